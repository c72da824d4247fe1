//! Test fixtures for the transport: a `Node` is one `Device` with its own anonymous guest memory at
//! fake GPAs and a recording output; objects are created through `Device::handle_command` with ABI
//! structs (the driver's path), rings are written in guest memory like the driver does, and two
//! nodes are linked in-process (optionally through the wire engineer's impairment wrapper).
//!
//! One concept per submodule: `rc_pair` (a connected QP pair in one call), `odp` (pager and
//! two-node ODP harness), `engine` (tests with engine threads), `heap` (a counting allocator), `device` (one device without a
//! transport, for the command-level tests), `rng` (seeded generators).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::os::unix::io::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vrdma_backend::device::{CmdOutcome, Device, DeviceConfig, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::{self, ctx::Cqe};
use vrdma_backend::uplink::{ImpairConfig, Impaired, Uplink, UplinkError};
use vrdma_spec::*;

/// Builder setters: each `/// doc` `name: Type;` becomes `pub fn name(self, v: Type) -> Self`
/// storing `v` in the builder's field `name`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $t:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, v: $t) -> Self {
                self.$name = v;
                self
            }
        )*
    };
}

pub mod device;
pub mod engine;
pub mod fabric_rc;
pub mod fabric_tap;
pub mod heap;
pub mod odp;
pub mod rc_pair;
pub mod rng;
pub mod write_conn;

// Not every test binary builds an `RcPair` (same reason as the `dead_code` allow above).
#[allow(unused_imports)]
pub use rc_pair::RcPair;

/// Which node of a two-node fixture (`RcPair`, `odp::Pair`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Guest RAM of every node starts here (a fake GPA).
pub const BASE: u64 = 0x4000_0000;
const PAGE: u64 = 4096;

pub const ACC_ALL: u32 = VRDMA_ACCESS_LOCAL_WRITE
    | VRDMA_ACCESS_REMOTE_WRITE
    | VRDMA_ACCESS_REMOTE_READ
    | VRDMA_ACCESS_REMOTE_ATOMIC;

/// A ring as the driver sees it.
#[derive(Debug, Clone)]
pub struct RingH {
    pub pages: Vec<u64>,
    pub depth: u32,
    pub shift: u32,
    /// Driver-owned index: producer (SQ/RQ/SRQ) or consumer (CQ).
    pub idx: u32,
}

impl RingH {
    pub fn ctrl(&self) -> u64 {
        self.pages[0]
    }
    pub fn entry_gpa(&self, i: u32) -> u64 {
        let off = ((i & (self.depth - 1)) as u64) << self.shift;
        self.pages[1 + (off / PAGE) as usize] + off % PAGE
    }
}

#[derive(Debug, Clone)]
pub struct QpH {
    pub qpn: u32,
    pub qp_type: u32,
    pub sq: RingH,
    pub rq: Option<RingH>,
}

/// QP creation parameters.
#[derive(Debug, Clone, Copy)]
pub struct QpSpec {
    pub pd: u32,
    pub qp_type: u32,
    pub scq: u32,
    pub rcq: u32,
    pub srq: Option<u32>,
    pub sq_depth: u32,
    pub rq_depth: u32,
    pub sq_shift: u8,
    pub rq_shift: u8,
    pub max_sge: u32,
    pub max_inline: u32,
    pub sig_all: bool,
}

impl QpSpec {
    /// The CREATE_QP request for this QP on rings `sq` and `rq` (`None` with an SRQ), its page
    /// list included.
    pub fn request(&self, sq: &RingH, rq: Option<&RingH>) -> Vec<u8> {
        let c = VrdmaCmdCreateQp {
            pdn: self.pd,
            qp_type: self.qp_type,
            send_cqn: self.scq,
            recv_cqn: self.rcq,
            srqn: self.srq.unwrap_or(VRDMA_NO_SRQ),
            sq_depth: self.sq_depth,
            rq_depth: if self.srq.is_some() { 0 } else { self.rq_depth },
            sq_wqe_shift: self.sq_shift,
            rq_wqe_shift: if self.srq.is_some() { 0 } else { self.rq_shift },
            sq_sig_all: self.sig_all as u8,
            reserved0: 0,
            max_send_sge: self.max_sge,
            max_recv_sge: self.max_sge,
            max_inline_data: self.max_inline,
            sq_npages: sq.pages.len() as u32,
            rq_npages: rq.map_or(0, |r| r.pages.len() as u32),
            xrcdn: 0,
        };
        let mut b = c.as_bytes().to_vec();
        for p in sq.pages.iter().chain(rq.iter().flat_map(|r| &r.pages)) {
            b.extend_from_slice(&p.to_le_bytes());
        }
        b
    }

    pub fn rc(pd: u32, cq: u32) -> QpSpec {
        QpSpec {
            pd,
            qp_type: VRDMA_QPT_RC,
            scq: cq,
            rcq: cq,
            srq: None,
            sq_depth: 256,
            rq_depth: 256,
            sq_shift: 9,
            rq_shift: 8,
            max_sge: 8,
            max_inline: 256,
            sig_all: false,
        }
    }
}

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

pub struct Node {
    pub dev: Device,
    pub out: Arc<RecordingOutput>,
    pub mem: GuestMem,
    next: u64,
    end: u64,
    pub id: u8,
    pub gid: [u8; 16],
    pub mac: [u8; 6],
    /// Page requests answered by [`Node::answer_page_requests`].
    pub answered: usize,
}

pub fn gid_v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

pub fn gid_v6(id: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfd;
    g[1] = 0x00;
    g[15] = id;
    g
}

impl Node {
    /// A node with `mem_mib` MiB of guest RAM and Ethernet MTU `eth_mtu`.
    pub fn new(id: u8, mem_mib: u64, eth_mtu: u16) -> Node {
        Self::with_gid(id, mem_mib, eth_mtu, gid_v4([10, 0, 0, id]))
    }

    pub fn with_gid(id: u8, mem_mib: u64, eth_mtu: u16, gid: [u8; 16]) -> Node {
        Self::with_config(id, mem_mib, eth_mtu, gid, |_| {})
    }

    /// A node whose device configuration `tune` adjusts (limits, host-memory budget...).
    pub fn with_config(
        id: u8,
        mem_mib: u64,
        eth_mtu: u16,
        gid: [u8; 16],
        tune: impl FnOnce(&mut DeviceConfig),
    ) -> Node {
        let mem = GuestMem::from_ranges(&[(BASE, (mem_mib << 20) as usize)]).expect("guest mem");
        let out = Arc::new(RecordingOutput::new());
        let mut cfg = DeviceConfig {
            mac: [0x52, 0x54, 0x00, 0x00, 0x00, id],
            mtu: eth_mtu,
            ..DeviceConfig::default()
        };
        tune(&mut cfg);
        let mac = cfg.mac;
        let mut dev = Device::new(cfg, mem.clone(), out.clone());
        dev.flush_hook = Some(transport::flush);
        let mut n = Node {
            dev,
            out,
            mem,
            next: BASE,
            end: BASE + (mem_mib << 20),
            id,
            gid,
            mac,
            answered: 0,
        };
        let g = VrdmaCmdGid {
            index: 0,
            type_: VRDMA_GID_TYPE_ROCE_V2,
            gid,
        };
        n.cmd(VRDMA_CMD_ADD_GID, g.as_bytes()).expect("add gid");
        n
    }

    /// Allocate `len` bytes of guest memory (4 KiB aligned, zeroed).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next;
        self.next += len.div_ceil(PAGE).max(1) * PAGE;
        assert!(self.next <= self.end, "guest memory exhausted");
        a
    }

    /// Run a command that completes at once (panics if the device parks it).
    pub fn cmd(&mut self, op: u16, req: &[u8]) -> Result<Vec<u8>, u32> {
        let mut resp = Vec::new();
        match self.dev.handle_command(op, req, &mut resp) {
            CmdOutcome::Done(VRDMA_STATUS_OK) => Ok(resp),
            CmdOutcome::Done(st) => Err(st),
            CmdOutcome::Parked(t) => panic!("command {op} parked as {t:?}"),
        }
    }

    pub fn cmd_pages<T: Abi>(&mut self, op: u16, req: &T, pages: &[u64]) -> Result<Vec<u8>, u32> {
        let mut b = req.as_bytes().to_vec();
        for p in pages {
            b.extend_from_slice(&p.to_le_bytes());
        }
        self.cmd(op, &b)
    }

    pub fn ring(&mut self, depth: u32, shift: u32) -> RingH {
        let np = 1 + ((depth as u64) << shift).div_ceil(PAGE);
        let base = self.alloc(np * PAGE);
        RingH {
            pages: (0..np).map(|i| base + i * PAGE).collect(),
            depth,
            shift,
            idx: 0,
        }
    }

    pub fn create_pd(&mut self) -> u32 {
        let r = self
            .cmd(VRDMA_CMD_CREATE_PD, VrdmaHandle::default().as_bytes())
            .expect("pd");
        VrdmaHandle::read_from(&r).unwrap().handle
    }

    pub fn create_cq(&mut self, depth: u32) -> (u32, RingH) {
        let ring = self.ring(depth, 6);
        let c = VrdmaCmdCreateCq {
            cqn: 0,
            depth,
            npages: ring.pages.len() as u32,
            reserved: 0,
        };
        let pages = ring.pages.clone();
        let r = self.cmd_pages(VRDMA_CMD_CREATE_CQ, &c, &pages).expect("cq");
        (VrdmaHandle::read_from(&r).unwrap().handle, ring)
    }

    pub fn create_srq(&mut self, pd: u32, depth: u32, max_sge: u32, limit: u32) -> (u32, RingH) {
        let shift = 8;
        let ring = self.ring(depth, shift);
        let c = VrdmaCmdCreateSrq {
            pdn: pd,
            depth,
            wqe_shift: shift as u8,
            srq_type: 0,
            reserved0: [0; 2],
            xrcdn: 0,
            cqn: 0,
            max_sge,
            srq_limit: limit,
            npages: ring.pages.len() as u32,
        };
        let pages = ring.pages.clone();
        let r = self
            .cmd_pages(VRDMA_CMD_CREATE_SRQ, &c, &pages)
            .expect("srq");
        (VrdmaHandle::read_from(&r).unwrap().handle, ring)
    }

    pub fn create_qp(&mut self, s: QpSpec) -> QpH {
        self.try_create_qp(s).expect("create qp")
    }

    /// [`Node::create_qp`], returning the device's status if it refuses.
    pub fn try_create_qp(&mut self, s: QpSpec) -> Result<QpH, u32> {
        let sq = self.ring(s.sq_depth, s.sq_shift as u32);
        let rq = if s.srq.is_none() {
            Some(self.ring(s.rq_depth, s.rq_shift as u32))
        } else {
            None
        };
        let r = self.cmd(VRDMA_CMD_CREATE_QP, &s.request(&sq, rq.as_ref()))?;
        Ok(QpH {
            qpn: VrdmaRespCreateQp::read_from(&r).unwrap().qpn,
            qp_type: s.qp_type,
            sq,
            rq,
        })
    }

    pub fn modify_qp(&mut self, qpn: u32, mask: u32, attr: VrdmaQpAttr) -> Result<(), u32> {
        let c = VrdmaCmdModifyQp {
            qpn,
            attr_mask: mask,
            attr,
        };
        self.cmd(VRDMA_CMD_MODIFY_QP, c.as_bytes()).map(|_| ())
    }

    /// RESET -> INIT on port 1 (P_Key index 0, no remote access).
    pub fn qp_to_init(&mut self, qpn: u32) {
        let init = VrdmaQpAttr {
            qp_state: VRDMA_QPS_INIT,
            port_num: 1,
            ..Default::default()
        };
        let mask = VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS;
        self.modify_qp(qpn, mask, init).expect("to INIT");
    }

    pub fn qp_to_err(&mut self, qpn: u32) {
        let a = VrdmaQpAttr {
            qp_state: VRDMA_QPS_ERR,
            ..Default::default()
        };
        self.modify_qp(qpn, VRDMA_QP_STATE, a).expect("to ERR");
    }

    /// Address vector pointing at `peer`.
    pub fn av_to(&self, peer: &Node) -> VrdmaAv {
        VrdmaAv {
            dgid: peer.gid,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            dmac: peer.mac,
            vlan_id: 0xffff,
            reserved: 0,
        }
    }

    /// Register `[gpa, gpa+len)` (iova == gpa) with 4 KiB pages.
    pub fn reg_mr(&mut self, pd: u32, gpa: u64, len: u64, access: u32) -> u32 {
        let first = gpa & !(PAGE - 1);
        let np = (gpa + len.max(1) - first).div_ceil(PAGE);
        let pages: Vec<u64> = (0..np).map(|i| first + i * PAGE).collect();
        let c = VrdmaCmdRegMr {
            pdn: pd,
            access,
            iova: gpa,
            length: len,
            page_shift: 12,
            npages: np as u32,
        };
        let r = self
            .cmd_pages(VRDMA_CMD_REG_MR, &c, &pages)
            .expect("reg mr");
        VrdmaRespRegMr::read_from(&r).unwrap().lkey
    }

    pub fn create_ah(&mut self, pd: u32, av: VrdmaAv) -> u32 {
        let c = VrdmaCmdCreateAh {
            pdn: pd,
            reserved: 0,
            av,
        };
        let r = self.cmd(VRDMA_CMD_CREATE_AH, c.as_bytes()).expect("ah");
        VrdmaHandle::read_from(&r).unwrap().handle
    }

    pub fn write(&self, gpa: u64, data: &[u8]) {
        self.mem.write(gpa, data).expect("write guest");
    }

    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.mem.read(gpa, &mut b).expect("read guest");
        b
    }

    /// Write a send WQE at the SQ producer and publish it (no doorbell).
    pub fn post_send_nodb(&mut self, qp: &mut QpH, w: &Wqe) {
        let slot = 1usize << qp.sq.shift;
        let ud = qp.qp_type == VRDMA_QPT_UD || qp.qp_type == VRDMA_QPT_GSI;
        let b = w.bytes(slot, ud);
        let gpa = qp.sq.entry_gpa(qp.sq.idx);
        self.write(gpa, &b);
        qp.sq.idx = qp.sq.idx.wrapping_add(1);
        self.mem.store_u32_release(qp.sq.ctrl(), qp.sq.idx).unwrap();
    }

    /// Post a send WQE and ring the SQ doorbell.
    pub fn post_send(&mut self, qp: &mut QpH, w: &Wqe) {
        self.post_send_nodb(qp, w);
        self.doorbell(qp.qpn);
    }

    pub fn doorbell(&mut self, qpn: u32) {
        self.ring_doorbell(VRDMA_DB_SQ, qpn);
    }

    /// Ring a doorbell of any type (`VRDMA_DB_*`) for object `id`.
    pub fn ring_doorbell(&mut self, type_: u32, id: u32) {
        transport::on_doorbell(&self.dev, VrdmaDoorbell { type_, id });
    }

    /// Post a receive WQE on an RQ or SRQ ring.
    pub fn post_recv(&mut self, ring: &mut RingH, wr_id: u64, sges: &[(u64, u32, u32)]) {
        let slot = 1usize << ring.shift;
        let mut b = vec![0u8; slot];
        b[0..8].copy_from_slice(&wr_id.to_le_bytes());
        b[8..12].copy_from_slice(&(sges.len() as u32).to_le_bytes());
        for (i, (a, l, k)) in sges.iter().enumerate() {
            let o = 16 + i * 16;
            b[o..o + 8].copy_from_slice(&a.to_le_bytes());
            b[o + 8..o + 12].copy_from_slice(&l.to_le_bytes());
            b[o + 12..o + 16].copy_from_slice(&k.to_le_bytes());
        }
        let gpa = ring.entry_gpa(ring.idx);
        self.write(gpa, &b);
        ring.idx = ring.idx.wrapping_add(1);
        self.mem.store_u32_release(ring.ctrl(), ring.idx).unwrap();
    }

    /// Read every new CQE.
    pub fn poll_cq(&mut self, cq: &mut RingH) -> Vec<Cqe> {
        let prod = self.mem.load_u32_acquire(cq.ctrl()).unwrap();
        let mut v = Vec::new();
        while cq.idx != prod {
            let mut b = [0u8; 64];
            self.mem.read(cq.entry_gpa(cq.idx), &mut b).unwrap();
            v.push(Cqe::from_bytes(&b));
            cq.idx = cq.idx.wrapping_add(1);
        }
        self.mem.store_u32_release(cq.ctrl() + 64, cq.idx).unwrap();
        v
    }

    pub fn qp_state(&self, qpn: u32) -> u32 {
        transport::ctx::qp_state(&self.dev, qpn)
            .expect("qp exists")
            .as_u32()
    }

    pub fn events(&self) -> Vec<VrdmaEvent> {
        self.out.take_events()
    }
}

/// Bring an RC/UC pair to RTS (IBTA 10.3.1 transitions with the usual attribute masks).
#[allow(clippy::too_many_arguments)]
pub fn connect(
    a: &mut Node,
    qa: &QpH,
    b: &mut Node,
    qb: &QpH,
    mtu: u32,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
) {
    let (ava, avb) = (a.av_to(b), b.av_to(a));
    rts(
        a, qa, qb.qpn, ava, mtu, timeout, retry, rnr_retry, 1000, 5000,
    );
    rts(
        b, qb, qa.qpn, avb, mtu, timeout, retry, rnr_retry, 5000, 1000,
    );
}

#[allow(clippy::too_many_arguments)]
pub fn rts(
    n: &mut Node,
    q: &QpH,
    dest: u32,
    av: VrdmaAv,
    mtu: u32,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
    sq_psn: u32,
    rq_psn: u32,
) {
    let rc = q.qp_type == VRDMA_QPT_RC;
    let mut a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        // Every remote right, the flush ones included (as rdma-core's pyverbs tests do).
        qp_access_flags: VRDMA_ACCESS_REMOTE_WRITE
            | VRDMA_ACCESS_REMOTE_READ
            | VRDMA_ACCESS_REMOTE_ATOMIC
            | VRDMA_ACCESS_FLUSH_GLOBAL
            | VRDMA_ACCESS_FLUSH_PERSISTENT,
        port_num: 1,
        ..Default::default()
    };
    let acc = if rc {
        VRDMA_QP_ACCESS_FLAGS
    } else {
        a.qp_access_flags = VRDMA_ACCESS_REMOTE_WRITE;
        VRDMA_QP_ACCESS_FLAGS
    };
    n.modify_qp(
        q.qpn,
        VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | acc,
        a,
    )
    .expect("INIT");
    a.qp_state = VRDMA_QPS_RTR;
    a.av = av;
    a.path_mtu = mtu;
    a.dest_qp_num = dest;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    let mut m =
        VRDMA_QP_STATE | VRDMA_QP_AV | VRDMA_QP_PATH_MTU | VRDMA_QP_DEST_QPN | VRDMA_QP_RQ_PSN;
    if rc {
        m |= VRDMA_QP_MAX_DEST_RD_ATOMIC | VRDMA_QP_MIN_RNR_TIMER;
    }
    n.modify_qp(q.qpn, m, a).expect("RTR");
    a.qp_state = VRDMA_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = timeout;
    a.retry_cnt = retry;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 16;
    let mut m = VRDMA_QP_STATE | VRDMA_QP_SQ_PSN;
    if rc {
        m |= VRDMA_QP_TIMEOUT | VRDMA_QP_RETRY_CNT | VRDMA_QP_RNR_RETRY | VRDMA_QP_MAX_QP_RD_ATOMIC;
    }
    n.modify_qp(q.qpn, m, a).expect("RTS");
}

/// UD/GSI QP to RTS.
pub fn ud_rts(n: &mut Node, q: &QpH, qkey: u32) {
    let mut a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        qkey,
        port_num: 1,
        ..Default::default()
    };
    // GSI: PKEY_INDEX + QKEY; UD additionally PORT (ib_modify_qp_is_ok's table).
    let port = if q.qp_type == VRDMA_QPT_GSI {
        0
    } else {
        VRDMA_QP_PORT
    };
    n.modify_qp(
        q.qpn,
        VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | port | VRDMA_QP_QKEY,
        a,
    )
    .expect("UD INIT");
    a.qp_state = VRDMA_QPS_RTR;
    n.modify_qp(q.qpn, VRDMA_QP_STATE, a).expect("UD RTR");
    a.qp_state = VRDMA_QPS_RTS;
    a.sq_psn = 7;
    n.modify_qp(q.qpn, VRDMA_QP_STATE | VRDMA_QP_SQ_PSN, a)
        .expect("UD RTS");
}

/// An in-memory cable end: frames sent are queued for the peer.
#[derive(Default)]
pub struct MemPipe {
    q: Mutex<VecDeque<Vec<u8>>>,
}

impl Uplink for MemPipe {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.q.lock().unwrap().push_back(frame.to_vec());
        Ok(())
    }
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        match self.q.lock().unwrap().pop_front() {
            Some(f) => {
                let n = f.len().min(buf.len());
                buf[..n].copy_from_slice(&f[..n]);
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }
    fn as_raw_fd(&self) -> RawFd {
        -1
    }
}

impl MemPipe {
    fn drain(&self) -> Vec<Vec<u8>> {
        self.q.lock().unwrap().drain(..).collect()
    }
}

/// A frame filter: return false to drop the frame.
pub type Filter = Box<dyn FnMut(&[u8]) -> bool>;

/// Two directions of a cable, each optionally impaired.
pub struct Link {
    ab: Impaired<MemPipe>,
    ba: Impaired<MemPipe>,
    /// Optional frame filter (a → b): return false to drop.
    pub filter_ab: Option<Filter>,
    pub filter_ba: Option<Filter>,
    /// Frames a → b delivered.
    pub frames_ab: u64,
    pub frames_ba: u64,
}

impl Link {
    pub fn clean() -> Link {
        Self::impaired(ImpairConfig::default())
    }

    pub fn impaired(cfg: ImpairConfig) -> Link {
        let cfg2 = ImpairConfig {
            seed: cfg.seed.wrapping_add(77),
            ..cfg
        };
        Link {
            ab: Impaired::new(MemPipe::default(), cfg),
            ba: Impaired::new(MemPipe::default(), cfg2),
            filter_ab: None,
            filter_ba: None,
            frames_ab: 0,
            frames_ba: 0,
        }
    }
}

/// Move frames between two nodes until `done` holds, firing timers in virtual time whenever the
/// link is quiet. Panics after `limit` of wall-clock time.
pub fn pump_until(
    a: &mut Node,
    b: &mut Node,
    link: &mut Link,
    limit: Duration,
    mut done: impl FnMut(&mut Node, &mut Node) -> bool,
) {
    let start = Instant::now();
    let mut vt = Instant::now();
    loop {
        if done(a, b) {
            return;
        }
        assert!(start.elapsed() < limit, "pump: timed out");
        let mut moved = 0;
        for f in std::mem::take(&mut a.dev.outbox(0).frames) {
            if link.filter_ab.as_mut().is_none_or(|flt| flt(&f)) {
                let _ = link.ab.send(&f);
            }
        }
        let _ = link.ab.flush();
        for f in link.ab.inner().drain() {
            transport::on_frame(&b.dev, &f);
            link.frames_ab += 1;
            moved += 1;
        }
        for f in std::mem::take(&mut b.dev.outbox(0).frames) {
            if link.filter_ba.as_mut().is_none_or(|flt| flt(&f)) {
                let _ = link.ba.send(&f);
            }
        }
        let _ = link.ba.flush();
        for f in link.ba.inner().drain() {
            transport::on_frame(&a.dev, &f);
            link.frames_ba += 1;
            moved += 1;
        }
        if moved == 0 && a.dev.outbox(0).frames.is_empty() && b.dev.outbox(0).frames.is_empty() {
            // Quiet: advance virtual time to the earliest transport deadline.
            let now = Instant::now().max(vt);
            let na = transport::on_tick(&a.dev, now);
            let nb = transport::on_tick(&b.dev, now);
            if !a.dev.outbox(0).frames.is_empty() || !b.dev.outbox(0).frames.is_empty() {
                continue;
            }
            match (na, nb) {
                (None, None) => {
                    if done(a, b) {
                        return;
                    }
                    panic!("pump: idle with no timers and the condition not met");
                }
                (x, y) => {
                    let d = match (x, y) {
                        (Some(x), Some(y)) => x.min(y),
                        (Some(x), None) | (None, Some(x)) => x,
                        _ => unreachable!(),
                    };
                    vt = d.max(vt);
                    let na = transport::on_tick(&a.dev, vt);
                    let nb = transport::on_tick(&b.dev, vt);
                    let _ = (na, nb);
                }
            }
        }
    }
}

/// Pump until `cq` (a CQ of `a`) gave `n` CQEs, failing after `limit`; returns them.
pub fn pump_cqes(
    a: &mut Node,
    b: &mut Node,
    link: &mut Link,
    cq: &mut RingH,
    n: usize,
    limit: Duration,
) -> Vec<Cqe> {
    let mut got = Vec::new();
    pump_until(a, b, link, limit, |a, _| {
        got.extend(a.poll_cq(cq));
        got.len() >= n
    });
    got
}

/// Pump until both nodes are quiet with no timers left (or `limit`).
pub fn pump_idle(a: &mut Node, b: &mut Node, link: &mut Link) {
    let start = Instant::now();
    loop {
        let mut moved = 0;
        for f in std::mem::take(&mut a.dev.outbox(0).frames) {
            let _ = link.ab.send(&f);
        }
        let _ = link.ab.flush();
        for f in link.ab.inner().drain() {
            transport::on_frame(&b.dev, &f);
            moved += 1;
        }
        for f in std::mem::take(&mut b.dev.outbox(0).frames) {
            let _ = link.ba.send(&f);
        }
        let _ = link.ba.flush();
        for f in link.ba.inner().drain() {
            transport::on_frame(&a.dev, &f);
            moved += 1;
        }
        if moved == 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "pump_idle: timed out"
        );
    }
}

pub const ETH: usize = 14;
pub const IP: usize = 20;
pub const UDP: usize = 8;
/// Offset of the BTH in an untagged IPv4 RoCEv2 frame.
pub const BTH: usize = ETH + IP + UDP;

/// Fix IPv4 total length + checksum, UDP length and the ICRC of an untagged IPv4 RoCEv2 frame
/// after it was mutated, so that it passes every check before the transport.
pub fn reseal(f: &mut [u8]) {
    if f.len() < BTH + 12 + 4 {
        return;
    }
    let ip_len = (f.len() - ETH) as u16;
    f[ETH + 2..ETH + 4].copy_from_slice(&ip_len.to_be_bytes());
    f[ETH + 10] = 0;
    f[ETH + 11] = 0;
    let mut s = 0u32;
    for i in (ETH..ETH + IP).step_by(2) {
        s += u32::from(u16::from_be_bytes([f[i], f[i + 1]]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    f[ETH + 10..ETH + 12].copy_from_slice(&(!(s as u16)).to_be_bytes());
    let udp_len = (f.len() - ETH - IP) as u16;
    f[ETH + IP + 4..ETH + IP + 6].copy_from_slice(&udp_len.to_be_bytes());
    let n = f.len();
    // Only fails on headers shorter than checked above; then the frame stays unsealed.
    if let Ok(c) =
        vrdma_backend::wire::icrc::compute(&f[ETH..ETH + IP], &f[ETH + IP..BTH], &f[BTH..n - 4])
    {
        f[n - 4..].copy_from_slice(&c.to_le_bytes());
    }
}

/// Deterministic test data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Two UDP uplinks on loopback sending to each other (4 MiB socket buffers when allowed).
pub fn udp_pair() -> (
    vrdma_backend::uplink::UdpUplink,
    vrdma_backend::uplink::UdpUplink,
) {
    use std::net::UdpSocket;
    use std::os::unix::io::AsRawFd;
    let sa = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let sb = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for s in [&sa, &sb] {
        let v: libc::c_int = 4 << 20;
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            // SAFETY: setsockopt on a valid socket fd with a pointer to a live c_int and its size.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
    let (aa, ab) = (sa.local_addr().unwrap(), sb.local_addr().unwrap());
    (
        vrdma_backend::uplink::UdpUplink::from_socket(sa, ab).expect("uplink a"),
        vrdma_backend::uplink::UdpUplink::from_socket(sb, aa).expect("uplink b"),
    )
}

/// Move a node's device behind a mutex (for the engine thread); the node keeps its guest memory
/// handle, so rings and buffers stay usable from the test.
pub fn detach(n: &mut Node) -> Arc<HandoffLock<Device>> {
    let placeholder = Device::new(
        DeviceConfig::default(),
        GuestMem::empty(),
        Arc::new(RecordingOutput::new()),
    );
    Arc::new(HandoffLock::new(std::mem::replace(&mut n.dev, placeholder)))
}

/// Post a send WQE without touching the device (engine tests ring the doorbell via the engine).
pub fn post_send_mem(mem: &GuestMem, qp: &mut QpH, w: &Wqe) {
    let slot = 1usize << qp.sq.shift;
    let ud = qp.qp_type == VRDMA_QPT_UD || qp.qp_type == VRDMA_QPT_GSI;
    let b = w.bytes(slot, ud);
    mem.write(qp.sq.entry_gpa(qp.sq.idx), &b).unwrap();
    qp.sq.idx = qp.sq.idx.wrapping_add(1);
    mem.store_u32_release(qp.sq.ctrl(), qp.sq.idx).unwrap();
}

impl Node {
    /// A node whose device accepts ODP MRs (2 MiB chunks).
    pub fn new_odp(id: u8, mem_mib: u64) -> Node {
        let mut n = Node::new(id, mem_mib, 1500);
        n.dev.config.odp.enabled = true;
        n.dev.config.odp.implicit = true;
        *n.dev.mrs.get_mut() = vrdma_backend::memory::MrTable::new(
            n.dev.config.max_mr,
            n.mem.clone(),
            n.out.clone(),
            n.dev.config.odp.clone(),
        )
        .with_max_mw(n.dev.config.max_mw)
        .with_budget(n.dev.budget.clone());
        n
    }

    /// Explicit ODP MR over `[gpa, gpa+len)` with iova == gpa.
    pub fn reg_odp_mr(&mut self, pd: u32, gpa: u64, len: u64, access: u32) -> u32 {
        let c = VrdmaCmdRegMr {
            pdn: pd,
            access: access | VRDMA_ACCESS_ON_DEMAND,
            iova: gpa,
            length: len,
            page_shift: 12,
            npages: 0,
        };
        let r = self
            .cmd(VRDMA_CMD_REG_ODP_MR, c.as_bytes())
            .expect("reg odp mr");
        VrdmaRespRegMr::read_from(&r).unwrap().lkey
    }

    /// Answer every pending page request like the driver would for identity-mapped (iova == GPA)
    /// ODP MRs. Returns how many were answered.
    pub fn answer_page_requests(&mut self) -> usize {
        let reqs = self.out.take_page_requests();
        self.answered += reqs.len();
        for r in &reqs {
            if r.type_ != VRDMA_PAGEREQ_FAULT {
                continue;
            }
            let sp = r.iova & !(PAGE - 1);
            let ep = (r.iova + r.length + PAGE - 1) & !(PAGE - 1);
            let pages: Vec<u64> = (sp..ep).step_by(PAGE as usize).collect();
            self.page_resp(r, VRDMA_STATUS_OK, sp, &pages);
        }
        reqs.len()
    }

    /// Answer page request `r` with `status` and the writable `pages` from `iova` (an
    /// ODP_PAGE_RESP, spec §12.4), as the driver does; the device must accept it.
    pub fn page_resp(&mut self, r: &VrdmaPageReq, status: u32, iova: u64, pages: &[u64]) {
        let c = VrdmaCmdOdpPageResp {
            req_id: r.req_id,
            mr_key: r.mr_key,
            status,
            flags: VRDMA_ODP_RESP_F_WRITABLE,
            iova,
            npages: pages.len() as u32,
            reserved: 0,
        };
        self.cmd_pages(VRDMA_CMD_ODP_PAGE_RESP, &c, pages)
            .expect("page resp accepted");
    }
}

/// An RC pair that only ever carries healthy traffic, set up next to QPs that get hostile input:
/// its rounds prove that other QPs lose nothing (the "never loses another QP's data" rule).
pub struct HealthyPair {
    pub qa: QpH,
    pub qb: QpH,
    cqa: RingH,
    cqb: RingH,
    pub src: u64,
    pub dst: u64,
    pub ka: u32,
    pub kb: u32,
}

impl HealthyPair {
    /// Connected RC QPs with their own CQs and 64 KiB MRs on `a` (source) and `b` (target).
    pub fn new(a: &mut Node, b: &mut Node, pda: u32, pdb: u32) -> HealthyPair {
        let (ca, cqa) = a.create_cq(1024);
        let (cb, cqb) = b.create_cq(1024);
        let qa = a.create_qp(QpSpec::rc(pda, ca));
        let qb = b.create_qp(QpSpec::rc(pdb, cb));
        connect(a, &qa, b, &qb, 3, 14, 7, 7);
        let src = a.alloc(65536);
        let dst = b.alloc(65536);
        let ka = a.reg_mr(pda, src, 65536, ACC_ALL);
        let kb = b.reg_mr(pdb, dst, 65536, ACC_ALL);
        HealthyPair {
            qa,
            qb,
            cqa,
            cqb,
            src,
            dst,
            ka,
            kb,
        }
    }

    /// One RDMA WRITE of `write_len` bytes (≤ 32 KiB) and one SEND of `send_len` bytes (≤ 8 KiB,
    /// `send_len` ≤ `write_len`): both complete successfully, the data lands, both QPs stay in RTS.
    #[allow(clippy::too_many_arguments)]
    pub fn round(
        &mut self,
        a: &mut Node,
        b: &mut Node,
        link: &mut Link,
        round: u64,
        write_len: u32,
        send_len: u32,
    ) {
        let data = pattern(round, write_len as usize);
        a.write(self.src, &data);
        let mut rq = self.qb.rq.clone().unwrap();
        b.post_recv(&mut rq, round, &[(self.dst + 32768, 8192, self.kb)]);
        self.qb.rq = Some(rq);
        let mut qa = self.qa.clone();
        a.post_send(
            &mut qa,
            &Wqe {
                wr_id: round,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: VRDMA_SEND_SIGNALED,
                sges: vec![(self.src, write_len, self.ka)],
                remote_addr: self.dst,
                rkey: self.kb,
                ..Default::default()
            },
        );
        a.post_send(
            &mut qa,
            &Wqe {
                wr_id: round + 1_000_000,
                opcode: VRDMA_WR_SEND,
                flags: VRDMA_SEND_SIGNALED,
                sges: vec![(self.src, send_len, self.ka)],
                ..Default::default()
            },
        );
        self.qa = qa;
        let (mut ca, mut cb) = (Vec::new(), Vec::new());
        let (cqa, cqb) = (&mut self.cqa, &mut self.cqb);
        pump_until(a, b, link, Duration::from_secs(30), |a, b| {
            ca.extend(a.poll_cq(cqa));
            cb.extend(b.poll_cq(cqb));
            ca.len() >= 2 && !cb.is_empty()
        });
        assert!(
            ca.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
            "round {round}: healthy requester {ca:?}"
        );
        assert_eq!(cb.len(), 1);
        assert_eq!(cb[0].status, VRDMA_WC_SUCCESS, "round {round}");
        assert_eq!(cb[0].byte_len, send_len);
        assert_eq!(
            b.read(self.dst, write_len as usize),
            data,
            "round {round}: WRITE data"
        );
        assert_eq!(
            b.read(self.dst + 32768, send_len as usize),
            data[..send_len as usize].to_vec(),
            "round {round}: SEND data"
        );
        assert_eq!(a.qp_state(self.qa.qpn), VRDMA_QPS_RTS);
        assert_eq!(b.qp_state(self.qb.qpn), VRDMA_QPS_RTS);
    }
}
