//! Per-device host-memory budget (spec §16 "Host memory"): every piece of daemon memory whose
//! amount the guest decides is charged here before it is allocated.
//!
//! One [`Budget`] per device, shared (it is an `Arc`) by the device's tables, the transport and
//! the control queue. [`Budget::try_charge`] either reserves the bytes and returns a [`Charge`]
//! that gives them back when dropped, or fails with [`OverBudget`] and changes nothing; the
//! caller then takes the spec's outcome (§14.8: a command gets NO_RESOURCES, a WQE fetch waits,
//! a request is RNR-NAKed). The counter is an atomic, so no lock is needed and the charged total
//! never exceeds the limit, whichever threads charge at the same time.
//!
//! Budgets nest (spec §16.1): a device's budget may belong to the daemon's
//! ([`Budget::in_pool`], `--max-host-memory` on a daemon of several devices); a charge then
//! fits only if it fits both, so every device stays within its own bound and all of them
//! together within the daemon's. The daemon's budget is charged directly for what belongs to
//! no device (the fabric's receive queues, the capture queue).
//!
//! What a charge counts is an estimate of the heap and table memory an object holds (its struct
//! plus the guest-sized arrays in it: page lists, SGE lists, inline data), not allocator
//! overhead; the budget's slack for that is what `tests/budget_limits.rs` measures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

/// Default bound of one device (`--max-host-memory-per-device`): 1 GiB.
pub const DEFAULT_MAX_HOST_MEMORY: u64 = 1 << 30;

/// A charge did not fit.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("host-memory budget exceeded: {want} bytes asked, {used} of {limit} in use")]
pub struct OverBudget {
    pub want: u64,
    pub used: u64,
    pub limit: u64,
}

#[derive(Debug)]
struct Inner {
    limit: u64,
    /// The budget every charge of this one is also charged to.
    pool: Option<Budget>,
    used: AtomicU64,
    /// Highest `used` ever seen (tests check it against `limit`).
    peak: AtomicU64,
}

/// The host-memory budget of one device. Clones share the counter.
#[derive(Debug, Clone)]
pub struct Budget(Arc<Inner>);

impl Default for Budget {
    fn default() -> Self {
        Budget::new(DEFAULT_MAX_HOST_MEMORY)
    }
}

impl Budget {
    /// A budget of `limit` bytes, nothing charged.
    pub fn new(limit: u64) -> Self {
        Budget(Arc::new(Inner {
            limit,
            pool: None,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }))
    }

    /// A budget of `limit` bytes whose charges are also charged to `pool` (a device's budget
    /// in its daemon's): a charge fits only if it fits both.
    pub fn in_pool(limit: u64, pool: &Budget) -> Self {
        Budget(Arc::new(Inner {
            limit,
            pool: Some(pool.clone()),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }))
    }

    /// The budget this one's charges are also charged to, if any.
    pub fn pool(&self) -> Option<&Budget> {
        self.0.pool.as_ref()
    }

    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.0.used.load(Ordering::Acquire)
    }

    /// Most bytes ever charged at once.
    pub fn peak(&self) -> u64 {
        self.0.peak.load(Ordering::Acquire)
    }

    /// Reserve `bytes`, or fail without changing anything.
    pub fn try_charge(&self, bytes: u64) -> Result<Charge, OverBudget> {
        self.reserve(bytes)?;
        Ok(Charge {
            budget: Some(self.clone()),
            bytes,
        })
    }

    fn reserve(&self, bytes: u64) -> Result<(), OverBudget> {
        self.reserve_here(bytes)?;
        if let Some(pool) = &self.0.pool {
            if let Err(e) = pool.reserve(bytes) {
                self.release_here(bytes);
                return Err(e);
            }
        }
        Ok(())
    }

    fn reserve_here(&self, bytes: u64) -> Result<(), OverBudget> {
        let inner = &*self.0;
        let mut cur = inner.used.load(Ordering::Relaxed);
        loop {
            let new = cur
                .checked_add(bytes)
                .filter(|&n| n <= inner.limit)
                .ok_or(OverBudget {
                    want: bytes,
                    used: cur,
                    limit: inner.limit,
                })?;
            match inner
                .used
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    inner.peak.fetch_max(new, Ordering::AcqRel);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    fn release(&self, bytes: u64) {
        self.release_here(bytes);
        if let Some(pool) = &self.0.pool {
            pool.release(bytes);
        }
    }

    fn release_here(&self, bytes: u64) {
        // Never below zero: a charge only gives back what it reserved.
        let _ = self
            .0
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

/// Bytes reserved on a [`Budget`]; dropping it gives them back. `Charge::default()` holds
/// nothing and belongs to no budget (objects built outside a device, e.g. in unit tests).
#[derive(Debug, Default)]
pub struct Charge {
    budget: Option<Budget>,
    bytes: u64,
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reserve `bytes` more on `budget` (which this charge then belongs to, if it belonged to
    /// none). A charge of one budget cannot grow on another: that is a bug, answered with
    /// `OverBudget` rather than a wrong count.
    pub fn try_grow(&mut self, budget: &Budget, bytes: u64) -> Result<(), OverBudget> {
        if let Some(b) = &self.budget {
            if !Arc::ptr_eq(&b.0, &budget.0) {
                return Err(OverBudget {
                    want: bytes,
                    used: budget.used(),
                    limit: budget.limit(),
                });
            }
        }
        budget.reserve(bytes)?;
        self.budget.get_or_insert_with(|| budget.clone());
        self.bytes += bytes;
        Ok(())
    }

    /// Take over what `other` holds (both must belong to the same budget, or `other` to none);
    /// on a mismatch `other` is simply dropped, giving its bytes back.
    pub fn absorb(&mut self, mut other: Charge) {
        let same = match (&self.budget, &other.budget) {
            (_, None) => true,
            (None, Some(_)) => {
                self.budget = other.budget.clone();
                true
            }
            (Some(a), Some(b)) => Arc::ptr_eq(&a.0, &b.0),
        };
        if same {
            self.bytes += other.bytes;
            other.bytes = 0;
        }
    }

    /// Give back `bytes` (at most what is held).
    pub fn shrink(&mut self, bytes: u64) {
        let n = bytes.min(self.bytes);
        if let Some(b) = &self.budget {
            b.release(n);
        }
        self.bytes -= n;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.bytes);
        }
    }
}

/// Parse a byte count with an optional K/M/G/T suffix (powers of 1024; `KiB`, `MB`... spellings
/// accepted, case-insensitive), e.g. `64M`, `1G`, `1048576`.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_bounded_and_released() {
        let b = Budget::new(100);
        let c1 = b.try_charge(60).unwrap();
        assert_eq!(b.try_charge(41).unwrap_err().used, 60);
        let mut c2 = b.try_charge(40).unwrap();
        assert_eq!(b.used(), 100);
        assert!(c2.try_grow(&b, 1).is_err());
        c2.shrink(15);
        c2.try_grow(&b, 10).unwrap();
        assert_eq!((b.used(), c2.bytes()), (95, 35));
        drop(c1);
        drop(c2);
        assert_eq!((b.used(), b.peak()), (0, 100));
        assert!(b.try_charge(u64::MAX).is_err());
        let other = Budget::new(100);
        let mut c = b.try_charge(1).unwrap();
        assert!(c.try_grow(&other, 1).is_err());
        assert_eq!(other.used(), 0);
    }

    #[test]
    fn concurrent_charges_never_exceed_the_limit() {
        let b = Budget::new(1000);
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Ok(c) = b.try_charge(300) {
                            assert!(b.used() <= 1000);
                            drop(c);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(b.used(), 0);
        assert!(b.peak() <= 1000);
    }

    /// Finding 5 of issue 39: two devices of one daemon, each within its own bound, together
    /// beyond the daemon's: the charge that would pass the daemon's bound fails, changes
    /// nothing, and fits again once the other device gives memory back.
    #[test]
    fn device_budgets_in_a_daemon_pool() {
        let daemon = Budget::new(150);
        let a = Budget::in_pool(100, &daemon);
        let b = Budget::in_pool(100, &daemon);
        let ca = a.try_charge(90).unwrap();
        assert_eq!(a.try_charge(11).unwrap_err().limit, 100, "a's own bound");
        let e = b.try_charge(90).unwrap_err();
        assert_eq!((e.limit, e.used), (150, 90), "the daemon's bound");
        assert_eq!((b.used(), daemon.used()), (0, 90), "nothing changed");
        let cb = b.try_charge(60).unwrap();
        assert_eq!(daemon.used(), 150);
        drop(ca);
        assert_eq!(daemon.used(), 60);
        let mut cb2 = b.try_charge(40).unwrap();
        cb2.shrink(10);
        assert_eq!((b.used(), daemon.used()), (90, 90));
        drop((cb, cb2));
        assert_eq!((a.used(), b.used(), daemon.used()), (0, 0, 0));
        assert_eq!(daemon.peak(), 150);
    }

    #[test]
    fn byte_suffixes() {
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("1g"), Some(1 << 30));
        assert_eq!(parse_bytes("4KiB"), Some(4096));
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("1Q"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999T"), None);
    }
}
