//! Test support: a logger that records the text of every line at `Warn` or above, for the
//! tests of what the daemon logs (spec §16.5 "Logs"). A process has one logger, so each test
//! file that uses this is its own test binary and calls [`install`] once.

use std::sync::{Mutex, MutexGuard};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            lines().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder;

/// Make the recorder this process's logger, at `Warn`.
pub fn install() {
    log::set_logger(&RECORDER).expect("the first logger of this test binary");
    log::set_max_level(log::LevelFilter::Warn);
}

/// The lines recorded so far.
pub fn lines() -> MutexGuard<'static, Vec<String>> {
    LINES.lock().unwrap_or_else(|p| p.into_inner())
}
