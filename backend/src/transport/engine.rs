//! The engine threads (ARCHITECTURE.md "Threads"): one or more workers per device
//! (`--engine-threads`, `workers.rs`: a QP belongs to one worker), each waiting (epoll) on
//! - the uplink fd (frames from the network; worker 0 only, which hands the frames for other
//!   workers' QPs to them),
//! - an eventfd kicked by the vhost-user thread (doorbell records queued in [`EngineSender`], or a
//!   plain kick after a control command that may unblock QPs, e.g. ODP_PAGE_RESP),
//! - a timerfd programmed with the earliest transport / ODP deadline,
//!
//! and then, holding the device lock (`HandoffLock`) shared for a batch and handing it to a
//! waiting control command after every doorbell record and received buffer (see [`hand_off`]),
//! runs doorbells, received frames and timers through the transport. Workers of one device run
//! their batches at the same time: what they change is behind per-object locks (a QP, a CQ or
//! SRQ, the MR table, their timer shard and outbox; ARCHITECTURE.md "Locks"). Frames the
//! transport queued in the worker's outbox (`Device::outbox`) are sent to the uplink after the
//! lock is released. RoCEv2 frames for our GIDs go to `transport::on_frame`, everything else the
//! port demux (`port.rs`) gives the guest goes to `DeviceOutput::eth_rx`.
//!
//! The vhost-user thread never blocks on the engine: [`EngineSender::doorbell`] only adds to a
//! bounded, merging queue (`doorbells.rs`) and writes the eventfd.

use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;
use vrdma_spec::VrdmaDoorbell;

use super::doorbells::DoorbellBatch;
use super::wait::{Alarm, Poller};
use super::workers::{
    doorbell_worker, each_bit, hand, hand_out, looped_to, owners, received_by, Handed, Inbox,
    MAX_WORKERS,
};
use crate::devlog::DeviceLog;
use crate::handoff::{HandoffLock, LongGuard};
use crate::port::{classify_located, classify_with, tx_destination, Destination, TxDestination};
use crate::stats::{bump, PortStats};
use crate::tables::Outbox;
use crate::transport::Device;
use crate::uplink::{RxFrame, Uplink, MAX_FRAME};

/// Frames taken from the uplink per batch (bounds the time the device lock is held, and the
/// receive buffers: RX_BATCH × MAX_FRAME bytes per engine).
const RX_BATCH: usize = 128;
/// On a port with fabric segments (spec §16.2 rule 6): buffers taken per receive call, and the
/// packets after which a round stops receiving so its ACKs leave. Without it one round took a
/// whole window of segments (128 packets) before acknowledging any: the two engines took turns
/// instead of overlapping (fabric 64 KiB WRITE 1560 vs 2250 MB/s of single frames); with it
/// 2900-4000 MB/s (ARCHITECTURE.md "Segments"). Step 1 / budget 16 measured worse than 4 / 32.
const SEGMENT_RX_STEP: usize = 4;
const SEGMENT_RX_BUDGET: usize = 32;

/// Received frames handled per clock read (see `run`).
const FRAMES_PER_CLOCK: usize = 16;

const TOKEN_KICK: u64 = 1;
const TOKEN_TIMER: u64 = 2;
const TOKEN_UPLINK: u64 = 3;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("engine: cannot create {what}: {source}")]
    Setup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("engine: cannot spawn the thread: {0}")]
    Spawn(std::io::Error),
}

/// Handle the vhost-user side uses to feed the engine. Cheap to clone.
#[derive(Clone)]
pub struct EngineSender {
    /// One per worker (`workers.rs`).
    inboxes: Arc<[Inbox]>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for EngineSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineSender").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EngineSender {
    /// Queue doorbell records (spec §8) and wake the engine. Never blocks on the network; O(1)
    /// per record, records for the same object merged, pending records bounded (see
    /// `doorbells.rs`).
    pub fn doorbells(&self, dbs: &[VrdmaDoorbell]) {
        let n = self.inboxes.len();
        let mut kicked = 0u32;
        if n == 1 {
            if let Some(inbox) = self.inboxes.first() {
                let mut q = lock(&inbox.queue);
                for db in dbs {
                    q.push(*db);
                }
                kicked = 1;
            }
        } else {
            // Each record to its QP's worker (`workers.rs`).
            for db in dbs {
                let w = doorbell_worker(db, n);
                if let Some(inbox) = self.inboxes.get(w) {
                    lock(&inbox.queue).push(*db);
                    kicked |= 1 << w;
                }
            }
        }
        self.kick_workers(kicked);
    }

    /// Queue one doorbell record.
    pub fn doorbell(&self, db: VrdmaDoorbell) {
        self.doorbells(&[db]);
    }

    /// Same as [`EngineSender::doorbell`].
    pub fn push(&self, db: VrdmaDoorbell) {
        self.doorbells(&[db]);
    }

    /// Wake the engine to re-run timers and resumed QPs (call after control commands that may
    /// unblock work, e.g. ODP_PAGE_RESP, MODIFY_QP): every worker.
    pub fn kick(&self) {
        for inbox in self.inboxes.iter() {
            inbox.kick();
        }
    }

    /// Wake the workers set in `mask`.
    fn kick_workers(&self, mask: u32) {
        for w in each_bit(mask) {
            if let Some(inbox) = self.inboxes.get(w) {
                inbox.kick();
            }
        }
    }

    /// Wait, at most `limit` and holding no device lock, until every worker has run the
    /// doorbell records queued so far and sent their frames (spec §8; `workers::fence`).
    pub fn fence(&self, limit: Duration) -> bool {
        super::workers::fence(&self.inboxes, &self.stop, limit)
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.inboxes.len()
    }
}

/// The running engine threads. Dropping it stops and joins them.
pub struct Engine {
    sender: EngineSender,
    threads: Vec<JoinHandle<()>>,
    /// The device's label and log limit: what the engine logs names it (spec §16.5 "Logs").
    log: Option<Arc<DeviceLog>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

pub use super::engine_options::{EngineOptions, DEFAULT_POLL, DEFAULT_POLL_US};

impl Engine {
    /// Start the engine for `dev` on `uplink` with the default [`EngineOptions`].
    pub fn start(
        dev: Arc<HandoffLock<Device>>,
        uplink: Arc<dyn Uplink>,
    ) -> Result<Engine, EngineError> {
        Self::start_with(dev, uplink, EngineOptions::default())
    }

    /// Start the engine for `dev` on `uplink`. Installs the transport's flush hook in the device
    /// and spreads its QPs over the workers.
    pub fn start_with(
        dev: Arc<HandoffLock<Device>>,
        uplink: Arc<dyn Uplink>,
        opts: EngineOptions,
    ) -> Result<Engine, EngineError> {
        let n = opts.threads.clamp(1, MAX_WORKERS);
        let setup = |what| move |source| EngineError::Setup { what, source };
        let mut inboxes = Vec::with_capacity(n);
        let mut waits = Vec::with_capacity(n);
        for w in 0..n {
            let kick = EventFd::new(EFD_NONBLOCK).map_err(setup("eventfd"))?;
            let timer = TimerFd::new().map_err(|e| EngineError::Setup {
                what: "timerfd",
                source: std::io::Error::from_raw_os_error(e.errno()),
            })?;
            let epoll = Epoll::new().map_err(setup("epoll"))?;
            epoll
                .ctl(
                    ControlOperation::Add,
                    kick.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, TOKEN_KICK),
                )
                .map_err(setup("epoll add eventfd"))?;
            epoll
                .ctl(
                    ControlOperation::Add,
                    timer.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, TOKEN_TIMER),
                )
                .map_err(setup("epoll add timerfd"))?;
            // Worker 0 receives for all (`workers.rs`).
            let ufd = uplink.as_raw_fd();
            if w == 0 && ufd >= 0 {
                epoll
                    .ctl(
                        ControlOperation::Add,
                        ufd,
                        EpollEvent::new(EventSet::IN, TOKEN_UPLINK),
                    )
                    .map_err(setup("epoll add uplink"))?;
            }
            inboxes.push(Inbox::new(kick));
            waits.push((epoll, Alarm { timer, armed: None }));
        }
        let (port, units, log) = {
            let mut d = dev.lock();
            d.flush_hook = Some(super::flush);
            // What the port does with the ICRC is the uplink's for its life (a reset keeps it).
            d.icrc_offload = uplink.icrc_offload();
            super::timers::set_workers(&mut d, n);
            (d.port_stats.clone(), d.units.clone(), d.out.device_log())
        };
        let sender = EngineSender {
            inboxes: inboxes.into(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let mut engine = Engine {
            sender: sender.clone(),
            threads: Vec::with_capacity(n),
            log: log.clone(),
        };
        for (w, (epoll, alarm)) in waits.into_iter().enumerate() {
            let worker = Worker {
                w,
                dev: dev.clone(),
                uplink: uplink.clone(),
                sender: sender.clone(),
                port: port.clone(),
                units: units.clone(),
            };
            let poller = Poller::new(opts.poll);
            let name = if n == 1 {
                "vrdma-engine".to_string()
            } else {
                format!("vrdma-engine{w}")
            };
            let log = log.clone();
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    // The worker's whole life is its device's: all it logs names the device.
                    let _device = log.as_ref().map(crate::devlog::enter);
                    run(worker, epoll, alarm, poller)
                })
                .map_err(EngineError::Spawn)?;
            engine.threads.push(thread);
        }
        Ok(engine)
    }

    pub fn sender(&self) -> EngineSender {
        self.sender.clone()
    }

    /// Stop the thread and wait for it (clean shutdown: the current batch finishes first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _device = self.log.as_ref().map(crate::devlog::enter);
        self.sender.stop.store(true, Ordering::Release);
        self.sender.kick();
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                guest_error!("engine thread panicked");
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often the engine reads the uplink's link state (spec §2.2: a change reaches the guest
/// within this, plus the event's delivery).
pub const LINK_POLL: Duration = Duration::from_millis(250);

/// What one worker thread runs with (`workers.rs`).
struct Worker {
    /// Its index: worker 0 receives from the uplink.
    w: usize,
    dev: Arc<HandoffLock<Device>>,
    uplink: Arc<dyn Uplink>,
    /// Every worker's inbox, this one's included.
    sender: EngineSender,
    port: Arc<PortStats>,
    /// Where it publishes its units of work (`tables/units.rs`).
    units: Arc<crate::tables::UnitFence>,
}

fn run(worker: Worker, epoll: Epoll, mut alarm: Alarm, mut poller: Poller) {
    let Worker {
        w,
        dev,
        uplink,
        sender,
        port,
        units,
    } = worker;
    // Flushes of this worker's QPs run on this thread (`tables/flush.rs`).
    crate::tables::flush::enter_worker(w);
    let port = &*port;
    let inboxes = &*sender.inboxes;
    let workers = inboxes.len();
    let Some(inbox) = inboxes.get(w) else {
        return;
    };
    let receives = w == 0;
    let rx_uplink: Option<&dyn Uplink> = receives.then_some(&*uplink);
    // Frames other workers handed to this one's QPs (`workers.rs`), swapped with the inbox.
    let mut handed: Vec<Handed> = Vec::new();
    let mut events = vec![EpollEvent::default(); 8];
    // Receive buffers, reused every batch: frames are parsed in place (no copy per frame).
    let mut bufs: Vec<Vec<u8>> = (0..RX_BATCH).map(|_| vec![0u8; MAX_FRAME]).collect();
    let mut frames: Vec<RxFrame> = Vec::with_capacity(RX_BATCH);
    let mut uplink_more = receives;
    // Frames the engine sent to one of its own GIDs (QP to QP on this device): processed as
    // received in the next round instead of going out on the uplink.
    // Each with its segment mark (spec §16.2 rule 6).
    let mut looped: Vec<Handed> = Vec::new();
    // Frames for the uplink, swapped with this worker's outbox (`Device::outbox`, both keep
    // their capacity), and those of them that leave through the uplink.
    let mut out = Outbox::default();
    let mut to_uplink = Outbox::default();
    // The uplink's link state is polled every LINK_POLL (spec §2.2: UDP has none).
    let has_link = receives && uplink.link_up().is_some();
    let icrc_offload = uplink.icrc_offload();
    // The uplink is an in-memory queue whose `recv_batch` swaps whole buffers in (a fabric
    // device port): a frame for another worker moves to it without a copy.
    let swaps_buffers = uplink.rx_pending().is_some();
    // A worker that does not receive polls its inbox's flag only.
    let can_poll = poller.enabled() && (!receives || uplink.rx_pending().is_some());
    let mut link_next = Instant::now();
    loop {
        // Checked before every wait too, not only after one: the round that read the kick
        // eventfd may have consumed the kick of a stop stored after the last check, and the
        // next wait would then never end (seen once as a hung shutdown under strace).
        if sender.stop.load(Ordering::Acquire) {
            return;
        }
        // Wait unless the last batch left frames on the uplink or looped back; with a link
        // state to poll, at most until the next poll.
        let busy = uplink_more || !looped.is_empty();
        let timeout = if busy {
            0
        } else if has_link {
            let ms = link_next
                .saturating_duration_since(Instant::now())
                .as_millis();
            i32::try_from(ms).unwrap_or(i32::MAX).max(1)
        } else {
            -1
        };
        // Spin before sleeping (`Poller`); work found there needs no epoll round. The sleep is
        // timed only where the poller can poll (a clock read costs on some hosts).
        let pollable = can_poll && !busy;
        let polled = pollable && poller.spin(&inbox.wake, rx_uplink);
        let slept = (pollable && !polled && timeout != 0).then(Instant::now);
        // After a successful spin the fds are not read: a readable eventfd or timerfd stays
        // readable for the next epoll round, and the timers run every batch anyway.
        let n = if polled {
            0
        } else {
            match epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    guest_error!("engine: epoll_wait: {e}");
                    return;
                }
            }
        };
        if let Some(t) = slept {
            poller.slept(t.elapsed());
        }
        if sender.stop.load(Ordering::Acquire) {
            return;
        }
        for ev in &events[..n] {
            match ev.data() {
                TOKEN_KICK => {
                    let _ = inbox.kick.read();
                }
                TOKEN_TIMER => alarm.fired(),
                _ => {}
            }
        }
        // Before taking the queue: a kick after this take sets it again.
        inbox.wake.work.store(false, Ordering::SeqCst);
        let dbs = lock(&inbox.queue).take();
        inbox.take_frames(&mut handed);
        // The other workers this batch handed frames or a sweep to (kicked after it).
        let mut kick_mask = 0u32;
        frames.clear();
        let mut used = 0;
        uplink_more = false;
        // Packets taken this round: a fabric segment counts as the frames in it, and the round
        // ends after SEGMENT_RX_BUDGET of them so its ACKs go back without waiting for a whole
        // window's worth of segments (the peer's window keeps moving).
        let mut packets = 0;
        while receives && used < RX_BATCH {
            let from = frames.len();
            let end = if icrc_offload.segments {
                (used + SEGMENT_RX_STEP).min(RX_BATCH)
            } else {
                RX_BATCH
            };
            match uplink.recv_batch(&mut bufs[used..end], &mut frames) {
                Ok(0) => break,
                Ok(k) => {
                    for f in &mut frames[from..] {
                        f.slot += used;
                    }
                    used += k;
                    if icrc_offload.segments {
                        packets += frames[from..]
                            .iter()
                            .map(|f| {
                                bufs.get(f.slot)
                                    .and_then(|b| b.get(f.off..f.off + f.len))
                                    .map_or(1, |b| crate::wire::segment::frame_count(b, f.segment))
                            })
                            .sum::<usize>();
                        if packets >= SEGMENT_RX_BUDGET {
                            uplink_more = true;
                            break;
                        }
                    }
                }
                Err(e) => {
                    guest_warn!("engine: uplink receive: {e}");
                    break;
                }
            }
        }
        if used == RX_BATCH {
            uplink_more = true;
        }
        let next = {
            // A link change is rare and needs the device exclusively (spec §2.2: port_state
            // and the event), so it is applied before the batch takes its share.
            if has_link && Instant::now() >= link_next {
                link_next = Instant::now() + LINK_POLL;
                if let Some(up) = uplink.link_up() {
                    if dev.lock_long().config.port_active != up {
                        dev.lock().set_port_active(up);
                    }
                }
            }
            let mut d = dev.lock_long();
            // From here to the end of the batch this worker may copy through translations
            // (`tables/units.rs`); a hand-off point ends a unit.
            let unit = units.batch(w);
            // One clock read per FRAMES_PER_CLOCK frames, not per frame: deadlines armed from
            // it are at most that many frames' work early.
            let mut now = Instant::now();
            // False once the device is suspended: at the start of the batch, or by a control
            // command at a hand-off point (`hand_off`).
            let mut live = !d.suspended;
            'work: {
                if !live {
                    break 'work;
                }
                // This worker's QPs that another worker moved to ERR (a shared CQ overflowed,
                // a shared SRQ broke) are flushed here, on their own worker (`tables/flush.rs`).
                d.run_flushes();
                // A load first: the swap writes a line every worker reads each batch.
                if d.resume_sweep.load(Ordering::Acquire)
                    && d.resume_sweep.swap(false, Ordering::SeqCst)
                {
                    // Each worker sweeps its own QPs: the others get the request.
                    for (i, other) in inboxes.iter().enumerate().filter(|(i, _)| *i != w) {
                        lock(&other.queue).request_sweep();
                        kick_mask |= 1 << i;
                    }
                    super::on_worker_doorbells(&d, &DoorbellBatch::sweep_only(), w, workers);
                }
                // A hand-off point after every unit of work (a doorbell record, a looped or
                // received buffer): a waiting control command gets the device there instead of
                // after the whole batch.
                for db in &dbs.records {
                    super::on_doorbell(&d, *db);
                    (d, live) = hand_off(d, &unit, &mut now);
                    if !live {
                        break 'work;
                    }
                }
                if dbs.sweep {
                    super::on_worker_doorbells(&d, &DoorbellBatch::sweep_only(), w, workers);
                }
                for h in looped.drain(..).chain(handed.drain(..)) {
                    for (k, f) in super::frames_of(&h.buf, h.segment).enumerate() {
                        let src = held(&h.refs, k)
                            .map(|r| super::packet::PayloadSrc { refs: r, frame: k });
                        super::on_frame_ref_at(&d, f, now, src);
                    }
                    h.recycle();
                    (d, live) = hand_off(d, &unit, &mut now);
                    if !live {
                        break 'work;
                    }
                }
                for (i, rx) in frames.iter_mut().enumerate() {
                    if i > 0 {
                        (d, live) = hand_off(d, &unit, &mut now);
                        if !live {
                            break 'work;
                        }
                    }
                    if i % FRAMES_PER_CLOCK == FRAMES_PER_CLOCK - 1 {
                        now = Instant::now();
                    }
                    // A by-reference segment (spec §16.2 rule 6) goes to the transport with its
                    // references, unless its frames are not for the engine: then they become
                    // bytes first (a guest's netdev must never see a payload area unfilled).
                    let mut refs = rx.refs.take();
                    if let Some(r) = refs.take() {
                        let mac = d.config.mac;
                        let for_engine = bufs
                            .get(rx.slot)
                            .and_then(|b| b.get(rx.off..rx.off + rx.len))
                            .and_then(|b| super::frames_of(b, rx.segment).next())
                            .is_some_and(|f| {
                                classify_with(f, &[mac], false, |g| {
                                    d.gids.find_v2(g).is_some() || d.is_mcast_group(g)
                                }) == Destination::Engine
                            });
                        if rx.segment && for_engine {
                            refs = Some(r);
                        } else {
                            let ok = bufs
                                .get_mut(rx.slot)
                                .and_then(|b| b.get_mut(rx.off..rx.off + rx.len))
                                .is_some_and(|b| crate::wire::segment::materialize(b, &*r));
                            r.recycle();
                            if !ok {
                                bump(&port.drop_stale_ref);
                                continue;
                            }
                        }
                    }
                    // Frames for another worker's QP go to it whole (`workers.rs`), by-reference
                    // segments with their references: a QP's frames are all received by its
                    // own worker (its responder state is taken there, its ACKs queued there); a
                    // multicast datagram goes to the worker of each attached QP.
                    if workers > 1 {
                        let mac = d.config.mac;
                        let ours = |g: &_| d.gids.find_v2(g).is_some() || d.is_mcast_group(g);
                        let members = |g: &_| d.with_mcast_members(g, |m| owners(m, workers));
                        let to = bufs
                            .get(rx.slot)
                            .and_then(|b| b.get(rx.off..rx.off + rx.len))
                            .map_or(1 << w, |buf| {
                                received_by(buf, rx.segment, mac, ours, members, w, workers)
                            });
                        let here = to & (1 << w) != 0;
                        if let Some(slot) = bufs.get_mut(rx.slot).filter(|_| to != 1 << w) {
                            kick_mask |= hand_out(
                                inboxes,
                                to,
                                w,
                                slot,
                                rx.off..rx.off + rx.len,
                                rx.segment,
                                swaps_buffers,
                                &mut refs,
                                port,
                            );
                        }
                        if !here {
                            if let Some(r) = refs.take() {
                                r.recycle();
                            }
                            continue;
                        }
                    }
                    let Some(buf) = bufs
                        .get(rx.slot)
                        .and_then(|b| b.get(rx.off..rx.off + rx.len))
                    else {
                        if let Some(r) = refs {
                            r.recycle();
                        }
                        continue;
                    };
                    // A fabric segment is its frames, one after the other (spec §16.2 rule 6);
                    // only the port's mark makes a buffer one.
                    for (k, f) in super::frames_of(buf, rx.segment).enumerate() {
                        let mac = d.config.mac;
                        let (dest, located) = classify_located(f, &[mac], false, |g| {
                            d.gids.find_v2(g).is_some() || d.is_mcast_group(g)
                        });
                        match dest {
                            Destination::Engine => {
                                bump(&port.rx_to_engine);
                                // Only a frame whose payload is held by reference gets one;
                                // the others of the segment carry their bytes.
                                let src = held(&refs, k)
                                    .map(|r| super::packet::PayloadSrc { refs: r, frame: k });
                                match located {
                                    Some(l) => super::on_located_ref_at(&d, l, now, src),
                                    None => super::on_frame_ref_at(&d, f, now, src),
                                }
                            }
                            // Never the unfilled payload area of a by-reference frame.
                            Destination::Guest if held(&refs, k).is_some() => {
                                bump(&port.drop_filtered)
                            }
                            Destination::Guest => {
                                bump(&port.rx_to_guest);
                                d.out.eth_rx(f)
                            }
                            Destination::Drop => bump(&port.drop_filtered),
                        }
                    }
                    if let Some(r) = refs {
                        r.recycle();
                    }
                }
            }
            if !live {
                // Spec §17.1: a suspended device touches neither guest memory nor the wire.
                // Received frames are lost (RC peers retransmit); doorbells are handled by the
                // sweep when the device resumes (also those of this batch not run yet).
                if !dbs.records.is_empty() || dbs.sweep {
                    d.resume_sweep.store(true, Ordering::SeqCst);
                }
                looped.clear();
                handed.clear();
                frames.clear();
                d.outbox(w).clear();
                None
            } else {
                let t = super::on_worker_tick(&d, now, w);
                let o = d.odp_tick(now);
                if workers > 1 && d.mrs.read().resumed_pending() {
                    // ODP resumptions of other workers' QPs: each takes its own.
                    kick_mask |= !(1u32 << w) & ((1u32 << workers) - 1);
                }
                let next = match (t, o) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                // Other workers' QPs this batch moved to ERR: their workers flush them.
                kick_mask |= d.take_flush_kicks();
                std::mem::swap(&mut out, &mut *d.outbox(w));
                let mut marks = out.segments.iter().copied().peekable();
                let mut held = out.refs.drain(..).peekable();
                for (i, mut f) in out.frames.drain(..).enumerate() {
                    let segment = marks.next_if_eq(&i).is_some();
                    let refs = held.next_if(|(j, _)| *j == i).map(|(_, r)| r);
                    let ours = |g: &_| d.gids.find_v2(g).is_some() || d.is_mcast_group(g);
                    // A segment's frames share their addresses: the first one decides.
                    let probe = super::frames_of(&f, segment).next().unwrap_or(&f);
                    let dest = tx_destination(probe, ours);
                    let refs = match (dest, refs) {
                        // Looped back (QP to QP on this device): as bytes (spec §16.2 rule 6).
                        (TxDestination::Engine | TxDestination::EngineAndUplink, Some(r)) => {
                            let ok = crate::wire::segment::materialize(&mut f, &*r);
                            r.recycle();
                            if !ok {
                                bump(&port.drop_stale_ref);
                                super::packet::recycle_frame(f);
                                continue;
                            }
                            None
                        }
                        (_, r) => r,
                    };
                    // A looped frame is received by its destination QP's worker.
                    // A looped multicast datagram goes to each member's worker.
                    let members = |g: &_| d.with_mcast_members(g, |m| owners(m, workers));
                    let mut loop_back = |f: Vec<u8>| {
                        let to = looped_to(&f, segment, members, w, workers);
                        let here = to & (1 << w) != 0;
                        let count = super::frames_of(&f, segment).count();
                        let mut f = Some(f);
                        let mut others = each_bit(to & !(1 << w)).peekable();
                        while let Some(o) = others.next() {
                            // The last taker gets the frame itself, the others a copy.
                            let last = !here && others.peek().is_none();
                            let buf = if last { f.take() } else { f.clone() };
                            let Some(buf) = buf else { break };
                            if hand(inboxes, o, Handed::plain(buf, segment), count, port) {
                                kick_mask |= 1 << o;
                            }
                        }
                        if let Some(f) = f.filter(|_| here) {
                            looped.push(Handed::plain(f, segment));
                        }
                    };
                    match dest {
                        TxDestination::Engine => {
                            bump(&port.loopback_frames);
                            loop_back(f);
                        }
                        TxDestination::EngineAndUplink => {
                            bump(&port.loopback_frames);
                            loop_back(f.clone());
                            match segment {
                                true => to_uplink.push_segment(f),
                                false => to_uplink.push(f),
                            }
                        }
                        TxDestination::Uplink => match (segment, refs) {
                            (true, Some(r)) => to_uplink.push_segment_refs(f, r),
                            (true, None) => to_uplink.push_segment(f),
                            (false, _) => to_uplink.push(f),
                        },
                    }
                }
                drop(held);
                drop(marks);
                out.clear();
                std::mem::swap(&mut out, &mut to_uplink);
                next
            }
        };
        sender.kick_workers(kick_mask & !(1 << w));
        // Batched (sendmmsg on UDP; on the fabric the buffers move to the destination's
        // queue). A full socket buffer is packet loss; RC retransmits (IBTA 9.7.6).
        out.send(&*uplink);
        // Its doorbells ran, their frames left (suspended: remembered for the resume sweep).
        inbox.done.store(dbs.received, Ordering::Release);
        out.segments.clear();
        for f in out.frames.drain(..) {
            super::packet::recycle_frame(f);
        }
        alarm.set(next, Instant::now());
    }
}

/// A hand-off point of the engine's batch (`LongGuard::hand_off`): a control command that
/// waits for the device gets it here. Returns the guard and whether the batch may go on: not
/// when the command suspended the device (spec §17.1: from then on the batch touches neither
/// guest memory nor the wire). After a hand-off the clock is read again.
fn hand_off<'a>(
    d: LongGuard<'a, Device>,
    unit: &crate::tables::units::Batch<'_>,
    now: &mut Instant,
) -> (LongGuard<'a, Device>, bool) {
    // Between units while the share may be given up: a command fencing local copies beside
    // the workers (`tables/units.rs`) must not wait for a worker that waits for a writer
    // queued behind it.
    unit.pause();
    let (d, released) = d.hand_off();
    unit.resume();
    if released {
        *now = Instant::now();
    }
    let live = !d.suspended;
    (d, live)
}

/// A segment's by-reference payloads (spec §16.2 rule 6).
type SegRefs = Box<dyn crate::wire::segment::PayloadRefs>;

/// The references of a segment if its frame `k` is held by them.
fn held(refs: &Option<SegRefs>, k: usize) -> Option<&dyn crate::wire::segment::PayloadRefs> {
    refs.as_deref().filter(|r| r.place(k).is_some())
}
