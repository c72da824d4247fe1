//! `start_backend(config)`: build the device, its outputs, the uplink and the engine, then run
//! the vhost-user daemon loop until the process is told to stop.

use std::sync::{Arc, Mutex};

use log::info;
use thiserror::Error;

use super::daemon::{listen, serve, DaemonError, ServeParts};
use super::{NullSink, RdmaDevice, VirtqOutput, CONFIG_SIZE};
use crate::cli::{Config, UplinkChoice};
use vrdma_spec::{Abi, VrdmaConfig};

/// Errors of daemon start-up (each printed as one line by `main`).
#[derive(Debug, Error)]
pub enum StartError {
    #[error("uplink {spec}: {reason}")]
    Uplink { spec: String, reason: String },
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

/// Placeholder device until `device::Device` is wired: every command is NOT_SUPPORTED.
#[derive(Debug, Default)]
pub struct PlaceholderDevice;

impl RdmaDevice for PlaceholderDevice {
    fn handle_command(&mut self, _opcode: u16, _req: &[u8], _resp: &mut Vec<u8>) -> u32 {
        vrdma_spec::VRDMA_STATUS_NOT_SUPPORTED
    }
    fn reset(&mut self) {}
    fn set_guest_memory(&mut self, _mem: super::GuestMemoryAtomic) {}
}

/// `struct vrdma_config` for `config` (§2.2). Placeholder until `device::DeviceConfig` serves it.
pub fn config_space(config: &Config) -> [u8; CONFIG_SIZE] {
    let c = VrdmaConfig {
        mac: config.mac,
        mtu: config.mtu,
        max_pd: config.limits.max_pd,
        max_qp: config.limits.max_qp,
        max_cq: config.limits.max_cq,
        max_srq: config.limits.max_srq,
        max_mr: config.limits.max_mr,
        max_ah: config.limits.max_ah,
        odp_chunk_shift: config.odp.chunk_shift,
        ..VrdmaConfig::ZERO
    };
    let mut out = [0u8; CONFIG_SIZE];
    out.copy_from_slice(c.as_bytes());
    out
}

/// Run the daemon described by `config` until the process is stopped (SIGINT/SIGTERM are
/// handled by `main`).
pub fn start_backend(config: Config) -> Result<(), StartError> {
    if let UplinkChoice::Spec(spec) = &config.uplink {
        return Err(StartError::Uplink {
            spec: spec.clone(),
            reason: "uplinks are not wired in this build yet".to_string(),
        });
    }
    let limits = &config.limits;
    let event_backlog = (limits.max_qp as usize)
        .saturating_add(limits.max_cq as usize)
        .saturating_add(limits.max_srq as usize)
        .saturating_add(64);
    let out = Arc::new(VirtqOutput::new(event_backlog));
    let parts = ServeParts {
        device: Arc::new(Mutex::new(PlaceholderDevice)),
        out,
        doorbells: Arc::new(NullSink),
        eth_tx: Arc::new(NullSink),
        config: config_space(&config),
        odp: config.odp.enabled,
        mtu: config.mtu,
    };
    let mut listener = listen(&config.socket_path)?;
    info!(
        "listening on {} (mac {})",
        config.socket_path.display(),
        config
            .mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    );
    serve(&mut listener, &parts, None)?;
    Ok(())
}
