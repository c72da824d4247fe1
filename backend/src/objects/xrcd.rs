//! XRC domains (spec §13.7): a handle that groups XRC SRQs and XRC_TGT QPs. DEALLOC_XRCD of a
//! domain still referenced is BUSY.

use super::LockedTable;

#[derive(Debug, Clone, Default)]
pub struct Xrcd {
    pub xrcdn: u32,
}

/// ALLOC_XRCD adds one beside the engine workers (`Device::handle_shared`).
pub type XrcdTable = LockedTable<Xrcd>;
