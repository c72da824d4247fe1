//! The base of every two-node fixture: `Sides` (nodes 1 and 2 with a PD each) and `QpPair` (a
//! CQ per side and a connected QP pair). `RcPair`, `WriteConn`, `HealthyPair`, `FabricRc` and
//! `odp::Pair` add their MRs, links and harnesses on top.

use vrdma_spec::*;

use super::{connect, Node, QpH, QpSpec, RingH};

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

/// The attributes `connect` sets on the way to RTS besides the peer: path MTU (IBTA enum),
/// local ACK timeout, retry and RNR retry counts.
#[derive(Debug, Clone, Copy)]
pub struct RtsAttrs {
    pub mtu: u32,
    pub timeout: u8,
    pub retry: u8,
    pub rnr_retry: u8,
}

impl RtsAttrs {
    /// Path MTU enum `mtu`, timeout 14 (67 ms: robust against a loaded host starving an engine
    /// thread), retry and RNR retry 7 (infinite RNR retry).
    pub fn mtu(mtu: u32) -> RtsAttrs {
        RtsAttrs {
            mtu,
            timeout: 14,
            retry: 7,
            rnr_retry: 7,
        }
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
    pub rts: RtsAttrs,
}

impl QpPairSpec {
    /// RC QPs with CQs of `cq_depth`, connected with `rts`.
    pub fn rc(cq_depth: u32, rts: RtsAttrs) -> QpPairSpec {
        QpPairSpec {
            qp_type: VRDMA_QPT_RC,
            cq_depth,
            srq_b: None,
            rts,
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
    /// A CQ on each side, then a QP on each in PDs `pda` and `pdb`, connected.
    pub fn open(a: &mut Node, b: &mut Node, pda: u32, pdb: u32, spec: QpPairSpec) -> QpPair {
        let (cqna, cqa) = a.create_cq(spec.cq_depth);
        let (cqnb, cqb) = b.create_cq(spec.cq_depth);
        let qa = a.create_qp(QpSpec {
            qp_type: spec.qp_type,
            ..QpSpec::rc(pda, cqna)
        });
        let qb = b.create_qp(QpSpec {
            qp_type: spec.qp_type,
            srq: spec.srq_b,
            ..QpSpec::rc(pdb, cqnb)
        });
        let r = spec.rts;
        connect(a, &qa, b, &qb, r.mtu, r.timeout, r.retry, r.rnr_retry);
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
