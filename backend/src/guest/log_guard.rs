//! The migration dirty log's fault guard (spec §16.5, §17.1).
//!
//! The frontend hands over the dirty-page log as a file the vhost-user-backend crate maps with
//! no hook for the daemon (SET_LOG_BASE): the daemon never sees the descriptor, so it cannot
//! check the file's length or seals the way it checks memory regions. A log file shorter than
//! the log (or truncated later) makes the daemon's next dirty-bit store fault with SIGBUS, which
//! would end every tenant's device.
//!
//! The only code that stores into the log is [`super::dirty_log::RegionLog`]: one atomic OR per
//! page written. Its byte range in the log is registered here while it exists. A SIGBUS at an
//! address inside a registered range is answered by mapping an anonymous page over the faulting
//! page of the log and marking every range on that page *lost*; the interrupted store then runs
//! again on the new page and succeeds. A lost range means the frontend no longer sees the bits
//! of those pages, so the device refuses to save its state (the migration fails) instead of
//! letting a destination start from memory the log did not cover. A SIGBUS anywhere else goes
//! to the handler that was installed before (Rust's stack-overflow reporter, or the default
//! action: the process ends, as without the guard).
//!
//! Why this is sound here and not for guest memory (§16.5 refuses unsealed regions instead):
//! the faulting instruction is always one of our atomic ORs into the log, whose result nobody
//! reads back, and replacing the page changes nothing but where the bit lands.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Ranges the guard can watch at once: one per guest memory region per device with a log.
/// QEMU uses a handful of regions per guest; a full table refuses the next log.
const SLOTS: usize = 1024;

struct Slot {
    /// A sequence count: odd while the slot changes. The handler reads it before and after the
    /// range and trusts the range only if both reads are the same even value, so it never
    /// combines the start of one registration with the end of another.
    generation: AtomicUsize,
    /// First byte of the range; 0 while the slot is free (a mapping never starts at 0).
    start: AtomicUsize,
    /// One past the last byte; 0 while the slot is free.
    end: AtomicUsize,
    lost: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        generation: AtomicUsize::new(0),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        lost: AtomicBool::new(false),
    }
}; SLOTS];
static INSTALL: Once = Once::new();
/// Whether the handler is installed (set once by `install`).
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The host page size, read once before the handler is installed.
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS action before ours (written once before ours is installed, read by the handler).
static PREVIOUS: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();

/// Errors of registering a log range.
#[derive(Debug, thiserror::Error)]
pub enum LogGuardError {
    /// Every slot holds a range.
    #[error("too many dirty logs at once (the guard watches {SLOTS} ranges)")]
    Full,
    /// An empty range, or one at address 0 (no mapping starts there).
    #[error("not a range of a mapping: {0:#x}..{1:#x}")]
    NotMapped(usize, usize),
    /// sigaction failed.
    #[error("cannot install the SIGBUS handler: {0}")]
    Install(io::Error),
}

impl From<LogGuardError> for io::Error {
    fn from(e: LogGuardError) -> Self {
        io::Error::other(e)
    }
}

/// A registered range of the log; unregisters on drop.
#[derive(Debug)]
pub struct Guarded {
    index: usize,
}

impl Guarded {
    /// Did a store into this range fault (the frontend's file does not cover it)?
    pub fn lost(&self) -> bool {
        TABLE[self.index].lost.load(Ordering::Acquire)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let slot = &TABLE[self.index];
        slot.generation.fetch_add(1, Ordering::AcqRel);
        slot.end.store(0, Ordering::Release);
        slot.start.store(0, Ordering::Release);
        slot.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// Watch `range` (addresses of the log mapping that only [`super::dirty_log::RegionLog`]
/// stores into) until the returned guard is dropped.
pub fn guard(range: Range<usize>) -> Result<Guarded, LogGuardError> {
    install()?;
    if range.start == 0 || range.is_empty() {
        return Err(LogGuardError::NotMapped(range.start, range.end));
    }
    for (index, slot) in TABLE.iter().enumerate() {
        let generation = slot.generation.load(Ordering::Acquire);
        // Claim a free slot by making its generation odd (changing); the claim's CAS fails
        // if another registration or a release moved the generation since the load.
        if generation.is_multiple_of(2)
            && slot.start.load(Ordering::Acquire) == 0
            && slot
                .generation
                .compare_exchange(
                    generation,
                    generation + 1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            slot.lost.store(false, Ordering::Relaxed);
            slot.start.store(range.start, Ordering::Release);
            slot.end.store(range.end, Ordering::Release);
            slot.generation.fetch_add(1, Ordering::AcqRel);
            return Ok(Guarded { index });
        }
    }
    Err(LogGuardError::Full)
}

fn install() -> Result<(), LogGuardError> {
    INSTALL.call_once(|| {
        // SAFETY: sysconf only reads a system parameter.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE_SIZE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: zeroed is a valid empty sigaction; the fields are set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        action.sa_sigaction = handler as usize;
        // SA_ONSTACK: a fault on a thread running on Rust's alternate signal stack still gets
        // a stack to run on.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a plain sigset_t owned by `action`.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: an all-zero sigaction is a valid value for the kernel to overwrite.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // One call swaps the actions, so a handler installed in between cannot be lost. The
        // handler reads PREVIOUS only for a SIGBUS that is not ours.
        // SAFETY: `action` is fully initialised, `on_sigbus` has the SA_SIGINFO signature and
        // `old` is writable.
        if unsafe { libc::sigaction(libc::SIGBUS, &action, &mut old) } == 0 {
            let _ = PREVIOUS.set(old);
            INSTALLED.store(true, Ordering::Release);
        }
    });
    if INSTALLED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(LogGuardError::Install(io::Error::other(
            "sigaction(SIGBUS) failed",
        )))
    }
}

/// The SIGBUS handler. Only async-signal-safe work: atomic loads and stores, mmap, sigaction.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let page_size = PAGE_SIZE.load(Ordering::Relaxed);
    let page = addr & !(page_size - 1);
    // Only a fault of an access beyond the end of a file at a watched address is ours (not a
    // SIGBUS sent by kill, whose address means nothing, nor a hardware or hugetlb error).
    if code == BUS_ADRERR && watched(addr) {
        // SAFETY: `page` is a page of the log mapping (inside a registered range, which only
        // lies in the log the crate mapped): MAP_FIXED replaces that page of it, with the
        // same protection, and nothing else.
        let mapped = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                page_size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            for slot in TABLE.iter() {
                if range_of(slot).is_some_and(|(start, end)| start < page + page_size && page < end)
                {
                    slot.lost.store(true, Ordering::Release);
                }
            }
            return;
        }
    }
    chain(sig, info, ctx);
}

/// Linux's si_code for "nonexistent physical address" (a page beyond the end of the file).
const BUS_ADRERR: libc::c_int = 2;

/// The slot's range, if it holds a complete registration right now.
fn range_of(slot: &Slot) -> Option<(usize, usize)> {
    let before = slot.generation.load(Ordering::Acquire);
    if !before.is_multiple_of(2) {
        return None;
    }
    let start = slot.start.load(Ordering::Acquire);
    let end = slot.end.load(Ordering::Acquire);
    (end != 0 && slot.generation.load(Ordering::Acquire) == before).then_some((start, end))
}

fn watched(addr: usize) -> bool {
    TABLE
        .iter()
        .any(|slot| range_of(slot).is_some_and(|(start, end)| start <= addr && addr < end))
}

/// Hand a SIGBUS that is not ours to the action that was there before.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = PREVIOUS.get();
    match previous {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO action's handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain action's handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // The default action: restore it; returning re-runs the faulting access, which
            // then ends the process as if no handler had been installed.
            // SAFETY: signal() with SIG_DFL only changes this signal's disposition.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A shared mapping of `len` bytes of an empty memfd: every access faults with SIGBUS.
    fn beyond_its_file(len: usize) -> (std::fs::File, *mut u8) {
        // SAFETY: a NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"vrdma-log-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: `fd` was just created and is owned by the File from here on.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: a new shared mapping of the file, not fixed; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (file, p.cast())
    }

    #[test]
    fn a_store_beyond_the_file_lands_on_a_fresh_page_and_marks_the_range_lost() {
        let len = 2 * 4096;
        let (_file, base) = beyond_its_file(len);
        let start = base as usize;
        let g = guard(start..start + len).expect("guard");
        assert!(!g.lost());
        let cell = base.wrapping_add(4096 + 17);
        // SAFETY: inside the mapping; the store faults (no file behind it) and the guard puts an
        // anonymous page there, so it completes.
        let word = unsafe { &*(cell as *const std::sync::atomic::AtomicU8) };
        word.fetch_or(0x4, Ordering::Relaxed);
        assert_eq!(word.load(Ordering::Relaxed), 0x4, "the store landed");
        assert!(g.lost(), "the range is marked lost");
        drop(g);
        // SAFETY: the mapping made above, `len` bytes.
        unsafe { libc::munmap(base.cast(), len) };
    }

    #[test]
    fn a_freed_slot_holds_no_range_and_a_new_registration_starts_not_lost() {
        let a = guard(0x1000..0x2000).expect("first");
        let index = a.index;
        assert_eq!(range_of(&TABLE[index]), Some((0x1000, 0x2000)));
        TABLE[index].lost.store(true, Ordering::Relaxed);
        assert!(a.lost());
        drop(a);
        assert_eq!(
            range_of(&TABLE[index]),
            None,
            "a freed slot watches nothing"
        );
        assert!(!watched(0x1800));
        let b = guard(0x5000..0x6000).expect("second");
        assert!(!b.lost(), "a new registration starts with nothing lost");
        assert!(watched(0x5800) && !watched(0x6000));
        assert!(guard(0..0x10).is_err(), "a range at 0 is refused");
        drop(b);
    }
}
