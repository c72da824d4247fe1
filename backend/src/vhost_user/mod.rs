//! The vhost-user face of the vrdma device (spec §3): a [`VhostUserBackend`] serving the six
//! virtqueues, the 256-byte config space and the guest memory table, plus the daemon loop that
//! accepts one QEMU connection after another.
//!
//! - `backend.rs`: [`VhostUserRdma`], the `VhostUserBackend` impl (features, config space,
//!   memory table, queue dispatch, reset).
//! - `controlq.rs`: control chains -> [`RdmaDevice::handle_command`] -> response (§11).
//! - `parked.rs`: control chains of commands the device completes later (ADVISE_MR + F_FLUSH).
//! - `output.rs`: [`VirtqOutput`], device -> driver records on the event, pagereq and eth rx
//!   queues, queued internally while the driver has posted no buffer.
//! - `inputq.rs`: doorbell records -> [`DoorbellSink`], eth tx frames -> [`FrameSink`].
//! - `glue.rs`: the traits above implemented by `device::Device`, the engine and the uplink.
//! - `daemon.rs`: the accept loop ([`serve`]); `start.rs`: [`start_backend`] (one device) and [`start_daemon`] (one device or a fabric of them) wiring.
//!
//! # Operation (what a launcher can rely on)
//! - `vrdma-backend --socket-path S --mac M [--uplink udp:local=A:P,remote=A:P | tap:NAME]`.
//!   The uplink is opened and the engine started first; the socket `S` appears last, so once it
//!   exists the daemon is ready (QEMU may connect). A stale socket at `S` is replaced; any other
//!   file there is an error. Start-up errors: one line on stderr, exit status 1, no socket left.
//! - One frontend connection at a time; after it ends (QEMU exit or crash) the device is reset,
//!   the guest memory unmapped and the daemon accepts the next connection on the same socket
//!   (QEMU `-chardev socket,...,reconnect-ms=N` works). A second QEMU connecting meanwhile waits.
//! - The device is also reset when the frontend stops the control queue (GET_VRING_BASE on
//!   queue 0, which QEMU sends on a guest virtio reset, driver unbind or VM reboot) and on
//!   RESET_DEVICE: every RDMA object is destroyed and pending events/page requests/frames are
//!   dropped. Pausing the VM (`stop`/`cont`) also stops the rings, so it resets the device too;
//!   only while a migration logs dirty pages (VHOST_F_LOG_ALL) does the stop suspend it (§17.1).
//! - SIGINT/SIGTERM: the socket is removed and the process exits with status 0.
//! - Logs: env_logger on stderr (or `--log-file`), `RUST_LOG` (default `info`): one line per
//!   connect/disconnect/reset, each starting with the device label; guest-triggered lines
//!   (here and on the device's engine threads) name their device and are rate-limited per
//!   device (`devlog.rs`); `debug` logs each control command, under the device's debug limit.
//!
//! Lock order (the whole of it: ARCHITECTURE.md "Locks"): memory swap lock (a queue event
//! holds it, spec §16.5) -> device lock -> output queue / parked-chain mutex -> vring lock; the
//! checked-table record (`region_check.rs`) is a leaf. Nothing here takes the device lock while holding a vring
//! lock, and no vhost-user thread waits for the network or a timer.
//!
//! [`VhostUserBackend`]: vhost_user_backend::VhostUserBackend

mod backend;
pub mod backlog;
pub mod chain;
pub mod controlq;
pub mod daemon;
pub mod delay;
mod exit_events;
pub mod fd_limit;
mod glue;
pub mod inputq;
pub mod output;
pub mod parked;
pub mod region_check;
pub mod socket_bind;
mod start;
pub mod state_pipe;

use std::io;

use thiserror::Error;
use vhost_user_backend::VringRwLock;
use vrdma_spec::{self as spec, Abi};

pub use crate::guest::{CmdOutcome, Ticket};
pub use backend::VhostUserRdma;
pub use daemon::{serve, DaemonError, ServeParts};
pub use glue::DOORBELL_FENCE_LIMIT;
pub use output::VirtqOutput;
pub use start::{
    open_uplink, prepare, prepare_fabric, prepare_with_uplink, start_backend, start_daemon,
    Prepared, PreparedFabric, StartError,
};

/// Guest memory as mapped from the vhost-user memory table (one type with `guest::GuestMemoryMap`,
/// whose regions carry the dirty-page log `guest::DirtyBitmap`).
pub type GuestMemoryMmap = crate::guest::GuestMemoryMap;
/// The swappable guest memory shared by the vrings and the device (SET_MEM_TABLE, ADD_MEM_REG
/// and REM_MEM_REG replace its contents).
pub type GuestMemoryAtomic = vm_memory::GuestMemoryAtomic<GuestMemoryMmap>;
/// One virtqueue as handed out by vhost-user-backend (Send + Sync, usable from any thread).
pub type Vring = VringRwLock<GuestMemoryAtomic>;

/// Virtqueue indices (spec §3, `VRDMA_VQ_*`).
pub const VQ_CONTROL: u16 = spec::VRDMA_VQ_CONTROL;
pub const VQ_EVENT: u16 = spec::VRDMA_VQ_EVENT;
pub const VQ_DOORBELL: u16 = spec::VRDMA_VQ_DOORBELL;
pub const VQ_PAGEREQ: u16 = spec::VRDMA_VQ_PAGEREQ;
pub const VQ_ETH_RX: u16 = spec::VRDMA_VQ_ETH_RX;
pub const VQ_ETH_TX: u16 = spec::VRDMA_VQ_ETH_TX;
/// Number of virtqueues (`VRDMA_NUM_VQS`).
pub const NUM_QUEUES: usize = spec::VRDMA_NUM_VQS as usize;
/// Largest virtqueue size offered to the frontend.
pub const MAX_QUEUE_SIZE: usize = 1024;
/// Size of `struct vrdma_config` (§2.2).
pub const CONFIG_SIZE: usize = <spec::VrdmaConfig as Abi>::SIZE;

/// Device feature masks (spec §2, `VIRTIO_RDMA_F_*` are bit numbers).
pub const VIRTIO_RDMA_F_ODP: u64 = 1 << spec::VIRTIO_RDMA_F_ODP;
pub const VIRTIO_RDMA_F_ODP_IMPLICIT: u64 = 1 << spec::VIRTIO_RDMA_F_ODP_IMPLICIT;
pub const VIRTIO_RDMA_F_ETH: u64 = 1 << spec::VIRTIO_RDMA_F_ETH;

/// What the virtqueue plumbing needs from the device model. `device::Device` implements it;
/// tests may substitute a mock. All calls happen under the device mutex.
pub trait RdmaDevice: Send + Sync + 'static {
    /// Execute one control command (§11). `req` is the readable part after the 8-byte
    /// `vrdma_cmd_hdr`; the response body (without `vrdma_cmd_resp_hdr`) is appended to `resp`.
    /// Returns `Done(VRDMA_STATUS_*)`, or `Parked(ticket)`: the control queue keeps the chain in
    /// the output's `ParkedCommands` until the device reports `command_done(ticket, status)`.
    fn handle_command(&mut self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> CmdOutcome;
    /// Execute a command that runs on the device shared with the engine (a query, or a
    /// change of one object under its own lock: it never waits for other QPs' data path);
    /// `None` if `opcode` needs [`RdmaDevice::handle_command`] on the exclusive device.
    fn handle_shared(&self, _opcode: u16, _req: &[u8], _resp: &mut Vec<u8>) -> Option<u32> {
        None
    }
    /// [`RdmaDevice::handle_shared`] for a caller that can park the command's chain: it also
    /// runs the commands that may park (ADVISE_MR with F_FLUSH) beside the engine. The caller
    /// opens a `ParkedCommands::window` before it calls, since the completion may come from
    /// an engine worker before the chain is parked.
    fn handle_shared_parking(
        &self,
        opcode: u16,
        req: &[u8],
        resp: &mut Vec<u8>,
    ) -> Option<CmdOutcome> {
        self.handle_shared(opcode, req, resp).map(CmdOutcome::Done)
    }
    /// Back to the power-on state: every object destroyed, engine state for them dropped.
    fn reset(&mut self);
    /// The frontend installed a new memory table (the atomic is the one the vrings use).
    fn set_guest_memory(&mut self, mem: GuestMemoryAtomic);
    /// The device's host-memory budget, if it has one: the control queue charges the chains
    /// it gathers to it (spec §16).
    fn budget(&self) -> Option<crate::budget::Budget> {
        None
    }
    /// Migration (spec §17.1): stop touching guest memory and the network, keeping every object
    /// (the frontend stopped the device while logging dirty pages). Undone by [`Self::resume`].
    fn suspend(&mut self) {}
    /// Leave the suspension (the frontend started the device again: migration failed on the
    /// source, or the destination runs).
    fn resume(&mut self) {}
    /// Whether the device is suspended.
    fn suspended(&self) -> bool {
        false
    }
    /// The device state stream of spec §17.3 (the device is suspended).
    fn save_state(&mut self) -> Result<Vec<u8>, String> {
        Err("this device does not migrate".into())
    }
    /// Replace the device's state by the stream (untrusted); the device stays suspended until
    /// resumed. On error the device is at power-on state.
    fn load_state(&mut self, _state: &[u8]) -> Result<(), String> {
        Err("this device does not migrate".into())
    }
}

/// Where doorbell records (§8) go: the engine thread. Must not block.
pub trait DoorbellSink: Send + Sync {
    /// One `vrdma_doorbell` record (`type_` is `VRDMA_DB_*`, `id` a qpn, srqn or cqn).
    fn doorbell(&self, db: spec::VrdmaDoorbell);
    /// The records of one doorbell buffer, in order (one wake-up for all of them).
    fn doorbells(&self, dbs: &[spec::VrdmaDoorbell]) {
        for db in dbs {
            self.doorbell(*db);
        }
    }
    /// Control commands ran (they may have unblocked work, e.g. ODP_PAGE_RESP, MODIFY_QP).
    fn kick(&self) {}
    /// Before a command that ends or changes what posted WQEs name (spec §8): wait, bounded,
    /// until the records given so far have been run. Called without the device lock.
    fn fence(&self) {}
}

/// Where the guest's eth tx frames go: the uplink. Must not block.
pub trait FrameSink: Send + Sync {
    /// Send one raw Ethernet frame (no virtio-net header).
    fn send_frame(&self, frame: &[u8]) -> io::Result<()>;
}

/// A [`FrameSink`] / [`DoorbellSink`] that drops everything (no uplink, no engine).
#[derive(Debug, Default)]
pub struct NullSink;

impl FrameSink for NullSink {
    fn send_frame(&self, _frame: &[u8]) -> io::Result<()> {
        Ok(())
    }
}

impl DoorbellSink for NullSink {
    fn doorbell(&self, _db: spec::VrdmaDoorbell) {}
}

pub use crate::devlog::LogLimit;

/// Errors of the virtqueue plumbing. Converted to `io::Error` only at the vhost-user trait
/// boundary; most are logged and the offending chain returned, never a panic.
#[derive(Debug, Error)]
pub enum VhostUserRdmaError {
    #[error("queue {0}: reading the available ring failed: {1}")]
    AvailRing(u16, virtio_queue::Error),
    #[error("queue {0}: adding a used element failed: {1}")]
    AddUsed(u16, virtio_queue::Error),
    #[error("queue {0}: notification state update failed: {1}")]
    Notification(u16, virtio_queue::Error),
    #[error("queue {0}: signalling the frontend failed: {1}")]
    Signal(u16, io::Error),
    #[error("event {0} is not a queue of this device")]
    UnknownEvent(u16),
}

impl From<VhostUserRdmaError> for io::Error {
    fn from(e: VhostUserRdmaError) -> Self {
        io::Error::other(e)
    }
}

#[cfg(test)]
mod tests {
    use super::LogLimit;

    #[test]
    fn log_limit_lets_through_the_first_16_then_one_in_1024() {
        let l = LogLimit::new();
        let allowed: Vec<u64> = (0..5000u64).filter(|_| l.allow()).collect();
        let mut expect: Vec<u64> = (0..16).collect();
        expect.extend([1024, 2048, 3072, 4096]);
        assert_eq!(allowed, expect);
    }
}
