//! Unpredictable identifiers (spec §16): the QPNs and the initial MR key variants a peer would
//! otherwise guess. Each table owns an [`IdRng`], a ChaCha12 generator seeded once from the
//! operating system's RNG when the table (i.e. the device) is created.

use rand::rngs::{StdRng, SysRng};
use rand::{Rng, RngExt, SeedableRng};

/// A cryptographically strong generator for identifiers.
pub struct IdRng(StdRng);

impl std::fmt::Debug for IdRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The state is the secret: never print it.
        f.write_str("IdRng")
    }
}

impl IdRng {
    /// Seeded from the OS RNG (getrandom(2)). If that fails (an over-tight sandbox), the seed
    /// falls back to the clock, the PID and an address: identifiers are then only as hard to
    /// guess as those, which is logged.
    ///
    /// With the `fuzzing` feature (the coverage-guided fuzz targets in `fuzz/`, never a release
    /// build) the seed is fixed instead, so that an input replays the same QPNs and keys and a
    /// crash found by the fuzzer reproduces from its input alone.
    pub fn from_os() -> IdRng {
        if cfg!(feature = "fuzzing") {
            return IdRng::from_seed(0x7672_646d_615f_667a);
        }
        match StdRng::try_from_rng(&mut SysRng) {
            Ok(r) => IdRng(r),
            Err(e) => {
                log::warn!("ids: no OS randomness ({e}); QPNs and MR keys are weakly seeded");
                IdRng(StdRng::seed_from_u64(weak_seed()))
            }
        }
    }

    /// A generator with a fixed seed (unit tests that need a reproducible sequence).
    pub fn from_seed(seed: u64) -> IdRng {
        IdRng(StdRng::seed_from_u64(seed))
    }

    /// A uniform value in `lo..=hi` (`lo <= hi`; if not, `lo`).
    pub fn in_range(&mut self, lo: u32, hi: u32) -> u32 {
        if lo >= hi {
            return lo;
        }
        self.0.random_range(lo..=hi)
    }

    pub fn next_u8(&mut self) -> u8 {
        self.0.next_u32() as u8
    }
}

fn weak_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let local = 0u8;
    let addr = std::ptr::addr_of!(local) as u64;
    t ^ (u64::from(std::process::id()) << 32) ^ addr.rotate_left(17)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_seeded_generators_differ_and_ranges_hold() {
        let (mut a, mut b) = (IdRng::from_os(), IdRng::from_os());
        let sa: Vec<u32> = (0..8).map(|_| a.in_range(16, 0xff_fffe)).collect();
        let sb: Vec<u32> = (0..8).map(|_| b.in_range(16, 0xff_fffe)).collect();
        assert_ne!(sa, sb);
        assert!(sa.iter().chain(&sb).all(|&q| (16..=0xff_fffe).contains(&q)));
        assert_eq!(a.in_range(5, 5), 5);
        assert_eq!(a.in_range(6, 5), 6);
        let (mut c, mut d) = (IdRng::from_seed(1), IdRng::from_seed(1));
        assert_eq!(c.in_range(0, u32::MAX), d.in_range(0, u32::MAX));
    }
}
