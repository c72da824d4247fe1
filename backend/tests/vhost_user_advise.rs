//! ADVISE_MR with F_FLUSH through the real daemon (`prepare` + `serve`, engine thread, no
//! uplink), the `vhost` crate's Frontend playing QEMU: the control chain is returned only once
//! the page requests are answered (or time out, through the engine thread), other commands keep
//! completing meanwhile, and a reset drops the parked chain without ever writing it.

mod vhost_user_support;

use std::thread;
use std::time::{Duration, Instant};

use vrdma_backend::cli::Config;
use vrdma_backend::vhost_user::prepare;
use vrdma_spec::*;

use vhost_user_support::*;

const T: Duration = Duration::from_secs(5);
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x0a, 0x0d, 0x01];
/// `--odp-chunk-shift 16`: 64 KiB chunks, 16 pages per answer.
const CHUNK: u64 = 1 << 16;
const IOVA: u64 = 0x7f00_0000_0000;
/// Sentinel in response buffers, to see whether the device wrote them.
const UNTOUCHED: [u8; 8] = [0xee; 8];

struct Session {
    daemon: thread::JoinHandle<()>,
    fe: vhost::vhost_user::Frontend,
    guest: Guest,
    ctrl: DriverRing,
    prq: DriverRing,
    key: u32,
}

/// Daemon with one connection: control and pagereq queues started, 8 pagereq buffers posted, a
/// PD and an explicit ODP MR of 4 chunks at `IOVA` registered.
fn session(tag: &str) -> Session {
    let _ = env_logger::builder().is_test(true).try_init();
    let path = socket_path(tag);
    let mut cfg = Config::new(path.clone(), MAC);
    cfg.odp.chunk_shift = 16;
    let daemon = serve_on_thread(prepare(&cfg).expect("prepare"), 1);
    let (mut fe, _) = connect(&path, true);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let ctrl = DriverRing::new(&mut guest, VRDMA_VQ_CONTROL as usize, 64);
    let mut prq = DriverRing::new(&mut guest, VRDMA_VQ_PAGEREQ as usize, 16);
    start_rings(&mut fe, &guest, &[&ctrl, &prq]);
    for _ in 0..8 {
        let b = guest.alloc(32, 8);
        prq.add(&guest, &[(b, 32, true)]);
    }
    prq.notify();
    let mut s = Session {
        daemon,
        fe,
        guest,
        ctrl,
        prq,
        key: 0,
    };
    let (_, st, resp) = s.run(&cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!(st, VRDMA_STATUS_OK);
    let pdn = VrdmaHandle::read_from(&resp[8..]).unwrap().handle;
    let reg = VrdmaCmdRegMr {
        pdn,
        access: VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_ON_DEMAND,
        iova: IOVA,
        length: 4 * CHUNK,
        page_shift: 12,
        npages: 0,
    };
    let (_, st, resp) = s.run(&cmd(VRDMA_CMD_REG_ODP_MR, reg.as_bytes()), 16);
    assert_eq!(st, VRDMA_STATUS_OK);
    s.key = VrdmaRespRegMr::read_from(&resp[8..]).unwrap().lkey;
    s
}

impl Session {
    /// Make a command available; returns (head, response buffer GPA).
    fn post(&mut self, command: &[u8], resp_len: usize) -> (u16, u64) {
        let req = self.guest.alloc(command.len(), 8);
        self.guest.write(req, command);
        let resp = self.guest.alloc(resp_len, 8);
        self.guest.write(resp, &vec![0xee; resp_len]);
        let head = self.ctrl.add(
            &self.guest,
            &[
                (req, command.len() as u32, false),
                (resp, resp_len as u32, true),
            ],
        );
        self.ctrl.notify();
        (head, resp)
    }

    /// Run a command that completes at once (the next used element must be it); returns (used
    /// len, status, response bytes).
    fn run(&mut self, command: &[u8], resp_len: usize) -> (u32, u32, Vec<u8>) {
        let (head, resp) = self.post(command, resp_len);
        let (id, len) = self
            .ctrl
            .wait_used(&self.guest, T)
            .expect("command completed");
        assert_eq!(id, u32::from(head), "another chain completed first");
        let bytes = self.guest.read(resp, resp_len);
        (len, status_of(&bytes), bytes)
    }

    /// Post ADVISE_MR PREFETCH + F_FLUSH over `[iova, iova + len)`.
    fn advise(&mut self, iova: u64, length: u64) -> (u16, u64) {
        let c = VrdmaCmdAdviseMr {
            lkey: self.key,
            advice: VRDMA_ADVISE_PREFETCH,
            flags: VRDMA_ADVISE_F_FLUSH,
            reserved: 0,
            iova,
            length,
        };
        self.post(&cmd(VRDMA_CMD_ADVISE_MR, c.as_bytes()), 8)
    }

    /// An ADVISE_MR with F_FLUSH of the first chunk, parked on the page request it sent (taken
    /// off the pagereq queue and never answered); returns its response buffer.
    fn park_an_advise(&mut self) -> u64 {
        let (_, adv_resp) = self.advise(IOVA, CHUNK);
        let _ = self.page_request();
        adv_resp
    }

    /// The next page request the device wrote.
    fn page_request(&mut self) -> VrdmaPageReq {
        let (id, len) = self
            .prq
            .wait_used(&self.guest, T)
            .expect("page request delivered");
        assert_eq!(len, 32);
        // Buffers were posted in order, 32 bytes each, from descriptor `id`.
        let d = self.guest.read(self.prq.desc + 16 * u64::from(id), 8);
        let addr = u64::from_le_bytes(d.try_into().unwrap());
        VrdmaPageReq::read_from(&self.guest.read(addr, 32)).unwrap()
    }

    /// Answer a FAULT with 16 guest pages; returns the ODP_PAGE_RESP chain head.
    fn answer(&mut self, r: &VrdmaPageReq) -> u16 {
        let base = self.guest.alloc(CHUNK as usize, 4096);
        let c = VrdmaCmdOdpPageResp {
            req_id: r.req_id,
            mr_key: r.mr_key,
            status: VRDMA_STATUS_OK,
            flags: VRDMA_ODP_RESP_F_WRITABLE,
            iova: r.iova,
            npages: (r.length / 4096) as u32,
            reserved: 0,
        };
        let mut b = c.as_bytes().to_vec();
        for i in 0..r.length / 4096 {
            b.extend_from_slice(&(base + i * 4096).to_le_bytes());
        }
        self.post(&cmd(VRDMA_CMD_ODP_PAGE_RESP, &b), 8).0
    }

    fn finish(self) {
        drop(self.fe);
        self.daemon.join().unwrap();
    }
}

#[test]
fn flush_chain_returns_only_after_the_page_responses() {
    let mut s = session("advise-flush");
    let (adv, adv_resp) = s.advise(IOVA, 2 * CHUNK);
    let r1 = s.page_request();
    let r2 = s.page_request();
    assert_eq!(
        (r1.type_, r2.type_),
        (VRDMA_PAGEREQ_FAULT, VRDMA_PAGEREQ_FAULT)
    );
    thread::sleep(Duration::from_millis(200));
    assert_eq!(s.ctrl.used_count(&s.guest), 0, "advise returned early");
    // Other commands complete while the advise is parked.
    let (len, st, _) = s.run(&cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!((len, st), (16, VRDMA_STATUS_OK));
    // First answer: its own chain comes back, the advise stays.
    let p1 = s.answer(&r1);
    let (id, len) = s.ctrl.wait_used(&s.guest, T).expect("page response");
    assert_eq!((id, len), (u32::from(p1), 8));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(s.ctrl.used_count(&s.guest), 0, "advise returned early");
    assert_eq!(s.guest.read(adv_resp, 8), UNTOUCHED);
    // Last answer: both chains come back, the advise with status OK.
    let p2 = s.answer(&r2);
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(s.ctrl.wait_used(&s.guest, T).expect("two completions"));
    }
    got.sort();
    let mut want = vec![(u32::from(adv), 8), (u32::from(p2), 8)];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(status_of(&s.guest.read(adv_resp, 8)), VRDMA_STATUS_OK);
    s.finish();
}

#[test]
fn flush_chain_returns_at_the_odp_timeout() {
    let mut s = session("advise-timeout");
    let start = Instant::now();
    let (adv, adv_resp) = s.advise(IOVA + CHUNK, 100);
    let r = s.page_request();
    assert_eq!(r.iova, IOVA + CHUNK);
    // Nobody answers: the engine thread's ODP timer (5 s) ends the request and returns the chain.
    let (id, len) = s
        .ctrl
        .wait_used(&s.guest, Duration::from_secs(15))
        .expect("advise completed by the timeout");
    assert_eq!((id, len), (u32::from(adv), 8));
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "returned after {:?}, before the timeout",
        start.elapsed()
    );
    assert_eq!(status_of(&s.guest.read(adv_resp, 8)), VRDMA_STATUS_OK);
    s.finish();
}

#[test]
fn reset_drops_a_parked_chain_unwritten() {
    let mut s = session("advise-reset");
    let adv_resp = s.park_an_advise();
    // QEMU stops the control queue on a guest virtio reset: the device resets.
    vhost::VhostBackend::get_vring_base(&s.fe, VRDMA_VQ_CONTROL as usize).expect("GET_VRING_BASE");
    // Past the ODP timeout: nothing ever completes the dropped chain.
    thread::sleep(Duration::from_secs(6));
    assert_eq!(s.ctrl.used_count(&s.guest), 0, "parked chain returned");
    assert_eq!(s.guest.read(adv_resp, 8), UNTOUCHED);
    s.finish();
}

#[test]
fn disabled_ring_gets_no_parked_completion() {
    let mut s = session("advise-disabled");
    let adv_resp = s.park_an_advise();
    // The frontend disables the control ring without stopping it (no device reset): the
    // timeout still ends the advise, but nothing may be written to a disabled ring.
    vhost::vhost_user::VhostUserFrontend::set_vring_enable(
        &mut s.fe,
        VRDMA_VQ_CONTROL as usize,
        false,
    )
    .expect("SET_VRING_ENABLE(0)");
    thread::sleep(Duration::from_secs(6));
    assert_eq!(
        s.ctrl.used_count(&s.guest),
        0,
        "chain returned on a disabled ring"
    );
    assert_eq!(s.guest.read(adv_resp, 8), UNTOUCHED);
    s.finish();
}
