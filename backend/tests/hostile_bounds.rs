//! A guest cannot make the device recurse without bound or queue unbounded work (spec §5.2,
//! §8, §14.4): CQ-overflow chains are flushed iteratively, doorbell records are merged and
//! bounded.

mod common;

use common::*;
use vrdma_spec::*;

/// QPs in the overflow chain of [`overflow_chain_is_flushed_iteratively`].
const CHAIN: usize = 5000;

/// QP `i` sends to CQ `i + 1` and receives on CQ `i`; every CQ has depth 1 and every SQ two
/// posted WQEs. Moving QP 0 to ERR flushes its two WQEs into CQ 1, which overflows (§5.2) and
/// moves QP 1 to ERR, whose flush overflows CQ 2, and so on down the chain. Before the flush
/// worklist each link nested one more flush inside the previous one and a 256 KiB stack
/// overflowed after a few hundred links.
#[test]
fn overflow_chain_is_flushed_iteratively() {
    let worker = std::thread::Builder::new()
        .name("small-stack".into())
        .stack_size(256 << 10)
        .spawn(|| {
            // Per link: one CQ (2 pages), SQ (2 pages) and RQ (2 pages).
            let mut n = Node::new(1, ((CHAIN as u64 * 6 * 4096) >> 20) + 16, 1500);
            let pd = n.create_pd();
            let cqs: Vec<u32> = (0..=CHAIN).map(|_| n.create_cq(1).0).collect();
            let mut qps = Vec::with_capacity(CHAIN);
            for i in 0..CHAIN {
                let mut s = QpSpec::rc(pd, cqs[i + 1]);
                s.rcq = cqs[i];
                s.sq_depth = 2;
                s.sq_shift = 7;
                s.rq_depth = 1;
                s.rq_shift = 5;
                s.max_sge = 1;
                s.max_inline = 0;
                let mut q = n.create_qp(s);
                n.qp_to_init(q.qpn);
                // Posted in INIT: nothing is sent, the flush completes them (§13.3).
                for w in 0..2 {
                    let wqe = Wqe {
                        wr_id: (i * 2 + w) as u64,
                        opcode: VRDMA_WR_SEND,
                        ..Default::default()
                    };
                    n.post_send_nodb(&mut q, &wqe);
                }
                qps.push(q);
            }
            n.qp_to_err(qps[0].qpn);
            let states: Vec<u32> = qps.iter().map(|q| n.qp_state(q.qpn)).collect();
            let cq_errors = n
                .events()
                .iter()
                .filter(|e| e.type_ == VRDMA_EV_CQ_ERR)
                .count();
            (states, cq_errors)
        })
        .expect("spawn");
    let (states, cq_errors) = worker.join().expect("the flush chain overflowed the stack");
    let not_err: Vec<usize> = (0..CHAIN).filter(|&i| states[i] != VRDMA_QPS_ERR).collect();
    assert!(not_err.is_empty(), "QPs not in ERR: {not_err:?}");
    // Every CQ but CQ 0 (receive-only, nothing posted) overflowed exactly once.
    assert_eq!(cq_errors, CHAIN);
}

/// A flood of distinct doorbell records (ids of QPs that do not exist, §8: ignored) mixed with
/// repeats: repeats are merged, the pending records never exceed the bound, and the batch asks
/// for a sweep instead of growing. Before the bound, every distinct record was queued (an
/// unbounded queue) and, past 65536 records, each new one was compared with the whole queue.
#[test]
fn doorbell_flood_is_merged_and_bounded() {
    use vrdma_backend::transport::doorbells::{DoorbellQueue, Pushed, MAX_PENDING};
    let mut q = DoorbellQueue::new();
    let distinct = 3 * MAX_PENDING as u32;
    let (mut queued, mut merged, mut swept) = (0usize, 0usize, 0usize);
    for id in 1..=distinct {
        // Each id twice, and an early id again: only the first of each is new.
        for rec in [id, id, 1 + id % 1024] {
            match q.push(VrdmaDoorbell {
                type_: VRDMA_DB_SQ,
                id: rec,
            }) {
                Pushed::Queued => queued += 1,
                Pushed::Merged => merged += 1,
                Pushed::Swept => swept += 1,
                Pushed::Ignored | Pushed::Dropped => panic!("SQ doorbell {rec} not kept"),
            }
            assert!(q.len() <= MAX_PENDING);
        }
    }
    // ids 1..=MAX_PENDING: queued once, merged twice; everything after: swept.
    assert_eq!(queued, MAX_PENDING);
    assert_eq!(merged, 2 * MAX_PENDING);
    assert_eq!(swept, 3 * (distinct as usize - MAX_PENDING));
    let batch = q.take();
    assert_eq!(batch.records.len(), MAX_PENDING);
    assert!(batch.sweep);
    // First-arrival order, no duplicates.
    assert!(batch
        .records
        .iter()
        .enumerate()
        .all(|(i, r)| r.id == i as u32 + 1));
    // The next batch starts empty and does not sweep again.
    assert!(q.is_empty());
    assert_eq!(
        q.push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: 7
        }),
        Pushed::Queued
    );
    assert!(!q.take().sweep);
}

/// SQ doorbells of real QPs that arrive after a flood filled the queue are not queued, yet every
/// QP is served: the swept batch rings every QP's SQ, and each QP sends its posted SEND.
#[test]
fn every_qp_is_served_after_a_doorbell_flood() {
    use vrdma_backend::transport::doorbells::{DoorbellQueue, Pushed, MAX_PENDING};
    use vrdma_backend::transport::{self, packet};
    let (mut a, mut b, pda, pdb) = Sides::new(64, 1500).parts();
    let (cqa, _) = a.create_cq(64);
    let (cqb, _) = b.create_cq(64);
    let mut pairs = Vec::new();
    for _ in 0..8 {
        let mut sa = QpSpec::rc(pda, cqa);
        sa.sq_depth = 16;
        sa.rq_depth = 16;
        let mut sb = QpSpec::rc(pdb, cqb);
        sb.sq_depth = 16;
        sb.rq_depth = 16;
        let qa = a.create_qp(sa);
        let qb = b.create_qp(sb);
        connect(&mut a, &qa, &mut b, &qb, RtsAttrs::mtu(3));
        pairs.push((qa, qb));
    }
    for (i, (qa, _)) in pairs.iter_mut().enumerate() {
        let w = Wqe {
            wr_id: i as u64,
            opcode: VRDMA_WR_SEND,
            ..Default::default()
        };
        a.post_send_nodb(qa, &w);
    }
    let mut q = DoorbellQueue::new();
    // Ids above every QPN in use: no such QP.
    for id in 0..MAX_PENDING as u32 + 10 {
        q.push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: 0x80_0000 + id,
        });
    }
    for (qa, _) in &pairs {
        let r = q.push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: qa.qpn,
        });
        assert_eq!(r, Pushed::Swept);
    }
    let batch = q.take();
    assert!(batch.sweep);
    a.dev.outbox(0).frames.clear();
    transport::on_doorbells(&a.dev, &batch);
    let mut served: Vec<u32> = a
        .dev
        .outbox(0)
        .frames
        .iter()
        .filter_map(|f| packet::parse(f).map(|p| p.bth.dest_qp))
        .collect();
    served.sort_unstable();
    served.dedup();
    let mut want: Vec<u32> = pairs.iter().map(|(_, qb)| qb.qpn).collect();
    want.sort_unstable();
    assert_eq!(served, want);
}

/// Page-list MRs may name one guest page over and over (8 Mi times per REG_MR fits a command).
/// What all MRs hold together is bounded (spec §11.8): registrations beyond the budget fail with
/// NoResources and change nothing; DEREG_MR, REREG_MR to a shorter list and reset give entries
/// back; fast-reg MRs count their max_num_sg.
#[test]
fn mr_page_lists_are_bounded_in_total() {
    use std::sync::Arc;
    use vrdma_backend::device::RecordingOutput;
    use vrdma_backend::guest::GuestMem;
    use vrdma_backend::memory::mr::PageListSpec;
    use vrdma_backend::memory::{MrError, MrTable, OdpConfig};
    const PAGE: u64 = 0x10_0000;
    let mem = GuestMem::from_ranges(&[(0, 4 << 20)]).expect("mem");
    let out = Arc::new(RecordingOutput::new());
    let mut t = MrTable::new(100, mem, out, OdpConfig::default()).with_max_pages(1024);
    fn spec(pages: &[u64]) -> PageListSpec<'_> {
        PageListSpec {
            pd: 1,
            access: VRDMA_ACCESS_LOCAL_WRITE,
            iova: 0,
            length: pages.len() as u64 * 4096,
            page_shift: 12,
            pages,
        }
    }
    let aliased = vec![PAGE; 600];
    let k1 = t.reg_page_list(&spec(&aliased), 1 << 40).expect("first");
    assert_eq!(t.pages_held(), 600);
    assert_eq!(
        t.reg_page_list(&spec(&aliased), 1 << 40),
        Err(MrError::NoResources)
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t.pages_held(), 600);
    // Fast-reg capacity counts too: 424 more fit exactly, one more does not.
    let f = t.alloc_fast_reg(1, 424, 512).expect("fast reg");
    assert_eq!(t.pages_held(), 1024);
    assert_eq!(t.alloc_fast_reg(1, 1, 512), Err(MrError::NoResources));
    // REREG_MR to a longer list than the budget allows fails and keeps the MR; a shorter one
    // gives entries back.
    assert_eq!(
        t.rereg_page_list(k1, &spec(&[PAGE; 601]), 1 << 40),
        Err(MrError::NoResources)
    );
    assert_eq!(t.pages_held(), 1024);
    t.rereg_page_list(k1, &spec(&[PAGE; 100]), 1 << 40)
        .expect("shorter");
    assert_eq!(t.pages_held(), 524);
    t.dereg(f).expect("dereg");
    assert_eq!(t.pages_held(), 100);
    t.clear();
    assert_eq!(t.pages_held(), 0);
}

/// Through the command path with the default budget: REG_MR of more than VRDMA_CMD_MAX_PAGES
/// pages is INVALID before any page is looked at, and a device configured with a small budget
/// answers NO_RESOURCES.
#[test]
fn reg_mr_page_count_limits_through_commands() {
    use std::sync::Arc;
    use vrdma_backend::device::{CmdOutcome, Device, DeviceConfig, RecordingOutput};
    use vrdma_backend::guest::GuestMem;
    let mem = GuestMem::from_ranges(&[(0, 4 << 20)]).expect("mem");
    let cfg = DeviceConfig {
        max_mr_pages: 1024,
        ..DeviceConfig::default()
    };
    let mut dev = Device::new(cfg, mem, Arc::new(RecordingOutput::new()));
    let run = |dev: &mut Device, op: u16, req: &[u8]| -> (u32, Vec<u8>) {
        let mut resp = Vec::new();
        match dev.handle_command(op, req, &mut resp) {
            CmdOutcome::Done(st) => (st, resp),
            CmdOutcome::Parked(t) => panic!("parked {t:?}"),
        }
    };
    let (st, r) = run(&mut dev, VRDMA_CMD_CREATE_PD, &[0u8; 8]);
    assert_eq!(st, VRDMA_STATUS_OK);
    let pd = VrdmaHandle::read_from(&r).expect("pd").handle;
    let reg = |npages: u32| -> Vec<u8> {
        let c = VrdmaCmdRegMr {
            pdn: pd,
            access: VRDMA_ACCESS_LOCAL_WRITE,
            iova: 0,
            length: u64::from(npages) * 4096,
            page_shift: 12,
            npages,
        };
        let mut b = c.as_bytes().to_vec();
        for _ in 0..npages {
            b.extend_from_slice(&0x10_0000u64.to_le_bytes());
        }
        b
    };
    assert_eq!(
        run(&mut dev, VRDMA_CMD_REG_MR, &reg(1000)).0,
        VRDMA_STATUS_OK
    );
    assert_eq!(
        run(&mut dev, VRDMA_CMD_REG_MR, &reg(100)).0,
        VRDMA_STATUS_NO_RESOURCES
    );
    assert_eq!(run(&mut dev, VRDMA_CMD_REG_MR, &reg(24)).0, VRDMA_STATUS_OK);
    // One page more than any command may carry (64 MiB + 8 bytes of page list).
    assert_eq!(
        run(&mut dev, VRDMA_CMD_REG_MR, &reg(VRDMA_CMD_MAX_PAGES + 1)).0,
        VRDMA_STATUS_INVALID
    );
}

/// A queue filled with CQ_ARM hints for made-up CQs does not make every batch sweep all QPs:
/// over the bound an arm hint is dropped (spec §5.3: optional), a QP doorbell still sweeps.
#[test]
fn cq_arm_flood_is_dropped_not_swept() {
    use vrdma_backend::transport::doorbells::{DoorbellQueue, Pushed, MAX_PENDING};
    let mut q = DoorbellQueue::new();
    for id in 0..MAX_PENDING as u32 {
        assert_eq!(
            q.push(VrdmaDoorbell {
                type_: VRDMA_DB_CQ_ARM,
                id: 0x1000_0000 + id,
            }),
            Pushed::Queued
        );
    }
    let extra = q.push(VrdmaDoorbell {
        type_: VRDMA_DB_CQ_ARM,
        id: 7,
    });
    assert_eq!(extra, Pushed::Dropped);
    assert!(!q.sweep_pending(), "arm hints alone never cause a sweep");
    assert_eq!(
        q.push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: 16,
        }),
        Pushed::Swept
    );
}
