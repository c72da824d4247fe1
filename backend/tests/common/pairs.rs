//! The base of every two-node fixture: `Sides` (nodes 1 and 2 with a PD each) and `QpPair` (a
//! CQ per side and a connected QP pair). `RcPair`, `WriteConn`, `HealthyPair`, `FabricRc` and
//! `odp::Pair` add their MRs, links and harnesses on top.

use vrdma_spec::*;

use super::{connect, ud_rts, Node, QpH, QpSpec, RingH, RtsAttrs, ACC_ALL};

/// Nodes 1 and 2 with a PD each.
pub struct Sides {
    pub a: Node,
    pub b: Node,
    pub pda: u32,
    pub pdb: u32,
}

impl Sides {
    /// Nodes 1 and 2 with `mem_mib` MiB of guest memory and Ethernet MTU `eth_mtu` each.
    pub fn new(mem_mib: u64, eth_mtu: u16) -> Sides {
        let a = Node::new(1, mem_mib, eth_mtu);
        let b = Node::new(2, mem_mib, eth_mtu);
        Sides::of(a, b)
    }

    /// A PD on each of `a` and `b`.
    pub fn of(mut a: Node, mut b: Node) -> Sides {
        let pda = a.create_pd();
        let pdb = b.create_pd();
        Sides { a, b, pda, pdb }
    }

    /// (a, b, pda, pdb), for a test that goes on with them as locals.
    pub fn parts(self) -> (Node, Node, u32, u32) {
        (self.a, self.b, self.pda, self.pdb)
    }
}

/// How a `QpPair` is opened.
#[derive(Debug, Clone, Copy)]
pub struct QpPairSpec {
    /// RC or UC, on both sides.
    pub qp_type: u32,
    pub cq_depth: u32,
    /// B's QP takes its receives from this SRQ instead of an RQ.
    pub srq_b: Option<u32>,
    /// How RC and UC QPs are connected.
    pub rts: RtsAttrs,
    /// The Q_Key of UD and GSI QPs, which are taken to RTS each on its own (`ud_rts`).
    pub qkey: u32,
}

impl QpPairSpec {
    /// RC QPs with CQs of `cq_depth`, connected with `rts`.
    pub fn rc(cq_depth: u32, rts: RtsAttrs) -> QpPairSpec {
        QpPairSpec {
            qp_type: VRDMA_QPT_RC,
            cq_depth,
            srq_b: None,
            rts,
            qkey: 0,
        }
    }

    /// UD or GSI QPs (`qp_type`) with CQs of `cq_depth`, each in RTS with Q_Key `qkey`.
    pub fn datagram(qp_type: u32, cq_depth: u32, qkey: u32) -> QpPairSpec {
        QpPairSpec {
            qp_type,
            qkey,
            ..QpPairSpec::rc(cq_depth, RtsAttrs::mtu(3))
        }
    }
}

/// A connected QP pair (`QpSpec::rc` sizes) with a CQ per side.
pub struct QpPair {
    pub qa: QpH,
    pub qb: QpH,
    pub cqa: RingH,
    pub cqb: RingH,
    /// The CQ numbers of `cqa` and `cqb`.
    pub cqna: u32,
    pub cqnb: u32,
}

impl QpPair {
    /// A CQ on each side, then a QP on each in PDs `pda` and `pdb`, connected (or, UD and GSI,
    /// each in RTS).
    pub fn open(a: &mut Node, b: &mut Node, pda: u32, pdb: u32, spec: QpPairSpec) -> QpPair {
        let (cqna, cqa) = a.create_cq(spec.cq_depth);
        let (cqnb, cqb) = b.create_cq(spec.cq_depth);
        let qa = a.create_qp(QpSpec::of_type(spec.qp_type, pda, cqna));
        let qb = b.create_qp(QpSpec {
            qp_type: spec.qp_type,
            srq: spec.srq_b,
            ..QpSpec::rc(pdb, cqnb)
        });
        if matches!(spec.qp_type, VRDMA_QPT_UD | VRDMA_QPT_GSI) {
            ud_rts(a, &qa, spec.qkey);
            ud_rts(b, &qb, spec.qkey);
        } else {
            connect(a, &qa, b, &qb, spec.rts);
        }
        QpPair {
            qa,
            qb,
            cqa,
            cqb,
            cqna,
            cqnb,
        }
    }
}

/// A `len`-byte MR with every access on each side: A's `src` (key `ka`), B's `dst` (key `kb`).
pub struct MrPair {
    pub src: u64,
    pub ka: u32,
    pub dst: u64,
    pub kb: u32,
}

impl MrPair {
    /// Allocate `len` bytes on each side and register them in PDs `pda` and `pdb`.
    pub fn new(a: &mut Node, b: &mut Node, pda: u32, pdb: u32, len: u64) -> MrPair {
        let src = a.alloc(len);
        let dst = b.alloc(len);
        let ka = a.reg_mr(pda, src, len, ACC_ALL);
        let kb = b.reg_mr(pdb, dst, len, ACC_ALL);
        MrPair { src, ka, dst, kb }
    }
}
