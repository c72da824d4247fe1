//! The device model (spec §2, §5, §11): every object table, guest memory and the outputs.
//!
//! `Device` is the façade both threads lock: the vhost-user thread runs control commands
//! (`handle_command`), the engine thread runs the transport on it. It is
//! `tables::DeviceTables<Rocev2>`: the tables and the rules that span them are defined below the
//! transport (`tables/`), the command handlers and migration state here, above it. Nothing in
//! here blocks.
//!
//! # For `vhost_user/` and `main`
//! - `Device::new(DeviceConfig, GuestMem::empty(), out)`; `DeviceConfig` carries the CLI limits,
//!   MAC, MTU and ODP settings (`config.odp.enabled/implicit` decide the ODP caps in the config
//!   space and `DeviceConfig::odp_feature_bits()`).
//! - `handle_command(opcode, req, resp)`: `req` = bytes after `vrdma_cmd_hdr`; returns
//!   `CmdOutcome::Done(VRDMA_STATUS_*)` with `resp` = response body (empty on error), or
//!   `CmdOutcome::Parked(ticket)` (ADVISE_MR + F_FLUSH): keep the chain until
//!   `DeviceOutput::command_done(ticket, status)` (see `guest/outcome.rs`).
//! - `set_guest_memory(&atomic)` on every SET_MEM_TABLE; `reset()` on device reset;
//!   `config_space()` = the 256 config bytes; `set_output()` if the output sink changes.
//!
//! # For `transport/`
//! Nothing: the engine works on `tables::DeviceTables` (see `tables/mod.rs`).

pub mod commands;
pub mod snapshot;

// Part of `Device`'s own signatures (`handle_command`, `Device::new`), so its users need not know
// that they are defined in `guest/` (the layer memory/ and objects/ also report through) or in
// `tables/`.
pub use crate::guest::outcome::{CmdOutcome, Ticket};
pub use crate::guest::output::{DeviceOutput, NullOutput, RecordingOutput};
pub use crate::tables::config;
pub use crate::tables::{DeviceConfig, FlushHook, PARKED_RESERVE};
pub use crate::transport::Rocev2;

/// The device: its tables run by the RoCEv2 engine.
pub type Device = crate::tables::DeviceTables<Rocev2>;

/// A QP of this device.
pub type Qp = crate::qp::Qp<Rocev2>;

// The vhost-user thread and the engine thread share the device behind a mutex.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Device>();
};
