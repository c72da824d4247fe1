//! `start_backend(config)`: build the device, its virtqueue outputs, the uplink and the engine,
//! then run the vhost-user daemon loop until the process is stopped.

use std::sync::{Arc, Mutex};

use log::info;
use thiserror::Error;
use vhost::vhost_user::Listener;

use super::daemon::{listen, serve, DaemonError, ServeParts};
use super::glue::{NoUplink, UplinkTx};
use super::{VirtqOutput, CONFIG_SIZE};
use crate::cli::Config;
use crate::device::{Device, DeviceConfig};
use crate::guest::GuestMem;
use crate::transport::engine::{Engine, EngineError};
use crate::uplink::{Impaired, Uplink, UplinkError};

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
}

/// Open the uplink of `config` (with the test-only impairment when asked).
pub fn open_uplink(config: &Config) -> Result<Arc<dyn Uplink>, StartError> {
    let Some(spec) = &config.uplink else {
        info!("no --uplink: frames leaving the port are dropped");
        return Ok(Arc::new(NoUplink));
    };
    let uplink = spec
        .open_for_mtu(config.mtu)
        .map_err(|source| StartError::Uplink {
            spec: spec.to_string(),
            source,
        })?;
    info!("uplink {spec}");
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
    let device = Arc::new(Mutex::new(Device::new(
        dev_config,
        GuestMem::empty(),
        out.clone(),
    )));

    // The socket appears last: launchers start QEMU once it exists, so every other start-up
    // error (uplink bind, TAP open) happens before.
    let uplink = open_uplink(config)?;
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
    engine.stop();
    if r.is_err() {
        let _ = std::fs::remove_file(&config.socket_path);
    }
    r.map_err(StartError::from)
}
