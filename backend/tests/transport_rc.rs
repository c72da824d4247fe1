//! RC transport between two in-process devices: every operation, sizes from 0 B to 8 MiB with
//! every path MTU, data verified byte for byte in guest memory.

mod common;

use std::time::Duration;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(60);

struct Pair {
    a: Node,
    b: Node,
    qa: QpH,
    qb: QpH,
    cqa: RingH,
    cqb: RingH,
    pda: u32,
    pdb: u32,
}

fn pair(mtu: u32, mem_mib: u64) -> Pair {
    let mut a = Node::new(1, mem_mib, 9000);
    let mut b = Node::new(2, mem_mib, 9000);
    let pda = a.create_pd();
    let pdb = b.create_pd();
    let (ca, cqa) = a.create_cq(1024);
    let (cb, cqb) = b.create_cq(1024);
    let qa = a.create_qp(QpSpec::rc(pda, ca));
    let qb = b.create_qp(QpSpec::rc(pdb, cb));
    connect(&mut a, &qa, &mut b, &qb, mtu, 14, 7, 7);
    Pair {
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        pda,
        pdb,
    }
}

fn wait_cqes(p: &mut Pair, link: &mut Link, na: usize, nb: usize) -> (Vec<Cqe>, Vec<Cqe>) {
    let mut ga = Vec::new();
    let mut gb = Vec::new();
    let (cqa, cqb) = (&mut p.cqa, &mut p.cqb);
    pump_until(&mut p.a, &mut p.b, link, T, |a, b| {
        ga.extend(a.poll_cq(cqa));
        gb.extend(b.poll_cq(cqb));
        ga.len() >= na && gb.len() >= nb
    });
    (ga, gb)
}

#[test]
fn send_recv_small() {
    let mut p = pair(3, 16);
    let mut link = Link::clean();
    let src = p.a.alloc(4096);
    let dst = p.b.alloc(4096);
    let ka = p.a.reg_mr(p.pda, src, 4096, ACC_ALL);
    let kb = p.b.reg_mr(p.pdb, dst, 4096, ACC_ALL);
    let data = pattern(1, 100);
    p.a.write(src, &data);
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 77, &[(dst, 4096, kb)]);
    let mut qa = p.qa.clone();
    p.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 5,
            opcode: VRDMA_WR_SEND as u8,
            flags: VRDMA_SEND_SIGNALED as u8,
            sges: vec![(src, 100, ka)],
            ..Default::default()
        },
    );
    let (ca, cb) = wait_cqes(&mut p, &mut link, 1, 1);
    assert_eq!(ca[0].wr_id, 5);
    assert_eq!(ca[0].status, VRDMA_WC_SUCCESS as u8);
    assert_eq!(ca[0].opcode, VRDMA_WC_SEND as u8);
    assert_eq!(cb[0].wr_id, 77);
    assert_eq!(cb[0].status, VRDMA_WC_SUCCESS as u8);
    assert_eq!(cb[0].opcode, VRDMA_WC_RECV as u8);
    assert_eq!(cb[0].byte_len, 100);
    assert_eq!(p.b.read(dst, 100), data);
}
