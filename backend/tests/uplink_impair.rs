//! The impairment wrapper: statistics within tolerance for fixed seeds, and the output sequence is
//! exactly what the statistics say.

use std::os::unix::io::RawFd;
use std::sync::Mutex;

use vrdma_backend::uplink::{ImpairConfig, Impaired, Uplink, UplinkError};

#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<u32>>,
}

impl Uplink for Recorder {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        let seq = u32::from_be_bytes(frame[..4].try_into().unwrap());
        self.sent.lock().unwrap().push(seq);
        Ok(())
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Ok(None)
    }
    fn as_raw_fd(&self) -> RawFd {
        -1
    }
}

fn run(cfg: ImpairConfig, n: u32) -> (Vec<u32>, vrdma_backend::uplink::ImpairStats) {
    let imp = Impaired::new(Recorder::default(), cfg);
    for seq in 0..n {
        imp.send(&seq.to_be_bytes()).unwrap();
    }
    imp.flush().unwrap();
    let out = imp.inner().sent.lock().unwrap().clone();
    (out, imp.stats())
}

#[test]
fn statistics_within_tolerance() {
    let cfg: ImpairConfig = "drop=0.05,dup=0.01,reorder=0.01,seed=42".parse().unwrap();
    let n = 200_000u32;
    let (out, st) = run(cfg, n);
    assert_eq!(st.offered, u64::from(n));
    let f = |x: u64| x as f64 / f64::from(n);
    assert!(
        (f(st.dropped) - 0.05).abs() < 0.003,
        "drop {}",
        f(st.dropped)
    );
    // dup/reorder apply to frames that survived the drop (95 %).
    assert!(
        (f(st.duplicated) - 0.0095).abs() < 0.0015,
        "dup {}",
        f(st.duplicated)
    );
    assert!(
        (f(st.reordered) - 0.0095).abs() < 0.0015,
        "reorder {}",
        f(st.reordered)
    );
    assert_eq!(st.forwarded, out.len() as u64);

    // The output agrees with the counters exactly.
    let mut seen = vec![0u8; n as usize];
    for &s in &out {
        seen[s as usize] += 1;
    }
    let missing = seen.iter().filter(|&&c| c == 0).count() as u64;
    let doubled = seen.iter().filter(|&&c| c == 2).count() as u64;
    assert!(seen.iter().all(|&c| c <= 2));
    assert_eq!(missing, st.dropped);
    assert_eq!(doubled, st.duplicated);
    let inversions = out.windows(2).filter(|w| w[0] > w[1]).count() as u64;
    assert_eq!(inversions, st.reordered);
    // Reordering displaces a frame by exactly one surviving frame.
    for w in out.windows(2).filter(|w| w[0] > w[1]) {
        assert!(w[0] - w[1] <= 10, "{w:?}");
    }
}

#[test]
fn deterministic_per_seed() {
    let c1: ImpairConfig = "drop=0.1,dup=0.1,reorder=0.1,seed=7".parse().unwrap();
    let c2 = ImpairConfig { seed: 8, ..c1 };
    let (a, sa) = run(c1, 5000);
    let (b, sb) = run(c1, 5000);
    let (c, _) = run(c2, 5000);
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert_ne!(a, c);
}

#[test]
fn extremes() {
    let (out, st) = run(ImpairConfig::default(), 1000);
    assert_eq!(out, (0..1000).collect::<Vec<_>>());
    assert_eq!(st.dropped + st.duplicated + st.reordered, 0);
    let (out, st) = run("drop=1".parse().unwrap(), 1000);
    assert!(out.is_empty());
    assert_eq!(st.dropped, 1000);
    let (out, _) = run("dup=1".parse().unwrap(), 10);
    assert_eq!(
        out,
        vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    );
    // reorder=1: every other frame is held and released after the next one.
    let (out, _) = run("reorder=1".parse().unwrap(), 6);
    assert_eq!(out, vec![1, 0, 3, 2, 5, 4]);
}
