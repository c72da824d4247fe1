//! One RC connection between two nodes with a patterned source MR on one side and a
//! destination MR on the other: what the multi-connection engine tests and benches write over.

use super::{pattern, MrPair, Node, QpH, QpPair, QpPairSpec, RingH, RtsAttrs};

/// See the module documentation.
pub struct WriteConn {
    pub qa: QpH,
    pub cqa: RingH,
    pub src: u64,
    pub dst: u64,
    pub ka: u32,
    pub kb: u32,
    pub len: u64,
    /// What `src` holds (pattern `seed`).
    pub data: Vec<u8>,
}

impl WriteConn {
    /// A PD, CQ (256) and RC QP on each side, connected, and a `len`-byte MR on each: a's
    /// filled with pattern `seed`.
    pub fn new(a: &mut Node, b: &mut Node, len: u64, seed: u64) -> WriteConn {
        let pda = a.create_pd();
        let pdb = b.create_pd();
        let QpPair { qa, cqa, .. } =
            QpPair::open(a, b, pda, pdb, QpPairSpec::rc(256, RtsAttrs::mtu(5)));
        let MrPair { src, ka, dst, kb } = MrPair::new(a, b, pda, pdb, len);
        let data = pattern(seed, len as usize);
        a.write(src, &data);
        WriteConn {
            qa,
            cqa,
            src,
            dst,
            ka,
            kb,
            len,
            data,
        }
    }
}
