//! One copy between the fabric's guests (spec §16.2 rule 6, issue #13 item 2 stage 2): the
//! requester of an RC WRITE leaves the payload of each packet of a multi-packet message in its
//! guest's memory and records in the segment where it is ([`SourceRefs`]: the guest ranges
//! resolved through its MRs when the packet is built, the generations of those MRs' slots and
//! of the device, and a clone of the device's `GuestMem`, which keeps the memory table alive).
//! The receiving engine copies from there straight into its own guest memory
//! ([`write_payload`]): one copy instead of two, raw pointer to raw pointer.
//!
//! Fence (`memory::fence`): every read goes through the sender's `DmaFence` (read side, the
//! generations checked under it); a stale reference is a lost packet, which the RC requester
//! retransmits (re-resolving its SGEs: after a DEREG_MR the WQE fails with the usual local
//! protection error). Only RC (and XRC) WRITEs: their WQE completes on the ACK, which the
//! responder sends after its copy, so the guest cannot reuse the buffer while a reference to it
//! is queued; a UC WRITE completes when handed to the wire, so its payload is copied as before.

use std::sync::{Arc, Mutex};

use crate::guest::GuestMem;
use crate::memory::fence::{DmaFence, SlotGen};
use crate::memory::{Access, GuestRange, MrError};
use crate::sync::lock;
use crate::transport::Device;
use crate::wire::segment::{PayloadRefs, SegmentWriter, StaleRef, MAX_FRAMES};

use super::packet::{RxPkt, TxMeta};
use super::requester::{Sge, SgeError};

/// Most distinct MR slots one segment's references go through (more: the packet is copied).
const MAX_SLOTS: usize = 8;
/// Most guest ranges one segment's references hold (more: the packet is copied).
const MAX_RANGES: usize = 4 * MAX_FRAMES;

/// A frame's payload by reference: frame index in the segment, where its payload belongs in
/// the segment buffer, and its ranges (`SourceRefs::ranges[start..end]`).
#[derive(Debug, Clone, Copy)]
struct FrameRef {
    frame: usize,
    off: usize,
    len: usize,
    start: usize,
    end: usize,
}

/// Recycled [`SourceRefs`] of one engine thread (the receiving engine gives them back).
type Pool = Mutex<Vec<Box<SourceRefs>>>;
/// Most recycled references a thread's pool keeps.
const POOL_MAX: usize = 128;

thread_local! {
    static POOL: Arc<Pool> = Arc::new(Mutex::new(Vec::new()));
}

/// The by-reference payloads of one segment (see the module documentation).
pub struct SourceRefs {
    pool: Arc<Pool>,
    /// The sender's memory and fence; `None` while pooled (a pooled entry must not keep a
    /// guest's memory mapped after its device let it go).
    mem: Option<GuestMem>,
    fence: Option<Arc<DmaFence>>,
    device_gen: u64,
    slots: Vec<(SlotGen, u64)>,
    frames: Vec<FrameRef>,
    ranges: Vec<GuestRange>,
}

impl std::fmt::Debug for SourceRefs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceRefs")
            .field("frames", &self.frames.len())
            .field("ranges", &self.ranges.len())
            .finish_non_exhaustive()
    }
}

impl SourceRefs {
    /// From this thread's pool (no allocation in steady state), for device `dev`.
    fn take(dev: &Device) -> Box<SourceRefs> {
        let pool = POOL.with(Arc::clone);
        let got = lock(&pool).pop();
        let fence = &Arc::clone(dev.mrs.read().fence());
        match got {
            Some(mut r) => {
                r.mem = Some(dev.mem.clone());
                r.fence = Some(Arc::clone(fence));
                r.device_gen = fence.device_gen();
                r
            }
            None => Box::new(SourceRefs {
                pool,
                mem: Some(dev.mem.clone()),
                fence: Some(Arc::clone(fence)),
                device_gen: fence.device_gen(),
                slots: Vec::with_capacity(MAX_SLOTS),
                frames: Vec::with_capacity(MAX_FRAMES),
                ranges: Vec::with_capacity(MAX_RANGES),
            }),
        }
    }

    fn find(&self, frame: usize) -> Option<&FrameRef> {
        self.frames
            .binary_search_by_key(&frame, |f| f.frame)
            .ok()
            .and_then(|i| self.frames.get(i))
    }

    /// Are the generations recorded still current? Called under the fence's read side.
    fn current(&self, fence: &DmaFence) -> bool {
        use std::sync::atomic::Ordering;
        fence.device_gen() == self.device_gen
            && self
                .slots
                .iter()
                .all(|(g, v)| g.load(Ordering::Acquire) == *v)
    }
}

impl PayloadRefs for SourceRefs {
    fn place(&self, frame: usize) -> Option<(usize, usize)> {
        self.find(frame).map(|f| (f.off, f.len))
    }

    fn read(
        &self,
        frame: usize,
        sink: &mut dyn FnMut(*const u8, usize, usize),
    ) -> Result<(), StaleRef> {
        let f = *self.find(frame).ok_or(StaleRef)?;
        let ranges = self.ranges.get(f.start..f.end).ok_or(StaleRef)?;
        // The fence's read side for the whole packet: a DEREG_MR / invalidation / reset of the
        // sender either waits for this copy or is seen by the check (memory::fence).
        let (Some(fence), Some(mem)) = (self.fence.as_deref(), self.mem.as_ref()) else {
            return Err(StaleRef);
        };
        let _gate = fence.read();
        if !self.current(fence) {
            return Err(StaleRef);
        }
        let mut at = 0usize;
        for r in ranges {
            let len = usize::try_from(r.len).map_err(|_| StaleRef)?;
            mem.with_host_ranges(r.gpa, len, |src, done, n| sink(src, at + done, n))
                .map_err(|_| StaleRef)?;
            at += len;
        }
        if at != f.len {
            return Err(StaleRef);
        }
        Ok(())
    }

    fn recycle(mut self: Box<Self>) {
        self.slots.clear();
        self.frames.clear();
        self.ranges.clear();
        self.mem = None;
        self.fence = None;
        let pool = Arc::clone(&self.pool);
        let mut p = lock(&pool);
        if p.len() < POOL_MAX {
            p.push(self);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Should this packet go by reference? RC/XRC WRITE packets of multi-packet messages with a
/// payload from SGEs, on a port whose segments may hold references, at least its smallest
/// payload by reference long.
pub(crate) fn by_reference(dev: &Device, rc: bool, write: bool, inline: bool, plen: usize) -> bool {
    let o = &dev.icrc_offload;
    o.payload_refs && rc && write && !inline && plen > 0 && plen >= o.refs_min_payload
}

/// Where a request packet's payload is in the sender's guest memory: `len` bytes at message
/// offset `off` of `sges`, read by QP `qpn` of PD `pdn` (its MR accesses, and the QP an ODP
/// fault resumes).
pub(crate) struct PayloadSource<'a> {
    pub qpn: u32,
    pub pdn: u32,
    pub sges: &'a [Sge],
    pub off: u64,
    pub len: usize,
}

/// Add one request packet whose payload (`payload`) stays in guest memory to the segment `w`.
/// `Ok(Added(len))`: added; `Ok(Copy)`: the references are full (the caller copies it
/// instead); `Ok(Lost)`: the segment refused it; `Err`: the SGEs do not resolve (as a gather
/// would fail).
pub(crate) fn build_by_reference(
    dev: &Device,
    m: &TxMeta<'_>,
    payload: PayloadSource<'_>,
    w: &mut SegmentWriter,
) -> Result<Built, SgeError> {
    let plen = payload.len;
    if w.refs_mut().is_none() {
        *w.refs_mut() = Some(SourceRefs::take(dev));
    }
    let Some(refs) = w
        .refs_mut()
        .as_mut()
        .and_then(|r| r.as_any_mut().downcast_mut::<SourceRefs>())
    else {
        return Ok(Built::Copy);
    };
    let start = refs.ranges.len();
    let mut ranges = super::scratch::take(super::scratch::Side::Requester);
    let r = resolve(dev, &payload, refs, &mut ranges);
    super::scratch::give_back(super::scratch::Side::Requester, ranges);
    match r {
        Ok(true) => {}
        Ok(false) => {
            refs.ranges.truncate(start);
            return Ok(Built::Copy);
        }
        Err(e) => {
            refs.ranges.truncate(start);
            return Err(e);
        }
    }
    let end = refs.ranges.len();
    let mut at: Option<*const u8> = None;
    let built = super::packet::build_into_segment(m, plen, w, |p| {
        // The payload stays in guest memory: only where it belongs is noted.
        at = Some(p.as_ptr());
        Ok::<(), SgeError>(())
    })?;
    let place = at.and_then(|p| w.offset_of(p));
    let frame = w.count().wrapping_sub(1);
    let Some(refs) = w
        .refs_mut()
        .as_mut()
        .and_then(|r| r.as_any_mut().downcast_mut::<SourceRefs>())
    else {
        return Ok(Built::Lost);
    };
    match (built, place) {
        (Some(len), Some(off)) => {
            refs.frames.push(FrameRef {
                frame,
                off,
                len: plen,
                start,
                end,
            });
            Ok(Built::Added(len))
        }
        _ => {
            refs.ranges.truncate(start);
            Ok(Built::Lost)
        }
    }
}

/// What [`build_by_reference`] did.
pub(crate) enum Built {
    /// Added by reference (the frame's length).
    Added(usize),
    /// Not added: the references are full; copy the payload instead.
    Copy,
    /// Not added: `wire` or the segment refused the frame (logged by the builder).
    Lost,
}

/// Resolve the payload's SGE pieces through the MRs into `refs` (as `sge_copy`'s gather would
/// read them, with the same errors), recording each MR slot's generation. `Ok(false)`: the
/// references are full.
fn resolve(
    dev: &Device,
    payload: &PayloadSource<'_>,
    refs: &mut SourceRefs,
    ranges: &mut Vec<GuestRange>,
) -> Result<bool, SgeError> {
    let total = payload.len;
    let mut skip = payload.off;
    let mut done = 0usize;
    for s in payload.sges {
        if done == total {
            break;
        }
        let slen = u64::from(s.len);
        if skip >= slen {
            skip -= slen;
            continue;
        }
        let n = ((slen - skip) as usize).min(total - done);
        // The slot's generation before the translation: an MR change between the two (a
        // DEREG_MR or REREG_MR beside the workers, a LOCAL_INV on another worker) then leaves
        // the reference stale. Read after, it could pair the old ranges with the new
        // generation, and the receiver would read memory the MR no longer allows.
        // A slot already recorded keeps the generation read for its first range, older than
        // this translation: a change since makes the whole reference stale, never fresh.
        let new_slot = {
            let mrs = dev.mrs.read();
            let Some((gen, v)) = mrs.reference_gen(s.lkey) else {
                return Err(SgeError::Prot);
            };
            (!refs.slots.iter().any(|(g, _)| Arc::ptr_eq(g, gen))).then(|| (Arc::clone(gen), v))
        };
        // A gather: a local read, which needs no right.
        let a = Access {
            key: s.lkey,
            pd: payload.pdn,
            iova: s.addr.wrapping_add(skip),
            len: n as u64,
            rights: 0,
        };
        super::ctx::resolve(dev, Some(payload.qpn), a, ranges).map_err(|e| match e {
            MrError::Fault { key, iova } => SgeError::Fault { key, iova },
            _ => SgeError::Prot,
        })?;
        let mut got = 0u64;
        for r in ranges.iter() {
            if !dev.mem.check_range(r.gpa, r.len) {
                return Err(SgeError::Prot);
            }
            got = got.checked_add(r.len).ok_or(SgeError::Prot)?;
        }
        if got != n as u64 {
            return Err(SgeError::Prot);
        }
        if refs.ranges.len() + ranges.len() > MAX_RANGES {
            return Ok(false);
        }
        if let Some(slot) = new_slot {
            if refs.slots.len() == MAX_SLOTS {
                return Ok(false);
            }
            refs.slots.push(slot);
        }
        refs.ranges.extend_from_slice(ranges);
        done += n;
        skip = 0;
    }
    if done != total {
        return Err(SgeError::Len);
    }
    Ok(true)
}

/// Why [`write_payload`] wrote nothing (or not everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OneCopyError {
    /// The sender fenced the reference (spec §16.2 rule 6): the packet is lost.
    #[error("stale payload reference")]
    Stale,
    /// The destination ranges do not take the payload (a local memory fault).
    #[error("destination guest memory")]
    Destination,
}

/// The payload of `pkt` held by reference, if it is.
pub(crate) fn payload_ref<'a>(pkt: &RxPkt<'a>) -> Option<super::packet::PayloadSrc<'a>> {
    pkt.payload_ref
}

/// Copy a by-reference payload straight from the sender's guest memory into `dst` (guest
/// ranges of this device, together exactly the payload's length): the one copy.
pub(crate) fn write_payload(
    dev: &Device,
    src: super::packet::PayloadSrc<'_>,
    dst: &[GuestRange],
    len: usize,
) -> Result<(), OneCopyError> {
    let total: u64 = dst.iter().map(|r| r.len).sum();
    if total != len as u64 {
        return Err(OneCopyError::Destination);
    }
    let mut bad = false;
    let mut copied = 0usize;
    let r = src.refs.read(src.frame, &mut |p, off, n| {
        // The piece is [off, off + n) of the payload: copy its overlap with each range.
        let mut lo = 0usize;
        for d in dst {
            let hi = lo + d.len as usize;
            let (s, e) = (off.max(lo), (off + n).min(hi));
            if s < e {
                // SAFETY: `p` is valid for reads of `n` bytes during this call
                // (`PayloadRefs::read`: the sender's table snapshot and its fence's read side
                // are held, so the bytes are still what its MR allowed, memory::fence), and
                // `s - off + (e - s) <= n` because `e <= off + n`. Raw to raw: neither guest's
                // bytes are ever seen as a Rust slice, which their guests may change meanwhile.
                let w = unsafe {
                    dev.mem
                        .write_from_ptr(d.gpa + (s - lo) as u64, p.add(s - off), e - s)
                };
                if w.is_err() {
                    bad = true;
                    return;
                }
                copied += e - s;
            }
            if hi >= off + n {
                break;
            }
            lo = hi;
        }
    });
    match r {
        Err(StaleRef) => Err(OneCopyError::Stale),
        Ok(()) if bad || copied != len => Err(OneCopyError::Destination),
        Ok(()) => Ok(()),
    }
}
