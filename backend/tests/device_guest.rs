//! GuestMem bounds and atomics; Ring validation, index wrap and bad indices.

use std::sync::Arc;

use vrdma_backend::guest::ring::{
    ring_npages, CTRL_CONSUMER, CTRL_CQ_ARM, CTRL_ERROR, CTRL_PRODUCER,
};
use vrdma_backend::guest::{GuestMem, GuestMemError, Ring, RingError};

fn mem() -> GuestMem {
    // Two contiguous regions [0, 1M) + [1M, 2M), then a hole, then [16M, 17M).
    GuestMem::from_ranges(&[(0, 1 << 20), (1 << 20, 1 << 20), (16 << 20, 1 << 20)]).unwrap()
}

#[test]
fn read_write_inside_and_across_contiguous_regions() {
    let m = mem();
    m.write(0x1000, b"hello").unwrap();
    let mut b = [0u8; 5];
    m.read(0x1000, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    // Spans the boundary between the two contiguous regions.
    let data: Vec<u8> = (0..64u8).collect();
    m.write((1 << 20) - 32, &data).unwrap();
    let mut back = vec![0u8; 64];
    m.read((1 << 20) - 32, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn out_of_range_hole_and_overflow_rejected() {
    let m = mem();
    let mut b = [0u8; 16];
    // Entirely in the hole.
    assert!(matches!(
        m.read(8 << 20, &mut b),
        Err(GuestMemError::OutOfRange { .. })
    ));
    // Starts inside, runs into the hole.
    assert!(matches!(
        m.write((2 << 20) - 8, &b),
        Err(GuestMemError::OutOfRange { .. })
    ));
    // Past the end of the last region.
    assert!(m.read((17 << 20) - 8, &mut b).is_err());
    // Address overflow.
    assert!(matches!(
        m.read(u64::MAX - 4, &mut b),
        Err(GuestMemError::Overflow { .. })
    ));
    assert!(!m.check_range(u64::MAX, 2));
    assert!(m.check_range(0, 2 << 20));
    assert!(!m.check_range(0, (2 << 20) + 1));
    // Zero-length accesses are fine anywhere.
    m.read(8 << 20, &mut []).unwrap();
    // Empty memory rejects everything.
    let e = GuestMem::empty();
    assert!(e.read(0, &mut b).is_err());
}

#[test]
fn atomics_semantics_and_alignment() {
    let m = mem();
    m.write(0x2000, &5u64.to_le_bytes()).unwrap();
    assert_eq!(m.compare_swap_u64(0x2000, 4, 9).unwrap(), 5);
    assert_eq!(m.read_u64(0x2000).unwrap(), 5, "failed CAS must not store");
    assert_eq!(m.compare_swap_u64(0x2000, 5, 9).unwrap(), 5);
    assert_eq!(m.read_u64(0x2000).unwrap(), 9);
    assert_eq!(m.fetch_add_u64(0x2000, u64::MAX).unwrap(), 9);
    assert_eq!(m.read_u64(0x2000).unwrap(), 8, "fetch_add wraps");
    assert_eq!(
        m.compare_swap_u64(0x2004, 0, 0),
        Err(GuestMemError::Misaligned {
            gpa: 0x2004,
            align: 8
        })
    );
    assert!(matches!(
        m.fetch_add_u64(0x2001, 1),
        Err(GuestMemError::Misaligned { .. })
    ));
    assert!(matches!(
        m.load_u32_acquire(0x2002),
        Err(GuestMemError::Misaligned { .. })
    ));
    assert!(m.fetch_add_u64(8 << 20, 1).is_err());
    m.store_u32_release(0x3000, 0xdead_beef).unwrap();
    assert_eq!(m.load_u32_acquire(0x3000).unwrap(), 0xdead_beef);
    assert_eq!(m.swap_u32(0x3000, 7).unwrap(), 0xdead_beef);
    assert_eq!(m.read_u32(0x3000).unwrap(), 7);
}

/// One thread per view of `views`, each adding 1 to the u64 at `gpa` `times` times.
fn add_from_threads(views: Vec<Arc<GuestMem>>, gpa: u64, times: usize) {
    let threads: Vec<_> = views
        .into_iter()
        .map(|m| {
            std::thread::spawn(move || {
                for _ in 0..times {
                    m.fetch_add_u64(gpa, 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn fetch_add_is_atomic_across_threads() {
    let m = Arc::new(mem());
    add_from_threads(vec![m.clone(); 4], 0x4000, 10_000);
    assert_eq!(m.read_u64(0x4000).unwrap(), 40_000);
}

#[test]
fn memory_swap_visible_to_clones() {
    let m = GuestMem::empty();
    let c = m.clone();
    assert!(c.write(0x1000, b"x").is_err());
    let other = GuestMem::from_ranges(&[(0, 1 << 20)]).unwrap();
    m.set_from_atomic(other.atomic());
    c.write(0x1000, b"x").unwrap();
    let mut b = [0u8; 1];
    other.read(0x1000, &mut b).unwrap();
    assert_eq!(&b, b"x", "same mapping is shared");
}

fn pages_at(base: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| base + i * 4096).collect()
}

/// A ring of `depth` 64-byte entries on consecutive pages from `base`.
fn ring_at(m: &GuestMem, base: u64, depth: u32) -> Ring {
    let pages = pages_at(base, ring_npages(depth, 6));
    Ring::new(m, &pages, depth, 6, 6, 1024).unwrap()
}

#[test]
fn ring_creation_validation() {
    let m = mem();
    let good = pages_at(0x10000, ring_npages(16, 6));
    assert_eq!(good.len(), 2);
    Ring::new(&m, &good, 16, 6, 6, 1024).unwrap();
    // (depth, entry shift, max depth) the geometry check refuses.
    for (depth, shift, max_depth, refused) in [
        (12, 6, 1024, RingError::BadDepth(12)),
        (0, 6, 1024, RingError::BadDepth(0)),
        (2048, 6, 1024, RingError::BadDepth(2048)),
        (16, 5, 1024, RingError::BadEntryShift(5)),
        (16, 13, 1 << 20, RingError::BadEntryShift(13)),
    ] {
        assert_eq!(
            Ring::new(&m, &good, depth, shift, 6, max_depth).unwrap_err(),
            refused
        );
    }
    assert!(matches!(
        Ring::new(&m, &good[..1], 16, 6, 6, 1024),
        Err(RingError::BadPageCount {
            expected: 2,
            got: 1
        })
    ));
    let mut extra = good.clone();
    extra.push(0x20000);
    assert!(matches!(
        Ring::new(&m, &extra, 16, 6, 6, 1024),
        Err(RingError::BadPageCount { .. })
    ));
    assert_eq!(
        Ring::new(&m, &[0x10000, 0x11008], 16, 6, 6, 1024).unwrap_err(),
        RingError::UnalignedPage(0x11008)
    );
    assert!(matches!(
        Ring::new(&m, &[0x10000, 8 << 20], 16, 6, 6, 1024),
        Err(RingError::Access(_))
    ));
    assert!(matches!(
        Ring::new(&m, &[!4095, 0x10000], 16, 6, 6, 1024),
        Err(RingError::Access(_))
    ));
}

#[test]
fn ring_entries_wrap_and_span_pages() {
    let m = mem();
    // 128 entries of 64 bytes = 2 entry pages, scattered pages.
    let pages = vec![0x30000, 0x50000, 0x40000];
    let r = Ring::new(&m, &pages, 128, 6, 6, 1024).unwrap();
    assert_eq!(r.entry_gpa(0), 0x50000);
    assert_eq!(r.entry_gpa(63), 0x50000 + 63 * 64);
    assert_eq!(r.entry_gpa(64), 0x40000);
    assert_eq!(r.entry_gpa(128), 0x50000, "index wraps by depth");
    assert_eq!(r.entry_gpa(u32::MAX), 0x40000 + 63 * 64);
    r.write_entry(&m, 130, &[7u8; 64]).unwrap();
    let mut b = [0u8; 64];
    r.read_entry(&m, 2, &mut b).unwrap();
    assert_eq!(b, [7u8; 64]);
    assert!(matches!(
        r.read_entry(&m, 0, &mut [0u8; 65]),
        Err(RingError::BadBuffer { .. })
    ));
}

#[test]
fn ring_index_checks_with_wrap() {
    let m = mem();
    let mut r = ring_at(&m, 0x60000, 8);
    let c = r.ctrl_gpa();
    m.store_u32_release(c + CTRL_PRODUCER, 8).unwrap();
    assert_eq!(r.pending(&m).unwrap(), 8);
    m.store_u32_release(c + CTRL_PRODUCER, 9).unwrap();
    assert!(matches!(r.pending(&m), Err(RingError::Index { .. })));
    // Consumer near the wrap point.
    r.set_consumer(&m, u32::MAX - 2).unwrap();
    assert_eq!(m.load_u32_acquire(c + CTRL_CONSUMER).unwrap(), u32::MAX - 2);
    m.store_u32_release(c + CTRL_PRODUCER, 3).unwrap();
    assert_eq!(r.pending(&m).unwrap(), 6);
    // Producer behind the consumer (guest corrupted it) is an index error too.
    m.store_u32_release(c + CTRL_PRODUCER, u32::MAX - 3)
        .unwrap();
    let e = r.pending(&m).unwrap_err();
    assert_eq!(e.ring_error_code(), 2);
    r.set_error(&m, e.ring_error_code()).unwrap();
    assert_eq!(m.load_u32_acquire(c + CTRL_ERROR).unwrap(), 2);
    r.reset_indices(&m);
    assert_eq!(r.dev_index(), 0);
    assert_eq!(m.load_u32_acquire(c + CTRL_ERROR).unwrap(), 0);
}

#[test]
fn cq_push_overflow_and_arm() {
    let m = mem();
    let mut r = ring_at(&m, 0x70000, 4);
    let c = r.ctrl_gpa();
    for i in 0..4u8 {
        r.cq_push(&m, &[i; 64]).unwrap();
    }
    assert_eq!(m.load_u32_acquire(c + CTRL_PRODUCER).unwrap(), 4);
    assert_eq!(r.cq_push(&m, &[9; 64]), Err(RingError::Overflow));
    assert_eq!(m.load_u32_acquire(c + CTRL_PRODUCER).unwrap(), 4);
    m.store_u32_release(c + CTRL_CONSUMER, 1).unwrap();
    r.cq_push(&m, &[4; 64]).unwrap();
    let mut b = [0u8; 64];
    r.read_entry(&m, 4, &mut b).unwrap();
    assert_eq!(b[0], 4);
    assert_eq!(r.cq_unpolled(&m).unwrap(), 4);
    // Arms.
    assert!(!r.cq_take_arm(&m, true).unwrap(), "not armed");
    m.store_u32_release(c + CTRL_CQ_ARM, 2).unwrap();
    assert!(
        !r.cq_take_arm(&m, false).unwrap(),
        "SOLICITED ignores unsolicited"
    );
    assert_eq!(m.load_u32_acquire(c + CTRL_CQ_ARM).unwrap(), 2);
    assert!(r.cq_take_arm(&m, true).unwrap());
    assert_eq!(m.load_u32_acquire(c + CTRL_CQ_ARM).unwrap(), 0);
    m.store_u32_release(c + CTRL_CQ_ARM, 1).unwrap();
    assert!(r.cq_take_arm(&m, false).unwrap());
    assert!(!r.cq_take_arm(&m, false).unwrap(), "one event per arm");
}

/// Two independent mappings of one shared file (like QEMU's memfd guest RAM and the daemon's
/// mapping): writes are visible across them and atomics from both sides are atomic together.
#[test]
fn shared_file_mapping_atomics() {
    use vm_memory::{FileOffset, GuestAddress, GuestRegionMmap};
    let path = std::env::temp_dir().join(format!("vrdma-guestmem-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file.set_len(1 << 20).unwrap();
    let file = Arc::new(file);
    let map = |gpa: u64| {
        let r = GuestRegionMmap::<vrdma_backend::guest::DirtyBitmap>::from_range(
            GuestAddress(gpa),
            1 << 20,
            Some(FileOffset::from_arc(file.clone(), 0)),
        )
        .unwrap();
        GuestMem::from_regions(vec![r]).unwrap()
    };
    // The "guest" sees the file at GPA 0x4000_0000, the device at the same GPA in another mapping.
    let guest = Arc::new(map(0x4000_0000));
    let dev = Arc::new(map(0x4000_0000));
    guest.write(0x4000_1000, b"ring").unwrap();
    let mut b = [0u8; 4];
    dev.read(0x4000_1000, &mut b).unwrap();
    assert_eq!(&b, b"ring");
    add_from_threads(vec![guest.clone(), dev.clone()], 0x4000_2000, 20_000);
    assert_eq!(guest.read_u64(0x4000_2000).unwrap(), 40_000);
    assert!(dev.read(0x3fff_fff0, &mut b).is_err());
}
