//! MR table: registration validation and the resolve matrix (bounds, access, variant, PD, DMA MR,
//! fast-reg).

use std::sync::Arc;

use vrdma_backend::device::RecordingOutput;
use vrdma_backend::guest::GuestMem;
use vrdma_backend::memory::mr::*;
use vrdma_backend::memory::{Access, GuestRange, MrError, MrTable, OdpConfig};
use vrdma_spec::*;

/// REG_MR in PD 1 (MR size limit `MAX`) with its fields as arguments, to keep the many cases
/// below on one line each.
fn reg_list(
    t: &mut MrTable,
    access: u32,
    iova: u64,
    length: u64,
    page_shift: u32,
    pages: &[u64],
) -> Result<u32, MrError> {
    let spec = PageListSpec {
        pd: 1,
        access,
        iova,
        length,
        page_shift,
        pages,
    };
    t.reg_page_list(&spec, MAX)
}

const LW: u32 = VRDMA_ACCESS_LOCAL_WRITE;
const RW: u32 = VRDMA_ACCESS_REMOTE_WRITE;
const RR: u32 = VRDMA_ACCESS_REMOTE_READ;
const RA: u32 = VRDMA_ACCESS_REMOTE_ATOMIC;
const MAX: u64 = 1 << 40;

/// A REG_MR WQE's registration of 4 KiB pages.
fn fast_reg(key: u32, access: u32, iova: u64, length: u64, list: u64, pages: u32) -> FastReg {
    FastReg {
        key,
        access,
        iova,
        length,
        page_shift: 12,
        page_list_addr: list,
        page_list_len: pages,
    }
}

fn table() -> (MrTable, GuestMem) {
    let mem = GuestMem::from_ranges(&[(0, 64 << 20)]).unwrap();
    let out = Arc::new(RecordingOutput::new());
    (
        MrTable::new(1000, mem.clone(), out, OdpConfig::default()),
        mem,
    )
}

#[test]
fn page_list_translation_with_offset_and_coalescing() {
    let (mut t, _) = table();
    // iova 0x10000800, 3 pages: two contiguous then one elsewhere.
    let pages = [0x100000, 0x101000, 0x300000];
    let key = reg_list(&mut t, LW | RR, 0x1000_0800, 0x2000, 12, &pages).unwrap();
    assert_eq!(key >> 8, 1);
    // Whole MR: first page from offset 0x800, pages 0-1 coalesce, page 2 separate.
    let r = t.resolve(key, 1, 0x1000_0800, 0x2000, 0).unwrap();
    assert_eq!(
        r,
        vec![
            GuestRange {
                gpa: 0x100800,
                len: 0x1800
            },
            GuestRange {
                gpa: 0x300000,
                len: 0x800
            }
        ]
    );
    // Last byte.
    let r = t.resolve(key, 1, 0x1000_27ff, 1, LW).unwrap();
    assert_eq!(
        r,
        vec![GuestRange {
            gpa: 0x3007ff,
            len: 1
        }]
    );
    // Zero length validates key/PD/access only.
    assert_eq!(t.resolve(key, 1, 0, 0, 0).unwrap(), vec![]);
}

#[test]
fn resolve_bounds() {
    let (mut t, _) = table();
    let key = reg_list(&mut t, LW, 0x5000, 0x1000, 12, &[0x200000]).unwrap();
    let oob = |r: Result<Vec<GuestRange>, MrError>| matches!(r, Err(MrError::OutOfBounds { .. }));
    assert!(oob(t.resolve(key, 1, 0x4fff, 1, 0)));
    assert!(oob(t.resolve(key, 1, 0x5000, 0x1001, 0)));
    assert!(oob(t.resolve(key, 1, 0x6000, 1, 0)));
    assert!(oob(t.resolve(key, 1, u64::MAX, 2, 0)), "overflow");
    assert!(oob(t.resolve(key, 1, 0x5001, u64::MAX, 0)), "overflow");
    assert!(t.resolve(key, 1, 0x5000, 0x1000, 0).is_ok());
}

#[test]
fn resolve_access_rights() {
    let (mut t, _) = table();
    let ro = reg_list(&mut t, 0, 0, 0x1000, 12, &[0x200000]).unwrap();
    let all = reg_list(&mut t, LW | RW | RR | RA, 0, 0x1000, 12, &[0x201000]).unwrap();
    let rr = reg_list(&mut t, RR, 0, 0x1000, 12, &[0x202000]).unwrap();
    // Local read needs nothing.
    assert!(t.resolve(ro, 1, 0, 8, 0).is_ok());
    for a in [LW, RW, RR, RA] {
        assert!(
            matches!(t.resolve(ro, 1, 0, 8, a), Err(MrError::AccessDenied { .. })),
            "access {a:#x} on a read-only MR"
        );
        assert!(t.resolve(all, 1, 0, 8, a).is_ok());
    }
    assert!(t.resolve(rr, 1, 0, 8, RR).is_ok());
    assert!(matches!(
        t.resolve(rr, 1, 0, 8, RW),
        Err(MrError::AccessDenied { .. })
    ));
}

#[test]
fn registration_rejects_bad_input() {
    let (mut t, _) = table();
    // Remote write without local write.
    assert_eq!(
        reg_list(&mut t, RW, 0, 0x1000, 12, &[0x200000]),
        Err(MrError::BadAccess(RW))
    );
    assert_eq!(
        reg_list(&mut t, RA, 0, 0x1000, 12, &[0x200000]),
        Err(MrError::BadAccess(RA))
    );
    // Unknown bits.
    assert!(matches!(
        reg_list(&mut t, 1 << 20, 0, 0x1000, 12, &[0x200000]),
        Err(MrError::Invalid(_))
    ));
    // npages mismatch (iova offset needs 2 pages).
    assert!(matches!(
        reg_list(&mut t, 0, 0x800, 0x1000, 12, &[0x200000]),
        Err(MrError::Invalid(_))
    ));
    // Bad page shift, unaligned page, page outside memory, overflow, too long.
    assert!(reg_list(&mut t, 0, 0, 0x1000, 11, &[0x200000]).is_err());
    assert!(reg_list(&mut t, 0, 0, 0x1000, 40, &[0]).is_err());
    assert!(matches!(
        reg_list(&mut t, 0, 0, 0x1000, 12, &[0x200100]),
        Err(MrError::Invalid(_))
    ));
    assert_eq!(
        reg_list(&mut t, 0, 0, 0x1000, 12, &[128 << 20]),
        Err(MrError::BadAddress { gpa: 128 << 20 })
    );
    // A 1 GiB page that starts in guest memory and runs past its end.
    assert!(matches!(
        reg_list(&mut t, 0, 0, 0x1000, 30, &[0]),
        Err(MrError::BadAddress { .. })
    ));
    assert!(reg_list(&mut t, 0, u64::MAX - 10, 0x1000, 12, &[0x200000, 0x201000]).is_err());
    let over_max = PageListSpec {
        pd: 1,
        access: 0,
        iova: 0,
        length: 0x2000,
        page_shift: 12,
        pages: &[0x200000, 0x201000],
    };
    assert!(t.reg_page_list(&over_max, 0x1000).is_err());
    assert_eq!(t.len(), 0, "nothing registered");
    // Status mapping used by the command layer.
    assert_eq!(
        MrError::BadAccess(RW).status(),
        vrdma_spec::VRDMA_STATUS_ACCESS
    );
    assert_eq!(
        MrError::BadAddress { gpa: 0 }.status(),
        vrdma_spec::VRDMA_STATUS_BAD_ADDRESS
    );
}

#[test]
fn keys_variants_and_pd() {
    let (mut t, _) = table();
    let k1 = reg_list(&mut t, LW, 0, 0x1000, 12, &[0x200000]).unwrap();
    assert!(matches!(
        t.resolve(k1, 2, 0, 1, 0),
        Err(MrError::WrongPd { .. })
    ));
    assert!(matches!(
        t.resolve(k1 ^ 1, 1, 0, 1, 0),
        Err(MrError::StaleKey(_))
    ));
    assert!(matches!(
        t.resolve(0, 1, 0, 1, 0),
        Err(MrError::InvalidKey(0))
    ));
    assert!(matches!(
        t.resolve(0xffff_ff00, 1, 0, 1, 0),
        Err(MrError::InvalidKey(_))
    ));
    t.dereg(k1).unwrap();
    assert!(matches!(
        t.resolve(k1, 1, 0, 1, 0),
        Err(MrError::InvalidKey(_))
    ));
    assert_eq!(t.dereg(k1), Err(MrError::InvalidKey(k1)));
    // Fill so the index gets reused: the new key differs in its variant.
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys.push(reg_list(&mut t, LW, 0, 0x1000, 12, &[0x200000]).unwrap());
    }
    let reused = keys.iter().find(|&&k| k >> 8 == k1 >> 8);
    if let Some(&k) = reused {
        assert_ne!(k, k1);
        assert!(matches!(
            t.resolve(k1, 1, 0, 1, 0),
            Err(MrError::StaleKey(_))
        ));
    }
    assert!(t.pd_in_use(1));
    assert!(!t.pd_in_use(2));
}

#[test]
fn mr_table_limit() {
    let mem = GuestMem::from_ranges(&[(0, 1 << 20)]).unwrap();
    let mut t = MrTable::new(
        2,
        mem,
        Arc::new(RecordingOutput::new()),
        OdpConfig::default(),
    );
    t.reg_dma(1, LW).unwrap();
    let k = t.reg_dma(1, LW).unwrap();
    assert_eq!(t.reg_dma(1, LW), Err(MrError::NoResources));
    t.dereg(k).unwrap();
    t.reg_dma(1, LW).unwrap();
}

#[test]
fn dma_mr_is_local_only_and_checks_memory() {
    let (mut t, _) = table();
    assert_eq!(t.reg_dma(1, LW | RR), Err(MrError::BadAccess(LW | RR)));
    let k = t.reg_dma(1, LW).unwrap();
    assert_eq!(
        t.resolve(k, 1, 0x1234, 100, LW).unwrap(),
        vec![GuestRange {
            gpa: 0x1234,
            len: 100
        }]
    );
    assert!(matches!(
        t.resolve(k, 1, 64 << 20, 1, 0),
        Err(MrError::BadAddress { .. })
    ));
    assert!(matches!(
        t.resolve(k, 1, 0, 1, RR),
        Err(MrError::AccessDenied { .. })
    ));
}

#[test]
fn fast_reg_lifecycle() {
    let (mut t, mem) = table();
    let k = t.alloc_fast_reg(1, 4, 512).unwrap();
    assert!(matches!(
        t.alloc_fast_reg(1, 0, 512),
        Err(MrError::Invalid(_))
    ));
    assert!(matches!(
        t.alloc_fast_reg(1, 513, 512),
        Err(MrError::Invalid(_))
    ));
    // Not registered yet.
    assert_eq!(t.resolve(k, 1, 0, 0, 0), Err(MrError::Invalidated(k)));
    // Page list in guest memory.
    let list = 0x80000u64;
    for (i, p) in [0x400000u64, 0x500000].iter().enumerate() {
        mem.write(list + 8 * i as u64, &p.to_le_bytes()).unwrap();
    }
    let newkey = (k & !0xff) | 0x42;
    // Wrong PD.
    assert!(matches!(
        t.fast_register(2, &fast_reg(newkey, LW | RR, 0x9000, 0x2000, list, 2)),
        Err(MrError::WrongPd { .. })
    ));
    // More pages than allocated.
    assert!(t
        .fast_register(1, &fast_reg(newkey, LW, 0x9000, 0x2000, list, 5))
        .is_err());
    // Length beyond the list.
    assert!(t
        .fast_register(1, &fast_reg(newkey, LW, 0x9000, 0x3000, list, 2))
        .is_err());
    // Page list outside guest memory.
    assert!(matches!(
        t.fast_register(1, &fast_reg(newkey, LW, 0x9000, 0x2000, 1 << 40, 2)),
        Err(MrError::BadAddress { .. })
    ));
    t.fast_register(1, &fast_reg(newkey, LW | RR, 0x9000, 0x2000, list, 2))
        .unwrap();
    // Old key is stale, new key works.
    assert_eq!(t.resolve(k, 1, 0x9000, 1, 0), Err(MrError::StaleKey(k)));
    assert_eq!(
        t.resolve(newkey, 1, 0x9ff0, 0x20, RR).unwrap(),
        vec![
            GuestRange {
                gpa: 0x400ff0,
                len: 0x10
            },
            GuestRange {
                gpa: 0x500000,
                len: 0x10
            }
        ]
    );
    // Registering a valid MR again is an error.
    assert_eq!(
        t.fast_register(1, &fast_reg(newkey, LW, 0x9000, 0x1000, list, 1)),
        Err(MrError::InvalidOp(newkey))
    );
    // Invalidate: wrong key variant, wrong PD, then right.
    assert_eq!(t.local_invalidate(k, 1), Err(MrError::StaleKey(k)));
    assert!(matches!(
        t.local_invalidate(newkey, 3),
        Err(MrError::WrongPd { .. })
    ));
    t.local_invalidate(newkey, 1).unwrap();
    assert_eq!(
        t.resolve(newkey, 1, 0x9000, 1, 0),
        Err(MrError::Invalidated(newkey))
    );
    // Re-register with another variant.
    let k3 = (k & !0xff) | 0x43;
    t.fast_register(1, &fast_reg(k3, LW, 0, 0x1000, list, 1))
        .unwrap();
    assert!(t.resolve(k3, 1, 0, 0x1000, LW).is_ok());
    // LOCAL_INV of a non-fast-reg MR is refused.
    let pl = reg_list(&mut t, 0, 0, 0x1000, 12, &[0x200000]).unwrap();
    assert_eq!(t.local_invalidate(pl, 1), Err(MrError::InvalidOp(pl)));
    // REG_MR WQE naming a page-list MR is refused.
    assert_eq!(
        t.fast_register(1, &fast_reg(pl, 0, 0, 0x1000, list, 1)),
        Err(MrError::InvalidOp(pl))
    );
}

#[test]
fn check_access_agrees_with_resolve_and_never_faults() {
    let mem = GuestMem::from_ranges(&[(0, 64 << 20)]).unwrap();
    let out = Arc::new(RecordingOutput::new());
    let cfg = OdpConfig {
        enabled: true,
        implicit: true,
        ..OdpConfig::default()
    };
    let mut t = MrTable::new(100, mem, out.clone(), cfg);
    let pl = reg_list(&mut t, LW | RR, 0x1000, 0x2000, 12, &[0x200000, 0x201000]).unwrap();
    let dma = t.reg_dma(1, LW).unwrap();
    let fr = t.alloc_fast_reg(1, 4, 512).unwrap();
    let odp = t.reg_odp(1, LW, 0, 1 << 30, false, MAX).unwrap();
    let cases: Vec<(u32, u32, u64, u64, u32)> = vec![
        (pl, 1, 0x1000, 0x2000, RR),
        (pl, 1, 0x1000, 0x2000, RW),
        (pl, 2, 0x1000, 1, 0),
        (pl ^ 3, 1, 0x1000, 1, 0),
        (pl, 1, 0xfff, 1, 0),
        (pl, 1, 0x2fff, 2, 0),
        (pl, 1, u64::MAX, 2, 0),
        (pl, 1, 0x1800, 0, RA),
        (dma, 1, 0x1000, 10, LW),
        (dma, 1, 1 << 40, 10, 0),
        (dma, 1, 0, 10, RR),
        (fr, 1, 0, 1, 0),
        (0, 1, 0, 1, 0),
        (odp, 1, 1 << 30, 1, 0),
        (odp, 2, 0, 1, 0),
        (odp, 1, 0, 1, RW),
    ];
    for (key, pd, iova, len, access) in cases {
        let c = t.check_access(Access {
            key,
            pd,
            iova,
            len,
            rights: access,
        });
        let r = t.resolve(key, pd, iova, len, access).map(|_| ());
        assert_eq!(
            c, r,
            "key {key:#x} pd {pd} iova {iova:#x} len {len:#x} access {access:#x}"
        );
    }
    assert!(out.take_page_requests().is_empty());
    // On an ODP MR a valid range checks fine without faulting (resolve would fault).
    let whole = Access {
        key: odp,
        pd: 1,
        iova: 0,
        len: 1 << 30,
        rights: LW,
    };
    assert_eq!(t.check_access(whole), Ok(()));
    assert!(out.take_page_requests().is_empty());
    assert!(matches!(
        t.resolve(odp, 1, 0, 8, LW),
        Err(MrError::Fault { .. })
    ));
    assert_eq!(out.take_page_requests().len(), 1);
}
