//! Send WQEs as the driver writes them into an SQ slot, and constructors for the common ones.

use vrdma_spec::*;

/// A send WQE to post.
#[derive(Debug, Clone, Default)]
pub struct Wqe {
    pub wr_id: u64,
    pub opcode: u8,
    pub flags: u8,
    pub ex: u32,
    pub sges: Vec<(u64, u32, u32)>,
    pub inline: Option<Vec<u8>>,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    pub ah: u32,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// REG_MR fields: iova, length, key, access, page_list_len, page_shift, page_list_addr.
    pub reg: Option<(u64, u64, u32, u32, u32, u32, u64)>,
    /// Override num_sge (error tests).
    pub num_sge: Option<u8>,
    /// FLUSH placement type and selectivity level (`wr.flush`; its length is `compare_add`).
    /// ATOMIC_WRITE needs no field: its 8 data bytes are `compare_add` in little-endian order.
    pub flush: Option<(u8, u8)>,
    /// BIND_MW: `wr.bind_mw` (spec §12.8).
    pub bind: Option<VrdmaWqeBindMw>,
}

impl Wqe {
    pub fn bytes(&self, slot: usize, ud: bool) -> Vec<u8> {
        let mut b = vec![0u8; slot];
        b[0..8].copy_from_slice(&self.wr_id.to_le_bytes());
        b[8] = self.opcode;
        b[9] = self.flags;
        b[10] = self.num_sge.unwrap_or(self.sges.len() as u8);
        b[12..16].copy_from_slice(&self.ex.to_le_bytes());
        if ud {
            b[24..28].copy_from_slice(&self.ah.to_le_bytes());
            b[28..32].copy_from_slice(&self.remote_qpn.to_le_bytes());
            b[32..36].copy_from_slice(&self.remote_qkey.to_le_bytes());
        } else if let Some(bm) = &self.bind {
            b[24..64].copy_from_slice(bm.as_bytes());
        } else if let Some((iova, len, key, acc, pll, ps, pla)) = self.reg {
            b[24..32].copy_from_slice(&iova.to_le_bytes());
            b[32..40].copy_from_slice(&len.to_le_bytes());
            b[40..44].copy_from_slice(&key.to_le_bytes());
            b[44..48].copy_from_slice(&acc.to_le_bytes());
            b[48..52].copy_from_slice(&pll.to_le_bytes());
            b[52..56].copy_from_slice(&ps.to_le_bytes());
            b[56..64].copy_from_slice(&pla.to_le_bytes());
        } else {
            b[24..32].copy_from_slice(&self.remote_addr.to_le_bytes());
            b[32..36].copy_from_slice(&self.rkey.to_le_bytes());
            b[40..48].copy_from_slice(&self.compare_add.to_le_bytes());
            b[48..56].copy_from_slice(&self.swap.to_le_bytes());
            if let Some((placement, selectivity)) = self.flush {
                b[36] = placement;
                b[37] = selectivity;
            }
        }
        if let Some(d) = &self.inline {
            b[9] |= VRDMA_SEND_INLINE;
            b[16..20].copy_from_slice(&(d.len() as u32).to_le_bytes());
            let n = d.len().min(slot - 64);
            b[64..64 + n].copy_from_slice(&d[..n]);
        } else {
            for (i, (a, l, k)) in self.sges.iter().enumerate() {
                let o = 64 + i * 16;
                if o + 16 > slot {
                    break;
                }
                b[o..o + 8].copy_from_slice(&a.to_le_bytes());
                b[o + 8..o + 12].copy_from_slice(&l.to_le_bytes());
                b[o + 12..o + 16].copy_from_slice(&k.to_le_bytes());
            }
        }
        b
    }
}

/// A signaled RDMA WRITE / READ of one SGE `(addr, len, lkey)` to `raddr` / `rkey`.
pub fn rdma(wr_id: u64, opcode: u8, sge: (u64, u32, u32), raddr: u64, rkey: u32) -> Wqe {
    Wqe {
        wr_id,
        opcode,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![sge],
        remote_addr: raddr,
        rkey,
        ..Default::default()
    }
}

/// A signaled SEND of one SGE `(addr, len, lkey)`.
pub fn send(wr_id: u64, sge: (u64, u32, u32)) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_SEND,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![sge],
        ..Default::default()
    }
}

/// A signaled ATOMIC FETCH_AND_ADD of `add` at `raddr` / `rkey`; the old value lands in `sge`.
pub fn fetch_add(wr_id: u64, sge: (u64, u32, u32), raddr: u64, rkey: u32, add: u64) -> Wqe {
    Wqe {
        compare_add: add,
        ..rdma(wr_id, VRDMA_WR_ATOMIC_FETCH_AND_ADD, sge, raddr, rkey)
    }
}

/// A signaled ATOMIC CMP_AND_SWP at `raddr` / `rkey` (`swap` stored if the value is
/// `compare`); the old value lands in `sge`.
pub fn cmp_swap(
    wr_id: u64,
    sge: (u64, u32, u32),
    raddr: u64,
    rkey: u32,
    compare: u64,
    swap: u64,
) -> Wqe {
    Wqe {
        compare_add: compare,
        swap,
        ..rdma(wr_id, VRDMA_WR_ATOMIC_CMP_AND_SWP, sge, raddr, rkey)
    }
}

/// A signaled SEND whose payload `data` is inline in the WQE.
pub fn send_inline(wr_id: u64, data: &[u8]) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_SEND,
        flags: VRDMA_SEND_SIGNALED,
        inline: Some(data.to_vec()),
        ..Default::default()
    }
}
