//! The engine's settings from the command line (`--poll-us`, `--engine-threads`).

use std::time::Duration;

#[cfg(doc)]
use super::workers::MAX_WORKERS;

/// Engine settings from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// `--poll-us`: the longest busy-poll before the engine sleeps (see `Poller`); zero never
    /// spins.
    pub poll: Duration,
    /// `--engine-threads`: workers per device (1..=[`MAX_WORKERS`]; out of range is clamped).
    pub threads: usize,
}

/// `--poll-us` default, chosen by measurement (`make bench` with and without
/// `VRDMA_BENCH_POLL_US=0`: 64 B fabric latency and CPU per message).
pub const DEFAULT_POLL: Duration = Duration::from_micros(DEFAULT_POLL_US);
/// [`DEFAULT_POLL`] in microseconds (the CLI's unit).
pub const DEFAULT_POLL_US: u64 = 50;

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            poll: DEFAULT_POLL,
            threads: 1,
        }
    }
}
