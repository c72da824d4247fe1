//! A keyed hasher for the per-packet tables whose keys the device chooses (QPNs): every packet
//! looks its QP up several times, and std's SipHash-1-3 cost more than the lookup itself.
//!
//! One 128-bit multiply folded to 64 bits per word, keyed by a seed that std's `RandomState`
//! draws per table. Not meant to resist an adversary who picks keys: use it only where the
//! device assigns them (random QPNs, spec §16). Tables keyed by what a guest or the network
//! chooses (learned MACs, ODP addresses, multicast GIDs) keep SipHash.

use std::hash::{BuildHasher, Hasher};

const K: u64 = 0x9e37_79b9_7f4a_7c15;

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// See the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = fold(self.0 ^ v, K);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Builds [`FastHasher`]s with this table's seed.
#[derive(Debug, Clone, Copy)]
pub struct FastHash {
    seed: u64,
}

impl Default for FastHash {
    fn default() -> Self {
        FastHash {
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64) | 1,
        }
    }
}

impl BuildHasher for FastHash {
    type Hasher = FastHasher;
    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.seed)
    }
}

/// A `HashMap` with [`FastHash`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastHash>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_consecutive_and_random_keys_over_the_low_bits() {
        // hashbrown picks the bucket from the low bits: 4096 consecutive QPNs must not pile up.
        let b = FastHash::default();
        let mut buckets = [0u32; 256];
        for q in 0x10u32..0x10 + 4096 {
            buckets[(b.hash_one(q) & 0xff) as usize] += 1;
        }
        let max = *buckets.iter().max().unwrap();
        assert!(max <= 40, "fullest of 256 buckets holds {max} of 4096 keys");
        // Two tables hash the same key differently (per-table seed).
        assert_ne!(
            FastHash::default().hash_one(7u32),
            FastHash::default().hash_one(7u32)
        );
    }

    #[test]
    fn a_map_with_it_behaves_like_a_map() {
        let mut m: FastMap<u32, u32> = FastMap::default();
        for i in 0..10_000u32 {
            m.insert(i.wrapping_mul(2_654_435_761) & 0xff_ffff, i);
        }
        for i in 0..10_000u32 {
            assert_eq!(
                m.get(&(i.wrapping_mul(2_654_435_761) & 0xff_ffff)),
                Some(&i)
            );
        }
        assert!(!m.contains_key(&0x1000_0000));
    }
}
