//! One copy between the fabric's guests (spec §16.2 rule 6, ARCHITECTURE.md "Segments"): RC
//! WRITE payloads travel by reference in fabric segments and the receiving engine copies them
//! straight from the sender's guest memory. The results (data, CQEs, the opcode / PSN / length
//! of every request packet) equal those of stage 1 (payload copied into the segment), at path
//! MTU 1024 and 4096, for messages of 1..=64 packets; a capture sees the same bytes (ICRC
//! included); and the DMA fence holds: a reference made before a DEREG_MR or a reset of the
//! sender and delivered after it is never read (the sender's later bytes never arrive), while
//! the segments of its other MRs keep flowing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fabric_rc::{wait_both_cqes, Cqes, FabricRc};
use common::fabric_tap::{Seen, Tap};
use common::*;
use vrdma_backend::device::Device;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::wire::{IcrcCheck, RocePacket};
use vrdma_spec::*;

const LEN: u64 = 4 << 20;

/// Two nodes on one fabric, RC connected; b's engine starts only when asked (so segments can
/// wait in its queue while a's device changes).
struct Rig {
    a: Node,
    b: Node,
    qa: QpH,
    cqa: RingH,
    cqb: RingH,
    rqb: RingH,
    pda: u32,
    ea: Engine,
    eb: Option<Engine>,
    dev_a: Arc<HandoffLock<Device>>,
    dev_b: Option<Arc<HandoffLock<Device>>>,
    port_b: Option<Tap>,
    /// b's port counters (`rx_by_reference`, `drop_stale_ref`).
    stats_b: Arc<vrdma_backend::stats::PortStats>,
    src: u64,
    dst: u64,
    ka: u32,
    kb: u32,
    seen_b: Arc<Mutex<Seen>>,
}

/// Which payloads a's and b's engines send by reference.
#[derive(Clone, Copy)]
enum Refs {
    /// None: copied into the segment (stage 1).
    Off,
    /// To every device (`--payload-refs`, stage 2).
    Everywhere,
    /// To the devices of their engine group slot (a fabric daemon's default): a's, b's slot.
    Slots(usize, usize),
}

/// `mtu`: the path MTU enum (3 = 1024, 5 = 4096); `refs`: payloads by reference (stage 2)
/// or copied (stage 1); `capture`: a pcap of the fabric.
fn rig(mtu: u32, refs: bool, capture: Option<&std::path::Path>) -> Rig {
    let refs = if refs { Refs::Everywhere } else { Refs::Off };
    rig_with(mtu, refs, capture)
}

/// [`rig`] with the scope of the references given.
fn rig_with(mtu: u32, refs: Refs, capture: Option<&std::path::Path>) -> Rig {
    // timeout 17 (537 ms: nothing is retransmitted while b's engine waits to start), retry
    // 7, rnr_retry 7.
    let FabricRc {
        mut a,
        mut b,
        qa,
        cqa,
        cqb,
        rqb,
        pda,
        src,
        dst,
        ka,
        kb,
        fabric,
        pa,
        pb,
    } = FabricRc::new(VRDMA_QPT_RC, mtu, 17, 1024, LEN, capture);
    let port = |p, slot: fn(usize, usize) -> usize| {
        let d = fabric.device_port(p).unwrap().with_segments();
        match refs {
            Refs::Off => d,
            Refs::Everywhere => d.with_payload_refs(),
            Refs::Slots(sa, sb) => d.with_payload_refs_on_slot(slot(sa, sb)),
        }
    };
    let seen_b = Arc::new(Mutex::new(Seen::default()));
    let dev_a = detach(&mut a);
    let ea = Engine::start(dev_a.clone(), Arc::new(port(pa, |a, _| a))).unwrap();
    let port_b = Tap::new(port(pb, |_, b| b), &seen_b);
    let dev_b = detach(&mut b);
    let stats_b = dev_b.lock().port_stats.clone();
    Rig {
        dev_b: Some(dev_b),
        stats_b,
        a,
        b,
        qa,
        cqa,
        cqb,
        rqb,
        pda,
        ea,
        eb: None,
        dev_a,
        port_b: Some(port_b),
        src,
        dst,
        ka,
        kb,
        seen_b,
    }
}

impl Rig {
    fn start_b(&mut self) {
        let (d, p) = (self.dev_b.take().unwrap(), self.port_b.take().unwrap());
        self.eb = Some(Engine::start(d, Arc::new(p)).unwrap());
    }
    fn ring(&self) {
        self.ea.sender().push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: self.qa.qpn,
        });
    }
    fn post(&mut self, w: Wqe) {
        post_send_mem(&self.a.mem, &mut self.qa, &w);
    }
    fn write_with(&mut self, wr_id: u64, key: u32, off: u64, len: u32) {
        let sge = (self.src + off, len, key);
        self.post(rdma(
            wr_id,
            VRDMA_WR_RDMA_WRITE,
            sge,
            self.dst + off,
            self.kb,
        ));
    }
    fn write(&mut self, wr_id: u64, off: u64, len: u32) {
        self.write_with(wr_id, self.ka, off, len);
    }
    fn send(&mut self, wr_id: u64, off: u64, len: u32) {
        self.post(send(wr_id, (self.src + off, len, self.ka)));
    }
    fn read(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = (self.src + off, len, self.ka);
        self.post(rdma(
            wr_id,
            VRDMA_WR_RDMA_READ,
            sge,
            self.dst + off,
            self.kb,
        ));
    }
    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let (dst, kb) = (self.dst, self.kb);
        self.b
            .post_recv(&mut self.rqb, wr_id, &[(dst + off, len, kb)]);
    }
    /// Wait for `n` send CQEs at a and `m` receive CQEs at b.
    fn wait(&mut self, n: usize, m: usize) -> Cqes {
        wait_both_cqes(&mut self.a, &mut self.cqa, &mut self.b, &mut self.cqb, n, m)
    }
    /// Wait until b's queue holds `n` segments from a (b's engine not started).
    fn wait_queued(&self, what: impl Fn(&Device) -> bool) {
        let t0 = Instant::now();
        while !what(&self.dev_a.lock()) {
            assert!(t0.elapsed() < Duration::from_secs(10), "a did not send");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The engine queues, then sends after releasing the lock: give it that moment.
        std::thread::sleep(Duration::from_millis(50));
    }
    fn stop(self) -> (Vec<u8>, Vec<u8>, Seen) {
        let data_b = self.b.read(self.dst, LEN as usize);
        let data_a = self.a.read(self.src, LEN as usize);
        self.ea.stop();
        if let Some(e) = self.eb {
            e.stop();
        }
        let mut seen = std::mem::take(&mut *self.seen_b.lock().unwrap());
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        seen.copied_by_reference = count(&self.stats_b.rx_by_reference);
        seen.stale_references = count(&self.stats_b.drop_stale_ref);
        (data_a, data_b, seen)
    }
}

fn bytes_of(mtu: u32) -> u32 {
    if mtu == 3 {
        1024
    } else {
        4096
    }
}

/// WRITEs of 1..=64 packets, SENDs and a READ at path MTU `mtu`.
fn traffic(mtu: u32, refs: bool) -> (Cqes, Vec<u8>, Vec<u8>, Seen) {
    traffic_with(mtu, if refs { Refs::Everywhere } else { Refs::Off })
}

/// [`traffic`] with the scope of the references given.
fn traffic_with(mtu: u32, refs: Refs) -> (Cqes, Vec<u8>, Vec<u8>, Seen) {
    let bytes = bytes_of(mtu);
    let mut r = rig_with(mtu, refs, None);
    r.start_b();
    for i in 0..3 {
        r.recv(100 + i, (3 << 20) + (i << 16), 64 << 10);
    }
    // Lengths in packets: 1, 2, 3, 16, 17, 63, 64; plus odd byte counts.
    let lens = [
        bytes / 2,
        2 * bytes,
        2 * bytes + 1,
        16 * bytes,
        17 * bytes - 3,
        63 * bytes,
        64 * bytes,
    ];
    let mut off = 0u64;
    for (i, &l) in lens.iter().enumerate() {
        r.write(i as u64, off, l);
        off += u64::from(l).next_multiple_of(4096);
    }
    for i in 0..3 {
        r.send(10 + i, (2 << 20) + (i << 16), 40 << 10);
    }
    r.read(20, (3 << 20) + (512 << 10), 64 << 10);
    r.ring();
    let cqes = r.wait(lens.len() + 4, 3);
    let (a, b, seen) = r.stop();
    (cqes, a, b, seen)
}

#[test]
fn one_copy_gives_what_stage_one_gives() {
    for mtu in [3, 5] {
        let (c1, a1, b1, s1) = traffic(mtu, false);
        let (c2, a2, b2, s2) = traffic(mtu, true);
        assert_eq!(s1.refs_in, 0, "stage 1 copies every payload");
        assert!(s2.refs_in > 0, "payloads went by reference (mtu {mtu})");
        assert_eq!(
            s1.copied_by_reference, 0,
            "stage 1 counts no copy by reference"
        );
        assert!(
            s2.copied_by_reference > 0 && s2.stale_references == 0,
            "b counted its copies by reference and no stale one: {s2:?}"
        );
        assert!(s2.segments_in > 0 && s1.segments_in > 0);
        assert_eq!(c1, c2, "the same completions (mtu {mtu})");
        assert!(c2.0.iter().all(|c| c.1 == VRDMA_WC_SUCCESS), "{c2:?}");
        assert!(a1 == a2, "the same data at a (mtu {mtu})");
        assert!(b1 == b2, "the same data at b (mtu {mtu})");
        assert_eq!(
            s1.first_sends(),
            s2.first_sends(),
            "the same request packets (opcode, PSN, length)"
        );
        // The WRITEs did land: the first one's range and the 64-packet one's at b hold a's
        // pattern.
        let pa = pattern(7, LEN as usize);
        assert!(b2[..bytes_of(mtu) as usize / 2] == pa[..bytes_of(mtu) as usize / 2]);
    }
}

/// In an engine group (a fabric daemon's default) payloads go by reference only between the
/// devices of one slot, and only packets of at least 2 KiB: b on a's slot copies them from
/// a's memory at path MTU 4096; b on another slot gets segments whose payloads the switch
/// gathered on a's side (no reference reaches it); at path MTU 1024 nothing goes by
/// reference. Each gives what stage 1 gives.
#[test]
fn payloads_go_by_reference_only_within_an_engine_slot() {
    for (mtu, slots, by_reference) in [
        (5, (0, 0), true),
        (5, (2, 2), true),
        (5, (0, 1), false),
        (3, (0, 0), false),
    ] {
        let (c1, a1, b1, _) = traffic_with(mtu, Refs::Off);
        let (c, a, b, s) = traffic_with(mtu, Refs::Slots(slots.0, slots.1));
        if by_reference {
            assert!(
                s.refs_in > 0 && s.copied_by_reference > 0 && s.stale_references == 0,
                "mtu {mtu}, slots {slots:?}: b copied from a's memory: {s:?}"
            );
        } else {
            assert_eq!(
                s.refs_in, 0,
                "mtu {mtu}, slots {slots:?}: no reference reached b"
            );
            assert_eq!(s.copied_by_reference, 0, "mtu {mtu}, slots {slots:?}");
        }
        assert!(
            s.segments_in > 0,
            "mtu {mtu}, slots {slots:?}: segments still"
        );
        assert_eq!(c, c1, "mtu {mtu}, slots {slots:?}: the same completions");
        assert!(
            a == a1 && b == b1,
            "mtu {mtu}, slots {slots:?}: the same data"
        );
    }
}

/// WRITE, SEND, WRITE, SEND of two packets each, posted together: one segment holds frames
/// by reference and frames with their bytes.
fn interleaved(refs: bool) -> (Cqes, Vec<u8>, Seen) {
    let mut r = rig(5, refs, None);
    r.start_b();
    for i in 0..2 {
        r.recv(100 + i, (3 << 20) + (i << 16), 8 << 10);
    }
    for i in 0..2u64 {
        r.write(2 * i, i << 16, 8 << 10);
        r.send(2 * i + 1, (2 << 20) + (i << 16), 8 << 10);
    }
    r.ring();
    let cqes = r.wait(4, 2);
    let (_, b, seen) = r.stop();
    (cqes, b, seen)
}

#[test]
fn a_segment_may_mix_frames_by_reference_and_by_value() {
    let (c1, b1, s1) = interleaved(false);
    let (c2, b2, s2) = interleaved(true);
    assert!(s2.refs_in > 0);
    assert!(
        s2.segments_in * 2 <= s2.requests.len() / 2,
        "the messages shared segments: {} for {} packets",
        s2.segments_in,
        s2.requests.len()
    );
    assert_eq!(c1, c2);
    assert!(
        c2.0.iter().chain(&c2.1).all(|c| c.1 == VRDMA_WC_SUCCESS),
        "{c2:?}"
    );
    assert!(b1 == b2);
    assert_eq!(s1.first_sends(), s2.first_sends());
}

/// The frames of a capture (pcap records), in order.
fn pcap_frames(path: &std::path::Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).expect("pcap");
    let _ = std::fs::remove_file(path);
    let mut off = 24;
    let mut out = Vec::new();
    while off + 16 <= b.len() {
        let incl = u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        out.push(b[off + 16..off + 16 + incl].to_vec());
        off += 16 + incl;
    }
    out
}

fn captured(refs: bool) -> Vec<Vec<u8>> {
    let path = std::env::temp_dir().join(format!(
        "vrdma-onecopy-{}-{}.pcap",
        std::process::id(),
        refs
    ));
    let mut r = rig(5, refs, Some(&path));
    r.start_b();
    for i in 0..4 {
        r.write(i, i << 16, 64 << 10);
    }
    r.ring();
    let (sa, _) = r.wait(4, 0);
    assert!(sa.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    let (_, b, _) = r.stop();
    assert!(b[..256 << 10] == pattern(7, LEN as usize)[..256 << 10]);
    // The request packets (first transmission of each PSN), each with a correct ICRC.
    let mut psns = std::collections::HashSet::new();
    pcap_frames(&path)
        .into_iter()
        .filter(|f| {
            let p = RocePacket::parse_with(f, IcrcCheck::Verify).expect("standard, ICRC right");
            !p.info.is_response() && psns.insert(p.bth.psn)
        })
        .collect()
}

#[test]
fn a_capture_sees_the_frames_of_stage_one_byte_for_byte() {
    let plain = captured(false);
    let by_ref = captured(true);
    assert_eq!(plain.len(), 64, "4 x 16 request packets");
    assert_eq!(by_ref.len(), 64);
    // Two runs differ in their QPNs (the flow label, hence the UDP source port, and the BTH
    // destination QP) and the random key variant (the RETH R_Key), so the ICRC too: those
    // are masked after `captured` verified every ICRC. Everything else is byte for byte.
    let mask = |f: &[u8]| {
        let mut f = f.to_vec();
        let n = f.len();
        for i in [
            34,
            35,
            47,
            48,
            49,
            62,
            63,
            64,
            65,
            n - 4,
            n - 3,
            n - 2,
            n - 1,
        ] {
            f[i] = 0;
        }
        f
    };
    for (i, (p, b)) in plain.iter().zip(&by_ref).enumerate() {
        assert!(mask(p) == mask(b), "frame {i} differs");
    }
}

/// Queue two 64 KiB WRITEs, from MR `k2` (offset 1 MiB) and then from MR `k1` (offset 0), in
/// b's fabric queue (b's engine not running), as references.
fn queue_two(r: &mut Rig, k1: u32, k2: u32) {
    r.write_with(2, k2, 1 << 20, 64 << 10);
    r.write_with(1, k1, 0, 64 << 10);
    r.ring();
    let qpn = r.qa.qpn;
    // Both messages sent (psn moved by 32 packets at path MTU 4096).
    r.wait_queued(|d| d.qps.get(qpn).is_some_and(|q| q.stats.tx_packets >= 32));
}

#[test]
fn a_reference_made_before_dereg_mr_is_never_read_after_it() {
    let mut r = rig(5, true, None);
    // A second MR over the second MiB: its segments must keep flowing.
    let (pda, src) = (r.pda, r.src);
    let k2 = {
        let mut d = r.dev_a.lock();
        let np = 256u64;
        let pages: Vec<u64> = (0..np).map(|i| src + (1 << 20) + i * 4096).collect();
        let c = VrdmaCmdRegMr {
            pdn: pda,
            access: ACC_ALL,
            iova: src + (1 << 20),
            length: 1 << 20,
            page_shift: 12,
            npages: np as u32,
        };
        let mut req = c.as_bytes().to_vec();
        for p in pages {
            req.extend_from_slice(&p.to_le_bytes());
        }
        let mut resp = Vec::new();
        let out = d.handle_command(VRDMA_CMD_REG_MR, &req, &mut resp);
        assert!(matches!(
            out,
            vrdma_backend::guest::CmdOutcome::Done(VRDMA_STATUS_OK)
        ));
        VrdmaRespRegMr::read_from(&resp).unwrap().lkey
    };
    let ka = r.ka;
    queue_two(&mut r, ka, k2);
    // DEREG_MR of the first MR, then new bytes where it was: after the fence completed no
    // reference through it may be read, so b must never see them.
    {
        let mut d = r.dev_a.lock();
        let h = VrdmaHandle {
            handle: ka,
            ..Default::default()
        };
        let mut resp = Vec::new();
        let out = d.handle_command(VRDMA_CMD_DEREG_MR, h.as_bytes(), &mut resp);
        assert!(matches!(
            out,
            vrdma_backend::guest::CmdOutcome::Done(VRDMA_STATUS_OK)
        ));
    }
    let fresh = pattern(99, 64 << 10);
    r.a.write(r.src, &fresh);
    r.start_b();
    let (sa, _) = r.wait(2, 0);
    let (_, b, seen) = r.stop();
    assert!(seen.refs_in > 0, "the segments arrived by reference");
    assert!(
        seen.stale_references > 0,
        "b counted the fenced packets: {seen:?}"
    );
    let old_a = pattern(7, LEN as usize);
    let old_b = pattern(8, LEN as usize);
    // The first WRITE: never delivered (its retransmission finds no MR: WC_LOC_PROT_ERR).
    assert!(
        b[..64 << 10] == old_b[..64 << 10],
        "b's range of the deregistered MR is untouched"
    );
    let s1 = sa.iter().find(|c| c.0 == 1).expect("a CQE for WQE 1");
    assert_eq!(s1.1, VRDMA_WC_LOC_PROT_ERR, "{sa:?}");
    // The other WRITE went through its own MR, whose references stayed valid: delivered
    // from the references queued before the DEREG (per-slot fence, not device-wide).
    let s2 = sa.iter().find(|c| c.0 == 2).expect("a CQE for WQE 2");
    assert_eq!(s2.1, VRDMA_WC_SUCCESS, "{sa:?}");
    let r2 = (1 << 20)..(1 << 20) + (64 << 10);
    assert!(b[r2.clone()] == old_a[r2], "the other MR's WRITE landed");
}

#[test]
fn a_reference_made_before_a_reset_is_never_read_after_it() {
    let mut r = rig(5, true, None);
    let ka = r.ka;
    r.write_with(1, ka, 0, 64 << 10);
    r.ring();
    let qpn = r.qa.qpn;
    r.wait_queued(|d| d.qps.get(qpn).is_some_and(|q| q.stats.tx_packets >= 16));
    r.dev_a.lock().reset();
    r.a.write(r.src, &pattern(99, 64 << 10));
    r.start_b();
    // b's engine takes the queued segments (confirmed, not hoped for on a loaded host), then
    // has the moment a broken fence would need to read through one of their references.
    let t0 = Instant::now();
    while r.seen_b.lock().unwrap().refs_in == 0 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (_, b, seen) = r.stop();
    assert!(seen.refs_in > 0, "the segment arrived by reference");
    assert!(
        b[..64 << 10] == pattern(8, LEN as usize)[..64 << 10],
        "nothing read through a reference of the reset device"
    );
}

#[test]
fn each_fencing_operation_moves_its_own_slot_or_the_device() {
    let mut a = Node::new_odp(1, 32);
    let pd = a.create_pd();
    let buf = a.alloc(1 << 20);
    let k_dereg = a.reg_mr(pd, buf, 64 << 10, ACC_ALL);
    let k_other = a.reg_mr(pd, buf, 64 << 10, ACC_ALL);
    let k_odp = a.reg_odp_mr(pd, buf, 1 << 20, ACC_ALL);
    // A fast-reg MR registered by a REG_MR WQE (FRWR), then invalidated (LOCAL_INV).
    let k_frwr = a.dev.mrs.write().alloc_fast_reg(pd, 4, 64).unwrap();
    let list = a.alloc(4096);
    for i in 0..4u64 {
        a.write(list + i * 8, &(buf + i * 4096).to_le_bytes());
    }
    let gen = |a: &Node, k: u32| a.dev.mrs.write().reference_gen(k).map(|(_, v)| v).unwrap();
    let all = |a: &Node| [k_dereg, k_other, k_odp, k_frwr].map(|k| gen(a, k));
    let before = all(&a);
    a.dev
        .mrs
        .write()
        .fast_register(
            pd,
            &vrdma_backend::memory::FastReg {
                key: k_frwr,
                access: ACC_ALL,
                iova: buf,
                length: 16 << 10,
                page_shift: 12,
                page_list_addr: list,
                page_list_len: 4,
            },
        )
        .unwrap();
    let after_reg = all(&a);
    a.dev.mrs.write().local_invalidate(k_frwr, pd).unwrap();
    let after_inv = all(&a);
    assert_eq!(
        a.dev.mrs.write().odp_invalidate(k_odp, buf, 4096),
        VRDMA_STATUS_OK
    );
    let after_odp = all(&a);
    a.dev.mrs.write().dereg(k_dereg).unwrap();
    let after_dereg = all(&a);
    // Only the slot operated on moves; the others' references stay valid.
    assert_eq!(after_reg, [before[0], before[1], before[2], before[3] + 1]);
    assert_eq!(after_inv, [before[0], before[1], before[2], before[3] + 2]);
    assert_eq!(
        after_odp,
        [before[0], before[1], before[2] + 1, before[3] + 2]
    );
    assert_eq!(
        after_dereg,
        [before[0] + 1, before[1], before[2] + 1, before[3] + 2]
    );
    // Reset, SET_MEM_TABLE, suspend: the device generation.
    let fence = a.dev.mrs.write().fence().clone();
    let g0 = fence.device_gen();
    a.dev.reset();
    let g1 = fence.device_gen();
    let atomic = a.mem.atomic().clone();
    a.dev.set_guest_memory(&atomic);
    let g2 = fence.device_gen();
    vrdma_backend::vhost_user::RdmaDevice::suspend(&mut a.dev);
    let g3 = fence.device_gen();
    assert!(g1 > g0, "a reset fences the device");
    assert!(g2 > g1, "SET_MEM_TABLE fences the device");
    assert!(g3 > g2, "a migration suspend fences the device");
}
