//! RoCEv2 traffic between two QPs of the same device never leaves through the uplink: the engine
//! loops frames addressed to its own GIDs back into itself (`port::tx_destination`).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::engine::*;
use common::*;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

#[test]
fn rc_between_qps_of_one_device_loops_back() {
    let mut a = Node::new(1, 64, 1500);
    let pd = a.create_pd();
    let (cq, mut cqr) = a.create_cq(256);
    let mut q1 = a.create_qp(QpSpec::rc(pd, cq));
    let q2 = a.create_qp(QpSpec::rc(pd, cq));
    connect_loopback(&mut a, &q1, &q2, RtsAttrs::mtu(3).timeout(12));
    let buf = a.alloc(16384);
    let k = a.reg_mr(pd, buf, 16384, ACC_ALL);
    let mut rq = q2.rq.clone().unwrap();
    a.post_recv(&mut rq, 77, &[(buf, 4096, k)]);

    let up = CountingUplink::new();
    let d = detach(&mut a);
    let e = Engine::start(d.clone(), up.clone()).expect("engine");

    // A SEND and a 5000-byte RDMA WRITE (multi-packet at MTU 1024), both q1 -> q2.
    let data = pattern(3, 5000);
    a.write(buf + 8192, &data);
    post_sq(&e, &a.mem, &mut q1, &send_inline(5, b"hello, myself"));
    post_send_mem(
        &a.mem,
        &mut q1,
        &rdma(6, VRDMA_WR_RDMA_WRITE, (buf + 8192, 5000, k), buf + 4096, k),
    );
    assert_all_succeed(&mut a, &mut cqr, &[5, 6, 77], Duration::from_secs(10));
    assert_eq!(a.read(buf, 13), b"hello, myself");
    assert!(a.read(buf + 4096, 5000) == data, "WRITE data differs");
    e.stop();
    assert_eq!(
        up.sent.load(Ordering::SeqCst),
        0,
        "frames leaked to the uplink"
    );
}
