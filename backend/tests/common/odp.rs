//! ODP fixtures shared by the ODP integration tests: a driver stand-in (`Pager`) that answers
//! `VRDMA_PAGEREQ_FAULT` through `VRDMA_CMD_ODP_PAGE_RESP` (the driver's command path) from a
//! process-VA → GPA table it may change at any time, and a two-node harness (`Pair`) that moves
//! frames, serves page requests and fires timers in virtual time, one round per `step`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vrdma_backend::device::{Device, DeviceConfig};
use vrdma_backend::memory::odp::OdpConfig;
use vrdma_backend::transport::{self, ctx::Cqe};
use vrdma_spec::*;

use super::*;

/// [va, va + len) of MR `key` is backed by guest pages [gpa, gpa + len).
#[derive(Debug, Clone, Copy)]
pub struct Map {
    pub key: u32,
    pub va: u64,
    pub gpa: u64,
    pub len: u64,
}

/// The driver stand-in of one node.
#[derive(Debug, Default)]
pub struct Pager {
    pub maps: Vec<Map>,
    /// Error status answered for an MR (absent: VRDMA_STATUS_OK).
    pub status: HashMap<u32, u32>,
    /// MRs whose faults are never answered.
    pub silent: Vec<u32>,
    /// Every FAULT request seen, in order.
    pub faults: Vec<VrdmaPageReq>,
    /// Every RECLAIM notice seen, in order.
    pub reclaims: Vec<VrdmaPageReq>,
}

impl Pager {
    /// Faults seen for MR `key`.
    pub fn faults_for(&self, key: u32) -> Vec<VrdmaPageReq> {
        self.faults
            .iter()
            .filter(|r| r.mr_key == key)
            .copied()
            .collect()
    }

    /// Replace the backing of MR `key` at `va` (the driver moved the range to other pages).
    pub fn remap(&mut self, m: Map) {
        self.maps.retain(|x| !(x.key == m.key && x.va == m.va));
        self.maps.push(m);
    }

    /// Answer every new FAULT of `n` (and record the RECLAIM notices answers cause); returns
    /// how many were answered.
    pub fn serve(&mut self, n: &mut Node) -> usize {
        let mut k = 0;
        loop {
            let reqs = n.out.take_page_requests();
            if reqs.is_empty() {
                return k;
            }
            k += self.serve_batch(n, reqs);
        }
    }

    fn serve_batch(&mut self, n: &mut Node, reqs: Vec<VrdmaPageReq>) -> usize {
        let mut k = 0;
        for r in reqs {
            match r.type_ {
                VRDMA_PAGEREQ_FAULT => self.faults.push(r),
                VRDMA_PAGEREQ_RECLAIM => {
                    self.reclaims.push(r);
                    continue;
                }
                t => panic!("unknown page request type {t}"),
            }
            if self.silent.contains(&r.mr_key) {
                continue;
            }
            self.reply(n, &r);
            k += 1;
        }
        k
    }

    /// Answer FAULT `r` of `n` now (its status from `status`, its pages from `maps`), also one
    /// that was held back by `silent`.
    pub fn reply(&self, n: &mut Node, r: &VrdmaPageReq) {
        let start = r.iova & !4095;
        let end = (r.iova + r.length).next_multiple_of(4096);
        let status = self
            .status
            .get(&r.mr_key)
            .copied()
            .unwrap_or(VRDMA_STATUS_OK);
        let mut pages = Vec::new();
        if status == VRDMA_STATUS_OK {
            let m = self
                .maps
                .iter()
                .find(|m| m.key == r.mr_key && start >= m.va && end <= m.va + m.len)
                .unwrap_or_else(|| panic!("fault outside the mapped ranges: {r:?}"));
            pages = (start..end)
                .step_by(4096)
                .map(|va| m.gpa + (va - m.va))
                .collect();
        }
        n.page_resp(r, status, start, &pages);
    }
}

/// Rebuild a node's device with ODP configured by `odp`.
pub fn enable_odp(n: &mut Node, odp: OdpConfig) {
    let cfg = DeviceConfig {
        mac: n.mac,
        mtu: 9000,
        odp,
        ..DeviceConfig::default()
    };
    n.dev = Device::new(cfg, n.mem.clone(), n.out.clone());
    n.dev.flush_hook = Some(transport::flush);
    let g = VrdmaCmdGid {
        index: 0,
        type_: VRDMA_GID_TYPE_ROCE_V2,
        gid: n.gid,
    };
    n.cmd(VRDMA_CMD_ADD_GID, g.as_bytes()).expect("gid");
}

/// Register an explicit ODP MR `[va, va + len)` or (implicit) the implicit ODP MR; returns its key.
pub fn reg_odp(n: &mut Node, pd: u32, va: u64, len: u64, implicit: bool) -> u32 {
    let c = odp_mr_req(
        pd,
        ACC_ALL | VRDMA_ACCESS_ON_DEMAND,
        if implicit { 0 } else { va },
        if implicit { u64::MAX } else { len },
    );
    let op = if implicit {
        VRDMA_CMD_REG_IMPLICIT_MR
    } else {
        VRDMA_CMD_REG_ODP_MR
    };
    let r = n.cmd(op, c.as_bytes()).expect("reg odp");
    VrdmaRespRegMr::read_from(&r).unwrap().lkey
}

/// One connected RC QP pair with a CQ per side and the completions gathered so far.
pub struct Conn {
    pub qp: QpPair,
    pub ga: Vec<Cqe>,
    pub gb: Vec<Cqe>,
}

/// Two ODP-enabled nodes, their pagers and RC connections.
pub struct Pair {
    pub a: Node,
    pub b: Node,
    pub pa: Pager,
    pub pb: Pager,
    pub pda: u32,
    pub pdb: u32,
    pub conns: Vec<Conn>,
    /// Virtual time (advanced 5 ms per step, never behind the wall clock).
    pub vt: Instant,
    /// If set, every step asserts that B's resident chunk count is at most this.
    pub budget_b: Option<usize>,
    pub started: Instant,
    /// Page requests both pagers answered so far.
    pub served: usize,
    /// Path MTU (IBTA enum) of the connections `conn` adds.
    mtu: u32,
}

/// An ODP config whose device keeps at most `chunks` chunks resident (in total and per MR).
pub fn budget(chunks: usize) -> OdpConfig {
    OdpConfig {
        max_resident: chunks,
        max_resident_per_mr: chunks,
        ..OdpConfig::default()
    }
}

/// How a `Pair` is built: `Pair::with(32).mtu(3).odp_b(budget(4)).conns(2).build()`.
pub struct PairBuilder {
    mem_mib: u64,
    odp_a: OdpConfig,
    odp_b: OdpConfig,
    conns: usize,
    mtu: u32,
}

impl PairBuilder {
    setters! {
        /// ODP config of A's device (default: `OdpConfig::default()`).
        odp_a: OdpConfig;
        /// ODP config of B's device (default: `OdpConfig::default()`).
        odp_b: OdpConfig;
        /// Number of RC connections (default 1).
        conns: usize;
        /// Path MTU as the IBTA enum (default 5 = 4096).
        mtu: u32;
    }

    pub fn build(self) -> Pair {
        let mut a = Node::new(1, self.mem_mib, 9000);
        let mut b = Node::new(2, self.mem_mib, 9000);
        enable_odp(&mut a, self.odp_a);
        enable_odp(&mut b, self.odp_b);
        let Sides { a, b, pda, pdb } = Sides::of(a, b);
        let mut p = Pair {
            a,
            b,
            pa: Pager::default(),
            pb: Pager::default(),
            pda,
            pdb,
            conns: Vec::new(),
            vt: Instant::now(),
            budget_b: None,
            started: Instant::now(),
            served: 0,
            mtu: self.mtu,
        };
        for _ in 0..self.conns {
            p.conn(None);
        }
        p
    }
}

impl Pair {
    /// Two nodes with `mem_mib` MiB of guest memory each, see `PairBuilder` for the rest.
    pub fn with(mem_mib: u64) -> PairBuilder {
        PairBuilder {
            mem_mib,
            odp_a: OdpConfig::default(),
            odp_b: OdpConfig::default(),
            conns: 1,
            mtu: 5,
        }
    }

    pub fn new(mem_mib: u64, odp_a: OdpConfig, odp_b: OdpConfig, nconns: usize) -> Pair {
        Pair::with(mem_mib)
            .odp_a(odp_a)
            .odp_b(odp_b)
            .conns(nconns)
            .build()
    }

    /// Add an RC connection (B's QP on SRQ `srq_b` if given); returns its index.
    pub fn conn(&mut self, srq_b: Option<u32>) -> usize {
        let (a, b) = (&mut self.a, &mut self.b);
        // timeout 14, retry 7, rnr_retry 7 (infinite: the responder RNR-NAKs while a chunk is
        // faulted in).
        let spec = QpPairSpec {
            srq_b,
            ..QpPairSpec::rc(256, RtsAttrs::mtu(self.mtu))
        };
        self.conns.push(Conn {
            qp: QpPair::open(a, b, self.pda, self.pdb, spec),
            ga: Vec::new(),
            gb: Vec::new(),
        });
        self.conns.len() - 1
    }

    /// Node, pager and PD of `side`.
    pub fn side(&mut self, side: Side) -> (&mut Node, &mut Pager, u32) {
        match side {
            Side::A => (&mut self.a, &mut self.pa, self.pda),
            Side::B => (&mut self.b, &mut self.pb, self.pdb),
        }
    }

    /// The implicit ODP MR of `side` (its key; back VAs with `back`).
    pub fn implicit_mr(&mut self, side: Side) -> u32 {
        let (n, _, pd) = self.side(side);
        reg_odp(n, pd, 0, 0, true)
    }

    /// The implicit ODP MR of `side` with [va, va + len) backed (see `back`): (key, GPA).
    pub fn implicit_backed(&mut self, side: Side, va: u64, len: u64) -> (u32, u64) {
        let key = self.implicit_mr(side);
        (key, self.back(side, key, va, len))
    }

    /// Back [va, va + len) of ODP MR `key` on `side` by fresh guest pages its pager maps;
    /// returns their GPA.
    pub fn back(&mut self, side: Side, key: u32, va: u64, len: u64) -> u64 {
        let (n, pager, _) = self.side(side);
        let gpa = n.alloc(len);
        pager.maps.push(Map { key, va, gpa, len });
        gpa
    }

    /// An explicit ODP MR over [va, va + len) on `side`, backed as by `back`; returns
    /// (key, GPA of the backing).
    pub fn odp_mr(&mut self, side: Side, va: u64, len: u64) -> (u32, u64) {
        let (n, _, pd) = self.side(side);
        let key = reg_odp(n, pd, va, len, false);
        (key, self.back(side, key, va, len))
    }

    /// A pinned MR over `len` fresh bytes of `side` (iova == GPA); returns (GPA, key).
    pub fn mr(&mut self, side: Side, len: u64) -> (u64, u32) {
        let (n, _, pd) = self.side(side);
        let gpa = n.alloc(len);
        (gpa, n.reg_mr(pd, gpa, len, ACC_ALL))
    }

    /// Post a WQE on connection `i`, side A.
    pub fn post(&mut self, i: usize, w: &Wqe) {
        let c = &mut self.conns[i];
        self.a.post_send(&mut c.qp.qa, w);
    }

    /// Serve page requests on both sides.
    pub fn serve(&mut self) -> usize {
        let k = self.pa.serve(&mut self.a) + self.pb.serve(&mut self.b);
        self.served += k;
        k
    }

    /// Deliver frames both ways (A's frames: at most `limit_a`, the rest stay queued).
    pub fn deliver(&mut self, limit_a: usize) {
        let mut fa = std::mem::take(&mut self.a.dev.outbox(0).frames);
        let rest = if fa.len() > limit_a {
            fa.split_off(limit_a)
        } else {
            Vec::new()
        };
        for f in fa {
            transport::on_frame(&self.b.dev, &f);
        }
        // Frames A produced meanwhile go after the held-back ones.
        let mut later = std::mem::take(&mut self.a.dev.outbox(0).frames);
        self.a.dev.outbox(0).frames = rest;
        self.a.dev.outbox(0).frames.append(&mut later);
        for f in std::mem::take(&mut self.b.dev.outbox(0).frames) {
            transport::on_frame(&self.a.dev, &f);
        }
    }

    /// Gather completions, advance virtual time and fire timers; check the ODP invariants.
    pub fn finish_step(&mut self) {
        for c in &mut self.conns {
            c.ga.extend(self.a.poll_cq(&mut c.qp.cqa));
            c.gb.extend(self.b.poll_cq(&mut c.qp.cqb));
        }
        self.vt += Duration::from_millis(5);
        let now = Instant::now().max(self.vt);
        self.vt = now;
        for d in [&mut self.a.dev, &mut self.b.dev] {
            d.odp_tick(now);
            transport::on_tick(d, now);
        }
        self.a
            .dev
            .mrs
            .write()
            .odp_check_invariants()
            .expect("A ODP state");
        self.b
            .dev
            .mrs
            .write()
            .odp_check_invariants()
            .expect("B ODP state");
        if let Some(n) = self.budget_b {
            let r = self.b.dev.mrs.write().odp_resident_total();
            assert!(r <= n, "B has {r} resident chunks, budget {n}");
        }
    }

    /// One round: serve, deliver everything, gather completions, tick.
    pub fn step(&mut self) {
        self.serve();
        self.deliver(usize::MAX);
        self.finish_step();
    }

    /// Post an RDMA WRITE of `sge` (addr, len, lkey) to `dst` (`rkey`) on connection `i`.
    pub fn post_write(&mut self, i: usize, wr_id: u64, sge: (u64, u32, u32), dst: u64, rkey: u32) {
        self.post(i, &rdma(wr_id, VRDMA_WR_RDMA_WRITE, sge, dst, rkey));
    }

    /// Step until connection `i` has `n` requester completions; returns them.
    pub fn run_until(&mut self, i: usize, n: usize) -> Vec<Cqe> {
        while self.conns[i].ga.len() < n {
            assert!(
                self.started.elapsed() < Duration::from_secs(60),
                "test timed out waiting for {n} completions on conn {i}"
            );
            self.step();
        }
        self.conns[i].ga.clone()
    }

    /// Step until connection `i` has `n` requester completions and assert that those from index
    /// `from` on succeeded, with wr_ids `first`, `first + 1`, ... in order; returns all `n`.
    pub fn run_ok(&mut self, i: usize, from: usize, n: usize, first: u64) -> Vec<Cqe> {
        let c = self.run_until(i, n);
        for (k, c) in c[from..n].iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (first + k as u64, VRDMA_WC_SUCCESS),
                "{c:?}"
            );
        }
        c
    }

    /// Step until connection `i` has one more requester completion, assert that it is `wr_id`
    /// and succeeded; returns how many page requests were answered meanwhile.
    pub fn run_one_ok(&mut self, i: usize, wr_id: u64) -> usize {
        let (c, served) = self.run_more(i, 1);
        assert_eq!(
            (c[0].wr_id, c[0].status),
            (wr_id, VRDMA_WC_SUCCESS),
            "{:?}",
            c[0]
        );
        served
    }

    /// Step until connection `i` has `n` requester completions more than now; returns those
    /// and how many page requests were answered meanwhile.
    pub fn run_more(&mut self, i: usize, n: usize) -> (Vec<Cqe>, usize) {
        let (seen, served) = (self.conns[i].ga.len(), self.served);
        let all = self.run_until(i, seen + n);
        (all[seen..].to_vec(), self.served - served)
    }
}
