//! XRC domains (spec §13.7): a handle that groups XRC SRQs and XRC_TGT QPs. DEALLOC_XRCD of a
//! domain still referenced is BUSY.

use super::HandleTable;

#[derive(Debug, Clone, Default)]
pub struct Xrcd {
    pub xrcdn: u32,
}

pub type XrcdTable = HandleTable<Xrcd>;
