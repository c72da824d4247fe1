//! Harnesses of the coverage-guided fuzz targets (`src/bin/*.rs`, one per attack surface of
//! spec §16): each takes the fuzzer's bytes, builds fresh device state from the integration
//! tests' fixtures (`backend/tests/common`, the driver's own command path) and feeds the bytes in
//! as the untrusted input of its surface. A fresh state per input keeps every finding
//! reproducible from its input file alone; state carries across the commands, WQEs or frames
//! *within* one input. A panic anywhere is a finding (the daemon must not panic on guest or wire
//! input, spec §14); the binaries abort on it so AFL records a crash.
//!
//! Run outside AFL, a target binary reads one input from stdin (replaying a seed or a crash;
//! `VRDMA_FUZZ_TRACE=1` prints what the harness did). A crash, once understood, becomes a plain
//! test in `backend/tests/` built from the same fixtures.

#[path = "../../backend/tests/common/mod.rs"]
#[allow(dead_code, clippy::all)]
pub mod common;

pub mod bed;
pub mod chains;
pub mod control;
pub mod fabric;
pub mod packets;
pub mod pagelists;
pub mod snapshot;
pub mod vhost_user;
pub mod wqes;

/// A cursor over the fuzzer's bytes; reads past the end give zeros, so every input decodes.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let v = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = self.pos.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }

    /// Exactly `n` bytes, zero-padded.
    pub fn padded(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.bytes(n).to_vec();
        v.resize(n, 0);
        v
    }
}

/// Executions of [`run`] in this process so far (AFL's persistent mode runs many in one).
static EXECUTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// With `VRDMA_FUZZ_PANICS` naming a directory, a panic's message, place, thread, the number
/// of executions this process ran and a backtrace are appended to `<dir>/<pid>.txt` before the
/// binary aborts. AFL keeps a crashing input but not what the target printed, and a crash that
/// depends on what earlier executions of a persistent process left behind, or on timing, may
/// not replay from its input alone: the record is then all there is to go on.
pub fn record_panics() {
    use std::io::Write;
    let Some(dir) = std::env::var_os("VRDMA_FUZZ_PANICS") else {
        return;
    };
    // Opened now: the panic may be the process running out of descriptors.
    let path = std::path::Path::new(&dir).join(format!("{}.txt", std::process::id()));
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        Ok(f) => std::sync::Mutex::new(f),
        Err(e) => {
            eprintln!("VRDMA_FUZZ_PANICS: cannot open {}: {e}", path.display());
            return;
        }
    };
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let execs = EXECUTIONS.load(std::sync::atomic::Ordering::Relaxed);
        let trace = std::backtrace::Backtrace::force_capture();
        if let Ok(mut f) = file.lock() {
            let _ = writeln!(
                f,
                "panic in thread {name} during execution {execs} of this process: {info}\n{trace}"
            );
        }
        previous(info);
    }));
}

/// `VRDMA_FUZZ_TRACE` set: the harnesses print what they did to stderr (checking seeds).
pub fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("VRDMA_FUZZ_TRACE").is_some())
}

/// Names of the targets, as `src/bin/<name>.rs`, `corpus/<name>/` and [`run`] know them.
pub const TARGETS: [&str; 8] = [
    "control",
    "wqe",
    "pagelist",
    "packet",
    "vring",
    "snapshot",
    "vhost_user",
    "fabric",
];

/// Run target `name` on one input (for replays); false if the name is unknown. Outside AFL,
/// `VRDMA_FUZZ_REPEAT=N` runs it N times in one process, as AFL's persistent mode runs many
/// executions in one process (to replay a finding that needs what executions leave behind);
/// with `VRDMA_FUZZ_TRACE` the process's open descriptors are counted after each.
pub fn run(name: &str, data: &[u8]) -> bool {
    static REPEAT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let repeat = *REPEAT.get_or_init(|| {
        std::env::var("VRDMA_FUZZ_REPEAT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    });
    for i in 0..repeat {
        if !run_once(name, data) {
            return false;
        }
        if trace() {
            let fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| std::fs::read_link(e.path()).ok())
                        .map(|t| t.display().to_string())
                        .collect()
                })
                .unwrap_or_default();
            eprintln!("run {i}: {} open descriptors: {fds:?}", fds.len());
        }
    }
    true
}

fn run_once(name: &str, data: &[u8]) -> bool {
    EXECUTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match name {
        "control" => control::run(data),
        "wqe" => wqes::run(data),
        "pagelist" => pagelists::run(data),
        "packet" => packets::run(data),
        "vring" => chains::run(data),
        "snapshot" => snapshot::run(data),
        "vhost_user" => vhost_user::run(data),
        "fabric" => fabric::run(data),
        _ => return false,
    }
    true
}
