//! Seeded generators: `Rng` (the impairment wrapper's splitmix64) for the hostile-input suites,
//! `XorShift` for the random-sequence tests. A failure prints the seed; the seed replays it.

use vrdma_backend::uplink::impair::SplitMix64;

pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform-ish in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True with a probability of `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// xorshift64*: the generator of the random-sequence tests (device commands, ODP operations,
/// concurrent stress); the seed must not be 0.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// In `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
