//! Rings in guest memory (spec §4): SQ, RQ, SRQ and CQ.
//!
//! A ring is described by a list of 4 KiB guest-physical pages: page 0 holds `vrdma_ring_ctrl`,
//! entries start at page 1. `npages` must be exactly `1 + ceil(depth * entry_size / 4096)`; depth is
//! a power of two; entry sizes are powers of two between the ring kind's minimum and 4096, so an
//! entry never crosses a page. Indices are free-running u32 counters.
//!
//! The device keeps a shadow of the index it owns (consumer of SQ/RQ/SRQ, producer of a CQ) and never
//! trusts the guest's copy of it; the guest-owned index is read with acquire ordering and checked:
//! `producer - consumer > depth` is an index error (§4, DESIGN.md "Rings").

use std::sync::atomic::{fence, Ordering};

use std::mem::offset_of;

use thiserror::Error;
use vrdma_spec::{
    VrdmaRingCtrl, VRDMA_CQ_ARM_NEXT, VRDMA_CQ_ARM_NONE, VRDMA_CQ_ARM_SOLICITED, VRDMA_PAGE_SIZE,
    VRDMA_RING_ERR_ACCESS, VRDMA_RING_ERR_INDEX, VRDMA_RING_ERR_OVERFLOW,
};

use super::memory::{GuestMem, GuestMemError};

/// Ring page size (`VRDMA_PAGE_SIZE`, §4) as a guest-address quantity.
pub const RING_PAGE_SIZE: u64 = VRDMA_PAGE_SIZE;
/// Offsets inside `struct vrdma_ring_ctrl` (§4), taken from the spec's layout.
pub const CTRL_PRODUCER: u64 = offset_of!(VrdmaRingCtrl, producer) as u64;
pub const CTRL_CONSUMER: u64 = offset_of!(VrdmaRingCtrl, consumer) as u64;
pub const CTRL_CQ_ARM: u64 = offset_of!(VrdmaRingCtrl, cq_arm) as u64;
pub const CTRL_ERROR: u64 = offset_of!(VrdmaRingCtrl, error) as u64;

/// Errors at ring creation (→ command status) and at run time (→ ring error / QP fatal).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RingError {
    /// depth is 0, not a power of two or above the limit → STATUS_INVALID.
    #[error("bad ring depth {0}")]
    BadDepth(u32),
    /// entry size (log2) out of range → STATUS_INVALID.
    #[error("bad ring entry shift {0}")]
    BadEntryShift(u32),
    /// page list length does not match depth and entry size → STATUS_INVALID.
    #[error("ring needs {expected} pages, got {got}")]
    BadPageCount { expected: u64, got: u64 },
    /// page address not 4 KiB aligned → STATUS_INVALID.
    #[error("ring page {0:#x} is not page aligned")]
    UnalignedPage(u64),
    /// page outside guest memory → STATUS_BAD_ADDRESS (at creation) / VRDMA_RING_ERR_ACCESS (run time).
    #[error("ring page access failed: {0}")]
    Access(#[from] GuestMemError),
    /// producer - consumer > depth (guest corrupted an index) → VRDMA_RING_ERR_INDEX.
    #[error("ring index error: producer {producer} consumer {consumer} depth {depth}")]
    Index {
        producer: u32,
        consumer: u32,
        depth: u32,
    },
    /// CQ full → VRDMA_RING_ERR_OVERFLOW.
    #[error("completion queue overflow")]
    Overflow,
    /// The object owning the ring is already in error; the device no longer uses the ring.
    #[error("ring is in error")]
    Broken,
    /// entry buffer of the wrong size.
    #[error("entry buffer of {got} bytes, entry size is {size}")]
    BadBuffer { got: usize, size: u32 },
}

impl RingError {
    /// The VRDMA_RING_ERR_* code for a run-time error written into the ring's `error` field.
    pub fn ring_error_code(&self) -> u32 {
        match self {
            RingError::Overflow => VRDMA_RING_ERR_OVERFLOW,
            RingError::Index { .. } => VRDMA_RING_ERR_INDEX,
            _ => VRDMA_RING_ERR_ACCESS,
        }
    }
}

/// Number of pages a ring of `depth` entries of `1 << entry_shift` bytes needs (control page included).
pub fn ring_npages(depth: u32, entry_shift: u32) -> u64 {
    let bytes = (depth as u64) << entry_shift;
    1 + bytes.div_ceil(RING_PAGE_SIZE)
}

/// A ring in guest memory.
#[derive(Debug, Clone)]
pub struct Ring {
    pages: Vec<u64>,
    depth: u32,
    entry_shift: u32,
    /// Device-owned index shadow: consumer for SQ/RQ/SRQ, producer for CQ.
    dev_index: u32,
}

/// The "page" of an absent ring: page aligned, never inside guest memory, and far enough below
/// 2^64 that adding an in-page offset cannot overflow.
const NO_PAGE: u64 = !(RING_PAGE_SIZE - 1);

/// The checks of a ring's shape that need no guest memory (spec §4): a power-of-two depth up to
/// `max_depth`, an entry size between `min_shift` and a page, exactly as many pages as the
/// entries fill, each 4 KiB aligned.
fn check_geometry(
    pages: &[u64],
    depth: u32,
    entry_shift: u32,
    min_shift: u32,
    max_depth: u32,
) -> Result<(), RingError> {
    if depth == 0 || !depth.is_power_of_two() || depth > max_depth {
        return Err(RingError::BadDepth(depth));
    }
    if entry_shift < min_shift || entry_shift > 12 {
        return Err(RingError::BadEntryShift(entry_shift));
    }
    let expected = ring_npages(depth, entry_shift);
    if pages.len() as u64 != expected {
        return Err(RingError::BadPageCount {
            expected,
            got: pages.len() as u64,
        });
    }
    if let Some(&p) = pages.iter().find(|&&p| p % RING_PAGE_SIZE != 0) {
        return Err(RingError::UnalignedPage(p));
    }
    Ok(())
}

impl Ring {
    /// Validate and build a ring. `min_shift`/`max_shift` bound the entry size; `max_depth` bounds
    /// depth. Every page must be 4 KiB aligned and inside guest memory.
    pub fn new(
        mem: &GuestMem,
        pages: &[u64],
        depth: u32,
        entry_shift: u32,
        min_shift: u32,
        max_depth: u32,
    ) -> Result<Ring, RingError> {
        let ring = Ring::from_saved(pages, depth, entry_shift, 0, min_shift, max_depth)?;
        for &p in pages {
            if !mem.check_range(p, RING_PAGE_SIZE) {
                return Err(RingError::Access(GuestMemError::OutOfRange {
                    gpa: p,
                    len: RING_PAGE_SIZE,
                }));
            }
        }
        Ok(ring)
    }

    /// A ring that does not exist (the SQ of an XRC_TGT QP, spec §13.7): no pages, depth 0.
    /// Every access fails with an out-of-range guest address instead of touching memory, so a
    /// doorbell the guest rings for it cannot do anything.
    pub fn absent() -> Ring {
        Ring {
            pages: Vec::new(),
            depth: 0,
            entry_shift: 6,
            dev_index: 0,
        }
    }

    /// Rebuild a ring from migrated state (spec §17.3): the same geometry checks as
    /// [`Ring::new`] but not the guest-memory check, because the destination has no memory table
    /// yet when the state arrives (every later access is bounds-checked anyway).
    pub fn from_saved(
        pages: &[u64],
        depth: u32,
        entry_shift: u32,
        dev_index: u32,
        min_shift: u32,
        max_depth: u32,
    ) -> Result<Ring, RingError> {
        check_geometry(pages, depth, entry_shift, min_shift, max_depth)?;
        Ok(Ring {
            pages: pages.to_vec(),
            depth,
            entry_shift,
            dev_index,
        })
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }
    pub fn entry_size(&self) -> u32 {
        1 << self.entry_shift
    }
    pub fn entry_shift(&self) -> u32 {
        self.entry_shift
    }
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }
    /// GPA of the control page.
    pub fn ctrl_gpa(&self) -> u64 {
        self.pages.first().copied().unwrap_or(NO_PAGE)
    }

    /// GPA of the entry slot for free-running index `idx`.
    pub fn entry_gpa(&self, idx: u32) -> u64 {
        let slot = (idx & self.depth.wrapping_sub(1)) as u64;
        let off = slot << self.entry_shift;
        let page = 1 + (off / RING_PAGE_SIZE) as usize;
        // page < pages.len() by construction (npages checked against depth and entry size),
        // except for an absent ring.
        self.pages.get(page).copied().unwrap_or(NO_PAGE) + off % RING_PAGE_SIZE
    }

    /// The guest-written producer (SQ/RQ/SRQ), acquire.
    pub fn producer(&self, mem: &GuestMem) -> Result<u32, RingError> {
        Ok(mem.load_u32_acquire(self.ctrl_gpa() + CTRL_PRODUCER)?)
    }

    /// The guest-written consumer (CQ), acquire.
    pub fn guest_consumer(&self, mem: &GuestMem) -> Result<u32, RingError> {
        Ok(mem.load_u32_acquire(self.ctrl_gpa() + CTRL_CONSUMER)?)
    }

    /// The device-owned index (consumer of SQ/RQ/SRQ, producer of CQ).
    pub fn dev_index(&self) -> u32 {
        self.dev_index
    }

    /// Number of posted, not yet consumed entries of an SQ/RQ/SRQ: `producer - consumer`, checked
    /// against depth.
    pub fn pending(&self, mem: &GuestMem) -> Result<u32, RingError> {
        let producer = self.producer(mem)?;
        let n = producer.wrapping_sub(self.dev_index);
        if n > self.depth {
            return Err(RingError::Index {
                producer,
                consumer: self.dev_index,
                depth: self.depth,
            });
        }
        Ok(n)
    }

    /// Check a producer value read earlier against an arbitrary position `from` (e.g. the
    /// requester's next-to-process index, which is between consumer and producer).
    pub fn check_producer(&self, producer: u32) -> Result<(), RingError> {
        if producer.wrapping_sub(self.dev_index) > self.depth {
            return Err(RingError::Index {
                producer,
                consumer: self.dev_index,
                depth: self.depth,
            });
        }
        Ok(())
    }

    /// Set the device-owned consumer (SQ/RQ/SRQ) and publish it (release).
    pub fn set_consumer(&mut self, mem: &GuestMem, v: u32) -> Result<(), RingError> {
        self.dev_index = v;
        Ok(mem.store_u32_release(self.ctrl_gpa() + CTRL_CONSUMER, v)?)
    }

    /// Advance the device-owned consumer by `n` and publish it.
    pub fn advance_consumer(&mut self, mem: &GuestMem, n: u32) -> Result<(), RingError> {
        let v = self.dev_index.wrapping_add(n);
        self.set_consumer(mem, v)
    }

    /// Read the entry at free-running index `idx` into `buf` (`buf.len()` ≤ entry size).
    pub fn read_entry(&self, mem: &GuestMem, idx: u32, buf: &mut [u8]) -> Result<(), RingError> {
        if buf.len() > self.entry_size() as usize {
            return Err(RingError::BadBuffer {
                got: buf.len(),
                size: self.entry_size(),
            });
        }
        Ok(mem.read(self.entry_gpa(idx), buf)?)
    }

    /// Write `buf` (≤ entry size) into the slot of `idx`.
    pub fn write_entry(&self, mem: &GuestMem, idx: u32, buf: &[u8]) -> Result<(), RingError> {
        if buf.len() > self.entry_size() as usize {
            return Err(RingError::BadBuffer {
                got: buf.len(),
                size: self.entry_size(),
            });
        }
        Ok(mem.write(self.entry_gpa(idx), buf)?)
    }

    /// CQ: is there room for one more entry? Reads the guest's consumer.
    pub fn cq_has_room(&self, mem: &GuestMem) -> Result<bool, RingError> {
        let consumer = self.guest_consumer(mem)?;
        let used = self.dev_index.wrapping_sub(consumer);
        // used > depth means the guest wrote a consumer ahead of our producer: treat as full.
        Ok(used < self.depth)
    }

    /// CQ: write one entry at the producer and advance the producer (release). Fails with
    /// `Overflow` if the ring is full (nothing written then).
    pub fn cq_push(&mut self, mem: &GuestMem, entry: &[u8]) -> Result<(), RingError> {
        if !self.cq_has_room(mem)? {
            return Err(RingError::Overflow);
        }
        self.write_entry(mem, self.dev_index, entry)?;
        let next = self.dev_index.wrapping_add(1);
        mem.store_u32_release(self.ctrl_gpa() + CTRL_PRODUCER, next)?;
        self.dev_index = next;
        Ok(())
    }

    /// CQ: number of CQEs written but not yet consumed by the guest (clamped to depth).
    pub fn cq_unpolled(&self, mem: &GuestMem) -> Result<u32, RingError> {
        let consumer = self.guest_consumer(mem)?;
        Ok(self.dev_index.wrapping_sub(consumer).min(self.depth))
    }

    /// CQ: after a CQE is visible, read-and-clear `cq_arm` when it matches: with `solicited_or_error`
    /// both NEXT and SOLICITED fire, otherwise only NEXT. Returns true if this call won the arm and
    /// the caller must post one CQ_COMP event.
    pub fn cq_take_arm(&self, mem: &GuestMem, solicited_or_error: bool) -> Result<bool, RingError> {
        fence(Ordering::SeqCst);
        let gpa = self.ctrl_gpa() + CTRL_CQ_ARM;
        let cur = mem.load_u32_acquire(gpa)?;
        let fire = match cur {
            VRDMA_CQ_ARM_NEXT => true,
            VRDMA_CQ_ARM_SOLICITED => solicited_or_error,
            _ => false,
        };
        if !fire {
            return Ok(false);
        }
        // Exchange to NONE: only the winner of the exchange posts the event. If the guest re-armed
        // with a different mode in between, honour what we swapped out.
        let old = mem.swap_u32(gpa, VRDMA_CQ_ARM_NONE)?;
        Ok(match old {
            VRDMA_CQ_ARM_NEXT => true,
            VRDMA_CQ_ARM_SOLICITED => {
                if solicited_or_error {
                    true
                } else {
                    // Not ours to consume: put it back.
                    mem.store_u32_release(gpa, VRDMA_CQ_ARM_SOLICITED)?;
                    false
                }
            }
            _ => false,
        })
    }

    /// CQ: steps 1 and 2 of spec §5.3 without the exchange: would a CQE (`solicited_or_error`
    /// as in [`Ring::cq_take_arm`]) fire the arm the guest has set now? (CQ moderation, §5.5.)
    pub fn cq_arm_matches(
        &self,
        mem: &GuestMem,
        solicited_or_error: bool,
    ) -> Result<bool, RingError> {
        fence(Ordering::SeqCst);
        Ok(match mem.load_u32_acquire(self.ctrl_gpa() + CTRL_CQ_ARM)? {
            VRDMA_CQ_ARM_NEXT => true,
            VRDMA_CQ_ARM_SOLICITED => solicited_or_error,
            _ => false,
        })
    }

    /// Write the ring's `error` field (device stops using the ring afterwards).
    pub fn set_error(&self, mem: &GuestMem, code: u32) -> Result<(), RingError> {
        Ok(mem.store_u32_release(self.ctrl_gpa() + CTRL_ERROR, code)?)
    }

    /// Read the ring's `error` field.
    pub fn error(&self, mem: &GuestMem) -> Result<u32, RingError> {
        Ok(mem.load_u32_acquire(self.ctrl_gpa() + CTRL_ERROR)?)
    }

    /// Reset the device-owned index to 0 and clear indices/error in the control page (QP to RESET).
    /// Guest-memory failures are ignored: the ring may already be unreachable.
    pub fn reset_indices(&mut self, mem: &GuestMem) {
        self.dev_index = 0;
        let c = self.ctrl_gpa();
        let _ = mem.store_u32_release(c + CTRL_PRODUCER, 0);
        let _ = mem.store_u32_release(c + CTRL_CONSUMER, 0);
        let _ = mem.store_u32_release(c + CTRL_ERROR, 0);
    }

    /// Set the device-owned index without touching guest memory (e.g. CQ resize).
    pub fn set_dev_index(&mut self, v: u32) {
        self.dev_index = v;
    }
}
