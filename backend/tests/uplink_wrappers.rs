//! The uplink wrappers (`stats::Metered`, `uplink::PcapTee`) keep the inner uplink's batched
//! calls (`send_batch` / `recv_batch`, sendmmsg / recvmmsg on UDP) and still count / capture
//! every frame of a batch. The engine only uses the batch calls; a wrapper falling back to the
//! trait's per-frame defaults would turn each batch back into one system call per frame.

use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use vrdma_backend::stats::{Metered, PortStats};
use vrdma_backend::uplink::{PcapTee, PcapWriter, RxFrame, Uplink, UplinkError};

/// An uplink that only moves frames through its batch calls: the per-frame calls fail, so a
/// wrapper that does not forward the batch calls sends and receives nothing.
#[derive(Default)]
struct BatchOnly {
    send_batches: AtomicUsize,
    recv_batches: AtomicUsize,
}

impl Uplink for BatchOnly {
    fn send(&self, _frame: &[u8]) -> Result<(), UplinkError> {
        Err(UplinkError::Send(std::io::Error::other("per-frame send")))
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Err(UplinkError::Recv(std::io::Error::other("per-frame recv")))
    }
    fn as_raw_fd(&self) -> RawFd {
        -1
    }
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        self.send_batches.fetch_add(1, Ordering::Relaxed);
        Ok(frames.len())
    }
    /// Two frames merged into the first buffer (like UDP GRO), one in the second.
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        self.recv_batches.fetch_add(1, Ordering::Relaxed);
        bufs[0][..100].fill(1);
        bufs[1][..60].fill(2);
        frames.push(RxFrame {
            slot: 0,
            off: 0,
            len: 60,
            segment: false,
            refs: None,
            source: None,
        });
        frames.push(RxFrame {
            slot: 0,
            off: 60,
            len: 40,
            segment: false,
            refs: None,
            source: None,
        });
        frames.push(RxFrame {
            slot: 1,
            off: 0,
            len: 60,
            segment: false,
            refs: None,
            source: None,
        });
        Ok(2)
    }
}

#[test]
fn metered_forwards_batches_and_counts_each_frame() {
    let stats = Arc::new(PortStats::default());
    let m = Metered::new(BatchOnly::default(), stats.clone());
    let (a, b) = ([0u8; 64], [0u8; 80]);
    assert_eq!(m.send_batch(&[&a, &b]).unwrap(), 2);
    let mut bufs = vec![vec![0u8; 256]; 4];
    let mut frames = vec![RxFrame::default()]; // frames already there are not counted again
    assert_eq!(m.recv_batch(&mut bufs, &mut frames).unwrap(), 2);
    assert_eq!(frames.len(), 4);
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(get(&stats.tx_frames), 2);
    assert_eq!(get(&stats.tx_bytes), 144);
    assert_eq!(get(&stats.rx_frames), 3);
    assert_eq!(get(&stats.rx_bytes), 160);
    assert_eq!(get(&stats.tx_errors) + get(&stats.rx_errors), 0);
}

#[test]
fn pcap_tee_forwards_batches_and_captures_each_frame() {
    let path = std::env::temp_dir().join(format!("vrdma-wrappers-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let w = PcapWriter::create(&path, None).unwrap();
    let t = PcapTee::new(BatchOnly::default(), w.clone());
    let (a, b) = ([0u8; 64], [0u8; 80]);
    assert_eq!(t.send_batch(&[&a, &b]).unwrap(), 2);
    let mut bufs = vec![vec![0u8; 256]; 4];
    let mut frames = Vec::new();
    assert_eq!(t.recv_batch(&mut bufs, &mut frames).unwrap(), 2);
    w.sync();
    let s = w.stats();
    assert_eq!((s.written, s.dropped), (5, 0));
    w.close();
    let _ = std::fs::remove_file(&path);
}
