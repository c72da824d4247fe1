//! Writes the seed corpus `corpus/<target>/` from real commands, WQEs, page lists, frames and
//! chains (`make fuzz-corpus`). With the `fuzzing` feature the handles, QPNs and keys inside
//! them are the ones every execution of the targets sees.

use std::fs;
use std::path::{Path, PathBuf};

use vrdma_fuzz::bed::Bed;
use vrdma_fuzz::common::{Node, Wqe, BASE, BTH};
use vrdma_fuzz::packets::bed_with_traffic;
use vrdma_spec::*;

/// `corpus/<target>/` without its generated seeds; the inputs a campaign kept (`q-*`, written
/// by `make fuzz-cmin`) stay.
fn out_dir(root: &Path, target: &str) -> PathBuf {
    let d = root.join(target);
    fs::create_dir_all(&d).expect("corpus dir");
    for e in fs::read_dir(&d).expect("corpus dir").flatten() {
        if !e.file_name().to_string_lossy().starts_with("q-") {
            fs::remove_file(e.path()).expect("remove seed");
        }
    }
    d
}

fn save_all(root: &Path, target: &str, seeds: Vec<(String, Vec<u8>)>) {
    let dir = out_dir(root, target);
    for (name, data) in seeds {
        save(&dir, &name, &data);
    }
}

fn save(dir: &Path, name: &str, data: &[u8]) {
    fs::write(dir.join(name), data).expect("write seed");
}

/// A control record without patches.
fn rec(op: u16, payload: &[u8]) -> Vec<u8> {
    let mut r = vec![op as u8, 0];
    r.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    r.extend_from_slice(payload);
    r
}

fn with_pages(head: &[u8], pages: &[u64]) -> Vec<u8> {
    let mut b = head.to_vec();
    for p in pages {
        b.extend_from_slice(&p.to_le_bytes());
    }
    b
}

fn control(root: &Path) {
    let dir = out_dir(root, "control");
    // Same device as the target; each command runs so the next can name what it returned.
    let mut n = Node::new(1, 8, 1500);
    let mut seq = Vec::new();
    let mut step = |n: &mut Node, op: u16, p: Vec<u8>| -> Vec<u8> {
        seq.extend_from_slice(&rec(op, &p));
        n.cmd(op, &p).unwrap_or_default()
    };
    let h = |x: u32| {
        VrdmaHandle {
            handle: x,
            reserved: 0,
        }
        .as_bytes()
        .to_vec()
    };
    step(&mut n, VRDMA_CMD_QUERY_DEVICE, vec![]);
    step(&mut n, VRDMA_CMD_QUERY_PORT, vec![1, 0, 0, 0, 0, 0, 0, 0]);
    let pd = VrdmaHandle::read_from(&step(&mut n, VRDMA_CMD_CREATE_PD, vec![0; 8]))
        .map_or(0, |h| h.handle);
    let cq = VrdmaCmdCreateCq {
        cqn: 0,
        depth: 64,
        npages: 2,
        reserved: 0,
    };
    let cqn = VrdmaHandle::read_from(&step(
        &mut n,
        VRDMA_CMD_CREATE_CQ,
        with_pages(cq.as_bytes(), &[BASE + 0x10000, BASE + 0x11000]),
    ))
    .map_or(0, |h| h.handle);
    let qp = VrdmaCmdCreateQp {
        pdn: pd,
        qp_type: VRDMA_QPT_RC,
        send_cqn: cqn,
        recv_cqn: cqn,
        srqn: VRDMA_NO_SRQ,
        sq_depth: 8,
        rq_depth: 16,
        sq_wqe_shift: 9,
        rq_wqe_shift: 8,
        sq_sig_all: 0,
        reserved0: 0,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
        sq_npages: 2,
        rq_npages: 2,
        xrcdn: 0,
    };
    let pages = [
        BASE + 0x20000,
        BASE + 0x21000,
        BASE + 0x22000,
        BASE + 0x23000,
    ];
    let qpn = VrdmaRespCreateQp::read_from(&step(
        &mut n,
        VRDMA_CMD_CREATE_QP,
        with_pages(qp.as_bytes(), &pages),
    ))
    .map_or(0, |q| q.qpn);
    let mr = VrdmaCmdRegMr {
        pdn: pd,
        access: VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE,
        iova: 0x1000_0000,
        length: 8192,
        page_shift: 12,
        npages: 2,
    };
    let key = VrdmaRespRegMr::read_from(&step(
        &mut n,
        VRDMA_CMD_REG_MR,
        with_pages(mr.as_bytes(), &[BASE + 0x30000, BASE + 0x31000]),
    ))
    .map_or(0, |r| r.lkey);
    let attr = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        qp_access_flags: VRDMA_ACCESS_REMOTE_WRITE,
        port_num: 1,
        ..Default::default()
    };
    let m = VrdmaCmdModifyQp {
        qpn,
        attr_mask: VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS,
        attr,
    };
    step(&mut n, VRDMA_CMD_MODIFY_QP, m.as_bytes().to_vec());
    step(&mut n, VRDMA_CMD_QUERY_QP, h(qpn));
    let srq = VrdmaCmdCreateSrq {
        pdn: pd,
        depth: 16,
        wqe_shift: 8,
        srq_type: 0,
        reserved0: [0; 2],
        xrcdn: 0,
        cqn: 0,
        max_sge: 4,
        srq_limit: 0,
        npages: 2,
    };
    step(
        &mut n,
        VRDMA_CMD_CREATE_SRQ,
        with_pages(srq.as_bytes(), &[BASE + 0x40000, BASE + 0x41000]),
    );
    let ah = VrdmaCmdCreateAh {
        pdn: pd,
        reserved: 0,
        av: VrdmaAv {
            dgid: n.gid,
            hop_limit: 64,
            vlan_id: 0xffff,
            ..Default::default()
        },
    };
    step(&mut n, VRDMA_CMD_CREATE_AH, ah.as_bytes().to_vec());
    let dma = VrdmaCmdRegMr {
        pdn: pd,
        access: VRDMA_ACCESS_LOCAL_WRITE,
        ..Default::default()
    };
    step(&mut n, VRDMA_CMD_REG_DMA_MR, dma.as_bytes().to_vec());
    let fr = VrdmaCmdRegMr {
        pdn: pd,
        npages: 16,
        page_shift: 12,
        ..Default::default()
    };
    step(&mut n, VRDMA_CMD_ALLOC_FAST_REG_MR, fr.as_bytes().to_vec());
    step(&mut n, VRDMA_CMD_DEREG_MR, h(key));
    step(&mut n, VRDMA_CMD_DESTROY_QP, h(qpn));
    step(&mut n, VRDMA_CMD_DESTROY_CQ, h(cqn));
    step(&mut n, VRDMA_CMD_DESTROY_PD, h(pd));
    save(&dir, "lifecycle", &seq);
    // One seed per opcode with a zero payload of the request's usual size.
    for op in 1..=29u16 {
        save(&dir, &format!("op{op:02}"), &rec(op, &[0; 64]));
    }
}

fn wqe_rec(sel: u8, w: &Wqe, ud: bool) -> Vec<u8> {
    let b = w.bytes(512, ud);
    let mut r = vec![sel, 128];
    r.extend_from_slice(&b);
    r
}

fn wqes(root: &Path) {
    let dir = out_dir(root, "wqe");
    let t = Bed::new();
    let (src, ka, dst, kb) = (t.src, t.ka, t.dst, t.kb);
    let base = Wqe {
        wr_id: 1,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(src, 2000, ka)],
        remote_addr: dst,
        rkey: kb,
        ..Default::default()
    };
    let ops = [
        ("write", VRDMA_WR_RDMA_WRITE),
        ("write_imm", VRDMA_WR_RDMA_WRITE_WITH_IMM),
        ("send", VRDMA_WR_SEND),
        ("send_imm", VRDMA_WR_SEND_WITH_IMM),
        ("read", VRDMA_WR_RDMA_READ),
        ("cas", VRDMA_WR_ATOMIC_CMP_AND_SWP),
        ("fadd", VRDMA_WR_ATOMIC_FETCH_AND_ADD),
        ("local_inv", VRDMA_WR_LOCAL_INV),
        ("send_inv", VRDMA_WR_SEND_WITH_INV),
        ("atomic_write", VRDMA_WR_ATOMIC_WRITE),
        ("flush", VRDMA_WR_FLUSH),
    ];
    let mut all = Vec::new();
    for (name, op) in ops {
        let mut w = Wqe {
            opcode: op,
            ..base.clone()
        };
        if matches!(
            op,
            VRDMA_WR_ATOMIC_CMP_AND_SWP | VRDMA_WR_ATOMIC_FETCH_AND_ADD
        ) {
            w.sges = vec![(src, 8, ka)];
            w.compare_add = 3;
        }
        if op == VRDMA_WR_FLUSH {
            w.sges.clear();
            w.compare_add = 4096;
            w.flush = Some((VRDMA_FLUSH_GLOBAL, VRDMA_FLUSH_RANGE));
        }
        if op == VRDMA_WR_LOCAL_INV || op == VRDMA_WR_SEND_WITH_INV {
            w.ex = kb;
        }
        let r = wqe_rec(0, &w, false);
        save(&dir, &format!("rc_{name}"), &r);
        all.extend_from_slice(&r);
    }
    let uc = Wqe {
        opcode: VRDMA_WR_RDMA_WRITE_WITH_IMM,
        ..base.clone()
    };
    save(&dir, "uc_write_imm", &wqe_rec(1, &uc, false));
    let ud = Wqe {
        opcode: VRDMA_WR_SEND,
        sges: vec![(src, 1000, ka)],
        ah: t.ah,
        remote_qpn: t.qb[2].qpn,
        remote_qkey: vrdma_fuzz::bed::QKEY,
        ..base.clone()
    };
    save(&dir, "ud_send", &wqe_rec(2, &ud, true));
    let inline = Wqe {
        opcode: VRDMA_WR_SEND,
        sges: vec![],
        inline: Some(vec![0x5a; 100]),
        ..base.clone()
    };
    save(&dir, "rc_send_inline", &wqe_rec(0, &inline, false));
    // b's peer WRITEs into a's MR, then a timer round.
    let back = Wqe {
        opcode: VRDMA_WR_RDMA_WRITE,
        sges: vec![],
        remote_addr: src,
        rkey: ka,
        ..base.clone()
    };
    save(&dir, "b_write_timers", &wqe_rec(0x40 | 0x80, &back, false));
    save(&dir, "rc_all", &all);
}

fn pagelists(root: &Path) {
    let dir = out_dir(root, "pagelist");
    let list = |first: u16, n: u8| {
        let mut v = vec![n];
        for i in 0..u16::from(n) {
            v.extend_from_slice(&(first + i).to_le_bytes());
        }
        v
    };
    let acc = (VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_READ)
        .to_le_bytes();
    // REG_MR of 4 pages at iova 0x7000_0000, WRITE/READ 6000 bytes at +100.
    let mut s = vec![0];
    s.extend_from_slice(&acc);
    s.extend_from_slice(&0x7000_0000u64.to_le_bytes());
    s.extend_from_slice(&16384u64.to_le_bytes());
    s.extend_from_slice(&[12, 0]);
    s.extend_from_slice(&100u32.to_le_bytes());
    s.extend_from_slice(&6000u16.to_le_bytes());
    s.extend_from_slice(&list(1024, 4));
    save(&dir, "reg_mr", &s);
    // Fast registration of the same pages.
    let mut s = vec![1, 16];
    s.extend_from_slice(&acc);
    s.extend_from_slice(&0x7000_0000u64.to_le_bytes());
    s.extend_from_slice(&16384u64.to_le_bytes());
    s.extend_from_slice(&[12, 0x11]);
    s.extend_from_slice(&100u32.to_le_bytes());
    s.extend_from_slice(&6000u16.to_le_bytes());
    s.extend_from_slice(&list(1024, 4));
    save(&dir, "fast_reg", &s);
    // Rings: CQ of 64 entries, SQ 8 x 512 B, RQ 16 x 256 B (ctrl page + 1 page each).
    for (name, cq_depth, cq_pages) in [("rings", 64u16, 2u8), ("rings_cq128", 128, 3)] {
        let mut s = vec![2];
        s.extend_from_slice(&cq_depth.to_le_bytes());
        s.extend_from_slice(&8u16.to_le_bytes());
        s.extend_from_slice(&16u16.to_le_bytes());
        s.push(3 | (3 << 3));
        s.extend_from_slice(&list(1100, cq_pages));
        s.extend_from_slice(&list(1110, 2));
        s.extend_from_slice(&list(1120, 2));
        save(&dir, name, &s);
    }
}

fn packets(root: &Path) {
    let dir = out_dir(root, "packet");
    let (_bed, reqs, resps) = bed_with_traffic();
    let mut all = Vec::new();
    for (role, frames) in [(0u8, &reqs), (1u8, &resps)] {
        for (i, f) in frames.iter().enumerate() {
            if f.len() < BTH + 4 {
                continue;
            }
            let body = &f[BTH..f.len() - 4];
            let mut r = vec![role | ((i as u8) << 2)];
            r.extend_from_slice(&(body.len() as u16).to_le_bytes());
            r.extend_from_slice(body);
            save(&dir, &format!("{}_{i}", ["req", "resp"][role as usize]), &r);
            all.extend_from_slice(&r);
            // And the sealed frame as raw bytes (bit 1).
            let mut raw = vec![role | 2];
            raw.extend_from_slice(&(f.len() as u16).to_le_bytes());
            raw.extend_from_slice(f);
            if i == 0 {
                save(
                    &dir,
                    &format!("raw_{}", ["req", "resp"][role as usize]),
                    &raw,
                );
            }
        }
    }
    save(&dir, "all", &all);
}

fn desc(addr: u64, len: u32, flags: u16, next: u16) -> Vec<u8> {
    let mut d = addr.to_le_bytes().to_vec();
    d.extend_from_slice(&len.to_le_bytes());
    d.extend_from_slice(&flags.to_le_bytes());
    d.extend_from_slice(&next.to_le_bytes());
    d
}

fn vring(root: &Path) {
    use vrdma_fuzz::chains::{DATA, QSIZE};
    let dir = out_dir(root, "vring");
    let (next, write, indirect) = (1u16, 2u16, 4u16);
    let chain_seed = |ctl: u8, descs: &[Vec<u8>], data: &[u8], n: u16| {
        let mut s = vec![ctl];
        s.extend_from_slice(&n.to_le_bytes());
        for i in 0..QSIZE {
            s.extend_from_slice(&(if i < n { i * 2 } else { 0 }).to_le_bytes());
        }
        let mut table = vec![0u8; 16 * usize::from(QSIZE)];
        for (i, d) in descs.iter().enumerate() {
            table[16 * i..16 * i + 16].copy_from_slice(d);
        }
        s.extend_from_slice(&table);
        s.extend_from_slice(data);
        s
    };
    // Command: header + CREATE_PD request in one readable descriptor, a writable response.
    let hdr = VrdmaCmdHdr {
        opcode: VRDMA_CMD_CREATE_PD,
        flags: 0,
        reserved: 0,
    };
    let mut cmd = hdr.as_bytes().to_vec();
    cmd.extend_from_slice(&[0; 8]);
    let resp_at = DATA + 0x1000;
    let descs = vec![
        desc(DATA, cmd.len() as u32, next, 1),
        desc(resp_at, 64, write, 0),
        desc(DATA, cmd.len() as u32, next, 3),
        desc(resp_at + 64, 64, write, 0),
    ];
    save(&dir, "control_create_pd", &chain_seed(0, &descs, &cmd, 2));
    save(&dir, "control_event_idx", &chain_seed(1, &descs, &cmd, 2));
    // The same through an indirect table at DATA + 0x2000.
    let mut data = cmd.clone();
    data.resize(0x2000, 0);
    data.extend_from_slice(&desc(DATA, cmd.len() as u32, next, 1));
    data.extend_from_slice(&desc(resp_at, 64, write, 0));
    let descs = vec![desc(DATA + 0x2000, 32, indirect, 0)];
    save(&dir, "control_indirect", &chain_seed(0, &descs, &data, 1));
    // Doorbell records and an eth tx frame.
    let db = VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: 1,
    };
    let mut dbs = db.as_bytes().to_vec();
    dbs.extend_from_slice(db.as_bytes());
    let descs = vec![desc(DATA, dbs.len() as u32, 0, 0)];
    save(&dir, "doorbells", &chain_seed(2, &descs, &dbs, 1));
    let frame = vec![0x11u8; 60];
    let descs = vec![desc(DATA, 30, next, 1), desc(DATA + 30, 30, 0, 0)];
    save(&dir, "eth_tx", &chain_seed(4, &descs, &frame, 1));
    // Writable buffers for the device -> driver queues: 4 x 64 bytes, and 2 KiB frames.
    let descs: Vec<Vec<u8>> = (0..8u16)
        .map(|i| desc(DATA + 64 * u64::from(i), 64, write, 0))
        .collect();
    let heads = |ctl: u8, descs: &[Vec<u8>], n: u16| {
        let mut s = chain_seed(ctl, descs, &[], n);
        for i in 0..n {
            s[3 + 2 * usize::from(i)..5 + 2 * usize::from(i)].copy_from_slice(&i.to_le_bytes());
        }
        s
    };
    save(&dir, "events", &heads(6, &descs, 8));
    let descs: Vec<Vec<u8>> = (0..4u16)
        .map(|i| desc(DATA + 2048 * u64::from(i), 2048, write, 0))
        .collect();
    save(&dir, "eth_rx", &heads(8, &descs, 4));
}

fn main() {
    let root = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("corpus"), PathBuf::from);
    control(&root);
    wqes(&root);
    pagelists(&root);
    packets(&root);
    vring(&root);
    save_all(&root, "snapshot", vrdma_fuzz::snapshot::seeds());
    save_all(&root, "vhost_user", vrdma_fuzz::vhost_user::seeds::all());
    save_all(&root, "fabric", vrdma_fuzz::fabric::seeds::all());
    for t in vrdma_fuzz::TARGETS {
        let n = fs::read_dir(root.join(t)).map_or(0, |d| d.count());
        println!("corpus/{t}: {n} seeds");
    }
}
