//! Two nodes on one in-process fabric with a connected QP between them and one patterned MR
//! each: what the fabric tests start from before they choose their ports and engines.

use std::path::Path;
use std::sync::Arc;

use vrdma_backend::fabric::{Fabric, FabricBuilder, PortId};

use super::{pattern, MrPair, Node, QpH, QpPair, QpPairSpec, RingH, RtsAttrs, Sides};

/// See the module documentation.
pub struct FabricRc {
    pub a: Node,
    pub b: Node,
    pub qa: QpH,
    pub cqa: RingH,
    pub cqb: RingH,
    pub rqb: RingH,
    pub pda: u32,
    /// a's MR (pattern 7) and b's (pattern 8), `len` bytes each, every access allowed.
    pub src: u64,
    pub dst: u64,
    pub ka: u32,
    pub kb: u32,
    pub fabric: Arc<Fabric>,
    pub pa: PortId,
    pub pb: PortId,
}

impl FabricRc {
    /// `qp_type` (RC, UC) on both sides, path MTU enum `mtu`, retransmit `timeout` (retry and
    /// rnr_retry 7), CQs of `cq_depth`, `len`-byte MRs, and a capture of the fabric if asked.
    pub fn new(
        qp_type: u32,
        mtu: u32,
        timeout: u8,
        cq_depth: u32,
        len: u64,
        capture: Option<&Path>,
    ) -> FabricRc {
        let (mut a, mut b, pda, pdb) = Sides::new(32, 9000).parts();
        let spec = QpPairSpec {
            qp_type,
            ..QpPairSpec::rc(cq_depth, RtsAttrs::mtu(mtu).timeout(timeout))
        };
        let QpPair {
            qa, qb, cqa, cqb, ..
        } = QpPair::open(&mut a, &mut b, pda, pdb, spec);
        let rqb = qb.rq.clone().expect("an RQ");
        let MrPair { src, ka, dst, kb } = MrPair::new(&mut a, &mut b, pda, pdb, len);
        a.write(src, &pattern(7, len as usize));
        b.write(dst, &pattern(8, len as usize));
        let mut fb = FabricBuilder::new();
        if let Some(p) = capture {
            // A capture is never written over (spec §16.5): start from no file.
            let _ = std::fs::remove_file(p);
            fb.capture(vrdma_backend::uplink::PcapWriter::create(p, None).expect("pcap"));
        }
        let pa = fb.add_device(a.mac).unwrap();
        let pb = fb.add_device(b.mac).unwrap();
        FabricRc {
            fabric: fb.build(),
            a,
            b,
            qa,
            cqa,
            cqb,
            rqb,
            pda,
            src,
            dst,
            ka,
            kb,
            pa,
            pb,
        }
    }
}

/// One completion: wr_id, status, opcode, byte_len.
pub type C = (u64, u8, u8, u32);
/// The send completions at a and the receive completions at b.
pub type Cqes = (Vec<C>, Vec<C>);

/// Poll until a's CQ gave `n` completions and b's `m` (30 s at most).
pub fn wait_both_cqes(
    a: &mut Node,
    cqa: &mut RingH,
    b: &mut Node,
    cqb: &mut RingH,
    n: usize,
    m: usize,
) -> Cqes {
    let key = |c: &vrdma_backend::transport::ctx::Cqe| (c.wr_id, c.status, c.opcode, c.byte_len);
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let t0 = std::time::Instant::now();
    while sa.len() < n || sb.len() < m {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "completions missing: {sa:?} {sb:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
        sa.extend(a.poll_cq(cqa).iter().map(key));
        sb.extend(b.poll_cq(cqb).iter().map(key));
    }
    (sa, sb)
}
