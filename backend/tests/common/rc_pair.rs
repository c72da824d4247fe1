//! `RcPair`: two nodes joined by one connected QP pair with a CQ per side, an MR per side
//! (A's `src`, B's `dst`) and the link between them, built in one call:
//! `RcPair::new().mtu(5).retry(2).b_access(RW).srq_b().build()`.

use std::time::Duration;

use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

use super::*;

/// A connected pair, A → B.
pub struct RcPair {
    pub a: Node,
    pub b: Node,
    pub qa: QpH,
    pub qb: QpH,
    pub cqa: RingH,
    pub cqb: RingH,
    /// The CQ numbers of `cqa` and `cqb`.
    pub cqna: u32,
    pub cqnb: u32,
    pub pda: u32,
    pub pdb: u32,
    /// A's MR (`ka`) over `src` and B's (`kb`) over `dst`; 0 with `no_mrs`.
    pub src: u64,
    pub ka: u32,
    pub dst: u64,
    pub kb: u32,
    /// B's SRQ (with `srq_b`) and its ring.
    pub srq_b: Option<(u32, RingH)>,
    pub link: Link,
    serve_odp: bool,
    patience: Duration,
}

/// The parameters of an `RcPair`; each setter names its default.
pub struct RcPairBuilder {
    a: Option<Node>,
    b: Option<Node>,
    mem_mib: u64,
    eth_mtu: u16,
    qp_type: u32,
    cq_depth: u32,
    mtu: u32,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
    mr_len: Option<(u64, u64)>,
    b_access: u32,
    srq_b: bool,
    link: Option<Link>,
    serve_odp: bool,
    patience: Duration,
}

impl RcPair {
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> RcPairBuilder {
        RcPairBuilder {
            a: None,
            b: None,
            mem_mib: 16,
            eth_mtu: 1500,
            qp_type: VRDMA_QPT_RC,
            cq_depth: 256,
            mtu: 3,
            timeout: 14,
            retry: 7,
            rnr_retry: 7,
            mr_len: Some((65536, 65536)),
            b_access: ACC_ALL,
            srq_b: false,
            link: None,
            serve_odp: false,
            patience: Duration::from_secs(30),
        }
    }

    /// Post `w` on A's send queue (doorbell included).
    pub fn post(&mut self, w: &Wqe) {
        self.a.post_send(&mut self.qa, w);
    }

    /// Post `w` on B's send queue (doorbell included).
    pub fn post_b(&mut self, w: &Wqe) {
        self.b.post_send(&mut self.qb, w);
    }

    /// Post a receive of `len` bytes at `dst + off` (B's MR) on B's RQ.
    pub fn recv_b(&mut self, wr_id: u64, off: u64, len: u32) {
        let rq = self.qb.rq.as_mut().expect("B has an RQ");
        self.b
            .post_recv(rq, wr_id, &[(self.dst + off, len, self.kb)]);
    }

    /// Post a receive of `sges` on B's RQ.
    pub fn post_recv_b(&mut self, wr_id: u64, sges: &[(u64, u32, u32)]) {
        let rq = self.qb.rq.as_mut().expect("B has an RQ");
        self.b.post_recv(rq, wr_id, sges);
    }

    /// Post a receive of `len` bytes at `src + off` (A's MR) on A's RQ.
    pub fn recv_a(&mut self, wr_id: u64, off: u64, len: u32) {
        let rq = self.qa.rq.as_mut().expect("A has an RQ");
        self.a
            .post_recv(rq, wr_id, &[(self.src + off, len, self.ka)]);
    }

    /// Pump the link until A's CQ gave `n` new completions (B's CQ is left alone), failing
    /// after `patience`; returns them.
    pub fn wait_a(&mut self, n: usize) -> Vec<Cqe> {
        let patience = self.patience;
        pump_cqes(
            &mut self.a,
            &mut self.b,
            &mut self.link,
            &mut self.cqa,
            n,
            patience,
        )
    }

    /// A pinned MR over `len` fresh bytes of `side` (iova == GPA, all access); returns (GPA, key).
    pub fn mr(&mut self, side: Side, len: u64) -> (u64, u32) {
        let (n, pd) = match side {
            Side::A => (&mut self.a, self.pda),
            Side::B => (&mut self.b, self.pdb),
        };
        let gpa = n.alloc(len);
        (gpa, n.reg_mr(pd, gpa, len, ACC_ALL))
    }

    /// Pump the link until A has `na` and B `nb` new completions (failing after `patience`);
    /// returns them.
    pub fn wait(&mut self, na: usize, nb: usize) -> (Vec<Cqe>, Vec<Cqe>) {
        let (mut ga, mut gb) = (Vec::new(), Vec::new());
        let (cqa, cqb, odp) = (&mut self.cqa, &mut self.cqb, self.serve_odp);
        pump_until(
            &mut self.a,
            &mut self.b,
            &mut self.link,
            self.patience,
            |a, b| {
                if odp {
                    a.answer_page_requests();
                    b.answer_page_requests();
                }
                ga.extend(a.poll_cq(cqa));
                gb.extend(b.poll_cq(cqb));
                ga.len() >= na && gb.len() >= nb
            },
        );
        (ga, gb)
    }
}

impl RcPairBuilder {
    setters! {
        /// Guest memory of each default node in MiB (default 16).
        mem_mib: u64;
        /// Ethernet MTU of the default nodes (default 1500).
        eth_mtu: u16;
        /// QP type of both QPs (default RC; UC works too).
        qp_type: u32;
        /// Depth of both CQs (default 256).
        cq_depth: u32;
        /// Path MTU as the IBTA enum (default 3 = 1024).
        mtu: u32;
        /// Local ACK timeout exponent (default 14: 67 ms).
        timeout: u8;
        /// Retry count (default 7).
        retry: u8;
        /// RNR retry count (default 7 = infinite).
        rnr_retry: u8;
        /// Access flags of B's MR (default `ACC_ALL`).
        b_access: u32;
        /// How long `wait` may pump before the test fails (default 30 s).
        patience: Duration;
    }

    /// Use these nodes (default: `Node::new(1|2, mem_mib, eth_mtu)`).
    pub fn nodes(mut self, a: Node, b: Node) -> Self {
        (self.a, self.b) = (Some(a), Some(b));
        self
    }

    /// Use this node as B (default: `Node::new(2, mem_mib, eth_mtu)`).
    pub fn node_b(mut self, b: Node) -> Self {
        self.b = Some(b);
        self
    }

    /// Sizes of A's `src` and B's `dst` MRs (default 64 KiB each).
    pub fn mrs(mut self, src_len: u64, dst_len: u64) -> Self {
        self.mr_len = Some((src_len, dst_len));
        self
    }

    /// Register no MRs (`src`, `dst`, `ka`, `kb` stay 0).
    pub fn no_mrs(mut self) -> Self {
        self.mr_len = None;
        self
    }

    /// Put B's QP on an SRQ (depth 64, 4 SGEs) instead of an RQ.
    pub fn srq_b(mut self) -> Self {
        self.srq_b = true;
        self
    }

    /// The link between the nodes (default `Link::clean()`).
    pub fn link(mut self, l: Link) -> Self {
        self.link = Some(l);
        self
    }

    /// Let `wait` answer ODP page requests on both nodes like the driver would.
    pub fn serve_odp(mut self) -> Self {
        self.serve_odp = true;
        self
    }

    pub fn build(self) -> RcPair {
        let a = self
            .a
            .unwrap_or_else(|| Node::new(1, self.mem_mib, self.eth_mtu));
        let b = self
            .b
            .unwrap_or_else(|| Node::new(2, self.mem_mib, self.eth_mtu));
        let (mut a, mut b, pda, pdb) = Sides::of(a, b).parts();
        let srq_b = self.srq_b.then(|| b.create_srq(pdb, 64, 4, 0));
        let rts = RtsAttrs {
            mtu: self.mtu,
            timeout: self.timeout,
            retry: self.retry,
            rnr_retry: self.rnr_retry,
        };
        let spec = QpPairSpec {
            qp_type: self.qp_type,
            srq_b: srq_b.as_ref().map(|s| s.0),
            ..QpPairSpec::rc(self.cq_depth, rts)
        };
        let QpPair {
            qa,
            qb,
            cqa,
            cqb,
            cqna: ca,
            cqnb: cb,
        } = QpPair::open(&mut a, &mut b, pda, pdb, spec);
        let (mut src, mut ka, mut dst, mut kb) = (0, 0, 0, 0);
        if let Some((sl, dl)) = self.mr_len {
            src = a.alloc(sl);
            dst = b.alloc(dl);
            ka = a.reg_mr(pda, src, sl, ACC_ALL);
            kb = b.reg_mr(pdb, dst, dl, self.b_access);
        }
        RcPair {
            a,
            b,
            qa,
            qb,
            cqa,
            cqb,
            cqna: ca,
            cqnb: cb,
            pda,
            pdb,
            src,
            ka,
            dst,
            kb,
            srq_b,
            link: self.link.unwrap_or_else(Link::clean),
            serve_odp: self.serve_odp,
            patience: self.patience,
        }
    }
}
