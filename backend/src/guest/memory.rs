//! Guest-physical memory access (spec §4, §12): every device access to guest RAM goes through
//! [`GuestMem`]. Guest physical addresses (GPAs) come from the guest and are untrusted: each access
//! is bounds-checked against the vhost-user memory table and fails with [`GuestMemError`].
//!
//! Rules:
//! - `read`/`write` of a range that spans several regions succeed only if the regions are
//!   contiguous in GPA space (no hole anywhere in `[gpa, gpa + len)`); otherwise nothing is
//!   guaranteed about partial copies and the call fails with `OutOfRange`.
//! - Atomic accesses (`load_u32_acquire`, `store_u32_release`, `swap_u32`) need 4-byte alignment,
//!   `compare_swap_u64` and `fetch_add_u64` need 8-byte alignment (`Misaligned` otherwise). They are
//!   real CPU atomics on the shared mapping, so they are atomic with respect to the guest's own
//!   accesses and to every other atomic of this device (IB atomicity level HCA or better).
//! - The memory table can be swapped at any time (SET_MEM_TABLE); all clones of a `GuestMem` see
//!   the new table at their next access.

use std::cell::RefCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use thiserror::Error;

use super::dirty_log::RegionLog;
use vhost_user_backend::bitmap::BitmapReplace;
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::{
    GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress,
};

/// The memory map type handed over by vhost-user, with the dirty-page log of migration (spec
/// §17.1): every write of [`GuestMem`] marks the pages it touched in the region's [`DirtyBitmap`].
pub type GuestMemoryMap = GuestMemoryMmap<DirtyBitmap>;

/// The dirty-page log of one guest memory region (spec §17.1): the region's bits in the
/// frontend's shared log ([`RegionLog`], none until SET_LOG_BASE, VHOST_USER_PROTOCOL_F_LOG_SHMFD)
/// behind a "logging on" flag. Defined here, not in `vhost_user/`, because every guest access
/// must know it: nothing below the vhost-user layer may depend on that layer (ARCHITECTURE.md
/// "Layers").
///
/// Why the flag: reaching the log takes an `RwLock` read (two locked RMWs on a cache line every
/// engine thread shares) on every guest write, and most writes happen while no migration runs.
/// With the flag, a write while no log is set costs a compiler barrier and one load. No page is
/// lost: the flag turns on only after the log is in place (`replace`), and a writer that reads
/// it off has its write globally visible before `replace` returns (an asymmetric fence,
/// `sync/asymmetric.rs`: the full barrier is `replace`'s, see `mark_dirty`).
///
/// vhost-user-backend never takes a log away again (it keeps marking after a failed
/// migration), so the flag never turns off either. A loss of bits (`RegionLog::lost`) is
/// remembered across a new log base of the same migration (`LogState::lost_earlier`).
#[derive(Default, Debug, Clone)]
pub struct DirtyBitmap {
    log: Arc<RwLock<Option<RegionLog>>>,
    /// Where this slice starts in its region.
    base: usize,
    state: Arc<LogState>,
}

#[derive(Default, Debug)]
struct LogState {
    /// A log has been set (SET_LOG_BASE reached `replace`).
    on: AtomicBool,
    /// A log this one replaced during the same migration missed pages. A frontend sets a new
    /// log base during a migration when the log must grow, after reading the old one: the
    /// pages the old log missed are missing from what it read, so the loss outlives that log
    /// until the migration ends ([`DirtyBitmap::end_migration`]).
    lost_earlier: AtomicBool,
    /// The last migration ended (logging turned off) since the log in place was set: the
    /// next log belongs to a new migration and inherits nothing from it.
    ended: AtomicBool,
}

impl DirtyBitmap {
    /// Is a dirty log set for this region?
    pub fn logging(&self) -> bool {
        self.state.on.load(Ordering::Acquire)
    }

    /// Did a mark into this region's log fault because the frontend's log file does not cover
    /// it (spec §16.5)? Then the log misses pages and the device state must not be saved.
    pub fn log_lost(&self) -> bool {
        self.logging()
            && (self.state.lost_earlier.load(Ordering::Acquire)
                || crate::sync::read(&self.log)
                    .as_ref()
                    .is_some_and(RegionLog::lost))
    }

    /// The frontend turned logging off (VHOST_F_LOG_ALL no longer acked): the migration is
    /// over, saved or failed. What its logs missed does not count against the next one, whose
    /// first SET_LOG_BASE (before or after it acks LOG_ALL again) brings a log of its own.
    pub fn end_migration(&self) {
        self.state.ended.store(true, Ordering::Release);
        self.state.lost_earlier.store(false, Ordering::Release);
    }
}

impl Bitmap for DirtyBitmap {
    fn mark_dirty(&self, offset: usize, len: usize) {
        // The caller wrote guest memory just before. If this load sees "off", that write must
        // already be visible to whoever turns logging on and then reads the page (QEMU's first
        // RAM pass starts after SET_LOG_BASE): a store -> load order (x86 reorders a later
        // load before an earlier store). The full fence it takes is on the side that turns
        // logging on (`replace`), which runs once per region and migration.
        crate::sync::asymmetric::light();
        if self.state.on.load(Ordering::Acquire) {
            if let Some(log) = crate::sync::read(&self.log).as_ref() {
                log.mark_dirty(self.base.saturating_add(offset), len);
            }
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.logging()
            && crate::sync::read(&self.log)
                .as_ref()
                .is_some_and(|log| log.dirty_at(self.base.saturating_add(offset)))
    }

    fn slice_at(&self, offset: usize) -> Self {
        DirtyBitmap {
            log: Arc::clone(&self.log),
            base: self.base.saturating_add(offset),
            state: Arc::clone(&self.state),
        }
    }
}

impl BitmapSlice for DirtyBitmap {}

impl WithBitmapSlice<'_> for DirtyBitmap {
    type S = Self;
}

impl NewBitmap for DirtyBitmap {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}

impl BitmapReplace for DirtyBitmap {
    type InnerBitmap = RegionLog;

    fn replace(&self, log: RegionLog) {
        let old = crate::sync::write(&self.log).replace(log);
        let same_migration = !self.state.ended.swap(false, Ordering::AcqRel);
        if same_migration && old.as_ref().is_some_and(RegionLog::lost) {
            self.state.lost_earlier.store(true, Ordering::Release);
        }
        // Release after the log is in place: a writer that sees "on" marks into this log.
        self.state.on.store(true, Ordering::SeqCst);
        // A writer that saw "off" has its write visible before this returns, so before the
        // reply to SET_LOG_BASE lets the frontend read the page (`mark_dirty`).
        crate::sync::asymmetric::heavy();
    }
}

/// Errors of guest memory accesses.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GuestMemError {
    /// `[gpa, gpa + len)` is not entirely inside guest RAM.
    #[error("guest range {gpa:#x}+{len:#x} is outside guest memory")]
    OutOfRange { gpa: u64, len: u64 },
    /// `gpa + len` overflows the 64-bit address space.
    #[error("guest range {gpa:#x}+{len:#x} overflows")]
    Overflow { gpa: u64, len: u64 },
    /// An atomic access at an address that is not naturally aligned.
    #[error("atomic access at {gpa:#x} is not {align}-byte aligned")]
    Misaligned { gpa: u64, align: u64 },
    /// Building a memory map failed (tests / setup only).
    #[error("cannot build guest memory: {0}")]
    Setup(String),
}

/// Bounds-checked access to guest physical memory. Cheap to clone; clones share the memory table.
#[derive(Clone)]
pub struct GuestMem {
    inner: GuestMemoryAtomic<GuestMemoryMap>,
    /// The table's version: unique across every `GuestMem` table of the process (taken from
    /// [`NEXT_VERSION`]) and replaced by each `set_memory`, so a thread's snapshot
    /// ([`SNAPSHOTS`]) is current exactly when its version equals this.
    version: Arc<AtomicU64>,
}

/// Source of table versions (see `GuestMem::version`).
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

/// Snapshots of the memory tables this thread used: (table identity, version, table). Why:
/// `GuestMemoryAtomic::memory()` is an arc-swap load (a SeqCst store and a CAS on a debt slot,
/// on lines the engine and vhost-user threads share) and a packet accesses guest memory several
/// times: those loads were ~12 % of the CPU of the 64 B in-process profile. A current snapshot
/// costs one atomic load of the version. One entry per table (the identity picks the entry to
/// replace, so an old table is released at this thread's next access); an engine thread serves
/// one device, or in an engine group (a fabric's default) the devices of its slot (more than this many then
/// take turns: correct, at the cost of the load above), the in-process bench and tests a few.
const SNAPSHOT_SLOTS: usize = 16;

type Snapshot = (usize, u64, Arc<GuestMemoryMap>);

thread_local! {
    static SNAPSHOTS: RefCell<Vec<Snapshot>> = const { RefCell::new(Vec::new()) };
}

impl std::fmt::Debug for GuestMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_map(|map| {
            let mut l = f.debug_list();
            for r in map.iter() {
                l.entry(&(r.start_addr().0, r.len()));
            }
            l.finish()
        })
    }
}

impl Default for GuestMem {
    fn default() -> Self {
        Self::empty()
    }
}

impl GuestMem {
    /// Wrap a memory object. From then on its table must be replaced only through
    /// [`GuestMem::set_memory`] / [`GuestMem::set_from_atomic`]: a swap made directly on `atomic`
    /// is not seen by threads holding a snapshot of the table (see `with_map`).
    pub fn new(atomic: GuestMemoryAtomic<GuestMemoryMap>) -> Self {
        GuestMem {
            inner: atomic,
            version: Arc::new(AtomicU64::new(NEXT_VERSION.fetch_add(1, Ordering::Relaxed))),
        }
    }

    /// No guest memory at all (before SET_MEM_TABLE): every access fails with `OutOfRange`.
    pub fn empty() -> Self {
        Self::new(GuestMemoryAtomic::new(GuestMemoryMap::new()))
    }

    /// Anonymous memory regions at the given GPAs (tests). Regions must not overlap.
    pub fn from_ranges(ranges: &[(u64, usize)]) -> Result<Self, GuestMemError> {
        let r: Vec<(GuestAddress, usize)> =
            ranges.iter().map(|&(g, l)| (GuestAddress(g), l)).collect();
        let map =
            GuestMemoryMap::from_ranges(&r).map_err(|e| GuestMemError::Setup(e.to_string()))?;
        Ok(Self::new(GuestMemoryAtomic::new(map)))
    }

    /// Build from already-mapped regions (e.g. memfd-backed regions in tests).
    pub fn from_regions(regions: Vec<GuestRegionMmap<DirtyBitmap>>) -> Result<Self, GuestMemError> {
        let map = GuestMemoryMap::from_regions(regions)
            .map_err(|e| GuestMemError::Setup(e.to_string()))?;
        Ok(Self::new(GuestMemoryAtomic::new(map)))
    }

    /// Swap in a new memory table (SET_MEM_TABLE). Visible to every clone.
    pub fn set_memory(&self, map: GuestMemoryMap) {
        crate::sync::unpoisoned(self.inner.lock()).replace(map);
        // After the replace (Release): a thread that reads the new version loads the new table.
        let v = NEXT_VERSION.fetch_add(1, Ordering::Relaxed);
        self.version.store(v, Ordering::Release);
    }

    /// Run `f` on the current table: this thread's snapshot if it is current, else a fresh one
    /// (which then replaces the table's old snapshot, or the oldest one). `f` may access guest
    /// memory again (nested accesses just skip the snapshot update).
    fn with_map<R>(&self, f: impl FnOnce(&GuestMemoryMap) -> R) -> R {
        let v = self.version.load(Ordering::Acquire);
        let id = Arc::as_ptr(&self.version) as usize;
        if SNAPSHOTS.try_with(|_| ()).is_err() {
            // This thread's snapshots are gone (a thread-local destructor runs): load directly.
            return f(&self.inner.memory());
        }
        SNAPSHOTS.with(move |c| {
            if let Ok(snaps) = c.try_borrow() {
                if let Some((_, _, m)) = snaps.iter().find(|s| s.1 == v) {
                    return f(m);
                }
            }
            // Loaded after reading `v`, so at least as new as version `v`; a swap in between
            // shows up as a newer version at the next access, which loads again.
            let m = self.inner.memory().into_inner();
            if let Ok(mut snaps) = c.try_borrow_mut() {
                if let Some(s) = snaps.iter_mut().find(|s| s.0 == id) {
                    *s = (id, v, Arc::clone(&m));
                } else {
                    if snaps.len() == SNAPSHOT_SLOTS {
                        snaps.remove(0);
                    }
                    snaps.push((id, v, Arc::clone(&m)));
                }
            }
            f(&m)
        })
    }

    /// Copy the current table of another `GuestMemoryAtomic` (what vhost-user's `update_memory`
    /// hands over) into this one.
    pub fn set_from_atomic(&self, other: &GuestMemoryAtomic<GuestMemoryMap>) {
        let map: GuestMemoryMap = (*other.memory()).clone();
        self.set_memory(map);
    }

    /// The underlying atomic memory object (for the vhost-user plumbing).
    pub fn atomic(&self) -> &GuestMemoryAtomic<GuestMemoryMap> {
        &self.inner
    }

    /// Is a dirty-page log set (spec §17.1) for any region of the current table?
    pub fn logging(&self) -> bool {
        self.inner
            .memory()
            .iter()
            .any(|r| r.deref().bitmap().logging())
    }

    /// Is `[gpa, gpa + len)` entirely inside guest RAM (contiguous regions allowed)? Zero-length
    /// ranges are always valid.
    pub fn check_range(&self, gpa: u64, len: u64) -> bool {
        self.check(gpa, len).is_ok()
    }

    fn check(&self, gpa: u64, len: u64) -> Result<(), GuestMemError> {
        self.with_map(|m| check_in(m, gpa, len))
    }

    /// Read `buf.len()` bytes at `gpa`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), GuestMemError> {
        // One snapshot of the table for the check and the copy.
        let dst = buf.as_mut_ptr();
        let len = buf.len();
        self.with_map(|map| {
            for_each_piece(map, gpa, len, |_, host, done, n| {
                // SAFETY: `host` is valid for `n` bytes of the region's mapping (`for_each_piece`)
                // and `dst + done .. + n` lies inside `buf`. Guest RAM never overlaps a host
                // buffer. The guest may change the bytes while they are copied (as with
                // vm-memory's own slice copies): the caller gets some byte values, never UB in
                // this process, because guest RAM is only ever accessed through raw pointers.
                unsafe { std::ptr::copy_nonoverlapping(host, dst.add(done), n) };
            })
        })
    }

    /// Write `buf` at `gpa`, marking the pages in the dirty log while one is set (spec §17.1).
    pub fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), GuestMemError> {
        let src = buf.as_ptr();
        self.with_map(|map| {
            for_each_piece(map, gpa, buf.len(), |r, host, done, n| {
                // SAFETY: as in `read`, with the roles of the two buffers exchanged.
                unsafe { std::ptr::copy_nonoverlapping(src.add(done), host, n) };
                let off = host as usize - r.as_ptr() as usize;
                r.deref().bitmap().mark_dirty(off, n);
            })
        })
    }

    /// Hand the host addresses of `[gpa, gpa + len)` to `f(host, done, n)`, piece by piece in
    /// order (`done`: bytes before the piece), for a copy from this guest's memory straight
    /// into another's (a fabric reference, spec §16.2 rule 6). `host` is valid for `n` bytes
    /// during the call only (the table snapshot is held for it); reading through it is up to
    /// the caller's `unsafe`, and must be a raw copy: the guest may change the bytes
    /// meanwhile, so no `&[u8]` over them may exist. Fails (having called `f` for nothing)
    /// if the range is not entirely in guest RAM.
    pub fn with_host_ranges(
        &self,
        gpa: u64,
        len: usize,
        mut f: impl FnMut(*const u8, usize, usize),
    ) -> Result<(), GuestMemError> {
        self.with_map(|map| {
            for_each_piece(map, gpa, len, |_, host, done, n| {
                f(host.cast_const(), done, n)
            })
        })
    }

    /// [`GuestMem::write`] from a raw source: copy `len` bytes from `src` to `gpa`, marking
    /// the pages in the dirty log while one is set (spec §17.1).
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes for the whole call (it may be another
    /// guest's memory, which may change meanwhile: the copy is raw, so that is harmless).
    pub unsafe fn write_from_ptr(
        &self,
        gpa: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), GuestMemError> {
        self.with_map(|map| {
            for_each_piece(map, gpa, len, |r, host, done, n| {
                // SAFETY: `host` is valid for `n` bytes of the region's mapping
                // (`for_each_piece`); `src + done .. + n` is inside the caller's `len` valid
                // bytes (this function's contract). Distinct guests' RAM never overlaps, and a
                // copy within one guest (a loopback) is a raw copy of some byte values: the
                // device gives no guarantee for overlapping local and remote buffers either.
                unsafe { std::ptr::copy(src.add(done), host, n) };
                let off = host as usize - r.as_ptr() as usize;
                r.deref().bitmap().mark_dirty(off, n);
            })
        })
    }

    /// Fill `[gpa, gpa + len)` with zeroes.
    pub fn zero(&self, gpa: u64, len: u64) -> Result<(), GuestMemError> {
        self.check(gpa, len)?;
        let zeros = [0u8; 4096];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(4096);
            self.write(gpa + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    /// `dirty`: the access may write, so the page goes into the migration log (spec §17.1).
    fn with_u32<R>(
        &self,
        gpa: u64,
        dirty: bool,
        f: impl FnOnce(&AtomicU32) -> R,
    ) -> Result<R, GuestMemError> {
        if !gpa.is_multiple_of(4) {
            return Err(GuestMemError::Misaligned { gpa, align: 4 });
        }
        self.with_map(|map| {
            let (r, host) = host_of(map, gpa, 4)?;
            // SAFETY: `host` is valid for 4 bytes of a live mapping (`host_of`, and `map` keeps
            // the table alive for this call) and 4-aligned (checked: the GPA is, and regions are
            // mapped page-aligned, but the pointer itself is what counts). Guest RAM is shared
            // memory only ever accessed atomically or through raw copies, so an atomic reference
            // to it is sound for the duration of `f`.
            let a = unsafe { &*(host as *const AtomicU32) };
            let res = f(a);
            if dirty {
                let off = host as usize - r.as_ptr() as usize;
                r.deref().bitmap().mark_dirty(off, 4);
            }
            Ok(res)
        })
    }

    /// `dirty`: the access may write, so the page goes into the migration log (spec §17.1).
    fn with_u64<R>(
        &self,
        gpa: u64,
        dirty: bool,
        f: impl FnOnce(&AtomicU64) -> R,
    ) -> Result<R, GuestMemError> {
        if !gpa.is_multiple_of(8) {
            return Err(GuestMemError::Misaligned { gpa, align: 8 });
        }
        self.with_map(|map| {
            let (r, host) = host_of(map, gpa, 8)?;
            // SAFETY: `host` is valid for 8 bytes of a live mapping (`host_of`, and `map` keeps
            // the table alive for this call) and 8-aligned (checked: the GPA is, and regions are
            // mapped page-aligned, but the pointer itself is what counts). Guest RAM is shared
            // memory only ever accessed atomically or through raw copies, so an atomic reference
            // to it is sound for the duration of `f`.
            let a = unsafe { &*(host as *const AtomicU64) };
            let res = f(a);
            if dirty {
                let off = host as usize - r.as_ptr() as usize;
                r.deref().bitmap().mark_dirty(off, 8);
            }
            Ok(res)
        })
    }

    /// Little-endian u32 load with acquire ordering (ring indices).
    pub fn load_u32_acquire(&self, gpa: u64) -> Result<u32, GuestMemError> {
        self.with_u32(gpa, false, |a| u32::from_le(a.load(Ordering::Acquire)))
    }

    /// Little-endian u32 store with release ordering (ring indices).
    pub fn store_u32_release(&self, gpa: u64, v: u32) -> Result<(), GuestMemError> {
        self.with_u32(gpa, true, |a| a.store(v.to_le(), Ordering::Release))
    }

    /// Atomic exchange of a little-endian u32 (CQ arm); sequentially consistent. Returns the old value.
    pub fn swap_u32(&self, gpa: u64, v: u32) -> Result<u32, GuestMemError> {
        self.with_u32(gpa, true, |a| {
            u32::from_le(a.swap(v.to_le(), Ordering::SeqCst))
        })
    }

    /// Atomic compare-and-swap of a u64 in guest memory (IB atomic CMP_AND_SWP, little-endian host
    /// order in memory as the guest CPU sees it). Returns the original value.
    pub fn compare_swap_u64(&self, gpa: u64, expect: u64, new: u64) -> Result<u64, GuestMemError> {
        self.with_u64(gpa, true, |a| {
            match a.compare_exchange(
                expect.to_le(),
                new.to_le(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(old) | Err(old) => u64::from_le(old),
            }
        })
    }

    /// Atomic fetch-and-add of a u64 in guest memory (wrapping). Returns the original value.
    pub fn fetch_add_u64(&self, gpa: u64, add: u64) -> Result<u64, GuestMemError> {
        // The host is little-endian (vrdma-spec refuses big-endian targets), so the in-memory
        // representation is the native one and a native fetch_add is correct.
        self.with_u64(gpa, true, |a| a.fetch_add(add, Ordering::SeqCst))
    }

    /// Store 8 bytes with one atomic 64-bit store (IBTA 1.5 ATOMIC WRITE); the bytes land in
    /// memory unchanged. Release ordering: every earlier write of the device is visible first.
    pub fn store_bytes8_atomic(&self, gpa: u64, bytes: [u8; 8]) -> Result<(), GuestMemError> {
        self.with_u64(gpa, true, |a| {
            a.store(u64::from_ne_bytes(bytes), Ordering::Release)
        })
    }

    /// Make every earlier device write globally visible (IBTA 1.5 FLUSH, global placement):
    /// guest memory is host RAM, so a full fence is all it takes.
    pub fn fence(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Read a little-endian u64 (non-atomic).
    pub fn read_u64(&self, gpa: u64) -> Result<u64, GuestMemError> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Read a little-endian u32 (non-atomic).
    pub fn read_u32(&self, gpa: u64) -> Result<u32, GuestMemError> {
        let mut b = [0u8; 4];
        self.read(gpa, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// Is `[gpa, gpa + len)` inside `map` (contiguous regions allowed; zero length always is)?
fn check_in(map: &GuestMemoryMap, gpa: u64, len: u64) -> Result<(), GuestMemError> {
    if len == 0 {
        return Ok(());
    }
    let end = gpa
        .checked_add(len - 1)
        .ok_or(GuestMemError::Overflow { gpa, len })?;
    // Walk regions covering the range; they must be contiguous.
    let mut cur = gpa;
    loop {
        let r = map
            .find_region(GuestAddress(cur))
            .ok_or(GuestMemError::OutOfRange { gpa, len })?;
        let last = r.last_addr().0;
        if last >= end {
            return Ok(());
        }
        cur = last + 1;
    }
}

/// Walk `[gpa, gpa + len)` region by region (contiguous regions allowed), calling
/// `f(region, host, done, n)` for each piece: `n` bytes at host address `host`, the piece
/// starting `done` bytes into the access. Fails before any call if the range is not entirely
/// guest RAM.
fn for_each_piece(
    map: &GuestMemoryMap,
    gpa: u64,
    len: usize,
    mut f: impl FnMut(&GuestRegionMmap<DirtyBitmap>, *mut u8, usize, usize),
) -> Result<(), GuestMemError> {
    let len64 = len as u64;
    check_in(map, gpa, len64)?;
    let oor = || GuestMemError::OutOfRange { gpa, len: len64 };
    let mut done = 0usize;
    while done < len {
        let cur = gpa + done as u64;
        let r = map.find_region(GuestAddress(cur)).ok_or_else(oor)?;
        let off = cur - r.start_addr().0;
        let n = ((r.len() - off) as usize).min(len - done);
        let host = r
            .get_host_address(MemoryRegionAddress(off))
            .map_err(|_| oor())?;
        f(r, host, done, n);
        done += n;
    }
    Ok(())
}

/// The region and host address of an `len`-byte atomic at `gpa` (inside one region, host
/// address `len`-aligned).
fn host_of(
    map: &GuestMemoryMap,
    gpa: u64,
    len: u64,
) -> Result<(&GuestRegionMmap<DirtyBitmap>, *mut u8), GuestMemError> {
    let oor = GuestMemError::OutOfRange { gpa, len };
    let r = map.find_region(GuestAddress(gpa)).ok_or(oor.clone())?;
    let off = gpa - r.start_addr().0;
    if r.len() - off < len {
        return Err(oor);
    }
    let host = r
        .get_host_address(MemoryRegionAddress(off))
        .map_err(|_| oor)?;
    if !(host as usize).is_multiple_of(len as usize) {
        return Err(GuestMemError::Misaligned { gpa, align: len });
    }
    Ok((r, host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(base: u64) -> GuestMem {
        GuestMem::from_ranges(&[(base, 0x10000)]).expect("memory")
    }

    /// Thread snapshots (`with_map`): a `set_memory` is seen by every clone at its next access,
    /// on this thread and on others, with more tables in use than snapshot slots.
    #[test]
    fn a_swapped_table_is_seen_at_the_next_access() {
        let tables: Vec<GuestMem> = (0..SNAPSHOT_SLOTS as u64 + 2)
            .map(|i| mem(i << 20))
            .collect();
        for (i, t) in tables.iter().enumerate() {
            t.write((i as u64) << 20, &[i as u8; 8]).unwrap();
        }
        for round in 0..3 {
            for (i, t) in tables.iter().enumerate() {
                assert_eq!(
                    t.read_u64((i as u64) << 20).unwrap(),
                    u64::from_ne_bytes([i as u8; 8])
                );
                assert!(!t.check_range(0x4000_0000, 1), "round {round}");
            }
        }
        let a = tables[1].clone();
        let other = a.clone();
        // Another thread takes its own snapshot of the old table first.
        std::thread::spawn(move || assert!(other.check_range(1 << 20, 8)))
            .join()
            .unwrap();
        // This thread holds a current snapshot of the old table now.
        assert!(a.check_range(1 << 20, 8));
        let fresh = GuestMemoryMap::from_ranges(&[(GuestAddress(0x4000_0000), 0x1000)]).unwrap();
        tables[1].set_memory(fresh);
        assert!(
            a.check_range(0x4000_0000, 0x1000),
            "the clone sees the new table"
        );
        assert!(!a.check_range(1 << 20, 8), "and not the old one");
        let other = a.clone();
        std::thread::spawn(move || {
            assert!(other.check_range(0x4000_0000, 8));
            assert!(!other.check_range(1 << 20, 8));
        })
        .join()
        .unwrap();
        // The other tables are untouched.
        assert_eq!(tables[0].read_u64(0).unwrap(), 0);
        assert!(tables[5].check_range(5 << 20, 8));
    }

    /// An access from inside another access's snapshot (the Debug output walks the table) does
    /// not trip over the thread's snapshot list.
    #[test]
    fn nested_accesses_work() {
        let a = mem(0);
        let b = mem(1 << 20);
        a.write(0, &[1; 4]).unwrap();
        let s = a.with_map(|_| {
            // A miss for `b` while `a`'s snapshot is borrowed: loads without caching.
            b.write(1 << 20, &[2; 4]).unwrap();
            format!("{a:?} {b:?}")
        });
        assert!(s.contains("65536"), "{s}");
        assert_eq!(b.read_u32(1 << 20).unwrap(), 0x0202_0202);
    }
}
