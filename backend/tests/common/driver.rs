//! The mock driver: a `Node` is one `Device` with its own anonymous guest memory at fake GPAs and
//! a recording output, driven the way the guest driver drives it: commands through
//! `Device::handle_command` with ABI structs, rings written in guest memory, doorbells. Object
//! creation (PD, CQ, QP, MR...) is in `objects`.

use std::sync::Arc;

use vrdma_backend::device::{CmdOutcome, Device, DeviceConfig, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::{self, ctx::Cqe};
use vrdma_spec::*;

use super::{gid_v4, odp_mr_req, req_with_pages, QpH, RingH, Wqe, BASE, PAGE};

/// Guest RAM of a [`Node::bare`] device: 64 MiB at 0 and 16 MiB at 4 GiB (a hole in between).
pub const RAM0: (u64, usize) = (0, 64 << 20);
pub const RAM1: (u64, usize) = (4 << 30, 16 << 20);

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

impl Node {
    /// Translate `len` bytes at `iova` of MR `key` in PD `pd` for `access` (the MR table's
    /// `resolve`, under its write lock as the engine takes it).
    pub fn resolve(
        &self,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        access: u32,
    ) -> Result<Vec<vrdma_backend::memory::GuestRange>, vrdma_backend::memory::MrError> {
        self.dev.mrs.write().resolve(key, pd, iova, len, access)
    }

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

    /// A device without a peer, a GID or a transport flush hook, over [`RAM0`] and [`RAM1`]
    /// (a hole in between): what the command-level tests drive.
    pub fn bare() -> Node {
        Self::bare_with(DeviceConfig::default())
    }

    /// [`Node::bare`] whose device takes ODP MRs, implicit ones included.
    pub fn bare_odp() -> Node {
        let mut cfg = DeviceConfig::default();
        cfg.odp.enabled = true;
        cfg.odp.implicit = true;
        Self::bare_with(cfg)
    }

    /// [`Node::bare`] with configuration `cfg`.
    pub fn bare_with(cfg: DeviceConfig) -> Node {
        let mem = GuestMem::from_ranges(&[RAM0, RAM1]).expect("guest memory");
        let out = Arc::new(RecordingOutput::new());
        let mac = cfg.mac;
        Node {
            dev: Device::new(cfg, mem.clone(), out.clone()),
            out,
            mem,
            next: 0x10_0000,
            end: RAM0.1 as u64,
            id: 0,
            gid: [0; 16],
            mac,
            answered: 0,
        }
    }

    /// Allocate `len` bytes of guest memory (4 KiB aligned, zeroed, at least one page).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let first = self.next;
        self.pages(len.div_ceil(PAGE).max(1) as usize);
        first
    }

    /// Allocate `n` zeroed, contiguous 4 KiB pages; returns their GPAs.
    pub fn pages(&mut self, n: usize) -> Vec<u64> {
        let v: Vec<u64> = (0..n as u64).map(|i| self.next + i * PAGE).collect();
        self.next += n as u64 * PAGE;
        assert!(self.next <= self.end, "guest memory exhausted");
        v
    }

    /// Run a command that may be parked.
    pub fn submit(&mut self, op: u16, req: &[u8]) -> CmdOutcome {
        let mut resp = Vec::new();
        self.dev.handle_command(op, req, &mut resp)
    }

    /// Run a command that completes at once (panics if the device parks it); returns (status,
    /// response body).
    pub fn cmd_status(&mut self, op: u16, req: &[u8]) -> (u32, Vec<u8>) {
        let mut resp = Vec::new();
        match self.dev.handle_command(op, req, &mut resp) {
            CmdOutcome::Done(s) => (s, resp),
            CmdOutcome::Parked(t) => panic!("command {op} parked as {t:?}"),
        }
    }

    /// [`Node::cmd_status`] as a result: the response body, or the status if not OK.
    pub fn cmd(&mut self, op: u16, req: &[u8]) -> Result<Vec<u8>, u32> {
        match self.cmd_status(op, req) {
            (VRDMA_STATUS_OK, resp) => Ok(resp),
            (st, _) => Err(st),
        }
    }

    /// Run a command that must succeed and return a handle-like first u32.
    pub fn ok_handle(&mut self, op: u16, req: &[u8]) -> u32 {
        let (s, r) = self.cmd_status(op, req);
        assert_eq!(s, VRDMA_STATUS_OK, "command {op} failed");
        u32::from_le_bytes(r[0..4].try_into().unwrap())
    }

    pub fn cmd_pages<T: Abi>(&mut self, op: u16, req: &T, pages: &[u64]) -> Result<Vec<u8>, u32> {
        self.cmd(op, &req_with_pages(req, pages))
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
        post_send_mem(&self.mem, qp, w);
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
        post_recv_mem(&self.mem, ring, wr_id, sges);
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
        let c = odp_mr_req(pd, access | VRDMA_ACCESS_ON_DEMAND, gpa, len);
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

/// Post a receive WQE (spec §6.2 layout) on an RQ or SRQ ring in guest memory.
pub fn post_recv_mem(mem: &GuestMem, ring: &mut RingH, wr_id: u64, sges: &[(u64, u32, u32)]) {
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
    mem.write(ring.entry_gpa(ring.idx), &b)
        .expect("write recv wqe");
    ring.idx = ring.idx.wrapping_add(1);
    mem.store_u32_release(ring.ctrl(), ring.idx)
        .expect("rq producer");
}
