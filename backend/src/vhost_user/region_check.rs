//! Memory regions a frontend hands over (SET_MEM_TABLE / ADD_MEM_REG) are checked against their
//! file before the device uses them (spec §16.5 "Frontend memory"): an access to a page of a
//! shared mapping that lies beyond the end of its file raises SIGBUS, which would end the whole
//! daemon and every tenant's device with it. A region is accepted only if no frontend action
//! can put any of its pages beyond the end of the file:
//!
//! - it is backed by a regular file (memfd, hugetlbfs or tmpfs file), not a device or socket;
//! - the file is at least `mmap_offset + size` bytes long;
//! - the file carries `F_SEAL_SHRINK` (a memfd that can never get shorter), which QEMU's
//!   `memory-backend-memfd` sets by default (`seal=on`). A file that cannot be sealed
//!   (`memory-backend-file`) or a memfd without that seal could be truncated later by the
//!   frontend, so it is refused.
//!
//! Anonymous regions (no file: only the in-process tests build them) cannot shrink and pass.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::GuestMemoryMmap;
use crate::sync::lock;

/// Why a region of the frontend's memory table was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RegionError {
    #[error("cannot fstat the region's file: {0}")]
    Stat(String),
    #[error("the region's file is not a regular file (mode {mode:#o})")]
    NotRegularFile { mode: u32 },
    #[error("the region ends at file offset {end:#x} but the file is {file_size:#x} bytes long")]
    BeyondEndOfFile { end: u64, file_size: u64 },
    #[error(
        "the region's file can be truncated: it is not a memfd sealed with F_SEAL_SHRINK \
         (use -object memory-backend-memfd with seal=on, QEMU's default)"
    )]
    NotSealed,
}

/// A refused region of a memory table: where it sits in guest memory and why.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("memory region at gpa {gpa:#x} ({size:#x} bytes) refused: {reason}")]
pub struct RefusedRegion {
    pub gpa: u64,
    pub size: u64,
    pub reason: RegionError,
}

/// Check one file-backed region: `size` bytes mapped from `file` at `offset`.
pub fn check_region_file(file: &File, offset: u64, size: u64) -> Result<(), RegionError> {
    let meta = file
        .metadata()
        .map_err(|e| RegionError::Stat(e.to_string()))?;
    if !meta.file_type().is_file() {
        use std::os::unix::fs::PermissionsExt;
        return Err(RegionError::NotRegularFile {
            mode: meta.permissions().mode(),
        });
    }
    let end = offset
        .checked_add(size)
        .ok_or(RegionError::BeyondEndOfFile {
            end: u64::MAX,
            file_size: meta.len(),
        })?;
    if end > meta.len() {
        return Err(RegionError::BeyondEndOfFile {
            end,
            file_size: meta.len(),
        });
    }
    // SAFETY: F_GET_SEALS takes no argument and only reads the descriptor's seals; `file`
    // keeps the descriptor open for the call. Files that cannot be sealed answer -1 (EINVAL).
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(RegionError::NotSealed);
    }
    Ok(())
}

/// Check every region of a memory table; the first refused one is returned.
pub fn check_table(table: &GuestMemoryMmap) -> Result<(), RefusedRegion> {
    for r in table.iter() {
        let Some(fo) = r.file_offset() else {
            continue;
        };
        check_region_file(fo.file(), fo.start(), r.len()).map_err(|reason| RefusedRegion {
            gpa: r.start_addr().0,
            size: r.len(),
            reason,
        })?;
    }
    Ok(())
}

/// The last memory table of a connection whose regions passed [`check_table`], kept alive so
/// that its address names it and no other table. Shared by the connection's ring workers and
/// the device's outputs (spec §16.5).
#[derive(Debug, Default)]
pub struct CheckedTable {
    held: Mutex<Option<Arc<GuestMemoryMmap>>>,
    addr: AtomicUsize,
}

impl CheckedTable {
    /// `table` back if its regions are safe to access (checked now unless it is the table
    /// checked last), `None` if not. A caller that then accesses guest memory only through
    /// the returned table never touches a region that was not checked, whatever swaps the
    /// frontend makes meanwhile.
    pub fn checked(&self, table: Arc<GuestMemoryMmap>) -> Option<Arc<GuestMemoryMmap>> {
        if self.addr.load(Ordering::Acquire) == Arc::as_ptr(&table) as usize {
            return Some(table);
        }
        check_table(&table).ok()?;
        self.remember(Arc::clone(&table));
        Some(table)
    }

    /// Record `table` as checked.
    pub fn remember(&self, table: Arc<GuestMemoryMmap>) {
        let mut held = lock(&self.held);
        self.addr
            .store(Arc::as_ptr(&table) as usize, Ordering::Release);
        *held = Some(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(len: u64, seals: libc::c_int) -> File {
        // SAFETY: memfd_create with a NUL-terminated name; the fd (checked) is owned by the File.
        let file = unsafe {
            let fd = libc::memfd_create(
                c"vrdma-region-check".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            );
            assert!(fd >= 0);
            File::from_raw_fd(fd)
        };
        file.set_len(len).unwrap();
        if seals != 0 {
            // SAFETY: F_ADD_SEALS takes an int of seal bits; the fd is open.
            let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
            assert_eq!(rc, 0);
        }
        file
    }

    #[test]
    fn sealed_memfd_of_the_right_size_passes() {
        let f = memfd(1 << 20, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        assert_eq!(check_region_file(&f, 0, 1 << 20), Ok(()));
        assert_eq!(check_region_file(&f, 4096, (1 << 20) - 4096), Ok(()));
    }

    #[test]
    fn region_beyond_the_end_of_its_file_is_refused() {
        let f = memfd(1 << 20, libc::F_SEAL_SHRINK);
        assert_eq!(
            check_region_file(&f, 4096, 1 << 20),
            Err(RegionError::BeyondEndOfFile {
                end: (1 << 20) + 4096,
                file_size: 1 << 20
            })
        );
        assert!(matches!(
            check_region_file(&f, u64::MAX, 2),
            Err(RegionError::BeyondEndOfFile { .. })
        ));
    }

    #[test]
    fn unsealed_memfd_and_plain_files_are_refused() {
        let f = memfd(1 << 20, 0);
        assert_eq!(check_region_file(&f, 0, 4096), Err(RegionError::NotSealed));
        let plain = std::env::temp_dir().join(format!("vrdma-region-{}", std::process::id()));
        let p = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&plain)
            .unwrap();
        p.set_len(8192).unwrap();
        let _ = std::fs::remove_file(&plain);
        assert_eq!(check_region_file(&p, 0, 4096), Err(RegionError::NotSealed));
    }

    #[test]
    fn non_regular_files_are_refused() {
        let f = File::open("/dev/zero").unwrap();
        assert!(matches!(
            check_region_file(&f, 0, 4096),
            Err(RegionError::NotRegularFile { .. })
        ));
    }
}
