//! Hostile control commands (spec §11, §14.2): random and mutated-valid bodies for every
//! `VRDMA_CMD_*` opcode go into `Device::handle_command`. Whatever the input, the device must not
//! panic, must answer one of the defined statuses (never NEEDS_RESET: §14.1 forbids entering it
//! for malformed commands), must write a response body only on OK and of the opcode's size, and
//! must stay usable: a valid sequence afterwards still moves data between two nodes. A parked
//! command (ADVISE_MR with F_FLUSH) must complete exactly once, with OK, by the ODP timeout.
//!
//! Deterministic: a seeded splitmix64 PRNG; a failure prints the seed and iteration.
//!
//! Long because it holds a generator for every opcode's body; they share one PRNG and one
//! checker, so they stay in one binary.

mod common;

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::rng::Rng;
use common::*;
use vrdma_backend::device::{CmdOutcome, Ticket};
use vrdma_spec::*;

/// Handles the device has handed out so far (mutations draw from them).
#[derive(Default)]
struct Pools {
    pds: Vec<u32>,
    cqs: Vec<u32>,
    qps: Vec<u32>,
    srqs: Vec<u32>,
    ahs: Vec<u32>,
    keys: Vec<u32>,
    /// Destroyed handles (stale inputs).
    stale: Vec<u32>,
}

/// Response body size of a successful command (spec §11.2).
fn resp_size(op: u16) -> usize {
    match op {
        VRDMA_CMD_QUERY_DEVICE => 256,
        VRDMA_CMD_QUERY_PORT => 32,
        VRDMA_CMD_CREATE_PD
        | VRDMA_CMD_CREATE_CQ
        | VRDMA_CMD_RESIZE_CQ
        | VRDMA_CMD_CREATE_QP
        | VRDMA_CMD_CREATE_SRQ
        | VRDMA_CMD_CREATE_AH
        | VRDMA_CMD_REG_MR
        | VRDMA_CMD_REG_DMA_MR
        | VRDMA_CMD_ALLOC_FAST_REG_MR
        | VRDMA_CMD_REG_ODP_MR
        | VRDMA_CMD_REG_IMPLICIT_MR
        | VRDMA_CMD_REREG_MR
        | VRDMA_CMD_ALLOC_MW
        | VRDMA_CMD_ALLOC_XRCD => 8,
        VRDMA_CMD_QUERY_QP => 104,
        VRDMA_CMD_QUERY_SRQ => 16,
        VRDMA_CMD_QUERY_STATS => 128,
        _ => 0,
    }
}

struct Fuzz {
    rng: Rng,
    pools: Pools,
    /// A guest area the fuzzer uses for ring pages and page lists.
    area: u64,
    area_pages: u64,
    mem_end: u64,
}

impl Fuzz {
    /// An "interesting" u32 for a handle-ish or size-ish field.
    fn u32v(&mut self) -> u32 {
        let p = &self.pools;
        let from_pool = |r: &mut Rng, v: &Vec<u32>| {
            if v.is_empty() {
                1
            } else {
                r.pick(v)
            }
        };
        match self.rng.below(17) {
            0 => 0,
            1 => 1,
            2 => u32::MAX,
            3 => 1 << 31,
            4 => from_pool(&mut self.rng, &p.pds),
            5 => from_pool(&mut self.rng, &p.cqs),
            15 => from_pool(&mut self.rng, &p.stale),
            6 => from_pool(&mut self.rng, &p.qps),
            7 => from_pool(&mut self.rng, &p.srqs),
            8 => from_pool(&mut self.rng, &p.ahs),
            9 => from_pool(&mut self.rng, &p.keys) ^ (self.rng.below(2) as u32),
            10 => 1 << self.rng.below(32),
            11 => (1 << self.rng.below(32)) - 1,
            12 => self.rng.below(64) as u32,
            13 => 0xffff,
            _ => self.rng.next() as u32,
        }
    }

    /// A live handle of pool `k` (0 pd, 1 cq, 2 qp, 3 srq, 4 ah, 5 key) most of the time.
    fn live(&mut self, k: usize) -> u32 {
        let p = &self.pools;
        let v = [&p.pds, &p.cqs, &p.qps, &p.srqs, &p.ahs, &p.keys][k];
        if v.is_empty() || self.rng.chance(10) {
            self.u32v()
        } else {
            self.rng.pick(v)
        }
    }

    /// An "interesting" GPA for a page list: valid, unaligned, outside memory, overflowing.
    fn gpa(&mut self) -> u64 {
        match self.rng.below(10) {
            0 => 0,
            1 => !4095u64,
            2 => self.mem_end,
            3 => self.mem_end - 4096,
            4 => self.area + self.rng.below(self.area_pages * 4096),
            5 => self.rng.next(),
            _ => self.area + self.rng.below(self.area_pages) * 4096,
        }
    }

    fn pages(&mut self, n: u64) -> Vec<u8> {
        let mut b = Vec::new();
        // Most lists are entirely valid (so that the command gets deep); the rest mix in bad GPAs.
        let clean = self.rng.chance(70);
        for _ in 0..n {
            let g = if clean {
                self.area + self.rng.below(self.area_pages) * 4096
            } else {
                self.gpa()
            };
            b.extend_from_slice(&g.to_le_bytes());
        }
        b
    }

    /// A plausible request for `op`, then mutated.
    fn body(&mut self, op: u16) -> Vec<u8> {
        if self.rng.chance(15) {
            let n = self.rng.below(400) as usize;
            return (0..n).map(|_| self.rng.next() as u8).collect();
        }
        let r = &mut self.rng;
        let depth = if r.chance(70) {
            1u32 << r.below(9)
        } else {
            r.next() as u32
        };
        let mut b: Vec<u8> = match op {
            VRDMA_CMD_QUERY_PORT => VrdmaCmdQueryPort {
                port: 1,
                reserved: 0,
            }
            .as_bytes()
            .to_vec(),
            VRDMA_CMD_ADD_GID | VRDMA_CMD_DEL_GID => {
                let mut gid = [0u8; 16];
                gid[10] = 0xff;
                gid[11] = 0xff;
                gid[15] = r.below(256) as u8;
                VrdmaCmdGid {
                    index: 1 + r.below(200) as u32,
                    type_: r.below(4) as u32,
                    gid,
                }
                .as_bytes()
                .to_vec()
            }
            VRDMA_CMD_CREATE_CQ | VRDMA_CMD_RESIZE_CQ => {
                let np = if depth <= 4096 {
                    1 + (depth as u64 * 64).div_ceil(4096)
                } else {
                    r.below(4)
                };
                let cqn = if op == VRDMA_CMD_RESIZE_CQ {
                    self.u32v()
                } else {
                    0
                };
                let mut b = VrdmaCmdCreateCq {
                    cqn,
                    depth,
                    npages: np as u32,
                    reserved: 0,
                }
                .as_bytes()
                .to_vec();
                b.extend(self.pages(np));
                b
            }
            VRDMA_CMD_CREATE_QP => {
                let sq_shift = 6 + r.below(4) as u8;
                let rq_shift = 5 + r.below(4) as u8;
                let rq_depth = 1u32 << r.below(6);
                let sqn = 1 + ((depth as u64) << sq_shift).div_ceil(4096).min(64);
                let rqn = 1 + ((rq_depth as u64) << rq_shift).div_ceil(4096);
                let pdn = self.live(0);
                let send_cqn = self.live(1);
                let recv_cqn = self.live(1);
                let srqn = if self.rng.chance(90) {
                    VRDMA_NO_SRQ
                } else {
                    self.live(3)
                };
                let c = VrdmaCmdCreateQp {
                    pdn,
                    qp_type: self.rng.pick(&[1, 2, 2, 2, 3, 3, 4, 4, 4, 0, 7]),
                    send_cqn,
                    recv_cqn,
                    srqn,
                    sq_depth: depth,
                    rq_depth,
                    sq_wqe_shift: sq_shift,
                    rq_wqe_shift: rq_shift,
                    sq_sig_all: self.rng.pick(&[0, 1, 1, 2]),
                    reserved0: 0,
                    max_send_sge: self.rng.pick(&[0, 1, 2, 4, 33, 1000]),
                    max_recv_sge: self.rng.pick(&[0, 1, 2, 4, 33, 1000]),
                    max_inline_data: self.rng.below(4) as u32 * self.rng.below(200) as u32,
                    sq_npages: sqn as u32,
                    rq_npages: rqn as u32,
                    xrcdn: 0,
                };
                let mut b = c.as_bytes().to_vec();
                b.extend(self.pages(sqn + rqn));
                b
            }
            VRDMA_CMD_MODIFY_QP => {
                let attr = VrdmaQpAttr {
                    qp_state: r.below(8) as u32,
                    cur_qp_state: r.below(8) as u32,
                    path_mtu: r.below(7) as u32,
                    qkey: r.next() as u32,
                    rq_psn: r.below(1 << 25) as u32,
                    sq_psn: r.below(1 << 25) as u32,
                    dest_qp_num: r.below(1 << 25) as u32,
                    qp_access_flags: r.below(32) as u32,
                    port_num: r.below(3) as u8,
                    timeout: r.below(40) as u8,
                    retry_cnt: r.below(9) as u8,
                    rnr_retry: r.below(9) as u8,
                    min_rnr_timer: r.below(40) as u8,
                    max_rd_atomic: r.below(20) as u8,
                    max_dest_rd_atomic: r.below(20) as u8,
                    ..Default::default()
                };
                let mut attr = attr;
                if r.chance(70) {
                    attr.port_num = 1;
                    attr.pkey_index = 0;
                    attr.path_mtu = 1 + r.below(5) as u32;
                    attr.timeout = r.below(32) as u8;
                    attr.retry_cnt = r.below(8) as u8;
                    attr.rnr_retry = r.below(8) as u8;
                    attr.min_rnr_timer = r.below(32) as u8;
                    attr.max_rd_atomic = r.below(17) as u8;
                    attr.max_dest_rd_atomic = r.below(17) as u8;
                    attr.rq_psn &= 0xff_ffff;
                    attr.sq_psn &= 0xff_ffff;
                    attr.dest_qp_num &= 0xff_ffff;
                    attr.qp_access_flags &= 0xe;
                    attr.av.vlan_id = 0xffff;
                    attr.av.dgid[10] = 0xff;
                    attr.av.dgid[11] = 0xff;
                    attr.av.dgid[15] = 2;
                }
                let canonical = [
                    VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS,
                    VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_QKEY,
                    VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_QKEY,
                    VRDMA_QP_STATE
                        | VRDMA_QP_AV
                        | VRDMA_QP_PATH_MTU
                        | VRDMA_QP_DEST_QPN
                        | VRDMA_QP_RQ_PSN
                        | VRDMA_QP_MAX_DEST_RD_ATOMIC
                        | VRDMA_QP_MIN_RNR_TIMER,
                    VRDMA_QP_STATE
                        | VRDMA_QP_TIMEOUT
                        | VRDMA_QP_RETRY_CNT
                        | VRDMA_QP_RNR_RETRY
                        | VRDMA_QP_SQ_PSN
                        | VRDMA_QP_MAX_QP_RD_ATOMIC,
                    VRDMA_QP_STATE | VRDMA_QP_SQ_PSN,
                    VRDMA_QP_STATE,
                    VRDMA_QP_STATE | VRDMA_QP_EN_SQD_ASYNC_NOTIFY,
                    VRDMA_QP_STATE | VRDMA_QP_CUR_STATE,
                ];
                let mask = match r.below(4) {
                    0 => r.next() as u32,
                    1 => (r.next() as u32) & 0x1f_ffff,
                    2 => r.pick(&canonical) ^ (1 << r.below(21)),
                    _ => r.pick(&canonical),
                };
                let qpn = self.live(2);
                VrdmaCmdModifyQp {
                    qpn,
                    attr_mask: mask,
                    attr,
                }
                .as_bytes()
                .to_vec()
            }
            VRDMA_CMD_CREATE_SRQ => {
                let shift = 5 + r.below(5) as u8;
                let np = 1 + ((depth as u64) << shift).div_ceil(4096).min(64);
                let c = VrdmaCmdCreateSrq {
                    pdn: self.u32v(),
                    depth,
                    wqe_shift: shift,
                    srq_type: 0,
                    reserved0: [0; 2],
                    xrcdn: 0,
                    cqn: 0,
                    max_sge: self.rng.below(40) as u32,
                    srq_limit: self.u32v(),
                    npages: np as u32,
                };
                let mut b = c.as_bytes().to_vec();
                b.extend(self.pages(np));
                b
            }
            VRDMA_CMD_MODIFY_SRQ => {
                let depth = 1u32 << self.rng.below(12);
                let np = 1 + ((depth as u64) << 6).div_ceil(4096).min(64);
                let c = VrdmaCmdModifySrq {
                    srqn: self.u32v(),
                    attr_mask: self.u32v(),
                    max_wr: depth,
                    srq_limit: self.u32v(),
                    npages: np as u32,
                    reserved: 0,
                };
                let mut b = c.as_bytes().to_vec();
                b.extend(self.pages(np));
                b
            }
            VRDMA_CMD_CREATE_AH => {
                let mut gid = [0u8; 16];
                gid[10] = 0xff;
                gid[11] = 0xff;
                gid[15] = 9;
                VrdmaCmdCreateAh {
                    pdn: self.u32v(),
                    reserved: 0,
                    av: VrdmaAv {
                        dgid: gid,
                        flow_label: self.u32v(),
                        sgid_index: self.rng.below(4) as u8,
                        hop_limit: 64,
                        traffic_class: 0,
                        sl: 0,
                        dmac: [2, 0, 0, 0, 0, 9],
                        vlan_id: self.rng.pick(&[0xffff, 0, 4095, 4096, 0xfffe]),
                        reserved: 0,
                    },
                }
                .as_bytes()
                .to_vec()
            }
            VRDMA_CMD_REREG_MR => {
                // The REG_MR body of another draw, re-laid out behind a fuzzed key.
                let reg = self.body(VRDMA_CMD_REG_MR);
                let Some((c, pages)) = VrdmaCmdRegMr::split_from(&reg) else {
                    return reg; // a random draw: send it as it is
                };
                let mut b = VrdmaCmdReregMr {
                    key: self.u32v(),
                    pdn: c.pdn,
                    access: c.access,
                    page_shift: c.page_shift,
                    iova: c.iova,
                    length: c.length,
                    npages: c.npages,
                    reserved: 0,
                }
                .as_bytes()
                .to_vec();
                b.extend_from_slice(pages);
                b
            }
            VRDMA_CMD_REG_MR
            | VRDMA_CMD_REG_DMA_MR
            | VRDMA_CMD_ALLOC_FAST_REG_MR
            | VRDMA_CMD_REG_ODP_MR
            | VRDMA_CMD_REG_IMPLICIT_MR => {
                let page_shift = self.rng.pick(&[12u32, 12, 13, 21, 0, 63, 64, 200]);
                let iova = match self.rng.below(4) {
                    0 => self.gpa(),
                    1 => 0,
                    2 => u64::MAX - self.rng.below(8192),
                    _ => self.rng.next(),
                };
                let length = match self.rng.below(5) {
                    0 => u64::MAX,
                    1 => 0,
                    2 => 1 + self.rng.below(1 << 16),
                    3 => 1 << 41,
                    _ => self.rng.next(),
                };
                let mut np = self.rng.below(20);
                let (mut iova, mut length, mut page_shift) = (iova, length, page_shift);
                if self.rng.chance(50) {
                    // Valid geometry over the fuzz area (the page list is still fuzzed).
                    page_shift = 12;
                    iova = self.area + self.rng.below(self.area_pages * 4096 / 2);
                    length = 1 + self.rng.below(65536);
                    np = ((iova & 4095) + length).div_ceil(4096);
                }
                let mut b = VrdmaCmdRegMr {
                    pdn: self.u32v(),
                    access: self.rng.below(256) as u32,
                    iova,
                    length,
                    page_shift,
                    npages: if self.rng.chance(80) {
                        np as u32
                    } else {
                        self.u32v()
                    },
                }
                .as_bytes()
                .to_vec();
                b.extend(self.pages(np));
                b
            }
            // A quarter are well-formed flush prefetches on a live key, so that (on an implicit
            // ODP MR) some park and must complete later.
            VRDMA_CMD_ADVISE_MR if self.rng.chance(25) => VrdmaCmdAdviseMr {
                lkey: if self.pools.keys.is_empty() {
                    1
                } else {
                    self.rng.pick(&self.pools.keys)
                },
                advice: self.rng.below(2) as u32,
                flags: VRDMA_ADVISE_F_FLUSH,
                reserved: 0,
                iova: self.gpa(),
                length: self.rng.pick(&[1, 4096, 1 << 22]),
            }
            .as_bytes()
            .to_vec(),
            VRDMA_CMD_ADVISE_MR => VrdmaCmdAdviseMr {
                lkey: self.u32v(),
                advice: self.rng.below(4) as u32,
                flags: self.rng.pick(&[0, 0, VRDMA_ADVISE_F_FLUSH, 2]),
                reserved: 0,
                iova: self.gpa(),
                length: self.rng.pick(&[0, 1, 4096, 1 << 22, u64::MAX]),
            }
            .as_bytes()
            .to_vec(),
            VRDMA_CMD_ODP_PAGE_RESP => {
                let np = self.rng.below(8);
                let mut b = VrdmaCmdOdpPageResp {
                    req_id: self.u32v(),
                    mr_key: self.u32v(),
                    status: self.rng.below(10) as u32,
                    flags: self.rng.below(4) as u32,
                    iova: self.gpa(),
                    npages: np as u32,
                    reserved: 0,
                }
                .as_bytes()
                .to_vec();
                b.extend(self.pages(np));
                b
            }
            VRDMA_CMD_ODP_INVALIDATE => VrdmaCmdOdpInvalidate {
                mr_key: self.u32v(),
                reserved: 0,
                iova: self.gpa(),
                length: self.rng.pick(&[0, 1, 4096, 1 << 22, u64::MAX]),
            }
            .as_bytes()
            .to_vec(),
            VRDMA_CMD_MODIFY_CQ => VrdmaCmdModifyCq {
                cqn: self.u32v(),
                cq_count: self.rng.pick(&[0, 1, 2, 16, u16::MAX]),
                cq_period: self.rng.pick(&[0, 1, 100, u16::MAX]),
            }
            .as_bytes()
            .to_vec(),
            // Handle-only commands (destroy/query/dereg), QUERY_STATS ({qpn, flags} has the
            // handle's layout) and CREATE_PD / QUERY_DEVICE.
            _ => VrdmaHandle {
                handle: self.u32v(),
                reserved: 0,
            }
            .as_bytes()
            .to_vec(),
        };
        // Mutations: overwrite aligned words with interesting values, truncate, extend.
        let muts = if self.rng.chance(60) {
            0
        } else {
            1 + self.rng.below(2)
        };
        for _ in 0..muts {
            if b.len() >= 4 {
                let o = (self.rng.below(b.len() as u64 / 4) * 4) as usize;
                let v = self.u32v();
                b[o..o + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        match self.rng.below(10) {
            0 => {
                let n = self.rng.below(b.len() as u64 + 1) as usize;
                b.truncate(n);
            }
            1 => {
                let n = self.rng.below(64) as usize;
                b.extend((0..n).map(|_| self.rng.next() as u8));
            }
            _ => {}
        }
        b
    }
}

/// Remember handles from successful creating commands.
fn record(p: &mut Pools, op: u16, resp: &[u8]) {
    let h = u32::from_le_bytes(resp[0..4].try_into().unwrap());
    match op {
        VRDMA_CMD_CREATE_PD => p.pds.push(h),
        VRDMA_CMD_CREATE_CQ => p.cqs.push(h),
        VRDMA_CMD_CREATE_QP => p.qps.push(h),
        VRDMA_CMD_CREATE_SRQ => p.srqs.push(h),
        VRDMA_CMD_CREATE_AH => p.ahs.push(h),
        VRDMA_CMD_REG_MR
        | VRDMA_CMD_REG_DMA_MR
        | VRDMA_CMD_ALLOC_FAST_REG_MR
        | VRDMA_CMD_REG_ODP_MR
        | VRDMA_CMD_REG_IMPLICIT_MR
        | VRDMA_CMD_ALLOC_MW => p.keys.push(h),
        _ => {}
    }
}

/// One RC RDMA WRITE + SEND from `a` to a fresh peer: the device still works.
fn prove_usable(a: &mut Node) {
    // Restore GID 0 (the fuzzer may have replaced or deleted it: that is legal).
    let g = VrdmaCmdGid {
        index: 0,
        type_: VRDMA_GID_TYPE_ROCE_V2,
        gid: a.gid,
    };
    a.cmd(VRDMA_CMD_ADD_GID, g.as_bytes())
        .expect("re-add gid 0");
    let mut b = Node::new(2, 8, 1500);
    let pda = a.create_pd();
    let pdb = b.create_pd();
    let (ca, mut cqa) = a.create_cq(64);
    let (cb, mut cqb) = b.create_cq(64);
    let mut qa = a.create_qp(QpSpec::rc(pda, ca));
    let mut qb = b.create_qp(QpSpec::rc(pdb, cb));
    connect(a, &qa, &mut b, &qb, RtsAttrs::mtu(3));
    let MrPair { src, ka, dst, kb } = MrPair::new(a, &mut b, pda, pdb, 16384);
    let data = pattern(42, 10000);
    a.write(src, &data);
    let mut rq = qb.rq.clone().unwrap();
    b.post_recv(&mut rq, 77, &[(dst + 12000, 4096, kb)]);
    qb.rq = Some(rq);
    a.post_send(
        &mut qa,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (src, 10000, ka), dst, kb),
    );
    a.post_send(&mut qa, &send(2, (src, 100, ka)));
    let mut link = Link::clean();
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    pump_until(a, &mut b, &mut link, Duration::from_secs(20), |a, b| {
        got_a.extend(a.poll_cq(&mut cqa));
        got_b.extend(b.poll_cq(&mut cqb));
        got_a.len() >= 2 && !got_b.is_empty()
    });
    assert!(
        got_a.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
        "{got_a:?}"
    );
    assert_eq!(got_b[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(got_b[0].wr_id, 77);
    assert_eq!(b.read(dst, 10000), data);
    assert_eq!(b.read(dst + 12000, 100), data[..100].to_vec());
}

const ALL_OPS: [u16; 37] = [
    VRDMA_CMD_QUERY_DEVICE,
    VRDMA_CMD_QUERY_PORT,
    VRDMA_CMD_ADD_GID,
    VRDMA_CMD_DEL_GID,
    VRDMA_CMD_CREATE_PD,
    VRDMA_CMD_DESTROY_PD,
    VRDMA_CMD_CREATE_CQ,
    VRDMA_CMD_DESTROY_CQ,
    VRDMA_CMD_RESIZE_CQ,
    VRDMA_CMD_CREATE_QP,
    VRDMA_CMD_MODIFY_QP,
    VRDMA_CMD_QUERY_QP,
    VRDMA_CMD_DESTROY_QP,
    VRDMA_CMD_CREATE_SRQ,
    VRDMA_CMD_MODIFY_SRQ,
    VRDMA_CMD_QUERY_SRQ,
    VRDMA_CMD_DESTROY_SRQ,
    VRDMA_CMD_CREATE_AH,
    VRDMA_CMD_DESTROY_AH,
    VRDMA_CMD_REG_MR,
    VRDMA_CMD_REG_DMA_MR,
    VRDMA_CMD_ALLOC_FAST_REG_MR,
    VRDMA_CMD_REG_ODP_MR,
    VRDMA_CMD_REG_IMPLICIT_MR,
    VRDMA_CMD_DEREG_MR,
    VRDMA_CMD_ADVISE_MR,
    VRDMA_CMD_ODP_PAGE_RESP,
    VRDMA_CMD_ODP_INVALIDATE,
    VRDMA_CMD_REREG_MR,
    VRDMA_CMD_ALLOC_MW,
    VRDMA_CMD_DEALLOC_MW,
    VRDMA_CMD_ATTACH_MCAST,
    VRDMA_CMD_DETACH_MCAST,
    VRDMA_CMD_QUERY_STATS,
    VRDMA_CMD_MODIFY_CQ,
    VRDMA_CMD_ALLOC_XRCD,
    VRDMA_CMD_DEALLOC_XRCD,
];

fn run(seed: u64, odp: bool, budget: Duration) {
    let mut a = if odp {
        Node::new_odp(1, 32)
    } else {
        Node::new(1, 32, 1500)
    };
    let area_pages = 256;
    let area = a.alloc(area_pages * 4096);
    // A few real objects so that mutations hit live handles.
    let mut f = Fuzz {
        rng: Rng::new(seed),
        pools: Pools::default(),
        area,
        area_pages,
        mem_end: BASE + (32 << 20),
    };
    let pd = a.create_pd();
    let (cq, _) = a.create_cq(64);
    let qp = a.create_qp(QpSpec::rc(pd, cq));
    let buf = a.alloc(65536);
    let key = a.reg_mr(pd, buf, 65536, ACC_ALL);
    f.pools.pds.push(pd);
    f.pools.cqs.push(cq);
    f.pools.qps.push(qp.qpn);
    f.pools.keys.push(key);
    // Parked flush advises not completed yet.
    let mut parked: HashSet<Ticket> = HashSet::new();
    if odp {
        // An implicit ODP MR (every range is inside it) with one flush advise parked from the
        // start, so completion is always exercised whatever the fuzzer does meanwhile.
        let imp = odp_mr_req(
            pd,
            VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_ON_DEMAND,
            0,
            u64::MAX,
        );
        let r = a.cmd(VRDMA_CMD_REG_IMPLICIT_MR, imp.as_bytes()).unwrap();
        let ik = VrdmaRespRegMr::read_from(&r).unwrap().lkey;
        f.pools.keys.push(ik);
        let adv = VrdmaCmdAdviseMr {
            lkey: ik,
            advice: VRDMA_ADVISE_PREFETCH,
            flags: VRDMA_ADVISE_F_FLUSH,
            reserved: 0,
            iova: area,
            length: 4096,
        };
        match a
            .dev
            .handle_command(VRDMA_CMD_ADVISE_MR, adv.as_bytes(), &mut Vec::new())
        {
            CmdOutcome::Parked(t) => parked.insert(t),
            o => panic!("flush advise on an implicit MR: {o:?}"),
        };
    }
    let start = Instant::now();
    let mut i = 0u64;
    let mut oks = 0u64;
    let mut parks = 0u64;
    while start.elapsed() < budget && i < 20000 {
        let mut op = if f.rng.chance(3) {
            f.rng.next() as u16
        } else {
            f.rng.pick(&ALL_OPS)
        };
        // Destroys are less frequent than creates so that live objects accumulate.
        if matches!(
            op,
            VRDMA_CMD_DESTROY_PD
                | VRDMA_CMD_DESTROY_CQ
                | VRDMA_CMD_DESTROY_QP
                | VRDMA_CMD_DESTROY_SRQ
                | VRDMA_CMD_DESTROY_AH
                | VRDMA_CMD_DEREG_MR
        ) && f.rng.chance(60)
        {
            op = f.rng.pick(&ALL_OPS);
        }
        let body = f.body(op);
        let mut resp = Vec::new();
        let r = catch_unwind(AssertUnwindSafe(|| {
            a.dev.handle_command(op, &body, &mut resp)
        }));
        let outcome = match r {
            Ok(o) => o,
            Err(_) => panic!("seed {seed} iter {i}: panic on opcode {op} body {body:02x?}"),
        };
        // Only ADVISE_MR with F_FLUSH may park; it then answers OK with no body when done.
        let st = match outcome {
            CmdOutcome::Done(st) => st,
            CmdOutcome::Parked(t) => {
                assert_eq!(op, VRDMA_CMD_ADVISE_MR, "seed {seed} iter {i}: parked");
                assert!(resp.is_empty(), "seed {seed} iter {i}: parked with a body");
                assert!(parked.insert(t), "seed {seed} iter {i}: ticket reused");
                parks += 1;
                VRDMA_STATUS_OK
            }
        };
        check_parked(&a, &mut parked, seed, i);
        assert!(
            st <= VRDMA_STATUS_BAD_ADDRESS,
            "seed {seed} iter {i}: opcode {op} status {st} (undefined or NEEDS_RESET) body {body:02x?}"
        );
        if std::env::var("HOSTILE_STATS").is_ok() {
            eprintln!("STAT op={op} st={st}");
        }
        if st == VRDMA_STATUS_OK {
            oks += 1;
            assert_eq!(
                resp.len(),
                resp_size(op),
                "seed {seed} iter {i}: opcode {op} OK with a {}-byte body",
                resp.len()
            );
            if resp.len() >= 4 {
                record(&mut f.pools, op, &resp);
            }
        } else {
            assert!(resp.is_empty(), "seed {seed} iter {i}: error with a body");
        }
        // Destroyed handles move to the stale pool (still used as inputs, less often).
        if st == VRDMA_STATUS_OK && body.len() >= 4 {
            let h = u32::from_le_bytes(body[0..4].try_into().unwrap());
            let p = &mut f.pools;
            let pool = match op {
                VRDMA_CMD_DESTROY_PD => Some(&mut p.pds),
                VRDMA_CMD_DESTROY_CQ => Some(&mut p.cqs),
                VRDMA_CMD_DESTROY_QP => Some(&mut p.qps),
                VRDMA_CMD_DESTROY_SRQ => Some(&mut p.srqs),
                VRDMA_CMD_DESTROY_AH => Some(&mut p.ahs),
                VRDMA_CMD_DEREG_MR => Some(&mut p.keys),
                _ => None,
            };
            if let Some(v) = pool {
                v.retain(|&x| x != h && (op != VRDMA_CMD_DEREG_MR || x >> 8 != h >> 8));
                p.stale.push(h);
            }
        }
        i += 1;
    }
    assert!(i > 200, "too few iterations ({i}) to mean anything");
    assert!(
        oks > 10,
        "the fuzzer never got a command through ({oks} OK)"
    );
    if std::env::var("HOSTILE_STATS").is_ok() {
        eprintln!("STAT seed={seed} iterations={i} parked={parks}");
    }
    // Nobody answers the page requests: every parked advise completes by the ODP timeout.
    a.dev
        .odp_tick(Instant::now() + a.dev.config.odp.timeout + Duration::from_secs(1));
    check_parked(&a, &mut parked, seed, i);
    assert!(
        parked.is_empty(),
        "seed {seed}: {} advises never completed",
        parked.len()
    );
    assert_eq!(a.dev.mrs.write().odp_parked_advises(), 0);
    a.out.take_events();
    a.out.take_page_requests();
    prove_usable(&mut a);
}

/// Completions reported so far: each for a parked ticket, once, with OK; the ODP bookkeeping
/// (parked advises included) is consistent.
fn check_parked(a: &Node, parked: &mut HashSet<Ticket>, seed: u64, i: u64) {
    for (t, st) in a.out.take_done() {
        assert!(
            parked.remove(&t),
            "seed {seed} iter {i}: completion of unknown ticket {t:?}"
        );
        assert_eq!(st, VRDMA_STATUS_OK, "seed {seed} iter {i}: advise status");
    }
    assert_eq!(a.dev.mrs.write().odp_parked_advises(), parked.len());
    // The full walk is costly (implicit MRs collect many chunks): every 256 iterations.
    if i.is_multiple_of(256) {
        if let Err(e) = a.dev.mrs.write().odp_check_invariants() {
            panic!("seed {seed} iter {i}: {e}");
        }
    }
}

#[test]
fn random_and_mutated_commands_plain_device() {
    for seed in 1..=3u64 {
        run(seed, false, Duration::from_millis(1500));
    }
}

#[test]
fn random_and_mutated_commands_odp_device() {
    for seed in 11..=13u64 {
        run(seed, true, Duration::from_millis(1500));
    }
}

/// Targeted: destroy objects in use, double destroy, stale handles.
#[test]
fn destroy_in_use_and_double_destroy() {
    let mut a = Node::new(1, 16, 1500);
    let pd = a.create_pd();
    let (cq, _) = a.create_cq(64);
    let qp = a.create_qp(QpSpec::rc(pd, cq));
    let buf = a.alloc(8192);
    let key = a.reg_mr(pd, buf, 8192, ACC_ALL);
    let h = |x: u32| {
        VrdmaHandle {
            handle: x,
            reserved: 0,
        }
        .as_bytes()
        .to_vec()
    };
    assert_eq!(a.cmd(VRDMA_CMD_DESTROY_PD, &h(pd)), Err(VRDMA_STATUS_BUSY));
    assert_eq!(a.cmd(VRDMA_CMD_DESTROY_CQ, &h(cq)), Err(VRDMA_STATUS_BUSY));
    a.cmd(VRDMA_CMD_DESTROY_QP, &h(qp.qpn)).unwrap();
    assert_eq!(
        a.cmd(VRDMA_CMD_DESTROY_QP, &h(qp.qpn)),
        Err(VRDMA_STATUS_NOT_FOUND)
    );
    assert_eq!(
        a.cmd(VRDMA_CMD_QUERY_QP, &h(qp.qpn)),
        Err(VRDMA_STATUS_NOT_FOUND)
    );
    a.cmd(VRDMA_CMD_DESTROY_CQ, &h(cq)).unwrap();
    assert_eq!(
        a.cmd(VRDMA_CMD_DESTROY_CQ, &h(cq)),
        Err(VRDMA_STATUS_NOT_FOUND)
    );
    assert_eq!(a.cmd(VRDMA_CMD_DESTROY_PD, &h(pd)), Err(VRDMA_STATUS_BUSY));
    a.cmd(VRDMA_CMD_DEREG_MR, &h(key)).unwrap();
    assert_eq!(
        a.cmd(VRDMA_CMD_DEREG_MR, &h(key)),
        Err(VRDMA_STATUS_NOT_FOUND)
    );
    a.cmd(VRDMA_CMD_DESTROY_PD, &h(pd)).unwrap();
    assert_eq!(
        a.cmd(VRDMA_CMD_DESTROY_PD, &h(pd)),
        Err(VRDMA_STATUS_NOT_FOUND)
    );
    // Every handle-taking command with a truncated body → INVALID.
    for op in ALL_OPS {
        if op == VRDMA_CMD_QUERY_DEVICE || op == VRDMA_CMD_CREATE_PD || op == VRDMA_CMD_ALLOC_XRCD {
            continue;
        }
        for n in [0usize, 3, 7] {
            let st = a.cmd(op, &vec![0xa5; n]);
            assert!(
                matches!(
                    st,
                    Err(VRDMA_STATUS_INVALID) | Err(VRDMA_STATUS_NOT_SUPPORTED)
                ),
                "opcode {op} with {n} bytes: {st:?}"
            );
        }
    }
    prove_usable(&mut a);
}
