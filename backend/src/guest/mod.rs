//! Guest memory access and rings in guest memory (spec §4).

pub mod memory;
pub mod ring;

pub use memory::{GuestMem, GuestMemError, GuestMemoryMap};
pub use ring::{Ring, RingError};
