//! The counters as an operator reads them.
//!
//! - [`render`]: the Prometheus text exposition format (version 0.0.4) of `stats::PortStats` and
//!   every QP's `stats::QpStats`, plus the live object counts and ODP figures of the device.
//! - [`StatsServer`]: serves [`render`]'s text to every client of a unix socket,
//!   `<vhost-user socket>.stats` in the daemon ([`stats_socket_path`]); `vrdma-backend stats
//!   --socket PATH` ([`fetch`]) prints it. Anyone who can connect can read the counters, so the
//!   socket gets the owner, group and mode of the device's vhost-user socket (spec §16.5). A
//!   device's answer holds that device's counters only; a fabric daemon's per-port counters
//!   are on the operator socket (`--stats-socket`, [`StatsServer::start_text`]).
//!
//! It reads the whole `Device` (under the shared device lock), so it sits above `device/`; the counters
//! themselves are in `stats.rs`, low enough for `qp/` and `transport/` to own them.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::device::Device;
use crate::handoff::HandoffLock;
use crate::qp::QpType;
use crate::stats::QpStats;

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
    // One MR-table lock for all its figures (a guard in the list below would live until the
    // end of the statement, and a second lock of the table would wait for it forever).
    let (mr_count, odp_faults, odp_resident, odp_pending) = {
        let mrs = dev.mrs.read();
        (
            mrs.len(),
            mrs.odp_faults(),
            mrs.odp_resident_total(),
            mrs.odp_pending_requests(),
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
            "vrdma_port_rx_by_reference_packets_total",
            "Received RC WRITE packets whose payload was copied straight from the sending \
             guest's memory (fabric, --payload-refs).",
            &p.rx_by_reference,
        ),
        port(
            "vrdma_port_loopback_frames_total",
            "RoCEv2 frames between QPs of this device (not on the uplink).",
            &p.loopback_frames,
        ),
        port(
            "vrdma_port_worker_handoff_frames_total",
            "RoCEv2 frames one engine worker routed to the worker of their QP (--engine-threads).",
            &p.routed_to_worker,
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
                drop("stale_ref", &p.drop_stale_ref),
                drop("tx_busy", &p.drop_tx_busy),
                drop("worker_busy", &p.drop_worker_busy),
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
                ("mr", mr_count),
                ("pd", dev.pds.len()),
                ("srq", dev.srqs.len()),
                ("ah", dev.ahs.read().len()),
            ]
            .iter()
            .map(|(k, n)| (format!("{dl},kind=\"{k}\""), u64::from(*n)))
            .collect(),
        },
        port(
            "vrdma_odp_faults_total",
            "ODP page requests (faults) sent to the guest (spec §10).",
            &AtomicU64::new(odp_faults),
        ),
        gauge(
            "vrdma_odp_resident_chunks",
            "ODP chunks currently resident.",
            odp_resident as u64,
        ),
        gauge(
            "vrdma_odp_pending_requests",
            "ODP page requests not yet answered.",
            odp_pending as u64,
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
        dev: Arc<HandoffLock<Device>>,
        label: String,
    ) -> Result<StatsServer, StatsError> {
        Self::start_with(path, dev, label, None)
    }

    /// [`StatsServer::start`], appending what `extra` renders (Prometheus text) to every
    /// answer: the daemon's fabric counters on a fabric daemon.
    pub fn start_with(
        path: &Path,
        dev: Arc<HandoffLock<Device>>,
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
        Self::start_on(listener, path, dev, label, extra)
    }

    /// [`StatsServer::start_with`] on a socket already bound at `path` (by the daemon, with
    /// the owner, group and mode of spec §16.5).
    pub fn start_on(
        listener: UnixListener,
        path: &Path,
        dev: Arc<HandoffLock<Device>>,
        label: String,
        extra: Option<ExtraStats>,
    ) -> Result<StatsServer, StatsError> {
        // Copy under the shared device lock, format outside it: the exporter never takes the
        // lock exclusively, so it neither stalls the engine workers nor waits for their
        // hand-off (spec §16.5); the per-object locks it reads through are the workers' own.
        let render = move || {
            let snap = {
                let d = dev.read();
                snapshot(&d, &label)
            };
            let mut text = format(snap);
            if let Some(f) = &extra {
                text.push_str(&f());
            }
            text
        };
        Self::start_text(listener, path, Arc::new(render))
    }

    /// Serve what `render` returns on a socket already bound at `path` (the daemon's operator
    /// socket, `--stats-socket`: the fabric-wide counters).
    pub fn start_text(
        listener: UnixListener,
        path: &Path,
        render: ExtraStats,
    ) -> Result<StatsServer, StatsError> {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vrdma-stats".into())
            .spawn(move || serve(listener, &*render, &s2))
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

fn serve(listener: UnixListener, render: &(dyn Fn() -> String + Send + Sync), stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        let text = render();
        // A client that does not read must not hold the thread for long.
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = conn.write_all(text.as_bytes());
    }
}
