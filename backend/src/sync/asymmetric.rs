//! An asymmetric fence: a store -> load order between a side that runs all the time (every
//! guest write of the engines) and a side that runs a few times in a process's life (turning
//! migration's dirty-page logging on), with the whole cost on the rare side.
//!
//! Both sides of a Dekker pair (`store A; fence; load B` against `store B; fence; load A`) need
//! a full fence for one of them to see the other's store: x86 lets a load pass an earlier store
//! waiting in the store buffer. A full fence on the frequent side costs what the store buffer
//! holds: after a packet's payload was copied into guest memory, a `lock or` waits for every
//! line of it (11 % of the engine's CPU at path MTU 1024, where it ran once per packet).
//!
//! The kernel's `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on every CPU
//! that runs a thread of this process, before it returns (an interrupt; threads not running
//! passed one when they were switched out). So [`light`] is only a compiler barrier, and
//! [`heavy`] stores nothing itself but makes every [`light`] before it as good as a full fence:
//! a frequent side whose load ran before the barrier reached its CPU had its earlier store
//! drained by that barrier, which completed before `heavy` returned; one whose load ran after
//! it sees the rare side's store, which the rare side's own barrier (the system call) made
//! visible first. Where the kernel lacks the command (before Linux 4.14, or refused by a
//! seccomp filter), both halves are full fences.

use std::sync::atomic::{compiler_fence, fence, Ordering};
use std::sync::OnceLock;

/// How the fences are made in this process (decided once, on first use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `membarrier` on the rare side, a compiler barrier on the frequent side.
    Membarrier,
    /// A full fence on both sides.
    Fences,
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The process's mode, registering for `membarrier` on first use. The mode never changes
/// afterwards: a frequent side that used a compiler barrier only is covered by every later
/// [`heavy`].
pub fn mode() -> Mode {
    *MODE.get_or_init(|| {
        if membarrier(libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED as libc::c_int).is_ok()
            && membarrier(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED as libc::c_int).is_ok()
        {
            Mode::Membarrier
        } else {
            Mode::Fences
        }
    })
}

/// The frequent side's half, between its store and its load.
#[inline]
pub fn light() {
    match mode() {
        Mode::Membarrier => compiler_fence(Ordering::SeqCst),
        Mode::Fences => fence(Ordering::SeqCst),
    }
}

/// The rare side's half, between its store and its load (or whatever it lets read next: the
/// frontend reads guest memory once the vhost-user reply has left).
pub fn heavy() {
    fence(Ordering::SeqCst);
    if mode() == Mode::Fences {
        return;
    }
    if let Err(e) = membarrier(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED as libc::c_int) {
        // It worked when the mode was chosen; if it fails now, the slower global command
        // (every CPU of the system, by waiting for a scheduling pass) still gives the order.
        if let Err(g) = membarrier(libc::MEMBARRIER_CMD_GLOBAL as libc::c_int) {
            log::error!(
                "membarrier failed ({e}, global: {g}): a guest write may miss the dirty log"
            );
        }
    }
}

fn membarrier(cmd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: membarrier takes two integers and a CPU id (ignored without
    // MEMBARRIER_CMD_FLAG_CPU); it reads and writes no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
    use std::sync::Arc;

    /// This host's kernel (Linux >= 4.14) has the expedited command: the cheap mode is the one
    /// the engines run in.
    #[test]
    fn the_expedited_command_is_used_here() {
        assert_eq!(mode(), Mode::Membarrier);
    }

    /// Spin, and after a while let the other thread have the CPU (a loaded 2-core host).
    fn wait_a_little(spins: &mut u32) {
        *spins += 1;
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// The store-buffer litmus test, with both threads released together each round (they spin
    /// on a round number, so each round's stores and loads overlap as far as two CPUs allow):
    /// the frequent side stores X and loads Y across [`light`], the rare side stores Y and
    /// loads X across [`heavy`]; never may both load 0. With `heavy` a plain fence and `light`
    /// a compiler barrier (what the module replaces), x86 shows that outcome within a few
    /// thousand rounds when the threads overlap.
    #[test]
    fn a_light_and_a_heavy_fence_never_both_miss() {
        const ROUNDS: u64 = 20_000;
        struct Litmus {
            x: AtomicU32,
            y: AtomicU32,
            round: AtomicU64,
            ready: AtomicU64,
            both_missed: AtomicU64,
            stop: AtomicBool,
        }
        let t = Arc::new(Litmus {
            x: AtomicU32::new(0),
            y: AtomicU32::new(0),
            round: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            both_missed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let seen_y = Arc::new(AtomicU32::new(0));
        let frequent = {
            let (t, seen_y) = (Arc::clone(&t), Arc::clone(&seen_y));
            std::thread::spawn(move || {
                for r in 1..=ROUNDS {
                    let mut spins = 0u32;
                    while t.round.load(Ordering::Acquire) < r {
                        if t.stop.load(Ordering::Relaxed) {
                            return;
                        }
                        wait_a_little(&mut spins);
                    }
                    t.x.store(1, Ordering::Relaxed);
                    light();
                    seen_y.store(t.y.load(Ordering::Relaxed), Ordering::Relaxed);
                    t.ready.fetch_add(1, Ordering::AcqRel);
                }
            })
        };
        for r in 1..=ROUNDS {
            t.x.store(0, Ordering::Relaxed);
            t.y.store(0, Ordering::Relaxed);
            t.round.store(r, Ordering::Release);
            t.y.store(1, Ordering::Relaxed);
            heavy();
            let seen_x = t.x.load(Ordering::Relaxed);
            let mut spins = 0u32;
            while t.ready.load(Ordering::Acquire) < r {
                wait_a_little(&mut spins);
            }
            if seen_x == 0 && seen_y.load(Ordering::Relaxed) == 0 {
                t.both_missed.fetch_add(1, Ordering::Relaxed);
            }
        }
        t.stop.store(true, Ordering::Relaxed);
        frequent.join().expect("frequent side");
        assert_eq!(t.both_missed.load(Ordering::Relaxed), 0);
    }
}
