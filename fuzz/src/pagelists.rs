//! Target `pagelist`: guest page lists (spec §9, §10, §5) from the input, then traffic through
//! what they describe.
//!
//! Input: `mode u8`, then the mode's fields, then a page list of `count u8 % 64` entries, each
//! `e u16`: bit 15 set → a raw u64 GPA follows; clear → guest page `BASE + 4 KiB * (e & 0x7ff)`
//! plus `(e >> 11 & 0xf) * 256` (misaligned entries). Modes (`mode % 3`):
//! - 0 REG_MR command on b: `access u32, iova u64, length u64, page_shift u8, npages_delta u8`,
//!   then a WRITEs `wlen u16` bytes at `iova + off u32` through the new rkey and READs them back;
//! - 1 fast registration on b: `max_sg u8, access u32, iova u64, length u64, page_shift u8,
//!   variant u8`, ALLOC_FAST_REG_MR, the page list in b's memory, a REG_MR WQE on b's RC SQ,
//!   then the same WRITE/READ from a;
//! - 2 ring page lists: `cq_depth u16, sq_depth u16, rq_depth u16, shifts u8` and three page
//!   lists (CQ, SQ, RQ), a CQ and a UD QP on b on those rings, brought to RTS; a sends it UD SENDs and b posts a
//!   receive and a send through its rings.

use vrdma_spec::*;

use crate::bed::{Bed, QKEY};
use crate::common::{ud_rts, QpH, RingH, Wqe, BASE};
use crate::Input;

fn page_list(inp: &mut Input) -> Vec<u64> {
    let n = inp.u8() % 64;
    (0..n)
        .map(|_| {
            let e = inp.u16();
            if e & 0x8000 != 0 {
                inp.u64()
            } else {
                BASE + 4096 * u64::from(e & 0x7ff) + 256 * u64::from((e >> 11) & 0xf)
            }
        })
        .collect()
}

fn cmd_with_pages(bed: &mut Bed, op: u16, head: &[u8], pages: &[u64]) -> Result<Vec<u8>, u32> {
    let mut b = head.to_vec();
    for p in pages {
        b.extend_from_slice(&p.to_le_bytes());
    }
    let r = bed.b.cmd(op, &b);
    if crate::trace() {
        eprintln!("pagelist: opcode {op}, {} pages -> {r:?}", pages.len());
    }
    r
}

/// a WRITEs `len` bytes to `[addr, addr + len)` of rkey `rkey` on b, then READs them back.
fn write_read(bed: &mut Bed, rkey: u32, addr: u64, len: u32) {
    let len = len.min(16384);
    let (src, ka) = (bed.src, bed.ka);
    let mut qa = bed.qa[0].clone();
    for (op, at) in [
        (VRDMA_WR_RDMA_WRITE, src),
        (VRDMA_WR_RDMA_READ, src + 32768),
    ] {
        bed.a.post_send(
            &mut qa,
            &Wqe {
                wr_id: u64::from(op),
                opcode: op,
                flags: VRDMA_SEND_SIGNALED,
                sges: vec![(at, len, ka)],
                remote_addr: addr,
                rkey,
                ..Default::default()
            },
        );
    }
    bed.qa[0] = qa;
    bed.settle(1);
    if crate::trace() {
        eprintln!("pagelist: a's completions: {:?}", bed.cqes_a);
    }
}

fn reg_mr(bed: &mut Bed, inp: &mut Input) {
    let (access, iova, length) = (inp.u32(), inp.u64(), inp.u64());
    let (page_shift, delta) = (u32::from(inp.u8()), inp.u8());
    let (off, wlen) = (inp.u32(), u32::from(inp.u16()));
    let pages = page_list(inp);
    let c = VrdmaCmdRegMr {
        pdn: bed.pdb,
        access,
        iova,
        length,
        page_shift,
        npages: (pages.len() as u32).wrapping_add(u32::from(delta) & 3),
    };
    let Ok(r) = cmd_with_pages(bed, VRDMA_CMD_REG_MR, c.as_bytes(), &pages) else {
        return;
    };
    let Some(resp) = VrdmaRespRegMr::read_from(&r) else {
        panic!("REG_MR OK with a {}-byte response", r.len());
    };
    write_read(bed, resp.rkey, iova.wrapping_add(u64::from(off)), wlen);
}

fn fast_reg(bed: &mut Bed, inp: &mut Input) {
    let max_sg = u32::from(inp.u8());
    let (access, iova, length) = (inp.u32(), inp.u64(), inp.u64());
    let (page_shift, variant) = (u32::from(inp.u8()), inp.u8());
    let (off, wlen) = (inp.u32(), u32::from(inp.u16()));
    let pages = page_list(inp);
    let c = VrdmaCmdRegMr {
        pdn: bed.pdb,
        access: 0,
        iova: 0,
        length: 0,
        page_shift: 12,
        npages: max_sg,
    };
    let Ok(r) = bed.b.cmd(VRDMA_CMD_ALLOC_FAST_REG_MR, c.as_bytes()) else {
        return;
    };
    let Some(resp) = VrdmaRespRegMr::read_from(&r) else {
        panic!("ALLOC_FAST_REG_MR OK with a {}-byte response", r.len());
    };
    // The page list sits in b's memory, right after its MR's upper canary page.
    let plist = bed.b.alloc(64 * 8);
    let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    bed.b.write(plist, &bytes);
    let key = (resp.lkey & !0xff) | u32::from(variant);
    let mut qb = bed.qb[0].clone();
    bed.b.post_send(
        &mut qb,
        &Wqe {
            wr_id: 77,
            opcode: VRDMA_WR_REG_MR,
            flags: VRDMA_SEND_SIGNALED,
            reg: Some((
                iova,
                length,
                key,
                access,
                pages.len() as u32,
                page_shift,
                plist,
            )),
            ..Default::default()
        },
    );
    bed.qb[0] = qb;
    bed.settle(0);
    write_read(bed, key, iova.wrapping_add(u64::from(off)), wlen);
}

fn rings(bed: &mut Bed, inp: &mut Input) {
    let (cq_depth, sq_depth, rq_depth) = (inp.u16(), inp.u16(), inp.u16());
    let shifts = inp.u8();
    let (cq_pages, sq_pages, rq_pages) = (page_list(inp), page_list(inp), page_list(inp));
    let cq = VrdmaCmdCreateCq {
        cqn: 0,
        depth: u32::from(cq_depth),
        npages: cq_pages.len() as u32,
        reserved: 0,
    };
    let Ok(r) = cmd_with_pages(bed, VRDMA_CMD_CREATE_CQ, cq.as_bytes(), &cq_pages) else {
        return;
    };
    let Some(cqn) = VrdmaHandle::read_from(&r).map(|h| h.handle) else {
        panic!("CREATE_CQ OK with a {}-byte response", r.len());
    };
    let (sq_shift, rq_shift) = (6 + (shifts & 7), 5 + ((shifts >> 3) & 7));
    let c = VrdmaCmdCreateQp {
        pdn: bed.pdb,
        qp_type: VRDMA_QPT_UD,
        send_cqn: cqn,
        recv_cqn: cqn,
        srqn: VRDMA_NO_SRQ,
        sq_depth: u32::from(sq_depth),
        rq_depth: u32::from(rq_depth),
        sq_wqe_shift: sq_shift,
        rq_wqe_shift: rq_shift,
        sq_sig_all: 1,
        reserved0: 0,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
        sq_npages: sq_pages.len() as u32,
        rq_npages: rq_pages.len() as u32,
        xrcdn: 0,
    };
    let pages = [sq_pages.as_slice(), rq_pages.as_slice()].concat();
    let Ok(r) = cmd_with_pages(bed, VRDMA_CMD_CREATE_QP, c.as_bytes(), &pages) else {
        return;
    };
    let Some(qpn) = VrdmaRespCreateQp::read_from(&r).map(|q| q.qpn) else {
        panic!("CREATE_QP OK with a {}-byte response", r.len());
    };
    let ring = |pages: &[u64], depth: u16, shift: u8| RingH {
        pages: pages.to_vec(),
        depth: u32::from(depth.max(1)).next_power_of_two(),
        shift: u32::from(shift),
        idx: 0,
    };
    let mut q = QpH {
        qpn,
        qp_type: VRDMA_QPT_UD,
        sq: ring(&sq_pages, sq_depth, sq_shift),
        rq: Some(ring(&rq_pages, rq_depth, rq_shift)),
    };
    ud_rts(&mut bed.b, &q, QKEY);
    // The fixtures write ring entries at the GPAs the list names; only do that where the
    // list points into guest memory (the device already accepted it).
    let in_mem = |r: &RingH, m: &crate::common::Node| {
        r.pages.len() >= 2 && r.pages.iter().all(|&p| m.mem.check_range(p, 4096))
    };
    let (dst, kb) = (bed.dst, bed.kb);
    if let Some(mut rq) = q.rq.clone().filter(|r| in_mem(r, &bed.b)) {
        bed.b.post_recv(&mut rq, 9, &[(dst, 4096, kb)]);
    }
    let (src, ka, ah) = (bed.src, bed.ka, bed.ah);
    let mut ua = bed.qa[2].clone();
    bed.a.post_send(
        &mut ua,
        &Wqe {
            wr_id: 8,
            opcode: VRDMA_WR_SEND,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src, 256, ka)],
            ah,
            remote_qpn: qpn,
            remote_qkey: QKEY,
            ..Default::default()
        },
    );
    bed.qa[2] = ua;
    if in_mem(&q.sq, &bed.b) && q.sq.shift >= 7 {
        let bah = bed.b.create_ah(bed.pdb, bed.b.av_to(&bed.a));
        let w = Wqe {
            wr_id: 10,
            opcode: VRDMA_WR_SEND,
            sges: vec![(dst, 128, kb)],
            ah: bah,
            remote_qpn: bed.qa[2].qpn,
            remote_qkey: QKEY,
            ..Default::default()
        };
        bed.b.post_send(&mut q, &w);
    }
    bed.settle(1);
}

pub fn run(data: &[u8]) {
    let mut bed = Bed::new();
    let mut inp = Input::new(data);
    match inp.u8() % 3 {
        0 => reg_mr(&mut bed, &mut inp),
        1 => fast_reg(&mut bed, &mut inp),
        _ => rings(&mut bed, &mut inp),
    }
    // No canary check: a page list may name any page of b, the canaries' included.
}
