//! The two-node test bed of the `wqe`, `pagelist` and `packet` targets: nodes a and b linked in
//! memory, with a connected RC pair, a connected UC pair and a UD pair (all in RTS), a 64 KiB MR
//! on each side, an AH a → b and receives posted on b. With the `fuzzing` feature the QPNs and
//! keys are the same in every execution, so seed inputs built from real WQEs and frames
//! (`corpus/`, `src/bin/gen_corpus.rs`) name live objects.
//!
//! b's MR is surrounded by canary pages that nothing may write (no RDMA lands outside an MR,
//! spec §16): [`Bed::check_canaries`] is the targets' oracle beyond "no panic".

use std::time::{Duration, Instant};

use vrdma_backend::transport;
use vrdma_spec::*;

use crate::common::*;

/// Length of each side's MR.
pub const MR_LEN: u64 = 65536;
const CANARY: u8 = 0xc5;
/// UD Q_Key of the UD pair.
pub const QKEY: u32 = 0x1111;

pub struct Bed {
    pub a: Node,
    pub b: Node,
    pub link: Link,
    pub pda: u32,
    pub pdb: u32,
    /// RC, UC, UD QPs on a and their peers on b (same order).
    pub qa: [QpH; 3],
    pub qb: [QpH; 3],
    pub cqa: RingH,
    pub cqb: RingH,
    pub cqb_handle: u32,
    pub src: u64,
    pub ka: u32,
    /// b's MR `[dst, dst + MR_LEN)`, with a canary page on each side.
    pub dst: u64,
    pub kb: u32,
    pub ah: u32,
    /// Status of every completion a's CQ produced (for traces).
    pub cqes_a: Vec<u8>,
}

impl Bed {
    pub fn new() -> Bed {
        let mut a = Node::new(1, 8, 1500);
        let mut b = Node::new(2, 8, 1500);
        let pda = a.create_pd();
        let pdb = b.create_pd();
        let (ca, cqa) = a.create_cq(1024);
        let (cb, cqb) = b.create_cq(1024);
        let mut s = QpSpec::rc(pda, ca);
        s.sq_depth = 64;
        s.rq_depth = 64;
        let mut sb = s;
        sb.pd = pdb;
        sb.scq = cb;
        sb.rcq = cb;
        let mk = |n: &mut Node, s: QpSpec, t: u32| n.create_qp(QpSpec { qp_type: t, ..s });
        let qa = [
            mk(&mut a, s, VRDMA_QPT_RC),
            mk(&mut a, s, VRDMA_QPT_UC),
            mk(&mut a, s, VRDMA_QPT_UD),
        ];
        let qb = [
            mk(&mut b, sb, VRDMA_QPT_RC),
            mk(&mut b, sb, VRDMA_QPT_UC),
            mk(&mut b, sb, VRDMA_QPT_UD),
        ];
        // Short timeout, few retries: a hostile exchange ends in a few virtual seconds.
        const RTS: RtsAttrs = RtsAttrs {
            mtu: 3,
            timeout: 8,
            retry: 2,
            rnr_retry: 2,
        };
        connect(&mut a, &qa[0], &mut b, &qb[0], RTS);
        connect(&mut a, &qa[1], &mut b, &qb[1], RTS);
        ud_rts(&mut a, &qa[2], QKEY);
        ud_rts(&mut b, &qb[2], QKEY);
        let src = a.alloc(MR_LEN);
        let ka = a.reg_mr(pda, src, MR_LEN, ACC_ALL);
        a.write(src, &pattern(1, MR_LEN as usize));
        let area = b.alloc(MR_LEN + 8192);
        b.write(area, &vec![CANARY; (MR_LEN + 8192) as usize]);
        let dst = area + 4096;
        let kb = b.reg_mr(pdb, dst, MR_LEN, ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
        let av = a.av_to(&b);
        let ah = a.create_ah(pda, av);
        let mut bed = Bed {
            a,
            b,
            link: Link::clean(),
            pda,
            pdb,
            qa,
            qb,
            cqa,
            cqb,
            cqb_handle: cb,
            src,
            ka,
            dst,
            kb,
            ah,
            cqes_a: Vec::new(),
        };
        for i in 0..3 {
            let mut rq = bed.qb[i].rq.clone().expect("rq");
            for j in 0..8u64 {
                let at = bed.dst + j * 4096;
                bed.b
                    .post_recv(&mut rq, 100 * i as u64 + j, &[(at, 4096, bed.kb)]);
            }
            bed.qb[i].rq = Some(rq);
        }
        bed
    }

    /// Deliver frames both ways until quiet, then fire the transport timers `rounds` times in
    /// virtual time (retransmissions, RNR and ACK timeouts), delivering again after each.
    pub fn settle(&mut self, rounds: u32) {
        pump_idle(&mut self.a, &mut self.b, &mut self.link);
        let mut vt = Instant::now();
        for _ in 0..rounds {
            vt += Duration::from_secs(30);
            transport::on_tick(&mut self.a.dev, vt);
            transport::on_tick(&mut self.b.dev, vt);
            pump_idle(&mut self.a, &mut self.b, &mut self.link);
        }
        self.cqes_a.extend(drain_cq(&self.a, &mut self.cqa));
        drain_cq(&self.b, &mut self.cqb);
    }

    /// The pages around b's MR hold their canary.
    pub fn check_canaries(&self) {
        for page in [self.dst - 4096, self.dst + MR_LEN] {
            let got = self.b.read(page, 4096);
            assert!(
                got.iter().all(|&x| x == CANARY),
                "bytes written outside b's MR at {page:#x}"
            );
        }
    }
}

/// Consume a CQ like the driver does, at most one ring's worth: a page list may let a peer's
/// RDMA overwrite the ring (the guest's own doing), so the producer index is not trusted
/// (the fixtures' `poll_cq` would loop to it). Returns the completion statuses.
pub fn drain_cq(n: &Node, cq: &mut RingH) -> Vec<u8> {
    let Ok(prod) = n.mem.load_u32_acquire(cq.ctrl()) else {
        return Vec::new();
    };
    let count = prod.wrapping_sub(cq.idx).min(cq.depth);
    let mut st = Vec::new();
    for _ in 0..count {
        let mut b = [0u8; 64];
        if n.mem.read(cq.entry_gpa(cq.idx), &mut b).is_ok() {
            st.push(vrdma_backend::transport::ctx::Cqe::from_bytes(&b).status);
        }
        cq.idx = cq.idx.wrapping_add(1);
    }
    let _ = n.mem.store_u32_release(cq.ctrl() + 64, cq.idx);
    st
}

impl Default for Bed {
    fn default() -> Self {
        Self::new()
    }
}
