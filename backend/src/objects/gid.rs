//! The port's GID table (ADD_GID / DEL_GID): index → GID and type, read by every frame without
//! a lock and changed beside the engine workers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
// Loom's types under `--cfg loom` (the model at the end of this file).
use crate::sync::modeled::{
    fence, lock, spin_loop, yield_now, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering,
};

use vrdma_spec::{VRDMA_GID_TYPE_ROCE_V1, VRDMA_GID_TYPE_ROCE_V2};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    pub gid: [u8; 16],
    pub gid_type: u32,
}

impl GidEntry {
    /// The IP address of the GID (IPv4 for IPv4-mapped GIDs).
    pub fn ip(&self) -> IpAddr {
        gid_to_ip(&self.gid)
    }
}

/// `::ffff:a.b.c.d` → IPv4, everything else IPv6.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// IP → GID (IPv4 mapped into `::ffff:0:0/96`).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Is the GID IPv4-mapped?
pub fn gid_is_ipv4(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Errors of ADD_GID / DEL_GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GidError {
    #[error("GID index out of range")]
    BadIndex,
    #[error("bad GID type")]
    BadType,
    #[error("no GID at this index")]
    NotFound,
}

/// One GID entry as atomic words, so that it can change beside readers ([`GidTable`]).
#[derive(Default)]
struct GidSlot {
    /// The GID's 16 bytes, big-endian halves.
    hi: AtomicU64,
    lo: AtomicU64,
    /// The GID type (`VRDMA_GID_TYPE_*`, never 0); 0: empty. For a `v2` slot: the index.
    tag: AtomicU32,
}

impl GidSlot {
    fn load(&self) -> ([u8; 16], u32) {
        let hi = u128::from(self.hi.load(Ordering::Relaxed));
        let lo = u128::from(self.lo.load(Ordering::Relaxed));
        (
            (hi << 64 | lo).to_be_bytes(),
            self.tag.load(Ordering::Relaxed),
        )
    }

    fn matches(&self, gid: &[u8; 16]) -> bool {
        let (hi, lo) = halves(gid);
        self.hi.load(Ordering::Relaxed) == hi && self.lo.load(Ordering::Relaxed) == lo
    }

    fn store(&self, gid: &[u8; 16], tag: u32) {
        let (hi, lo) = halves(gid);
        self.hi.store(hi, Ordering::Relaxed);
        self.lo.store(lo, Ordering::Relaxed);
        self.tag.store(tag, Ordering::Relaxed);
    }
}

/// The GID as two big-endian 64-bit halves.
fn halves(gid: &[u8; 16]) -> (u64, u64) {
    let v = u128::from_be_bytes(*gid);
    ((v >> 64) as u64, v as u64)
}

/// The port's GID table. Every frame in and out looks its addresses up here, without a lock:
/// the entries are atomic words under a sequence lock. ADD_GID and DEL_GID (beside the engine
/// workers, one control queue at a time; the writers' mutex keeps tests and restores honest
/// too) make the sequence odd, change the words and make it even again; a reader that saw an
/// odd sequence, or a different one after reading, reads again. A change is a few stores,
/// so a reader retries at most for that long.
pub struct GidTable {
    seq: AtomicU32,
    writer: Mutex<()>,
    entries: Box<[GidSlot]>,
    /// The RoCEv2 entries as (GID, index), in index order, the first `v2_len` of them: a port
    /// has a handful of them in a table of `max_gid` slots.
    v2: Box<[GidSlot]>,
    v2_len: AtomicUsize,
}

impl std::fmt::Debug for GidTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries: Vec<(u32, GidEntry)> = (0..self.len())
            .filter_map(|i| self.get(i).map(|e| (i, e)))
            .collect();
        f.debug_struct("GidTable")
            .field("len", &self.len())
            .field("entries", &entries)
            .finish()
    }
}

impl GidTable {
    pub fn new(size: u32) -> Self {
        let slots = || (0..size).map(|_| GidSlot::default()).collect();
        GidTable {
            seq: AtomicU32::new(0),
            writer: Mutex::new(()),
            entries: slots(),
            v2: slots(),
            v2_len: AtomicUsize::new(0),
        }
    }

    pub fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `f` on a consistent view of the table (the sequence lock's read side). A writer
    /// descheduled in the middle of its few stores would keep a spinning reader off the CPU it
    /// needs (2 cores): after a few tries the reader yields.
    fn read<T>(&self, f: impl Fn() -> T) -> T {
        let mut tries = 0u32;
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let v = f();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return v;
                }
            }
            tries += 1;
            if tries.is_multiple_of(64) {
                yield_now();
            } else {
                spin_loop();
            }
        }
    }

    /// `f` changes the words, the sequence odd meanwhile (the write side).
    fn write<T>(&self, f: impl FnOnce() -> T) -> T {
        let _one = lock(&self.writer);
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let v = f();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
        v
    }

    /// ADD_GID: set (or replace) entry `index`.
    pub fn add(&self, index: u32, gid_type: u32, gid: [u8; 16]) -> Result<(), GidError> {
        if gid_type != VRDMA_GID_TYPE_ROCE_V1 && gid_type != VRDMA_GID_TYPE_ROCE_V2 {
            return Err(GidError::BadType);
        }
        let e = self.entries.get(index as usize).ok_or(GidError::BadIndex)?;
        self.write(|| {
            e.store(&gid, gid_type);
            self.reindex();
        });
        Ok(())
    }

    /// DEL_GID: clear entry `index`.
    pub fn del(&self, index: u32) -> Result<(), GidError> {
        let e = self.entries.get(index as usize).ok_or(GidError::BadIndex)?;
        self.write(|| {
            if e.tag.load(Ordering::Relaxed) == 0 {
                return Err(GidError::NotFound);
            }
            e.store(&[0; 16], 0);
            self.reindex();
            Ok(())
        })
    }

    /// Rebuild `v2` (ADD_GID / DEL_GID are rare; lookups are per frame). Inside `write`.
    fn reindex(&self) {
        let mut n = 0;
        for (i, e) in self.entries.iter().enumerate() {
            let (gid, t) = e.load();
            if t == VRDMA_GID_TYPE_ROCE_V2 {
                if let Some(slot) = self.v2.get(n) {
                    slot.store(&gid, i as u32);
                    n += 1;
                }
            }
        }
        self.v2_len.store(n, Ordering::Relaxed);
    }

    pub fn get(&self, index: u32) -> Option<GidEntry> {
        let e = self.entries.get(index as usize)?;
        let (gid, gid_type) = self.read(|| e.load());
        (gid_type != 0).then_some(GidEntry { gid, gid_type })
    }

    /// Index of a RoCEv2 entry with exactly this GID.
    pub fn find_v2(&self, gid: &[u8; 16]) -> Option<u32> {
        self.read(|| {
            let n = self.v2_len.load(Ordering::Relaxed);
            self.v2
                .iter()
                .take(n)
                .find(|s| s.matches(gid))
                .map(|s| s.tag.load(Ordering::Relaxed))
        })
    }

    /// Is `ip` one of the port's RoCEv2 addresses? (port demux: frames to our GIDs → engine)
    pub fn is_local_ip(&self, ip: IpAddr) -> bool {
        self.find_v2(&ip_to_gid(ip)).is_some()
    }

    /// Is the IPv4 address one of ours?
    pub fn is_local_ipv4(&self, ip: Ipv4Addr) -> bool {
        self.is_local_ip(IpAddr::V4(ip))
    }

    /// Remove every entry (device reset).
    pub fn clear(&self) {
        self.write(|| {
            for e in self.entries.iter() {
                e.store(&[0; 16], 0);
            }
            self.v2_len.store(0, Ordering::Relaxed);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::overlap::Overlap;

    #[test]
    fn add_del_lookup_and_local_ips() {
        let t = GidTable::new(4);
        let v4: Ipv4Addr = "192.168.1.7".parse().unwrap();
        let v6: Ipv6Addr = "fd00::7".parse().unwrap();
        t.add(0, VRDMA_GID_TYPE_ROCE_V2, ip_to_gid(IpAddr::V4(v4)))
            .unwrap();
        t.add(1, VRDMA_GID_TYPE_ROCE_V1, ip_to_gid(IpAddr::V6(v6)))
            .unwrap();
        assert!(t.is_local_ipv4(v4));
        assert!(
            !t.is_local_ip(IpAddr::V6(v6)),
            "RoCEv1 entries are not RoCEv2 addresses"
        );
        t.add(2, VRDMA_GID_TYPE_ROCE_V2, v6.octets()).unwrap();
        assert!(t.is_local_ip(IpAddr::V6(v6)));
        assert_eq!(t.find_v2(&v6.octets()), Some(2));
        // The same GID at a lower index too: the lowest index answers; replaced by RoCEv1,
        // it no longer does.
        t.add(1, VRDMA_GID_TYPE_ROCE_V2, v6.octets()).unwrap();
        assert_eq!(t.find_v2(&v6.octets()), Some(1));
        t.add(1, VRDMA_GID_TYPE_ROCE_V1, v6.octets()).unwrap();
        assert_eq!(t.find_v2(&v6.octets()), Some(2));
        assert_eq!(t.get(0).unwrap().ip(), IpAddr::V4(v4));
        assert!(gid_is_ipv4(&t.get(0).unwrap().gid));
        assert!(!gid_is_ipv4(&v6.octets()));
        assert_eq!(gid_to_ip(&v6.octets()), IpAddr::V6(v6));
        assert_eq!(
            t.add(4, VRDMA_GID_TYPE_ROCE_V2, [0; 16]),
            Err(GidError::BadIndex)
        );
        assert_eq!(t.add(3, 0, [0; 16]), Err(GidError::BadType));
        assert_eq!(t.del(3), Err(GidError::NotFound));
        assert_eq!(t.del(9), Err(GidError::BadIndex));
        t.del(0).unwrap();
        assert!(!t.is_local_ipv4(v4));
        t.clear();
        assert!(t.get(2).is_none());
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn readers_beside_a_writer_see_whole_entries() {
        // A writer flips entry 1 between two RoCEv2 GIDs and a RoCEv1 one; readers never see
        // half of one GID with half of another, or a type that does not go with its GID.
        let t = GidTable::new(4);
        let a = [0xaa; 16];
        let b = [0x55; 16];
        t.add(0, VRDMA_GID_TYPE_ROCE_V2, [7; 16]).unwrap();
        t.add(1, VRDMA_GID_TYPE_ROCE_V2, a).unwrap();
        // Every reader checks entry 1 this many times while the writer flips it (issue 38
        // item 5: the overlap is made to happen, see `sync::overlap`).
        const READER_ROUNDS: u64 = 2_000;
        let o = Overlap::new(2);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|r| {
                    let (o, t) = (&o, &t);
                    s.spawn(move || {
                        o.read(r, || {
                            let e = t.get(1).expect("entry 1 is never empty");
                            let ok = (e.gid == a && e.gid_type == VRDMA_GID_TYPE_ROCE_V2)
                                || (e.gid == b && e.gid_type == VRDMA_GID_TYPE_ROCE_V1);
                            assert!(ok, "torn entry {e:?}");
                            // `a` is RoCEv2 at index 1 whenever the table holds it; `b` never.
                            assert!(matches!(t.find_v2(&a), None | Some(1)));
                            assert_eq!(t.find_v2(&b), None);
                            assert_eq!(t.find_v2(&[7; 16]), Some(0));
                        })
                    })
                })
                .collect();
            let w = o.writer();
            let mut flips = 0;
            while flips < 20_000 || !w.readers_did(READER_ROUNDS) {
                t.add(1, VRDMA_GID_TYPE_ROCE_V1, b).unwrap();
                t.add(1, VRDMA_GID_TYPE_ROCE_V2, a).unwrap();
                flips += 1;
            }
            drop(w);
            for r in readers {
                assert!(r.join().expect("reader") >= READER_ROUNDS);
            }
        });
    }
}

/// The loom model (issue 38 item 1): `RUSTFLAGS="--cfg loom" cargo test --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;

    /// A writer flips entry 1 from a RoCEv2 GID to a RoCEv1 one and back while a reader
    /// reads it: every read is one whole entry (never half of one GID with half of the other,
    /// or a type that does not go with its GID), and the RoCEv2 index agrees.
    #[test]
    fn loom_readers_beside_a_writer_never_see_a_torn_entry() {
        let (a, b) = ([0xaa; 16], [0x55; 16]);
        crate::sync::modeled::model(move || {
            let t = Arc::new(GidTable::new(2));
            t.add(1, VRDMA_GID_TYPE_ROCE_V2, a).unwrap();
            let reader = {
                let t = t.clone();
                loom::thread::spawn(move || {
                    let e = t.get(1).expect("entry 1 is never empty");
                    let whole = (e.gid == a && e.gid_type == VRDMA_GID_TYPE_ROCE_V2)
                        || (e.gid == b && e.gid_type == VRDMA_GID_TYPE_ROCE_V1);
                    assert!(whole, "torn entry {e:?}");
                    assert!(matches!(t.find_v2(&a), None | Some(1)));
                    assert_eq!(t.find_v2(&b), None, "a RoCEv1 GID in the RoCEv2 index");
                })
            };
            t.add(1, VRDMA_GID_TYPE_ROCE_V1, b).unwrap();
            t.add(1, VRDMA_GID_TYPE_ROCE_V2, a).unwrap();
            reader.join().expect("reader");
        });
    }
}
