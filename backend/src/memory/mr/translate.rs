//! iova -> guest-physical translation and the access checks on the way (spec §12.3): what the
//! requester's gathers and the responder's RETH placements resolve through.

use super::*;
use crate::memory::Access;

impl MrTable {
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
    pub fn check_access(&self, a: Access) -> Result<(), MrError> {
        let mr = self.get(a.key)?;
        check_mr(mr, &a)?;
        if a.len != 0 && matches!(mr.kind, MrKind::Dma) && !self.mem.check_range(a.iova, a.len) {
            return Err(MrError::BadAddress { gpa: a.iova });
        }
        Ok(())
    }

    /// Translate `[iova, iova + len)` of the MR named by `key` for `access` (VRDMA_ACCESS_* bits;
    /// local reads need no bit; pass LOCAL_WRITE for local writes, REMOTE_* for incoming requests).
    /// `waiter` is the QPN to resume when an ODP fault is resolved (see `take_resumed`).
    /// `len == 0` validates key, PD and access only and returns no ranges. The values of an
    /// [`Access`], spelled out; the data path passes one to [`MrTable::resolve_into`] (through
    /// `transport::ctx`).
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
        let a = Access {
            key,
            pd,
            iova,
            len,
            rights: access,
        };
        self.resolve_into(waiter, a, &mut out)?;
        Ok(out)
    }

    /// [`MrTable::resolve_for`] into `out` (cleared first), so a caller on the data path can
    /// reuse one vector: pinned MRs (DMA, page list, fast-reg) then translate without
    /// allocating. On error `out` is left empty.
    pub fn resolve_into(
        &mut self,
        waiter: Option<u32>,
        a: Access,
        out: &mut Vec<GuestRange>,
    ) -> Result<(), MrError> {
        if let Some(r) = self.resolve_pinned_into(a, out) {
            return r;
        }
        // Only an ODP MR is left: `resolve_pinned_into` answered every other key.
        let odp = &mut self.odp;
        let mr = self
            .slots
            .get_mut(key_index(a.key) as usize)
            .and_then(|s| s.mr.as_mut())
            .filter(|m| m.key == a.key)
            .ok_or(MrError::InvalidKey(a.key))?;
        check_mr(mr, &a)?;
        if a.len == 0 {
            return Ok(());
        }
        let (mr_iova, mr_len) = (mr.iova, mr.length);
        let (MrKind::Odp(o) | MrKind::ImplicitOdp(o)) = &mut mr.kind else {
            return Err(MrError::AccessDenied {
                key: a.key,
                access: a.rights,
            });
        };
        // Only ODP needs the clock (a vDSO call was ~2.5 % of the UDP profile when every
        // translation read it).
        let now = odp.now();
        *out = odp.resolve(o, mr_iova, mr_len, a, waiter, now)?;
        Ok(())
    }
}

impl MrTable {
    /// [`MrTable::resolve_into`] through a shared borrow, for every MR but an ODP one (whose
    /// translation moves chunks and LRU ticks): `None` for an ODP MR (`out` empty), which needs
    /// `resolve_into`. The engine workers translate pinned MRs under the table's read lock, so
    /// they never wait for each other there.
    pub fn resolve_pinned_into(
        &self,
        a: Access,
        out: &mut Vec<GuestRange>,
    ) -> Option<Result<(), MrError>> {
        out.clear();
        // `entry`, not `get`: a window's key fails in `check_mr`, as in `resolve_into`.
        let mr = match self.entry(a.key) {
            Ok(mr) => mr,
            Err(e) => return Some(Err(e)),
        };
        if matches!(mr.kind, MrKind::Odp(_) | MrKind::ImplicitOdp(_)) {
            return None;
        }
        Some((|| {
            check_mr(mr, &a)?;
            if a.len == 0 {
                return Ok(());
            }
            match &mr.kind {
                MrKind::Dma => {
                    if !self.mem.check_range(a.iova, a.len) {
                        return Err(MrError::BadAddress { gpa: a.iova });
                    }
                    out.push(GuestRange {
                        gpa: a.iova,
                        len: a.len,
                    });
                }
                MrKind::PageList { page_shift, pages }
                | MrKind::FastReg {
                    page_shift, pages, ..
                } => translate_pages(mr.iova, *page_shift, pages, a.iova, a.len, out),
                // `check_mr` refused a window already; kept so none is ever translated here.
                _ => {
                    return Err(MrError::AccessDenied {
                        key: a.key,
                        access: a.rights,
                    })
                }
            }
            Ok(())
        })())
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
fn check_mr(mr: &Mr, a: &Access) -> Result<(), MrError> {
    if mr.pd != a.pd {
        return Err(MrError::WrongPd {
            key: a.key,
            pd: a.pd,
        });
    }
    // A window's rkey is used only through `check_remote` / `resolve_remote_into` (spec §12.8),
    // never as an lkey or without the QP a type 2B window is bound to.
    if mr.is_window() {
        return Err(MrError::AccessDenied {
            key: a.key,
            access: a.rights,
        });
    }
    check_range_rights(mr, a)
}

/// Rights and bounds of an MR or a bound window (`mr.access`, `[mr.iova, mr.end())`); `a.pd`
/// is the caller's to check.
pub(in crate::memory) fn check_range_rights(mr: &Mr, a: &Access) -> Result<(), MrError> {
    let (key, iova, len, access) = (a.key, a.iova, a.len, a.rights);
    let need = access & (ACCESS_WRITES | VRDMA_ACCESS_REMOTE_READ | ACCESS_FLUSH);
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
