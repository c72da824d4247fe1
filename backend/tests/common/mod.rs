//! The test fixture library: one mock driver and what tests build with it.
//!
//! - `driver`: `Node`, one `Device` over anonymous guest memory driven as the guest driver drives
//!   it (commands with ABI structs, rings in guest memory, doorbells); `Node::bare` is the
//!   command-level device without peer, GID or transport.
//! - `objects`: rings and PD / CQ / SRQ / QP / MR / AH creation, typed and as raw requests.
//! - `wqe`: send WQEs; `connect`: QP state transitions to RTS.
//! - `link`: two nodes joined in-process (optionally impaired) and the pumps that drive them.
//! - `pairs`: `Sides` (nodes 1 and 2 with a PD each) and `QpPair` (CQs and a connected QP
//!   pair), the base of the two-node fixtures, each built in one call: `rc_pair` (a connected
//!   pair with MRs and link), `write_conn` (one more RC connection between existing nodes),
//!   `healthy_pair` (traffic beside QPs under attack), `fabric_rc` (two nodes on an in-process
//!   fabric), `odp` (pager and two-node ODP harness).
//! - `engine` (tests with engine threads), `fabric_tap`, `frame` (RoCEv2 frame offsets), `heap` (a
//!   counting allocator), `rng` (seeded generators).
#![allow(dead_code)]

use vrdma_spec::*;

/// Builder setters: each `/// doc` `name: Type;` becomes `pub fn name(self, v: Type) -> Self`
/// storing `v` in the builder's field `name`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $t:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, v: $t) -> Self {
                self.$name = v;
                self
            }
        )*
    };
}

pub mod connect;
pub mod driver;
pub mod engine;
pub mod fabric_rc;
pub mod fabric_tap;
pub mod frame;
pub mod healthy_pair;
pub mod heap;
pub mod link;
pub mod objects;
pub mod odp;
pub mod pairs;
pub mod rc_pair;
pub mod rng;
pub mod wqe;
pub mod write_conn;

// Not every test binary uses every fixture (same reason as the `dead_code` allow above).
#[allow(unused_imports)]
pub use connect::*;
#[allow(unused_imports)]
pub use driver::*;
#[allow(unused_imports)]
pub use frame::*;
#[allow(unused_imports)]
pub use healthy_pair::HealthyPair;
#[allow(unused_imports)]
pub use link::*;
#[allow(unused_imports)]
pub use objects::*;
#[allow(unused_imports)]
pub use pairs::*;
#[allow(unused_imports)]
pub use rc_pair::RcPair;
#[allow(unused_imports)]
pub use wqe::*;

/// Which node of a two-node fixture (`RcPair`, `odp::Pair`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Guest RAM of every node starts here (a fake GPA).
pub const BASE: u64 = 0x4000_0000;
pub const PAGE: u64 = 4096;

pub const ACC_ALL: u32 = VRDMA_ACCESS_LOCAL_WRITE
    | VRDMA_ACCESS_REMOTE_WRITE
    | VRDMA_ACCESS_REMOTE_READ
    | VRDMA_ACCESS_REMOTE_ATOMIC;

pub fn gid_v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

pub fn gid_v6(id: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfd;
    g[1] = 0x00;
    g[15] = id;
    g
}

/// The wr_ids of `cqes`, sorted (to compare completions that may come in any order).
pub fn sorted_wr_ids(cqes: &[vrdma_backend::transport::ctx::Cqe]) -> Vec<u64> {
    let mut ids: Vec<u64> = cqes.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    ids
}

/// Deterministic test data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
