//! The guest as the device sees it: its memory (`memory.rs`), the rings in it (`ring.rs`, spec §4)
//! and what the device sends it besides command responses (`output.rs`: events, page requests,
//! eth rx frames, late completions of parked commands; `outcome.rs`: a command's status or ticket).
//! Everything above `wire/` may use this layer; it uses none of the others.

pub mod dirty_log;
pub mod log_guard;
pub mod memory;
pub mod outcome;
pub mod output;
pub mod ring;

pub use memory::{DirtyBitmap, GuestMem, GuestMemError, GuestMemoryMap};
pub use outcome::{CmdOutcome, Ticket};
pub use output::{DeviceOutput, NullOutput, RecordingOutput};
pub use ring::{Ring, RingError};
