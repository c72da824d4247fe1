//! `start_backend(config)`: build the device, its virtqueue outputs, the uplink and the engine,
//! then run the vhost-user daemon loop until the process is stopped.

use std::sync::{Arc, Mutex};

use log::{info, warn};
use thiserror::Error;
use vhost::vhost_user::Listener;

use super::daemon::{listen, serve, DaemonError, ServeParts};
use super::delay::CommandDelays;
use super::glue::{NoUplink, UplinkTx};
use super::{VirtqOutput, CONFIG_SIZE};
use crate::cli::Config;
use crate::device::{Device, DeviceConfig};
use crate::guest::GuestMem;
use crate::stats::{device_label, stats_socket_path, Metered, StatsServer};
use crate::transport::engine::{Engine, EngineError};
use crate::uplink::{Impaired, PcapError, PcapTee, PcapWriter, Uplink, UplinkError};

/// Errors of daemon start-up (each printed as one line by `main`).
#[derive(Debug, Error)]
pub enum StartError {
    #[error("cannot open uplink {spec}: {source}")]
    Uplink { spec: String, source: UplinkError },
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("config space is {0} bytes, expected {CONFIG_SIZE}")]
    ConfigSpace(usize),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error("--pcap: {0}")]
    Pcap(#[from] PcapError),
}

/// Open the uplink of `config`: the `--pcap` capture right on the uplink (so it records what is
/// really sent and received), the test-only impairment in front of it when asked.
pub fn open_uplink(config: &Config) -> Result<Arc<dyn Uplink>, StartError> {
    let raw: Box<dyn Uplink> = match &config.uplink {
        Some(spec) => {
            let u = spec
                .open_for_mtu(config.mtu)
                .map_err(|source| StartError::Uplink {
                    spec: spec.to_string(),
                    source,
                })?;
            info!("uplink {spec}");
            u
        }
        None => {
            info!("no --uplink: frames leaving the port are dropped");
            Box::new(NoUplink)
        }
    };
    let uplink: Box<dyn Uplink> = match &config.pcap {
        Some(path) => {
            let w = PcapWriter::create(path, config.pcap_max_bytes)?;
            info!("capturing the uplink's frames to {}", path.display());
            Box::new(PcapTee::new(raw, w))
        }
        None => raw,
    };
    Ok(match config.impair {
        Some(imp) => {
            info!(
                "uplink impaired (test only): drop={} dup={} reorder={} seed={}",
                imp.drop, imp.dup, imp.reorder, imp.seed
            );
            Arc::new(Impaired::new(uplink, imp))
        }
        None => Arc::from(uplink),
    })
}

/// A daemon ready to serve: the bound socket, the per-connection parts and the running engine.
pub struct Prepared {
    pub listener: Listener,
    pub parts: ServeParts<Device>,
    pub engine: Engine,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Build the device, outputs, uplink and engine for `config` and bind the socket.
pub fn prepare(config: &Config) -> Result<Prepared, StartError> {
    let dev_config = DeviceConfig::from_cli(config);
    let config_bytes = dev_config.config_space();
    let config_space: [u8; CONFIG_SIZE] = config_bytes
        .as_slice()
        .try_into()
        .map_err(|_| StartError::ConfigSpace(config_bytes.len()))?;
    let device_features = dev_config.odp_feature_bits();
    let limits = &config.limits;
    let event_backlog = (limits.max_qp as usize)
        .saturating_add(limits.max_cq as usize)
        .saturating_add(limits.max_srq as usize)
        .saturating_add(64);
    let out = Arc::new(VirtqOutput::new(event_backlog));
    if let Some(spec) = &config.delay_commands {
        warn!("control command responses delayed (test only): {spec:?}");
        out.parked().set_delays(CommandDelays::new(spec));
    }
    let device = Arc::new(Mutex::new(Device::new(
        dev_config,
        GuestMem::empty(),
        out.clone(),
    )));

    // The socket appears last: launchers start QEMU once it exists, so every other start-up
    // error (uplink bind, TAP open) happens before.
    let port_stats = lock(&device).port_stats.clone();
    let uplink: Arc<dyn Uplink> = Arc::new(Metered::new(open_uplink(config)?, port_stats));
    let engine = Engine::start(device.clone(), uplink.clone())?;
    let listener = listen(&config.socket_path)?;
    let parts = ServeParts {
        device,
        out,
        doorbells: Arc::new(engine.sender()),
        eth_tx: Arc::new(UplinkTx(uplink)),
        config: config_space,
        device_features,
        mtu: config.mtu,
    };
    Ok(Prepared {
        listener,
        parts,
        engine,
    })
}

/// Run the daemon described by `config` until the process is stopped (SIGINT/SIGTERM are
/// handled by `main`). Returns only on a start-up error or a fatal listener error.
pub fn start_backend(config: Config) -> Result<(), StartError> {
    let Prepared {
        mut listener,
        parts,
        engine,
    } = prepare(&config)?;
    // The counters are for operators: a daemon that cannot offer them still serves the guest
    // (e.g. a --socket-path whose ".stats" sibling passes the 107-byte unix path limit).
    let stats_path = stats_socket_path(&config.socket_path);
    let stats = match StatsServer::start(
        &stats_path,
        parts.device.clone(),
        device_label(&config.socket_path),
    ) {
        Ok(s) => {
            info!("counters on {}", stats_path.display());
            Some(s)
        }
        Err(e) => {
            warn!("no counters socket: {e}");
            None
        }
    };
    info!(
        "listening on {} (mac {}, mtu {}, odp {})",
        config.socket_path.display(),
        config
            .mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
        config.mtu,
        if config.odp.enabled { "on" } else { "off" },
    );
    let r = serve(&mut listener, &parts, None);
    drop(stats);
    engine.stop();
    if r.is_err() {
        let _ = std::fs::remove_file(&config.socket_path);
    }
    r.map_err(StartError::from)
}
