//! Guest-triggered log lines (spec §16.5 "Logs"): each names its device and counts against
//! that device's own rate limit, so one tenant flooding the log neither hides which device
//! misbehaves nor silences another device's first warnings.
//!
//! The device is the one the current thread works for, kept in a thread-local [`LogScope`]:
//! the vhost-user code enters it wherever a device's work starts (a queue event, an engine
//! thread's output to the guest, a delayed command response), and each engine worker enters
//! its device's scope once, when its thread starts (`transport/engine/mod.rs`). `guest_warn!`,
//! `guest_info!` and `guest_debug!` read it. This module sits at the bottom of the crate
//! (ARCHITECTURE.md "Layers") so that the engine, the tables, the fabric and the vhost-user
//! layer share one scope and one limit per device.
//!
//! Cost when nothing is logged: none. The macros check the level first (`log_enabled!`), so a
//! disabled `guest_debug!` neither formats nor counts; the thread-local is read and the
//! limit's counter incremented only when a line would be written.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A device's name in the log and its rate limit for guest-triggered warnings.
#[derive(Debug)]
pub struct DeviceLog {
    label: String,
    /// Lines at `info` and above.
    limit: LogLimit,
    /// Lines at `debug` and below: a limit of their own, so that an operator who turns on
    /// debug logging (one line per control command) does not use up the warnings' limit.
    debug_limit: LogLimit,
}

impl DeviceLog {
    pub fn new(label: impl Into<String>) -> Arc<DeviceLog> {
        Arc::new(DeviceLog {
            label: label.into(),
            limit: LogLimit::new(),
            debug_limit: LogLimit::new(),
        })
    }

    /// The device label (its socket's file name without extension, as in the counters).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Guest-triggered lines (`info` and above) of this device that were not logged (rate
    /// limit).
    pub fn suppressed(&self) -> u64 {
        self.limit.suppressed()
    }

    fn limit_for(&self, level: log::Level) -> &LogLimit {
        if level <= log::Level::Info {
            &self.limit
        } else {
            &self.debug_limit
        }
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

/// Outside any device's scope (threads shared by all devices: the fabric bridge; tests of the
/// plumbing alone): one limit for all of them, and one for their debug lines.
static UNSCOPED: LogLimit = LogLimit::new();
static UNSCOPED_DEBUG: LogLimit = LogLimit::new();

/// What the `guest_*!` macros do once `level` is enabled: log `args` at `level` as a line of
/// the current device, within its limit, under the caller's module as the target (so
/// `RUST_LOG=vrdma_backend::transport=debug` still selects the engine's lines).
pub fn guest_log(level: log::Level, target: &str, args: fmt::Arguments<'_>) {
    match current() {
        Some(log) => {
            if log.limit_for(level).allow() {
                log::log!(target: target, level, "{}: {args}", log.label);
            }
        }
        None => {
            let limit = if level <= log::Level::Info {
                &UNSCOPED
            } else {
                &UNSCOPED_DEBUG
            };
            if limit.allow() {
                log::log!(target: target, level, "{args}");
            }
        }
    }
}

/// [`guest_log`] at `warn`.
pub fn guest_warn(args: fmt::Arguments<'_>) {
    guest_log(log::Level::Warn, module_path!(), args);
}

/// `warn!` for conditions a guest or a network peer can trigger at will (malformed chains,
/// packets the engine cannot build, uplink errors on a device's thread), labelled with the
/// device the thread works for and limited per device (spec §16.5): the first 16, then one in
/// 1024, so a misbehaving driver can neither flood the log nor silence another device's
/// warnings.
#[macro_export]
macro_rules! guest_warn {
    ($($arg:tt)+) => {{
        if ::log::log_enabled!(::log::Level::Warn) {
            $crate::devlog::guest_log(::log::Level::Warn, module_path!(), format_args!($($arg)+));
        }
    }};
}

/// [`guest_warn!`] at `error` (same label, same per-device limit).
#[macro_export]
macro_rules! guest_error {
    ($($arg:tt)+) => {{
        if ::log::log_enabled!(::log::Level::Error) {
            $crate::devlog::guest_log(::log::Level::Error, module_path!(), format_args!($($arg)+));
        }
    }};
}

/// [`guest_warn!`] at `info` (same label, same per-device limit).
#[macro_export]
macro_rules! guest_info {
    ($($arg:tt)+) => {{
        if ::log::log_enabled!(::log::Level::Info) {
            $crate::devlog::guest_log(::log::Level::Info, module_path!(), format_args!($($arg)+));
        }
    }};
}

/// [`guest_warn!`] at `debug` (same label, same per-device limit; off by default, and then it
/// neither formats nor counts).
#[macro_export]
macro_rules! guest_debug {
    ($($arg:tt)+) => {{
        if ::log::log_enabled!(::log::Level::Debug) {
            $crate::devlog::guest_log(::log::Level::Debug, module_path!(), format_args!($($arg)+));
        }
    }};
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

    /// Debug lines (one per control command when an operator turns them on) have a limit of
    /// their own: they do not use up the device's warnings.
    #[test]
    fn debug_lines_do_not_use_up_the_warning_limit() {
        let a = DeviceLog::new("vrdma-a");
        for _ in 0..1000 {
            a.limit_for(log::Level::Debug).allow();
        }
        assert!(
            a.limit_for(log::Level::Warn).allow(),
            "first warning logged"
        );
        assert!(a.limit_for(log::Level::Error).allow());
        assert!(a.limit_for(log::Level::Info).allow());
        assert_eq!(a.suppressed(), 0);
        assert!(a.debug_limit.suppressed() > 900);
    }
}
