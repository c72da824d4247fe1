//! The MR table (spec §12).
//!
//! Keys are `(index << 8) | variant`, lkey == rkey, index ≥ 1 (so key 0 is never valid). The variant
//! of a slot changes on every registration into it and on every fast registration (REG_MR WQE), so a
//! key of an earlier registration is rejected as `StaleKey`. A slot's first variant is random (spec
//! §16), so the keys of a fresh device are not the same predictable sequence on every device.
//!
//! Kinds: page-list MR, DMA MR (iova == GPA, local access only), fast-reg MR (allocated empty,
//! filled by `fast_register`, emptied by `local_invalidate`), explicit ODP MR and implicit ODP MR
//! (translated per chunk on demand, see `odp.rs`). Memory windows (spec §12.8, `mw.rs`) live in
//! the same slots, so MR keys and window rkeys share one index space; [`MrTable::get`] and the
//! local-access paths never return a window, only the `*_remote` paths translate through one.
//!
//! The transport checks a whole SGE / RETH range with [`MrTable::check_access`] (no ODP faults)
//! and translates with [`MrTable::resolve_into`] (through `transport::ctx::resolve`) only the
//! bytes of the packet it is moving, so an ODP transfer larger than the resident budget
//! progresses chunk by chunk (spec §12.4).

mod register;
mod restore;
mod translate;

pub(super) use translate::check_range_rights;

use std::collections::VecDeque;
use std::sync::Arc;

use thiserror::Error;
use vrdma_spec::*;

use super::odp::{OdpConfig, OdpMr, OdpState};
use crate::budget::{Budget, Charge};
use crate::guest::output::DeviceOutput;
use crate::guest::GuestMem;

// The access bits themselves are `vrdma_spec::VRDMA_ACCESS_*` (spec §12.2); these are the groups
// the checks below use.
/// The IBTA 1.5 FLUSH rights (one per placement type).
pub const ACCESS_FLUSH: u32 = VRDMA_ACCESS_FLUSH_GLOBAL | VRDMA_ACCESS_FLUSH_PERSISTENT;
/// Every access bit the device knows.
pub const ACCESS_ALL: u32 = VRDMA_ACCESS_LOCAL_WRITE
    | VRDMA_ACCESS_REMOTE_WRITE
    | VRDMA_ACCESS_REMOTE_READ
    | VRDMA_ACCESS_REMOTE_ATOMIC
    | VRDMA_ACCESS_MW_BIND
    | VRDMA_ACCESS_ZERO_BASED
    | VRDMA_ACCESS_ON_DEMAND
    | ACCESS_FLUSH;
/// Bits that need remote access rights.
pub const ACCESS_REMOTE: u32 = VRDMA_ACCESS_REMOTE_WRITE
    | VRDMA_ACCESS_REMOTE_READ
    | VRDMA_ACCESS_REMOTE_ATOMIC
    | ACCESS_FLUSH;
/// Bits that imply a write into the MR's memory.
pub const ACCESS_WRITES: u32 =
    VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_ATOMIC;

/// Smallest and largest MR page shift accepted (4 KiB .. 1 GiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
pub const MAX_PAGE_SHIFT: u32 = 30;
/// `page_size_cap` advertised in the config space: every power of two from 4 KiB to 1 GiB.
pub const PAGE_SIZE_CAP: u64 =
    ((1u64 << (MAX_PAGE_SHIFT + 1)) - 1) & !((1u64 << MIN_PAGE_SHIFT) - 1);
/// Largest MR index (24 bits of key).
pub const MAX_MR_INDEX: u32 = (1 << 24) - 1;
/// Default bound on the page-list entries all MRs hold together (page-list MRs' pages plus
/// fast-reg MRs' `max_num_sg`, reserved at allocation): 2^26 entries, 512 MiB of daemon memory,
/// enough to register 256 GiB in 4 KiB pages. Each MR is also bounded by the command limit
/// (`VRDMA_CMD_MAX_PAGES`, spec §11.1); without a total, `max_mr` MRs of 2^23 entries that
/// all name one guest page would make the daemon hold 4 TiB.
pub const DEFAULT_MAX_MR_PAGES: u64 = 1 << 26;

/// Split a key.
pub fn key_index(key: u32) -> u32 {
    key >> 8
}
pub fn key_variant(key: u32) -> u8 {
    (key & 0xff) as u8
}

/// A contiguous guest-physical range produced by translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestRange {
    pub gpa: u64,
    pub len: u64,
}

/// Errors of translation and registration. The transport maps translation errors to completion
/// statuses: every variant except `Fault` → LOC_PROT_ERR for a local SGE, remote access error NAK
/// for an incoming request; `Fault` → suspend the requester / RNR NAK at the responder.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MrError {
    /// No MR with this key's index.
    #[error("invalid key {0:#x}")]
    InvalidKey(u32),
    /// The MR exists but its current variant differs.
    #[error("stale key {0:#x}")]
    StaleKey(u32),
    /// The MR belongs to another PD.
    #[error("key {key:#x} is not in PD {pd}")]
    WrongPd { key: u32, pd: u32 },
    /// The range is not inside the MR (or overflows).
    #[error("range {iova:#x}+{len:#x} outside MR {key:#x}")]
    OutOfBounds { key: u32, iova: u64, len: u64 },
    /// The MR does not grant the requested access.
    #[error("MR {key:#x} does not allow access {access:#x}")]
    AccessDenied { key: u32, access: u32 },
    /// A fast-reg MR that is not registered (never, or invalidated).
    #[error("MR {0:#x} is invalidated")]
    Invalidated(u32),
    /// ODP: a chunk is not resident. The page request has been sent (or joined); retry when the QP
    /// is resumed (see `MrTable::take_resumed`).
    #[error("ODP fault on MR {key:#x} at {iova:#x}")]
    Fault { key: u32, iova: u64 },
    /// ODP: the driver answered the page request with an error, or did not answer in time.
    #[error("ODP page request for MR {key:#x} at {iova:#x} failed (status {status})")]
    OdpFailed { key: u32, iova: u64, status: u32 },
    /// A translation points outside guest memory.
    #[error("translation {gpa:#x} outside guest memory")]
    BadAddress { gpa: u64 },
    /// Operation not valid for this MR kind (e.g. LOCAL_INV of a page-list MR, REG_MR WQE on a
    /// non-fast-reg MR, REG_MR WQE on a valid MR).
    #[error("operation not valid on MR {0:#x}")]
    InvalidOp(u32),
    /// Registration: malformed parameters.
    #[error("invalid MR parameters: {0}")]
    Invalid(&'static str),
    /// Registration: access flag combination not allowed.
    #[error("access flags {0:#x} not allowed")]
    BadAccess(u32),
    /// Registration: the MR table is full.
    #[error("no MR slots left")]
    NoResources,
    /// Registration: feature not enabled (ODP); REREG_MR of an MR that is not a page-list MR.
    #[error("not supported")]
    NotSupported,
}

impl MrError {
    /// The VRDMA_STATUS_* for a control command failing with this error.
    pub fn status(&self) -> u32 {
        use vrdma_spec::*;
        match self {
            MrError::InvalidKey(_) | MrError::StaleKey(_) => VRDMA_STATUS_NOT_FOUND,
            MrError::WrongPd { .. } | MrError::AccessDenied { .. } | MrError::BadAccess(_) => {
                VRDMA_STATUS_ACCESS
            }
            MrError::BadAddress { .. } => VRDMA_STATUS_BAD_ADDRESS,
            MrError::NoResources => VRDMA_STATUS_NO_RESOURCES,
            MrError::NotSupported => VRDMA_STATUS_NOT_SUPPORTED,
            _ => VRDMA_STATUS_INVALID,
        }
    }
}

/// What an MR translates through.
#[derive(Debug, Clone)]
pub enum MrKind {
    /// Registered page list: `pages[i]` is the GPA of page `i` of size `1 << page_shift`; the MR's
    /// first byte is at `pages[0] + (iova & (page_size - 1))`.
    PageList { page_shift: u32, pages: Vec<u64> },
    /// iova == GPA over all guest memory; local access only.
    Dma,
    /// Fast-reg MR: `max_pages` capacity; `pages`/`page_shift` valid only while `valid`.
    FastReg {
        max_pages: u32,
        page_shift: u32,
        pages: Vec<u64>,
        valid: bool,
    },
    /// Explicit ODP MR over [iova, iova + length).
    Odp(OdpMr),
    /// Implicit ODP MR: the whole address space (iova 0, length u64::MAX), iova == guest virtual.
    ImplicitOdp(OdpMr),
    /// A memory window (spec §12.8), not an MR: `Mr::access`, `iova`, `length` are the window's
    /// rights and remote range while it is bound.
    Window(super::mw::Window),
}

/// What REG_MR and REREG_MR describe: a PD, access flags, an iova range and the pages under it
/// (`pages[i]` is the GPA of page `i` of size `1 << page_shift`).
#[derive(Debug, Clone, Copy)]
pub struct PageListSpec<'a> {
    pub pd: u32,
    pub access: u32,
    pub iova: u64,
    pub length: u64,
    pub page_shift: u32,
    pub pages: &'a [u64],
}

/// What a REG_MR WQE (`struct vrdma_wqe_reg`, spec §6.1) asks of a fast-reg MR: its new key,
/// access flags and iova range, and the page list in guest memory (`page_list_len` u64 GPAs of
/// pages of size `1 << page_shift` at `page_list_addr`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FastReg {
    pub key: u32,
    pub access: u32,
    pub iova: u64,
    pub length: u64,
    pub page_shift: u32,
    pub page_list_addr: u64,
    pub page_list_len: u32,
}

/// One memory region.
#[derive(Debug, Clone)]
pub struct Mr {
    /// Current key (index << 8 | variant).
    pub key: u32,
    pub pd: u32,
    pub access: u32,
    pub iova: u64,
    pub length: u64,
    pub kind: MrKind,
}

impl Mr {
    /// An object of `pd` that maps nothing yet (a fast-registration MR before its first
    /// REG_MR WQE, a memory window before its first bind); `alloc` gives it its key.
    pub fn unmapped(pd: u32, kind: MrKind) -> Mr {
        Mr {
            key: 0,
            pd,
            access: 0,
            iova: 0,
            length: 0,
            kind,
        }
    }

    pub fn index(&self) -> u32 {
        key_index(self.key)
    }
    pub fn is_odp(&self) -> bool {
        matches!(self.kind, MrKind::Odp(_) | MrKind::ImplicitOdp(_))
    }
    pub fn is_window(&self) -> bool {
        matches!(self.kind, MrKind::Window(_))
    }
    /// Exclusive end of the MR's iova range (saturating for implicit MRs).
    pub fn end(&self) -> u64 {
        self.iova.saturating_add(self.length)
    }
}

#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) variant: u8,
    pub(super) mr: Option<Mr>,
    /// Host memory the MR holds (spec §16): released with the MR.
    charge: Charge,
    /// Memory windows bound to the MR in this slot (spec §12.8: such an MR cannot be
    /// invalidated). Reset when the MR goes; a window bound to a gone MR does not count.
    pub(super) bound_mws: u32,
    /// Generation of what this slot allows (spec §16.2 rule 6, `memory::fence`): moved by
    /// every operation that takes a permission away, so fabric references made through the
    /// slot before it are never read after it.
    pub(super) gen: crate::memory::fence::SlotGen,
}

/// The device's MR table.
pub struct MrTable {
    pub(super) slots: Vec<Slot>,
    pub(super) free: VecDeque<u32>,
    max_mr: u32,
    count: u32,
    /// Memory windows (spec §12.8): their number and bound (`max_mw`, 0 = none).
    pub(super) mw_count: u32,
    pub(super) max_mw: u32,
    /// Page-list entries held by all MRs, and their bound (see [`DEFAULT_MAX_MR_PAGES`]).
    pages_held: u64,
    max_pages: u64,
    /// The device's host-memory budget (see [`MrTable::charge_of`]).
    budget: Budget,
    pub(crate) mem: GuestMem,
    pub(crate) odp: OdpState,
    /// The DMA fence of this device's by-reference fabric segments (`memory::fence`).
    pub(crate) fence: Arc<crate::memory::fence::DmaFence>,
    /// Draws the first variant of each new slot.
    rng: crate::ids::IdRng,
}

impl Drop for MrTable {
    /// References made through a table that goes away are never read (spec §16.2 rule 6).
    fn drop(&mut self) {
        self.fence.fence_device();
    }
}

impl std::fmt::Debug for MrTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrTable")
            .field("count", &self.count)
            .field("max_mr", &self.max_mr)
            .finish()
    }
}

/// Check the IBTA rule: remote write / remote atomic need local write.
pub fn check_access_flags(access: u32) -> Result<(), MrError> {
    if access & !ACCESS_ALL != 0 {
        return Err(MrError::Invalid("unknown access bits"));
    }
    if access & (VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_ATOMIC) != 0
        && access & VRDMA_ACCESS_LOCAL_WRITE == 0
    {
        return Err(MrError::BadAccess(access));
    }
    // Guest memory is host RAM: nothing can be made persistent, so no MR may promise it.
    if access & VRDMA_ACCESS_FLUSH_PERSISTENT != 0 {
        return Err(MrError::NotSupported);
    }
    Ok(())
}

impl MrTable {
    /// `max_mr` MRs at most (capped to the 24-bit index space). `mem` is a clone of the device's
    /// guest memory, `out` receives ODP page requests.
    pub fn new(max_mr: u32, mem: GuestMem, out: Arc<dyn DeviceOutput>, odp: OdpConfig) -> Self {
        let max_mr = max_mr.min(MAX_MR_INDEX);
        MrTable {
            slots: Vec::from([Slot::default()]),
            free: VecDeque::new(),
            max_mr,
            count: 0,
            mw_count: 0,
            max_mw: 0,
            pages_held: 0,
            max_pages: DEFAULT_MAX_MR_PAGES,
            budget: Budget::default(),
            mem,
            odp: OdpState::new(odp, out),
            fence: Arc::default(),
            rng: crate::ids::IdRng::from_os(),
        }
    }

    /// Bound the page-list entries all MRs may hold together (REG_MR, REREG_MR and
    /// ALLOC_FAST_REG_MR beyond it fail with `NoResources`, spec §11.8).
    pub fn with_max_pages(mut self, max_pages: u64) -> Self {
        self.max_pages = max_pages;
        self
    }

    /// Charge MRs to the device's host-memory budget (spec §16) instead of a private one.
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.odp.set_budget(budget.clone());
        self.budget = budget;
        self
    }

    /// The budget MRs are charged to.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Host memory an MR with `pages` page-list entries holds: the table entry and the list.
    /// Charged before the list is copied, together with the page-count bound.
    pub fn charge_of(pages: u64) -> u64 {
        (std::mem::size_of::<Slot>() as u64).saturating_add(pages.saturating_mul(8))
    }

    /// Allow `max_mw` memory windows (spec §2.2, §12.8; 0: ALLOC_MW is NOT_SUPPORTED).
    pub fn with_max_mw(mut self, max_mw: u32) -> Self {
        self.max_mw = max_mw.min(MAX_MR_INDEX);
        self
    }

    pub(super) fn charge(&self, pages: u64) -> Result<Charge, MrError> {
        self.budget
            .try_charge(Self::charge_of(pages))
            .map_err(|_| MrError::NoResources)
    }

    /// Page-list entries held by all MRs (page-list pages + fast-reg capacity).
    pub fn pages_held(&self) -> u64 {
        self.pages_held
    }

    /// Entries `mr` counts against the page budget.
    fn pages_of(mr: &Mr) -> u64 {
        match &mr.kind {
            MrKind::PageList { pages, .. } => pages.len() as u64,
            MrKind::FastReg { max_pages, .. } => u64::from(*max_pages),
            _ => 0,
        }
    }

    /// Whether `add` more entries fit once `release` entries are given back.
    fn pages_fit(&self, add: u64, release: u64) -> bool {
        self.pages_held.saturating_sub(release).saturating_add(add) <= self.max_pages
    }

    /// Replace the sink of ODP page requests.
    pub fn set_output(&mut self, out: Arc<dyn DeviceOutput>) {
        self.odp.set_output(out);
    }

    /// Number of allocated memory windows.
    pub fn mw_count(&self) -> u32 {
        self.mw_count
    }

    /// Number of registered MRs.
    pub fn len(&self) -> u32 {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Drop every MR (device reset). Variants are kept so old keys stay invalid.
    pub fn clear(&mut self) {
        // No reference made before the reset is read after it (spec §16.2 rule 6).
        self.fence.fence_device();
        for s in &mut self.slots {
            s.mr = None;
            s.charge = Charge::default();
            s.bound_mws = 0;
        }
        self.free = (1..self.slots.len() as u32).collect();
        self.count = 0;
        self.mw_count = 0;
        self.pages_held = 0;
        self.odp.clear();
    }

    /// Look up an MR by key; checks index and variant. A window's rkey is not an MR key
    /// (`InvalidKey`).
    pub fn get(&self, key: u32) -> Result<&Mr, MrError> {
        self.entry(key).and_then(|m| {
            if m.is_window() {
                Err(MrError::InvalidKey(key))
            } else {
                Ok(m)
            }
        })
    }

    /// Look up an MR or a window by key; checks index and variant.
    pub(super) fn entry(&self, key: u32) -> Result<&Mr, MrError> {
        let s = self
            .slots
            .get(key_index(key) as usize)
            .filter(|_| key_index(key) != 0)
            .ok_or(MrError::InvalidKey(key))?;
        let mr = s.mr.as_ref().ok_or(MrError::InvalidKey(key))?;
        if mr.key != key {
            return Err(MrError::StaleKey(key));
        }
        Ok(mr)
    }

    /// Fence the slot of `key` (spec §16.2 rule 6): called by each MR operation that takes a
    /// permission away, after it succeeded and before it returns.
    pub(crate) fn fence_slot(&self, key: u32) {
        if let Some(s) = self.slots.get(key_index(key) as usize) {
            self.fence.fence_slot(&s.gen);
        }
    }

    /// The fence and the generation of `key`'s slot, for a fabric reference made through the
    /// MR now (`transport::onecopy`); `None` for an unknown key.
    pub fn reference_gen(&self, key: u32) -> Option<(&crate::memory::fence::SlotGen, u64)> {
        let s = self.slots.get(key_index(key) as usize)?;
        Some((&s.gen, s.gen.load(std::sync::atomic::Ordering::Acquire)))
    }

    /// The device's fence (shared with every reference its engine made).
    pub fn fence(&self) -> &Arc<crate::memory::fence::DmaFence> {
        &self.fence
    }

    pub(super) fn get_mut(&mut self, key: u32) -> Result<&mut Mr, MrError> {
        let idx = key_index(key) as usize;
        if idx == 0 {
            return Err(MrError::InvalidKey(key));
        }
        let s = self.slots.get_mut(idx).ok_or(MrError::InvalidKey(key))?;
        let mr = s.mr.as_mut().ok_or(MrError::InvalidKey(key))?;
        if mr.key != key {
            return Err(MrError::StaleKey(key));
        }
        Ok(mr)
    }

    /// Whether `key` names an ODP MR, directly or as a window bound to one (the responder's
    /// ODP caps apply to the memory behind a window too, spec §2.2).
    pub fn is_odp_key(&self, key: u32) -> bool {
        match self.entry(key) {
            Ok(Mr {
                kind: MrKind::Window(w),
                ..
            }) => w
                .bound
                .is_some_and(|b| self.get(b.mr_key).is_ok_and(Mr::is_odp)),
            Ok(m) => m.is_odp(),
            Err(_) => false,
        }
    }

    /// Does any MR belong to `pd`? (DESTROY_PD → BUSY)
    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.slots
            .iter()
            .any(|s| s.mr.as_ref().is_some_and(|m| m.pd == pd))
    }

    /// Insert `mr`, which holds `charge` (see [`MrTable::charge_of`]).
    pub(super) fn alloc(&mut self, mut mr: Mr, charge: Charge) -> Result<u32, MrError> {
        let window = mr.is_window();
        if (!window && self.count >= self.max_mr) || (window && self.mw_count >= self.max_mw) {
            return Err(MrError::NoResources);
        }
        let pages = Self::pages_of(&mr);
        if !self.pages_fit(pages, 0) {
            return Err(MrError::NoResources);
        }
        let idx = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                if i > MAX_MR_INDEX {
                    return Err(MrError::NoResources);
                }
                // The variant is incremented below, so the first key's variant is this + 1:
                // uniformly random as well.
                self.slots.push(Slot {
                    variant: self.rng.next_u8(),
                    ..Default::default()
                });
                i
            }
        };
        let slot = &mut self.slots[idx as usize];
        slot.variant = slot.variant.wrapping_add(1);
        mr.key = (idx << 8) | slot.variant as u32;
        let key = mr.key;
        slot.mr = Some(mr);
        slot.charge = charge;
        slot.bound_mws = 0;
        if window {
            self.mw_count += 1;
        } else {
            self.count += 1;
        }
        self.pages_held += pages;
        Ok(key)
    }

    /// QPNs whose ODP faults were resolved (resident, failed or timed out) since the last call;
    /// the transport reschedules them.
    pub fn take_resumed(&mut self) -> Vec<u32> {
        self.odp.take_resumed()
    }

    /// The resumed QPs `mine` accepts (one engine worker's, `transport::on_worker_tick`).
    pub fn take_resumed_where(&mut self, mine: impl Fn(u32) -> bool) -> Vec<u32> {
        self.odp.take_resumed_where(mine)
    }

    /// Resumed QPs not taken yet (a worker that took its own kicks the others).
    pub fn resumed_pending(&self) -> bool {
        self.odp.resumed_pending()
    }

    /// Configured chunk shift.
    pub fn odp_config(&self) -> &OdpConfig {
        &self.odp.config
    }

    pub(crate) fn odp_parts(
        &mut self,
        key: u32,
    ) -> Result<(&mut Mr, &mut OdpState, &GuestMem), MrError> {
        let idx = key_index(key) as usize;
        let mr = self
            .slots
            .get_mut(idx)
            .filter(|_| idx != 0)
            .and_then(|s| s.mr.as_mut())
            .ok_or(MrError::InvalidKey(key))?;
        if mr.key != key {
            return Err(MrError::StaleKey(key));
        }
        if mr.is_window() {
            return Err(MrError::InvalidKey(key));
        }
        Ok((mr, &mut self.odp, &self.mem))
    }

    /// An MR by slot index together with the ODP state (ODP reclaim by LRU entry).
    pub(crate) fn odp_parts_by_index(&mut self, idx: u32) -> Option<(&mut Mr, &mut OdpState)> {
        let mr = self
            .slots
            .get_mut(idx as usize)
            .and_then(|s| s.mr.as_mut())?;
        Some((mr, &mut self.odp))
    }

    /// The MR in slot `idx`, if any.
    pub(crate) fn get_by_index(&self, idx: u32) -> Result<&Mr, MrError> {
        self.slots
            .get(idx as usize)
            .and_then(|s| s.mr.as_ref())
            .ok_or(MrError::InvalidKey(idx << 8))
    }

    /// Number of slots (index space in use, slot 0 included).
    pub(crate) fn slot_count(&self) -> u32 {
        self.slots.len() as u32
    }
}
