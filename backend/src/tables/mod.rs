//! The device's state that both paths share (spec §2, §5, §11): every object table, guest
//! memory, the outputs, and the rules that span tables — posting a CQE (overflow moves the CQ's
//! QPs to ERR), moving a QP to ERR (event, then its flush through [`FlushHook`]), taking an SRQ
//! WQE (a broken SRQ moves its QPs to ERR). Generic over the QP protocol ([`Protocol`]), so the
//! engine (`transport/`, which names the protocol `transport::Rocev2`) sits above it without
//! knowing the command handlers, and the command handlers (`device/`, whose `Device` is
//! `DeviceTables<Rocev2>`) sit above the engine whose per-QP state they save and restore
//! (ARCHITECTURE.md "Layers"). Nothing in here blocks.
//!
//! # For `transport/`
//! - CQEs: `post_cqe(cqn, &cqe, solicited)` (arming, events and overflow handled here).
//! - Errors: `qp_to_error(qpn, Some(VRDMA_EV_*), info)`, `qp_ring_error(qpn, on_sq, &err)`; set
//!   `flush_hook` at start-up: it is called after MODIFY_QP / `qp_to_error` moved a QP to ERR,
//!   through a worklist (`schedule_flush`), never recursively.
//! - Receive WQEs: `srq_pop(srqn, buf)` (limit / error events handled here), RQ via `qp.rq`.
//! - Memory: `mrs.resolve_for(Some(qpn), key, pd, iova, len, access)`, `mrs.fast_register`,
//!   `mrs.local_invalidate`; never keep a `GuestRange` across device-lock releases (ODP
//!   invalidation relies on it). `take_resumed_qps()` after faults resolve; `odp_tick(now)` from
//!   the timer tick (page-request timeouts; returns the next deadline).
//! - Lookups: `ahs.lookup_in_pd(index, pd)`, `gids.get(i)`, `gids.is_local_ip(ip)`.
//! - Memory: anything held in proportion to guest or peer input is charged to `budget` first
//!   (spec §16.1, `crate::budget`); over budget, take the spec's outcome, never allocate anyway.

pub mod config;
pub mod flush;
pub mod outbox;
pub mod timer_queue;
pub mod units;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vrdma_spec::*;

pub use config::DeviceConfig;
pub use outbox::Outbox;
pub use timer_queue::TimerQueue;
pub use units::UnitFence;

use crate::guest::output;
use crate::guest::output::DeviceOutput;

use crate::guest::{GuestMem, GuestMemoryMap, RingError};
use crate::memory::MrTable;
use crate::objects::{AhTable, Cq, CqError, GidTable, LockedTable, PdTable, Srq};
use crate::qp::{Protocol, QpState, QpTable};

/// Budget reserved for parked control chains: `MAX_PARKED_ADVISE` chains of at most 8
/// response descriptors (16 bytes each) plus their table entry.
pub const PARKED_RESERVE: u64 = crate::memory::advise::MAX_PARKED_ADVISE as u64 * (8 * 16 + 128);

/// Transport hook called with a QPN right after the device moved that QP to ERR (flush its SQ/RQ
/// WQEs with WR_FLUSH_ERR). Set by the engine at start-up; `None` in unit tests of the device.
pub type FlushHook<P> = fn(&DeviceTables<P>, u32);

/// The device's tables and guest (see the module documentation).
pub struct DeviceTables<P: Protocol> {
    pub config: DeviceConfig,
    pub mem: GuestMem,
    pub out: Arc<dyn DeviceOutput>,
    pub(crate) pds: PdTable,
    /// XRC domains (spec §13.7).
    pub(crate) xrcds: crate::objects::XrcdTable,
    pub(crate) cqs: LockedTable<Cq>,
    pub(crate) srqs: LockedTable<Srq>,
    /// Read per UD packet (`ctx::ah_path`), written by CREATE_AH / DESTROY_AH beside the
    /// workers.
    pub(crate) ahs: crate::sync::ReadMostly<AhTable>,
    pub(crate) gids: GidTable,
    /// UD multicast groups and their QPs (spec §15.8). Read only for a multicast GID
    /// ([`DeviceTables::is_mcast_group`], [`DeviceTables::with_mcast_members`]), written by
    /// ATTACH_MCAST / DETACH_MCAST / DESTROY_QP beside the workers.
    pub(crate) mcast: crate::sync::ReadMostly<crate::objects::McastTable>,
    /// Read-locked for a pinned MR's translation (the workers translate side by side),
    /// write-locked for what changes it on the data path (ODP translations, FRWR, LOCAL_INV,
    /// binds); held for a translation, never for the copy (ARCHITECTURE.md "Locks").
    pub mrs: crate::sync::ReadMostly<MrTable>,
    pub qps: QpTable<P>,
    /// Host-memory budget (spec §16, `budget.rs`): MRs, QPs, CQs, SRQs, fetched WQEs, ODP
    /// chunk tables and the control queue's buffers are charged to it.
    pub budget: crate::budget::Budget,
    /// What the device holds of the budget for its whole life: the parked control chains
    /// (at most `MAX_PARKED_ADVISE`, each keeping a few response descriptors, see
    /// `vhost_user::controlq::response_descs`).
    _fixed: crate::budget::Charge,
    /// What the QPs queued for the uplink, one outbox per engine worker (`outbox.rs`); the
    /// worker flushes its own after its batch.
    outboxes: Vec<crate::sync::Locked<Outbox>>,
    /// Port counters (`stats.rs`), kept across resets: they count from daemon start.
    pub port_stats: Arc<crate::stats::PortStats>,
    /// See [`FlushHook`].
    pub flush_hook: Option<FlushHook<P>>,
    /// QPs moved to ERR whose flush hook has not run yet. A flush can overflow another CQ,
    /// which moves more QPs to ERR (spec §5.2); they are queued here and flushed one after the
    /// other instead of recursively, so a chain of thousands of QPs and CQs cannot exhaust the
    /// thread's stack. Each QP enters ERR once, so the list never holds more than `max_qp`.
    flushes: flush::FlushQueues,
    /// Bumped each time [`DeviceTables::qp_to_error`] moves a QP to ERR. A worker running
    /// several frames of one QP on a responder state it holds (`transport::ReceiveRun`) checks
    /// it before each: the core can move that QP to ERR meanwhile (a CQ overflow, an SRQ or a
    /// shared CQ failing on another worker) without touching the held state.
    pub qps_errored: AtomicU64,
    /// Set when the device hit an unrecoverable state: every command answers NEEDS_RESET.
    pub needs_reset: bool,
    /// Which engine workers are inside a unit of work (`units.rs`): the fence of the commands
    /// that take memory access away beside the workers. Replaced only by `set_workers`, before
    /// the engine's workers start.
    pub(crate) units: Arc<UnitFence>,
    /// Transport deadlines and the tick worklist (transport/timers.rs).
    pub(crate) timers: TimerQueue,
    /// CQ moderation deadlines (spec §5.5), fired by `transport::on_tick`.
    cq_timers: crate::sync::Locked<
        std::collections::BinaryHeap<std::cmp::Reverse<(std::time::Instant, u32)>>,
    >,
    /// What the device's port does with the ICRC (`Uplink::icrc_offload`, spec §16.2): on a
    /// fabric port RoCEv2 frames are built without one and received ones are not checked. Set
    /// by the engine.
    pub(crate) icrc_offload: crate::uplink::IcrcOffload,
    /// Migration (spec §17.1): the engine neither reads nor writes guest memory nor sends;
    /// received frames are dropped (RC peers retransmit), doorbells wait for `resume_sweep`.
    pub(crate) suspended: bool,
    /// The next engine batch rings every QP's SQ and RQ doorbell: set by doorbells that arrived
    /// while suspended and by a restore (doorbells the source had not handled yet).
    pub(crate) resume_sweep: std::sync::atomic::AtomicBool,
}

impl<P: Protocol> std::fmt::Debug for DeviceTables<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTables")
            .field("qps", &self.qps)
            .field("mrs", &self.mrs)
            .finish_non_exhaustive()
    }
}

impl<P: Protocol> DeviceTables<P> {
    /// A device at power-on state.
    pub fn new(config: DeviceConfig, mem: GuestMem, out: Arc<dyn DeviceOutput>) -> Self {
        let budget = match &config.host_memory_pool {
            Some(pool) => crate::budget::Budget::in_pool(config.max_host_memory, pool),
            None => crate::budget::Budget::new(config.max_host_memory),
        };
        // A budget too small even for this (below the CLI's minimum) leaves it uncharged.
        let fixed = budget.try_charge(PARKED_RESERVE).unwrap_or_default();
        DeviceTables {
            _fixed: fixed,
            pds: PdTable::new(config.max_pd),
            xrcds: crate::objects::XrcdTable::new(config.max_pd),
            cqs: LockedTable::new(config.max_cq),
            srqs: LockedTable::new(config.max_srq),
            ahs: crate::sync::ReadMostly::new(AhTable::new(config.max_ah)),
            gids: GidTable::new(config.max_gid),
            mcast: crate::sync::ReadMostly::new(crate::objects::McastTable::new(
                crate::objects::mcast::MAX_MCAST_GROUPS,
                crate::objects::mcast::MAX_MCAST_QP_ATTACH,
            )),
            mrs: crate::sync::ReadMostly::new(
                MrTable::new(config.max_mr, mem.clone(), out.clone(), config.odp.clone())
                    .with_max_pages(config.max_mr_pages)
                    .with_max_mw(config.max_mw)
                    .with_budget(budget.clone()),
            ),
            qps: QpTable::new(config.max_qp),
            budget,
            outboxes: vec![Default::default()],
            port_stats: Arc::default(),
            flush_hook: None,
            flushes: Default::default(),
            qps_errored: AtomicU64::new(0),
            needs_reset: false,
            timers: Default::default(),
            units: Default::default(),
            cq_timers: Default::default(),
            icrc_offload: Default::default(),
            suspended: false,
            resume_sweep: Default::default(),
            config,
            mem,
            out,
        }
    }

    /// Back to power-on state: every object destroyed, GID table empty. Guest memory and outputs
    /// are kept (the vhost-user layer replaces them when the frontend does).
    pub fn reset(&mut self) {
        self.pds.clear();
        self.xrcds.clear();
        self.cqs.clear();
        self.srqs.clear();
        self.ahs.get_mut().clear();
        self.gids.clear();
        self.mcast.get_mut().clear();
        self.mrs.get_mut().clear();
        self.qps.clear();
        for o in &mut self.outboxes {
            o.get_mut().clear();
        }
        self.flushes.clear();
        self.needs_reset = false;
        self.timers.clear();
        self.cq_timers.get_mut().clear();
        self.suspended = false;
        *self.resume_sweep.get_mut() = false;
    }

    /// Shard the device over `workers` engine workers (`qp::worker_of`): QPN allocation and
    /// one outbox each. Called by the engine before it starts, with the device quiet.
    pub(crate) fn set_workers(&mut self, workers: usize) {
        let n = workers.max(1);
        self.units = Arc::new(UnitFence::new(n));
        self.qps.set_workers(n);
        self.flushes.set_workers(n);
        let mut kept = std::mem::take(&mut self.outboxes);
        kept.resize_with(n, Default::default);
        self.outboxes = kept;
    }

    /// The outbox of engine worker `worker` (worker 0's when there are fewer; a device driven
    /// without an engine, as in tests, has one).
    /// Locked until the guard drops (only its worker and tests lock it, so nobody waits).
    pub fn outbox(&self, worker: usize) -> std::sync::MutexGuard<'_, Outbox> {
        let n = self.outboxes.len();
        self.outboxes[if worker < n { worker } else { 0 }].lock()
    }

    /// The outbox of the worker that owns QP `qpn`: where the frames it sends go.
    pub fn outbox_of(&self, qpn: u32) -> std::sync::MutexGuard<'_, Outbox> {
        let w = crate::qp::worker_of(qpn, self.outboxes.len());
        self.outbox(w)
    }

    /// Leaving a suspension (spec §17.4): ring every QP's doorbells at the next engine batch
    /// and send a RARP frame with the port's MAC, so that switches between the peers and this
    /// host learn where the port is now (as QEMU announces a migrated NIC).
    pub fn announce(&mut self) {
        *self.resume_sweep.get_mut() = true;
        let mut f = Vec::with_capacity(60);
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&self.config.mac);
        f.extend_from_slice(&[0x80, 0x35]); // RARP
                                            // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4, op 3 (reverse request)
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]);
        for _ in 0..2 {
            f.extend_from_slice(&self.config.mac);
            f.extend_from_slice(&[0; 4]);
        }
        f.resize(60, 0);
        self.outbox(0).push(f);
    }

    /// Replace the output sink (e.g. when the vhost-user layer is (re)connected). The MR table's
    /// ODP page requests follow.
    pub fn set_output(&mut self, out: Arc<dyn DeviceOutput>) {
        self.out = out.clone();
        self.mrs.get_mut().set_output(out);
    }

    /// SET_MEM_TABLE: adopt the memory map currently in `atomic` (the vhost-user layer's memory
    /// object). Every clone of `self.mem` (MR table included) sees the new table.
    pub fn set_guest_memory(&mut self, atomic: &vm_memory::GuestMemoryAtomic<GuestMemoryMap>) {
        // Before the swap: no fabric reference made under the old table is read under the new
        // one (spec §16.2 rule 6).
        self.mrs.get_mut().fence().fence_device();
        self.mem.set_from_atomic(atomic);
    }

    /// The config space bytes (256).
    pub fn config_space(&self) -> Vec<u8> {
        self.config.config_space()
    }

    /// Post a CQE on `cqn`. On overflow the CQ goes to error (CQ_ERR sent) and every QP using it
    /// is moved to ERR with QP_FATAL (DESIGN.md "Rings"). `solicited`: the completion is solicited
    /// (a SOLICITED arm fires for it; error completions always count as solicited).
    pub fn post_cqe(&self, cqn: u32, cqe: &VrdmaCqe, solicited: bool) -> Result<(), CqError> {
        // Lock order (ARCHITECTURE.md "Locks"): the CQ only for the post; the overflow path
        // below locks SRQs and QPs after it is released.
        let r = match self.cqs.get(cqn) {
            Some(mut cq) => cq.post_cqe(&self.mem, &*self.out, cqe, solicited),
            None => return Err(CqError::Broken),
        };
        if let Ok(Some(deadline)) = r {
            self.cq_timers
                .lock()
                .push(std::cmp::Reverse((deadline, cqn)));
        }
        let r = r.map(|_| ());
        if matches!(r, Err(CqError::Overflow) | Err(CqError::Access(_))) {
            // An XRC_TGT posts on the CQ of the XRC SRQ a request named (spec §13.7): every
            // target of a domain with an XRC SRQ on this CQ may have used it.
            let xrc_domains: Vec<u32> = self
                .srqs
                .iter()
                .filter_map(|(_, s)| s.xrc.filter(|x| x.cqn == cqn).map(|x| x.xrcdn))
                .collect();
            let victims: Vec<u32> = self
                .qps
                .iter()
                .filter(|q| {
                    q.send_cqn == cqn
                        || q.recv_cqn == cqn
                        || q.xrcdn.is_some_and(|x| xrc_domains.contains(&x))
                })
                .map(|q| q.qpn)
                .collect();
            for q in victims {
                self.qp_to_error(q, Some(VRDMA_EV_QP_FATAL), 0);
            }
        }
        r
    }

    /// The uplink's link state (spec §2.2 `port_state`, §9): on a change, `port_state` in the
    /// configuration space and QUERY_PORT follow, then `VRDMA_EV_PORT_ACTIVE` / `_PORT_ERR` is
    /// posted. Returns whether the state changed.
    pub fn set_port_active(&mut self, up: bool) -> bool {
        if self.config.port_active == up {
            return false;
        }
        self.config.port_active = up;
        guest_info!("port 1 {}", if up { "ACTIVE" } else { "DOWN" });
        let ev = if up {
            vrdma_spec::VRDMA_EV_PORT_ACTIVE
        } else {
            vrdma_spec::VRDMA_EV_PORT_ERR
        };
        self.out.event(output::event(ev, 1, 0));
        true
    }

    /// Arm a CQ moderation timer (spec §5.5) for `cqn` at `at` (a restore re-arms the CQs that
    /// held CQEs back).
    pub(crate) fn arm_cq_timer(&self, at: std::time::Instant, cqn: u32) {
        self.cq_timers.lock().push(std::cmp::Reverse((at, cqn)));
    }

    /// Fire the CQ moderation timers (spec §5.5) that expired by `now`; returns the next one.
    /// Entries of CQs destroyed or fired since are stale and skipped (`moderation_expired`
    /// compares the deadline); each held CQE pushes at most one entry per event.
    pub fn cq_moderation_tick(&self, now: std::time::Instant) -> Option<std::time::Instant> {
        loop {
            let (d, cqn) = {
                let mut heap = self.cq_timers.lock();
                match heap.peek() {
                    Some(&std::cmp::Reverse((d, _))) if d > now => return Some(d),
                    Some(&std::cmp::Reverse(e)) => {
                        heap.pop();
                        e
                    }
                    None => return None,
                }
            };
            if let Some(mut cq) = self.cqs.get(cqn) {
                cq.moderation_expired(&self.mem, &*self.out, d);
            }
        }
    }

    /// Move a QP to ERR (if it is not in RESET or ERR already), send `event` (VRDMA_EV_* with
    /// `info`) if given, then flush it through [`DeviceTables::schedule_flush`].
    pub fn qp_to_error(&self, qpn: u32, event: Option<u32>, info: u32) {
        {
            let Some(mut qp) = self.qps.get(qpn) else {
                return;
            };
            if matches!(qp.state, QpState::Err | QpState::Reset) {
                return;
            }
            qp.enter(&self.mem, QpState::Err);
            self.qps_errored.fetch_add(1, Ordering::Release);
        }
        if let Some(ev) = event {
            self.out.event(output::event(ev, qpn, info));
        }
        self.schedule_flush(qpn);
    }

    /// Run the flush hook for `qpn`, which just entered ERR. Called from inside a flush (the
    /// flush overflowed a CQ and moved more QPs to ERR), it only queues `qpn`: the outermost
    /// call flushes the queued QPs one after the other, in the order they entered ERR. The
    /// stack depth is therefore bounded whatever the length of the overflow chain. On an engine
    /// worker, another worker's QP is only queued for that worker (`flush.rs`).
    pub fn schedule_flush(&self, qpn: u32) {
        if self.flush_hook.is_none() {
            return;
        }
        let owner = crate::qp::worker_of(qpn, self.flushes.workers());
        self.flushes.push(owner, qpn);
        if flush::queue_only(owner) {
            // Another worker's QP, or a command beside the workers: flushed on the QP's own
            // worker (`flush.rs`).
            self.flushes.request_kick(owner);
            return;
        }
        self.run_flushes();
    }

    /// Whether QP `qpn`'s received packets are processed on the calling thread: on an engine
    /// worker of several only its own QPs' (a multicast datagram reaches each member's worker,
    /// `transport::workers::received_by`); on any other thread, which holds the device
    /// exclusively, every QP's.
    pub fn receives_here(&self, qpn: u32) -> bool {
        flush::current_worker()
            .is_none_or(|w| crate::qp::worker_of(qpn, self.flushes.workers()) == w)
    }

    /// Flush what waits in the calling worker's queue (every queue on a thread that holds the
    /// device exclusively), unless this thread is flushing already (then its loop takes them).
    pub fn run_flushes(&self) {
        let Some(hook) = self.flush_hook else {
            return;
        };
        if self.flushes.is_empty() {
            return;
        }
        let Some(_in_loop) = flush::FlushLoop::enter() else {
            return;
        };
        let me = flush::current_worker();
        while let Some(q) = match me {
            Some(w) => self.flushes.pop(w),
            None => self.flushes.pop_any(),
        } {
            hook(self, q);
        }
    }

    /// Whether QP `qpn` waits in its worker's flush queue.
    pub fn flush_queued(&self, qpn: u32) -> bool {
        let owner = crate::qp::worker_of(qpn, self.flushes.workers());
        self.flushes.is_queued(owner, qpn)
    }

    /// The workers that have QPs to flush queued by another worker (bit per worker), cleared:
    /// the engine kicks them after its batch.
    pub fn take_flush_kicks(&self) -> u32 {
        self.flushes.take_kicks()
    }

    /// A QP's SQ or RQ ring failed at run time (index error or inaccessible): write the ring's
    /// error code, move the QP to ERR and send QP_FATAL.
    pub fn qp_ring_error(&self, qpn: u32, on_sq: bool, err: &RingError) {
        if let Some(qp) = self.qps.get(qpn) {
            let ring = if on_sq { Some(&qp.sq) } else { qp.rq.as_ref() };
            if let Some(r) = ring {
                let _ = r.set_error(&self.mem, err.ring_error_code());
            }
        }
        self.qp_to_error(qpn, Some(VRDMA_EV_QP_FATAL), err.ring_error_code());
    }

    /// Take the next receive WQE of an SRQ (see [`Srq::pop`]). When this call breaks the SRQ
    /// (index or access error, SRQ_ERR sent), every QP attached to it goes to ERROR with
    /// QP_FATAL (`info` = the ring error code): IBTA 10.2.9 / 11.6.3 (SRQ catastrophic error: the
    /// associated QPs enter the Error state), spec §14.4. Each then flushes and reports
    /// LAST_WQE_REACHED (spec §13).
    pub fn srq_pop(&self, srqn: u32, buf: &mut [u8]) -> Result<bool, RingError> {
        // The SRQ only for the pop; the QPs are locked after it is released (lock order).
        let (was_broken, r) = {
            let mut srq = self.srqs.get(srqn).ok_or(RingError::Broken)?;
            let was_broken = srq.broken;
            (was_broken, srq.pop(&self.mem, &*self.out, buf))
        };
        if let Err(e) = &r {
            if !was_broken {
                let code = e.ring_error_code();
                let victims: Vec<u32> = self
                    .qps
                    .iter()
                    .filter(|q| q.srqn == Some(srqn))
                    .map(|q| q.qpn)
                    .collect();
                for q in victims {
                    self.qp_to_error(q, Some(VRDMA_EV_QP_FATAL), code);
                }
            }
        }
        r
    }

    /// QPNs to reschedule because an ODP fault they waited for was resolved (resident, failed or
    /// timed out).
    pub fn take_resumed_qps(&self) -> Vec<u32> {
        self.mrs.write().take_resumed()
    }

    /// ODP timers: expire page requests; returns the next deadline. Call from the engine tick.
    pub fn odp_tick(&self, now: Instant) -> Option<Instant> {
        // Every batch: a read first, the write only when something is due.
        let idle = self.mrs.read().odp_tick_idle(now);
        idle.unwrap_or_else(|| self.mrs.write().odp_tick(now))
    }

    /// Is the XRC domain referenced by an XRC SRQ or an XRC_TGT QP (spec §13.7)?
    pub fn xrcd_in_use(&self, xrcdn: u32) -> bool {
        self.qps.iter().any(|q| q.xrcdn == Some(xrcdn))
            || self
                .srqs
                .iter()
                .any(|(_, s)| s.xrc.is_some_and(|x| x.xrcdn == xrcdn))
    }

    /// Is the PD referenced by any object?
    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.qps.iter().any(|q| q.pd == pd)
            || self.srqs.iter().any(|(_, s)| s.pd == pd)
            || self.ahs.read().iter().any(|(_, a)| a.pd == pd)
            || self.mrs.read().pd_in_use(pd)
    }
}

/// Read access to the object tables for the crate's users (tests, tools). Inside the crate the
/// fields are `pub(crate)`: `transport/` and `exporter.rs` use them directly (ARCHITECTURE.md
/// "Device"); nothing outside may change a table behind the device's back.
impl<P: Protocol> DeviceTables<P> {
    /// How many commands wait for the engine workers' units in flight now (`units.rs`; tests
    /// ask).
    pub fn fences_waiting(&self) -> u32 {
        self.units.waiting()
    }

    pub fn pds(&self) -> &PdTable {
        &self.pds
    }
    pub fn cqs(&self) -> &LockedTable<Cq> {
        &self.cqs
    }
    pub fn srqs(&self) -> &LockedTable<Srq> {
        &self.srqs
    }
    pub fn ahs(&self) -> std::sync::RwLockReadGuard<'_, AhTable> {
        self.ahs.read()
    }
    pub fn gids(&self) -> &GidTable {
        &self.gids
    }
    pub fn mcast(&self) -> std::sync::RwLockReadGuard<'_, crate::objects::McastTable> {
        self.mcast.read()
    }

    /// Whether `gid` is a multicast group a QP of this device is attached to. Per frame: a
    /// unicast GID (every RC/UC frame) is answered without the groups' lock.
    pub fn is_mcast_group(&self, gid: &[u8; 16]) -> bool {
        crate::objects::is_multicast_gid(gid) && self.mcast.read().has_group(gid)
    }

    /// `f` of the QPs attached to `gid` (none for a unicast GID), under the groups' read lock.
    pub fn with_mcast_members<R>(&self, gid: &[u8; 16], f: impl FnOnce(&[u32]) -> R) -> R {
        if !crate::objects::is_multicast_gid(gid) {
            return f(&[]);
        }
        f(self.mcast.read().members(gid))
    }
    /// The transport's timer queue (its visit counter is what `tests/transport_timers.rs` checks).
    pub fn timers(&self) -> &TimerQueue {
        &self.timers
    }
}
