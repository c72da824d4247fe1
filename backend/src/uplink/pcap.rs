//! Packet capture (`--pcap FILE`): a tee in front of the uplink that records every frame the port
//! sends to and receives from the uplink — RoCEv2 and the guest's other Ethernet traffic — in the
//! classic pcap format (LINKTYPE_ETHERNET, microsecond timestamps), readable by tcpdump, tshark
//! and Wireshark.
//!
//! The engine thread must never wait for the disk: [`PcapTee`] timestamps the frame and hands a
//! copy to a bounded queue (`try_send`); a writer thread drains it into a buffered file, flushing
//! whenever the queue runs empty (so the file is current within one batch of traffic). When the
//! queue is full the frame is not captured and counted in [`PcapStats::dropped`] — the capture
//! may lose frames under load, the port never does. The queue is bounded in frames and in bytes
//! ([`QUEUE_BYTES`]), so a stalled disk holds at most that much host memory.
//! `--pcap-max-bytes` (default [`DEFAULT_MAX_BYTES`]) bounds the file: once the next record
//! would pass the bound, capturing stops (counted in [`PcapStats::truncated`]).
//!
//! The file holds every tenant's traffic, so it is created, never reused (spec §16.5): it must
//! not exist (an existing file, or a symlink even to nowhere, is refused, not truncated or
//! followed) and it gets mode 0600.
//!
//! Not captured: RoCEv2 frames between two QPs of the same device, which the engine loops back
//! without reaching the uplink (`port::tx_destination`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

use super::{Uplink, UplinkError, MAX_FRAME};
use crate::sync::lock;

/// pcap global header magic for microsecond timestamps, written in native byte order (readers
/// detect the order from it).
pub const PCAP_MAGIC_USEC: u32 = 0xa1b2_c3d4;
/// LINKTYPE_ETHERNET: frames start with the Ethernet header, no FCS.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Snapshot length: the largest frame an uplink carries, so every record holds the whole frame
/// (`incl_len == orig_len`).
pub const SNAPLEN: u32 = MAX_FRAME as u32;
/// Size of the global header.
pub const GLOBAL_HEADER_LEN: u64 = 24;
/// Size of a record header.
pub const RECORD_HEADER_LEN: u64 = 16;
/// Frames queued for the writer before captures are dropped.
const QUEUE_FRAMES: usize = 8192;
/// Bytes of frames queued for the writer before captures are dropped (spec §16.1, §16.5):
/// charged to the daemon's host-memory budget ([`PcapWriter::charge_to`]); frames of a fabric
/// can be 64 KiB segments, so the frame count alone would allow 512 MiB.
pub const QUEUE_BYTES: u64 = 16 << 20;
/// The file bound without `--pcap-max-bytes` (1 GiB).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

#[derive(Debug, Error)]
pub enum PcapError {
    #[error(
        "pcap file {path} already exists (or is a symlink): refusing to overwrite a capture; \
         remove it or choose a new name"
    )]
    Exists { path: String },
    #[error("cannot create pcap file {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write pcap file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the pcap writer thread: {0}")]
    Spawn(std::io::Error),
}

/// What the capture did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PcapStats {
    /// Records written to the file (buffered or flushed).
    pub written: u64,
    /// Frames not captured because the writer queue was full.
    pub dropped: u64,
    /// Frames not captured because the file reached `--pcap-max-bytes` (or a write failed).
    pub truncated: u64,
}

#[derive(Debug, Default)]
struct Counters {
    written: AtomicU64,
    dropped: AtomicU64,
    truncated: AtomicU64,
}

enum Msg {
    Frame {
        sec: u32,
        usec: u32,
        data: Vec<u8>,
        /// `data`'s bytes on the queue's budget until written.
        _charge: crate::budget::Charge,
    },
    /// Flush and acknowledge (tests, shutdown).
    Sync(SyncSender<()>),
}

/// The capture file and its writer thread. Cheap to share (`Arc`); [`PcapWriter::sync`] makes
/// everything captured so far visible in the file.
pub struct PcapWriter {
    tx: Mutex<Option<SyncSender<Msg>>>,
    /// Bounds the queued frames' bytes ([`QUEUE_BYTES`]), inside the daemon's budget once
    /// [`PcapWriter::charge_to`] was called.
    queue_budget: Mutex<crate::budget::Budget>,
    counters: Arc<Counters>,
    thread: Mutex<Option<JoinHandle<()>>>,
    path: PathBuf,
    /// The file's size bound in bytes.
    limit: u64,
}

impl std::fmt::Debug for PcapWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The 24-byte pcap global header (version 2.4, thiszone 0, sigfigs 0).
pub fn global_header() -> [u8; GLOBAL_HEADER_LEN as usize] {
    let mut h = [0u8; GLOBAL_HEADER_LEN as usize];
    h[0..4].copy_from_slice(&PCAP_MAGIC_USEC.to_ne_bytes());
    h[4..6].copy_from_slice(&2u16.to_ne_bytes());
    h[6..8].copy_from_slice(&4u16.to_ne_bytes());
    // thiszone (8..12) and sigfigs (12..16) stay 0.
    h[16..20].copy_from_slice(&SNAPLEN.to_ne_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
    h
}

/// A record header for a frame of `len` bytes captured whole.
pub fn record_header(sec: u32, usec: u32, len: u32) -> [u8; RECORD_HEADER_LEN as usize] {
    let mut h = [0u8; RECORD_HEADER_LEN as usize];
    h[0..4].copy_from_slice(&sec.to_ne_bytes());
    h[4..8].copy_from_slice(&usec.to_ne_bytes());
    h[8..12].copy_from_slice(&len.to_ne_bytes());
    h[12..16].copy_from_slice(&len.to_ne_bytes());
    h
}

impl PcapWriter {
    /// Create `path` (it must not exist; mode 0600; a symlink is not followed), write the
    /// global header and start the writer thread. `max_bytes`: stop capturing before the file
    /// would exceed it (`None`: [`DEFAULT_MAX_BYTES`]).
    pub fn create(path: &Path, max_bytes: Option<u64>) -> Result<Arc<PcapWriter>, PcapError> {
        use std::os::unix::fs::OpenOptionsExt;
        let name = path.display().to_string();
        // O_CREAT|O_EXCL fails on any existing name, a dangling symlink included; O_NOFOLLOW
        // says the same for the last component in case the kernel ever looks further.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::AlreadyExists => PcapError::Exists { path: name.clone() },
                _ if source.raw_os_error() == Some(libc::ELOOP) => {
                    PcapError::Exists { path: name.clone() }
                }
                _ => PcapError::Create {
                    path: name.clone(),
                    source,
                },
            })?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&global_header())
            .and_then(|()| out.flush())
            .map_err(|source| PcapError::Write {
                path: name.clone(),
                source,
            })?;
        let (tx, rx) = sync_channel(QUEUE_FRAMES);
        let counters = Arc::new(Counters::default());
        let c2 = counters.clone();
        let limit = max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
        let thread = std::thread::Builder::new()
            .name("vrdma-pcap".into())
            .spawn(move || write_loop(rx, out, limit, &c2, &name))
            .map_err(PcapError::Spawn)?;
        Ok(Arc::new(PcapWriter {
            tx: Mutex::new(Some(tx)),
            queue_budget: Mutex::new(crate::budget::Budget::new(QUEUE_BYTES)),
            counters,
            thread: Mutex::new(Some(thread)),
            path: path.to_path_buf(),
            limit,
        }))
    }

    /// The size the file stops growing at (`--pcap-max-bytes`, default [`DEFAULT_MAX_BYTES`]).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The capture file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Charge the frames waiting for the writer to `pool` (the daemon's budget) as well: a
    /// capture that does not fit it is dropped like one that finds the queue full.
    pub fn charge_to(&self, pool: &crate::budget::Budget) {
        *lock(&self.queue_budget) = crate::budget::Budget::in_pool(QUEUE_BYTES, pool);
    }

    /// Queue `frame` with the current wall-clock time. Never blocks: a full queue (in frames
    /// or bytes, or no room in the daemon's budget) drops the capture (not the frame).
    pub fn capture(&self, frame: &[u8]) {
        let charge = lock(&self.queue_budget).try_charge(frame.len() as u64);
        let Ok(charge) = charge else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        // pcap's 32-bit seconds wrap in 2106; the low bits keep the record well-formed.
        let msg = Msg::Frame {
            sec: ts.as_secs() as u32,
            usec: ts.subsec_micros(),
            data: frame.to_vec(),
            _charge: charge,
        };
        let tx = lock(&self.tx);
        let sent = tx.as_ref().is_some_and(|tx| match tx.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        });
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Wait until every frame captured before this call is in the file (flushed).
    pub fn sync(&self) {
        let (ack_tx, ack_rx) = sync_channel(1);
        let sent = {
            let tx = lock(&self.tx);
            tx.as_ref()
                .is_some_and(|t| t.send(Msg::Sync(ack_tx)).is_ok())
        };
        if sent {
            let _ = ack_rx.recv();
        }
    }

    /// Flush and stop the writer thread; later captures are counted as dropped.
    pub fn close(&self) {
        lock(&self.tx).take();
        let t = lock(&self.thread).take();
        if let Some(t) = t {
            if t.join().is_err() {
                log::error!("pcap writer thread panicked");
            }
        }
    }

    pub fn stats(&self) -> PcapStats {
        PcapStats {
            written: self.counters.written.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            truncated: self.counters.truncated.load(Ordering::Relaxed),
        }
    }
}

impl Drop for PcapWriter {
    fn drop(&mut self) {
        self.close();
    }
}

fn write_loop(
    rx: Receiver<Msg>,
    mut out: BufWriter<File>,
    limit: u64,
    counters: &Counters,
    name: &str,
) {
    let mut size = GLOBAL_HEADER_LEN;
    let mut failed = false;
    let mut full_logged = false;
    let flush = |out: &mut BufWriter<File>, failed: &mut bool| {
        if !*failed {
            if let Err(e) = out.flush() {
                log::error!("pcap {name}: {e}; capture stopped");
                *failed = true;
            }
        }
    };
    // Block for the first message, then drain without blocking; flush when the queue is empty.
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Frame {
                    sec, usec, data, ..
                } => {
                    let rec = RECORD_HEADER_LEN + data.len() as u64;
                    if failed || size.saturating_add(rec) > limit {
                        if !failed && !full_logged {
                            log::warn!("pcap {name}: size limit {limit} reached, capture stopped");
                            full_logged = true;
                        }
                        counters.truncated.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let hdr = record_header(sec, usec, data.len() as u32);
                        match out.write_all(&hdr).and_then(|()| out.write_all(&data)) {
                            Ok(()) => {
                                size += rec;
                                counters.written.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                log::error!("pcap {name}: {e}; capture stopped");
                                failed = true;
                                counters.truncated.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                Msg::Sync(ack) => {
                    flush(&mut out, &mut failed);
                    let _ = ack.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        flush(&mut out, &mut failed);
    }
    flush(&mut out, &mut failed);
}

/// An [`Uplink`] that captures what passes through it into a [`PcapWriter`]: frames received
/// and frames sent successfully (a frame the uplink refused was not on the wire).
pub struct PcapTee<U> {
    inner: U,
    pcap: Arc<PcapWriter>,
}

impl<U> PcapTee<U> {
    pub fn new(inner: U, pcap: Arc<PcapWriter>) -> Self {
        PcapTee { inner, pcap }
    }

    pub fn writer(&self) -> &Arc<PcapWriter> {
        &self.pcap
    }
}

impl<U: Uplink> Uplink for PcapTee<U> {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.inner.send(frame)?;
        self.pcap.capture(frame);
        Ok(())
    }

    /// Received frames pass through untouched (recorded as the port carries them: between the
    /// devices of a fabric without an ICRC). Sent frames are recorded before they reach the
    /// inner port, so the engine computes their ICRC itself.
    fn icrc_offload(&self) -> super::IcrcOffload {
        super::IcrcOffload::of_wrapper(self.inner.icrc_offload())
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let r = self.inner.recv(buf)?;
        if let Some(len) = r {
            if let Some(f) = buf.get(..len) {
                self.pcap.capture(f);
            }
        }
        Ok(r)
    }

    // Forwarded so the capture keeps the inner uplink's batched system calls.
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        let n = self.inner.send_batch(frames)?;
        for f in frames.iter().take(n) {
            self.pcap.capture(f);
        }
        Ok(n)
    }

    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<super::RxFrame>,
    ) -> Result<usize, UplinkError> {
        let before = frames.len();
        let n = self.inner.recv_batch(bufs, frames)?;
        for rx in frames.iter().skip(before) {
            if let Some(f) = bufs
                .get(rx.slot)
                .and_then(|b| b.get(rx.off..rx.off.saturating_add(rx.len)))
            {
                self.pcap.capture(f);
            }
        }
        Ok(n)
    }

    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
    fn link_up(&self) -> Option<bool> {
        self.inner.link_up()
    }
    /// Frames are captured when received, so the inner queue's state is this uplink's.
    fn rx_pending(&self) -> Option<bool> {
        self.inner.rx_pending()
    }
    fn set_rx_polling(&self, polling: bool) {
        self.inner.set_rx_polling(polling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vrdma-pcap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    /// Walk the records of a pcap file: (incl_len, orig_len, data) per record.
    fn records(bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut off = GLOBAL_HEADER_LEN as usize;
        while off < bytes.len() {
            let h = &bytes[off..off + 16];
            let incl = u32::from_ne_bytes(h[8..12].try_into().unwrap());
            let orig = u32::from_ne_bytes(h[12..16].try_into().unwrap());
            let d = bytes[off + 16..off + 16 + incl as usize].to_vec();
            v.push((incl, orig, d));
            off += 16 + incl as usize;
        }
        assert_eq!(off, bytes.len(), "trailing partial record");
        v
    }

    #[test]
    fn header_and_records_are_well_formed() {
        let p = tmp("basic");
        let w = PcapWriter::create(&p, None).unwrap();
        w.capture(&[1u8; 60]);
        w.capture(&[2u8; 1514]);
        w.sync();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(&b[..4], &PCAP_MAGIC_USEC.to_ne_bytes());
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 2);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), 4);
        assert_eq!(u32::from_ne_bytes(b[16..20].try_into().unwrap()), 65535);
        assert_eq!(u32::from_ne_bytes(b[20..24].try_into().unwrap()), 1);
        let r = records(&b);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].0, r[0].1), (60, 60));
        assert_eq!(r[1].2, vec![2u8; 1514]);
        assert_eq!(w.stats().written, 2);
        w.close();
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn size_limit_stops_capture_at_a_record_boundary() {
        let p = tmp("limit");
        // Header + two 100-byte records fit; the third does not.
        let w = PcapWriter::create(&p, Some(24 + 2 * 116 + 50)).unwrap();
        for _ in 0..3 {
            w.capture(&[7u8; 100]);
        }
        w.sync();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(records(&b).len(), 2);
        assert_eq!(
            w.stats(),
            PcapStats {
                written: 2,
                dropped: 0,
                truncated: 1
            }
        );
        w.close();
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn closed_writer_counts_drops_and_keeps_the_file() {
        let p = tmp("closed");
        let w = PcapWriter::create(&p, None).unwrap();
        w.capture(&[3u8; 64]);
        w.close();
        w.capture(&[4u8; 64]);
        w.sync(); // must not hang once closed
        assert_eq!(w.stats().dropped, 1);
        assert_eq!(records(&std::fs::read(&p).unwrap()).len(), 1);
        let _ = std::fs::remove_file(&p);
    }

    /// Spec §16.1: the frames waiting for the writer are charged to the daemon's budget; a
    /// capture that does not fit is dropped (counted), and written ones give their bytes back.
    #[test]
    fn queued_captures_are_charged_to_the_daemon_budget() {
        let p = tmp("charged");
        let w = PcapWriter::create(&p, None).unwrap();
        let pool = crate::budget::Budget::new(100);
        w.charge_to(&pool);
        w.capture(&[1u8; 200]);
        assert_eq!(w.stats().dropped, 1, "beyond the daemon's budget");
        w.capture(&[2u8; 60]);
        w.sync();
        assert_eq!(w.stats().written, 1);
        assert_eq!(pool.used(), 0, "written: given back");
        assert_eq!(pool.peak(), 60);
        w.close();
        let _ = std::fs::remove_file(&p);
    }

    /// Spec §16.5: an existing file is never truncated, a symlink never followed.
    #[test]
    fn existing_files_and_symlinks_are_refused() {
        let p = tmp("exists");
        std::fs::write(&p, b"keep").unwrap();
        let e = PcapWriter::create(&p, None).unwrap_err();
        assert!(matches!(e, PcapError::Exists { .. }), "{e}");
        assert!(e.to_string().contains("refusing to overwrite"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");

        // A symlink to an existing file, and a dangling one: neither is followed.
        let link = tmp("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(
            PcapWriter::create(&link, None),
            Err(PcapError::Exists { .. })
        ));
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");
        let nowhere = tmp("nowhere");
        let dangling = tmp("dangling");
        std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
        assert!(matches!(
            PcapWriter::create(&dangling, None),
            Err(PcapError::Exists { .. })
        ));
        assert!(!nowhere.exists(), "the symlink's target was created");
        for f in [p, link, dangling] {
            let _ = std::fs::remove_file(f);
        }
    }

    #[test]
    fn file_is_private_and_bounded_by_default() {
        use std::os::unix::fs::PermissionsExt;
        let p = tmp("mode");
        let w = PcapWriter::create(&p, None).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(w.limit(), DEFAULT_MAX_BYTES);
        assert_eq!(
            PcapWriter::create(&tmp("mode2"), Some(4096))
                .unwrap()
                .limit(),
            4096
        );
        w.close();
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(tmp("mode2"));
    }

    /// The queue holds at most QUEUE_BYTES of frames, however few frames that is: with a
    /// writer that never drains, 64 KiB frames stop being queued at 16 MiB (256 frames), far
    /// below the 8192-frame bound.
    #[test]
    fn capture_queue_is_bounded_in_bytes() {
        let (tx, rx) = sync_channel(QUEUE_FRAMES);
        let w = PcapWriter {
            tx: Mutex::new(Some(tx)),
            counters: Arc::new(Counters::default()),
            thread: Mutex::new(None),
            path: PathBuf::new(),
            limit: DEFAULT_MAX_BYTES,
            queue_budget: Mutex::new(crate::budget::Budget::new(QUEUE_BYTES)),
        };
        let frame = vec![0u8; 64 << 10];
        for _ in 0..300 {
            w.capture(&frame);
        }
        let queued = rx.try_iter().count();
        assert_eq!(queued as u64, QUEUE_BYTES / (64 << 10));
        assert_eq!(w.stats().dropped, 300 - queued as u64);
    }
}
