//! How an engine worker waits for work (ARCHITECTURE.md "Threads"): its timerfd ([`Alarm`]),
//! armed with the earliest transport deadline without a system call per batch, and the bounded
//! adaptive busy-poll ([`Poller`]) it runs before it sleeps in epoll.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vmm_sys_util::timerfd::TimerFd;

use super::workers::WakeFlags;
use crate::uplink::Uplink;

/// The timerfd with the deadline it is armed for. Re-arming costs a system call, so `set` keeps
/// an armed deadline that is earlier than the wanted one: it fires early, the engine runs its
/// timers (nothing due yet) and arms the real deadline then. Under a stream of ACKs the
/// retransmit deadline moves later every batch; this turns a `timerfd_settime` per batch into one
/// per timeout period.
pub(super) struct Alarm {
    pub(super) timer: TimerFd,
    pub(super) armed: Option<Instant>,
}

impl Alarm {
    /// Make sure the timer fires no later than `deadline` (None: nothing due; a pending early
    /// expiry is left, it only costs a wake-up).
    pub(super) fn set(&mut self, deadline: Option<Instant>, now: Instant) {
        let Some(d) = deadline else {
            return;
        };
        if self.armed.is_some_and(|a| a <= d && a > now) {
            return;
        }
        // A zero duration would disarm the timerfd: fire "now" as 1 µs.
        let r = self.timer.reset(
            d.saturating_duration_since(now)
                .max(Duration::from_micros(1)),
            None,
        );
        match r {
            Ok(()) => self.armed = Some(d),
            Err(e) => {
                self.armed = None;
                guest_warn!("engine: timerfd: {e}");
            }
        }
    }

    /// The timer fired (its fd was readable): consume the expiry.
    pub(super) fn fired(&mut self) {
        // Readable: the read does not block.
        let _ = self.timer.wait();
        self.armed = None;
    }
}

/// Bounded adaptive busy-poll before the engine sleeps (`--poll-us`). A wake-up through the
/// eventfd and epoll costs tens of microseconds on a loaded host (scheduler, a cross-core IPI);
/// a 64 B round trip between two engines is a few. So after a batch the engine first spins for
/// up to `window` on the doorbell flag and the uplink's queue (`Uplink::rx_pending`, no system
/// call), yielding the CPU between checks so other runnable threads on its core still run.
///
/// The window adapts like KVM's halt polling: a sleep that ended within `max` (a longer spin
/// would have caught it) doubles it up to `max`; a longer sleep halves it down to zero. An idle
/// engine therefore sleeps in epoll without spinning at all: the first long sleep halves the
/// window, and an engine that is never woken never spins. Uplinks that cannot tell cheaply
/// whether frames wait (`rx_pending` = None: UDP, TAP) are never polled.
pub(super) struct Poller {
    max: Duration,
    window: Duration,
}

impl Poller {
    pub(super) fn new(max: Duration) -> Poller {
        Poller { max, window: max }
    }

    /// Polling configured at all (`--poll-us` not 0)?
    pub(super) fn enabled(&self) -> bool {
        !self.max.is_zero()
    }

    /// Spin until work shows up (true) or the window ends (false). `uplink`: the one the
    /// worker receives from (worker 0), if any.
    pub(super) fn spin(&mut self, wake: &WakeFlags, uplink: Option<&dyn Uplink>) -> bool {
        if self.window.is_zero() {
            return false;
        }
        let pending = || uplink.is_some_and(|u| u.rx_pending() == Some(true));
        wake.polling.store(true, Ordering::SeqCst);
        if let Some(u) = uplink {
            u.set_rx_polling(true);
        }
        let mut found = self.spin_until(|| wake.work.load(Ordering::SeqCst) || pending());
        wake.polling.store(false, Ordering::SeqCst);
        if let Some(u) = uplink {
            u.set_rx_polling(false);
        }
        // The other halves of the Dekker pairs (`WakeFlags`, `fabric::rxqueue`): a kick or a
        // frame that saw polling set skipped the eventfd.
        found |= wake.work.load(Ordering::SeqCst) || pending();
        found
    }

    /// Spin, yielding between checks, until `found` says there is work (true) or the window
    /// ends (false). The caller has told the wakers that it polls (the Dekker pairs above).
    pub(super) fn spin_until(&mut self, mut found: impl FnMut() -> bool) -> bool {
        let t0 = Instant::now();
        loop {
            if found() {
                return true;
            }
            if t0.elapsed() >= self.window {
                return false;
            }
            // Not a pure spin: on this kind of host the engines, the vhost-user threads and
            // vCPUs share few cores; spinning without yielding doubled the 64 B median.
            std::thread::yield_now();
        }
    }

    /// The spin window is not zero (it adapts to zero for an engine that is never woken).
    pub(super) fn spins(&self) -> bool {
        !self.window.is_zero()
    }

    /// The engine slept for `slept` after a spin that found nothing.
    pub(super) fn slept(&mut self, slept: Duration) {
        if slept <= self.max {
            let start = self.max / 8;
            self.window = (self.window * 2).max(start).min(self.max);
        } else {
            self.window /= 2;
            if self.window < Duration::from_micros(1) {
                self.window = Duration::ZERO;
            }
        }
    }
}
