//! Objects as the driver creates them: rings, and PD / CQ / SRQ / QP / MR / AH through their
//! commands, from the typed helpers the transport tests use to the raw request builders the
//! command-level tests vary.

use vrdma_spec::*;

use super::{gid_v4, Node, PAGE};

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

    /// [`QpSpec::rc`] sizes for a QP of `qp_type` (UC, UD, GSI...).
    pub fn of_type(qp_type: u32, pd: u32, cq: u32) -> QpSpec {
        QpSpec {
            qp_type,
            ..QpSpec::rc(pd, cq)
        }
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

impl Node {
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

    /// A CREATE_CQ request of `depth` entries over fresh pages, and those pages.
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

    /// A CREATE_QP request (SQ 256-byte slots, RQ 64-byte slots, 4 send and 3 receive SGEs,
    /// 128 inline bytes) over fresh pages, and those pages.
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

    /// A 16-deep QP from [`Node::qp_req`] with one CQ for both queues; returns its number.
    pub fn small_qp(&mut self, pdn: u32, qp_type: u32, cq: u32, srqn: Option<u32>) -> u32 {
        let (c, pages) = self.qp_req(pdn, qp_type, cq, cq, srqn, 16);
        self.ok_handle(VRDMA_CMD_CREATE_QP, &req_with_pages(&c, &pages))
    }

    /// REG_MR of `len` bytes at `iova` over fresh 4 KiB pages; returns (key, pages).
    pub fn reg_mr_iova(&mut self, pdn: u32, access: u32, iova: u64, len: u64) -> (u32, Vec<u64>) {
        let n = ((iova & (PAGE - 1)) + len).div_ceil(PAGE) as usize;
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

    /// Add a RoCEv2 GID for 10.0.0.<last> at `index`.
    pub fn add_gid_v4(&mut self, index: u32, last: u8) {
        let c = VrdmaCmdGid {
            index,
            type_: VRDMA_GID_TYPE_ROCE_V2,
            gid: gid_v4([10, 0, 0, last]),
        };
        let (s, _) = self.cmd_status(VRDMA_CMD_ADD_GID, c.as_bytes());
        assert_eq!(s, VRDMA_STATUS_OK);
    }

    /// MODIFY_QP; returns the device's status.
    pub fn modify_status(&mut self, qpn: u32, mask: u32, attr: VrdmaQpAttr) -> u32 {
        let c = VrdmaCmdModifyQp {
            qpn,
            attr_mask: mask,
            attr,
        };
        self.cmd_status(VRDMA_CMD_MODIFY_QP, c.as_bytes()).0
    }

    /// ODP_INVALIDATE [iova, iova + length) of ODP MR `key`, as the driver's MMU notifier does;
    /// the device must accept it.
    pub fn odp_invalidate(&mut self, key: u32, iova: u64, length: u64) {
        let c = VrdmaCmdOdpInvalidate {
            mr_key: key,
            reserved: 0,
            iova,
            length,
        };
        self.cmd(VRDMA_CMD_ODP_INVALIDATE, c.as_bytes())
            .expect("invalidate accepted");
    }

    /// The QP's state as QUERY_QP reports it.
    pub fn query_qp_state(&mut self, qpn: u32) -> u32 {
        let (s, r) = self.cmd_status(VRDMA_CMD_QUERY_QP, &h(qpn));
        assert_eq!(s, VRDMA_STATUS_OK);
        VrdmaQpAttr::read_from(&r).unwrap().qp_state
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

/// The bytes of a `VrdmaHandle` request for `handle`.
pub fn h(handle: u32) -> Vec<u8> {
    VrdmaHandle {
        handle,
        reserved: 0,
    }
    .as_bytes()
    .to_vec()
}

/// A valid AV towards 10.0.0.<last> (MAC 02:00:00:00:00:<last>) using sgid index 0.
pub fn av_to_host(last: u8) -> VrdmaAv {
    VrdmaAv {
        dgid: gid_v4([10, 0, 0, last]),
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

/// A REG_MR request without a page list (`npages` 0, 4 KiB pages): the ODP forms (explicit
/// ODP, implicit with iova 0 and length `u64::MAX`).
pub fn odp_mr_req(pdn: u32, access: u32, iova: u64, length: u64) -> VrdmaCmdRegMr {
    VrdmaCmdRegMr {
        pdn,
        access,
        iova,
        length,
        page_shift: 12,
        npages: 0,
    }
}
