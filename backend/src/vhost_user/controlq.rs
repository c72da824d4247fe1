//! Control queue (spec §11, DESIGN.md "Control queue"): one command per descriptor chain.
//!
//! Readable part = `vrdma_cmd_hdr` + request struct + trailing array, read as one byte stream
//! (any split, indirect allowed, at most [`MAX_REQUEST_BYTES`]). Writable part =
//! `vrdma_cmd_resp_hdr` + response struct. Outcomes for bad chains:
//! - writable part shorter than the 8-byte response header (or not in guest memory): the chain
//!   is returned with `len` 0 and the command is not executed;
//! - readable part unreadable, too large, shorter than `vrdma_cmd_hdr`, or `flags` != 0: status
//!   INVALID, not executed;
//! - writable part too small for the opcode's response struct: status INVALID, not executed
//!   (so no object is created whose handle the driver could not learn);
//! - otherwise the device executes it and the response is written; `len` = bytes written.

use std::sync::Mutex;

use log::{debug, warn};
use vm_memory::GuestMemory;

use super::chain::SplitChain;
use super::RdmaDevice;

/// Upper bound for a command's readable part (page lists can be large: 64 MiB of `__le64`
/// entries describe 32 GiB of 4 KiB pages).
pub const MAX_REQUEST_BYTES: usize = 64 << 20;
/// `sizeof(struct vrdma_cmd_hdr)`.
pub const CMD_HDR_LEN: usize = 8;
/// `sizeof(struct vrdma_cmd_resp_hdr)`.
pub const RESP_HDR_LEN: usize = 8;

/// `VRDMA_STATUS_OK`.
pub const STATUS_OK: u32 = 0;
/// `VRDMA_STATUS_INVALID`.
pub const STATUS_INVALID: u32 = 1;

/// Size of the response body (after `vrdma_cmd_resp_hdr`) for a known opcode, from the ABI
/// (§11): `None` for opcodes this table does not know (the device decides, usually INVALID).
pub fn resp_body_len(opcode: u16) -> Option<usize> {
    const HANDLE: usize = 8; // struct vrdma_handle / vrdma_resp_create_qp / vrdma_resp_reg_mr
    const CONFIG: usize = 256; // struct vrdma_config (QUERY_DEVICE)
    const QUERY_PORT: usize = 32; // struct vrdma_resp_query_port
    const QP_ATTR: usize = 104; // struct vrdma_qp_attr (QUERY_QP)
    const QUERY_SRQ: usize = 16; // struct vrdma_resp_query_srq
    Some(match opcode {
        1 => CONFIG,                    // QUERY_DEVICE
        2 => QUERY_PORT,                // QUERY_PORT
        3 | 4 => 0,                     // ADD_GID, DEL_GID
        5 => HANDLE,                    // CREATE_PD
        6 | 8 | 13 | 17 | 19 | 25 => 0, // DESTROY_PD/CQ/QP/SRQ/AH, DEREG_MR
        7 | 9 => HANDLE,                // CREATE_CQ, RESIZE_CQ
        10 => HANDLE,                   // CREATE_QP
        11 | 15 => 0,                   // MODIFY_QP, MODIFY_SRQ
        12 => QP_ATTR,                  // QUERY_QP
        14 => HANDLE,                   // CREATE_SRQ
        16 => QUERY_SRQ,                // QUERY_SRQ
        18 => HANDLE,                   // CREATE_AH
        20..=24 => HANDLE, // REG_MR, REG_DMA_MR, ALLOC_FAST_REG_MR, REG_ODP_MR, REG_IMPLICIT_MR
        26..=28 => 0,      // ADVISE_MR, ODP_PAGE_RESP, ODP_INVALIDATE
        _ => return None,
    })
}

/// Execute the command in `chain` (if it is well formed) and write the response. Returns the
/// `len` for the used ring.
pub fn run_command<D: RdmaDevice, M: GuestMemory>(
    device: &Mutex<D>,
    mem: &M,
    chain: &SplitChain,
) -> u32 {
    let cap = chain.writable_len();
    if cap < RESP_HDR_LEN as u64 {
        warn!(
            "controlq: chain {} has {cap} writable bytes, less than the response header; \
             returned unexecuted",
            chain.head
        );
        return 0;
    }
    let mut body = Vec::new();
    let status = execute(device, chain, cap, &mut body);
    let mut out = Vec::with_capacity(RESP_HDR_LEN + body.len());
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&body);
    match chain.scatter(mem, &out) {
        Ok(n) => n as u32,
        Err(e) => {
            warn!("controlq: chain {}: response not written: {e}", chain.head);
            0
        }
    }
}

/// Decode and execute; leaves the response body in `body` (empty unless OK or the device gave
/// one) and guarantees `RESP_HDR_LEN + body.len() <= cap`.
fn execute<D: RdmaDevice>(
    device: &Mutex<D>,
    chain: &SplitChain,
    cap: u64,
    body: &mut Vec<u8>,
) -> u32 {
    if let Some(e) = &chain.read_error {
        warn!("controlq: chain {}: {e}", chain.head);
        return STATUS_INVALID;
    }
    let req = &chain.readable;
    let Some(hdr) = req.get(..CMD_HDR_LEN) else {
        warn!(
            "controlq: chain {}: {} readable bytes, shorter than the command header",
            chain.head,
            req.len()
        );
        return STATUS_INVALID;
    };
    let opcode = u16::from_le_bytes([hdr[0], hdr[1]]);
    let flags = u16::from_le_bytes([hdr[2], hdr[3]]);
    if flags != 0 {
        warn!("controlq: opcode {opcode}: flags {flags:#x} must be 0");
        return STATUS_INVALID;
    }
    if let Some(need) = resp_body_len(opcode) {
        if cap < (RESP_HDR_LEN + need) as u64 {
            warn!("controlq: opcode {opcode}: writable part of {cap} bytes too small");
            return STATUS_INVALID;
        }
    }
    let status = {
        let mut dev = device.lock().unwrap_or_else(|p| p.into_inner());
        dev.handle_command(opcode, &req[CMD_HDR_LEN..], body)
    };
    debug!(
        "controlq: opcode {opcode} ({} bytes) -> status {status}, {} response bytes",
        req.len(),
        body.len()
    );
    if (RESP_HDR_LEN + body.len()) as u64 > cap {
        warn!(
            "controlq: opcode {opcode}: response of {} bytes does not fit {cap}",
            body.len()
        );
        body.clear();
        return STATUS_INVALID;
    }
    status
}
