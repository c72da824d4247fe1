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
//! and translates with [`MrTable::resolve`] / [`MrTable::resolve_for`] only the bytes of the
//! packet it is moving, so an ODP transfer larger than the resident budget progresses chunk by
//! chunk (spec §12.4).

use std::collections::VecDeque;
use std::sync::Arc;

use thiserror::Error;

use super::odp::{OdpConfig, OdpMr, OdpState};
use crate::budget::{Budget, Charge};
use crate::device::output::DeviceOutput;
use crate::guest::GuestMem;

/// VRDMA_ACCESS_* bits.
pub const ACCESS_LOCAL_WRITE: u32 = 1 << 0;
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
pub const ACCESS_REMOTE_READ: u32 = 1 << 2;
pub const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
pub const ACCESS_MW_BIND: u32 = 1 << 4;
pub const ACCESS_ZERO_BASED: u32 = 1 << 5;
pub const ACCESS_ON_DEMAND: u32 = 1 << 6;
pub const ACCESS_FLUSH_GLOBAL: u32 = 1 << 8;
pub const ACCESS_FLUSH_PERSISTENT: u32 = 1 << 9;
/// The IBTA 1.5 FLUSH rights (one per placement type).
pub const ACCESS_FLUSH: u32 = ACCESS_FLUSH_GLOBAL | ACCESS_FLUSH_PERSISTENT;
/// Every access bit the device knows.
pub const ACCESS_ALL: u32 = ((1 << 7) - 1) | ACCESS_FLUSH;
/// Bits that need remote access rights.
pub const ACCESS_REMOTE: u32 =
    ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC | ACCESS_FLUSH;
/// Bits that imply a write into the MR's memory.
pub const ACCESS_WRITES: u32 = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC;

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
    /// Draws the first variant of each new slot.
    rng: crate::ids::IdRng,
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
    if access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC) != 0
        && access & ACCESS_LOCAL_WRITE == 0
    {
        return Err(MrError::BadAccess(access));
    }
    // Guest memory is host RAM: nothing can be made persistent, so no MR may promise it.
    if access & ACCESS_FLUSH_PERSISTENT != 0 {
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

    /// Every slot past the reserved slot 0, with its key variant and MR (migration, spec §17.3).
    /// Windows are not migrated (the caller refuses to save while any exists).
    pub fn saved_slots(&self) -> impl Iterator<Item = (u32, u8, Option<&Mr>)> {
        self.slots
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, s)| (i as u32, s.variant, s.mr.as_ref()))
    }

    /// Fill an empty table from migrated slots `(variant, mr)` for indices 1, 2, ... (spec
    /// §17.3). Each MR is checked like a new registration of its kind except against guest
    /// memory (the destination has no memory table yet), and charged; ODP MRs come back with no
    /// resident chunk (they fault again). On error the table is left empty.
    pub fn restore(
        &mut self,
        saved: Vec<(u8, Option<Mr>)>,
        max_mr_size: u64,
    ) -> Result<(), MrError> {
        self.clear();
        let r = self.restore_inner(saved, max_mr_size);
        if r.is_err() {
            self.clear();
            self.slots.truncate(1);
            self.free.clear();
        }
        r
    }

    fn restore_inner(
        &mut self,
        saved: Vec<(u8, Option<Mr>)>,
        max_mr_size: u64,
    ) -> Result<(), MrError> {
        if saved.len() as u64 > u64::from(MAX_MR_INDEX) {
            return Err(MrError::NoResources);
        }
        self.slots.truncate(1);
        self.free.clear();
        for (i, (variant, mr)) in saved.into_iter().enumerate() {
            let idx = i as u32 + 1;
            let mut slot = Slot {
                variant,
                ..Default::default()
            };
            if let Some(mr) = mr {
                if mr.key != (idx << 8) | u32::from(variant) {
                    return Err(MrError::InvalidKey(mr.key));
                }
                Self::check_saved(&mr, max_mr_size)?;
                if self.count >= self.max_mr {
                    return Err(MrError::NoResources);
                }
                let pages = Self::pages_of(&mr);
                if !self.pages_fit(pages, 0) {
                    return Err(MrError::NoResources);
                }
                slot.charge = self.charge(pages)?;
                self.count += 1;
                self.pages_held += pages;
                slot.mr = Some(mr);
            } else {
                self.free.push_back(idx);
            }
            self.slots.push(slot);
        }
        Ok(())
    }

    /// The checks of REG_MR / REG_DMA_MR / ALLOC_FAST_REG_MR / REG_ODP_MR for a migrated MR,
    /// without the guest-memory ones.
    fn check_saved(mr: &Mr, max_mr_size: u64) -> Result<(), MrError> {
        let geometry = |page_shift: u32, pages: &[u64], iova: u64, length: u64| {
            if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
                return Err(MrError::Invalid("page_shift"));
            }
            iova.checked_add(length)
                .ok_or(MrError::Invalid("iova + length overflows"))?;
            let ps = 1u64 << page_shift;
            let need = ((iova & (ps - 1)) + length).div_ceil(ps);
            if need > pages.len() as u64 || pages.iter().any(|p| p & (ps - 1) != 0) {
                return Err(MrError::Invalid("page list does not cover the MR"));
            }
            Ok(())
        };
        if mr.access & ACCESS_FLUSH_PERSISTENT != 0 {
            return Err(MrError::NotSupported);
        }
        match &mr.kind {
            MrKind::PageList { page_shift, pages } => {
                if mr.length > max_mr_size
                    || pages.len() as u64 > u64::from(vrdma_spec::VRDMA_CMD_MAX_PAGES)
                {
                    return Err(MrError::Invalid("page-list MR too large"));
                }
                geometry(*page_shift, pages, mr.iova, mr.length)
            }
            MrKind::Dma => Ok(()),
            MrKind::FastReg {
                max_pages,
                page_shift,
                pages,
                valid,
            } => {
                if *max_pages == 0 || pages.len() as u64 > u64::from(*max_pages) {
                    return Err(MrError::Invalid("max_num_sg"));
                }
                if *valid {
                    geometry(*page_shift, pages, mr.iova, mr.length)
                } else {
                    Ok(())
                }
            }
            MrKind::Odp(_) => {
                if mr.length == 0 || mr.length > max_mr_size {
                    return Err(MrError::Invalid("ODP MR length"));
                }
                mr.iova
                    .checked_add(mr.length)
                    .map(|_| ())
                    .ok_or(MrError::Invalid("iova + length overflows"))
            }
            MrKind::ImplicitOdp(_) => {
                if mr.iova != 0 || mr.length != u64::MAX {
                    return Err(MrError::Invalid("implicit MR geometry"));
                }
                Ok(())
            }
            MrKind::Window(_) => Err(MrError::NotSupported),
        }
    }

    /// REG_MR: a page-list MR. Validates flags, geometry and every page against guest memory.
    pub fn reg_page_list(&mut self, spec: &PageListSpec, max_mr_size: u64) -> Result<u32, MrError> {
        let (mr, charge) = self.page_list_mr(spec, max_mr_size, 0)?;
        self.alloc(mr, charge)
    }

    /// REREG_MR: replace PD, access, range and page list of the page-list MR `key`, keeping the
    /// key. Validation is REG_MR's; on error the MR is unchanged. Accesses resolve the key again
    /// for every step, so nothing can still use the old translation after this returns.
    pub fn rereg_page_list(
        &mut self,
        key: u32,
        spec: &PageListSpec,
        max_mr_size: u64,
    ) -> Result<(), MrError> {
        if !matches!(self.get(key)?.kind, MrKind::PageList { .. }) {
            return Err(MrError::NotSupported);
        }
        // Like the page count, the budget takes the current list as given back first (spec
        // §11.8): only what the new list adds is charged.
        let idx = key_index(key) as usize;
        let held = self.slots[idx].charge.bytes();
        let (mut mr, extra) = self.page_list_mr(spec, max_mr_size, held)?;
        let (add, release) = (Self::pages_of(&mr), Self::pages_of(self.get(key)?));
        if !self.pages_fit(add, release) {
            return Err(MrError::NoResources);
        }
        mr.key = key;
        *self.get_mut(key)? = mr;
        let charge = &mut self.slots[idx].charge;
        charge.shrink(held.saturating_sub(Self::charge_of(add)));
        charge.absorb(extra);
        self.pages_held = self.pages_held - release + add;
        Ok(())
    }

    /// A checked page-list MR, not yet in the table (key 0), and the charge for it beyond the
    /// `credit` bytes the caller already holds for it.
    fn page_list_mr(
        &self,
        spec: &PageListSpec,
        max_mr_size: u64,
        credit: u64,
    ) -> Result<(Mr, Charge), MrError> {
        let PageListSpec {
            pd,
            access,
            iova,
            length,
            page_shift,
            pages,
        } = *spec;
        check_access_flags(access)?;
        if access & ACCESS_ON_DEMAND != 0 {
            return Err(MrError::Invalid("ON_DEMAND on a page-list MR"));
        }
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
            return Err(MrError::Invalid("page_shift"));
        }
        if length > max_mr_size {
            return Err(MrError::Invalid("length > max_mr_size"));
        }
        iova.checked_add(length)
            .ok_or(MrError::Invalid("iova + length overflows"))?;
        let ps = 1u64 << page_shift;
        let first_off = iova & (ps - 1);
        let need = (first_off + length).div_ceil(ps);
        if pages.len() as u64 != need {
            return Err(MrError::Invalid(
                "npages does not match iova/length/page_shift",
            ));
        }
        // Spec §11.1: no command carries more (the control queue cannot deliver more either;
        // checked here too so no other caller can store a longer list).
        if need > u64::from(vrdma_spec::VRDMA_CMD_MAX_PAGES) {
            return Err(MrError::Invalid("npages > VRDMA_CMD_MAX_PAGES"));
        }
        self.check_pages(pages, page_shift)?;
        let charge = self
            .budget
            .try_charge(Self::charge_of(need).saturating_sub(credit))
            .map_err(|_| MrError::NoResources)?;
        let mr = Mr {
            key: 0,
            pd,
            access,
            iova,
            length,
            kind: MrKind::PageList {
                page_shift,
                pages: pages.to_vec(),
            },
        };
        Ok((mr, charge))
    }

    fn check_pages(&self, pages: &[u64], page_shift: u32) -> Result<(), MrError> {
        let ps = 1u64 << page_shift;
        for &p in pages {
            if p & (ps - 1) != 0 {
                return Err(MrError::Invalid(
                    "page address not aligned to the page size",
                ));
            }
            if !self.mem.check_range(p, ps) {
                return Err(MrError::BadAddress { gpa: p });
            }
        }
        Ok(())
    }

    /// REG_DMA_MR: iova == GPA; remote access bits are refused (`BadAccess` → STATUS_ACCESS).
    pub fn reg_dma(&mut self, pd: u32, access: u32) -> Result<u32, MrError> {
        check_access_flags(access)?;
        if access & (ACCESS_REMOTE | ACCESS_ON_DEMAND) != 0 {
            return Err(MrError::BadAccess(access));
        }
        let charge = self.charge(0)?;
        self.alloc(
            Mr {
                key: 0,
                pd,
                access,
                iova: 0,
                length: u64::MAX,
                kind: MrKind::Dma,
            },
            charge,
        )
    }

    /// ALLOC_FAST_REG_MR: empty (invalid) MR with room for `max_pages` pages.
    pub fn alloc_fast_reg(
        &mut self,
        pd: u32,
        max_pages: u32,
        max_list: u32,
    ) -> Result<u32, MrError> {
        if max_pages == 0 || max_pages > max_list {
            return Err(MrError::Invalid("max_num_sg"));
        }
        // The capacity is charged now: FRWR fills it from the data path, which cannot fail a
        // WQE for want of memory the MR was promised.
        let charge = self.charge(u64::from(max_pages))?;
        self.alloc(
            Mr {
                key: 0,
                pd,
                access: 0,
                iova: 0,
                length: 0,
                kind: MrKind::FastReg {
                    max_pages,
                    page_shift: MIN_PAGE_SHIFT,
                    pages: Vec::new(),
                    valid: false,
                },
            },
            charge,
        )
    }

    /// REG_ODP_MR (explicit) or REG_IMPLICIT_MR (`implicit`: iova must be 0 and length u64::MAX).
    pub fn reg_odp(
        &mut self,
        pd: u32,
        access: u32,
        iova: u64,
        length: u64,
        implicit: bool,
        max_mr_size: u64,
    ) -> Result<u32, MrError> {
        if (implicit && !self.odp.config.implicit) || (!implicit && !self.odp.config.enabled) {
            return Err(MrError::NotSupported);
        }
        check_access_flags(access)?;
        if implicit {
            if iova != 0 || length != u64::MAX {
                return Err(MrError::Invalid(
                    "implicit MR must be iova 0, length u64::MAX",
                ));
            }
        } else {
            if length == 0 || length > max_mr_size {
                return Err(MrError::Invalid("ODP MR length"));
            }
            iova.checked_add(length)
                .ok_or(MrError::Invalid("iova + length overflows"))?;
        }
        let odp = OdpMr::default();
        let charge = self.charge(0)?;
        self.alloc(
            Mr {
                key: 0,
                pd,
                access: access | ACCESS_ON_DEMAND,
                iova,
                length,
                kind: if implicit {
                    MrKind::ImplicitOdp(odp)
                } else {
                    MrKind::Odp(odp)
                },
            },
            charge,
        )
    }

    /// DEREG_MR. The slot's variant is kept so the old key stays invalid after reuse.
    pub fn dereg(&mut self, key: u32) -> Result<(), MrError> {
        self.get(key)?;
        let idx = key_index(key);
        let mr = self.slots[idx as usize].mr.take();
        self.slots[idx as usize].charge = Charge::default();
        // Windows bound to the MR stay bound to its (now stale) key: their accesses fail
        // (spec §12.8), and their unbinding no longer counts against this slot.
        self.slots[idx as usize].bound_mws = 0;
        if let Some(mr) = mr {
            self.pages_held -= Self::pages_of(&mr);
            self.odp.forget_mr(&mr);
        }
        self.free.push_back(idx);
        self.count -= 1;
        Ok(())
    }

    /// REG_MR WQE (fast registration) executed by the requester. `pd` is the QP's PD; `key` the new
    /// key from the WQE (index must name a fast-reg MR of that PD, which must be invalid); the page
    /// list (`page_list_len` u64 GPAs at `page_list_addr`) is read from guest memory.
    #[allow(clippy::too_many_arguments)]
    pub fn fast_register(
        &mut self,
        pd: u32,
        key: u32,
        access: u32,
        iova: u64,
        length: u64,
        page_shift: u32,
        page_list_addr: u64,
        page_list_len: u32,
    ) -> Result<(), MrError> {
        check_access_flags(access)?;
        if access & ACCESS_ON_DEMAND != 0 {
            return Err(MrError::BadAccess(access));
        }
        let idx = key_index(key) as usize;
        let slot_mr = self
            .slots
            .get(idx)
            .filter(|_| idx != 0)
            .and_then(|s| s.mr.as_ref())
            .ok_or(MrError::InvalidKey(key))?;
        if slot_mr.pd != pd {
            return Err(MrError::WrongPd { key, pd });
        }
        let max_pages = match &slot_mr.kind {
            MrKind::FastReg {
                valid: false,
                max_pages,
                ..
            } => *max_pages,
            _ => return Err(MrError::InvalidOp(key)),
        };
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
            return Err(MrError::Invalid("page_shift"));
        }
        if page_list_len > max_pages {
            return Err(MrError::Invalid("page_list_len > max_num_sg"));
        }
        iova.checked_add(length)
            .ok_or(MrError::Invalid("iova + length overflows"))?;
        let ps = 1u64 << page_shift;
        let first_off = iova & (ps - 1);
        let need = (first_off + length).div_ceil(ps);
        if need > page_list_len as u64 {
            return Err(MrError::Invalid("length exceeds the page list"));
        }
        let mut pages = Vec::with_capacity(page_list_len as usize);
        for i in 0..page_list_len as u64 {
            let a = page_list_addr
                .checked_add(i * 8)
                .ok_or(MrError::BadAddress {
                    gpa: page_list_addr,
                })?;
            let p = self
                .mem
                .read_u64(a)
                .map_err(|_| MrError::BadAddress { gpa: a })?;
            pages.push(p);
        }
        self.check_pages(&pages, page_shift)?;
        let variant = key_variant(key);
        let slot = &mut self.slots[idx];
        slot.variant = variant;
        if let Some(mr) = slot.mr.as_mut() {
            mr.key = key;
            mr.access = access;
            mr.iova = iova;
            mr.length = length;
            mr.kind = MrKind::FastReg {
                max_pages,
                page_shift,
                pages,
                valid: true,
            };
        }
        Ok(())
    }

    /// LOCAL_INV WQE: invalidate the fast-reg MR or the type 2B window named by exactly `key` in
    /// `pd` (spec §6.1, §12.8).
    pub fn local_invalidate(&mut self, key: u32, pd: u32) -> Result<(), MrError> {
        self.invalidate(key, pd, None)
    }

    /// SEND_WITH_INV arriving on QP `qpn` of PD `pd`: as LOCAL_INV, and a type 2B window must be
    /// associated with `qpn` (spec §12.8, §14.6).
    pub fn remote_invalidate(&mut self, key: u32, pd: u32, qpn: u32) -> Result<(), MrError> {
        self.invalidate(key, pd, Some(qpn))
    }

    fn invalidate(&mut self, key: u32, pd: u32, qpn: Option<u32>) -> Result<(), MrError> {
        if self.entry(key)?.is_window() {
            return self.invalidate_window(key, pd, qpn);
        }
        // IBTA 10.6.7 (as Linux rxe): a region with bound windows cannot be invalidated.
        if self.slots[key_index(key) as usize].bound_mws > 0 {
            return Err(MrError::InvalidOp(key));
        }
        let mr = self.get_mut(key)?;
        if mr.pd != pd {
            return Err(MrError::WrongPd { key, pd });
        }
        match &mut mr.kind {
            MrKind::FastReg { valid, pages, .. } => {
                *valid = false;
                pages.clear();
                Ok(())
            }
            _ => Err(MrError::InvalidOp(key)),
        }
    }

    /// Resolve without a waiting QP (see [`MrTable::resolve_for`]).
    pub fn resolve(
        &mut self,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        access: u32,
    ) -> Result<Vec<GuestRange>, MrError> {
        self.resolve_for(None, key, pd, iova, len, access)
    }

    /// Validate without translating and without ODP faults: key, variant, PD, access rights,
    /// fast-reg validity and bounds, exactly as `resolve` checks them. Use it to validate whole
    /// SGEs / RETH ranges up front, then `resolve_for` per packet: resolving a large ODP range at
    /// once faults in every chunk of it, and a range larger than the resident budget could never
    /// be resident as a whole.
    pub fn check_access(
        &self,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        access: u32,
    ) -> Result<(), MrError> {
        let mr = self.get(key)?;
        check_mr(mr, key, pd, iova, len, access)?;
        if len != 0 && matches!(mr.kind, MrKind::Dma) && !self.mem.check_range(iova, len) {
            return Err(MrError::BadAddress { gpa: iova });
        }
        Ok(())
    }

    /// Translate `[iova, iova + len)` of the MR named by `key` for `access` (VRDMA_ACCESS_* bits;
    /// local reads need no bit; pass LOCAL_WRITE for local writes, REMOTE_* for incoming requests).
    /// `waiter` is the QPN to resume when an ODP fault is resolved (see `take_resumed`).
    /// `len == 0` validates key, PD and access only and returns no ranges.
    pub fn resolve_for(
        &mut self,
        waiter: Option<u32>,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        access: u32,
    ) -> Result<Vec<GuestRange>, MrError> {
        let mut out = Vec::new();
        self.resolve_into(waiter, key, pd, iova, len, access, &mut out)?;
        Ok(out)
    }

    /// [`MrTable::resolve_for`] into `out` (cleared first), so a caller on the data path can
    /// reuse one vector: pinned MRs (DMA, page list, fast-reg) then translate without
    /// allocating. On error `out` is left empty.
    #[allow(clippy::too_many_arguments)]
    pub fn resolve_into(
        &mut self,
        waiter: Option<u32>,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        access: u32,
        out: &mut Vec<GuestRange>,
    ) -> Result<(), MrError> {
        out.clear();
        let idx = key_index(key) as usize;
        let mem = &self.mem;
        let odp = &mut self.odp;
        let mr = self
            .slots
            .get_mut(idx)
            .filter(|_| idx != 0)
            .and_then(|s| s.mr.as_mut())
            .ok_or(MrError::InvalidKey(key))?;
        if mr.key != key {
            return Err(MrError::StaleKey(key));
        }
        check_mr(mr, key, pd, iova, len, access)?;
        if len == 0 {
            return Ok(());
        }
        if mr.is_window() {
            // `check_mr` refused it already; kept so no window is ever translated here.
            return Err(MrError::AccessDenied { key, access });
        }
        let mr_iova = mr.iova;
        let mr_len = mr.length;
        match &mut mr.kind {
            MrKind::Dma => {
                if !mem.check_range(iova, len) {
                    return Err(MrError::BadAddress { gpa: iova });
                }
                out.push(GuestRange { gpa: iova, len });
            }
            MrKind::PageList { page_shift, pages }
            | MrKind::FastReg {
                page_shift, pages, ..
            } => translate_pages(mr_iova, *page_shift, pages, iova, len, out),
            MrKind::Window(_) => return Err(MrError::AccessDenied { key, access }),
            MrKind::Odp(o) | MrKind::ImplicitOdp(o) => {
                // Only ODP needs the clock (a vDSO call was ~2.5 % of the UDP profile when
                // every translation read it).
                let now = odp.now();
                *out = odp.resolve(
                    o,
                    key,
                    mr_iova,
                    mr_len,
                    iova,
                    len,
                    access & ACCESS_WRITES != 0,
                    waiter,
                    now,
                )?
            }
        }
        Ok(())
    }

    /// QPNs whose ODP faults were resolved (resident, failed or timed out) since the last call;
    /// the transport reschedules them.
    pub fn take_resumed(&mut self) -> Vec<u32> {
        self.odp.take_resumed()
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

/// Translate a range of a page-list MR into coalesced guest ranges. The caller checked bounds.
fn translate_pages(
    mr_iova: u64,
    page_shift: u32,
    pages: &[u64],
    iova: u64,
    len: u64,
    out: &mut Vec<GuestRange>,
) {
    let ps = 1u64 << page_shift;
    let mut off = (mr_iova & (ps - 1)) + (iova - mr_iova);
    let mut left = len;
    while left > 0 {
        let pi = (off >> page_shift) as usize;
        let in_page = off & (ps - 1);
        let n = (ps - in_page).min(left);
        // pi < pages.len(): bounds were checked against the MR and npages matches its length.
        let Some(&page) = pages.get(pi) else {
            break;
        };
        let gpa = page + in_page;
        match out.last_mut() {
            Some(last) if last.gpa + last.len == gpa => last.len += n,
            _ => out.push(GuestRange { gpa, len: n }),
        }
        off += n;
        left -= n;
    }
}

/// The checks `check_access` and `resolve_for` share, on an MR already found by its key: PD,
/// access rights, fast-reg validity, DMA MRs local only, and bounds (overflow-safe; DMA and
/// implicit ODP MRs span the whole address space). One place, so both always agree.
fn check_mr(mr: &Mr, key: u32, pd: u32, iova: u64, len: u64, access: u32) -> Result<(), MrError> {
    if mr.pd != pd {
        return Err(MrError::WrongPd { key, pd });
    }
    // A window's rkey is used only through `check_remote` / `resolve_remote_into` (spec §12.8),
    // never as an lkey or without the QP a type 2B window is bound to.
    if mr.is_window() {
        return Err(MrError::AccessDenied { key, access });
    }
    check_range_rights(mr, key, iova, len, access)
}

/// Rights and bounds of an MR or a bound window (`mr.access`, `[mr.iova, mr.end())`).
pub(super) fn check_range_rights(
    mr: &Mr,
    key: u32,
    iova: u64,
    len: u64,
    access: u32,
) -> Result<(), MrError> {
    let need = access & (ACCESS_WRITES | ACCESS_REMOTE_READ | ACCESS_FLUSH);
    if need & !mr.access != 0 {
        return Err(MrError::AccessDenied { key, access });
    }
    if let MrKind::FastReg { valid: false, .. } = mr.kind {
        return Err(MrError::Invalidated(key));
    }
    if matches!(mr.kind, MrKind::Dma) && access & ACCESS_REMOTE != 0 {
        return Err(MrError::AccessDenied { key, access });
    }
    if len == 0 {
        return Ok(());
    }
    let oob = MrError::OutOfBounds { key, iova, len };
    let end = iova.checked_add(len).ok_or(oob.clone())?;
    if !matches!(mr.kind, MrKind::Dma | MrKind::ImplicitOdp(_))
        && (iova < mr.iova || end > mr.iova.saturating_add(mr.length))
    {
        return Err(oob);
    }
    Ok(())
}
