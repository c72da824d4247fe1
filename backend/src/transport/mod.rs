//! RoCEv2 transport (IBTA Vol. 1 ch. 9): requester, responder and completer for RC, UC, UD and
//! GSI (QP1), plus the engine thread that drives them.
//!
//! Files follow the IBTA roles:
//! - `intake.rs`: checks every packet passes first: service type, P_Key, peer address (§14.6)
//! - `requester/`: SQ WQEs -> request packets (spec §6.1; `wqe.rs` decodes, `send.rs` sends)
//! - `responder/`: request packets -> guest memory, ACK/NAK/READ responses/atomic acks (§14)
//! - `completer.rs`: ACKs and responses -> send CQEs, retransmission, RNR retry
//! - `timers.rs`: per-QP retransmit and RNR deadlines
//! - `engine/`: the engine threads, a worker's round one phase per file (wait, receive, run
//!   units, route, drain the outbox; see `engine/mod.rs`); `wait.rs`: the timerfd and busy-poll
//!   a worker waits with
//! - `doorbells.rs`: the merging, bounded queue of doorbell records feeding the engine
//! - `workers.rs`: engine workers (`--engine-threads`): which worker a QP, doorbell or frame
//!   belongs to, and what the other threads route to a worker
//! - `ctx.rs`: the narrow interface to the device (QP attribute snapshot, rings, CQs, AHs)
//! - `packet.rs`: the transport's view of packets on top of `wire`
//!
//! Per-QP protocol state lives in `Qp::req` ([`RequesterState`]) and `Qp::resp`
//! ([`ResponderState`]); `qp/` owns attributes and the IBTA state machine. While a transport
//! function works on a QP it *takes* that state out of the QP (see `with_req`) so it can use the
//! rest of the `Device` (MRs, guest memory, CQs) freely; QP-level errors found meanwhile are
//! deferred ([`Fatal`]) and applied once the state is back, through `qp/`'s move-to-ERROR, which
//! in turn calls [`flush`].
//!
//! Decisions (beyond what IBTA fixes):
//! - RC flow control: go-back-N (IBTA 9.7.5.1) inside a congestion window (requester/:
//!   `cwnd`, 4..=128 packets, +1 per acknowledgement, halved per loss signal); one restart per
//!   restart point (`retry_psn`) so bursts of out-of-order packets or duplicated NAKs do not each
//!   trigger a retransmission.
//! - READ responses are paced (`responder::READ_BURST` packets per request arrival / engine
//!   tick); a resent READ request replaces any queued reply.
//! - ACK coalescing: the requester sets AckReq on the last packet of a message, every 32 PSNs and
//!   when the window fills; the responder ACKs on AckReq or every 64 packets.
//! - Retransmission timeout 4.096 µs × 2^timeout with a 1 ms floor; timeout 0 = no timer
//!   (IBTA 9.7.6.1). RNR back-off per IBTA table 45, rnr_retry 7 = infinite.
//! - UD/GSI datagrams are bounded by the port MTU (no path MTU attribute for UD).
//! - UC resynchronises only on PSNs less than `responder::UC_PSN_WINDOW` (2^16) ahead of the
//!   expected one (spec §14.6); Linux rxe resynchronises on any PSN.
//! - Completions retire strictly in SQ order; an error WQE moves the QP to ERROR when it
//!   retires, after the WQEs before it completed.
//! - Engine tests and fixtures: `backend/tests/transport_*.rs`, `backend/tests/common/`.

pub mod completer;
pub mod ctx;
pub mod doorbells;
pub mod engine;
mod engine_options;
pub mod intake;
pub mod onecopy;
pub mod packet;
pub mod requester;
pub mod responder;
mod scratch;
pub mod sgelist;
pub mod timers;
mod wait;
pub mod workers;

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::qp::QpState;

pub use requester::RequesterState;
pub use responder::ResponderState;

/// The RoCEv2 engine as the QP table's protocol: the requester, responder and timer marks
/// every QP holds (`qp::Protocol`). Named here, so `qp/` and `tables/` do not depend on the
/// transport (ARCHITECTURE.md "Layers").
#[derive(Debug)]
pub struct Rocev2;

impl crate::qp::Protocol for Rocev2 {
    type Req = RequesterState;
    type Resp = ResponderState;
    type Tick = timers::TickMarks;
}

impl crate::qp::SendState for RequesterState {
    fn set_sq_psn(&mut self, psn: u32) {
        RequesterState::set_sq_psn(self, psn);
    }
    fn reset(&mut self) {
        RequesterState::reset(self);
    }
}

impl crate::qp::RecvState for ResponderState {
    fn set_rq_psn(&mut self, psn: u32) {
        ResponderState::set_rq_psn(self, psn);
    }
    fn reset(&mut self) {
        ResponderState::reset(self);
    }
}

/// The device state the engine runs on: the device's tables with this engine's per-QP state.
/// (`device::Device` is the same type; the transport sees only what `tables/` defines on it.)
pub type Device = crate::tables::DeviceTables<Rocev2>;

/// PSNs are 24-bit (IBTA 9.7.1).
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// `a - b` in the 24-bit PSN space, as a signed distance (IBTA 9.7.1: half the space is "ahead").
#[inline]
pub fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

/// `psn + n` modulo 2^24.
#[inline]
pub fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// A QP-level error found by the transport, applied after the protocol state is put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fatal {
    /// QP to ERROR, no async event (the error was reported through a completion).
    Silent,
    /// QP to ERROR + `VRDMA_EV_QP_FATAL` (ring access failure, spec §4) with `info` = the
    /// `VRDMA_RING_ERR_*` code (spec §14.4), 0 if no ring failed.
    QpFatal(u32),
    /// QP to ERROR + `VRDMA_EV_QP_REQ_ERR` (invalid request at the responder, IBTA 11.6.2).
    ReqErr,
    /// QP to ERROR + `VRDMA_EV_QP_ACCESS_ERR` (IBTA C9-222.1.1, spec §14).
    AccessErr,
}

impl Fatal {
    fn event(self) -> Option<u32> {
        match self {
            Fatal::Silent => None,
            Fatal::QpFatal(_) => Some(ctx::abi::EV_QP_FATAL),
            Fatal::ReqErr => Some(ctx::abi::EV_QP_REQ_ERR),
            Fatal::AccessErr => Some(ctx::abi::EV_QP_ACCESS_ERR),
        }
    }

    /// The event's `info`.
    fn info(self) -> u32 {
        match self {
            Fatal::QpFatal(code) => code,
            // Spec §14.6: QP_REQ_ERR carries the status the requester sees.
            Fatal::ReqErr => ctx::abi::WC_REM_INV_REQ_ERR as u32,
            _ => 0,
        }
    }
}

/// A QP's requester or responder state: taken out of the QP while a worker runs on it (the
/// QP's lock is not held meanwhile), put back after.
trait HeldState: Sized {
    fn take(dev: &Device, qpn: u32) -> Option<(ctx::QpCtx, Self)>;
    /// Put it back, counting `rx`; the QP's state after, if it still exists.
    fn put(self, dev: &Device, qpn: u32, rx: RxCount) -> Option<QpState>;
    /// What the work on it asked for: the QP to go to ERROR with this event.
    fn take_fatal(&mut self) -> Option<Fatal>;
}

impl HeldState for RequesterState {
    fn take(dev: &Device, qpn: u32) -> Option<(ctx::QpCtx, Self)> {
        ctx::take_req(dev, qpn)
    }
    fn put(self, dev: &Device, qpn: u32, rx: RxCount) -> Option<QpState> {
        ctx::put_req_counted(dev, qpn, self, rx.packets, rx.bytes)
    }
    fn take_fatal(&mut self) -> Option<Fatal> {
        self.fatal.take()
    }
}

impl HeldState for ResponderState {
    fn take(dev: &Device, qpn: u32) -> Option<(ctx::QpCtx, Self)> {
        ctx::take_resp(dev, qpn)
    }
    fn put(self, dev: &Device, qpn: u32, rx: RxCount) -> Option<QpState> {
        ctx::put_resp_counted(dev, qpn, self, rx.packets, rx.bytes)
    }
    fn take_fatal(&mut self) -> Option<Fatal> {
        self.fatal.take()
    }
}

/// Run `f` on QP `qpn`'s held state `S` (taken out of the QP for the duration).
fn with_state<S: HeldState, R>(
    dev: &Device,
    qpn: u32,
    f: impl FnOnce(&Device, &ctx::QpCtx, &mut S) -> R,
) -> Option<R> {
    let (c, mut st) = S::take(dev, qpn)?;
    let r = f(dev, &c, &mut st);
    put_back(dev, qpn, &c, st, RxCount::default());
    Some(r)
}

/// Run `f` on QP `qpn`'s requester state (taken out of the QP for the duration).
pub(crate) fn with_req<R>(
    dev: &Device,
    qpn: u32,
    f: impl FnOnce(&Device, &ctx::QpCtx, &mut RequesterState) -> R,
) -> Option<R> {
    with_state(dev, qpn, f)
}

/// Run `f` on QP `qpn`'s responder state (taken out of the QP for the duration).
pub(crate) fn with_resp<R>(
    dev: &Device,
    qpn: u32,
    f: impl FnOnce(&Device, &ctx::QpCtx, &mut ResponderState) -> R,
) -> Option<R> {
    with_state(dev, qpn, f)
}

/// Put a state taken with snapshot `c` back (with `rx`, the packets counted while it was out),
/// then apply what happened meanwhile.
fn put_back<S: HeldState>(dev: &Device, qpn: u32, c: &ctx::QpCtx, mut st: S, rx: RxCount) {
    let fatal = st.take_fatal();
    let after = st.put(dev, qpn, rx);
    settle_after_put_back(dev, qpn, c.state, after, fatal);
}

/// What happened to QP `qpn` while a state taken in state `before` was out: `after` is its
/// state at the put-back, `fatal` what the work on the state asked for.
fn settle_after_put_back(
    dev: &Device,
    qpn: u32,
    before: QpState,
    after: Option<QpState>,
    fatal: Option<Fatal>,
) {
    if before != QpState::Err && after == Some(QpState::Err) {
        // The QP entered ERROR while its state was out (e.g. CQ overflow, or its SRQ failed and
        // took every attached QP to ERROR, spec §14.4): the core already sent the event, but its
        // flush hook could not see the state then, so flush now, through the core's worklist (a
        // flush may overflow further CQs; the worklist keeps that iterative). A `fatal` of the
        // work is then moot: the QP is in ERROR already and one event reported it.
        dev.schedule_flush(qpn);
    } else if let Some(e) = fatal {
        dev.qp_to_error(qpn, e.event(), e.info());
    }
}

/// Packets and bytes received for a QP while its responder state was held.
#[derive(Debug, Default, Clone, Copy)]
struct RxCount {
    packets: u64,
    bytes: u64,
}

/// The received frames of one buffer, as the engine hands them to the transport one by one
/// ([`on_located_in_run`]). A fabric segment holds up to 64 request frames of one QP (spec
/// §16.2 rule 6): the first takes that QP's responder state out, the following ones of the
/// same QP run on it without a lookup, a lock, a snapshot or a put-back each, and
/// [`ReceiveRun::finish`] (or any other frame) puts it back. The buffer is one unit of work
/// (`LongGuard::hand_off` after it), and a MODIFY_QP waits while the state is out
/// (`ctx::state_out`); the one change the core makes beside it, moving a QP to ERR, bumps
/// `qps_errored`, which ends the run at the next frame. So the snapshot stays true for the run.
#[derive(Default)]
pub struct ReceiveRun {
    held: Option<HeldResp>,
}

struct HeldResp {
    qpn: u32,
    ctx: ctx::QpCtx,
    st: ResponderState,
    rx: RxCount,
    /// `qps_errored` before the take: a change means some QP entered ERR since, maybe this
    /// one, so the snapshot may be stale and the next frame takes a fresh one.
    errored: u64,
}

impl ReceiveRun {
    /// Put a held responder state back (the end of the buffer).
    pub fn finish(&mut self, dev: &Device) {
        if let Some(h) = self.held.take() {
            put_back(dev, h.qpn, &h.ctx, h.st, h.rx);
        }
    }
}

/// A doorbell record from the doorbell virtqueue (spec §8).
pub fn on_doorbell(dev: &Device, db: vrdma_spec::VrdmaDoorbell) {
    let now = Instant::now();
    match db.type_ {
        ctx::abi::DB_SQ => requester::run(dev, db.id, now),
        // Outside ERROR an RQ doorbell is a hint (spec §8): receives are read when a request
        // needs one. In ERROR nothing arrives, so the receives posted since the QP entered it
        // are flushed now (spec §13.3); ib_drain_rq() waits for exactly that flush.
        ctx::abi::DB_RQ if ctx::qp_state(dev, db.id) == Some(QpState::Err) => {
            with_resp(dev, db.id, responder::flush);
        }
        // Optional arm doorbell (spec §5.3): arming is in memory; the core re-checks the arm.
        ctx::abi::DB_CQ_ARM => {
            if let Some(mut cq) = dev.cqs.get(db.id) {
                cq.on_arm_doorbell(&dev.mem, &*dev.out);
            }
        }
        _ => {}
    }
}

/// One engine batch of doorbell records, in order; then, if the queue overflowed its bound,
/// an SQ and an RQ doorbell for every QP (in QPN order), which covers whatever was not queued
/// (spec §8).
pub fn on_doorbells(dev: &Device, batch: &doorbells::DoorbellBatch) {
    on_worker_doorbells(dev, batch, 0, 1);
}

/// [`on_doorbells`] for engine worker `w` of `workers`: its sweep rings only its own QPs
/// (`qp::worker_of`; the records were routed to it already).
pub fn on_worker_doorbells(
    dev: &Device,
    batch: &doorbells::DoorbellBatch,
    w: usize,
    workers: usize,
) {
    for db in &batch.records {
        on_doorbell(dev, *db);
    }
    if batch.sweep {
        let mut qpns: Vec<u32> = dev
            .qps
            .iter()
            .map(|q| q.qpn)
            .filter(|&q| crate::qp::worker_of(q, workers) == w)
            .collect();
        qpns.sort_unstable();
        for qpn in qpns {
            for type_ in [ctx::abi::DB_SQ, ctx::abi::DB_RQ] {
                on_doorbell(dev, vrdma_spec::VrdmaDoorbell { type_, id: qpn });
            }
        }
    }
}

/// The standard frames in a buffer: the frames of a fabric segment when the buffer is marked
/// as one (`segment`: `RxFrame::segment`, `Outbox::segments`; spec §16.2 rule 6), else
/// the buffer itself, whatever its bytes (a guest's netdev frame of any EtherType). A marked
/// buffer that is not a valid segment yields nothing (dropped).
pub fn frames_of(buf: &[u8], segment: bool) -> FramesOf<'_> {
    use crate::wire::segment::Segment;
    if !segment {
        return FramesOf::One(Some(buf));
    }
    match Segment::parse(buf) {
        Some(s) => FramesOf::Segment(s.frames()),
        None => {
            guest_debug!("engine: dropping a malformed fabric segment");
            FramesOf::One(None)
        }
    }
}

/// See [`frames_of`].
#[derive(Debug, Clone)]
pub enum FramesOf<'a> {
    One(Option<&'a [u8]>),
    Segment(crate::wire::segment::Frames<'a>),
}

impl<'a> Iterator for FramesOf<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            FramesOf::One(f) => f.take(),
            FramesOf::Segment(s) => s.next(),
        }
    }
}

/// A RoCEv2 frame from the uplink (already classified as ours by `port`).
pub fn on_frame(dev: &Device, frame: &[u8]) {
    on_frame_at(dev, frame, Instant::now());
}

/// [`on_frame`] with the time the caller read once for its whole batch (the engine: one clock
/// read per batch instead of per frame; deadlines armed from it are at most a batch early).
pub fn on_frame_at(dev: &Device, frame: &[u8], now: Instant) {
    on_frame_ref_at(dev, frame, now, None);
}

/// [`on_frame_at`] for a frame of a by-reference fabric segment (spec §16.2 rule 6): its
/// payload is `src` (in the sender's guest memory), not the payload bytes of `frame`. Only an
/// RC WRITE request can carry one (`onecopy`); any other packet with a reference is dropped,
/// so bytes that are not its payload are never read as one.
pub fn on_frame_ref_at(
    dev: &Device,
    frame: &[u8],
    now: Instant,
    src: Option<packet::PayloadSrc<'_>>,
) {
    match crate::wire::locate(frame) {
        Ok(l) => on_located_ref_at(dev, l, now, src),
        // Headers that do not locate are malformed (never an ICRC error: not checked yet).
        Err(_) => crate::stats::bump(&dev.port_stats.drop_malformed),
    }
}

/// [`on_frame_ref_at`] for a frame whose headers up to UDP are located already (by the port
/// when it classified the frame, `port::classify_located`): they are not read again.
pub fn on_located_ref_at(
    dev: &Device,
    located: crate::wire::Located<'_>,
    now: Instant,
    src: Option<packet::PayloadSrc<'_>>,
) {
    let mut run = ReceiveRun::default();
    on_located_in_run(dev, located, now, src, &mut run);
    run.finish(dev);
}

/// [`on_located_ref_at`] for one of the frames of a received buffer (`run`, see
/// [`ReceiveRun`]).
pub fn on_located_in_run(
    dev: &Device,
    located: crate::wire::Located<'_>,
    now: Instant,
    src: Option<packet::PayloadSrc<'_>>,
    run: &mut ReceiveRun,
) {
    use crate::stats::bump;
    let check = if dev.icrc_offload.checked_rx {
        crate::wire::IcrcCheck::Trusted
    } else {
        crate::wire::IcrcCheck::Verify
    };
    let frame = located.frame();
    let mut pkt = match packet::parse_located(located, check) {
        Ok(p) => p,
        // Malformed, bad ICRC, unsupported opcode: silently dropped (IBTA 9.7.5.2).
        Err(crate::wire::WireError::BadIcrc { .. }) => {
            bump(&dev.port_stats.drop_bad_icrc);
            return;
        }
        Err(_) => {
            bump(&dev.port_stats.drop_malformed);
            return;
        }
    };
    if src.is_some() {
        let rc_write = pkt.op() == crate::wire::Operation::Write
            && matches!(
                pkt.info.transport,
                crate::wire::Transport::Rc | crate::wire::Transport::Xrc
            );
        if !rc_write || pkt.bth.dest_qp == vrdma_spec::VRDMA_MCAST_QPN {
            bump(&dev.port_stats.drop_malformed);
            return;
        }
        pkt.payload_ref = src;
    }
    if pkt.bth.dest_qp == vrdma_spec::VRDMA_MCAST_QPN {
        // A datagram for a multicast group: a copy for each attached QP (spec §15.8), each
        // delivered by the QP's own worker (the engine gave every member's worker the
        // datagram). Only UD packets reach a QP here (intake drops other transports).
        let mut members = [0u32; crate::objects::mcast::MAX_MCAST_QP_ATTACH as usize];
        let n = dev.with_mcast_members(&pkt.dgid, |list| {
            let n = list.len().min(members.len());
            members[..n].copy_from_slice(&list[..n]);
            n
        });
        if n == 0 {
            bump(&dev.port_stats.drop_unknown_qp);
        }
        for &qpn in members[..n].iter().filter(|&&q| dev.receives_here(q)) {
            deliver(dev, qpn, &pkt, frame, now, run);
        }
        return;
    }
    deliver(dev, pkt.bth.dest_qp, &pkt, frame, now, run);
}

/// The checks and the processing of one received packet for QP `qpn` (`on_frame_at`).
fn deliver(
    dev: &Device,
    qpn: u32,
    pkt: &packet::RxPkt<'_>,
    frame: &[u8],
    now: Instant,
    run: &mut ReceiveRun,
) {
    use crate::stats::bump;
    // Service type, P_Key and (RC/UC) the peer's addresses (IBTA 9.6, spec §14.6), then the QP
    // state (IBTA 10.3): otherwise dropped, for responses as well as requests.
    let accept = |c: &ctx::QpCtx| {
        intake::check(c, pkt).map_err(|why| why.counter(&dev.port_stats))?;
        let accepted = if pkt.info.is_response() {
            c.can_send() || c.state == QpState::Sqe
        } else {
            c.can_receive()
        };
        if accepted {
            Ok(())
        } else {
            Err(&dev.port_stats.drop_qp_state)
        }
    };
    let errored = dev.qps_errored.load(Ordering::Acquire);
    if let Some(h) = run
        .held
        .as_mut()
        .filter(|h| h.qpn == qpn && h.errored == errored)
    {
        if !pkt.info.is_response() {
            if let Err(counter) = accept(&h.ctx) {
                bump(counter);
                return;
            }
            h.rx.packets += 1;
            h.rx.bytes += frame.len() as u64;
            responder::on_request(dev, &h.ctx, &mut h.st, pkt);
            if h.st.fatal.is_some() {
                run.finish(dev);
            }
            return;
        }
    }
    // Anything else: the held state goes back first, so nothing else finds it out.
    run.finish(dev);
    // The checks run on the snapshot the take makes (one lookup and lock of the QP for the
    // packet; a command beside the workers, MODIFY_QP on the shared device, waits while the
    // state is out, so it cannot move the QP between the check and the processing). The
    // packet is counted in the QP's receive counters when the state goes back.
    let rx = RxCount {
        packets: 1,
        bytes: frame.len() as u64,
    };
    if pkt.info.is_response() {
        let Some((c, mut st)) = ctx::take_req(dev, qpn) else {
            bump(&dev.port_stats.drop_unknown_qp);
            return;
        };
        let counted = match accept(&c) {
            Err(counter) => {
                bump(counter);
                RxCount::default()
            }
            Ok(()) => {
                completer::on_response(dev, &c, &mut st, pkt, now);
                // Acknowledgements open the window / complete WQEs: continue sending and retire.
                requester::process(dev, &c, &mut st, now);
                rx
            }
        };
        put_back(dev, qpn, &c, st, counted);
    } else {
        let Some((c, mut st)) = ctx::take_resp(dev, qpn) else {
            bump(&dev.port_stats.drop_unknown_qp);
            return;
        };
        if let Err(counter) = accept(&c) {
            // Refused: the state goes back at once, not held for frames that cannot use it
            // (a peer aiming at another tenant's QPN must not keep its state out).
            bump(counter);
            put_back(dev, qpn, &c, st, RxCount::default());
            return;
        }
        responder::on_request(dev, &c, &mut st, pkt);
        let held = HeldResp {
            qpn,
            ctx: c,
            st,
            rx,
            errored,
        };
        if held.st.fatal.is_some() || held.ctx.state == QpState::Err {
            put_back(dev, qpn, &held.ctx, held.st, held.rx);
        } else {
            run.held = Some(held);
        }
    }
}

/// Fire expired transport timers and resume QPs whose ODP faults were resolved; returns the next
/// deadline.
pub fn on_tick(dev: &Device, now: Instant) -> Option<Instant> {
    resume_odp(dev, now);
    let cq = dev.cq_moderation_tick(now);
    match (timers::on_tick(dev, now), cq) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// [`on_tick`] for engine worker `w` of several (`--engine-threads`): its own QPs' timers and
/// ODP resumptions, and the device-wide deadlines (CQ moderation), which any worker may fire.
pub fn on_worker_tick(dev: &Device, now: Instant, w: usize) -> Option<Instant> {
    let workers = dev.timers.shards();
    // Every batch: a read first, the write only when an ODP fault ended.
    let resumed = if dev.mrs.read().resumed_pending() {
        dev.mrs
            .write()
            .take_resumed_where(|q| crate::qp::worker_of(q, workers) == w)
    } else {
        Vec::new()
    };
    resume_qps(dev, resumed, now);
    let cq = dev.cq_moderation_tick(now);
    match (timers::on_worker_tick(dev, now, w), cq) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// QPs that waited for an ODP page request continue (spec §10): the requester, and READ
/// responses the responder held back on a fault (`responder::pump_replies`).
pub fn resume_odp(dev: &Device, now: Instant) {
    let resumed = dev.mrs.write().take_resumed();
    resume_qps(dev, resumed, now);
}

fn resume_qps(dev: &Device, resumed: Vec<u32>, now: Instant) {
    for qpn in resumed {
        with_req(dev, qpn, |dev, c, st| {
            st.odp_wait = None;
            requester::process(dev, c, st, now);
        });
        with_resp(dev, qpn, |dev, c, st| {
            if !st.replies.is_empty() {
                responder::pump_replies(dev, c, st, responder::READ_BURST);
            }
        });
    }
}

/// Flush hook called by `qp/` after a QP entered ERROR (from MODIFY_QP or from the transport):
/// outstanding and posted SQ WQEs complete with WR_FLUSH_ERR, RQ WQEs too; SRQ-attached QPs get
/// LAST_WQE_REACHED (spec §13).
pub fn flush(dev: &Device, qpn: u32) {
    // A flush queued for the QP's worker (a command beside the workers moved it to ERR) may run
    // after the guest moved the QP on (RESET, then INIT..RTS again): RESET discarded what the
    // flush was for, and flushing now would complete the QP's new WQEs.
    with_req(dev, qpn, |dev, c, st| {
        if c.state == QpState::Err {
            requester::flush(dev, c, st);
        }
    });
    with_resp(dev, qpn, |dev, c, st| {
        if c.state == QpState::Err {
            responder::flush(dev, c, st);
        }
    });
}
