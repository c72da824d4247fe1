//! Protection domains.

use super::HandleTable;

/// A PD. Objects record their PD's handle; DESTROY_PD of a PD still referenced is BUSY.
#[derive(Debug, Clone, Default)]
pub struct Pd {
    pub pdn: u32,
}

pub type PdTable = HandleTable<Pd>;
