//! Control commands (spec §11): decode, validate, execute, write the response body.
//!
//! `req` is the readable part after `vrdma_cmd_hdr` (the daemon strips and checks the header):
//! the request struct then any trailing page list. A request shorter than its struct, or a
//! trailing array shorter than its announced count → INVALID. `resp` receives the response body
//! (the daemon writes `vrdma_cmd_resp_hdr` with the returned status in front of it); on error
//! nothing is written to `resp`.

mod mr;
mod qp;

use vrdma_spec::*;

use super::Qp;
use super::{CmdOutcome, Device};
use crate::budget::Charge;
use crate::guest::{Ring, RingError};
use crate::memory::mr::PageListSpec;
use crate::objects::cq::CQE_SHIFT;
use crate::objects::gid::GidError;
use crate::objects::{Ah, Cq, Pd, Srq};
use crate::qp::{check_av, ModifyLimits, QpCaps, QpState, QpType};
use crate::transport::requester::wqe_floor;
use crate::transport::responder::{RdAtomicRes, ReadReply};

type CmdResult = Result<(), u32>;

fn parse<T: Abi>(req: &[u8]) -> Result<(T, &[u8]), u32> {
    T::split_from(req).ok_or(VRDMA_STATUS_INVALID)
}

fn page_list(rest: &[u8], n: u32) -> Result<Vec<u64>, u32> {
    read_u64_array(rest, n as usize).ok_or(VRDMA_STATUS_INVALID)
}

/// Host memory a CQ with a ring of `npages` pages holds.
pub(crate) fn cq_charge(npages: usize) -> u64 {
    (std::mem::size_of::<Cq>() as u64).saturating_add(npages as u64 * 8)
}

fn put<T: Abi>(resp: &mut Vec<u8>, v: &T) {
    resp.extend_from_slice(v.as_bytes());
}

fn handle(h: u32) -> VrdmaHandle {
    VrdmaHandle {
        handle: h,
        reserved: 0,
    }
}

/// Ring creation error → command status.
fn ring_status(e: &RingError) -> u32 {
    match e {
        RingError::Access(_) => VRDMA_STATUS_BAD_ADDRESS,
        _ => VRDMA_STATUS_INVALID,
    }
}

/// A command [`Device::run_shared`] runs beside the workers; `None`: this one needs the
/// exclusive device after all (a MODIFY_QP that keeps finding its QP's state out, a
/// CREATE_QP whose QPN index must grow, an ADVISE_MR that may park, an ODP_PAGE_RESP that
/// reclaims, a RESIZE_CQ shrink the shared count refuses).
type SharedCmd = fn(&Device, &[u8], &mut Vec<u8>) -> Option<CmdResult>;

impl Device {
    /// Execute one control command: `Done(VRDMA_STATUS_*)` with the response body in `resp`, or
    /// `Parked` (ADVISE_MR with F_FLUSH, see `outcome.rs`).
    pub fn handle_command(&mut self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> CmdOutcome {
        if let Some(status) = self.run_shared(opcode, req, resp) {
            return CmdOutcome::Done(status);
        }
        resp.clear();
        // Flushes that commands beside the workers queued and the workers have not run yet
        // (this thread holds the device exclusively): done before, as if those commands had
        // been exclusive too (a DESTROY_QP right after MODIFY_QP to ERR still gets them).
        self.run_flushes();
        if self.needs_reset {
            return CmdOutcome::Done(VRDMA_STATUS_NEEDS_RESET);
        }
        if opcode == VRDMA_CMD_ADVISE_MR {
            return self.cmd_advise_mr(req);
        }
        let r = match opcode {
            VRDMA_CMD_RESIZE_CQ => self.cmd_resize_cq(req, resp),
            VRDMA_CMD_CREATE_QP => self.cmd_create_qp_exclusive(req, resp),
            VRDMA_CMD_MODIFY_QP => self.cmd_modify_qp(req),
            VRDMA_CMD_DESTROY_QP => self.cmd_destroy_qp(req),
            VRDMA_CMD_ODP_PAGE_RESP => self.cmd_odp_page_resp(req),
            _ => Err(VRDMA_STATUS_INVALID),
        };
        CmdOutcome::Done(match r {
            Ok(()) => VRDMA_STATUS_OK,
            Err(s) => {
                resp.clear();
                s
            }
        })
    }

    /// Execute `opcode` if it runs on the shared device (`HandoffLock::read`), beside the
    /// engine workers, so that it never waits for another QP's data path. Returns the status,
    /// with the response body in `resp`; `None`: `opcode` needs [`Device::handle_command`] on
    /// the exclusive device. These run here (ARCHITECTURE.md "Control commands"):
    /// - the queries (QUERY_DEVICE, QUERY_PORT, QUERY_QP, QUERY_SRQ, QUERY_STATS), which only
    ///   read;
    /// - MODIFY_QP, MODIFY_CQ and MODIFY_SRQ (a resize too), under the object's own lock;
    /// - the commands that add an MR or a window in a free slot of the MR table (REG_MR,
    ///   REG_DMA_MR, ALLOC_FAST_REG_MR, REG_ODP_MR, REG_IMPLICIT_MR, ALLOC_MW), and CREATE_AH /
    ///   DESTROY_AH under the AH table's lock;
    /// - the creates of PDs, XRC domains, CQs and SRQs (CREATE_PD, ALLOC_XRCD, CREATE_CQ,
    ///   CREATE_SRQ), whose tables grow through a shared borrow (`objects::LockedTable`):
    ///   nothing refers to the new object before its handle is in the response, and what it
    ///   refers to (a PD, a CQ) is destroyed only by a command of this same control queue;
    /// - their destroys (DESTROY_PD, DEALLOC_XRCD, DESTROY_CQ, DESTROY_SRQ), which refuse
    ///   (BUSY) while anything refers to the object and, for a CQ or SRQ, wait for the units of
    ///   work in flight (`tables/units.rs`) before they answer;
    /// - the commands that take memory access away (DEREG_MR, REREG_MR, DEALLOC_MW,
    ///   ODP_INVALIDATE): they change the MR table under its write lock, release it, then wait
    ///   for the units of work in flight.
    /// - CREATE_QP and DESTROY_QP (`qp/table.rs`): the QP table inserts and removes through a
    ///   shared borrow; a destroy waits for the units of work in flight. A create that needs
    ///   the QPN index to grow, and a destroy while a flush is queued, need the exclusive
    ///   device;
    /// - ATTACH_MCAST and DETACH_MCAST, under the groups' write lock (a detach then waits for
    ///   the units in flight);
    /// - ADVISE_MR without F_FLUSH, under the MR table's write lock (one with it may park its
    ///   chain: [`Device::handle_shared_parking`] runs it beside the workers for a caller that
    ///   can park, and the exclusive device for the others);
    /// - ODP_PAGE_RESP under the MR table's write lock, unless its install reclaims a chunk
    ///   (a residency budget is full): the RECLAIM notice needs the exclusive device;
    /// - RESIZE_CQ under the CQ's lock, after the units in flight; a shrink its conservative
    ///   count refuses is decided on the exclusive device;
    /// - ADD_GID and DEL_GID under the GID table's sequence lock (a DEL_GID then waits for
    ///   the units in flight).
    pub fn handle_shared(&self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> Option<u32> {
        // A QP this moves to ERR is flushed by its own worker, not here.
        let _beside = crate::tables::flush::SharedCommand::enter();
        self.run_shared(opcode, req, resp)
    }

    /// [`Device::handle_shared`] for a caller that can park the chain of a command that
    /// answers later (`vhost_user::controlq`, inside a `ParkedCommands::window`): ADVISE_MR
    /// with F_FLUSH runs beside the workers too and may return `Parked`. Its completion may
    /// come from a worker, or from a command of this queue, before the caller parks the chain.
    pub fn handle_shared_parking(
        &self,
        opcode: u16,
        req: &[u8],
        resp: &mut Vec<u8>,
    ) -> Option<CmdOutcome> {
        if opcode != VRDMA_CMD_ADVISE_MR {
            return self.handle_shared(opcode, req, resp).map(CmdOutcome::Done);
        }
        let _beside = crate::tables::flush::SharedCommand::enter();
        resp.clear();
        if self.needs_reset {
            return Some(CmdOutcome::Done(VRDMA_STATUS_NEEDS_RESET));
        }
        Some(self.cmd_advise_mr_beside(req))
    }

    /// [`Device::handle_shared`] on a device held shared or exclusively.
    fn run_shared(&self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> Option<u32> {
        // One list: an opcode not named here needs the exclusive device.
        let run: SharedCmd = match opcode {
            VRDMA_CMD_QUERY_DEVICE => |d, q, r| Some(d.cmd_query_device(q, r)),
            VRDMA_CMD_QUERY_PORT => |d, q, r| Some(d.cmd_query_port(q, r)),
            VRDMA_CMD_QUERY_QP => |d, q, r| Some(d.cmd_query_qp(q, r)),
            VRDMA_CMD_QUERY_SRQ => |d, q, r| Some(d.cmd_query_srq(q, r)),
            VRDMA_CMD_QUERY_STATS => |d, q, r| Some(d.cmd_query_stats(q, r)),
            VRDMA_CMD_MODIFY_QP => |d, q, _| d.cmd_modify_qp_shared(q),
            VRDMA_CMD_MODIFY_CQ => |d, q, _| Some(d.cmd_modify_cq(q)),
            VRDMA_CMD_MODIFY_SRQ => |d, q, _| Some(d.cmd_modify_srq(q)),
            VRDMA_CMD_REG_MR => |d, q, r| Some(d.cmd_reg_mr(q, r)),
            VRDMA_CMD_REG_DMA_MR => |d, q, r| Some(d.cmd_reg_dma_mr(q, r)),
            VRDMA_CMD_ALLOC_FAST_REG_MR => |d, q, r| Some(d.cmd_alloc_fast_reg(q, r)),
            VRDMA_CMD_REG_ODP_MR => |d, q, r| Some(d.cmd_reg_odp(q, r, false)),
            VRDMA_CMD_REG_IMPLICIT_MR => |d, q, r| Some(d.cmd_reg_odp(q, r, true)),
            VRDMA_CMD_ALLOC_MW => |d, q, r| Some(d.cmd_alloc_mw(q, r)),
            VRDMA_CMD_CREATE_AH => |d, q, r| Some(d.cmd_create_ah(q, r)),
            VRDMA_CMD_DESTROY_AH => |d, q, _| Some(d.cmd_destroy_ah(q)),
            VRDMA_CMD_CREATE_PD => |d, q, r| Some(d.cmd_create_pd(q, r)),
            VRDMA_CMD_ALLOC_XRCD => |d, _, r| Some(d.cmd_alloc_xrcd(r)),
            VRDMA_CMD_CREATE_CQ => |d, q, r| Some(d.cmd_create_cq(q, r)),
            VRDMA_CMD_CREATE_SRQ => |d, q, r| Some(d.cmd_create_srq(q, r)),
            VRDMA_CMD_DEREG_MR => |d, q, _| Some(d.cmd_dereg_mr(q)),
            VRDMA_CMD_REREG_MR => |d, q, r| Some(d.cmd_rereg_mr(q, r)),
            VRDMA_CMD_DEALLOC_MW => |d, q, _| Some(d.cmd_dealloc_mw(q)),
            VRDMA_CMD_ODP_INVALIDATE => |d, q, _| Some(d.cmd_odp_invalidate(q)),
            VRDMA_CMD_DESTROY_PD => |d, q, _| Some(d.cmd_destroy_pd(q)),
            VRDMA_CMD_DEALLOC_XRCD => |d, q, _| Some(d.cmd_dealloc_xrcd(q)),
            VRDMA_CMD_DESTROY_CQ => |d, q, _| Some(d.cmd_destroy_cq(q)),
            VRDMA_CMD_DESTROY_SRQ => |d, q, _| Some(d.cmd_destroy_srq(q)),
            VRDMA_CMD_CREATE_QP => |d, q, r| d.cmd_create_qp_shared(q, r),
            VRDMA_CMD_DESTROY_QP => |d, q, _| d.cmd_destroy_qp_shared(q),
            VRDMA_CMD_ATTACH_MCAST => |d, q, _| Some(d.cmd_mcast(q, true)),
            VRDMA_CMD_ADVISE_MR => |d, q, _| d.cmd_advise_mr_shared(q),
            VRDMA_CMD_ODP_PAGE_RESP => |d, q, _| d.cmd_odp_page_resp_shared(q).transpose(),
            VRDMA_CMD_DETACH_MCAST => |d, q, _| Some(d.cmd_mcast(q, false)),
            VRDMA_CMD_RESIZE_CQ => |d, q, r| d.cmd_resize_cq_shared(q, r).transpose(),
            VRDMA_CMD_ADD_GID => |d, q, _| Some(d.cmd_add_gid(q)),
            VRDMA_CMD_DEL_GID => |d, q, _| Some(d.cmd_del_gid(q)),
            _ => return None,
        };
        resp.clear();
        if self.needs_reset {
            return Some(VRDMA_STATUS_NEEDS_RESET);
        }
        let r = run(self, req, resp)?;
        Some(match r {
            Ok(()) => VRDMA_STATUS_OK,
            Err(s) => {
                resp.clear();
                s
            }
        })
    }

    fn cmd_query_device(&self, _req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        put(resp, &self.config.to_vrdma_config());
        Ok(())
    }

    fn pd_exists(&self, pdn: u32) -> CmdResult {
        if self.pds.contains(pdn) {
            Ok(())
        } else {
            Err(VRDMA_STATUS_NOT_FOUND)
        }
    }

    fn cmd_query_port(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdQueryPort>(req)?;
        if c.port != 1 {
            return Err(VRDMA_STATUS_INVALID);
        }
        let mtu = self.config.port_mtu();
        let active = self.config.port_active;
        put(
            resp,
            &VrdmaRespQueryPort {
                state: if active {
                    VRDMA_PORT_ACTIVE
                } else {
                    VRDMA_PORT_DOWN
                },
                max_mtu: mtu,
                active_mtu: mtu,
                gid_tbl_len: self.gids.len(),
                max_msg_sz: self.config.max_msg_sz,
                phys_state: if active { 5 } else { 3 },
                active_speed: 32, // IB_SPEED_EDR
                active_width: 2,  // IB_WIDTH_4X
            },
        );
        Ok(())
    }

    /// ADD_GID beside the engine workers: the GID table changes under its sequence lock
    /// (`objects/gid.rs`), which every frame reads without a lock.
    fn cmd_add_gid(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdGid>(req)?;
        self.gids.add(c.index, c.type_, c.gid).map_err(|e| match e {
            GidError::BadIndex | GidError::BadType => VRDMA_STATUS_INVALID,
            GidError::NotFound => VRDMA_STATUS_NOT_FOUND,
        })
    }

    /// DEL_GID beside the engine workers, then it waits for the units in flight: one may have
    /// accepted a frame for the GID before it went, and no frame for it is taken in once the
    /// command has answered.
    fn cmd_del_gid(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdGid>(req)?;
        self.gids.del(c.index).map_err(|e| match e {
            GidError::BadIndex | GidError::BadType => VRDMA_STATUS_INVALID,
            GidError::NotFound => VRDMA_STATUS_NOT_FOUND,
        })?;
        self.units.wait();
        Ok(())
    }

    fn cmd_create_pd(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        // The request is a vrdma_handle that carries nothing; an empty request is accepted too.
        let _ = req;
        let h = self
            .pds
            .insert_with(|pdn| Pd { pdn })
            .ok_or(VRDMA_STATUS_NO_RESOURCES)?;
        put(resp, &handle(h));
        Ok(())
    }

    fn cmd_destroy_pd(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        self.pd_exists(c.handle)?;
        if self.pd_in_use(c.handle) {
            return Err(VRDMA_STATUS_BUSY);
        }
        self.pds.remove(c.handle);
        Ok(())
    }

    /// ALLOC_XRCD (spec §13.7): the request carries nothing (like CREATE_PD).
    fn cmd_alloc_xrcd(&self, resp: &mut Vec<u8>) -> CmdResult {
        let h = self
            .xrcds
            .insert_with(|xrcdn| crate::objects::Xrcd { xrcdn })
            .ok_or(VRDMA_STATUS_NO_RESOURCES)?;
        put(resp, &handle(h));
        Ok(())
    }

    fn cmd_dealloc_xrcd(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        if !self.xrcds.contains(c.handle) {
            return Err(VRDMA_STATUS_NOT_FOUND);
        }
        if self.xrcd_in_use(c.handle) {
            return Err(VRDMA_STATUS_BUSY);
        }
        self.xrcds.remove(c.handle);
        Ok(())
    }

    /// Reserve `bytes` of the host-memory budget for an object being created (spec §16:
    /// NO_RESOURCES when they do not fit).
    fn charge(&self, bytes: u64) -> Result<Charge, u32> {
        self.budget.try_charge(bytes).map_err(|e| {
            guest_debug!("budget: {e}");
            VRDMA_STATUS_NO_RESOURCES
        })
    }

    /// What a QP holds for its whole life: the struct, its ring page lists, the responder
    /// resources and READ replies it may queue (at most `max_qp_init_rd_atom` each, IBTA
    /// 9.7.5.1.5), the SGE list of the receive WQE a message in progress holds, and one
    /// fetched send WQE, so that it can always make progress (spec §16.1).
    pub fn qp_fixed_charge(&self, ring_pages: u64, sq_wqe_size: u32) -> u64 {
        let cfg = &self.config;
        let rd = u64::from(cfg.max_qp_init_rd_atom.max(cfg.max_qp_rd_atom))
            * (std::mem::size_of::<RdAtomicRes>() + std::mem::size_of::<ReadReply>()) as u64;
        let recv = u64::from(cfg.max_recv_sge.max(cfg.max_srq_sge))
            * std::mem::size_of::<crate::transport::requester::Sge>() as u64;
        std::mem::size_of::<Qp>() as u64 + ring_pages * 8 + rd + recv + wqe_floor(sq_wqe_size)
    }

    fn make_ring(
        &self,
        pages: &[u64],
        depth: u32,
        shift: u32,
        min_shift: u32,
        max_depth: u32,
    ) -> Result<Ring, u32> {
        let mut r = Ring::new(&self.mem, pages, depth, shift, min_shift, max_depth)
            .map_err(|e| ring_status(&e))?;
        r.reset_indices(&self.mem);
        Ok(r)
    }

    fn cmd_create_cq(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdCreateCq>(req)?;
        let pages = page_list(rest, c.npages)?;
        if self.cqs.len() >= self.cqs.max() {
            return Err(VRDMA_STATUS_NO_RESOURCES);
        }
        let charge = self.charge(cq_charge(pages.len()))?;
        let ring = self.make_ring(&pages, c.depth, CQE_SHIFT, CQE_SHIFT, self.config.max_cqe)?;
        let h = self
            .cqs
            .insert_with(|cqn| Cq {
                charge,
                ..Cq::new(cqn, ring)
            })
            .ok_or(VRDMA_STATUS_NO_RESOURCES)?;
        put(resp, &handle(h));
        Ok(())
    }

    fn cmd_destroy_cq(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        if !self.cqs.contains(c.handle) {
            return Err(VRDMA_STATUS_NOT_FOUND);
        }
        if self
            .qps
            .iter()
            .any(|q| q.send_cqn == c.handle || q.recv_cqn == c.handle)
            || self
                .srqs
                .iter()
                .any(|(_, s)| s.xrc.is_some_and(|x| x.cqn == c.handle))
        {
            return Err(VRDMA_STATUS_BUSY);
        }
        let cq = self.cqs.remove(c.handle);
        // A unit in flight may still post to it: an XRC SRQ destroyed just before completes a
        // WQE it had popped into this CQ.
        self.fence_local_copies();
        drop(cq);
        Ok(())
    }

    /// RESIZE_CQ's new ring, charged first (both rings exist until the swap).
    fn resize_cq_ring(&self, c: &VrdmaCmdCreateCq, pages: &[u64]) -> Result<(Charge, Ring), u32> {
        if !self.cqs.contains(c.cqn) {
            return Err(VRDMA_STATUS_NOT_FOUND);
        }
        let charge = self.charge(cq_charge(pages.len()))?;
        // Built without reset_indices: resize writes the new control page itself.
        let new = Ring::new(
            &self.mem,
            pages,
            c.depth,
            CQE_SHIFT,
            CQE_SHIFT,
            self.config.max_cqe,
        )
        .map_err(|e| ring_status(&e))?;
        Ok((charge, new))
    }

    /// Send WQEs still owed a completion in CQ `cqn`: every one outstanding on a QP that
    /// completes its sends there will write a CQE (a flush at the latest). A shrink below the
    /// unpolled CQEs plus these would overflow the CQ a moment later, so it is refused like
    /// one below the unpolled CQEs alone: the driver cannot tell the two apart, because the
    /// device completes sends asynchronously.
    fn owed_completions(&self, cqn: u32) -> u32 {
        self.qps
            .iter()
            .filter(|q| q.send_cqn == cqn)
            .map(|q| q.sq.pending(&self.mem).unwrap_or(0))
            .fold(0u32, u32::saturating_add)
    }

    /// RESIZE_CQ beside the engine workers: the CQEs move under the CQ's lock, under which a
    /// worker posts one. Its check needs care: a worker retiring WQEs moves the SQ consumer
    /// before it writes their CQEs (the driver may post again at once), so a WQE between the
    /// two is in neither count. The owed completions are counted first, then the units in
    /// flight are waited for (`tables/units.rs`: a WQE retired before the count has its CQE
    /// written by then), then the unpolled CQEs are counted under the CQ's lock. A WQE that
    /// completes in between is counted twice, so this check refuses more than the exclusive
    /// one, never less: a shrink it refuses goes to the exclusive device, which decides
    /// (`Ok(None)`).
    fn cmd_resize_cq_shared(&self, req: &[u8], resp: &mut Vec<u8>) -> Result<Option<()>, u32> {
        let (c, rest) = parse::<VrdmaCmdCreateCq>(req)?;
        let pages = page_list(rest, c.npages)?;
        let (charge, new) = self.resize_cq_ring(&c, &pages)?;
        let owed = self.owed_completions(c.cqn);
        self.units.wait();
        let mut cq = self.cqs.get(c.cqn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        match cq.resize(&self.mem, new, owed) {
            Ok(n) => {
                cq.charge = charge;
                put(resp, &handle(n));
                Ok(Some(()))
            }
            Err(RingError::BadDepth(_)) => Ok(None),
            Err(e) => Err(ring_status(&e)),
        }
    }

    /// RESIZE_CQ on the exclusive device: every count is exact.
    fn cmd_resize_cq(&mut self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdCreateCq>(req)?;
        let pages = page_list(rest, c.npages)?;
        let (charge, new) = self.resize_cq_ring(&c, &pages)?;
        let owed = self.owed_completions(c.cqn);
        let mem = self.mem.clone();
        let cq = self.cqs.get_mut(c.cqn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        let n = cq.resize(&mem, new, owed).map_err(|e| ring_status(&e))?;
        cq.charge = charge;
        put(resp, &handle(n));
        Ok(())
    }

    /// MODIFY_CQ (spec §5.5): the moderation applies from the next CQE; CQEs already held keep
    /// their deadline.
    /// MODIFY_CQ under the CQ's lock (`handle_shared`).
    fn cmd_modify_cq(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdModifyCq>(req)?;
        let mut cq = self.cqs.get(c.cqn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        cq.moderation.count = c.cq_count;
        cq.moderation.period_us = c.cq_period;
        Ok(())
    }

    /// QUERY_STATS (spec §11.9): one QP's counters, or (qpn 0) the port's.
    fn cmd_query_stats(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdQueryStats>(req)?;
        if c.flags != 0 {
            return Err(VRDMA_STATUS_INVALID);
        }
        let s = if c.qpn == 0 {
            let p = &self.port_stats;
            VrdmaStats {
                icrc_errors: p.drop_bad_icrc.load(std::sync::atomic::Ordering::Relaxed),
                rx_dropped: p.rx_dropped(),
                odp_faults: self.mrs.read().odp_faults(),
                ..self.qps.stats_total().to_vrdma()
            }
        } else {
            let qp = self.qps.get(c.qpn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
            qp.stats.to_vrdma()
        };
        put(resp, &s);
        Ok(())
    }

    fn cmd_create_srq(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdCreateSrq>(req)?;
        let pages = page_list(rest, c.npages)?;
        self.pd_exists(c.pdn)?;
        let xrc = match c.srq_type {
            VRDMA_SRQT_BASIC if c.xrcdn == 0 && c.cqn == 0 => None,
            VRDMA_SRQT_XRC => {
                if !self.xrcds.contains(c.xrcdn) || !self.cqs.contains(c.cqn) {
                    return Err(VRDMA_STATUS_NOT_FOUND);
                }
                Some(crate::objects::SrqXrc {
                    xrcdn: c.xrcdn,
                    cqn: c.cqn,
                })
            }
            _ => return Err(VRDMA_STATUS_INVALID),
        };
        let shift = c.wqe_shift as u32;
        if !(5..=12).contains(&shift) {
            return Err(VRDMA_STATUS_INVALID);
        }
        if c.max_sge > self.config.max_srq_sge || c.max_sge > rq_max_sge(c.wqe_shift) {
            return Err(VRDMA_STATUS_INVALID);
        }
        if c.srq_limit > c.depth {
            return Err(VRDMA_STATUS_INVALID);
        }
        let charge = self
            .charge((std::mem::size_of::<Srq>() as u64).saturating_add(pages.len() as u64 * 8))?;
        let ring = self.make_ring(&pages, c.depth, shift, 5, self.config.max_srq_wr)?;
        let h = self
            .srqs
            .insert_with(|srqn| Srq {
                srqn,
                pd: c.pdn,
                ring,
                max_sge: c.max_sge,
                limit: c.srq_limit,
                broken: false,
                qp_refs: 0,
                charge,
                xrc,
            })
            .ok_or(VRDMA_STATUS_NO_RESOURCES)?;
        put(resp, &handle(h));
        Ok(())
    }

    /// MODIFY_SRQ (spec §11.7) beside the workers (`handle_shared`), under the SRQ's lock:
    /// every check before any change, so both bits apply or neither. A resize copies the
    /// posted WQEs into the new ring and swaps it under that lock; a worker pops a WQE (copies
    /// it out of the ring) under the same lock and keeps nothing of the ring past it, so the
    /// old ring is unused once the command answers.
    fn cmd_modify_srq(&self, req: &[u8]) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdModifySrq>(req)?;
        let resize = c.attr_mask & VRDMA_SRQ_MAX_WR != 0;
        if !resize && c.npages != 0 {
            return Err(VRDMA_STATUS_INVALID);
        }
        let pages = page_list(rest, c.npages)?;
        let (shift, depth, limit) = {
            let srq = self.srqs.get(c.srqn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
            (srq.ring.entry_shift(), srq.ring.depth(), srq.limit)
        };
        if c.attr_mask & !(VRDMA_SRQ_MAX_WR | VRDMA_SRQ_LIMIT) != 0 {
            return Err(VRDMA_STATUS_INVALID);
        }
        let limit = if c.attr_mask & VRDMA_SRQ_LIMIT != 0 {
            c.srq_limit
        } else {
            limit
        };
        if !resize {
            if limit > depth {
                return Err(VRDMA_STATUS_INVALID);
            }
            self.srqs.get(c.srqn).ok_or(VRDMA_STATUS_NOT_FOUND)?.limit = limit;
            return Ok(());
        }
        // Both rings exist until the swap: the new one is charged first (§16.1).
        let charge = self
            .charge((std::mem::size_of::<Srq>() as u64).saturating_add(pages.len() as u64 * 8))?;
        // Built without reset_indices: resize writes the new control page itself.
        let new = Ring::new(
            &self.mem,
            &pages,
            c.max_wr,
            shift,
            5,
            self.config.max_srq_wr,
        )
        .map_err(|e| ring_status(&e))?;
        let mut srq = self.srqs.get(c.srqn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        // Any failure of the copy (SRQ in error, bad old indices, a shallow new ring, guest
        // memory) leaves the old ring in use: INVALID, or BAD_ADDRESS for memory.
        srq.resize(&self.mem, new, limit)
            .map_err(|e| ring_status(&e))?;
        srq.limit = limit;
        srq.charge = charge;
        Ok(())
    }

    fn cmd_query_srq(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        let srq = self.srqs.get(c.handle).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        put(
            resp,
            &VrdmaRespQuerySrq {
                max_wr: srq.ring.depth(),
                max_sge: srq.max_sge,
                srq_limit: srq.limit,
                reserved: 0,
            },
        );
        Ok(())
    }

    fn cmd_destroy_srq(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        let busy = self
            .srqs
            .get(c.handle)
            .ok_or(VRDMA_STATUS_NOT_FOUND)?
            .qp_refs
            > 0;
        if busy {
            return Err(VRDMA_STATUS_BUSY);
        }
        let srq = self.srqs.remove(c.handle);
        // An XRC packet names its SRQ: a unit in flight may have popped a WQE from it and not
        // completed it yet.
        self.fence_local_copies();
        drop(srq);
        Ok(())
    }

    /// CREATE_AH and DESTROY_AH run beside the workers (`handle_shared`), under the AH table's
    /// write lock: a UD send copies its AH's path out under the read lock.
    fn cmd_create_ah(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdCreateAh>(req)?;
        self.pd_exists(c.pdn)?;
        let sgid = check_av(&self.gids, &c.av).map_err(|e| e.status())?;
        let h = self
            .ahs
            .write()
            .insert(Ah {
                pd: c.pdn,
                av: c.av,
                sgid,
            })
            .ok_or(VRDMA_STATUS_NO_RESOURCES)?;
        put(resp, &handle(h));
        Ok(())
    }

    fn cmd_destroy_ah(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        self.ahs
            .write()
            .remove(c.handle)
            .ok_or(VRDMA_STATUS_NOT_FOUND)?;
        Ok(())
    }
}
