//! UD multicast (spec §15.8): ATTACH_MCAST / DETACH_MCAST, a datagram to a group reaching every
//! attached QP of the receiving device (and no other), detach and DESTROY_QP, the error cases.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::engine::{post_sq, wait_cqes};
use common::*;
use vrdma_backend::fabric::FabricBuilder;
use vrdma_backend::qp::worker_of;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::transport::engine::{Engine, EngineOptions};
use vrdma_backend::transport::timers::set_workers;
use vrdma_spec::*;

const QKEY: u32 = 0x1111_2222;

fn group() -> [u8; 16] {
    gid_v4([239, 1, 2, 3])
}

/// A signaled SEND of `len` bytes at `src` (key `key`) to the group of `ah`.
fn group_send(wr_id: u64, src: u64, len: usize, key: u32, ah: u32) -> Wqe {
    Wqe {
        ah,
        remote_qpn: VRDMA_MCAST_QPN,
        remote_qkey: QKEY,
        ..send(wr_id, (src, len as u32, key))
    }
}

fn mcast(n: &mut Node, op: u16, qpn: u32, gid: [u8; 16]) -> Result<Vec<u8>, u32> {
    let c = VrdmaCmdMcast {
        qpn,
        reserved: 0,
        gid,
    };
    n.cmd(op, c.as_bytes())
}

struct Bed {
    a: Node,
    b: Node,
    qa: QpH,
    cqa: RingH,
    cqb: RingH,
    /// B's UD QPs; all get receive WQEs, only some are attached.
    qb: Vec<QpH>,
    ah: u32,
    pda: u32,
    src: u64,
    ka: u32,
    dst: u64,
    kb: u32,
}

fn bed(receivers: usize) -> Bed {
    bed_with(receivers, 1)
}

/// [`bed`] with B's QPs spread over `workers_b` engine workers.
fn bed_with(receivers: usize, workers_b: usize) -> Bed {
    let mut a = Node::new(1, 16, 1500);
    let mut b = Node::new(2, 16, 1500);
    set_workers(&mut b.dev, workers_b);
    let pda = a.create_pd();
    let pdb = b.create_pd();
    let (ca, cqa) = a.create_cq(256);
    let (cb, cqb) = b.create_cq(256);
    let ud = |pd, cq| QpSpec::of_type(VRDMA_QPT_UD, pd, cq);
    let qa = a.create_qp(ud(pda, ca));
    ud_rts(&mut a, &qa, QKEY);
    let qb: Vec<QpH> = (0..receivers)
        .map(|_| {
            let q = b.create_qp(ud(pdb, cb));
            ud_rts(&mut b, &q, QKEY);
            q
        })
        .collect();
    // The AH of a group: its GID and the IP multicast MAC (RFC 1112).
    let av = VrdmaAv {
        dgid: group(),
        dmac: [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03],
        ..a.av_to(&b)
    };
    let ah = a.create_ah(pda, av);
    let src = a.alloc(4096);
    let ka = a.reg_mr(pda, src, 4096, ACC_ALL);
    let dst = b.alloc(4096 * receivers as u64);
    let kb = b.reg_mr(pdb, dst, 4096 * receivers as u64, ACC_ALL);
    Bed {
        a,
        b,
        qa,
        cqa,
        cqb,
        qb,
        ah,
        pda,
        src,
        ka,
        dst,
        kb,
    }
}

impl Bed {
    fn recv_all(&mut self, wr_base: u64) {
        for (i, q) in self.qb.iter_mut().enumerate() {
            let mut rq = q.rq.clone().unwrap();
            let at = self.dst + 4096 * i as u64;
            self.b
                .post_recv(&mut rq, wr_base + i as u64, &[(at, 4096, self.kb)]);
            q.rq = Some(rq);
        }
    }

    fn send(&mut self, wr_id: u64, data: &[u8]) {
        self.a.write(self.src, data);
        let w = group_send(wr_id, self.src, data.len(), self.ka, self.ah);
        self.a.post_send(&mut self.qa, &w);
    }

    /// Pump until A's send completed and B is quiet; B's receive completions.
    fn run(&mut self) -> Vec<Cqe> {
        let mut link = Link::clean();
        let mut got_a = Vec::new();
        let (cqa, cqb) = (&mut self.cqa, &mut self.cqb);
        pump_until(
            &mut self.a,
            &mut self.b,
            &mut link,
            Duration::from_secs(10),
            |a, _| {
                got_a.extend(a.poll_cq(cqa));
                !got_a.is_empty()
            },
        );
        assert_eq!(got_a[0].status, VRDMA_WC_SUCCESS);
        pump_idle(&mut self.a, &mut self.b, &mut link);
        self.b.poll_cq(cqb)
    }
}

#[test]
fn a_datagram_to_a_group_reaches_every_attached_qp_and_no_other() {
    let mut t = bed(3);
    let (q0, q1, q2) = (t.qb[0].qpn, t.qb[1].qpn, t.qb[2].qpn);
    mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, q0, group()).unwrap();
    mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, q1, group()).unwrap();
    // Attaching again changes nothing.
    mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, q1, group()).unwrap();
    t.recv_all(100);
    let data = pattern(5, 700);
    t.send(1, &data);
    let mut got = t.run();
    got.sort_by_key(|c| c.qpn);
    let mut want = vec![q0, q1];
    want.sort_unstable();
    assert_eq!(got.iter().map(|c| c.qpn).collect::<Vec<_>>(), want);
    for c in &got {
        // byte_len counts the 40-byte GRH area too (IBTA 11.4.1.1).
        assert_eq!((c.status, c.byte_len), (VRDMA_WC_SUCCESS, 740));
        assert_eq!(c.src_qp, t.qa.qpn, "src_qp is the sender's QPN");
        let slot = t.qb.iter().position(|q| q.qpn == c.qpn).unwrap() as u64;
        // UD receives start with the 40-byte GRH area.
        assert_eq!(t.b.read(t.dst + 4096 * slot + 40, 700), data);
    }
    assert_ne!(
        t.b.read(t.dst + 4096 * 2 + 40, 700),
        data,
        "q2 is not attached"
    );
    let _ = q2;

    // After DETACH only q0 gets the next datagram; q1 keeps its receive WQE.
    mcast(&mut t.b, VRDMA_CMD_DETACH_MCAST, q1, group()).unwrap();
    let mut rq = t.qb[0].rq.clone().unwrap();
    let kb = t.kb;
    t.b.post_recv(&mut rq, 200, &[(t.dst, 4096, kb)]);
    t.qb[0].rq = Some(rq);
    t.send(2, &pattern(6, 64));
    let got = t.run();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].qpn, got[0].wr_id), (q0, 200));

    // DESTROY_QP detaches: nobody is left in the group, the datagram is dropped.
    let h = VrdmaHandle {
        handle: q0,
        reserved: 0,
    };
    t.b.cmd(VRDMA_CMD_DESTROY_QP, h.as_bytes()).unwrap();
    assert!(!t.b.dev.mcast().has_group(&group()));
    t.send(3, &pattern(7, 64));
    assert!(t.run().is_empty());
}

#[test]
fn attach_errors() {
    let mut t = bed(1);
    let q = t.qb[0].qpn;
    let bad = |r: Result<Vec<u8>, u32>| r.unwrap_err();
    // Not a multicast GID.
    assert_eq!(
        bad(mcast(
            &mut t.b,
            VRDMA_CMD_ATTACH_MCAST,
            q,
            gid_v4([10, 0, 0, 9])
        )),
        VRDMA_STATUS_INVALID
    );
    // Unknown QP.
    assert_eq!(
        bad(mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, 0xabcdef, group())),
        VRDMA_STATUS_NOT_FOUND
    );
    // Not a UD QP.
    let pd = t.b.create_pd();
    let (cq, _) = t.b.create_cq(16);
    let rc = t.b.create_qp(QpSpec::rc(pd, cq));
    assert_eq!(
        bad(mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, rc.qpn, group())),
        VRDMA_STATUS_INVALID
    );
    // Detach what is not attached.
    assert_eq!(
        bad(mcast(&mut t.b, VRDMA_CMD_DETACH_MCAST, q, group())),
        VRDMA_STATUS_NOT_FOUND
    );
    // Truncated request.
    assert_eq!(
        t.b.cmd(VRDMA_CMD_ATTACH_MCAST, &[0u8; 8]).unwrap_err(),
        VRDMA_STATUS_INVALID
    );
    // The device advertises its limits.
    let cfg = t.b.dev.config.to_vrdma_config();
    assert!(cfg.max_mcast_grp > 0 && cfg.max_mcast_qp_attach > 0);
    // QPs per group are bounded.
    let mut n = 0;
    let ud = QpSpec::of_type(VRDMA_QPT_UD, pd, cq);
    let status = loop {
        let qp = t.b.create_qp(QpSpec {
            sq_depth: 4,
            rq_depth: 4,
            ..ud
        });
        match mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, qp.qpn, group()) {
            Ok(_) => n += 1,
            Err(s) => break s,
        }
        assert!(n <= cfg.max_mcast_qp_attach, "attachments beyond the limit");
    };
    assert_eq!(
        (n, status),
        (cfg.max_mcast_qp_attach, VRDMA_STATUS_NO_RESOURCES)
    );
}

#[test]
fn with_two_engine_workers_each_member_receives_on_its_own_worker() {
    // B's four QPs alternate between its two workers; worker 0 receives from the fabric. A
    // datagram goes to the worker of each attached QP (its responder state is taken there,
    // never by another worker at the same time), and only there: a group whose members are
    // all worker 0's is routed to nobody.
    let mut t = bed_with(4, 2);
    let on = |w: usize| -> Vec<u32> {
        t.qb.iter()
            .map(|q| q.qpn)
            .filter(|&q| worker_of(q, 2) == w)
            .collect()
    };
    let (w0, w1) = (on(0), on(1));
    assert_eq!((w0.len(), w1.len()), (2, 2));
    let local = gid_v4([239, 1, 2, 4]);
    for &q in &w0 {
        mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, q, local).unwrap();
    }
    for q in w0.iter().chain(&w1) {
        mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, *q, group()).unwrap();
    }
    // Two receives each: worker 0's members get both datagrams.
    t.recv_all(100);
    t.recv_all(200);
    let av_local = VrdmaAv {
        dgid: local,
        dmac: [0x01, 0x00, 0x5e, 0x01, 0x02, 0x04],
        ..t.a.av_to(&t.b)
    };
    let ah_local = t.a.create_ah(t.pda, av_local);
    let stats_b = t.b.dev.port_stats.clone();
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(t.a.mac).expect("port a");
    let pb = fb.add_device(t.b.mac).expect("port b");
    let fabric = fb.build();
    let port = |p| Arc::new(fabric.device_port(p).expect("port"));
    let ea =
        Engine::start_with(detach(&mut t.a), port(pa), EngineOptions::default()).expect("engine a");
    let eb = Engine::start_with(
        detach(&mut t.b),
        port(pb),
        EngineOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .expect("engine b");
    let data = pattern(8, 500);
    t.a.write(t.src, &data);
    let send = |t: &mut Bed, wr_id: u64, ah: u32| {
        let w = group_send(wr_id, t.src, data.len(), t.ka, ah);
        post_sq(&ea, &t.a.mem, &mut t.qa, &w);
        let sent = wait_cqes(&mut t.a, &mut t.cqa, 1, Duration::from_secs(10), "send");
        assert_eq!(sent[0].status, VRDMA_WC_SUCCESS);
    };
    let qpns = |got: &[Cqe]| {
        let mut q: Vec<u32> = got.iter().map(|c| c.qpn).collect();
        q.sort_unstable();
        q
    };
    let sorted = |v: &[u32]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };

    send(&mut t, 1, ah_local);
    let got = wait_cqes(&mut t.b, &mut t.cqb, 2, Duration::from_secs(10), "local");
    assert_eq!(qpns(&got), sorted(&w0));
    assert_eq!(stats_b.routed_to_worker.load(Ordering::Relaxed), 0);

    let ah = t.ah;
    send(&mut t, 2, ah);
    let got = wait_cqes(&mut t.b, &mut t.cqb, 4, Duration::from_secs(10), "group");
    assert_eq!(qpns(&got), sorted(&[w0.clone(), w1.clone()].concat()));
    for c in &got {
        assert_eq!((c.status, c.byte_len), (VRDMA_WC_SUCCESS, 540));
        let slot = t.qb.iter().position(|q| q.qpn == c.qpn).unwrap() as u64;
        assert_eq!(t.b.read(t.dst + 4096 * slot + 40, 500), data);
    }
    // One copy for worker 1 (its two members), none for worker 0's own.
    assert_eq!(stats_b.routed_to_worker.load(Ordering::Relaxed), 1);
    // Each datagram counts once as received for the engine, whatever the copies.
    assert_eq!(stats_b.rx_to_engine.load(Ordering::Relaxed), 2);
    ea.stop();
    eb.stop();
}

#[test]
fn datagrams_posted_before_destroy_ah_and_destroy_qp_are_sent() {
    // mckey's sender (spec §8): it posts its datagrams, rings the SQ doorbell and at once
    // destroys the AH they name and then the QP, without polling a completion. The doorbell
    // and the commands travel on two queues; the control path waits for the engine to run
    // the doorbells rung before such a command (`EngineSender::fence`, what the vhost-user
    // thread calls), so every datagram leaves. Without the fence the commands win the race
    // against a sleeping engine and the WQEs complete LOC_QP_OP_ERR or vanish with the QP.
    const ROUNDS: u64 = 40;
    const PER_ROUND: u64 = 10;
    // One round's completions on `cq`.
    let round_cqes = |n: &mut Node, cq: &mut RingH, what: &str| {
        wait_cqes(n, cq, PER_ROUND as usize, Duration::from_secs(10), what)
    };
    let mut t = bed(1);
    let q0 = t.qb[0].qpn;
    mcast(&mut t.b, VRDMA_CMD_ATTACH_MCAST, q0, group()).unwrap();
    let av = VrdmaAv {
        dgid: group(),
        dmac: [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03],
        ..t.a.av_to(&t.b)
    };
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(t.a.mac).expect("port a");
    let pb = fb.add_device(t.b.mac).expect("port b");
    let fabric = fb.build();
    let port = |p| Arc::new(fabric.device_port(p).expect("port"));
    let da = detach(&mut t.a);
    let ea = Engine::start_with(da.clone(), port(pa), EngineOptions::default()).expect("engine a");
    let eb =
        Engine::start_with(detach(&mut t.b), port(pb), EngineOptions::default()).expect("engine b");
    let run = |op: u16, req: &[u8]| -> Vec<u8> {
        let mut resp = Vec::new();
        let outcome = da.lock().handle_command(op, req, &mut resp);
        assert!(
            matches!(
                outcome,
                vrdma_backend::guest::CmdOutcome::Done(VRDMA_STATUS_OK)
            ),
            "command {op}: {outcome:?}"
        );
        resp
    };
    let handle = |h: u32| VrdmaHandle {
        handle: h,
        reserved: 0,
    };
    let data = pattern(9, 100);
    t.a.write(t.src, &data);
    let mut sent = 0u64;
    for round in 0..ROUNDS {
        let mut rq = t.qb[0].rq.clone().unwrap();
        for i in 0..PER_ROUND {
            t.b.post_recv(&mut rq, round * 100 + i, &[(t.dst, 4096, t.kb)]);
        }
        t.qb[0].rq = Some(rq);
        let c = VrdmaCmdCreateAh {
            pdn: t.pda,
            reserved: 0,
            av,
        };
        let ah = VrdmaHandle::read_from(&run(VRDMA_CMD_CREATE_AH, c.as_bytes()))
            .unwrap()
            .handle;
        for i in 0..PER_ROUND {
            let w = group_send(round * 100 + i, t.src, data.len(), t.ka, ah);
            post_send_mem(&t.a.mem, &mut t.qa, &w);
        }
        ea.sender().push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: t.qa.qpn,
        });
        assert!(ea.sender().fence(Duration::from_secs(10)), "fence");
        run(VRDMA_CMD_DESTROY_AH, handle(ah).as_bytes());
        sent += PER_ROUND;
        let last = round + 1 == ROUNDS;
        if last {
            // The sender's QP goes too; what it had posted was sent before.
            assert!(ea.sender().fence(Duration::from_secs(10)), "fence");
            run(VRDMA_CMD_DESTROY_QP, handle(t.qa.qpn).as_bytes());
        } else {
            let done = round_cqes(&mut t.a, &mut t.cqa, "sends");
            for c in &done {
                assert_eq!(c.status, VRDMA_WC_SUCCESS, "round {round}: {c:?}");
            }
        }
        let got = round_cqes(&mut t.b, &mut t.cqb, "datagrams");
        assert_eq!(got.len() as u64, PER_ROUND, "round {round}");
        for c in &got {
            assert_eq!((c.status, c.byte_len), (VRDMA_WC_SUCCESS, 140), "{c:?}");
        }
    }
    assert_eq!(sent, ROUNDS * PER_ROUND);
    // With nothing pending the fence returns at once.
    assert!(ea.sender().fence(Duration::ZERO));
    ea.stop();
    eb.stop();
}
