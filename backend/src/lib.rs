//! vrdma-backend: the vhost-user daemon and RoCEv2 engine behind the vrdma virtio device (ID 42).
//!
//! See `backend/ARCHITECTURE.md` for the module map and `device-spec/virtio-rdma.md` for the
//! normative device behaviour; comments cite its sections as §N.

// First: its `guest_*!` macros are used by every module below (textual macro scope).
#[macro_use]
pub mod devlog;
pub mod budget;
pub mod cli;
pub mod device;
pub mod exporter;
pub mod fabric;
pub mod fasthash;
pub mod guest;
pub mod handoff;
pub mod ids;
pub mod memory;
pub mod objects;
pub mod port;
pub mod qp;
pub mod stats;
pub mod sync;
pub mod tables;
pub mod transport;
pub mod uplink;
pub mod vhost_user;
pub mod wire;
