//! RoCEv2 transport (IBTA Vol. 1 ch. 9): requester, responder and completer for RC, UC, UD and
//! GSI (QP1), plus the engine thread that drives them.
//!
//! Files follow the IBTA roles:
//! - `requester.rs`: SQ WQEs -> request packets (C9-xx requester rules, spec §6.1)
//! - `responder.rs`: request packets -> guest memory, ACK/NAK/READ responses/atomic acks (§14)
//! - `completer.rs`: ACKs and responses -> send CQEs, retransmission, RNR retry
//! - `timers.rs`: per-QP retransmit and RNR deadlines
//! - `engine.rs`: the engine thread (uplink rx, doorbells, timers)
//!
//! Per-QP protocol state lives in `Qp::req` ([`RequesterState`]) and `Qp::resp`
//! ([`ResponderState`]); `qp/` owns attributes and the IBTA state machine.

pub mod completer;
pub mod engine;
pub mod requester;
pub mod responder;
pub mod timers;

pub use requester::RequesterState;
pub use responder::ResponderState;

/// PSNs are 24-bit (IBTA 9.7.1).
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// `a - b` in the 24-bit PSN space, as a signed distance (IBTA 9.7.1: half the space is "ahead").
#[inline]
pub fn psn_diff(a: u32, b: u32) -> i32 {
    (((a.wrapping_sub(b)) << 8) as i32) >> 8
}

/// `psn + n` modulo 2^24.
#[inline]
pub fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}
