//! Protection domains.

use super::LockedTable;

/// A PD. Objects record their PD's handle; DESTROY_PD of a PD still referenced is BUSY.
#[derive(Debug, Clone, Default)]
pub struct Pd {
    pub pdn: u32,
}

/// CREATE_PD adds one beside the engine workers (`Device::handle_shared`).
pub type PdTable = LockedTable<Pd>;
