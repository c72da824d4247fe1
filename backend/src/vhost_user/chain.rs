//! Descriptor chains as byte streams: the readable part gathered into one buffer (bounded), the
//! writable part as a list of guest ranges to scatter a response into. Every address comes from
//! the guest and is checked against the memory table; nothing here panics on a bad chain.

use std::ops::Deref;

use thiserror::Error;

use crate::budget::{Budget, Charge};
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Most descriptors walked in a chain of any queue: the control queue's limit (§11.1
/// `VRDMA_CMD_MAX_DESCS`); the other queues need far fewer and the spec sets no tighter bound.
pub const MAX_CHAIN_DESCS: usize = vrdma_spec::VRDMA_CMD_MAX_DESCS as usize;

/// Why a chain could not be used as the device expected.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChainError {
    #[error("readable part of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: u64, max: usize },
    #[error("descriptor at {addr:#x} (+{len}) is outside guest memory")]
    BadAddress { addr: u64, len: u32 },
    /// The chain has more descriptors than the limit: its writable part is not known either.
    #[error("chain has more than {max} descriptors")]
    TooManyDescriptors { max: usize },
    /// Gathering the chain would exceed the device's host-memory budget (spec §16).
    #[error("readable part of {len} bytes does not fit the host-memory budget")]
    OverBudget { len: u64 },
}

/// One chain split into its readable bytes and writable ranges.
#[derive(Debug, Clone)]
pub struct SplitChain {
    /// Head index, for `add_used`.
    pub head: u16,
    /// The device-readable bytes, in chain order (empty when `read_error` is set).
    pub readable: Vec<u8>,
    /// Set when the readable part could not be gathered.
    pub read_error: Option<ChainError>,
    /// The device-writable descriptors, in chain order.
    pub writable: Vec<(GuestAddress, u32)>,
}

impl SplitChain {
    /// Walk `chain` (at most `max_descs` descriptors), gathering at most `max_readable` readable
    /// bytes. The limits are checked on the descriptors before any byte is read, and the buffer
    /// is allocated only once they hold: a chain whose descriptors all alias one guest page but
    /// declare gigabytes costs nothing beyond the walk (spec §11.1). Beyond `max_descs` the walk
    /// stops and `writable` is empty.
    pub fn gather<M>(chain: DescriptorChain<M>, max_readable: usize, max_descs: usize) -> SplitChain
    where
        M: Deref + Clone,
        M::Target: GuestMemory,
    {
        Self::gather_charged(chain, max_readable, max_descs, None).0
    }

    /// [`SplitChain::gather`], charging the buffer and the descriptor lists to `budget` (spec
    /// §16) before they are allocated; the returned charge covers them while the chain lives.
    /// Without room the chain gets [`ChainError::OverBudget`] and nothing is read.
    pub fn gather_charged<M>(
        chain: DescriptorChain<M>,
        max_readable: usize,
        max_descs: usize,
        budget: Option<&Budget>,
    ) -> (SplitChain, Charge)
    where
        M: Deref + Clone,
        M::Target: GuestMemory,
    {
        let head = chain.head_index();
        let mem = chain.memory();
        let mut readable_descs = Vec::new();
        let mut writable = Vec::new();
        let mut readable_len: u64 = 0;
        for (n, desc) in chain.clone().enumerate() {
            if n >= max_descs {
                let out = SplitChain {
                    head,
                    readable: Vec::new(),
                    read_error: Some(ChainError::TooManyDescriptors { max: max_descs }),
                    writable: Vec::new(),
                };
                return (out, Charge::default());
            }
            if desc.is_write_only() {
                writable.push((desc.addr(), desc.len()));
            } else {
                readable_len += u64::from(desc.len());
                readable_descs.push((desc.addr(), desc.len()));
            }
        }
        let mut out = SplitChain {
            head,
            readable: Vec::new(),
            read_error: None,
            writable,
        };
        if readable_len > max_readable as u64 {
            out.read_error = Some(ChainError::TooLarge {
                len: readable_len,
                max: max_readable,
            });
            return (out, Charge::default());
        }
        // The walk's lists (bounded by `max_descs`) already exist; the buffer does not yet.
        let descs = (readable_descs.len() + out.writable.len()) as u64;
        let charge = match budget.map(|b| b.try_charge(readable_len + descs * 16)) {
            None => Charge::default(),
            Some(Ok(c)) => c,
            Some(Err(_)) => {
                out.read_error = Some(ChainError::OverBudget { len: readable_len });
                return (out, Charge::default());
            }
        };
        // readable_len <= max_readable, so it fits in usize.
        let mut buf = vec![0u8; readable_len as usize];
        let mut off = 0usize;
        for (addr, len) in readable_descs {
            let end = off + len as usize;
            if mem.read_slice(&mut buf[off..end], addr).is_err() {
                out.read_error = Some(ChainError::BadAddress { addr: addr.0, len });
                return (out, charge);
            }
            off = end;
        }
        out.readable = buf;
        (out, charge)
    }

    /// Total capacity of the writable part.
    pub fn writable_len(&self) -> u64 {
        self.writable.iter().map(|(_, l)| u64::from(*l)).sum()
    }

    /// Scatter `data` over the writable descriptors. Returns the bytes written, or the first
    /// descriptor that is not in guest memory. `data` longer than the capacity is truncated.
    pub fn scatter<M: GuestMemory>(&self, mem: &M, data: &[u8]) -> Result<usize, ChainError> {
        let mut off = 0usize;
        for &(addr, len) in &self.writable {
            if off >= data.len() {
                break;
            }
            let n = (len as usize).min(data.len() - off);
            mem.write_slice(&data[off..off + n], addr)
                .map_err(|_| ChainError::BadAddress { addr: addr.0, len })?;
            off += n;
        }
        Ok(off)
    }
}
