//! One guest memory region's part of the migration dirty log (spec §17.1): one bit per 4 KiB
//! guest-physical page in the log the frontend shares (SET_LOG_BASE, `LOG_SHMFD`), bit `p % 8`
//! of byte `p / 8` for page `p`, as the vhost-user protocol lays it out.
//!
//! The vhost-user-backend crate maps the log and asks the bitmap type for one of these per
//! region; the stores go through [`super::log_guard`], so a log file that does not cover the
//! log costs the migration, not the daemon.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use vhost_user_backend::bitmap::{AtomicBitmapMmap, MemRegionBitmap, MmapLogReg};
use vm_memory::GuestMemoryRegion;

use super::log_guard::{self, Guarded};

/// Guest bytes one bit of the log stands for.
const LOG_PAGE: u64 = 4096;

/// The log bits of one region, and the guard over the bytes that hold them.
#[derive(Debug)]
pub struct RegionLog {
    /// Declared before `log` so that the range is unwatched before the mapping can go.
    guard: Guarded,
    log: Arc<MmapLogReg>,
    /// The region's first page, counted from guest-physical 0 (its first bit in the log).
    first_page: usize,
    /// Pages of the region.
    pages: usize,
}

impl RegionLog {
    /// Mark the pages of `[offset, offset + len)` (relative to the region) dirty; bytes beyond
    /// the region are ignored.
    pub fn mark_dirty(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / LOG_PAGE as usize;
        let last = offset.saturating_add(len - 1) / LOG_PAGE as usize;
        for page in first..=last {
            if page >= self.pages {
                break;
            }
            let bit = self.first_page + page;
            self.log[bit / 8].fetch_or(1 << (bit % 8), Ordering::Relaxed);
        }
    }

    /// Is the page at `offset` (relative to the region) marked?
    pub fn dirty_at(&self, offset: usize) -> bool {
        let page = offset / LOG_PAGE as usize;
        if page >= self.pages {
            return false;
        }
        let bit = self.first_page + page;
        self.log[bit / 8].load(Ordering::Relaxed) & (1 << (bit % 8)) != 0
    }

    /// Did a store into this region's bits fault (spec §17.1: the migration must fail)?
    pub fn lost(&self) -> bool {
        self.guard.lost()
    }
}

impl MemRegionBitmap for RegionLog {
    fn new<R: GuestMemoryRegion>(region: &R, log: Arc<MmapLogReg>) -> io::Result<Self> {
        // The crate's own bitmap checks that the log covers the region (the mapping's length is
        // private to the crate); build one only for that check.
        drop(AtomicBitmapMmap::new(region, Arc::clone(&log))?);
        let invalid = || io::Error::from(io::ErrorKind::InvalidData);
        let start = region.start_addr().0;
        let len = region.len();
        if len == 0 {
            return Err(invalid());
        }
        let end = start.checked_add(len - 1).ok_or_else(invalid)?;
        let first_page = usize::try_from(start / LOG_PAGE).map_err(|_| invalid())?;
        let last_page = usize::try_from(end / LOG_PAGE).map_err(|_| invalid())?;
        let byte = |page: usize| std::ptr::from_ref::<AtomicU8>(&log[page / 8]) as usize;
        let range = byte(first_page)..byte(last_page) + 1;
        Ok(RegionLog {
            guard: log_guard::guard(range)?,
            log,
            first_page,
            pages: last_page - first_page + 1,
        })
    }
}
