//! Target `wqe`: send-queue WQEs from the input, decoded and executed by the requester of a
//! connected RC, UC or UD QP (spec §6), with the peer answering over the in-memory link.
//!
//! Input: records of `sel u8, len u8, bytes[4 * len]` (zero-padded to the 512-byte slot).
//! `sel % 3` picks the QP (RC, UC, UD on node a); bit 6 set writes the WQE on b's peer QP
//! instead; bit 7 fires the transport timers after the exchange. The SQ producer index advances
//! by one per record, so a record also moves through the ring and wraps it.

use crate::bed::Bed;
use crate::Input;

/// Most WQEs per input.
const MAX_WQES: usize = 24;

pub fn run(data: &[u8]) {
    let mut bed = Bed::new();
    let mut inp = Input::new(data);
    for _ in 0..MAX_WQES {
        if inp.is_empty() {
            break;
        }
        let sel = inp.u8();
        let len = 4 * usize::from(inp.u8());
        let i = usize::from(sel % 3);
        let on_b = sel & 0x40 != 0;
        let (node, qp) = if on_b {
            (&mut bed.b, &mut bed.qb[i])
        } else {
            (&mut bed.a, &mut bed.qa[i])
        };
        let slot = 1usize << qp.sq.shift;
        let mut wqe = inp.padded(len.min(slot));
        wqe.resize(slot, 0);
        node.write(qp.sq.entry_gpa(qp.sq.idx), &wqe);
        qp.sq.idx = qp.sq.idx.wrapping_add(1);
        node.mem
            .store_u32_release(qp.sq.ctrl(), qp.sq.idx)
            .expect("sq producer");
        node.doorbell(qp.qpn);
        bed.settle(if sel & 0x80 != 0 { 2 } else { 0 });
    }
    bed.settle(1);
    bed.check_canaries();
}
