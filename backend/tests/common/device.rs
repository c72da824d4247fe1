//! One device without a peer or transport, for the device-model tests (no VM): `Env` is a
//! device over anonymous guest memory with a page allocator, plus command builders.

use std::sync::Arc;

use vrdma_backend::device::{CmdOutcome, Device, DeviceConfig, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_spec::*;

/// Guest RAM layout of the test device: 64 MiB at 0 and 16 MiB at 4 GiB (a hole in between).
pub const RAM0: (u64, usize) = (0, 64 << 20);
pub const RAM1: (u64, usize) = (4 << 30, 16 << 20);

pub struct Env {
    pub dev: Device,
    pub out: Arc<RecordingOutput>,
    pub mem: GuestMem,
    next_page: u64,
}

pub fn config() -> DeviceConfig {
    DeviceConfig::default()
}

pub fn env() -> Env {
    env_with(config())
}

pub fn env_with(cfg: DeviceConfig) -> Env {
    let mem = GuestMem::from_ranges(&[RAM0, RAM1]).expect("guest memory");
    let out = Arc::new(RecordingOutput::new());
    let dev = Device::new(cfg, mem.clone(), out.clone());
    Env {
        dev,
        out,
        mem,
        next_page: 0x10_0000,
    }
}

/// Bytes of a request: the struct followed by a page list.
pub fn req_with_pages<T: Abi>(t: &T, pages: &[u64]) -> Vec<u8> {
    let mut v = t.as_bytes().to_vec();
    for p in pages {
        v.extend_from_slice(&p.to_le_bytes());
    }
    v
}

pub fn h(handle: u32) -> Vec<u8> {
    VrdmaHandle {
        handle,
        reserved: 0,
    }
    .as_bytes()
    .to_vec()
}

impl Env {
    /// Allocate `n` zeroed, contiguous 4 KiB pages in RAM0; returns their GPAs.
    pub fn pages(&mut self, n: usize) -> Vec<u64> {
        let v: Vec<u64> = (0..n as u64).map(|i| self.next_page + i * 4096).collect();
        self.next_page += n as u64 * 4096;
        assert!(self.next_page <= RAM0.1 as u64, "test RAM exhausted");
        v
    }

    /// Run a command that completes at once (panics if the device parks it); returns (status,
    /// response body).
    pub fn cmd(&mut self, op: u16, req: &[u8]) -> (u32, Vec<u8>) {
        let mut resp = Vec::new();
        match self.dev.handle_command(op, req, &mut resp) {
            CmdOutcome::Done(s) => (s, resp),
            CmdOutcome::Parked(t) => panic!("command {op} parked as {t:?}"),
        }
    }

    /// Run a command that may be parked.
    pub fn submit(&mut self, op: u16, req: &[u8]) -> CmdOutcome {
        let mut resp = Vec::new();
        self.dev.handle_command(op, req, &mut resp)
    }

    /// Run a command that must succeed and return a handle-like first u32.
    pub fn ok_handle(&mut self, op: u16, req: &[u8]) -> u32 {
        let (s, r) = self.cmd(op, req);
        assert_eq!(s, VRDMA_STATUS_OK, "command {op} failed");
        u32::from_le_bytes(r[0..4].try_into().unwrap())
    }

    pub fn create_pd(&mut self) -> u32 {
        self.ok_handle(VRDMA_CMD_CREATE_PD, &h(0))
    }

    pub fn cq_req(&mut self, depth: u32) -> (VrdmaCmdCreateCq, Vec<u64>) {
        let n = ring_npages(depth, 64).unwrap() as usize;
        let pages = self.pages(n);
        (
            VrdmaCmdCreateCq {
                cqn: 0,
                depth,
                npages: n as u32,
                reserved: 0,
            },
            pages,
        )
    }

    /// Create a CQ; returns (cqn, page list).
    pub fn create_cq(&mut self, depth: u32) -> (u32, Vec<u64>) {
        let (c, pages) = self.cq_req(depth);
        let cqn = self.ok_handle(VRDMA_CMD_CREATE_CQ, &req_with_pages(&c, &pages));
        (cqn, pages)
    }

    /// A CREATE_QP request (SQ 64-byte... 256-byte slots, RQ 64-byte slots) and its pages.
    pub fn qp_req(
        &mut self,
        pdn: u32,
        qp_type: u32,
        scq: u32,
        rcq: u32,
        srqn: Option<u32>,
        depth: u32,
    ) -> (VrdmaCmdCreateQp, Vec<u64>) {
        let sq_n = ring_npages(depth, 256).unwrap();
        let rq_n = if srqn.is_some() {
            0
        } else {
            ring_npages(depth, 64).unwrap()
        };
        let pages = self.pages((sq_n + rq_n) as usize);
        (
            VrdmaCmdCreateQp {
                pdn,
                qp_type,
                send_cqn: scq,
                recv_cqn: rcq,
                srqn: srqn.unwrap_or(VRDMA_NO_SRQ),
                sq_depth: depth,
                rq_depth: if srqn.is_some() { 0 } else { depth },
                sq_wqe_shift: 8,
                rq_wqe_shift: 6,
                sq_sig_all: 0,
                reserved0: 0,
                max_send_sge: 4,
                max_recv_sge: 3,
                max_inline_data: 128,
                sq_npages: sq_n,
                rq_npages: rq_n,
                xrcdn: 0,
            },
            pages,
        )
    }

    pub fn create_qp(&mut self, pdn: u32, qp_type: u32, cq: u32, srqn: Option<u32>) -> u32 {
        let (c, pages) = self.qp_req(pdn, qp_type, cq, cq, srqn, 16);
        self.ok_handle(VRDMA_CMD_CREATE_QP, &req_with_pages(&c, &pages))
    }

    /// Add a RoCEv2 GID for 10.0.0.<last> at `index`.
    pub fn add_gid_v4(&mut self, index: u32, last: u8) {
        let c = VrdmaCmdGid {
            index,
            type_: VRDMA_GID_TYPE_ROCE_V2,
            gid: gid_v4(last),
        };
        let (s, _) = self.cmd(VRDMA_CMD_ADD_GID, c.as_bytes());
        assert_eq!(s, VRDMA_STATUS_OK);
    }

    pub fn modify(&mut self, qpn: u32, mask: u32, attr: VrdmaQpAttr) -> u32 {
        let c = VrdmaCmdModifyQp {
            qpn,
            attr_mask: mask,
            attr,
        };
        self.cmd(VRDMA_CMD_MODIFY_QP, c.as_bytes()).0
    }

    pub fn qp_state(&mut self, qpn: u32) -> u32 {
        let (s, r) = self.cmd(VRDMA_CMD_QUERY_QP, &h(qpn));
        assert_eq!(s, VRDMA_STATUS_OK);
        VrdmaQpAttr::read_from(&r).unwrap().qp_state
    }

    /// REG_MR over `npages` fresh 4 KiB pages; returns (key, pages).
    pub fn reg_mr(&mut self, pdn: u32, access: u32, iova: u64, len: u64) -> (u32, Vec<u64>) {
        let n = (((iova & 4095) + len).div_ceil(4096)) as usize;
        let pages = self.pages(n);
        let c = VrdmaCmdRegMr {
            pdn,
            access,
            iova,
            length: len,
            page_shift: 12,
            npages: n as u32,
        };
        let key = self.ok_handle(VRDMA_CMD_REG_MR, &req_with_pages(&c, &pages));
        (key, pages)
    }
}

/// An IPv4-mapped GID 10.0.0.<last>.
pub fn gid_v4(last: u8) -> [u8; 16] {
    super::gid_v4([10, 0, 0, last])
}

/// A valid AV towards 10.0.0.<last> using sgid index 0.
pub fn av_to(last: u8) -> VrdmaAv {
    VrdmaAv {
        dgid: gid_v4(last),
        flow_label: 0,
        sgid_index: 0,
        hop_limit: 64,
        traffic_class: 0,
        sl: 0,
        dmac: [2, 0, 0, 0, 0, last],
        vlan_id: 0xffff,
        reserved: 0,
    }
}
