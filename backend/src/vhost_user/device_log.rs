//! Guest-triggered log lines (spec §16.5 "Logs"): each names its device and counts against
//! that device's own rate limit, so one tenant flooding the log neither hides which device
//! misbehaves nor silences another device's first warnings.
//!
//! The device is the one the current thread works for: the vhost-user code enters a
//! [`LogScope`] wherever a device's work starts (a queue event, an engine thread's output to
//! the guest, a delayed command response) and `guest_warn!` reads it. Threads of the
//! vhost-user library and the engine are shared by no two devices, but a scope is entered per
//! call rather than per thread so that nothing depends on that.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A device's name in the log and its rate limit for guest-triggered warnings.
#[derive(Debug)]
pub struct DeviceLog {
    label: String,
    limit: LogLimit,
}

impl DeviceLog {
    pub fn new(label: impl Into<String>) -> Arc<DeviceLog> {
        Arc::new(DeviceLog {
            label: label.into(),
            limit: LogLimit::new(),
        })
    }

    /// The device label (its socket's file name without extension, as in the counters).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Guest-triggered warnings of this device that were not logged (rate limit).
    pub fn suppressed(&self) -> u64 {
        self.limit.suppressed()
    }
}

/// Rate limit of one device's guest-triggered warnings: the first [`LogLimit::BURST`], then
/// one in 1024.
#[derive(Debug)]
pub struct LogLimit {
    seen: AtomicU64,
}

impl LogLimit {
    /// Warnings logged before the limit thins them out.
    pub const BURST: u64 = 16;

    pub const fn new() -> Self {
        LogLimit {
            seen: AtomicU64::new(0),
        }
    }

    /// Whether this occurrence may be logged.
    pub fn allow(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        n < Self::BURST || n & 1023 == 0
    }

    /// Occurrences not logged so far.
    pub fn suppressed(&self) -> u64 {
        let n = self.seen.load(Ordering::Relaxed);
        // Logged: the burst, then every multiple of 1024 below n.
        let logged = n.min(Self::BURST) + n.saturating_sub(1) / 1024;
        n - logged.min(n)
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<DeviceLog>>> = const { RefCell::new(None) };
}

/// While alive, the current thread works for the device of `log`. Restores the previous
/// device when dropped (scopes nest).
#[must_use = "the scope ends when dropped"]
pub struct LogScope {
    previous: Option<Arc<DeviceLog>>,
}

/// Enter `log`'s device for the rest of the scope.
pub fn enter(log: &Arc<DeviceLog>) -> LogScope {
    let previous = CURRENT.with(|c| c.replace(Some(Arc::clone(log))));
    LogScope { previous }
}

impl Drop for LogScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        // A thread-local destructor may already have run (thread exit): nothing to restore.
        let _ = CURRENT.try_with(|c| c.replace(previous));
    }
}

/// The device the current thread works for, if any.
pub fn current() -> Option<Arc<DeviceLog>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Outside any device's scope (tests of the plumbing alone): one limit for all of them.
static UNSCOPED: LogLimit = LogLimit::new();

/// What `guest_warn!` does: log `args` as a warning of the current device, within its limit.
pub fn guest_warn(args: fmt::Arguments<'_>) {
    match current() {
        Some(log) => {
            if log.limit.allow() {
                log::warn!("{}: {args}", log.label);
            }
        }
        None => {
            if UNSCOPED.allow() {
                log::warn!("{args}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_logs_a_burst_then_one_in_1024() {
        let l = LogLimit::new();
        let allowed = (0..1024 * 3).filter(|_| l.allow()).count() as u64;
        // 16, then n = 1024 and 2048.
        assert_eq!(allowed, LogLimit::BURST + 2);
        assert_eq!(l.suppressed(), 1024 * 3 - allowed);
    }

    /// One device's flood does not use up another's limit, and scopes nest and restore.
    #[test]
    fn each_device_has_its_own_limit() {
        let a = DeviceLog::new("vrdma-a");
        let b = DeviceLog::new("vrdma-b");
        {
            let _in_a = enter(&a);
            for _ in 0..10_000 {
                guest_warn(format_args!("flood"));
            }
            {
                let _in_b = enter(&b);
                assert_eq!(current().unwrap().label(), "vrdma-b");
                assert!(b.limit.allow(), "b's first warning is logged");
            }
            assert_eq!(current().unwrap().label(), "vrdma-a");
        }
        assert!(current().is_none());
        assert!(a.suppressed() > 9_000);
        assert_eq!(b.suppressed(), 0);
    }
}
