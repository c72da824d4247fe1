//! Two engine threads over the real UDP uplink on loopback: RC WRITE and SEND with data verified,
//! doorbells fed through `EngineSender` like the vhost-user thread does, clean shutdown.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

#[test]
fn rc_over_udp_engines() {
    // timeout 14 (67 ms): robust against a loaded CI host starving an engine thread.
    let RcPair {
        mut a,
        mut b,
        mut qa,
        qb,
        mut cqa,
        mut cqb,
        pda,
        pdb,
        ..
    } = RcPair::new()
        .mem_mib(64)
        .eth_mtu(9000)
        .cq_depth(1024)
        .mtu(5)
        .no_mrs()
        .build();
    let len: u64 = 8 << 20;
    let src = a.alloc(len);
    let dst = b.alloc(len);
    let ka = a.reg_mr(pda, src, len, ACC_ALL);
    let kb = b.reg_mr(pdb, dst, len, ACC_ALL);
    let data = pattern(42, len as usize);
    a.write(src, &data);
    let mut rq = qb.rq.clone().unwrap();
    b.post_recv(&mut rq, 9, &[(dst, 4096, kb)]);

    let (ua, ub) = udp_pair();
    let da = detach(&mut a);
    let db = detach(&mut b);
    let ea = Engine::start(da.clone(), Arc::new(ua)).expect("engine a");
    let eb = Engine::start(db.clone(), Arc::new(ub)).expect("engine b");

    // Four 2 MiB WRITEs (the last signaled) and a SEND.
    for i in 0..4u64 {
        post_send_mem(
            &a.mem,
            &mut qa,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: if i == 3 { VRDMA_SEND_SIGNALED } else { 0 },
                sges: vec![(src + i * (2 << 20), 2 << 20, ka)],
                remote_addr: dst + i * (2 << 20),
                rkey: kb,
                ..Default::default()
            },
        );
    }
    ea.sender().push(VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: qa.qpn,
    });
    let start = Instant::now();
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "WRITE did not complete"
        );
        std::thread::sleep(Duration::from_millis(2));
        got = a.poll_cq(&mut cqa);
    }
    assert_eq!((got[0].wr_id, got[0].status), (3, VRDMA_WC_SUCCESS));
    assert!(b.read(dst, len as usize) == data, "WRITE data differs");

    post_send_mem(
        &a.mem,
        &mut qa,
        &Wqe {
            wr_id: 50,
            opcode: VRDMA_WR_SEND,
            flags: VRDMA_SEND_SIGNALED,
            inline: Some(b"over the engine".to_vec()),
            ..Default::default()
        },
    );
    ea.sender().push(VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: qa.qpn,
    });
    let mut gb = Vec::new();
    let start = Instant::now();
    while gb.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "SEND did not arrive"
        );
        std::thread::sleep(Duration::from_millis(1));
        gb = b.poll_cq(&mut cqb);
    }
    assert_eq!(
        (gb[0].wr_id, gb[0].status, gb[0].byte_len),
        (9, VRDMA_WC_SUCCESS, 15)
    );
    assert_eq!(b.read(dst, 15), b"over the engine");
    ea.stop();
    eb.stop();
    // After shutdown the device is still usable (the engine released it).
    assert!(da.lock().unwrap().qps.get(qa.qpn).is_some());
}
