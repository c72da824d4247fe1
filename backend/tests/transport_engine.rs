//! Two engine threads over the real UDP uplink on loopback: RC WRITE and SEND with data verified,
//! doorbells fed through `EngineSender` like the vhost-user thread does, clean shutdown.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::*;
use common::*;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

#[test]
fn rc_over_udp_engines() {
    // timeout 14 (67 ms): robust against a loaded CI host starving an engine thread.
    let len: u64 = 8 << 20;
    let mut p = RcPair::new()
        .mem_mib(64)
        .eth_mtu(9000)
        .cq_depth(1024)
        .mtu(5)
        .mrs(len, len)
        .build();
    let data = pattern(42, len as usize);
    p.a.write(p.src, &data);
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 9, &[(p.dst, 4096, p.kb)]);

    let (ua, ub) = udp_pair();
    let da = detach(&mut p.a);
    let db = detach(&mut p.b);
    let ea = Engine::start(da.clone(), Arc::new(ua)).expect("engine a");
    let eb = Engine::start(db.clone(), Arc::new(ub)).expect("engine b");

    // Four 2 MiB WRITEs (the last signaled) and a SEND.
    for i in 0..4u64 {
        post_send_mem(
            &p.a.mem,
            &mut p.qa,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: if i == 3 { VRDMA_SEND_SIGNALED } else { 0 },
                sges: vec![(p.src + i * (2 << 20), 2 << 20, p.ka)],
                remote_addr: p.dst + i * (2 << 20),
                rkey: p.kb,
                ..Default::default()
            },
        );
    }
    ea.sender().push(VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: p.qa.qpn,
    });
    let got = wait_cqes(&mut p.a, &mut p.cqa, 1, Duration::from_secs(30), "WRITE");
    assert_eq!((got[0].wr_id, got[0].status), (3, VRDMA_WC_SUCCESS));
    assert!(p.b.read(p.dst, len as usize) == data, "WRITE data differs");

    post_sq(
        &ea,
        &p.a.mem,
        &mut p.qa,
        &send_inline(50, b"over the engine"),
    );
    let gb = wait_cqes(&mut p.b, &mut p.cqb, 1, Duration::from_secs(10), "SEND");
    assert_eq!(
        (gb[0].wr_id, gb[0].status, gb[0].byte_len),
        (9, VRDMA_WC_SUCCESS, 15)
    );
    assert_eq!(p.b.read(p.dst, 15), b"over the engine");
    ea.stop();
    eb.stop();
    // After shutdown the device is still usable (the engine released it).
    assert!(da.lock().qps.get(p.qa.qpn).is_some());
}
