//! Address handles (used by UD/GSI send WQEs through `wr.ud.ah_index`).

use vrdma_spec::VrdmaAv;

use super::HandleTable;

/// An AH: the address vector with its source GID resolved at creation.
#[derive(Debug, Clone)]
pub struct Ah {
    pub pd: u32,
    pub av: VrdmaAv,
    /// Source GID (from the GID table entry `av.sgid_index` at creation).
    pub sgid: [u8; 16],
}

pub type AhTable = HandleTable<Ah>;

impl HandleTable<Ah> {
    /// The AH `index` if it exists and belongs to `pd` (DESIGN.md: unknown or other-PD index →
    /// completion LOC_QP_OP_ERR, QP stays RTS for UD).
    pub fn lookup_in_pd(&self, index: u32, pd: u32) -> Option<&Ah> {
        self.get(index).filter(|a| a.pd == pd)
    }
}
