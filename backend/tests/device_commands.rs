//! Control commands: happy paths, hostile inputs → defined statuses, never a panic; CQ posting,
//! CQ events and overflow, SRQ limit events, device reset.
//!
//! One long file because every command of the table is checked here the same way (happy path,
//! hostile fields, status): one binary to build instead of one per command group.

mod common;

use common::rng::XorShift;
use common::*;
use std::time::{Duration, Instant};
use vrdma_backend::device::DeviceConfig;
use vrdma_backend::guest::ring::{CTRL_CONSUMER, CTRL_CQ_ARM, CTRL_ERROR, CTRL_PRODUCER};
use vrdma_backend::objects::CqError;
use vrdma_backend::qp::QpState;
use vrdma_backend::transport;
use vrdma_spec::*;

const ALL_OPS: std::ops::RangeInclusive<u16> = 1..=35;

#[test]
fn query_device_and_port() {
    let mut e = Node::bare();
    let (s, r) = e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]);
    assert_eq!(s, VRDMA_STATUS_OK);
    assert_eq!(r.len(), 256);
    let c = VrdmaConfig::read_from(&r).unwrap();
    assert_eq!(c.max_qp, 16384);
    assert_eq!(
        c.max_mw, 65536,
        "memory windows: as many as MRs (spec §2.2)"
    );
    assert_eq!(
        c.odp_general_caps,
        VRDMA_ODP_SUPPORT | VRDMA_ODP_SUPPORT_IMPLICIT,
        "ODP on by default"
    );
    assert_eq!(c.port_state, VRDMA_PORT_ACTIVE);
    assert_eq!(e.dev.config_space(), r);
    let q = VrdmaCmdQueryPort {
        port: 1,
        reserved: 0,
    };
    let (s, r) = e.cmd_status(VRDMA_CMD_QUERY_PORT, q.as_bytes());
    assert_eq!(s, VRDMA_STATUS_OK);
    let p = VrdmaRespQueryPort::read_from(&r).unwrap();
    assert_eq!(p.active_mtu, 3, "1500-byte Ethernet → IB MTU 1024");
    assert_eq!(p.gid_tbl_len, 128);
    let q = VrdmaCmdQueryPort {
        port: 2,
        reserved: 0,
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_QUERY_PORT, q.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_QUERY_PORT, &[1, 0]).0,
        VRDMA_STATUS_INVALID
    );
}

#[test]
fn odp_caps_advertised_only_when_enabled() {
    let mut e = Node::bare();
    let (_, r) = e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]);
    let c = VrdmaConfig::read_from(&r).unwrap();
    assert_eq!(
        c.odp_general_caps,
        VRDMA_ODP_SUPPORT | VRDMA_ODP_SUPPORT_IMPLICIT
    );
    assert_ne!(c.odp_rc_caps & VRDMA_ODP_WRITE, 0);
    assert_ne!(c.odp_rc_caps & VRDMA_ODP_SRQ_RECV, 0);
    // UD receives into ODP MRs too (a faulting datagram is dropped, spec §2.2 / §14.6); UC sends only.
    assert_eq!(
        c.odp_ud_caps,
        VRDMA_ODP_SEND | VRDMA_ODP_RECV | VRDMA_ODP_SRQ_RECV
    );
    assert_eq!(c.odp_uc_caps, VRDMA_ODP_SEND);
    assert_eq!(c.odp_chunk_shift, 21);
    assert_eq!(e.dev.config.odp_feature_bits(), 0b11);
    // Disabled: no caps, no feature bits, registrations refused.
    let mut cfg = DeviceConfig::default();
    cfg.odp.enabled = false;
    cfg.odp.implicit = false;
    let mut e = Node::bare_with(cfg);
    let (_, r) = e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]);
    let c = VrdmaConfig::read_from(&r).unwrap();
    assert_eq!(
        (
            c.odp_general_caps,
            c.odp_rc_caps,
            c.odp_uc_caps,
            c.odp_ud_caps
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(e.dev.config.odp_feature_bits(), 0);
    let pd = e.create_pd();
    let mut m = odp_mr_req(pd, VRDMA_ACCESS_ON_DEMAND, 0, 4096);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_ODP_MR, m.as_bytes()).0,
        VRDMA_STATUS_NOT_SUPPORTED
    );
    m.length = u64::MAX;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_IMPLICIT_MR, m.as_bytes()).0,
        VRDMA_STATUS_NOT_SUPPORTED
    );
    // The other ODP commands are refused as well, even for a valid MR key (spec §11.2).
    let (key, _) = e.reg_mr_iova(pd, VRDMA_ACCESS_LOCAL_WRITE, 0, 4096);
    let advise = VrdmaCmdAdviseMr {
        lkey: key,
        advice: VRDMA_ADVISE_PREFETCH,
        flags: 0,
        reserved: 0,
        iova: 0,
        length: 4096,
    };
    let inval = VrdmaCmdOdpInvalidate {
        mr_key: key,
        reserved: 0,
        iova: 0,
        length: 4096,
    };
    let resp = VrdmaCmdOdpPageResp {
        req_id: 1,
        mr_key: key,
        status: VRDMA_STATUS_OK,
        flags: 0,
        iova: 0,
        npages: 0,
        reserved: 0,
    };
    for (op, body) in [
        (VRDMA_CMD_ADVISE_MR, advise.as_bytes().to_vec()),
        (VRDMA_CMD_ODP_INVALIDATE, inval.as_bytes().to_vec()),
        (VRDMA_CMD_ODP_PAGE_RESP, resp.as_bytes().to_vec()),
    ] {
        assert_eq!(
            e.cmd_status(op, &body).0,
            VRDMA_STATUS_NOT_SUPPORTED,
            "op {op}"
        );
    }
}

#[test]
fn gid_table() {
    let mut e = Node::bare();
    e.add_gid_v4(0, 1);
    assert!(e.dev.gids().is_local_ipv4("10.0.0.1".parse().unwrap()));
    assert!(!e.dev.gids().is_local_ipv4("10.0.0.2".parse().unwrap()));
    let bad_idx = VrdmaCmdGid {
        index: 128,
        type_: VRDMA_GID_TYPE_ROCE_V2,
        gid: gid_v4([10, 0, 0, 3]),
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ADD_GID, bad_idx.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    let bad_type = VrdmaCmdGid {
        index: 1,
        type_: 7,
        gid: gid_v4([10, 0, 0, 3]),
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ADD_GID, bad_type.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    let del = VrdmaCmdGid {
        index: 0,
        type_: 0,
        gid: [0; 16],
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DEL_GID, del.as_bytes()).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DEL_GID, del.as_bytes()).0,
        VRDMA_STATUS_NOT_FOUND
    );
    assert!(!e.dev.gids().is_local_ipv4("10.0.0.1".parse().unwrap()));
}

#[test]
fn pd_lifecycle_and_busy() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    assert_ne!(pd, 0);
    let (key, _) = e.reg_mr_iova(pd, 0, 0, 4096);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd)).0,
        VRDMA_STATUS_BUSY
    );
    assert_eq!(e.cmd_status(VRDMA_CMD_DEREG_MR, &h(key)).0, VRDMA_STATUS_OK);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DEREG_MR, &h(key)).0,
        VRDMA_STATUS_NOT_FOUND
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd)).0,
        VRDMA_STATUS_NOT_FOUND
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(0)).0,
        VRDMA_STATUS_NOT_FOUND
    );
    let mut e = Node::bare_with(DeviceConfig {
        max_pd: 2,
        ..DeviceConfig::default()
    });
    e.create_pd();
    e.create_pd();
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_PD, &h(0)).0,
        VRDMA_STATUS_NO_RESOURCES
    );
}

#[test]
fn cq_create_hostile_inputs() {
    let mut e = Node::bare();
    let (c, pages) = e.cq_req(64);
    let ok = req_with_pages(&c, &pages);
    // Trailing list shorter than npages.
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_CQ, &ok[..ok.len() - 8]).0,
        VRDMA_STATUS_INVALID
    );
    // Huge npages with a short list: INVALID, no huge allocation.
    let mut huge = c;
    huge.npages = u32::MAX;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_CQ, &req_with_pages(&huge, &pages))
            .0,
        VRDMA_STATUS_INVALID
    );
    // npages mismatch with depth.
    let mut m = c;
    m.npages = 1;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_CQ, &req_with_pages(&m, &pages[..1]))
            .0,
        VRDMA_STATUS_INVALID
    );
    for depth in [0, 3, 100, 1 << 17, u32::MAX] {
        let mut d = c;
        d.depth = depth;
        assert_eq!(
            e.cmd_status(VRDMA_CMD_CREATE_CQ, &req_with_pages(&d, &pages))
                .0,
            VRDMA_STATUS_INVALID,
            "depth {depth}"
        );
    }
    // Page outside guest memory (in the hole) / unaligned.
    let mut bad = pages.clone();
    bad[1] = 1 << 30;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_CQ, &req_with_pages(&c, &bad))
            .0,
        VRDMA_STATUS_BAD_ADDRESS
    );
    bad[1] = pages[1] + 8;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_CQ, &req_with_pages(&c, &bad))
            .0,
        VRDMA_STATUS_INVALID
    );
    // Pages in the second RAM region are fine.
    let high: Vec<u64> = (0..pages.len() as u64).map(|i| RAM1.0 + i * 4096).collect();
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_CQ, &req_with_pages(&c, &high))
            .0,
        VRDMA_STATUS_OK
    );
    assert_eq!(e.cmd_status(VRDMA_CMD_CREATE_CQ, &ok).0, VRDMA_STATUS_OK);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_CQ, &h(77)).0,
        VRDMA_STATUS_NOT_FOUND
    );
}

#[test]
fn qp_create_hostile_inputs() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(64);
    let (good, pages) = e.qp_req(pd, VRDMA_QPT_RC, cq, cq, None, 16);
    type Mutator = Box<dyn Fn(&mut vrdma_spec::VrdmaCmdCreateQp)>;
    let cases: Vec<(&str, u32, Mutator)> = vec![
        ("bad pd", VRDMA_STATUS_NOT_FOUND, Box::new(|c| c.pdn = 99)),
        (
            "bad send cq",
            VRDMA_STATUS_NOT_FOUND,
            Box::new(|c| c.send_cqn = 99),
        ),
        (
            "bad recv cq",
            VRDMA_STATUS_NOT_FOUND,
            Box::new(|c| c.recv_cqn = 0),
        ),
        ("bad srq", VRDMA_STATUS_NOT_FOUND, Box::new(|c| c.srqn = 5)),
        (
            "bad type",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.qp_type = 9),
        ),
        (
            "depth not pow2",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.sq_depth = 15),
        ),
        (
            "depth huge",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.sq_depth = 1 << 30),
        ),
        (
            "rq depth 0",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.rq_depth = 0),
        ),
        (
            "sq shift small",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.sq_wqe_shift = 5),
        ),
        (
            "sq shift big",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.sq_wqe_shift = 13),
        ),
        (
            "rq shift",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.rq_wqe_shift = 255),
        ),
        (
            "send sge > slot",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.max_send_sge = 13),
        ),
        (
            "send sge > dev",
            VRDMA_STATUS_INVALID,
            Box::new(|c| {
                c.sq_wqe_shift = 12;
                c.max_send_sge = 33;
            }),
        ),
        (
            "recv sge > slot",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.max_recv_sge = 4),
        ),
        (
            "inline > slot",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.max_inline_data = 193),
        ),
        (
            "npages mismatch",
            VRDMA_STATUS_INVALID,
            Box::new(|c| {
                c.sq_npages -= 1;
                c.rq_npages += 1;
            }),
        ),
        (
            "npages overflow",
            VRDMA_STATUS_INVALID,
            Box::new(|c| c.rq_npages = u32::MAX),
        ),
    ];
    for (what, want, m) in cases {
        let mut c = good;
        m(&mut c);
        assert_eq!(
            e.cmd_status(VRDMA_CMD_CREATE_QP, &req_with_pages(&c, &pages))
                .0,
            want,
            "{what}"
        );
    }
    // Page outside guest memory.
    let mut bad = pages.clone();
    bad[2] = !4095;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_QP, &req_with_pages(&good, &bad))
            .0,
        VRDMA_STATUS_BAD_ADDRESS
    );
    assert_eq!(e.dev.qps.len(), 0, "no QP leaked by failures");
    // Happy path: a random QPN in 16..0xffffff (spec §16); GSI is 1 and unique.
    let (s, r) = e.cmd_status(VRDMA_CMD_CREATE_QP, &req_with_pages(&good, &pages));
    assert_eq!(s, VRDMA_STATUS_OK);
    let qpn = u32::from_le_bytes(r[..4].try_into().unwrap());
    assert!((VRDMA_FIRST_QPN..0xff_ffff).contains(&qpn), "qpn {qpn:#x}");
    let gsi = e.small_qp(pd, VRDMA_QPT_GSI, cq, None);
    assert_eq!(gsi, VRDMA_GSI_QPN);
    let (c, p) = e.qp_req(pd, VRDMA_QPT_GSI, cq, cq, None, 16);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_QP, &req_with_pages(&c, &p)).0,
        VRDMA_STATUS_BUSY
    );
    // CQ in use.
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_CQ, &h(cq)).0,
        VRDMA_STATUS_BUSY
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_QP, &h(qpn)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_QP, &h(qpn)).0,
        VRDMA_STATUS_NOT_FOUND
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_QP, &h(gsi)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_CQ, &h(cq)).0,
        VRDMA_STATUS_OK
    );
}

#[test]
fn qp_limit_and_many_qps() {
    let mut e = Node::bare_with(DeviceConfig {
        max_qp: 3,
        ..DeviceConfig::default()
    });
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(16);
    for _ in 0..3 {
        e.small_qp(pd, VRDMA_QPT_UD, cq, None);
    }
    let (c, p) = e.qp_req(pd, VRDMA_QPT_UD, cq, cq, None, 16);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_QP, &req_with_pages(&c, &p)).0,
        VRDMA_STATUS_NO_RESOURCES
    );
    // The GSI QP does not count against max_qp.
    assert_eq!(e.small_qp(pd, VRDMA_QPT_GSI, cq, None), 1);
}

#[test]
fn srq_lifecycle_limit_and_events() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(16);
    let n = ring_npages(16, 64).unwrap();
    let pages = e.pages(n as usize);
    let mut c = VrdmaCmdCreateSrq {
        pdn: pd,
        depth: 16,
        wqe_shift: 6,
        srq_type: 0,
        reserved0: [0; 2],
        xrcdn: 0,
        cqn: 0,
        max_sge: 3,
        srq_limit: 0,
        npages: n,
    };
    let mut bad = c;
    bad.max_sge = 4;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_SRQ, &req_with_pages(&bad, &pages))
            .0,
        VRDMA_STATUS_INVALID
    );
    bad = c;
    bad.srq_limit = 17;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_SRQ, &req_with_pages(&bad, &pages))
            .0,
        VRDMA_STATUS_INVALID
    );
    bad = c;
    bad.pdn = 42;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_SRQ, &req_with_pages(&bad, &pages))
            .0,
        VRDMA_STATUS_NOT_FOUND
    );
    c.srq_limit = 0;
    let srqn = e.ok_handle(VRDMA_CMD_CREATE_SRQ, &req_with_pages(&c, &pages));
    let modify = |srqn, mask, limit| VrdmaCmdModifySrq {
        srqn,
        attr_mask: mask,
        max_wr: 32,
        srq_limit: limit,
        npages: 0,
        reserved: 0,
    };
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            modify(srqn, VRDMA_SRQ_MAX_WR, 0).as_bytes()
        )
        .0,
        VRDMA_STATUS_INVALID,
        "a resize without the new ring's pages"
    );
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            modify(srqn, VRDMA_SRQ_LIMIT, 17).as_bytes()
        )
        .0,
        VRDMA_STATUS_INVALID
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_MODIFY_SRQ, modify(srqn, 4, 1).as_bytes())
            .0,
        VRDMA_STATUS_INVALID
    );
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            modify(srqn, VRDMA_SRQ_LIMIT, 3).as_bytes()
        )
        .0,
        VRDMA_STATUS_OK
    );
    let (s, r) = e.cmd_status(VRDMA_CMD_QUERY_SRQ, &h(srqn));
    assert_eq!(s, VRDMA_STATUS_OK);
    let q = VrdmaRespQuerySrq::read_from(&r).unwrap();
    assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (16, 3, 3));
    // Post 4 receive WQEs, take them: the limit event fires once when fewer than 3 remain.
    for i in 0..4u8 {
        let ring = &e.dev.srqs().get(srqn).unwrap().ring;
        ring.write_entry(&e.mem, i as u32, &[i; 16]).unwrap();
    }
    e.mem
        .store_u32_release(pages[0] + CTRL_PRODUCER, 4)
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(e.dev.srq_pop(srqn, &mut buf).unwrap());
    assert_eq!(buf[0], 0);
    assert!(
        e.out.take_events().is_empty(),
        "3 left: not below the limit"
    );
    assert!(e.dev.srq_pop(srqn, &mut buf).unwrap());
    let ev = e.out.take_events();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].type_, ev[0].id, ev[0].info),
        (VRDMA_EV_SRQ_LIMIT_REACHED, srqn, 3),
        "§9: info = the limit"
    );
    assert!(e.dev.srq_pop(srqn, &mut buf).unwrap());
    assert!(e.dev.srq_pop(srqn, &mut buf).unwrap());
    assert_eq!(buf[0], 3);
    assert!(!e.dev.srq_pop(srqn, &mut buf).unwrap(), "empty");
    assert!(e.out.take_events().is_empty(), "disarmed after one event");
    assert_eq!(e.mem.load_u32_acquire(pages[0] + CTRL_CONSUMER).unwrap(), 4);
    // Index error → SRQ_ERR.
    e.mem
        .store_u32_release(pages[0] + CTRL_PRODUCER, 100)
        .unwrap();
    assert!(e.dev.srq_pop(srqn, &mut buf).is_err());
    let ev = e.out.take_events();
    assert_eq!(ev[0].type_, VRDMA_EV_SRQ_ERR);
    assert_eq!(e.mem.load_u32_acquire(pages[0] + CTRL_ERROR).unwrap(), 2);
    // QP attached → BUSY; with SRQ, rq_depth must be 0.
    let (mut qc, qp_pages) = e.qp_req(pd, VRDMA_QPT_RC, cq, cq, Some(srqn), 16);
    qc.rq_depth = 16;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_QP, &req_with_pages(&qc, &qp_pages))
            .0,
        VRDMA_STATUS_INVALID
    );
    let qpn = e.small_qp(pd, VRDMA_QPT_RC, cq, Some(srqn));
    assert!(e.dev.qps.get(qpn).unwrap().rq.is_none());
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_SRQ, &h(srqn)).0,
        VRDMA_STATUS_BUSY
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_QP, &h(qpn)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_SRQ, &h(srqn)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_QUERY_SRQ, &h(srqn)).0,
        VRDMA_STATUS_NOT_FOUND
    );
}

/// Create an SRQ of `depth` 64-byte slots; returns (srqn, its pages).
fn srq_of(e: &mut Node, pd: u32, depth: u32, limit: u32) -> (u32, Vec<u64>) {
    let n = ring_npages(depth, 64).unwrap();
    let pages = e.pages(n as usize);
    let c = VrdmaCmdCreateSrq {
        pdn: pd,
        depth,
        wqe_shift: 6,
        srq_type: 0,
        reserved0: [0; 2],
        xrcdn: 0,
        cqn: 0,
        max_sge: 3,
        srq_limit: limit,
        npages: n,
    };
    (
        e.ok_handle(VRDMA_CMD_CREATE_SRQ, &req_with_pages(&c, &pages)),
        pages,
    )
}

fn resize_req(srqn: u32, mask: u32, depth: u32, limit: u32, pages: &[u64]) -> Vec<u8> {
    let c = VrdmaCmdModifySrq {
        srqn,
        attr_mask: mask,
        max_wr: depth,
        srq_limit: limit,
        npages: pages.len() as u32,
        reserved: 0,
    };
    req_with_pages(&c, pages)
}

/// §11.7 MODIFY_SRQ with MAX_WR: posted WQEs move to slots 0..n-1 of the new ring, in order,
/// whole slots; refused (old ring kept) below the posted count or an armed limit.
#[test]
fn srq_resize_moves_posted_wqes() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let (srqn, old) = srq_of(&mut e, pd, 8, 0);
    let (_, r) = e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]);
    let cfg = VrdmaConfig::read_from(&r).unwrap();
    assert_ne!(cfg.device_caps & VRDMA_DEVCAP_SRQ_RESIZE, 0);
    // Post 8 (the ring is full), take 3: WQEs 3..7 are posted, the indices have moved on.
    for i in 0..8u32 {
        let ring = &e.dev.srqs().get(srqn).unwrap().ring;
        let mut slot = [i as u8; 64];
        slot[63] = 0xa0 | i as u8; // the last byte of the slot travels too
        ring.write_entry(&e.mem, i, &slot).unwrap();
    }
    e.mem.store_u32_release(old[0] + CTRL_PRODUCER, 8).unwrap();
    let mut buf = [0u8; 16];
    for _ in 0..3 {
        assert!(e.dev.srq_pop(srqn, &mut buf).unwrap());
    }
    // Too shallow for 5 posted WQEs, and a limit above the new depth: INVALID, nothing changes.
    let small = e.pages(ring_npages(4, 64).unwrap() as usize);
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_MAX_WR, 4, 0, &small)
        )
        .0,
        VRDMA_STATUS_INVALID
    );
    let big = e.pages(ring_npages(32, 64).unwrap() as usize);
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_MAX_WR | VRDMA_SRQ_LIMIT, 32, 33, &big)
        )
        .0,
        VRDMA_STATUS_INVALID
    );
    // Wrong page count for the depth.
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_MAX_WR, 128, 0, &big)
        )
        .0,
        VRDMA_STATUS_INVALID
    );
    assert_eq!(e.dev.srqs().get(srqn).unwrap().ring.depth(), 8);
    assert_eq!(e.dev.srqs().get(srqn).unwrap().limit, 0);
    // Grow to 32 with a limit of 4 in the same command.
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_MAX_WR | VRDMA_SRQ_LIMIT, 32, 4, &big)
        )
        .0,
        VRDMA_STATUS_OK
    );
    let (_, r) = e.cmd_status(VRDMA_CMD_QUERY_SRQ, &h(srqn));
    let q = VrdmaRespQuerySrq::read_from(&r).unwrap();
    assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (32, 3, 4));
    assert_eq!(e.mem.load_u32_acquire(big[0] + CTRL_PRODUCER).unwrap(), 5);
    assert_eq!(e.mem.load_u32_acquire(big[0] + CTRL_CONSUMER).unwrap(), 0);
    assert_eq!(e.mem.load_u32_acquire(big[0] + CTRL_ERROR).unwrap(), 0);
    let mut slot = [0u8; 64];
    e.mem.read(big[1] + 4 * 64, &mut slot).unwrap();
    assert_eq!((slot[0], slot[63]), (7, 0xa7), "slot 4 holds WQE 7, whole");
    // The device takes WQEs 3, 4 from the new ring; 3 left < 4 fires the new limit.
    e.dev.srq_pop(srqn, &mut buf).unwrap();
    assert_eq!(buf[0], 3);
    assert!(e.out.take_events().is_empty(), "4 left");
    e.dev.srq_pop(srqn, &mut buf).unwrap();
    assert_eq!(buf[0], 4);
    let ev = e.out.take_events();
    assert_eq!(
        (ev.len(), ev[0].type_, ev[0].info),
        (1, VRDMA_EV_SRQ_LIMIT_REACHED, 4)
    );
    assert_eq!(e.mem.load_u32_acquire(big[0] + CTRL_CONSUMER).unwrap(), 2);
    // The guest posts at the new producer; the old ring is no longer read.
    e.mem.write(big[1] + 5 * 64, &[9u8; 16]).unwrap();
    e.mem.store_u32_release(big[0] + CTRL_PRODUCER, 6).unwrap();
    e.mem
        .store_u32_release(old[0] + CTRL_PRODUCER, 100)
        .unwrap();
    for want in [5, 6, 7, 9] {
        assert!(e.dev.srq_pop(srqn, &mut buf).unwrap());
        assert_eq!(buf[0], want);
    }
    assert!(!e.dev.srq_pop(srqn, &mut buf).unwrap(), "empty");
    // Shrink to 4 while empty: allowed. A broken SRQ cannot be resized.
    let small = e.pages(ring_npages(4, 64).unwrap() as usize);
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_MAX_WR, 4, 0, &small)
        )
        .0,
        VRDMA_STATUS_OK
    );
    e.mem
        .store_u32_release(small[0] + CTRL_PRODUCER, 50)
        .unwrap();
    assert!(e.dev.srq_pop(srqn, &mut buf).is_err());
    let again = e.pages(ring_npages(8, 64).unwrap() as usize);
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_MAX_WR, 8, 0, &again)
        )
        .0,
        VRDMA_STATUS_INVALID
    );
    // Pages without MAX_WR: INVALID.
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_MODIFY_SRQ,
            &resize_req(srqn, VRDMA_SRQ_LIMIT, 8, 0, &again)
        )
        .0,
        VRDMA_STATUS_INVALID
    );
}

#[test]
fn ah_create_and_pd_check() {
    let mut e = Node::bare();
    e.add_gid_v4(0, 1);
    let pd = e.create_pd();
    let pd2 = e.create_pd();
    let c = VrdmaCmdCreateAh {
        pdn: pd,
        reserved: 0,
        av: av_to_host(2),
    };
    let ah = e.ok_handle(VRDMA_CMD_CREATE_AH, c.as_bytes());
    assert!(e.dev.ahs().lookup_in_pd(ah, pd).is_some());
    assert!(e.dev.ahs().lookup_in_pd(ah, pd2).is_none());
    assert_eq!(e.dev.ahs().get(ah).unwrap().sgid, gid_v4([10, 0, 0, 1]));
    let mut bad = c;
    bad.av.sgid_index = 9;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_AH, bad.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    bad = c;
    bad.pdn = 99;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_CREATE_AH, bad.as_bytes()).0,
        VRDMA_STATUS_NOT_FOUND
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd)).0,
        VRDMA_STATUS_BUSY
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_AH, &h(ah)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_AH, &h(ah)).0,
        VRDMA_STATUS_NOT_FOUND
    );
}

#[test]
fn mr_commands() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let (key, pages) = e.reg_mr_iova(pd, VRDMA_ACCESS_LOCAL_WRITE, 0x7000_0000, 8192);
    assert_eq!(pages.len(), 2);
    let r = e
        .resolve(key, pd, 0x7000_0000, 8192, VRDMA_ACCESS_LOCAL_WRITE)
        .unwrap();
    assert_eq!(r.len(), 1, "contiguous test pages coalesce");
    let mk = |pdn, access, npages| VrdmaCmdRegMr {
        pdn,
        access,
        iova: 0,
        length: 4096,
        page_shift: 12,
        npages,
    };
    let p = e.pages(1);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_MR, &req_with_pages(&mk(99, 0, 1), &p))
            .0,
        VRDMA_STATUS_NOT_FOUND
    );
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_REG_MR,
            &req_with_pages(&mk(pd, VRDMA_ACCESS_REMOTE_WRITE, 1), &p)
        )
        .0,
        VRDMA_STATUS_ACCESS
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_MR, &req_with_pages(&mk(pd, 0, 1), &[3 << 30]))
            .0,
        VRDMA_STATUS_BAD_ADDRESS
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_MR, &req_with_pages(&mk(pd, 0, 2), &p))
            .0,
        VRDMA_STATUS_INVALID,
        "trailing list shorter than npages"
    );
    // DMA MR.
    let (s, r) = e.cmd_status(
        VRDMA_CMD_REG_DMA_MR,
        mk(pd, VRDMA_ACCESS_LOCAL_WRITE, 0).as_bytes(),
    );
    assert_eq!(s, VRDMA_STATUS_OK);
    let m = VrdmaRespRegMr::read_from(&r).unwrap();
    assert_eq!(m.lkey, m.rkey);
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_REG_DMA_MR,
            mk(pd, VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_READ, 0).as_bytes()
        )
        .0,
        VRDMA_STATUS_ACCESS
    );
    // Fast-reg.
    let (s, _) = e.cmd_status(VRDMA_CMD_ALLOC_FAST_REG_MR, mk(pd, 0, 16).as_bytes());
    assert_eq!(s, VRDMA_STATUS_OK);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ALLOC_FAST_REG_MR, mk(pd, 0, 100_000).as_bytes())
            .0,
        VRDMA_STATUS_INVALID
    );
    // ODP registrations: explicit needs a length, implicit needs iova 0 / length u64::MAX.
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_REG_ODP_MR,
            mk(pd, VRDMA_ACCESS_ON_DEMAND, 0).as_bytes()
        )
        .0,
        VRDMA_STATUS_OK
    );
    let mut zero = mk(pd, VRDMA_ACCESS_ON_DEMAND, 0);
    zero.length = 0;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_ODP_MR, zero.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    let mut imp = mk(pd, VRDMA_ACCESS_ON_DEMAND, 0);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_IMPLICIT_MR, imp.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    imp.length = u64::MAX;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_IMPLICIT_MR, imp.as_bytes()).0,
        VRDMA_STATUS_OK
    );
}

/// REREG_MR keeps the key and swaps PD, access, range and pages; every refusal leaves the MR as
/// it was (spec §11.6).
#[test]
fn rereg_mr_keeps_key_and_refusals_change_nothing() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let pd2 = e.create_pd();
    let rw = VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE;
    let (key, old_pages) = e.reg_mr_iova(pd, rw, 0x7000_0000, 8192);
    let new_pages = e.pages(1);
    let rereg = |key, pdn, access, iova, length, npages| VrdmaCmdReregMr {
        key,
        pdn,
        access,
        page_shift: 12,
        iova,
        length,
        npages,
        reserved: 0,
    };
    let unchanged = |e: &mut Node| {
        let r = e.resolve(key, pd, 0x7000_0000, 8192, rw).unwrap();
        assert_eq!(r[0].gpa, old_pages[0], "the MR still maps its old pages");
    };
    let cases: [(VrdmaCmdReregMr, Vec<u64>, u32, &str); 7] = [
        (
            rereg(key ^ 1, pd, rw, 0, 4096, 1),
            new_pages.clone(),
            VRDMA_STATUS_NOT_FOUND,
            "stale key",
        ),
        (
            rereg(0x7f00, pd, rw, 0, 4096, 1),
            new_pages.clone(),
            VRDMA_STATUS_NOT_FOUND,
            "unknown key",
        ),
        (
            rereg(key, 999, rw, 0, 4096, 1),
            new_pages.clone(),
            VRDMA_STATUS_NOT_FOUND,
            "unknown pd",
        ),
        (
            rereg(key, pd, rw, 0, 8192, 1),
            new_pages.clone(),
            VRDMA_STATUS_INVALID,
            "npages != range",
        ),
        (
            rereg(key, pd, rw, 0, 4096, 1),
            vec![3 << 30],
            VRDMA_STATUS_BAD_ADDRESS,
            "page outside RAM",
        ),
        (
            rereg(key, pd, VRDMA_ACCESS_REMOTE_WRITE, 0, 4096, 1),
            new_pages.clone(),
            VRDMA_STATUS_ACCESS,
            "remote write without local write",
        ),
        (
            rereg(key, pd, rw | VRDMA_ACCESS_ON_DEMAND, 0, 4096, 1),
            new_pages.clone(),
            VRDMA_STATUS_INVALID,
            "ON_DEMAND",
        ),
    ];
    for (c, pages, want, why) in cases {
        let (st, body) = e.cmd_status(VRDMA_CMD_REREG_MR, &req_with_pages(&c, &pages));
        assert_eq!(st, want, "{why}");
        assert!(body.is_empty(), "{why}: no response body on error");
        unchanged(&mut e);
    }
    // A truncated page list.
    let c = rereg(key, pd, rw, 0, 8192, 2);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REREG_MR, &req_with_pages(&c, &new_pages))
            .0,
        VRDMA_STATUS_INVALID
    );
    unchanged(&mut e);

    // Success: new PD, read-only remote access, one new page at iova 0x1000. Same key.
    let ro = VRDMA_ACCESS_REMOTE_READ;
    let c = rereg(key, pd2, ro, 0x1000, 4096, 1);
    let (st, body) = e.cmd_status(VRDMA_CMD_REREG_MR, &req_with_pages(&c, &new_pages));
    assert_eq!(st, VRDMA_STATUS_OK);
    let r = VrdmaRespRegMr::read_from(&body).unwrap();
    assert_eq!((r.lkey, r.rkey), (key, key), "the keys do not change");
    let m = e.resolve(key, pd2, 0x1000, 4096, ro).unwrap();
    assert_eq!(m[0].gpa, new_pages[0]);
    assert!(e.resolve(key, pd, 0x1000, 4096, ro).is_err(), "old PD");
    assert!(
        e.resolve(key, pd2, 0x7000_0000, 4096, ro).is_err(),
        "old range"
    );
    assert!(
        e.resolve(key, pd2, 0x1000, 4096, rw).is_err(),
        "write access was removed"
    );
    // The old PD has no MR left; the new one has.
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_DESTROY_PD, &h(pd2)).0,
        VRDMA_STATUS_BUSY
    );

    // Only REG_MR MRs can be re-registered.
    let mk = |access, length| odp_mr_req(pd2, access, 0, length);
    let dma = e.ok_handle(
        VRDMA_CMD_REG_DMA_MR,
        mk(VRDMA_ACCESS_LOCAL_WRITE, 0).as_bytes(),
    );
    let odp = e.ok_handle(
        VRDMA_CMD_REG_ODP_MR,
        mk(VRDMA_ACCESS_ON_DEMAND, 4096).as_bytes(),
    );
    for k in [dma, odp] {
        let c = rereg(k, pd2, 0, 0, 4096, 1);
        assert_eq!(
            e.cmd_status(VRDMA_CMD_REREG_MR, &req_with_pages(&c, &new_pages))
                .0,
            VRDMA_STATUS_NOT_SUPPORTED
        );
    }
    // After DEREG_MR the key is gone.
    assert_eq!(e.cmd_status(VRDMA_CMD_DEREG_MR, &h(key)).0, VRDMA_STATUS_OK);
    let c = rereg(key, pd2, 0, 0, 4096, 1);
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REREG_MR, &req_with_pages(&c, &new_pages))
            .0,
        VRDMA_STATUS_NOT_FOUND
    );
}

#[test]
fn post_cqe_arm_and_overflow() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let (
        cq,
        RingH {
            pages: cq_pages, ..
        },
    ) = e.create_cq(4);
    let qpn = e.small_qp(pd, VRDMA_QPT_RC, cq, None);
    e.dev.qps.get_mut(qpn).unwrap().state = QpState::Rts;
    let ctrl = cq_pages[0];
    let cqe = |wr_id| VrdmaCqe {
        wr_id,
        qpn,
        ..VrdmaCqe::ZERO
    };
    e.mem.store_u32_release(ctrl + CTRL_CQ_ARM, 1).unwrap();
    e.dev.post_cqe(cq, &cqe(1), false).unwrap();
    e.dev.post_cqe(cq, &cqe(2), false).unwrap();
    let ev = e.out.take_events();
    assert_eq!(ev.len(), 1, "one event per arm");
    assert_eq!((ev[0].type_, ev[0].id), (VRDMA_EV_CQ_COMP, cq));
    assert_eq!(e.mem.load_u32_acquire(ctrl + CTRL_PRODUCER).unwrap(), 2);
    let mut b = [0u8; 64];
    e.mem.read(cq_pages[1] + 64, &mut b).unwrap();
    assert_eq!(VrdmaCqe::read_from(&b).unwrap().wr_id, 2);
    // SOLICITED arm: an unsolicited success does not fire, an error does.
    e.mem.store_u32_release(ctrl + CTRL_CQ_ARM, 2).unwrap();
    e.dev.post_cqe(cq, &cqe(3), false).unwrap();
    assert!(e.out.take_events().is_empty());
    let mut err = cqe(4);
    err.status = VRDMA_WC_LOC_PROT_ERR;
    e.dev.post_cqe(cq, &err, false).unwrap();
    assert_eq!(e.out.take_events()[0].type_, VRDMA_EV_CQ_COMP);
    // Full (4 unpolled): overflow → CQ error, CQ_ERR, the QP goes to ERR with QP_FATAL.
    assert_eq!(e.dev.post_cqe(cq, &cqe(5), false), Err(CqError::Overflow));
    assert_eq!(e.mem.load_u32_acquire(ctrl + CTRL_ERROR).unwrap(), 1);
    let ev = e.out.take_events();
    assert!(ev.iter().any(|x| x.type_ == VRDMA_EV_CQ_ERR && x.id == cq));
    assert!(ev
        .iter()
        .any(|x| x.type_ == VRDMA_EV_QP_FATAL && x.id == qpn));
    assert_eq!(e.query_qp_state(qpn), VRDMA_QPS_ERR);
    assert_eq!(e.dev.post_cqe(cq, &cqe(6), false), Err(CqError::Broken));
    assert_eq!(e.dev.post_cqe(999, &cqe(6), false), Err(CqError::Broken));
}

/// Spec §5.5: a moderated, armed CQ signals after `cq_count` qualifying CQEs or `cq_period` µs
/// after the first of them, whichever comes first; errors are not held back.
#[test]
fn cq_moderation_count_period_and_errors() {
    let mut e = Node::bare();
    let (_, r) = e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]);
    let cfg = VrdmaConfig::read_from(&r).unwrap();
    assert_ne!(cfg.device_caps & VRDMA_DEVCAP_CQ_MODERATION, 0);
    let (cq, RingH { pages, .. }) = e.create_cq(64);
    let ctrl = pages[0];
    let arm = |e: &mut Node| e.mem.store_u32_release(ctrl + CTRL_CQ_ARM, 1).unwrap();
    let ok = |wr_id| VrdmaCqe {
        wr_id,
        ..VrdmaCqe::ZERO
    };
    let modify = |cqn, count, period| VrdmaCmdModifyCq {
        cqn,
        cq_count: count,
        cq_period: period,
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_MODIFY_CQ, modify(cq + 100, 4, 1000).as_bytes())
            .0,
        VRDMA_STATUS_NOT_FOUND
    );
    // A period long enough that only the count can fire in this part of the test.
    assert_eq!(
        e.cmd_status(VRDMA_CMD_MODIFY_CQ, modify(cq, 4, 60_000).as_bytes())
            .0,
        VRDMA_STATUS_OK
    );
    arm(&mut e);
    for i in 0..3 {
        e.dev.post_cqe(cq, &ok(i), false).unwrap();
    }
    assert!(e.out.take_events().is_empty(), "3 < count 4: held back");
    assert_eq!(
        e.mem.load_u32_acquire(ctrl + CTRL_CQ_ARM).unwrap(),
        1,
        "still armed"
    );
    let next = transport::on_tick(&e.dev, Instant::now());
    assert!(next.is_some(), "the period timer is running");
    assert!(e.out.take_events().is_empty());
    e.dev.post_cqe(cq, &ok(3), false).unwrap();
    let ev = e.out.take_events();
    assert_eq!(
        (ev.len(), ev[0].type_),
        (1, VRDMA_EV_CQ_COMP),
        "the 4th fires"
    );
    assert_eq!(e.mem.load_u32_acquire(ctrl + CTRL_CQ_ARM).unwrap(), 0);
    // The stale timer of that round does nothing, even once expired.
    transport::on_tick(&e.dev, Instant::now() + Duration::from_secs(120));
    arm(&mut e);
    transport::on_tick(&e.dev, Instant::now() + Duration::from_secs(120));
    assert!(e.out.take_events().is_empty(), "no CQE held: nothing fires");
    // Period: one CQE, then the timer expires.
    e.dev.post_cqe(cq, &ok(4), false).unwrap();
    assert!(e.out.take_events().is_empty());
    transport::on_tick(&e.dev, Instant::now());
    assert!(e.out.take_events().is_empty(), "not yet");
    transport::on_tick(&e.dev, Instant::now() + Duration::from_secs(61));
    let ev = e.out.take_events();
    assert_eq!(
        (ev.len(), ev[0].type_),
        (1, VRDMA_EV_CQ_COMP),
        "the period fires"
    );
    // An error CQE is not held back.
    arm(&mut e);
    e.dev.post_cqe(cq, &ok(5), false).unwrap();
    let mut err = ok(6);
    err.status = VRDMA_WC_WR_FLUSH_ERR;
    e.dev.post_cqe(cq, &err, false).unwrap();
    assert_eq!(e.out.take_events().len(), 1, "error: at once");
    // Unarmed CQEs are not counted: after arming, 3 more are still below the count.
    for i in 7..10 {
        e.dev.post_cqe(cq, &ok(i), false).unwrap();
    }
    arm(&mut e);
    for i in 10..13 {
        e.dev.post_cqe(cq, &ok(i), false).unwrap();
    }
    assert!(e.out.take_events().is_empty());
    e.dev.post_cqe(cq, &ok(13), false).unwrap();
    assert_eq!(e.out.take_events().len(), 1);
    // count < 2 turns moderation off: every CQE fires as §5.3.
    e.cmd_status(VRDMA_CMD_MODIFY_CQ, modify(cq, 1, 100).as_bytes());
    arm(&mut e);
    e.dev.post_cqe(cq, &ok(14), false).unwrap();
    assert_eq!(e.out.take_events().len(), 1);
}

#[test]
fn resize_cq_keeps_unpolled_cqes() {
    let mut e = Node::bare();
    let (cq, RingH { pages, .. }) = e.create_cq(4);
    for i in 0..3 {
        let c = VrdmaCqe {
            wr_id: 100 + i,
            ..VrdmaCqe::ZERO
        };
        e.dev.post_cqe(cq, &c, false).unwrap();
    }
    e.mem
        .store_u32_release(pages[0] + CTRL_CONSUMER, 1)
        .unwrap();
    // Too small for 2 unpolled CQEs? depth 1 → INVALID.
    let (mut c1, p1) = e.cq_req(1);
    c1.cqn = cq;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_RESIZE_CQ, &req_with_pages(&c1, &p1))
            .0,
        VRDMA_STATUS_INVALID
    );
    let (mut c, p) = e.cq_req(64);
    c.cqn = cq;
    let (s, r) = e.cmd_status(VRDMA_CMD_RESIZE_CQ, &req_with_pages(&c, &p));
    assert_eq!(s, VRDMA_STATUS_OK);
    assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), 2);
    assert_eq!(e.mem.load_u32_acquire(p[0] + CTRL_PRODUCER).unwrap(), 2);
    let mut b = [0u8; 64];
    e.mem.read(p[1], &mut b).unwrap();
    assert_eq!(VrdmaCqe::read_from(&b).unwrap().wr_id, 101);
    e.dev
        .post_cqe(
            cq,
            &VrdmaCqe {
                wr_id: 7,
                ..VrdmaCqe::ZERO
            },
            false,
        )
        .unwrap();
    e.mem.read(p[1] + 128, &mut b).unwrap();
    assert_eq!(VrdmaCqe::read_from(&b).unwrap().wr_id, 7);
    c.cqn = 55;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_RESIZE_CQ, &req_with_pages(&c, &p)).0,
        VRDMA_STATUS_NOT_FOUND
    );
}

/// A shrink is refused when the unpolled CQEs plus the send WQEs still owed a completion would
/// not fit: sends complete asynchronously, so the driver could not size the CQ safely otherwise.
#[test]
fn resize_cq_counts_outstanding_sends() {
    let mut e = Node::bare();
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(8);
    let (q, qpages) = e.qp_req(pd, VRDMA_QPT_RC, cq, cq, None, 16);
    e.ok_handle(VRDMA_CMD_CREATE_QP, &req_with_pages(&q, &qpages));
    // Six WQEs posted (producer written, doorbell not yet seen): each will write a CQE.
    e.mem
        .store_u32_release(qpages[0] + CTRL_PRODUCER, 6)
        .unwrap();
    let resize = |e: &mut Node, depth| {
        let (mut c, p) = e.cq_req(depth);
        c.cqn = cq;
        e.cmd_status(VRDMA_CMD_RESIZE_CQ, &req_with_pages(&c, &p)).0
    };
    assert_eq!(resize(&mut e, 4), VRDMA_STATUS_INVALID, "6 owed > 4");
    assert_eq!(resize(&mut e, 8), VRDMA_STATUS_OK, "6 owed <= 8");
    // A nonsense producer (more than the SQ depth ahead) does not block resizing.
    e.mem
        .store_u32_release(qpages[0] + CTRL_PRODUCER, 1000)
        .unwrap();
    assert_eq!(resize(&mut e, 4), VRDMA_STATUS_OK);
}

#[test]
fn short_and_empty_requests_never_panic() {
    let mut e = Node::bare();
    e.create_pd();
    for op in ALL_OPS.chain([VRDMA_CMD_ATTACH_MCAST, VRDMA_CMD_DETACH_MCAST]) {
        for len in 0..8 {
            let (s, _) = e.cmd_status(op, &vec![0u8; len]);
            // Requests that carry nothing (CREATE_PD, ALLOC_XRCD) succeed on any length.
            if op == VRDMA_CMD_QUERY_DEVICE
                || op == VRDMA_CMD_CREATE_PD
                || op == VRDMA_CMD_ALLOC_XRCD
            {
                assert_eq!(s, VRDMA_STATUS_OK, "op {op}");
            } else {
                assert_eq!(s, VRDMA_STATUS_INVALID, "op {op} with {len} bytes");
            }
        }
    }
    assert_eq!(e.cmd_status(0, &[]).0, VRDMA_STATUS_INVALID);
    assert_eq!(e.cmd_status(36, &[0; 64]).0, VRDMA_STATUS_INVALID);
    assert_eq!(e.cmd_status(39, &[0; 64]).0, VRDMA_STATUS_INVALID);
    assert_eq!(e.cmd_status(42, &[0; 64]).0, VRDMA_STATUS_INVALID);
    assert_eq!(e.cmd_status(u16::MAX, &[0; 64]).0, VRDMA_STATUS_INVALID);
}

#[test]
fn random_commands_never_panic() {
    let mut e = Node::bare_odp();
    e.add_gid_v4(0, 1);
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(16);
    e.small_qp(pd, VRDMA_QPT_RC, cq, None);
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    for _ in 0..20_000 {
        let op = (rng.next() % 30) as u16;
        let len = (rng.next() % 200) as usize;
        let mut req: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Make handles plausible half of the time so deeper paths run.
        if len >= 8 && rng.next().is_multiple_of(2) {
            let small = (rng.next() % 20) as u32;
            req[..4].copy_from_slice(&small.to_le_bytes());
        }
        let (s, _) = e.cmd_status(op, &req);
        assert!(s <= VRDMA_STATUS_NEEDS_RESET, "status {s}");
    }
}

#[test]
fn reset_returns_to_power_on() {
    let mut e = Node::bare();
    e.add_gid_v4(0, 1);
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(16);
    let qpn = e.small_qp(pd, VRDMA_QPT_RC, cq, None);
    e.small_qp(pd, VRDMA_QPT_GSI, cq, None);
    e.reg_mr_iova(pd, 0, 0, 4096);
    e.dev.reset();
    assert!(e.dev.qps.is_empty());
    assert_eq!(e.dev.mrs.write().len(), 0);
    assert!(e.dev.pds().is_empty());
    assert!(e.dev.cqs().is_empty());
    assert!(e.dev.gids().get(0).is_none());
    assert_eq!(
        e.cmd_status(VRDMA_CMD_QUERY_QP, &h(qpn)).0,
        VRDMA_STATUS_NOT_FOUND
    );
    // Same handle numbering as after power-on (QPNs are random, spec §16).
    assert_eq!(e.create_pd(), 1);
    let (cq, _) = e.create_cq(16);
    let qpn = e.small_qp(1, VRDMA_QPT_RC, cq, None);
    assert!((VRDMA_FIRST_QPN..0xff_ffff).contains(&qpn));
    e.dev.needs_reset = true;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]).0,
        VRDMA_STATUS_NEEDS_RESET
    );
    e.dev.reset();
    assert_eq!(e.cmd_status(VRDMA_CMD_QUERY_DEVICE, &[]).0, VRDMA_STATUS_OK);
}

#[test]
fn ring_error_moves_qp_to_error_with_fatal_event() {
    use std::sync::atomic::{AtomicU32, Ordering};
    static FLUSHES: AtomicU32 = AtomicU32::new(0);
    fn hook(_d: &vrdma_backend::device::Device, _qpn: u32) {
        FLUSHES.fetch_add(1, Ordering::SeqCst);
    }
    let mut e = Node::bare();
    e.dev.flush_hook = Some(hook);
    let pd = e.create_pd();
    let (cq, _) = e.create_cq(16);
    let (c, pages) = e.qp_req(pd, VRDMA_QPT_RC, cq, cq, None, 16);
    let qpn = e.ok_handle(VRDMA_CMD_CREATE_QP, &req_with_pages(&c, &pages));
    e.dev.qps.get_mut(qpn).unwrap().state = QpState::Rts;
    // The guest writes a producer too far ahead on the SQ.
    let sq_ctrl = pages[0];
    e.mem
        .store_u32_release(sq_ctrl + CTRL_PRODUCER, 17)
        .unwrap();
    let err = e.dev.qps.get(qpn).unwrap().sq.pending(&e.mem).unwrap_err();
    e.dev.qp_ring_error(qpn, true, &err);
    assert_eq!(e.mem.load_u32_acquire(sq_ctrl + CTRL_ERROR).unwrap(), 2);
    assert_eq!(e.query_qp_state(qpn), VRDMA_QPS_ERR);
    let ev = e.out.take_events();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].type_, ev[0].id, ev[0].info),
        (VRDMA_EV_QP_FATAL, qpn, 2)
    );
    assert_eq!(FLUSHES.load(Ordering::SeqCst), 1);
    // Already in ERR: no second event or flush.
    e.dev.qp_to_error(qpn, Some(VRDMA_EV_QP_FATAL), 0);
    assert!(e.out.take_events().is_empty());
    assert_eq!(FLUSHES.load(Ordering::SeqCst), 1);
    // Unknown QPN: nothing happens.
    e.dev.qp_ring_error(999, false, &err);
    assert!(e.out.take_events().is_empty());
}

/// Spec §2.2, §9: a link change updates `port_state` (config space and QUERY_PORT) and posts
/// one PORT_ERR / PORT_ACTIVE; no change, no event. A UDP uplink has no link state.
#[test]
fn port_state_follows_the_link() {
    let mut e = Node::bare();
    let port = |e: &mut Node| {
        let (s, r) = e.cmd_status(
            VRDMA_CMD_QUERY_PORT,
            VrdmaCmdQueryPort {
                port: 1,
                reserved: 0,
            }
            .as_bytes(),
        );
        assert_eq!(s, VRDMA_STATUS_OK);
        let p = VrdmaRespQueryPort::read_from(&r).unwrap();
        let c = VrdmaConfig::read_from(&e.dev.config_space()).unwrap();
        assert_eq!(p.state, c.port_state);
        (p.state, p.phys_state)
    };
    assert_eq!(port(&mut e), (VRDMA_PORT_ACTIVE, 5));
    assert!(!e.dev.set_port_active(true));
    assert!(e.out.take_events().is_empty());
    assert!(e.dev.set_port_active(false));
    assert_eq!(port(&mut e), (VRDMA_PORT_DOWN, 3));
    let ev = e.out.take_events();
    assert_eq!((ev.len(), ev[0].type_, ev[0].id), (1, VRDMA_EV_PORT_ERR, 1));
    assert!(!e.dev.set_port_active(false));
    assert!(e.out.take_events().is_empty());
    assert!(e.dev.set_port_active(true));
    assert_eq!(port(&mut e), (VRDMA_PORT_ACTIVE, 5));
    assert_eq!(e.out.take_events()[0].type_, VRDMA_EV_PORT_ACTIVE);
    let udp = vrdma_backend::uplink::UdpUplink::new(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:9".parse().unwrap(),
    )
    .unwrap();
    assert_eq!(vrdma_backend::uplink::Uplink::link_up(&udp), None);
}
