//! The daemon loop: listen on the socket, serve one frontend connection, reset, serve the next.
//!
//! The socket stays bound for the daemon's lifetime (a reconnecting QEMU always finds it). Each
//! connection gets a fresh `VhostUserDaemon` (new vrings and worker thread) over the same device;
//! when it ends, the device is reset, pending records dropped and the guest memory unmapped.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{error, info, warn};
use thiserror::Error;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;

use super::{
    DoorbellSink, FrameSink, GuestMemoryAtomic, GuestMemoryMmap, RdmaDevice, VhostUserRdma,
    VirtqOutput, CONFIG_SIZE,
};
use crate::handoff::HandoffLock;

/// Errors of the daemon loop: binding the socket ends start-up; the others end one accept,
/// which [`serve`] logs and retries.
#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        source: vhost::vhost_user::Error,
    },
    #[error("cannot set up the vhost-user handler: {0}")]
    NewDaemon(String),
    #[error("accepting a vhost-user connection failed: {0}")]
    Accept(String),
}

/// Everything a connection's backend is built from.
pub struct ServeParts<D: RdmaDevice> {
    pub device: Arc<HandoffLock<D>>,
    pub out: Arc<VirtqOutput>,
    pub doorbells: Arc<dyn DoorbellSink>,
    pub eth_tx: Arc<dyn FrameSink>,
    /// The 256-byte `vrdma_config` (§2.2).
    pub config: [u8; CONFIG_SIZE],
    /// `VIRTIO_RDMA_F_ODP` / `_ODP_IMPLICIT` masks to offer (from the device config).
    pub device_features: u64,
    pub mtu: u16,
    /// Accepts (or connection set-ups) that failed and were retried (spec §16.5).
    pub accept_failures: Arc<AtomicU64>,
}

/// Bind the vhost-user socket (replacing a stale one).
pub fn listen(path: &Path) -> Result<Listener, DaemonError> {
    Listener::new(path, true).map_err(|source| DaemonError::Listen {
        path: path.display().to_string(),
        source,
    })
}

/// [`listen`] with the socket's owner, group and mode set before it appears at `path` (spec
/// §16.5). With nothing asked this is [`listen`].
pub fn listen_with_access(
    path: &Path,
    access: crate::cli::access::SocketAccess,
) -> Result<Listener, DaemonError> {
    if access.is_default() {
        return listen(path);
    }
    super::socket_bind::bind_with_access(path, access)
        .map(Listener::from)
        .map_err(|e| DaemonError::Listen {
            path: path.display().to_string(),
            source: vhost::vhost_user::Error::SocketError(e),
        })
}

/// Serve connections on `listener` one after another; returns only after `max_connections`
/// (tests). A failed accept or connection set-up (EMFILE, ENFILE, ENOMEM, ...) is logged and
/// retried after [`ACCEPT_RETRY_DELAY`] (spec §16.5): it is a condition of the host or of one
/// frontend, never a reason to stop serving the device, let alone the daemon's other devices.
pub fn serve<D: RdmaDevice>(
    listener: &mut Listener,
    parts: &ServeParts<D>,
    max_connections: Option<usize>,
) -> Result<(), DaemonError> {
    let mut served = 0usize;
    loop {
        if matches!(max_connections, Some(m) if served >= m) {
            return Ok(());
        }
        match serve_one(listener, parts) {
            Ok(()) => served += 1,
            Err(e) => {
                parts.accept_failures.fetch_add(1, Ordering::Relaxed);
                error!(
                    "{}: {e}; retrying in {} ms",
                    parts.out.log().label(),
                    ACCEPT_RETRY_DELAY.as_millis()
                );
                std::thread::sleep(ACCEPT_RETRY_DELAY);
            }
        }
    }
}

/// How long the accept loop waits after a failed accept: long enough not to spin while the
/// process is out of descriptors, short enough that a frontend hardly notices.
pub const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

fn serve_one<D: RdmaDevice>(
    listener: &mut Listener,
    parts: &ServeParts<D>,
) -> Result<(), DaemonError> {
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    parts.device.lock().set_guest_memory(mem.clone());
    let backend = Arc::new(VhostUserRdma::new(parts, mem.clone()));
    let mut daemon = VhostUserDaemon::new("vrdma-vhost-user".to_string(), backend.clone(), mem)
        .map_err(|e| DaemonError::NewDaemon(e.to_string()))?;
    let started = daemon.start(listener);
    if let Err(e) = started {
        stop_workers(&daemon);
        return Err(DaemonError::Accept(e.to_string()));
    }
    let label = parts.out.log().label();
    info!("{label}: vhost-user frontend connected");
    match daemon.wait() {
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            VhostUserError::Disconnected | VhostUserError::PartialMessage,
        )) => info!("{label}: vhost-user frontend disconnected"),
        Err(e) => warn!("{label}: vhost-user connection ended: {e}"),
    }
    stop_workers(&daemon);
    parts.out.detach();
    backend.reset_state("frontend disconnected");
    // Unmap the old guest memory; the next connection brings its own table.
    parts
        .device
        .lock()
        .set_guest_memory(GuestMemoryAtomic::new(GuestMemoryMmap::new()));
    Ok(())
}

fn stop_workers<D: RdmaDevice>(daemon: &VhostUserDaemon<Arc<VhostUserRdma<D>>>) {
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
}
