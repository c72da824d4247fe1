//! Driver -> device queues other than control: doorbells (§8) and eth tx frames, plus the
//! drain loop every input queue shares (pop one chain, handle it, return it, repeat; signal
//! once, EVENT_IDX-aware so no kick is lost).

use vhost_user_backend::VringT;
use virtio_queue::QueueOwnedT;
use vm_memory::GuestAddressSpace;
use vrdma_spec::{Abi, VrdmaDoorbell};

use super::chain::SplitChain;
use super::{DoorbellSink, FrameSink, GuestMemoryAtomic, VhostUserRdmaError, Vring};
use crate::budget::Budget;

/// `sizeof(struct vrdma_doorbell)`.
pub const DOORBELL_LEN: usize = VrdmaDoorbell::SIZE;
/// Bound of one doorbell buffer (8192 records).
pub const MAX_DOORBELL_BYTES: usize = 64 << 10;
/// Ethernet header (14) + FCS-less slack for one 802.1Q tag (4): a frame may be MTU + 18.
pub const ETH_OVERHEAD: usize = 18;
/// Smallest frame accepted from the guest (an Ethernet header).
pub const ETH_MIN_FRAME: usize = 14;

/// How much of one chain the device gathers (see [`SplitChain::gather`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainLimits {
    /// Largest readable part gathered; longer chains get [`ChainError::TooLarge`].
    pub max_readable: usize,
    /// Most descriptors walked; longer chains get [`ChainError::TooManyDescriptors`].
    pub max_descs: usize,
}

/// Take the available chains of `vring` one at a time: pop one, gather it, hand it to `handle`
/// (which returns the used `len`, or `None` for a chain it keeps to return later itself),
/// return it, then take the next; signal the frontend once at the end if needed. Handling one
/// chain at a time bounds what a kick can make the daemon allocate to one chain's
/// `limits.max_readable` (spec §11.1), however many chains the guest made available. `handle`
/// runs without the vring lock held.
///
/// [`ChainError::TooLarge`]: super::chain::ChainError::TooLarge
/// [`ChainError::TooManyDescriptors`]: super::chain::ChainError::TooManyDescriptors
pub fn drain_queue<F>(
    index: u16,
    vring: &Vring,
    mem: &GuestMemoryAtomic,
    event_idx: bool,
    limits: ChainLimits,
    handle: F,
) -> Result<(), VhostUserRdmaError>
where
    F: FnMut(&SplitChain) -> Option<u32>,
{
    drain_queue_charged(index, vring, mem, event_idx, limits, None, handle)
}

/// [`drain_queue`], charging each chain's gathered buffer to `budget` while it is handled
/// (spec §16; a chain that does not fit gets `ChainError::OverBudget`).
pub fn drain_queue_charged<F>(
    index: u16,
    vring: &Vring,
    mem: &GuestMemoryAtomic,
    event_idx: bool,
    limits: ChainLimits,
    budget: Option<&Budget>,
    mut handle: F,
) -> Result<(), VhostUserRdmaError>
where
    F: FnMut(&SplitChain) -> Option<u32>,
{
    loop {
        if event_idx {
            vring
                .disable_notification()
                .map_err(|e| VhostUserRdmaError::Notification(index, e))?;
        }
        let mut any = false;
        loop {
            // Pop under the vring lock; gather and handle without it (handlers may take the
            // device lock, and the chain keeps its own reference to guest memory).
            let next = {
                let guard = mem.memory();
                let mut state = vring.get_mut();
                let queue = state.get_queue_mut();
                let mut iter = queue
                    .iter(guard.clone())
                    .map_err(|e| VhostUserRdmaError::AvailRing(index, e))?;
                iter.next()
            };
            let Some(desc_chain) = next else {
                break;
            };
            let (chain, charge) = SplitChain::gather_charged(
                desc_chain,
                limits.max_readable,
                limits.max_descs,
                budget,
            );
            let used = handle(&chain);
            let head = chain.head;
            // The buffer is freed here (a parked chain keeps only its response descriptors).
            drop(chain);
            drop(charge);
            let Some(len) = used else {
                continue;
            };
            vring
                .add_used(head, len)
                .map_err(|e| VhostUserRdmaError::AddUsed(index, e))?;
            any = true;
        }
        if any
            && vring
                .needs_notification()
                .map_err(|e| VhostUserRdmaError::Notification(index, e))?
        {
            vring
                .signal_used_queue()
                .map_err(|e| VhostUserRdmaError::Signal(index, e))?;
        }
        if !event_idx {
            return Ok(());
        }
        if !vring
            .enable_notification()
            .map_err(|e| VhostUserRdmaError::Notification(index, e))?
        {
            return Ok(());
        }
    }
}

/// Forward every `vrdma_doorbell` record in a doorbell buffer. Returns the used `len` (0: the
/// device writes nothing).
pub fn doorbells(chain: &SplitChain, sink: &dyn DoorbellSink) -> u32 {
    if let Some(e) = &chain.read_error {
        guest_warn!("doorbellq: buffer {}: {e}; ignored", chain.head);
        return 0;
    }
    let recs = chain.readable.chunks_exact(DOORBELL_LEN);
    if !recs.remainder().is_empty() {
        guest_warn!(
            "doorbellq: buffer {}: {} trailing bytes ignored",
            chain.head,
            recs.remainder().len()
        );
    }
    let dbs: Vec<VrdmaDoorbell> = recs.filter_map(VrdmaDoorbell::read_from).collect();
    if !dbs.is_empty() {
        sink.doorbells(&dbs);
    }
    0
}

/// Send the frame in an eth tx buffer to the uplink if its length is sane.
pub fn eth_tx(chain: &SplitChain, sink: &dyn FrameSink, max_frame: usize) -> u32 {
    if let Some(e) = &chain.read_error {
        guest_warn!("eth txq: buffer {}: {e}; dropped", chain.head);
        return 0;
    }
    let frame = &chain.readable;
    if frame.len() < ETH_MIN_FRAME || frame.len() > max_frame {
        guest_debug!(
            "eth txq: frame of {} bytes outside {ETH_MIN_FRAME}..={max_frame}; dropped",
            frame.len()
        );
        return 0;
    }
    if let Err(e) = sink.send_frame(frame) {
        guest_debug!("eth txq: uplink send failed: {e}; frame dropped");
    }
    0
}
