//! A test bed: two devices with one connected RC QP pair, a source buffer on A and a target
//! buffer on B, linked either in-process (frames moved by the bench thread) or by two engine
//! threads over the UDP uplink on loopback. Built with the test fixtures of backend/tests/common
//! (objects created through `Device::handle_command`, rings in guest memory).

use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_backend::device::{Device, RecordingOutput};
use vrdma_backend::fabric::{Fabric, PortId};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::memory::mr::MrKind;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::transport::engine::{
    Engine, EngineGroup, EngineOptions, EngineSender, GroupSlot,
};
use vrdma_backend::transport::{self};
use vrdma_backend::uplink::{Uplink, UplinkError};
use vrdma_spec::*;

use crate::common::*;
use crate::util::poll_cq_mem;

/// Chunk size of ODP (the device default, `odp_chunk_shift` 21).
pub const CHUNK: u64 = 2 << 20;
pub const SQ_DEPTH: u32 = 1024;
pub const RQ_DEPTH: u32 = 1024;
const CQ_DEPTH: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    InProc,
    Udp,
    /// Two engine threads on one daemon's fabric (`fabric::DevicePort`s).
    Fabric,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::InProc => "in-process",
            Mode::Udp => "udp+engines",
            Mode::Fabric => "fabric+engines",
        }
    }
}

/// How a buffer is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    /// REG_MR with a 4 KiB page list (iova == GPA).
    Pinned,
    /// REG_IMPLICIT_MR; the buffer is used at a process VA the pager maps onto guest pages.
    Implicit,
}

/// The driver stand-in's view of an ODP mapping: VAs [va, va + span) map onto guest pages
/// [gpa, gpa + backing) repeated (so many fresh chunks can share a little guest memory).
#[derive(Debug, Clone, Copy)]
pub struct Pager {
    pub key: u32,
    pub va: u64,
    pub span: u64,
    pub gpa: u64,
    pub backing: u64,
}

/// One side: guest memory handle, its QP/CQ rings and its buffer.
pub struct Side {
    pub mem: GuestMem,
    pub qp: QpH,
    pub cq: RingH,
    pub rq: RingH,
    /// Buffer address as the WQEs use it (GPA for pinned, VA for implicit).
    pub addr: u64,
    /// Guest-physical base of the buffer.
    pub gpa: u64,
    pub key: u32,
    pub pager: Option<Pager>,
    /// Time spent answering page requests (ODP_PAGE_RESP commands), one entry per answer.
    pub pager_times: Vec<f64>,
    /// When the last ODP_PAGE_RESP was accepted (the chunk became resident then).
    pub last_resp_at: Option<Instant>,
}

pub enum Link {
    InProc {
        a: Box<Device>,
        b: Box<Device>,
        out_a: Arc<RecordingOutput>,
        out_b: Arc<RecordingOutput>,
    },
    /// Two engine threads (UDP uplink pair or fabric ports).
    Engines {
        ea: Engine,
        eb: Engine,
        da: Arc<HandoffLock<Device>>,
        #[allow(dead_code)]
        db: Arc<HandoffLock<Device>>,
    },
}

/// Frames sent A -> B and B -> A (retransmissions show up as frames beyond the minimum).
#[derive(Debug, Default)]
pub struct Frames {
    pub ab: AtomicU64,
    pub ba: AtomicU64,
}

impl Frames {
    pub fn get(&self) -> (u64, u64) {
        (
            self.ab.load(Ordering::Relaxed),
            self.ba.load(Ordering::Relaxed),
        )
    }
}

/// An uplink that counts the frames it sends.
struct Counting<U> {
    inner: U,
    frames: Arc<Frames>,
    a_to_b: bool,
}

impl<U: Uplink> Uplink for Counting<U> {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        let c = if self.a_to_b {
            &self.frames.ab
        } else {
            &self.frames.ba
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.inner.send(frame)
    }
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        self.inner.recv(buf)
    }
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        let c = if self.a_to_b {
            &self.frames.ab
        } else {
            &self.frames.ba
        };
        c.fetch_add(frames.len() as u64, Ordering::Relaxed);
        self.inner.send_batch(frames)
    }
    fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
        let c = if self.a_to_b {
            &self.frames.ab
        } else {
            &self.frames.ba
        };
        c.fetch_add(frames.len() as u64, Ordering::Relaxed);
        self.inner.send_frames(frames)
    }
    /// A fabric segment stands for the frames in it (spec §16.2 rule 6).
    fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, UplinkError> {
        let c = if self.a_to_b {
            &self.frames.ab
        } else {
            &self.frames.ba
        };
        let n = vrdma_backend::wire::segment::frame_count(seg, true);
        c.fetch_add(n as u64, Ordering::Relaxed);
        self.inner.send_segment(seg)
    }
    /// The same for a segment whose payloads are held by reference (one copy, spec §16.2 rule
    /// 6): forwarded as it is, so the bench measures what the daemon does.
    fn send_segment_refs(
        &self,
        seg: &mut Vec<u8>,
        refs: Box<dyn vrdma_backend::wire::segment::PayloadRefs>,
    ) -> Result<usize, UplinkError> {
        let c = if self.a_to_b {
            &self.frames.ab
        } else {
            &self.frames.ba
        };
        let n = vrdma_backend::wire::segment::frame_count(seg, true);
        c.fetch_add(n as u64, Ordering::Relaxed);
        self.inner.send_segment_refs(seg, refs)
    }
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<vrdma_backend::uplink::RxFrame>,
    ) -> Result<usize, UplinkError> {
        self.inner.recv_batch(bufs, frames)
    }
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
    fn icrc_offload(&self) -> vrdma_backend::uplink::IcrcOffload {
        self.inner.icrc_offload()
    }
    fn rx_pending(&self) -> Option<bool> {
        self.inner.rx_pending()
    }
}

/// The engines' options: `VRDMA_BENCH_POLL_US` overrides `--poll-us`'s default (to measure the
/// busy-poll with and without), `VRDMA_BENCH_THREADS` `--engine-threads`'s.
fn engine_options() -> EngineOptions {
    let mut o = EngineOptions::default();
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(us) = var("VRDMA_BENCH_POLL_US") {
        o.poll = Duration::from_micros(us);
    }
    if let Some(n) = var("VRDMA_BENCH_THREADS") {
        o.threads = n as usize;
    }
    o
}

/// What engine threads `devices` devices of a fabric bench run on, said for the output.
pub fn engine_threads_of(devices: usize) -> String {
    engine_threads_in(devices, shared_group().as_ref())
}

/// [`engine_threads_of`] for devices in `group` if given.
pub fn engine_threads_in(devices: usize, group: Option<&EngineGroup>) -> String {
    let per_device = engine_options().threads.max(1);
    if let Some(g) = group {
        format!(
            "{per_device} engine thread(s) per slot shared by the {devices} devices, {} slot(s), \
             a pair per slot as far as they go",
            g.slots()
        )
    } else {
        format!("{} engine threads", devices * per_device)
    }
}

/// The process's engine group with `VRDMA_BENCH_SHARED=1` (see `Unlinked::on_fabric`): as
/// many slots as `VRDMA_BENCH_SLOTS` says or, as the daemon's default, the CPUs this process
/// may run on.
fn shared_group() -> Option<EngineGroup> {
    static GROUP: std::sync::OnceLock<Option<EngineGroup>> = std::sync::OnceLock::new();
    GROUP
        .get_or_init(|| {
            std::env::var_os("VRDMA_BENCH_SHARED").is_some().then(|| {
                let slots = std::env::var("VRDMA_BENCH_SLOTS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(EngineGroup::default_slots);
                EngineGroup::new(engine_options().poll, slots)
            })
        })
        .clone()
}

/// A new engine group as a fabric daemon makes it by default (a slot per CPU this process
/// may run on), whatever `VRDMA_BENCH_SHARED` says.
pub fn placed_group() -> EngineGroup {
    EngineGroup::new(engine_options().poll, EngineGroup::default_slots())
}

/// A placement key of its own for each bed (pair) of the process: the pair plays a tenant
/// network, as the daemon places devices (`EngineGroup::place`).
fn next_pair_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub struct Bed {
    pub frames: Arc<Frames>,
    /// What each device hands its guest (A, B): the eth frames of a flood pile up here.
    pub outs: [Arc<RecordingOutput>; 2],
    pub a: Side,
    pub b: Side,
    pub link: Link,
    pub buf_len: u64,
    pub path_mtu: u32,
    /// Ethernet MTU of both devices.
    pub eth_mtu: u16,
    /// A CREATE_QP request for a small RC QP on A's PD and CQ, with rings of its own
    /// (`control-churn` creates and destroys it over and over; never used for traffic).
    pub spare_qp_a: Vec<u8>,
}

/// IB MTU enum for a byte size.
pub fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

fn reg(n: &mut Node, pd: u32, gpa: u64, len: u64, how: Reg, va: u64) -> (u64, u32) {
    match how {
        Reg::Pinned => (gpa, n.reg_mr(pd, gpa, len, ACC_ALL)),
        Reg::Implicit => (va, crate::common::odp::reg_odp(n, pd, 0, 0, true)),
    }
}

/// Process VAs used for implicit MRs (chunk aligned, far from guest RAM).
pub const VA_A: u64 = 0x7f00_0000_0000;
pub const VA_B: u64 = 0x5500_0000_0000;

impl Bed {
    /// `buf_len` bytes of buffer on each side; `va_span` of VA space mapped for implicit MRs
    /// (≥ buf_len; beyond buf_len the VA chunks alias the buffer's guest pages).
    pub fn new(mode: Mode, path_mtu: u32, buf_len: u64, ra: Reg, rb: Reg, va_span: u64) -> Bed {
        Self::with_idle_qps(mode, path_mtu, buf_len, ra, rb, va_span, 0)
    }

    /// Like [`Bed::new`], with `idle` more RC QPs (in RESET, tiny rings) on each device.
    #[allow(clippy::too_many_arguments)]
    pub fn with_idle_qps(
        mode: Mode,
        path_mtu: u32,
        buf_len: u64,
        ra: Reg,
        rb: Reg,
        va_span: u64,
        idle: u32,
    ) -> Bed {
        let u = Unlinked::new((1, 2), path_mtu, buf_len, ra, rb, va_span, idle);
        match mode {
            Mode::Fabric => {
                let mut fb = vrdma_backend::fabric::FabricBuilder::new();
                let (pa, pb) = (
                    fb.add_device(u.a.mac).expect("port a"),
                    fb.add_device(u.b.mac).expect("port b"),
                );
                let fabric = fb.build();
                u.on_fabric(&fabric, pa, pb, shared_group().as_ref())
            }
            _ => u.link(mode),
        }
    }

    /// `pairs` RC pairs of devices (each device with its engine thread) on one fabric, with
    /// `raw` more device ports (these MACs) that the caller drives itself
    /// (`Fabric::forward`). Each pair as [`Bed::new`] in `Mode::Fabric`; its devices have
    /// the node ids 2i+1 and 2i+2.
    pub fn fabric_pairs(
        pairs: usize,
        path_mtu: u32,
        buf_len: u64,
        raw: &[[u8; 6]],
    ) -> (Vec<Bed>, Arc<Fabric>, Vec<PortId>) {
        Self::fabric_pairs_in(pairs, path_mtu, buf_len, raw, shared_group().as_ref())
    }

    /// [`Bed::fabric_pairs`] with the engines in `group` if given (each pair placed as a
    /// network of its own), else in threads of their own.
    pub fn fabric_pairs_in(
        pairs: usize,
        path_mtu: u32,
        buf_len: u64,
        raw: &[[u8; 6]],
        group: Option<&EngineGroup>,
    ) -> (Vec<Bed>, Arc<Fabric>, Vec<PortId>) {
        let unlinked: Vec<Unlinked> = (0..pairs)
            .map(|i| {
                let id = 2 * i as u8;
                Unlinked::new(
                    (id + 1, id + 2),
                    path_mtu,
                    buf_len,
                    Reg::Pinned,
                    Reg::Pinned,
                    0,
                    0,
                )
            })
            .collect();
        let mut fb = vrdma_backend::fabric::FabricBuilder::new();
        let ports: Vec<(PortId, PortId)> = unlinked
            .iter()
            .map(|u| {
                (
                    fb.add_device(u.a.mac).expect("port a"),
                    fb.add_device(u.b.mac).expect("port b"),
                )
            })
            .collect();
        let raw_ports = raw
            .iter()
            .map(|m| fb.add_device(*m).expect("raw port"))
            .collect();
        let fabric = fb.build();
        let beds = unlinked
            .into_iter()
            .zip(ports)
            .map(|(u, (pa, pb))| u.on_fabric(&fabric, pa, pb, group))
            .collect();
        (beds, fabric, raw_ports)
    }
}

/// The two sides of a bed, their QPs connected, not yet linked.
struct Unlinked {
    a: Node,
    b: Node,
    sa: Side,
    sb: Side,
    buf_len: u64,
    path_mtu: u32,
    eth_mtu: u16,
    spare_qp_a: Vec<u8>,
}

impl Unlinked {
    /// Nodes `ids` with `idle` more RC QPs each, one connected RC pair, buffers registered.
    fn new(
        ids: (u8, u8),
        path_mtu: u32,
        buf_len: u64,
        ra: Reg,
        rb: Reg,
        va_span: u64,
        idle: u32,
    ) -> Unlinked {
        let mem_mib = (buf_len >> 20) + 8 + (idle as u64 * 4 * 4096).div_ceil(1 << 20);
        // The smallest standard Ethernet MTU that carries the path MTU (wire::mtu: 1500 holds
        // 1024-byte RoCE payloads, 4096 needs jumbo frames).
        let eth_mtu: u16 = if path_mtu <= 1024 { 1500 } else { 9000 };
        let mut a = Node::new(ids.0, mem_mib, eth_mtu);
        let mut b = Node::new(ids.1, mem_mib, eth_mtu);
        let pda = a.create_pd();
        let pdb = b.create_pd();
        let (ca, cqa) = a.create_cq(CQ_DEPTH);
        let (cb, cqb) = b.create_cq(CQ_DEPTH);
        let small = |pd, cq| QpSpec {
            sq_depth: 16,
            rq_depth: 16,
            sq_shift: 7,
            rq_shift: 5,
            max_sge: 1,
            max_inline: 0,
            ..QpSpec::rc(pd, cq)
        };
        for (n, pd, cq) in [(&mut a, pda, ca), (&mut b, pdb, cb)] {
            for _ in 0..idle {
                n.create_qp(QpSpec {
                    sq_depth: 4,
                    rq_depth: 4,
                    ..small(pd, cq)
                });
            }
        }
        let spare_qp_a = {
            let (sq, rq) = (a.ring(16, 7), a.ring(16, 5));
            small(pda, ca).request(&sq, Some(&rq))
        };
        let spec = |pd, cq| QpSpec {
            sq_depth: SQ_DEPTH,
            rq_depth: RQ_DEPTH,
            ..QpSpec::rc(pd, cq)
        };
        let qa = a.create_qp(spec(pda, ca));
        let qb = b.create_qp(spec(pdb, cb));
        // timeout 14 (~67 ms), retry 7, rnr_retry 7 (infinite: ODP responders RNR-NAK).
        connect(&mut a, &qa, &mut b, &qb, RtsAttrs::mtu(mtu_enum(path_mtu)));
        // Chunk-aligned buffers so an implicit mapping starts on a chunk too.
        let ga = a.alloc(buf_len + CHUNK).next_multiple_of(CHUNK);
        let gb = b.alloc(buf_len + CHUNK).next_multiple_of(CHUNK);
        a.write(ga, &pattern(1, buf_len as usize));
        let (addr_a, ka) = reg(&mut a, pda, ga, buf_len, ra, VA_A);
        let (addr_b, kb) = reg(&mut b, pdb, gb, buf_len, rb, VA_B);
        let pager = |how, key, va, gpa| {
            (how == Reg::Implicit).then_some(Pager {
                key,
                va,
                span: va_span.max(buf_len),
                gpa,
                backing: buf_len,
            })
        };
        let side = |n: &Node, qp: &QpH, cq: RingH, addr, gpa, key, pg| Side {
            mem: n.mem.clone(),
            qp: qp.clone(),
            cq,
            rq: qp.rq.clone().expect("rq"),
            addr,
            gpa,
            key,
            pager: pg,
            pager_times: Vec::new(),
            last_resp_at: None,
        };
        let sa = side(&a, &qa, cqa, addr_a, ga, ka, pager(ra, ka, VA_A, ga));
        let sb = side(&b, &qb, cqb, addr_b, gb, kb, pager(rb, kb, VA_B, gb));
        Unlinked {
            a,
            b,
            sa,
            sb,
            buf_len,
            path_mtu,
            eth_mtu,
            spare_qp_a,
        }
    }

    /// Link the two sides in `mode` (not `Mode::Fabric`: [`Unlinked::on_fabric`]).
    fn link(self, mode: Mode) -> Bed {
        let Unlinked {
            mut a,
            mut b,
            sa,
            sb,
            buf_len,
            path_mtu,
            eth_mtu,
            spare_qp_a,
        } = self;
        let frames = Arc::new(Frames::default());
        let outs = [a.out.clone(), b.out.clone()];
        let link = match mode {
            Mode::InProc => {
                let (out_a, out_b) = (a.out.clone(), b.out.clone());
                Link::InProc {
                    a: Box::new(take_dev(&mut a)),
                    b: Box::new(take_dev(&mut b)),
                    out_a,
                    out_b,
                }
            }
            Mode::Fabric => unreachable!("Unlinked::on_fabric"),
            Mode::Udp => {
                let (ua, ub) = udp_pair();
                let da = detach(&mut a);
                let db = detach(&mut b);
                let ua = Counting {
                    inner: ua,
                    frames: frames.clone(),
                    a_to_b: true,
                };
                let ub = Counting {
                    inner: ub,
                    frames: frames.clone(),
                    a_to_b: false,
                };
                let ea = Engine::start_with(da.clone(), Arc::new(ua), engine_options())
                    .expect("engine a");
                let eb = Engine::start_with(db.clone(), Arc::new(ub), engine_options())
                    .expect("engine b");
                Link::Engines { ea, eb, da, db }
            }
        };
        Bed {
            frames,
            outs,
            a: sa,
            b: sb,
            link,
            buf_len,
            path_mtu,
            eth_mtu,
            spare_qp_a,
        }
    }

    /// Link the two sides through their ports `pa`, `pb` on `fabric`, an engine thread each.
    fn on_fabric(
        self,
        fabric: &Arc<Fabric>,
        pa: PortId,
        pb: PortId,
        group: Option<&EngineGroup>,
    ) -> Bed {
        let Unlinked {
            mut a,
            mut b,
            sa,
            sb,
            buf_len,
            path_mtu,
            eth_mtu,
            spare_qp_a,
        } = self;
        let frames = Arc::new(Frames::default());
        let outs = [a.out.clone(), b.out.clone()];
        let da = detach(&mut a);
        let db = detach(&mut b);
        // `VRDMA_BENCH_SHARED=1`: every device's workers in one engine group (a fabric
        // daemon's default), for the whole process as in a daemon: the pair on one slot's
        // threads, frames between its devices wake nobody.
        let placed = group.map(|g| {
            let key = next_pair_key();
            (g, g.place(key), g.place(key))
        });
        // RC WRITE payloads by reference (one copy, spec §16.2 rule 6) as a daemon sends them:
        // in a group to the devices of the slot unless `VRDMA_BENCH_COPY=1` (two copies);
        // `VRDMA_BENCH_REFS=1`: to every device (`--payload-refs`), with or without a group.
        let refs = std::env::var_os("VRDMA_BENCH_REFS").is_some();
        let copy = std::env::var_os("VRDMA_BENCH_COPY").is_some();
        let port = |p, slot: Option<GroupSlot>| {
            let d = fabric.device_port(p).expect("port").with_segments();
            match slot {
                _ if refs => d.with_payload_refs(),
                Some(s) if !copy => d.with_payload_refs_on_slot(s.index()),
                _ => d,
            }
        };
        let ua = Counting {
            inner: port(pa, placed.map(|(_, s, _)| s)),
            frames: frames.clone(),
            a_to_b: true,
        };
        let ub = Counting {
            inner: port(pb, placed.map(|(_, _, s)| s)),
            frames: frames.clone(),
            a_to_b: false,
        };
        let (ea, eb) = if let Some((g, slot_a, slot_b)) = placed {
            (
                Engine::start_in(g, slot_a, da.clone(), Arc::new(ua), engine_options())
                    .expect("engine a"),
                Engine::start_in(g, slot_b, db.clone(), Arc::new(ub), engine_options())
                    .expect("engine b"),
            )
        } else {
            (
                Engine::start_with(da.clone(), Arc::new(ua), engine_options()).expect("engine a"),
                Engine::start_with(db.clone(), Arc::new(ub), engine_options()).expect("engine b"),
            )
        };
        let link = Link::Engines { ea, eb, da, db };
        Bed {
            frames,
            outs,
            a: sa,
            b: sb,
            link,
            buf_len,
            path_mtu,
            eth_mtu,
            spare_qp_a,
        }
    }
}

impl Bed {
    /// Ring A's SQ doorbell.
    pub fn doorbell(&mut self) {
        let db = VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: self.a.qp.qpn,
        };
        match &mut self.link {
            Link::InProc { a, .. } => transport::on_doorbell(a, db),
            Link::Engines { ea, .. } => ea.sender().doorbell(db),
        }
    }

    /// Post a send WQE on A (no doorbell).
    pub fn post(&mut self, w: &Wqe) {
        post_send_mem(&self.a.mem, &mut self.a.qp, w);
    }

    /// Post a receive on B.
    pub fn post_recv_b(&mut self, wr_id: u64, addr: u64, len: u32) {
        let k = self.b.key;
        post_recv_mem(&self.b.mem, &mut self.b.rq, wr_id, &[(addr, len, k)]);
    }

    /// Make progress: in-process, answer page requests, move frames until both sides are quiet
    /// and fire due timers; over UDP, give the engines time (`spin`: yield instead of sleeping).
    pub fn progress(&mut self, spin: bool) {
        match &mut self.link {
            Link::InProc { a, b, out_a, out_b } => {
                for _ in 0..64 {
                    serve(a, out_a, &mut self.a);
                    serve(b, out_b, &mut self.b);
                    let fa = std::mem::take(&mut a.outbox(0).frames);
                    let fb = std::mem::take(&mut b.outbox(0).frames);
                    if fa.is_empty() && fb.is_empty() {
                        break;
                    }
                    self.frames.ab.fetch_add(fa.len() as u64, Ordering::Relaxed);
                    self.frames.ba.fetch_add(fb.len() as u64, Ordering::Relaxed);
                    // The driver stand-in answers a page request as soon as it is sent.
                    for f in &fa {
                        transport::on_frame(b, f);
                        if self.b.pager.is_some() {
                            serve(b, out_b, &mut self.b);
                        }
                    }
                    for f in &fb {
                        transport::on_frame(a, f);
                        if self.a.pager.is_some() {
                            serve(a, out_a, &mut self.a);
                        }
                    }
                }
                let now = Instant::now();
                transport::on_tick(a, now);
                transport::on_tick(b, now);
            }
            Link::Engines { .. } => {
                if spin {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }

    pub fn poll_a(&mut self, out: &mut Vec<Cqe>) -> usize {
        poll_cq_mem(&self.a.mem, &mut self.a.cq, out)
    }

    /// Drive the bed (`progress(spin)`) until A's CQ yields a completion, which must be a
    /// success; panics if none came within 10 s of `t0` (`what` names the stuck WQE).
    pub fn wait_a_success(&mut self, cqes: &mut Vec<Cqe>, spin: bool, t0: Instant, what: &str) {
        loop {
            self.progress(spin);
            cqes.clear();
            if self.poll_a(cqes) > 0 {
                assert_eq!(cqes[0].status, VRDMA_WC_SUCCESS, "{:?}", cqes[0]);
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{what} stuck");
        }
    }

    pub fn poll_b(&mut self, out: &mut Vec<Cqe>) -> usize {
        poll_cq_mem(&self.b.mem, &mut self.b.cq, out)
    }

    /// Is the ODP chunk holding `va` of side B's (`on_b`) or A's implicit MR resident?
    /// (In-process only.)
    pub fn resident(&self, on_b: bool, va: u64) -> bool {
        let Link::InProc { a, b, .. } = &self.link else {
            return false;
        };
        let (d, key) = if on_b {
            (b, self.b.key)
        } else {
            (a, self.a.key)
        };
        match d.mrs.write().get(key).map(|m| &m.kind) {
            Ok(MrKind::ImplicitOdp(o)) | Ok(MrKind::Odp(o)) => o.is_resident(va, 21),
            _ => false,
        }
    }

    /// One `transport::on_tick` of device A (in-process only; what the engine runs per batch).
    pub fn tick_a(&mut self) {
        if let Link::InProc { a, .. } = &mut self.link {
            transport::on_tick(a, Instant::now());
        }
    }

    /// CPU seconds spent by the engine so far: the engine threads over UDP; in-process the bench
    /// thread, which runs the transport itself (plus the driver's share: posting WQEs, polling).
    pub fn engine_cpu(&self) -> f64 {
        match self.link {
            Link::InProc { .. } => crate::util::thread_cpu_secs(),
            Link::Engines { .. } => {
                crate::common::engine::threads_cpu_secs_prefixed("vrdma-engine")
            }
        }
    }

    /// Device A's lock, the one its control commands take (engine modes only).
    pub fn device_a(&self) -> Option<Arc<HandoffLock<Device>>> {
        match &self.link {
            Link::Engines { da, .. } => Some(Arc::clone(da)),
            Link::InProc { .. } => None,
        }
    }

    /// Device A's engine handle, through which its control queue fences the doorbells before
    /// a command (engine modes only).
    pub fn sender_a(&self) -> Option<EngineSender> {
        match &self.link {
            Link::Engines { ea, .. } => Some(ea.sender()),
            Link::InProc { .. } => None,
        }
    }

    /// Stop the engines (UDP) cleanly.
    pub fn finish(self) {
        if let Link::Engines { ea, eb, .. } = self.link {
            ea.stop();
            eb.stop();
        }
    }
}

fn take_dev(n: &mut Node) -> Device {
    let d = detach(n);
    let m = Arc::try_unwrap(d).unwrap_or_else(|_| panic!("device still shared"));
    m.into_inner()
}

/// The driver stand-in: answer every FAULT page request of `dev` with the GPAs of the chunk's
/// pages (ODP_PAGE_RESP, writable). Reclaim notices need no answer.
fn serve(dev: &mut Device, out: &RecordingOutput, side: &mut Side) {
    let reqs = out.take_page_requests();
    if reqs.is_empty() {
        return;
    }
    let Some(pg) = side.pager else {
        panic!("page request for a side without a pager");
    };
    for r in reqs {
        if r.type_ != VRDMA_PAGEREQ_FAULT {
            continue;
        }
        let t0 = Instant::now();
        assert_eq!(r.mr_key, pg.key, "fault for an unknown MR");
        let start = r.iova & !4095;
        let end = (r.iova + r.length).next_multiple_of(4096);
        assert!(
            start >= pg.va && end <= pg.va + pg.span,
            "fault outside the mapped VA range"
        );
        let npages = (end - start) / 4096;
        let c = VrdmaCmdOdpPageResp {
            req_id: r.req_id,
            mr_key: r.mr_key,
            status: VRDMA_STATUS_OK,
            flags: VRDMA_ODP_RESP_F_WRITABLE,
            iova: start,
            npages: npages as u32,
            reserved: 0,
        };
        let mut b = Vec::with_capacity(48 + npages as usize * 8);
        b.extend_from_slice(c.as_bytes());
        for va in (start..end).step_by(4096) {
            let gpa = pg.gpa + (va - pg.va) % pg.backing;
            b.extend_from_slice(&gpa.to_le_bytes());
        }
        let mut resp = Vec::new();
        let st = dev.handle_command(VRDMA_CMD_ODP_PAGE_RESP, &b, &mut resp);
        assert_eq!(st.status(), Some(VRDMA_STATUS_OK), "ODP_PAGE_RESP refused");
        let now = Instant::now();
        side.last_resp_at = Some(now);
        side.pager_times.push((now - t0).as_secs_f64());
    }
}
