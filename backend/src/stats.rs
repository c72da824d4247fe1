//! Host-side counters: what an operator sees without looking into the guest.
//!
//! - [`PortStats`]: per-device port counters (frames/bytes to and from the uplink, where received
//!   frames went, drops by reason). Atomics, shared by the engine thread, the vhost-user thread
//!   (guest eth tx through [`Metered`]) and the stats server; relaxed increments on the hot path.
//! - [`QpStats`]: per-QP transport counters in `Qp::stats`, plain integers changed under the
//!   device lock by `transport/` (the only writer).
//! - [`render`]: the Prometheus text exposition format (version 0.0.4) of both, plus the live
//!   object counts and ODP figures of the device.
//! - [`StatsServer`]: serves [`render`]'s text to every client of a unix socket,
//!   `<vhost-user socket>.stats` in the daemon ([`stats_socket_path`]); `vrdma-backend stats
//!   --socket PATH` ([`fetch`]) prints it. Anyone who can connect can read the counters, so the
//!   socket gets the permissions of its directory (like the vhost-user socket, spec §16).
//!
//! Counters count from daemon start (port) or QP creation (QP); a device reset destroys the QPs
//! and their counters, not the port's.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::io::RawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::device::Device;
use crate::qp::QpType;
use crate::uplink::{RxFrame, Uplink, UplinkError, IO_BATCH};

#[derive(Debug, Error)]
pub enum StatsError {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the stats thread: {0}")]
    Spawn(std::io::Error),
    #[error("cannot read counters from {path}: {source}")]
    Fetch {
        path: String,
        source: std::io::Error,
    },
}

/// The port's counters (see the module doc). Every field counts events since daemon start.
#[derive(Debug, Default)]
pub struct PortStats {
    /// Frames received from the uplink, and their bytes.
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames handed to the uplink successfully (engine and guest eth tx), and their bytes.
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Received frames the port demux gave the RoCEv2 engine / the guest netdev.
    pub rx_to_engine: AtomicU64,
    pub rx_to_guest: AtomicU64,
    /// RoCEv2 frames between two QPs of this device, looped back without the uplink.
    pub loopback_frames: AtomicU64,
    /// Drops by reason: runts and unicast for another MAC (port demux, `port.rs`).
    pub drop_filtered: AtomicU64,
    /// RoCEv2 frames the transport could not parse (bad headers, unsupported opcode).
    pub drop_malformed: AtomicU64,
    /// RoCEv2 frames dropped for a bad ICRC (spec §15.7).
    pub drop_bad_icrc: AtomicU64,
    /// RoCEv2 frames for a QPN that does not exist.
    pub drop_unknown_qp: AtomicU64,
    /// RoCEv2 frames whose QP's type or state does not accept them (IBTA 9.6, 10.3).
    pub drop_qp_state: AtomicU64,
    /// RoCEv2 frames whose P_Key does not match the QP's (IBTA 10.9, spec §14.6).
    pub drop_bad_pkey: AtomicU64,
    /// RC/UC frames not from the QP's peer (source/destination GID ≠ the QP's path, §14.6).
    pub drop_bad_address: AtomicU64,
    /// UC frames ahead of the expected PSN by the UC window or more (§14.6).
    pub drop_uc_out_of_window: AtomicU64,
    /// Frames the uplink could not take (socket buffer full): lost like on a wire.
    pub drop_tx_busy: AtomicU64,
    /// Other uplink send / receive errors.
    pub tx_errors: AtomicU64,
    pub rx_errors: AtomicU64,
}

/// `counter += 1` for a [`PortStats`] field (relaxed: counters order nothing).
#[inline]
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[inline]
pub fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

/// Per-QP transport counters (`Qp::stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets (frames) the QP sent — requests, responses and acknowledgements — and bytes.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Packets for this QP the transport accepted for processing, and bytes.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N after a NAK, timeout or RNR NAK; IBTA 9.7.5).
    pub retransmits: u64,
    /// Retransmission timer expiries (IBTA 9.7.6.1).
    pub timeouts: u64,
    /// RNR NAKs received (requester) / sent (responder) (IBTA 9.7.5.2.8).
    pub rnr_naks_rx: u64,
    pub rnr_naks_tx: u64,
    /// PSN sequence error NAKs received (requester) / sent (responder) (IBTA 9.7.5.2.2).
    pub seq_naks_rx: u64,
    pub seq_naks_tx: u64,
}

impl QpStats {
    /// `self += o`, field by field (wrapping, like the 64-bit counters of spec §11.9).
    pub fn add(&mut self, o: &QpStats) {
        self.tx_packets = self.tx_packets.wrapping_add(o.tx_packets);
        self.tx_bytes = self.tx_bytes.wrapping_add(o.tx_bytes);
        self.rx_packets = self.rx_packets.wrapping_add(o.rx_packets);
        self.rx_bytes = self.rx_bytes.wrapping_add(o.rx_bytes);
        self.retransmits = self.retransmits.wrapping_add(o.retransmits);
        self.timeouts = self.timeouts.wrapping_add(o.timeouts);
        self.rnr_naks_rx = self.rnr_naks_rx.wrapping_add(o.rnr_naks_rx);
        self.rnr_naks_tx = self.rnr_naks_tx.wrapping_add(o.rnr_naks_tx);
        self.seq_naks_rx = self.seq_naks_rx.wrapping_add(o.seq_naks_rx);
        self.seq_naks_tx = self.seq_naks_tx.wrapping_add(o.seq_naks_tx);
    }

    /// The QP part of a QUERY_STATS response (spec §11.9); the port-only fields are 0.
    pub fn to_vrdma(&self) -> vrdma_spec::VrdmaStats {
        vrdma_spec::VrdmaStats {
            tx_packets: self.tx_packets,
            tx_bytes: self.tx_bytes,
            rx_packets: self.rx_packets,
            rx_bytes: self.rx_bytes,
            retransmits: self.retransmits,
            timeouts: self.timeouts,
            rnr_naks_rx: self.rnr_naks_rx,
            rnr_naks_tx: self.rnr_naks_tx,
            seq_naks_rx: self.seq_naks_rx,
            seq_naks_tx: self.seq_naks_tx,
            ..Default::default()
        }
    }
}

impl PortStats {
    /// RoCEv2 frames dropped before reaching a QP (spec §11.9 `rx_dropped`).
    pub fn rx_dropped(&self) -> u64 {
        [
            &self.drop_malformed,
            &self.drop_bad_icrc,
            &self.drop_unknown_qp,
            &self.drop_qp_state,
            &self.drop_bad_pkey,
            &self.drop_bad_address,
            &self.drop_uc_out_of_window,
        ]
        .iter()
        .fold(0u64, |a, c| a.wrapping_add(c.load(Ordering::Relaxed)))
    }
}

/// An [`Uplink`] that counts the frames and bytes passing through it into a [`PortStats`].
pub struct Metered<U> {
    inner: U,
    stats: Arc<PortStats>,
}

impl<U> Metered<U> {
    pub fn new(inner: U, stats: Arc<PortStats>) -> Self {
        Metered { inner, stats }
    }
}

impl<U: Uplink> Uplink for Metered<U> {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        let r = self.inner.send(frame);
        match &r {
            Ok(()) => {
                bump(&self.stats.tx_frames);
                add(&self.stats.tx_bytes, frame.len());
            }
            Err(UplinkError::WouldBlock) => bump(&self.stats.drop_tx_busy),
            Err(_) => bump(&self.stats.tx_errors),
        }
        r
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let r = self.inner.recv(buf);
        match &r {
            Ok(Some(n)) => {
                bump(&self.stats.rx_frames);
                add(&self.stats.rx_bytes, *n);
            }
            Ok(None) => {}
            Err(_) => bump(&self.stats.rx_errors),
        }
        r
    }

    // The batch calls forward to the inner uplink's own (sendmmsg / recvmmsg on UDP): the
    // engine moves frames in batches, and the wrapper must not turn them back into one system
    // call per frame.
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        let r = self.inner.send_batch(frames);
        match &r {
            Ok(n) => {
                let sent = frames.get(..*n).unwrap_or(frames);
                add(&self.stats.tx_frames, sent.len());
                add(&self.stats.tx_bytes, sent.iter().map(|f| f.len()).sum());
                // Frames not handed over are lost (a full socket buffer; RC retransmits).
                add(&self.stats.drop_tx_busy, frames.len() - sent.len());
            }
            Err(UplinkError::WouldBlock) => add(&self.stats.drop_tx_busy, frames.len()),
            Err(_) => bump(&self.stats.tx_errors),
        }
        r
    }

    fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
        let mut sent = 0;
        for chunk in frames.chunks_mut(IO_BATCH) {
            // Lengths first: the inner uplink may swap the buffers. A fabric segment counts as
            // the frames in it (spec §16.2 rule 6).
            let seg = self.inner.icrc_offload().segments;
            let mut lens = [0usize; IO_BATCH];
            let mut counts = [1usize; IO_BATCH];
            for ((l, c), f) in lens.iter_mut().zip(counts.iter_mut()).zip(chunk.iter()) {
                *l = f.len();
                if seg {
                    *c = crate::fabric::segment::frame_count(f);
                }
            }
            match self.inner.send_frames(chunk) {
                Ok(n) => {
                    add(
                        &self.stats.tx_frames,
                        counts[..n.min(IO_BATCH)].iter().sum(),
                    );
                    add(&self.stats.tx_bytes, lens[..n.min(IO_BATCH)].iter().sum());
                    add(&self.stats.drop_tx_busy, chunk.len().saturating_sub(n));
                    sent += n;
                }
                Err(UplinkError::WouldBlock) => add(&self.stats.drop_tx_busy, chunk.len()),
                Err(e) => {
                    bump(&self.stats.tx_errors);
                    if sent == 0 {
                        return Err(e);
                    }
                }
            }
        }
        Ok(sent)
    }

    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        let before = frames.len();
        let r = self.inner.recv_batch(bufs, frames);
        match &r {
            Ok(_) => {
                let got = frames.get(before..).unwrap_or_default();
                let n = if self.inner.icrc_offload().segments {
                    got.iter()
                        .map(|f| {
                            bufs.get(f.slot)
                                .and_then(|b| b.get(f.off..f.off + f.len))
                                .map_or(1, crate::fabric::segment::frame_count)
                        })
                        .sum()
                } else {
                    got.len()
                };
                add(&self.stats.rx_frames, n);
                add(&self.stats.rx_bytes, got.iter().map(|f| f.len).sum());
            }
            Err(_) => bump(&self.stats.rx_errors),
        }
        r
    }

    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
    fn link_up(&self) -> Option<bool> {
        self.inner.link_up()
    }
    fn icrc_offload(&self) -> crate::uplink::IcrcOffload {
        self.inner.icrc_offload()
    }
}

/// One metric family: name, help, and its samples (labels, value).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, u64)>,
}

/// Everything [`render`] prints, copied under the device lock.
struct Snapshot {
    families: Vec<Family>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn qp_type_name(t: QpType) -> &'static str {
    match t {
        QpType::Gsi => "gsi",
        QpType::Rc => "rc",
        QpType::XrcIni => "xrc_ini",
        QpType::XrcTgt => "xrc_tgt",
        QpType::Uc => "uc",
        QpType::Ud => "ud",
    }
}

fn snapshot(dev: &Device, label: &str) -> Snapshot {
    let dl = format!("device=\"{}\"", escape(label));
    let p = &dev.port_stats;
    let port = |name, help, c: &AtomicU64| Family {
        name,
        help,
        kind: "counter",
        samples: vec![(dl.clone(), c.load(Ordering::Relaxed))],
    };
    let gauge = |name, help, v: u64| Family {
        name,
        help,
        kind: "gauge",
        samples: vec![(dl.clone(), v)],
    };
    let drop = |reason: &str, c: &AtomicU64| {
        (
            format!("{dl},reason=\"{reason}\""),
            c.load(Ordering::Relaxed),
        )
    };
    let mut families = vec![
        port(
            "vrdma_port_rx_frames_total",
            "Frames received from the uplink.",
            &p.rx_frames,
        ),
        port(
            "vrdma_port_rx_bytes_total",
            "Bytes received from the uplink.",
            &p.rx_bytes,
        ),
        port(
            "vrdma_port_tx_frames_total",
            "Frames sent to the uplink (RoCEv2 and guest Ethernet).",
            &p.tx_frames,
        ),
        port(
            "vrdma_port_tx_bytes_total",
            "Bytes sent to the uplink.",
            &p.tx_bytes,
        ),
        port(
            "vrdma_port_rx_engine_frames_total",
            "Received frames given to the RoCEv2 engine.",
            &p.rx_to_engine,
        ),
        port(
            "vrdma_port_rx_guest_frames_total",
            "Received frames given to the guest netdev.",
            &p.rx_to_guest,
        ),
        port(
            "vrdma_port_loopback_frames_total",
            "RoCEv2 frames between QPs of this device (not on the uplink).",
            &p.loopback_frames,
        ),
        Family {
            name: "vrdma_port_drops_total",
            help: "Frames dropped by the port, by reason.",
            kind: "counter",
            samples: vec![
                drop("filtered", &p.drop_filtered),
                drop("malformed", &p.drop_malformed),
                drop("bad_icrc", &p.drop_bad_icrc),
                drop("unknown_qp", &p.drop_unknown_qp),
                drop("qp_state", &p.drop_qp_state),
                drop("bad_pkey", &p.drop_bad_pkey),
                drop("bad_address", &p.drop_bad_address),
                drop("uc_out_of_window", &p.drop_uc_out_of_window),
                drop("tx_busy", &p.drop_tx_busy),
            ],
        },
        Family {
            name: "vrdma_port_errors_total",
            help: "Uplink send/receive errors.",
            kind: "counter",
            samples: vec![
                (
                    format!("{dl},dir=\"tx\""),
                    p.tx_errors.load(Ordering::Relaxed),
                ),
                (
                    format!("{dl},dir=\"rx\""),
                    p.rx_errors.load(Ordering::Relaxed),
                ),
            ],
        },
        Family {
            name: "vrdma_objects",
            help: "Live verbs objects, by kind.",
            kind: "gauge",
            samples: [
                ("qp", dev.qps.len()),
                ("cq", dev.cqs.len()),
                ("mr", dev.mrs.len()),
                ("pd", dev.pds.len()),
                ("srq", dev.srqs.len()),
                ("ah", dev.ahs.len()),
            ]
            .iter()
            .map(|(k, n)| (format!("{dl},kind=\"{k}\""), u64::from(*n)))
            .collect(),
        },
        port(
            "vrdma_odp_faults_total",
            "ODP page requests (faults) sent to the guest (spec §10).",
            &AtomicU64::new(dev.mrs.odp_faults()),
        ),
        gauge(
            "vrdma_odp_resident_chunks",
            "ODP chunks currently resident.",
            dev.mrs.odp_resident_total() as u64,
        ),
        gauge(
            "vrdma_odp_pending_requests",
            "ODP page requests not yet answered.",
            dev.mrs.odp_pending_requests() as u64,
        ),
    ];
    type Get = fn(&QpStats) -> u64;
    let per_qp: [(&'static str, &'static str, Get); 10] = [
        (
            "vrdma_qp_tx_packets_total",
            "Packets sent by the QP.",
            |s| s.tx_packets,
        ),
        (
            "vrdma_qp_tx_bytes_total",
            "Bytes (whole frames) sent by the QP.",
            |s| s.tx_bytes,
        ),
        (
            "vrdma_qp_rx_packets_total",
            "Packets received for the QP.",
            |s| s.rx_packets,
        ),
        (
            "vrdma_qp_rx_bytes_total",
            "Bytes (whole frames) received for the QP.",
            |s| s.rx_bytes,
        ),
        (
            "vrdma_qp_retransmits_total",
            "Request packets sent again (go-back-N).",
            |s| s.retransmits,
        ),
        (
            "vrdma_qp_timeouts_total",
            "Retransmission timer expiries.",
            |s| s.timeouts,
        ),
        ("vrdma_qp_rnr_naks_rx_total", "RNR NAKs received.", |s| {
            s.rnr_naks_rx
        }),
        ("vrdma_qp_rnr_naks_tx_total", "RNR NAKs sent.", |s| {
            s.rnr_naks_tx
        }),
        (
            "vrdma_qp_seq_naks_rx_total",
            "PSN sequence error NAKs received.",
            |s| s.seq_naks_rx,
        ),
        (
            "vrdma_qp_seq_naks_tx_total",
            "PSN sequence error NAKs sent.",
            |s| s.seq_naks_tx,
        ),
    ];
    let mut qps: Vec<_> = dev
        .qps
        .iter()
        .map(|q| (q.qpn, qp_type_name(q.qp_type), q.stats))
        .collect();
    qps.sort_by_key(|q| q.0);
    for (name, help, get) in per_qp {
        families.push(Family {
            name,
            help,
            kind: "counter",
            samples: qps
                .iter()
                .map(|(qpn, t, s)| (format!("{dl},qpn=\"{qpn}\",type=\"{t}\""), get(s)))
                .collect(),
        });
    }
    Snapshot { families }
}

/// The device's counters in the Prometheus text format, labelled `device="<label>"`.
pub fn render(dev: &Device, label: &str) -> String {
    format(snapshot(dev, label))
}

fn format(snap: Snapshot) -> String {
    let mut out = String::new();
    for f in snap.families {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (labels, v) in f.samples {
            let _ = writeln!(out, "{}{{{labels}}} {v}", f.name);
        }
    }
    out
}

/// The stats socket next to a vhost-user socket: `PATH.stats`.
pub fn stats_socket_path(vhost_user_socket: &Path) -> PathBuf {
    let mut s = vhost_user_socket.as_os_str().to_owned();
    s.push(".stats");
    PathBuf::from(s)
}

/// The device label for a vhost-user socket path: its file name without extension
/// (`/run/vrdma/vrdma0.sock` -> `vrdma0`).
pub fn device_label(vhost_user_socket: &Path) -> String {
    vhost_user_socket
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "vrdma".to_string())
}

/// Read the counters from a stats socket (`path`, or `path.stats` when `path` is the
/// vhost-user socket).
pub fn fetch(path: &Path) -> Result<String, StatsError> {
    let target = if path.extension().is_some_and(|e| e == "stats") {
        path.to_path_buf()
    } else {
        stats_socket_path(path)
    };
    let err = |source| StatsError::Fetch {
        path: target.display().to_string(),
        source,
    };
    let mut s = UnixStream::connect(&target).map_err(err)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(err)?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(err)?;
    Ok(text)
}

/// The stats socket server: one thread answering each connection with [`render`] and closing
/// it. Dropping it stops the thread and removes the socket.
pub struct StatsServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl StatsServer {
    /// Bind `path` (replacing a stale socket) and serve `dev`'s counters labelled `label`.
    pub fn start(
        path: &Path,
        dev: Arc<Mutex<Device>>,
        label: String,
    ) -> Result<StatsServer, StatsError> {
        Self::start_with(path, dev, label, None)
    }

    /// [`StatsServer::start`], appending what `extra` renders (Prometheus text) to every
    /// answer: the daemon's fabric counters on a fabric daemon.
    pub fn start_with(
        path: &Path,
        dev: Arc<Mutex<Device>>,
        label: String,
        extra: Option<ExtraStats>,
    ) -> Result<StatsServer, StatsError> {
        let listen_err = |source| StatsError::Listen {
            path: path.display().to_string(),
            source,
        };
        {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(md) = std::fs::symlink_metadata(path) {
                if md.file_type().is_socket() {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let listener = UnixListener::bind(path).map_err(listen_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vrdma-stats".into())
            .spawn(move || serve(listener, &dev, &label, extra.as_deref(), &s2))
            .map_err(StatsError::Spawn)?;
        Ok(StatsServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// More counters for a stats answer (see [`StatsServer::start_with`]).
pub type ExtraStats = Arc<dyn Fn() -> String + Send + Sync>;

fn serve(
    listener: UnixListener,
    dev: &Mutex<Device>,
    label: &str,
    extra: Option<&(dyn Fn() -> String + Send + Sync)>,
    stop: &AtomicBool,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        // Copy under the lock, format outside it (the engine waits for the lock).
        let snap = {
            let d = dev.lock().unwrap_or_else(|p| p.into_inner());
            snapshot(&d, label)
        };
        let mut text = format(snap);
        if let Some(f) = extra {
            text.push_str(&f());
        }
        // A client that does not read must not hold the thread for long.
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = conn.write_all(text.as_bytes());
    }
}
