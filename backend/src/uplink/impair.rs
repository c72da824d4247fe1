//! Impairment wrapper (testing): drops, duplicates and reorders a configured fraction of the frames
//! *sent* through it, driven by a seeded PRNG so a run is reproducible. Received frames pass through.
//!
//! Spec string (`--impair`): `drop=P,dup=P,reorder=P,seed=N` — any subset, keys case-insensitive,
//! P in [0, 1]. Reordering holds a frame back and sends it right after the next frame that is sent
//! (call [`Impaired::flush`] to release a held frame).

use std::os::unix::io::RawFd;
use std::str::FromStr;
use std::sync::Mutex;

use super::{Uplink, UplinkError};
use crate::sync::lock;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImpairConfig {
    pub drop: f64,
    pub dup: f64,
    pub reorder: f64,
    pub seed: u64,
}

impl Default for ImpairConfig {
    fn default() -> Self {
        ImpairConfig {
            drop: 0.0,
            dup: 0.0,
            reorder: 0.0,
            seed: 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImpairSpecError {
    #[error("impairment {0:?}: expected key=value")]
    NotKeyValue(String),
    #[error("impairment key {0:?} unknown (expected drop, dup, reorder, seed)")]
    UnknownKey(String),
    #[error("impairment {key}={value:?}: expected a probability between 0 and 1")]
    BadProbability { key: String, value: String },
    #[error("impairment seed={0:?}: expected an unsigned integer")]
    BadSeed(String),
}

impl FromStr for ImpairConfig {
    type Err = ImpairSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut c = ImpairConfig::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| ImpairSpecError::NotKeyValue(item.to_owned()))?;
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            let prob = || -> Result<f64, ImpairSpecError> {
                match v.parse::<f64>() {
                    Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                    _ => Err(ImpairSpecError::BadProbability {
                        key: k.clone(),
                        value: v.to_owned(),
                    }),
                }
            };
            match k.as_str() {
                "drop" => c.drop = prob()?,
                "dup" => c.dup = prob()?,
                "reorder" => c.reorder = prob()?,
                "seed" => {
                    c.seed = v
                        .parse()
                        .map_err(|_| ImpairSpecError::BadSeed(v.to_owned()))?
                }
                _ => return Err(ImpairSpecError::UnknownKey(k)),
            }
        }
        Ok(c)
    }
}

/// splitmix64: tiny, fast, good enough for test impairment.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Counters of what the wrapper did to sent frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImpairStats {
    /// Frames handed to `send`.
    pub offered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Frames passed to the inner uplink (incl. duplicates and released held frames).
    pub forwarded: u64,
}

#[derive(Debug)]
struct State {
    rng: SplitMix64,
    held: Option<Vec<u8>>,
    stats: ImpairStats,
}

/// An [`Uplink`] that impairs what is sent through it.
#[derive(Debug)]
pub struct Impaired<U> {
    inner: U,
    cfg: ImpairConfig,
    state: Mutex<State>,
}

impl<U: Uplink> Impaired<U> {
    pub fn new(inner: U, cfg: ImpairConfig) -> Self {
        Impaired {
            inner,
            cfg,
            state: Mutex::new(State {
                rng: SplitMix64::new(cfg.seed),
                held: None,
                stats: ImpairStats::default(),
            }),
        }
    }

    pub fn stats(&self) -> ImpairStats {
        self.lock().stats
    }

    pub fn inner(&self) -> &U {
        &self.inner
    }

    /// Send a frame held back for reordering, if any.
    pub fn flush(&self) -> Result<(), UplinkError> {
        let mut st = self.lock();
        if let Some(h) = st.held.take() {
            st.stats.forwarded += 1;
            self.inner.send(&h)?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave State inconsistent in a harmful way.
        lock(&self.state)
    }
}

impl<U: Uplink> Uplink for Impaired<U> {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        let mut st = self.lock();
        st.stats.offered += 1;
        // Three independent rolls per frame, always drawn, so the sequence depends only on the seed.
        let (r_drop, r_reorder, r_dup) = (st.rng.next_f64(), st.rng.next_f64(), st.rng.next_f64());
        if r_drop < self.cfg.drop {
            st.stats.dropped += 1;
            return Ok(());
        }
        if r_reorder < self.cfg.reorder && st.held.is_none() {
            st.stats.reordered += 1;
            st.held = Some(frame.to_vec());
            return Ok(());
        }
        st.stats.forwarded += 1;
        let r = self.inner.send(frame);
        if let Some(h) = st.held.take() {
            st.stats.forwarded += 1;
            self.inner.send(&h)?;
        }
        r?;
        if r_dup < self.cfg.dup {
            st.stats.duplicated += 1;
            st.stats.forwarded += 1;
            self.inner.send(frame)?;
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        self.inner.recv(buf)
    }

    /// Received frames pass through untouched, so the inner port's receive promise holds.
    /// Sends go through `send`, which no uplink seals: the engine computes the ICRC itself.
    fn icrc_offload(&self) -> super::IcrcOffload {
        super::IcrcOffload::of_wrapper(self.inner.icrc_offload())
    }

    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
    fn link_up(&self) -> Option<bool> {
        self.inner.link_up()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_specs() {
        let c: ImpairConfig = "drop=0.05,DUP=0.01, reorder=0.02,seed=7".parse().unwrap();
        assert_eq!(
            c,
            ImpairConfig {
                drop: 0.05,
                dup: 0.01,
                reorder: 0.02,
                seed: 7
            }
        );
        assert_eq!("".parse::<ImpairConfig>().unwrap(), ImpairConfig::default());
        assert!(matches!(
            "drop=1.5".parse::<ImpairConfig>(),
            Err(ImpairSpecError::BadProbability { .. })
        ));
        assert!(matches!(
            "drop=-0.1".parse::<ImpairConfig>(),
            Err(ImpairSpecError::BadProbability { .. })
        ));
        assert!(matches!(
            "drop=nan".parse::<ImpairConfig>(),
            Err(ImpairSpecError::BadProbability { .. })
        ));
        assert!(matches!(
            "loss=0.1".parse::<ImpairConfig>(),
            Err(ImpairSpecError::UnknownKey(_))
        ));
        assert!(matches!(
            "drop".parse::<ImpairConfig>(),
            Err(ImpairSpecError::NotKeyValue(_))
        ));
        assert!(matches!(
            "seed=x".parse::<ImpairConfig>(),
            Err(ImpairSpecError::BadSeed(_))
        ));
    }

    #[test]
    fn prng_is_deterministic_and_uniform_enough() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let x = a.next_f64();
            assert_eq!(x, b.next_f64());
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        assert!((sum / 10_000.0 - 0.5).abs() < 0.02);
    }
}
