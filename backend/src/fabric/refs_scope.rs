//! Which devices a device's RC WRITE payloads reach by reference (one copy between guests,
//! spec §16.2 rule 6), and on which engine group slot its engine runs: the switch keeps a
//! segment's references only for a destination in its sender's scope and gathers the payloads
//! into the segment (on the sender's thread) for any other.

use std::sync::atomic::Ordering;

use super::{Fabric, FabricPortStats, PortId, PortKind};
use crate::wire::segment;

/// To which devices an engine's RC WRITE payloads go by reference (spec §16.2 rule 6); to any
/// other destination the switch gathers them into the frame first (on the sender's thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RefsScope {
    /// Copied when built.
    Off = 0,
    /// To devices whose engines run on the same engine group slot as the sender's: the one
    /// copy then runs on those threads, which did both copies before (the default in a group).
    SameSlot = 1,
    /// To every device that takes segments (`--payload-refs`).
    Everywhere = 2,
}

/// The smallest packet payload a device sends by reference in [`RefsScope::SameSlot`]: below
/// it the per-reference work (the fence's checks, the reference's bookkeeping) cost the
/// engines more than the copy it saves. Measured on the fabric benches (2026-12-07, five
/// alternated rounds, an engine group): at path MTU 4096 one copy moved 64 KiB WRITEs at
/// 3066-3528 MB per engine CPU-s against 2030-3152 with two copies, at path MTU 1024 (the
/// packets of the default `--mtu 1500`) at 775-1221 against 1009-1495.
pub(crate) const SAME_SLOT_REFS_MIN_PAYLOAD: usize = 2048;

impl RefsScope {
    fn from_u8(v: u8) -> RefsScope {
        match v {
            1 => RefsScope::SameSlot,
            2 => RefsScope::Everywhere,
            _ => RefsScope::Off,
        }
    }
}

impl Fabric {
    /// Does device port `id`'s engine send payloads by reference (it takes segments and has a
    /// scope other than [`RefsScope::Off`])?
    pub(crate) fn sends_refs(&self, id: PortId) -> bool {
        self.takes_segments(id) && self.refs_scope(id) != RefsScope::Off
    }

    fn refs_scope(&self, id: PortId) -> RefsScope {
        match self.ports.get(id).map(|p| &p.kind) {
            Some(PortKind::Device { refs, .. }) => RefsScope::from_u8(refs.load(Ordering::Relaxed)),
            _ => RefsScope::Off,
        }
    }

    /// The smallest payload port `id`'s engine sends by reference (`IcrcOffload`).
    pub(crate) fn refs_min_payload(&self, id: PortId) -> usize {
        match self.refs_scope(id) {
            RefsScope::SameSlot => SAME_SLOT_REFS_MIN_PAYLOAD,
            RefsScope::Everywhere | RefsScope::Off => 0,
        }
    }

    /// The engine group slot of device port `id`, plus one (0: none).
    fn engine_slot(&self, id: PortId) -> usize {
        match self.ports.get(id).map(|p| &p.kind) {
            Some(PortKind::Device { slot, .. }) => slot.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    pub(crate) fn set_refs(&self, id: PortId, scope: RefsScope) {
        if let Some(PortKind::Device { refs, .. }) = self.ports.get(id).map(|p| &p.kind) {
            refs.store(scope as u8, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_engine_slot(&self, id: PortId, index: usize) {
        if let Some(PortKind::Device { slot, .. }) = self.ports.get(id).map(|p| &p.kind) {
            slot.store(index.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// May a by-reference segment from `from` reach device `to` as it is?
    pub(super) fn keeps_refs(&self, from: PortId, to: PortId) -> bool {
        match self.refs_scope(from) {
            RefsScope::Everywhere => true,
            RefsScope::SameSlot => {
                let s = self.engine_slot(from);
                s != 0 && s == self.engine_slot(to)
            }
            RefsScope::Off => false,
        }
    }
}

/// Gathers the by-reference payloads of segment `seg` (of `n` frames) into it, if it has any:
/// the bytes a copying writer would have built. False if a reference was stale: the segment
/// is dropped and counted on its ingress port.
pub(super) fn gathered(
    seg: &mut [u8],
    refs: Option<Box<dyn segment::PayloadRefs>>,
    stats: &FabricPortStats,
    n: usize,
) -> bool {
    let Some(r) = refs else {
        return true;
    };
    let ok = segment::materialize(seg, &*r);
    r.recycle();
    if !ok {
        crate::stats::add(&stats.drop_stale_ref, n);
    }
    ok
}
