//! Memory regions (spec §12): the MR table, keys with variants, access checks, iova → guest-physical
//! translation, and on-demand paging (§10).

pub mod access;
pub mod advise;
pub mod fence;
pub mod mr;
pub mod mw;
pub mod odp;

pub use access::Access;
pub use mr::{FastReg, GuestRange, Mr, MrError, MrKind, MrTable};
pub use mw::{BindMw, Window};
pub use odp::OdpConfig;
