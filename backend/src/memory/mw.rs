//! Memory windows, type 1 and type 2B (spec §12.8, IBTA 10.6.7).
//!
//! A window lives in an MR table slot ([`MrKind::Window`]), so its rkey comes from the MR key
//! space (§12.1) and a stale rkey is rejected like a stale MR key. While bound, the slot's
//! `Mr::access`, `iova` and `length` are the window's remote rights and range; the [`Binding`]
//! names the MR (by its key at bind time) and where the window starts in the MR's iova space.
//! Remote accesses ([`MrTable::check_remote`], [`MrTable::resolve_remote_into`]) check the window
//! and then translate through the MR with the MR checks of §12.3, so an MR deregistered,
//! invalidated or re-keyed since the bind makes the access fail.

use super::mr::{
    check_range_rights, key_index, key_variant, GuestRange, Mr, MrError, MrKind, MrTable,
};
use super::Access;
use vrdma_spec::{
    VRDMA_ACCESS_LOCAL_WRITE, VRDMA_ACCESS_MW_BIND, VRDMA_ACCESS_REMOTE_ATOMIC,
    VRDMA_ACCESS_REMOTE_READ, VRDMA_ACCESS_REMOTE_WRITE, VRDMA_ACCESS_ZERO_BASED, VRDMA_MW_TYPE_1,
    VRDMA_MW_TYPE_2,
};

/// Rights a bind may ask for (§12.8 step 1); `LOCAL_WRITE` is accepted and ignored.
const BIND_ACCESS: u32 = VRDMA_ACCESS_REMOTE_WRITE
    | VRDMA_ACCESS_REMOTE_READ
    | VRDMA_ACCESS_REMOTE_ATOMIC
    | VRDMA_ACCESS_ZERO_BASED
    | VRDMA_ACCESS_LOCAL_WRITE;
/// Rights a bound window keeps.
const WINDOW_RIGHTS: u32 =
    VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_READ | VRDMA_ACCESS_REMOTE_ATOMIC;

/// A memory window's type and binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// `VRDMA_MW_TYPE_1` or `VRDMA_MW_TYPE_2` (IBTA type 2B).
    pub mw_type: u32,
    pub bound: Option<Binding>,
}

/// What a bound window translates through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The MR's key at bind time.
    pub mr_key: u32,
    /// The MR iova of the window's first byte (`wr.bind_mw.addr`).
    pub base: u64,
    /// Type 2B: the QP the window is associated with.
    pub qpn: Option<u32>,
}

/// A BIND_MW WQE (`wr.bind_mw`) and the QP executing it.
#[derive(Debug, Clone, Copy, Default)]
pub struct BindMw {
    pub qp_pd: u32,
    pub qpn: u32,
    pub mw_key: u32,
    pub new_key: u32,
    pub mr_key: u32,
    pub addr: u64,
    pub length: u64,
    pub access: u32,
}

impl MrTable {
    /// Number of memory windows.
    pub fn mw_len(&self) -> u32 {
        self.mw_count
    }

    /// ALLOC_MW (spec §12.8): a type 1 window (valid, unbound) or a free type 2B window in `pd`.
    pub fn alloc_mw(&mut self, pd: u32, mw_type: u32) -> Result<u32, MrError> {
        if self.max_mw == 0 {
            return Err(MrError::NotSupported);
        }
        if mw_type != VRDMA_MW_TYPE_1 && mw_type != VRDMA_MW_TYPE_2 {
            return Err(MrError::Invalid("memory window type"));
        }
        let charge = self.charge(0)?;
        self.alloc(
            Mr::unmapped(
                pd,
                MrKind::Window(Window {
                    mw_type,
                    bound: None,
                }),
            ),
            charge,
        )
    }

    /// DEALLOC_MW: only the index bits of `key` are used; unbinds, then frees the slot (its
    /// variant is kept, so the rkey stays invalid after the slot is reused).
    pub fn dealloc_mw(&mut self, key: u32) -> Result<(), MrError> {
        let idx = key_index(key);
        let is_window = idx != 0
            && self
                .slots
                .get(idx as usize)
                .and_then(|s| s.mr.as_ref())
                .is_some_and(Mr::is_window);
        if !is_window {
            return Err(MrError::InvalidKey(key));
        }
        self.unbind(idx);
        self.slots[idx as usize].mr = None;
        self.slots[idx as usize].bound_mws = 0;
        self.free.push_back(idx);
        self.mw_count -= 1;
        Ok(())
    }

    /// The window in slot `idx`, if that slot holds one.
    fn window_mut(&mut self, idx: u32) -> Option<(&mut Mr, Window)> {
        let mr = self.slots.get_mut(idx as usize)?.mr.as_mut()?;
        match mr.kind {
            MrKind::Window(w) => Some((mr, w)),
            _ => None,
        }
    }

    /// Unbind the window in slot `idx` (no-op if unbound): it grants nothing until bound again,
    /// and no longer counts against its MR.
    fn unbind(&mut self, idx: u32) {
        let Some((mr, w)) = self.window_mut(idx) else {
            return;
        };
        mr.access = 0;
        mr.iova = 0;
        mr.length = 0;
        mr.kind = MrKind::Window(Window { bound: None, ..w });
        let Some(b) = w.bound else {
            return;
        };
        if let Some(s) = self.slots.get_mut(key_index(b.mr_key) as usize) {
            if s.mr.as_ref().is_some_and(|m| m.key == b.mr_key) {
                s.bound_mws = s.bound_mws.saturating_sub(1);
            }
        }
    }

    /// DESTROY_QP: unbind the type 2B windows associated with `qpn` (spec §12.8), so a later QP
    /// given the same QPN cannot use them.
    pub fn unbind_qp(&mut self, qpn: u32) {
        if self.mw_count == 0 {
            return;
        }
        for idx in 1..self.slots.len() as u32 {
            let assoc = self.slots[idx as usize].mr.as_ref().is_some_and(|m| {
                matches!(m.kind, MrKind::Window(Window { bound: Some(b), .. }) if b.qpn == Some(qpn))
            });
            if assoc {
                self.unbind(idx);
            }
        }
    }

    /// BIND_MW WQE (spec §12.8): every rule in the spec's order; on error nothing changes (the
    /// requester completes the WQE with MW_BIND_ERR).
    pub fn bind_mw(&mut self, b: &BindMw) -> Result<(), MrError> {
        // 1. the window by its current rkey; the new rkey in the same slot; known rights.
        let w = self.entry(b.mw_key)?;
        let (MrKind::Window(win), mw_pd) = (w.kind.clone(), w.pd) else {
            return Err(MrError::InvalidKey(b.mw_key));
        };
        let idx = key_index(b.mw_key);
        if key_index(b.new_key) != idx {
            return Err(MrError::Invalid("new_key names another index"));
        }
        if b.access & !BIND_ACCESS != 0 {
            return Err(MrError::BadAccess(b.access));
        }
        // 2. C10-72: the window's PD is the QP's.
        if mw_pd != b.qp_pd {
            return Err(MrError::WrongPd {
                key: b.mw_key,
                pd: b.qp_pd,
            });
        }
        // 3. per type.
        let zero_based = b.access & VRDMA_ACCESS_ZERO_BASED != 0;
        if win.mw_type == VRDMA_MW_TYPE_1 {
            if zero_based {
                // o10-36.2.2
                return Err(MrError::BadAccess(b.access));
            }
            if b.length == 0 {
                self.unbind(idx);
                self.set_window_key(idx, b.new_key);
                return Ok(());
            }
        } else {
            if win.bound.is_some() {
                // o10-37.2.30: a type 2B window is bound only from the free state.
                return Err(MrError::InvalidOp(b.mw_key));
            }
            if b.length == 0 {
                // o10-37.2.40
                return Err(MrError::Invalid("type 2B bind of length 0"));
            }
        }
        // 4. and 5.
        self.check_bind_target(b)?;
        // Bound: a type 1 rebind first gives up its old binding.
        self.unbind(idx);
        let mr_idx = key_index(b.mr_key) as usize;
        self.slots[mr_idx].bound_mws += 1;
        self.set_window_key(idx, b.new_key);
        if let Some((w, _)) = self.window_mut(idx) {
            w.access = b.access & WINDOW_RIGHTS;
            w.iova = if zero_based { 0 } else { b.addr };
            w.length = b.length;
            w.kind = MrKind::Window(Window {
                mw_type: win.mw_type,
                bound: Some(Binding {
                    mr_key: b.mr_key,
                    base: b.addr,
                    qpn: (win.mw_type == VRDMA_MW_TYPE_2).then_some(b.qpn),
                }),
            });
        }
        Ok(())
    }

    /// BIND_MW rules 4 and 5 (spec §12.8): the MR the window is bound to and the range in it.
    fn check_bind_target(&self, b: &BindMw) -> Result<(), MrError> {
        // 4. the MR: same PD, MW_BIND, local write for remote write/atomic (C10-73, C10-74).
        let mr = self.get(b.mr_key)?;
        if mr.pd != b.qp_pd {
            return Err(MrError::WrongPd {
                key: b.mr_key,
                pd: b.qp_pd,
            });
        }
        match mr.kind {
            MrKind::Dma => return Err(MrError::InvalidOp(b.mr_key)),
            MrKind::FastReg { valid: false, .. } => return Err(MrError::Invalidated(b.mr_key)),
            _ => {}
        }
        if mr.access & VRDMA_ACCESS_MW_BIND == 0 {
            return Err(MrError::AccessDenied {
                key: b.mr_key,
                access: VRDMA_ACCESS_MW_BIND,
            });
        }
        if b.access & (VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_ATOMIC) != 0
            && mr.access & VRDMA_ACCESS_LOCAL_WRITE == 0
        {
            return Err(MrError::AccessDenied {
                key: b.mr_key,
                access: VRDMA_ACCESS_LOCAL_WRITE,
            });
        }
        // 5. C10-75: the range inside the MR.
        let oob = MrError::OutOfBounds {
            key: b.mr_key,
            iova: b.addr,
            len: b.length,
        };
        let end = b.addr.checked_add(b.length).ok_or(oob.clone())?;
        if b.addr < mr.iova || end > mr.end() {
            return Err(oob);
        }
        Ok(())
    }

    /// The window's rkey becomes `key` (its slot's variant follows, as for fast registration).
    fn set_window_key(&mut self, idx: u32, key: u32) {
        if let Some(s) = self.slots.get_mut(idx as usize) {
            s.variant = key_variant(key);
            if let Some(m) = s.mr.as_mut() {
                m.key = key;
            }
        }
    }

    /// LOCAL_INV / SEND_WITH_INV of a window's rkey (spec §12.8): only a bound type 2B window of
    /// `pd`, for SEND_WITH_INV (`qpn` given) only on the QP it is associated with.
    pub(super) fn invalidate_window(
        &mut self,
        key: u32,
        pd: u32,
        qpn: Option<u32>,
    ) -> Result<(), MrError> {
        let w = self.entry(key)?;
        let MrKind::Window(win) = w.kind.clone() else {
            return Err(MrError::InvalidKey(key));
        };
        if w.pd != pd {
            return Err(MrError::WrongPd { key, pd });
        }
        // o10-37.2.26: a type 1 window cannot be invalidated; a free window has nothing to
        // invalidate.
        let Some(b) = win.bound.filter(|_| win.mw_type == VRDMA_MW_TYPE_2) else {
            return Err(MrError::InvalidOp(key));
        };
        if qpn.is_some_and(|q| b.qpn != Some(q)) {
            return Err(MrError::InvalidOp(key));
        }
        self.unbind(key_index(key));
        Ok(())
    }

    /// If `a.key` names a window: check it for a remote access by QP `qpn` of PD `a.pd` (spec
    /// §12.8) and say where the access goes: the access of the MR behind the window (its key,
    /// its PD, the MR iova, and the right to check on the MR). `None`: not a window (the caller
    /// checks an MR).
    fn window_target(&self, a: Access, qpn: u32) -> Result<Option<Access>, MrError> {
        let (key, pd, iova, access) = (a.key, a.pd, a.iova, a.rights);
        let Ok(w) = self.entry(key) else {
            return Ok(None);
        };
        let MrKind::Window(win) = &w.kind else {
            return Ok(None);
        };
        let denied = MrError::AccessDenied { key, access };
        let Some(b) = win.bound else {
            return Err(denied);
        };
        // Type 1: the window's PD is the QP's; type 2B: the window is associated with the QP.
        let ours = match b.qpn {
            Some(q) => q == qpn && w.pd == pd,
            None => w.pd == pd,
        };
        if !ours {
            return Err(MrError::WrongPd { key, pd });
        }
        // Only remote accesses may use a window's rkey.
        if access & WINDOW_RIGHTS == 0 {
            return Err(denied);
        }
        check_range_rights(w, &a)?;
        // A REREG_MR keeps the MR's key but may move it to another PD: the window then no
        // longer reaches it (IBTA: window, MR and QP share one PD).
        let mr_pd = self.get(b.mr_key)?.pd;
        if mr_pd != w.pd {
            return Err(MrError::WrongPd {
                key: b.mr_key,
                pd: w.pd,
            });
        }
        // The MR itself need not grant remote rights, only hold the memory: writes need its
        // LOCAL_WRITE (C10-74 was checked at bind; checked again in case of a REREG).
        let mr_access = if access & (VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_ATOMIC) != 0 {
            VRDMA_ACCESS_LOCAL_WRITE
        } else {
            0
        };
        Ok(Some(Access {
            key: b.mr_key,
            pd: mr_pd,
            iova: b.base.wrapping_add(iova.wrapping_sub(w.iova)),
            len: a.len,
            rights: mr_access,
        }))
    }

    /// [`MrTable::check_access`] for an incoming request on QP `qpn`: `a.key` may be an MR's
    /// rkey or a window's (spec §12.8).
    pub fn check_remote(&self, a: Access, qpn: u32) -> Result<(), MrError> {
        let target = self.window_target(a, qpn)?;
        self.check_access(target.unwrap_or(a))
    }

    /// [`MrTable::resolve_remote_into`] through a shared borrow (see
    /// [`MrTable::resolve_pinned_into`]): `None` if the MR reached is an ODP one.
    pub fn resolve_remote_pinned_into(
        &self,
        a: Access,
        qpn: u32,
        out: &mut Vec<GuestRange>,
    ) -> Option<Result<(), MrError>> {
        out.clear();
        match self.window_target(a, qpn) {
            Err(e) => Some(Err(e)),
            Ok(target) => self.resolve_pinned_into(target.unwrap_or(a), out),
        }
    }

    /// [`MrTable::resolve_into`] for an incoming request on QP `qpn`: `a.key` may be an MR's
    /// rkey or a window's (spec §12.8).
    pub fn resolve_remote_into(
        &mut self,
        waiter: Option<u32>,
        a: Access,
        qpn: u32,
        out: &mut Vec<GuestRange>,
    ) -> Result<(), MrError> {
        out.clear();
        let target = self.window_target(a, qpn)?;
        self.resolve_into(waiter, target.unwrap_or(a), out)
    }
}
