//! Target `control`: a sequence of control commands (`Device::handle_command`, spec §11) with
//! arbitrary opcodes and payloads on one device, so that later commands act on the objects
//! earlier ones created.
//!
//! Input: records of `opcode u8, patches u8, len u16, payload[len]`, then per patch
//! `where u8, which u8`. Handles and QPNs cannot be guessed (spec §16), so a patch writes one
//! that an earlier command returned: bit 7 of `where` clear → the `which`-th u32 returned so
//! far at payload offset `4 * (where & 0x3f)`; set → the guest page `BASE + 4 KiB * which` as
//! a u64 there (for page arrays).

use vrdma_backend::device::CmdOutcome;
use vrdma_spec::*;

use crate::common::{Node, BASE};
use crate::Input;

/// Most commands per input (keeps an execution short).
const MAX_CMDS: usize = 64;
/// Guest RAM of the device, in MiB.
const MEM_MIB: u64 = 8;

/// Apply the patches of one command record to its payload.
pub(crate) fn patch(inp: &mut Input, n: u8, payload: &mut [u8], handles: &[u32]) {
    for _ in 0..n {
        let (w, which) = (inp.u8(), inp.u8());
        let off = 4 * usize::from(w & 0x3f);
        if w & 0x80 != 0 {
            let gpa = BASE + 4096 * u64::from(which);
            if let Some(dst) = payload.get_mut(off..off + 8) {
                dst.copy_from_slice(&gpa.to_le_bytes());
            }
        } else if !handles.is_empty() {
            let h = handles[usize::from(which) % handles.len()];
            if let Some(dst) = payload.get_mut(off..off + 4) {
                dst.copy_from_slice(&h.to_le_bytes());
            }
        }
    }
}

/// Remember the first words of a successful response (handles, QPNs, keys).
pub(crate) fn learn(resp: &[u8], handles: &mut Vec<u32>) {
    for w in resp.chunks_exact(4).take(4) {
        handles.push(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    }
}

pub fn run(data: &[u8]) {
    let mut node = Node::new(1, MEM_MIB, 1500);
    let mut inp = Input::new(data);
    let mut handles = Vec::new();
    for _ in 0..MAX_CMDS {
        if inp.is_empty() {
            break;
        }
        let op = u16::from(inp.u8());
        let npatch = inp.u8() & 7;
        let len = usize::from(inp.u16() % 2048);
        let mut payload = inp.padded(len);
        patch(&mut inp, npatch, &mut payload, &handles);
        let mut resp = Vec::new();
        let outcome = node.dev.handle_command(op, &payload, &mut resp);
        if crate::trace() {
            eprintln!("control: opcode {op}, {len} bytes -> {outcome:?}");
        }
        if outcome == CmdOutcome::Done(VRDMA_STATUS_OK) {
            learn(&resp, &mut handles);
        }
        // Every response must fit what the control queue reserves for it (§11): the queue
        // answers INVALID otherwise, so a longer body is a device bug.
        if let Some(need) = vrdma_backend::vhost_user::controlq::resp_body_len(op) {
            assert!(
                resp.len() <= need,
                "opcode {op}: {} response bytes, the queue reserves {need}",
                resp.len()
            );
        }
    }
}
