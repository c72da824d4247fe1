//! One access to registered memory (spec §12.3): which key, on behalf of which PD, which bytes
//! of the key's address space, with which rights. Every check and translation of the MR table
//! takes one, so the five values travel together from the WQE or the RETH to the table.

use super::mr::ACCESS_WRITES;

/// An access of `[iova, iova + len)` through `key` by a QP or command of PD `pd`, needing
/// `rights` (`VRDMA_ACCESS_*` bits: none for a local read, `LOCAL_WRITE` for a local write,
/// `REMOTE_*` for an incoming request). `len == 0` checks key, PD and rights only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The lkey or rkey named (an MR's, or a window's for a remote access).
    pub key: u32,
    /// The PD of the QP (or of the XRC SRQ, spec §13.7) making the access.
    pub pd: u32,
    /// First byte, in the key's address space (an iova; a GPA for a DMA MR).
    pub iova: u64,
    pub len: u64,
    /// `VRDMA_ACCESS_*` bits the access needs.
    pub rights: u32,
}

impl Access {
    /// Whether the access writes into the memory (ODP then needs writable pages).
    pub fn writes(&self) -> bool {
        self.rights & ACCESS_WRITES != 0
    }
}
