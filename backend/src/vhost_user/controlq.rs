//! Control queue (spec §11, DESIGN.md "Control queue"): one command per descriptor chain.
//!
//! Readable part = `vrdma_cmd_hdr` + request struct + trailing array, read as one byte stream
//! (any split, indirect allowed, at most [`MAX_REQUEST_BYTES`]). Writable part =
//! `vrdma_cmd_resp_hdr` + response struct. Chains are taken one at a time (`drain_queue`), so
//! at most one request buffer exists per queue. Outcomes for bad chains:
//! - more than [`MAX_REQUEST_DESCS`] descriptors: returned with `len` 0, not executed;
//! - writable part shorter than the 8-byte response header, or any writable descriptor outside
//!   guest memory: the chain is returned with `len` 0 and the command is not executed;
//! - readable part unreadable, too large, shorter than `vrdma_cmd_hdr`, or `flags` != 0: status
//!   INVALID, not executed;
//! - writable part too small for the opcode's response struct: status INVALID, not executed
//!   (so no object is created whose handle the driver could not learn);
//! - otherwise the device executes it and the response is written; `len` = bytes written;
//! - a command the device parks (ADVISE_MR with F_FLUSH, `CmdOutcome::Parked`) is not returned:
//!   the chain goes to [`ParkedCommands`] and is completed there later (see `parked.rs`);
//! - TEST ONLY: a command `--delay-commands` names is executed, and its response returned late
//!   (see `delay.rs`).

use vm_memory::{GuestAddress, GuestMemory, Permissions};

use super::chain::{ChainError, SplitChain};
use super::inputq::ChainLimits;
use super::parked::ParkedCommands;
use super::RdmaDevice;
use crate::guest::CmdOutcome;
use crate::handoff::HandoffLock;
use vrdma_spec::*;

/// Upper bound for a command's readable part (§11.1 `VRDMA_CMD_MAX_LEN`: 4 KiB of header and
/// request, then at most `VRDMA_CMD_MAX_PAGES` page GPAs, 64 MiB describing 32 GiB of 4 KiB
/// pages). Longer chains are answered INVALID without reading them.
pub const MAX_REQUEST_BYTES: usize = VRDMA_CMD_MAX_LEN as usize;
/// Most descriptors of a control chain (§11.1 `VRDMA_CMD_MAX_DESCS`); longer chains are
/// returned with `len` 0 unexecuted.
pub const MAX_REQUEST_DESCS: usize = super::chain::MAX_CHAIN_DESCS;
/// What the control queue gathers of one chain.
pub const LIMITS: ChainLimits = ChainLimits {
    max_readable: MAX_REQUEST_BYTES,
    max_descs: MAX_REQUEST_DESCS,
};
/// `sizeof(struct vrdma_cmd_hdr)`.
pub const CMD_HDR_LEN: usize = VrdmaCmdHdr::SIZE;
/// `sizeof(struct vrdma_cmd_resp_hdr)`.
pub const RESP_HDR_LEN: usize = VrdmaCmdRespHdr::SIZE;

/// Whether the command in `readable` is ordered after the doorbells rung before it (spec §8):
/// it ends or changes something a posted WQE names (its QP, an AH, an MR or window, a
/// multicast attachment, a GID), so the WQEs posted and rung before it start first, as they
/// would on an adapter that had long fetched them. `mckey`, for one, posts its datagrams and
/// at once detaches, destroys the AH and the QP.
pub fn ordered_after_doorbells(readable: &[u8]) -> bool {
    VrdmaCmdHdr::split_from(readable).is_some_and(|(hdr, _)| {
        matches!(
            hdr.opcode,
            VRDMA_CMD_MODIFY_QP
                | VRDMA_CMD_DESTROY_QP
                | VRDMA_CMD_DESTROY_AH
                | VRDMA_CMD_DETACH_MCAST
                | VRDMA_CMD_DEREG_MR
                | VRDMA_CMD_REREG_MR
                | VRDMA_CMD_DEALLOC_MW
                | VRDMA_CMD_DEL_GID
        )
    })
}

/// Size of the response body (after `vrdma_cmd_resp_hdr`) for a known opcode (§11): `None` for
/// opcodes this table does not know (the device decides, usually INVALID).
pub fn resp_body_len(opcode: u16) -> Option<usize> {
    Some(match opcode {
        VRDMA_CMD_QUERY_DEVICE => VrdmaConfig::SIZE,
        VRDMA_CMD_QUERY_PORT => VrdmaRespQueryPort::SIZE,
        VRDMA_CMD_QUERY_QP => VrdmaQpAttr::SIZE,
        VRDMA_CMD_QUERY_SRQ => VrdmaRespQuerySrq::SIZE,
        VRDMA_CMD_QUERY_STATS => VrdmaStats::SIZE,
        VRDMA_CMD_CREATE_QP => VrdmaRespCreateQp::SIZE,
        VRDMA_CMD_CREATE_PD | VRDMA_CMD_CREATE_CQ | VRDMA_CMD_RESIZE_CQ | VRDMA_CMD_CREATE_SRQ
        | VRDMA_CMD_CREATE_AH => VrdmaHandle::SIZE,
        VRDMA_CMD_REG_MR
        | VRDMA_CMD_REG_DMA_MR
        | VRDMA_CMD_ALLOC_FAST_REG_MR
        | VRDMA_CMD_REG_ODP_MR
        | VRDMA_CMD_REG_IMPLICIT_MR
        | VRDMA_CMD_REREG_MR => VrdmaRespRegMr::SIZE,
        VRDMA_CMD_ADD_GID
        | VRDMA_CMD_DEL_GID
        | VRDMA_CMD_DESTROY_PD
        | VRDMA_CMD_DESTROY_CQ
        | VRDMA_CMD_MODIFY_QP
        | VRDMA_CMD_DESTROY_QP
        | VRDMA_CMD_MODIFY_SRQ
        | VRDMA_CMD_MODIFY_CQ
        | VRDMA_CMD_DESTROY_SRQ
        | VRDMA_CMD_DESTROY_AH
        | VRDMA_CMD_DEREG_MR
        | VRDMA_CMD_ADVISE_MR
        | VRDMA_CMD_ODP_PAGE_RESP
        | VRDMA_CMD_ODP_INVALIDATE => 0,
        _ => return None,
    })
}

/// Execute the command in `chain` (if it is well formed) and write the response. Returns the
/// `len` for the used ring, or `None` when the command was parked in `parked` (do not return the
/// chain now).
pub fn run_command<D: RdmaDevice, M: GuestMemory>(
    device: &HandoffLock<D>,
    mem: &M,
    chain: &SplitChain,
    parked: &ParkedCommands,
) -> Option<u32> {
    if let Some(e @ ChainError::TooManyDescriptors { .. }) = &chain.read_error {
        // The walk stopped early: the writable part is unknown, so nothing can be answered.
        guest_warn!("controlq: chain {}: {e}; returned unexecuted", chain.head);
        return Some(0);
    }
    let cap = chain.writable_len();
    if let Some(&(addr, len)) = chain
        .writable
        .iter()
        .find(|&&(addr, len)| len > 0 && !mem.check_range(addr, len as usize, Permissions::Write))
    {
        guest_warn!(
            "controlq: chain {}: writable descriptor {:#x}+{len} outside guest memory; \
             returned unexecuted",
            chain.head,
            addr.0
        );
        return Some(0);
    }
    if cap < RESP_HDR_LEN as u64 {
        guest_warn!(
            "controlq: chain {} has {cap} writable bytes, less than the response header; \
             returned unexecuted",
            chain.head
        );
        return Some(0);
    }
    let mut body = Vec::new();
    let status = execute(device, chain, cap, &mut body, parked)?;
    let hdr = VrdmaCmdRespHdr {
        status,
        reserved: 0,
    };
    let mut out = Vec::with_capacity(RESP_HDR_LEN + body.len());
    out.extend_from_slice(hdr.as_bytes());
    out.extend_from_slice(&body);
    // TEST ONLY (`--delay-commands`): executed now, answered later.
    if let Some(delay) =
        VrdmaCmdHdr::split_from(&chain.readable).and_then(|(hdr, _)| parked.delay_for(hdr.opcode))
    {
        let late = SplitChain {
            head: chain.head,
            readable: Vec::new(),
            read_error: None,
            writable: chain.writable.clone(),
        };
        if parked.deliver_later(late, out.clone(), delay) {
            guest_debug!(
                "controlq: chain {} answered in {delay:?} (test only)",
                chain.head
            );
            return None;
        }
    }
    Some(match chain.scatter(mem, &out) {
        Ok(n) => n as u32,
        Err(e) => {
            guest_warn!("controlq: chain {}: response not written: {e}", chain.head);
            0
        }
    })
}

/// The writable descriptors a parked command's 8-byte response header needs: the shortest
/// prefix of `writable` holding `RESP_HDR_LEN` bytes (zero-length descriptors skipped). A parked
/// chain keeps only these, so the at most `MAX_PARKED_ADVISE` parked chains hold at most
/// 8 descriptors each whatever their length (spec §16), not up to `VRDMA_CMD_MAX_DESCS`.
pub fn response_descs(writable: &[(GuestAddress, u32)]) -> Vec<(GuestAddress, u32)> {
    let mut need = RESP_HDR_LEN as u64;
    let mut out = Vec::new();
    for &(a, l) in writable {
        if need == 0 {
            break;
        }
        if l == 0 {
            continue;
        }
        out.push((a, l));
        need = need.saturating_sub(u64::from(l));
    }
    out
}

/// What a parked command's chain keeps: its head and the descriptors of its 8-byte response.
fn parked_chain(chain: &SplitChain) -> SplitChain {
    SplitChain {
        head: chain.head,
        readable: Vec::new(),
        read_error: None,
        writable: response_descs(&chain.writable),
    }
}

/// The command of `chain`: its opcode and arguments, after the checks that need no device
/// (the chain was gathered, a header, flags 0, room for the opcode's response); `Err`: the
/// status refusing it.
fn decode(chain: &SplitChain, cap: u64) -> Result<(u16, &[u8]), u32> {
    if let Some(e) = &chain.read_error {
        guest_warn!("controlq: chain {}: {e}", chain.head);
        // Spec §14.2 / §16: a well-formed command the budget cannot gather is NO_RESOURCES.
        if matches!(e, ChainError::OverBudget { .. }) {
            return Err(VRDMA_STATUS_NO_RESOURCES);
        }
        return Err(VRDMA_STATUS_INVALID);
    }
    let req = &chain.readable;
    let Some((hdr, args)) = VrdmaCmdHdr::split_from(req) else {
        guest_warn!(
            "controlq: chain {}: {} readable bytes, shorter than the command header",
            chain.head,
            req.len()
        );
        return Err(VRDMA_STATUS_INVALID);
    };
    let (opcode, flags) = (hdr.opcode, hdr.flags);
    if flags != 0 {
        guest_warn!("controlq: opcode {opcode}: flags {flags:#x} must be 0");
        return Err(VRDMA_STATUS_INVALID);
    }
    if let Some(need) = resp_body_len(opcode) {
        if cap < (RESP_HDR_LEN + need) as u64 {
            guest_warn!("controlq: opcode {opcode}: writable part of {cap} bytes too small");
            return Err(VRDMA_STATUS_INVALID);
        }
    }
    Ok((opcode, args))
}

/// Decode and execute; leaves the response body in `body` (empty unless OK or the device gave
/// one) and guarantees `RESP_HDR_LEN + body.len() <= cap`. `None`: the device parked the command
/// and the chain is in `parked`.
fn execute<D: RdmaDevice>(
    device: &HandoffLock<D>,
    chain: &SplitChain,
    cap: u64,
    body: &mut Vec<u8>,
    parked: &ParkedCommands,
) -> Option<u32> {
    let req = &chain.readable;
    let (opcode, args) = match decode(chain, cap) {
        Ok(command) => command,
        Err(status) => return Some(status),
    };
    // Most commands run on the device held shared, beside the engine workers (no hand-off to
    // wait for; `Device::handle_shared`); the others hold it exclusively. One beside the
    // workers that parks (ADVISE_MR with F_FLUSH) may be completed by a worker before its
    // chain is parked here: the window keeps such a completion for `park`.
    let shared = {
        let window = parked.window();
        let outcome = device.read().handle_shared_parking(opcode, args, body);
        if let Some(CmdOutcome::Parked(ticket)) = outcome {
            guest_debug!("controlq: opcode {opcode} parked beside the engine as {ticket:?}");
            parked.park(ticket, parked_chain(chain));
            drop(window);
            return None;
        }
        outcome.and_then(CmdOutcome::status)
    };
    let status = if let Some(s) = shared {
        s
    } else {
        let mut dev = device.lock();
        match dev.handle_command(opcode, args, body) {
            CmdOutcome::Done(s) => s,
            CmdOutcome::Parked(ticket) => {
                // Parked before the device lock is released: the completion, which also runs
                // under the device lock, cannot come first. Its 8-byte response fits (checked
                // above: `cap` >= RESP_HDR_LEN).
                guest_debug!("controlq: opcode {opcode} parked as {ticket:?}");
                // Only what the completion writes is kept: the request bytes (up to
                // MAX_REQUEST_BYTES) are not pinned for the seconds a park may last.
                parked.park(ticket, parked_chain(chain));
                return None;
            }
        }
    };
    guest_debug!(
        "controlq: opcode {opcode} ({} bytes) -> status {status}, {} response bytes",
        req.len(),
        body.len()
    );
    if (RESP_HDR_LEN + body.len()) as u64 > cap {
        guest_warn!(
            "controlq: opcode {opcode}: response of {} bytes does not fit {cap}",
            body.len()
        );
        body.clear();
        return Some(VRDMA_STATUS_INVALID);
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_chains_keep_only_the_response_header_descriptors() {
        let d = |a: u64, l: u32| (GuestAddress(a), l);
        // 16448 one-byte descriptors: eight are enough for the 8-byte header.
        let many: Vec<_> = (0..MAX_REQUEST_DESCS as u64).map(|i| d(i, 1)).collect();
        assert_eq!(response_descs(&many), many[..8].to_vec());
        // Zero-length descriptors are skipped; a large first one is enough alone.
        let w = vec![d(0, 0), d(0x100, 4096), d(0x200, 4096)];
        assert_eq!(response_descs(&w), vec![d(0x100, 4096)]);
        let split = vec![d(0, 3), d(0, 0), d(8, 5), d(16, 100)];
        assert_eq!(response_descs(&split), vec![d(0, 3), d(8, 5)]);
        assert!(response_descs(&[]).is_empty());
    }
}
