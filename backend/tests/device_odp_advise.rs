//! ADVISE_MR with `VRDMA_ADVISE_F_FLUSH` (spec §11.8): the command is parked until every page
//! request of its range has ended, then completes with OK through `DeviceOutput::command_done`;
//! meanwhile other commands (ODP_PAGE_RESP above all) keep completing. Covers answers (good and
//! error), the ODP timeout (test clock and the real engine thread), DEREG_MR, ODP_INVALIDATE,
//! device reset, requests already pending, and the bound on parked advises.

mod common;

use std::os::unix::io::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::device::{CmdOutcome, Device, DeviceConfig, Ticket};
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::memory::advise::MAX_PARKED_ADVISE;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::uplink::{Uplink, UplinkError};
use vrdma_spec::*;

const CHUNK: u64 = 2 << 20;
const IOVA: u64 = 0x7f00_0000_0000;

fn odp_env() -> (Node, u32) {
    let mut e = Node::bare_odp();
    let pd = e.create_pd();
    let reg = odp_mr_req(
        pd,
        VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_ON_DEMAND,
        IOVA,
        8 * CHUNK,
    );
    let key = e.ok_handle(VRDMA_CMD_REG_ODP_MR, reg.as_bytes());
    (e, key)
}

fn advise_req(key: u32, flags: u32, iova: u64, length: u64) -> Vec<u8> {
    VrdmaCmdAdviseMr {
        lkey: key,
        advice: VRDMA_ADVISE_PREFETCH,
        flags,
        reserved: 0,
        iova,
        length,
    }
    .as_bytes()
    .to_vec()
}

/// Submit a flush advise over `[iova, iova + length)` that must park; returns its ticket.
fn park(e: &mut Node, key: u32, iova: u64, length: u64) -> Ticket {
    match e.submit(
        VRDMA_CMD_ADVISE_MR,
        &advise_req(key, VRDMA_ADVISE_F_FLUSH, iova, length),
    ) {
        CmdOutcome::Parked(t) => t,
        o => panic!("flush advise not parked: {o:?}"),
    }
}

/// Answer a FAULT through ODP_PAGE_RESP (the driver's command path) with `status`; returns the
/// command's status.
fn answer(e: &mut Node, r: &VrdmaPageReq, status: u32) -> u32 {
    let pages = if status == VRDMA_STATUS_OK {
        e.pages((r.length / 4096) as usize)
    } else {
        Vec::new()
    };
    let c = VrdmaCmdOdpPageResp {
        req_id: r.req_id,
        mr_key: r.mr_key,
        status,
        flags: VRDMA_ODP_RESP_F_WRITABLE,
        iova: r.iova,
        npages: pages.len() as u32,
        reserved: 0,
    };
    e.cmd_status(VRDMA_CMD_ODP_PAGE_RESP, &req_with_pages(&c, &pages))
        .0
}

fn faults(e: &Node) -> Vec<VrdmaPageReq> {
    e.out
        .take_page_requests()
        .into_iter()
        .filter(|r| r.type_ == VRDMA_PAGEREQ_FAULT)
        .collect()
}

fn check(e: &Node) {
    e.dev
        .mrs
        .write()
        .odp_check_invariants()
        .expect("ODP bookkeeping");
}

#[test]
fn flush_completes_only_after_every_answer() {
    let (mut e, key) = odp_env();
    let t = park(&mut e, key, IOVA + 100, 4 * CHUNK - 200);
    let reqs = faults(&e);
    assert_eq!(reqs.len(), 4, "one FAULT per chunk of the range");
    for (i, r) in reqs.iter().enumerate() {
        assert!(e.out.take_done().is_empty(), "completed after {i} answers");
        assert_eq!(e.dev.mrs.write().odp_parked_advises(), 1);
        // The page responses complete at once while the advise is parked.
        assert_eq!(answer(&mut e, r, VRDMA_STATUS_OK), VRDMA_STATUS_OK);
        check(&e);
    }
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
    assert_eq!(e.dev.mrs.write().odp_parked_advises(), 0);
    // The range is resident: the same flush now completes at once, asking nothing.
    assert_eq!(
        e.submit(
            VRDMA_CMD_ADVISE_MR,
            &advise_req(key, VRDMA_ADVISE_F_FLUSH, IOVA, 4 * CHUNK)
        ),
        CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    assert!(faults(&e).is_empty());
    assert!(e.out.take_done().is_empty());
}

#[test]
fn flush_is_ok_when_an_answer_fails() {
    let (mut e, key) = odp_env();
    let t = park(&mut e, key, IOVA, 3 * CHUNK);
    let reqs = faults(&e);
    assert_eq!(reqs.len(), 3);
    // The driver cannot map the middle chunk.
    assert_eq!(
        answer(&mut e, &reqs[1], VRDMA_STATUS_ACCESS),
        VRDMA_STATUS_OK
    );
    assert_eq!(answer(&mut e, &reqs[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    assert!(e.out.take_done().is_empty());
    // A rejected answer (range outside the chunk) also ends the request.
    let mut bad = reqs[2];
    bad.iova += CHUNK;
    assert_eq!(answer(&mut e, &bad, VRDMA_STATUS_OK), VRDMA_STATUS_INVALID);
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
    check(&e);
}

#[test]
fn flush_waits_for_requests_already_pending() {
    let (mut e, key) = odp_env();
    // An access faulted chunk 0 before the advise arrived.
    assert!(e
        .dev
        .mrs
        .write()
        .resolve_for(Some(20), key, 1, IOVA, 8, 0)
        .is_err());
    let early = faults(&e);
    assert_eq!(early.len(), 1);
    let t = park(&mut e, key, IOVA, 2 * CHUNK);
    let sent = faults(&e);
    assert_eq!(sent.len(), 1, "no second request for the pending chunk");
    assert_eq!(answer(&mut e, &sent[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    assert!(e.out.take_done().is_empty(), "chunk 0 still pending");
    assert_eq!(answer(&mut e, &early[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
}

#[test]
fn flush_completes_at_the_odp_timeout_without_answers() {
    let (mut e, key) = odp_env();
    let timeout = e.dev.config.odp.timeout;
    let t0 = Instant::now();
    let t = park(&mut e, key, IOVA, 2 * CHUNK);
    let reqs = faults(&e);
    assert_eq!(reqs.len(), 2);
    // Answer one; the other never comes.
    assert_eq!(answer(&mut e, &reqs[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    let next = e.dev.odp_tick(t0).expect("a request is outstanding");
    assert!(next <= t0 + timeout + Duration::from_secs(1));
    assert!(e.out.take_done().is_empty());
    e.dev.odp_tick(t0 + timeout / 2);
    assert!(e.out.take_done().is_empty(), "completed before the timeout");
    e.dev.odp_tick(t0 + timeout + Duration::from_millis(100));
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
    // The late answer is refused like any answer to an expired request.
    assert_eq!(
        answer(&mut e, &reqs[1], VRDMA_STATUS_OK),
        VRDMA_STATUS_NOT_FOUND
    );
    assert!(e.out.take_done().is_empty());
    check(&e);
}

#[test]
fn dereg_mr_completes_a_parked_flush() {
    let (mut e, key) = odp_env();
    let t = park(&mut e, key, IOVA, 2 * CHUNK);
    let reqs = faults(&e);
    assert_eq!(answer(&mut e, &reqs[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    assert!(e.out.take_done().is_empty());
    assert_eq!(e.cmd_status(VRDMA_CMD_DEREG_MR, &h(key)).0, VRDMA_STATUS_OK);
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
    assert_eq!(e.dev.mrs.write().odp_parked_advises(), 0);
    assert_eq!(
        answer(&mut e, &reqs[1], VRDMA_STATUS_OK),
        VRDMA_STATUS_NOT_FOUND
    );
    check(&e);
}

#[test]
fn invalidate_completes_a_parked_flush() {
    let (mut e, key) = odp_env();
    let t = park(&mut e, key, IOVA, 3 * CHUNK);
    let reqs = faults(&e);
    let inv = |iova, length| {
        VrdmaCmdOdpInvalidate {
            mr_key: key,
            reserved: 0,
            iova,
            length,
        }
        .as_bytes()
        .to_vec()
    };
    // Cancelling part of the range leaves the advise waiting for the rest.
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ODP_INVALIDATE, &inv(IOVA, CHUNK)).0,
        VRDMA_STATUS_OK
    );
    assert!(e.out.take_done().is_empty());
    assert_eq!(answer(&mut e, &reqs[1], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    assert!(e.out.take_done().is_empty());
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ODP_INVALIDATE, &inv(IOVA + 2 * CHUNK, 4096))
            .0,
        VRDMA_STATUS_OK
    );
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
    check(&e);
}

#[test]
fn reset_forgets_parked_flushes() {
    let (mut e, key) = odp_env();
    let t = park(&mut e, key, IOVA, 2 * CHUNK);
    let reqs = faults(&e);
    e.dev.reset();
    assert_eq!(e.dev.mrs.write().odp_parked_advises(), 0);
    // Nothing completes the forgotten advise: not a timeout, not a late answer.
    e.dev.odp_tick(Instant::now() + Duration::from_secs(60));
    assert_eq!(
        answer(&mut e, &reqs[0], VRDMA_STATUS_OK),
        VRDMA_STATUS_NOT_FOUND
    );
    assert!(e.out.take_done().is_empty());
    // A new flush after the reset gets a fresh ticket.
    let pd = e.create_pd();
    let reg = odp_mr_req(pd, VRDMA_ACCESS_ON_DEMAND, IOVA, CHUNK);
    let k = e.ok_handle(VRDMA_CMD_REG_ODP_MR, reg.as_bytes());
    assert_ne!(k, key, "the old key stays invalid");
    let t2 = park(&mut e, k, IOVA, CHUNK);
    assert!(t2 > t, "ticket {t2:?} reused after reset (was {t:?})");
}

#[test]
fn other_commands_complete_while_a_flush_is_parked() {
    let (mut e, key) = odp_env();
    let t = park(&mut e, key, IOVA, CHUNK);
    let reqs = faults(&e);
    let pd = e.create_pd();
    assert_ne!(pd, 0);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd)).0,
        VRDMA_STATUS_OK
    );
    // An advise without F_FLUSH completes at once even over the pending chunk and new ones.
    assert_eq!(
        e.submit(VRDMA_CMD_ADVISE_MR, &advise_req(key, 0, IOVA, 3 * CHUNK)),
        CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    let more = faults(&e);
    assert_eq!(more.len(), 2, "the two absent chunks are requested");
    // Their answers do not complete the flush: it waits only for its own range.
    for r in &more {
        assert_eq!(answer(&mut e, r, VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    }
    assert!(e.out.take_done().is_empty());
    assert_eq!(answer(&mut e, &reqs[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    assert_eq!(e.out.take_done(), vec![(t, VRDMA_STATUS_OK)]);
}

#[test]
fn parked_flushes_are_bounded() {
    let (mut e, key) = odp_env();
    let mut tickets = Vec::new();
    for _ in 0..MAX_PARKED_ADVISE {
        tickets.push(park(&mut e, key, IOVA, 4096));
    }
    let reqs = faults(&e);
    assert_eq!(reqs.len(), 1, "every advise joined the one pending request");
    // One more is refused and has no effect: no request for its (absent) chunk.
    assert_eq!(
        e.submit(
            VRDMA_CMD_ADVISE_MR,
            &advise_req(key, VRDMA_ADVISE_F_FLUSH, IOVA + CHUNK, 4096)
        ),
        CmdOutcome::Done(VRDMA_STATUS_NO_RESOURCES)
    );
    assert!(faults(&e).is_empty());
    // Without F_FLUSH nothing is parked, so the bound does not apply.
    assert_eq!(
        e.submit(VRDMA_CMD_ADVISE_MR, &advise_req(key, 0, IOVA + CHUNK, 4096)),
        CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    let other = faults(&e);
    assert_eq!(other.len(), 1);
    check(&e);
    // The answer completes all of them, once each.
    assert_eq!(answer(&mut e, &reqs[0], VRDMA_STATUS_OK), VRDMA_STATUS_OK);
    let mut done: Vec<Ticket> = e
        .out
        .take_done()
        .into_iter()
        .map(|(t, s)| {
            assert_eq!(s, VRDMA_STATUS_OK);
            t
        })
        .collect();
    done.sort();
    assert_eq!(done, tickets);
    // Room again.
    park(&mut e, key, IOVA + CHUNK, 4096);
    check(&e);
}

/// An uplink that never receives and drops what is sent.
struct Silent;

impl Uplink for Silent {
    fn send(&self, _frame: &[u8]) -> Result<(), UplinkError> {
        Ok(())
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Ok(None)
    }
    fn as_raw_fd(&self) -> RawFd {
        -1
    }
}

/// The engine thread's timer expires the unanswered request and completes the advise on its own
/// (no command, no test clock).
#[test]
fn engine_thread_completes_a_flush_at_the_timeout() {
    let mut cfg = DeviceConfig::default();
    cfg.odp.timeout = Duration::from_millis(200);
    let (mut e, key) = {
        let mut e = Node::bare_with(cfg);
        let pd = e.create_pd();
        let reg = odp_mr_req(pd, VRDMA_ACCESS_ON_DEMAND, IOVA, CHUNK);
        let key = e.ok_handle(VRDMA_CMD_REG_ODP_MR, reg.as_bytes());
        (e, key)
    };
    let t = park(&mut e, key, IOVA, CHUNK);
    let out = e.out.clone();
    let cfg = e.dev.config.clone();
    let dev = std::mem::replace(&mut e.dev, Device::new(cfg, e.mem.clone(), out.clone()));
    let dev = Arc::new(HandoffLock::new(dev));
    let start = Instant::now();
    let engine = Engine::start(dev.clone(), Arc::new(Silent)).expect("engine");
    engine.sender().kick();
    let done = loop {
        let d = out.take_done();
        if !d.is_empty() {
            break d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the engine never completed the advise"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    engine.stop();
    assert_eq!(done, vec![(t, VRDMA_STATUS_OK)]);
    assert!(start.elapsed() >= Duration::from_millis(150));
    let d = dev.lock();
    assert_eq!(d.mrs.write().odp_parked_advises(), 0);
    d.mrs.write().odp_check_invariants().unwrap();
}
