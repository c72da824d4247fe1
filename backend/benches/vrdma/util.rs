//! Small helpers shared by the benchmark sections: statistics, table printing, and ring
//! operations on guest memory (so a harness works whether the device sits in the bench thread or
//! behind an engine thread).

use std::time::{Duration, Instant};

use vrdma_backend::guest::GuestMem;
use vrdma_backend::transport::ctx::Cqe;

use crate::common::RingH;

/// Median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `p`-th percentile (0..=100) of `v` (sorted in place, nearest rank).
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Seconds → a human duration with a unit (ns/µs/ms/s).
pub fn fmt_secs(s: f64) -> String {
    if s < 0.0 {
        return format!("-{}", fmt_secs(-s));
    }
    if s < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if s < 1e-5 {
        // Per-message CPU figures ([cost] targets of 0.5 and 1.0 µs) need the second digit.
        format!("{:.2} µs", s * 1e6)
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

pub fn fmt_size(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// A plain text table with right-aligned columns (the first column left-aligned).
pub struct Table {
    title: String,
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, head: &[&str]) -> Table {
        Table {
            title: title.to_string(),
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let n = self.head.len();
        let mut w = vec![0usize; n];
        for r in std::iter::once(&self.head).chain(self.rows.iter()) {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |r: &Vec<String>| {
            let mut s = String::from("| ");
            for (i, wi) in w.iter().enumerate() {
                let c = r.get(i).map(String::as_str).unwrap_or("");
                let pad = wi - c.chars().count();
                if i == 0 {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
                s.push_str(" | ");
            }
            s.trim_end().to_string()
        };
        println!();
        println!("{}", self.title);
        println!("{}", line(&self.head));
        let sep: Vec<String> = w.iter().map(|&x| "-".repeat(x)).collect();
        println!(
            "|{}|",
            sep.iter()
                .map(|s| format!("-{s}-"))
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            println!("{}", line(r));
        }
    }
}

/// Read every new CQE of `cq` and advance its consumer.
pub fn poll_cq_mem(mem: &GuestMem, cq: &mut RingH, out: &mut Vec<Cqe>) -> usize {
    let prod = mem.load_u32_acquire(cq.ctrl()).expect("cq producer");
    let mut n = 0;
    while cq.idx != prod {
        let mut b = [0u8; 64];
        mem.read(cq.entry_gpa(cq.idx), &mut b).expect("read cqe");
        out.push(Cqe::from_bytes(&b));
        cq.idx = cq.idx.wrapping_add(1);
        n += 1;
    }
    if n > 0 {
        mem.store_u32_release(cq.ctrl() + 64, cq.idx)
            .expect("cq consumer");
    }
    n
}

/// Run `f` repeatedly for about `budget` (at least `min` and at most `max` times); returns the
/// per-call times in seconds.
pub fn sample(budget: Duration, min: usize, max: usize, mut f: impl FnMut() -> f64) -> Vec<f64> {
    let start = Instant::now();
    let mut v = Vec::new();
    while v.len() < max && (v.len() < min || start.elapsed() < budget) {
        v.push(f());
    }
    v
}

/// The 1-minute load average (the machine is shared: figures depend on it).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// CPU time of the calling thread, seconds.
pub fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a live local.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
