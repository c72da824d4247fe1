//! The per-opcode table (IBTA 9.2 / Annex A17): one `const` entry per supported BTH opcode saying
//! which extension headers follow the BTH, whether payload follows, its place in a message and the
//! header length. Code asks the table instead of switching on opcodes.
//!
//! Supported: RC (0x00..=0x14, 0x16, 0x17, and the IBTA 1.5 FLUSH 0x1c and ATOMIC WRITE 0x1d),
//! UC (0x20..=0x2b), UD SEND ONLY (+IMM) (0x64, 0x65), XRC (0xa0..=0xb4, 0xb6, 0xb7: the RC
//! operations without FLUSH and ATOMIC WRITE, spec §13.7). RD and CNP are not supported
//! (→ [`crate::wire::WireError::UnknownOpcode`]).
//!
//! Long because it is the table itself: one entry per supported opcode (62 of them), and the
//! tests of its rows.

use super::{aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, xrceth};

/// Transport service of an opcode (BTH opcode bits 7:5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
    /// eXtended Reliable Connected (spec §13.7): RC semantics, XRCETH in requests.
    Xrc,
}

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Ack,
    AtomicAck,
    CompareSwap,
    FetchAdd,
    /// IBTA 1.5 ATOMIC WRITE: 8 bytes stored atomically, answered like a READ.
    AtomicWrite,
    /// IBTA 1.5 FLUSH: make earlier writes visible/persistent, answered like a READ.
    Flush,
}

/// Place of a packet within its message. Single-packet operations (READ request, ACK, atomics) are
/// `Only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

/// Requester → responder (request) or responder → requester (response).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Request,
    Response,
}

/// A set of extension headers. On the wire they follow the BTH in this order:
/// DETH, XRCETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HdrMask(u16);

impl HdrMask {
    pub const NONE: HdrMask = HdrMask(0);
    pub const DETH: HdrMask = HdrMask(1 << 0);
    pub const RETH: HdrMask = HdrMask(1 << 1);
    pub const ATOMIC_ETH: HdrMask = HdrMask(1 << 2);
    pub const AETH: HdrMask = HdrMask(1 << 3);
    pub const ATOMIC_ACK_ETH: HdrMask = HdrMask(1 << 4);
    pub const IMMDT: HdrMask = HdrMask(1 << 5);
    pub const IETH: HdrMask = HdrMask(1 << 6);
    pub const FETH: HdrMask = HdrMask(1 << 7);
    pub const XRCETH: HdrMask = HdrMask(1 << 8);

    /// The headers in wire order with their lengths.
    pub const ORDER: [(HdrMask, usize, &'static str); 9] = [
        (Self::DETH, deth::Deth::LEN, "DETH"),
        (Self::XRCETH, xrceth::Xrceth::LEN, "XRCETH"),
        (Self::FETH, feth::Feth::LEN, "FETH"),
        (Self::RETH, reth::Reth::LEN, "RETH"),
        (Self::ATOMIC_ETH, atomic_eth::AtomicEth::LEN, "AtomicETH"),
        (Self::AETH, aeth::Aeth::LEN, "AETH"),
        (
            Self::ATOMIC_ACK_ETH,
            atomic_ack_eth::AtomicAckEth::LEN,
            "AtomicAckETH",
        ),
        (Self::IMMDT, immdt::ImmDt::LEN, "ImmDt"),
        (Self::IETH, ieth::Ieth::LEN, "IETH"),
    ];

    pub const fn union(self, other: HdrMask) -> HdrMask {
        HdrMask(self.0 | other.0)
    }
    pub const fn contains(self, other: HdrMask) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn bits(self) -> u16 {
        self.0
    }
    /// Total length of the extension headers in this set.
    pub const fn len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                n += Self::ORDER[i].1;
            }
            i += 1;
        }
        n
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// Offset of header `h` from the start of the BTH, if `h` is in this set.
    pub const fn offset(self, h: HdrMask) -> Option<usize> {
        if !self.contains(h) || h.0 == 0 {
            return None;
        }
        let mut off = bth::Bth::LEN;
        let mut i = 0;
        while i < Self::ORDER.len() {
            let (m, l, _) = Self::ORDER[i];
            if m.0 == h.0 {
                return Some(off);
            }
            if self.contains(m) {
                off += l;
            }
            i += 1;
        }
        None
    }
}

impl core::ops::BitOr for HdrMask {
    type Output = HdrMask;
    fn bitor(self, rhs: HdrMask) -> HdrMask {
        self.union(rhs)
    }
}

impl core::fmt::Debug for HdrMask {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut l = f.debug_set();
        for (m, _, name) in Self::ORDER {
            if self.contains(m) {
                l.entry(&format_args!("{name}"));
            }
        }
        l.finish()
    }
}

/// Supported BTH opcodes. The discriminant is the wire value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    RcSendFirst = 0x00,
    RcSendMiddle = 0x01,
    RcSendLast = 0x02,
    RcSendLastImm = 0x03,
    RcSendOnly = 0x04,
    RcSendOnlyImm = 0x05,
    RcWriteFirst = 0x06,
    RcWriteMiddle = 0x07,
    RcWriteLast = 0x08,
    RcWriteLastImm = 0x09,
    RcWriteOnly = 0x0a,
    RcWriteOnlyImm = 0x0b,
    RcReadRequest = 0x0c,
    RcReadResponseFirst = 0x0d,
    RcReadResponseMiddle = 0x0e,
    RcReadResponseLast = 0x0f,
    RcReadResponseOnly = 0x10,
    RcAck = 0x11,
    RcAtomicAck = 0x12,
    RcCompareSwap = 0x13,
    RcFetchAdd = 0x14,
    RcSendLastInv = 0x16,
    RcSendOnlyInv = 0x17,
    RcFlush = 0x1c,
    RcAtomicWrite = 0x1d,
    UcSendFirst = 0x20,
    UcSendMiddle = 0x21,
    UcSendLast = 0x22,
    UcSendLastImm = 0x23,
    UcSendOnly = 0x24,
    UcSendOnlyImm = 0x25,
    UcWriteFirst = 0x26,
    UcWriteMiddle = 0x27,
    UcWriteLast = 0x28,
    UcWriteLastImm = 0x29,
    UcWriteOnly = 0x2a,
    UcWriteOnlyImm = 0x2b,
    UdSendOnly = 0x64,
    UdSendOnlyImm = 0x65,
    XrcSendFirst = 0xa0,
    XrcSendMiddle = 0xa1,
    XrcSendLast = 0xa2,
    XrcSendLastImm = 0xa3,
    XrcSendOnly = 0xa4,
    XrcSendOnlyImm = 0xa5,
    XrcWriteFirst = 0xa6,
    XrcWriteMiddle = 0xa7,
    XrcWriteLast = 0xa8,
    XrcWriteLastImm = 0xa9,
    XrcWriteOnly = 0xaa,
    XrcWriteOnlyImm = 0xab,
    XrcReadRequest = 0xac,
    XrcReadResponseFirst = 0xad,
    XrcReadResponseMiddle = 0xae,
    XrcReadResponseLast = 0xaf,
    XrcReadResponseOnly = 0xb0,
    XrcAck = 0xb1,
    XrcAtomicAck = 0xb2,
    XrcCompareSwap = 0xb3,
    XrcFetchAdd = 0xb4,
    XrcSendLastInv = 0xb6,
    XrcSendOnlyInv = 0xb7,
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    pub opcode: Opcode,
    /// IBTA name, e.g. "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE".
    pub name: &'static str,
    pub transport: Transport,
    pub operation: Operation,
    pub position: Position,
    pub direction: Direction,
    /// Extension headers after the BTH.
    pub headers: HdrMask,
    /// Whether payload (possibly empty, e.g. a zero-length SEND) follows the headers.
    pub payload: bool,
    /// BTH + extension headers, in bytes (no payload, pad or ICRC).
    pub hdr_len: usize,
}

impl OpcodeInfo {
    pub const fn has(&self, h: HdrMask) -> bool {
        self.headers.contains(h)
    }
    /// Offset of extension header `h` from the start of the BTH.
    pub const fn offset(&self, h: HdrMask) -> Option<usize> {
        self.headers.offset(h)
    }
    pub const fn is_first(&self) -> bool {
        matches!(self.position, Position::First | Position::Only)
    }
    pub const fn is_last(&self) -> bool {
        matches!(self.position, Position::Last | Position::Only)
    }
    pub const fn is_request(&self) -> bool {
        matches!(self.direction, Direction::Request)
    }
    pub const fn is_response(&self) -> bool {
        matches!(self.direction, Direction::Response)
    }
    pub const fn has_imm(&self) -> bool {
        self.has(HdrMask::IMMDT)
    }
    pub const fn has_inv(&self) -> bool {
        self.has(HdrMask::IETH)
    }
    pub const fn is_atomic(&self) -> bool {
        matches!(self.operation, Operation::CompareSwap | Operation::FetchAdd)
    }
    /// Requests that take a responder resource (max_dest_rd_atomic) and are answered from it
    /// when duplicated: READ, the atomics, ATOMIC WRITE and FLUSH.
    pub const fn uses_responder_resource(&self) -> bool {
        matches!(
            self.operation,
            Operation::ReadRequest
                | Operation::CompareSwap
                | Operation::FetchAdd
                | Operation::AtomicWrite
                | Operation::Flush
        )
    }
}

const fn entry(
    opcode: Opcode,
    name: &'static str,
    transport: Transport,
    operation: Operation,
    position: Position,
    headers: HdrMask,
) -> OpcodeInfo {
    let payload = matches!(
        operation,
        Operation::Send | Operation::Write | Operation::ReadResponse | Operation::AtomicWrite
    );
    let direction = match operation {
        Operation::ReadResponse | Operation::Ack | Operation::AtomicAck => Direction::Response,
        _ => Direction::Request,
    };
    OpcodeInfo {
        opcode,
        name,
        transport,
        operation,
        position,
        direction,
        headers,
        payload,
        hdr_len: bth::Bth::LEN + headers.len(),
    }
}

use HdrMask as H;
use Operation as Op;
use Position as P;
use Transport as T;

const NONE: HdrMask = H::NONE;
const RETH_IMM: HdrMask = H::RETH.union(H::IMMDT);
const DETH_IMM: HdrMask = H::DETH.union(H::IMMDT);
const AETH_ATMACK: HdrMask = H::AETH.union(H::ATOMIC_ACK_ETH);
const FETH_RETH: HdrMask = H::FETH.union(H::RETH);

/// Every supported opcode, in wire-value order.
pub const OPCODES: [OpcodeInfo; 62] = [
    entry(
        Opcode::RcSendFirst,
        "RC_SEND_FIRST",
        T::Rc,
        Op::Send,
        P::First,
        NONE,
    ),
    entry(
        Opcode::RcSendMiddle,
        "RC_SEND_MIDDLE",
        T::Rc,
        Op::Send,
        P::Middle,
        NONE,
    ),
    entry(
        Opcode::RcSendLast,
        "RC_SEND_LAST",
        T::Rc,
        Op::Send,
        P::Last,
        NONE,
    ),
    entry(
        Opcode::RcSendLastImm,
        "RC_SEND_LAST_WITH_IMMEDIATE",
        T::Rc,
        Op::Send,
        P::Last,
        H::IMMDT,
    ),
    entry(
        Opcode::RcSendOnly,
        "RC_SEND_ONLY",
        T::Rc,
        Op::Send,
        P::Only,
        NONE,
    ),
    entry(
        Opcode::RcSendOnlyImm,
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        T::Rc,
        Op::Send,
        P::Only,
        H::IMMDT,
    ),
    entry(
        Opcode::RcWriteFirst,
        "RC_RDMA_WRITE_FIRST",
        T::Rc,
        Op::Write,
        P::First,
        H::RETH,
    ),
    entry(
        Opcode::RcWriteMiddle,
        "RC_RDMA_WRITE_MIDDLE",
        T::Rc,
        Op::Write,
        P::Middle,
        NONE,
    ),
    entry(
        Opcode::RcWriteLast,
        "RC_RDMA_WRITE_LAST",
        T::Rc,
        Op::Write,
        P::Last,
        NONE,
    ),
    entry(
        Opcode::RcWriteLastImm,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Rc,
        Op::Write,
        P::Last,
        H::IMMDT,
    ),
    entry(
        Opcode::RcWriteOnly,
        "RC_RDMA_WRITE_ONLY",
        T::Rc,
        Op::Write,
        P::Only,
        H::RETH,
    ),
    entry(
        Opcode::RcWriteOnlyImm,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Rc,
        Op::Write,
        P::Only,
        RETH_IMM,
    ),
    entry(
        Opcode::RcReadRequest,
        "RC_RDMA_READ_REQUEST",
        T::Rc,
        Op::ReadRequest,
        P::Only,
        H::RETH,
    ),
    entry(
        Opcode::RcReadResponseFirst,
        "RC_RDMA_READ_RESPONSE_FIRST",
        T::Rc,
        Op::ReadResponse,
        P::First,
        H::AETH,
    ),
    entry(
        Opcode::RcReadResponseMiddle,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        T::Rc,
        Op::ReadResponse,
        P::Middle,
        NONE,
    ),
    entry(
        Opcode::RcReadResponseLast,
        "RC_RDMA_READ_RESPONSE_LAST",
        T::Rc,
        Op::ReadResponse,
        P::Last,
        H::AETH,
    ),
    entry(
        Opcode::RcReadResponseOnly,
        "RC_RDMA_READ_RESPONSE_ONLY",
        T::Rc,
        Op::ReadResponse,
        P::Only,
        H::AETH,
    ),
    entry(
        Opcode::RcAck,
        "RC_ACKNOWLEDGE",
        T::Rc,
        Op::Ack,
        P::Only,
        H::AETH,
    ),
    entry(
        Opcode::RcAtomicAck,
        "RC_ATOMIC_ACKNOWLEDGE",
        T::Rc,
        Op::AtomicAck,
        P::Only,
        AETH_ATMACK,
    ),
    entry(
        Opcode::RcCompareSwap,
        "RC_COMPARE_SWAP",
        T::Rc,
        Op::CompareSwap,
        P::Only,
        H::ATOMIC_ETH,
    ),
    entry(
        Opcode::RcFetchAdd,
        "RC_FETCH_ADD",
        T::Rc,
        Op::FetchAdd,
        P::Only,
        H::ATOMIC_ETH,
    ),
    entry(
        Opcode::RcSendLastInv,
        "RC_SEND_LAST_WITH_INVALIDATE",
        T::Rc,
        Op::Send,
        P::Last,
        H::IETH,
    ),
    entry(
        Opcode::RcSendOnlyInv,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        T::Rc,
        Op::Send,
        P::Only,
        H::IETH,
    ),
    entry(
        Opcode::RcFlush,
        "RC_FLUSH",
        T::Rc,
        Op::Flush,
        P::Only,
        FETH_RETH,
    ),
    entry(
        Opcode::RcAtomicWrite,
        "RC_ATOMIC_WRITE",
        T::Rc,
        Op::AtomicWrite,
        P::Only,
        H::RETH,
    ),
    entry(
        Opcode::UcSendFirst,
        "UC_SEND_FIRST",
        T::Uc,
        Op::Send,
        P::First,
        NONE,
    ),
    entry(
        Opcode::UcSendMiddle,
        "UC_SEND_MIDDLE",
        T::Uc,
        Op::Send,
        P::Middle,
        NONE,
    ),
    entry(
        Opcode::UcSendLast,
        "UC_SEND_LAST",
        T::Uc,
        Op::Send,
        P::Last,
        NONE,
    ),
    entry(
        Opcode::UcSendLastImm,
        "UC_SEND_LAST_WITH_IMMEDIATE",
        T::Uc,
        Op::Send,
        P::Last,
        H::IMMDT,
    ),
    entry(
        Opcode::UcSendOnly,
        "UC_SEND_ONLY",
        T::Uc,
        Op::Send,
        P::Only,
        NONE,
    ),
    entry(
        Opcode::UcSendOnlyImm,
        "UC_SEND_ONLY_WITH_IMMEDIATE",
        T::Uc,
        Op::Send,
        P::Only,
        H::IMMDT,
    ),
    entry(
        Opcode::UcWriteFirst,
        "UC_RDMA_WRITE_FIRST",
        T::Uc,
        Op::Write,
        P::First,
        H::RETH,
    ),
    entry(
        Opcode::UcWriteMiddle,
        "UC_RDMA_WRITE_MIDDLE",
        T::Uc,
        Op::Write,
        P::Middle,
        NONE,
    ),
    entry(
        Opcode::UcWriteLast,
        "UC_RDMA_WRITE_LAST",
        T::Uc,
        Op::Write,
        P::Last,
        NONE,
    ),
    entry(
        Opcode::UcWriteLastImm,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Uc,
        Op::Write,
        P::Last,
        H::IMMDT,
    ),
    entry(
        Opcode::UcWriteOnly,
        "UC_RDMA_WRITE_ONLY",
        T::Uc,
        Op::Write,
        P::Only,
        H::RETH,
    ),
    entry(
        Opcode::UcWriteOnlyImm,
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Uc,
        Op::Write,
        P::Only,
        RETH_IMM,
    ),
    entry(
        Opcode::UdSendOnly,
        "UD_SEND_ONLY",
        T::Ud,
        Op::Send,
        P::Only,
        H::DETH,
    ),
    entry(
        Opcode::UdSendOnlyImm,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        T::Ud,
        Op::Send,
        P::Only,
        DETH_IMM,
    ),
    entry(
        Opcode::XrcSendFirst,
        "XRC_SEND_FIRST",
        T::Xrc,
        Op::Send,
        P::First,
        H::XRCETH,
    ),
    entry(
        Opcode::XrcSendMiddle,
        "XRC_SEND_MIDDLE",
        T::Xrc,
        Op::Send,
        P::Middle,
        H::XRCETH,
    ),
    entry(
        Opcode::XrcSendLast,
        "XRC_SEND_LAST",
        T::Xrc,
        Op::Send,
        P::Last,
        H::XRCETH,
    ),
    entry(
        Opcode::XrcSendLastImm,
        "XRC_SEND_LAST_WITH_IMMEDIATE",
        T::Xrc,
        Op::Send,
        P::Last,
        H::XRCETH.union(H::IMMDT),
    ),
    entry(
        Opcode::XrcSendOnly,
        "XRC_SEND_ONLY",
        T::Xrc,
        Op::Send,
        P::Only,
        H::XRCETH,
    ),
    entry(
        Opcode::XrcSendOnlyImm,
        "XRC_SEND_ONLY_WITH_IMMEDIATE",
        T::Xrc,
        Op::Send,
        P::Only,
        H::XRCETH.union(H::IMMDT),
    ),
    entry(
        Opcode::XrcWriteFirst,
        "XRC_RDMA_WRITE_FIRST",
        T::Xrc,
        Op::Write,
        P::First,
        H::XRCETH.union(H::RETH),
    ),
    entry(
        Opcode::XrcWriteMiddle,
        "XRC_RDMA_WRITE_MIDDLE",
        T::Xrc,
        Op::Write,
        P::Middle,
        H::XRCETH,
    ),
    entry(
        Opcode::XrcWriteLast,
        "XRC_RDMA_WRITE_LAST",
        T::Xrc,
        Op::Write,
        P::Last,
        H::XRCETH,
    ),
    entry(
        Opcode::XrcWriteLastImm,
        "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Xrc,
        Op::Write,
        P::Last,
        H::XRCETH.union(H::IMMDT),
    ),
    entry(
        Opcode::XrcWriteOnly,
        "XRC_RDMA_WRITE_ONLY",
        T::Xrc,
        Op::Write,
        P::Only,
        H::XRCETH.union(H::RETH),
    ),
    entry(
        Opcode::XrcWriteOnlyImm,
        "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Xrc,
        Op::Write,
        P::Only,
        H::XRCETH.union(RETH_IMM),
    ),
    entry(
        Opcode::XrcReadRequest,
        "XRC_RDMA_READ_REQUEST",
        T::Xrc,
        Op::ReadRequest,
        P::Only,
        H::XRCETH.union(H::RETH),
    ),
    entry(
        Opcode::XrcReadResponseFirst,
        "XRC_RDMA_READ_RESPONSE_FIRST",
        T::Xrc,
        Op::ReadResponse,
        P::First,
        H::AETH,
    ),
    entry(
        Opcode::XrcReadResponseMiddle,
        "XRC_RDMA_READ_RESPONSE_MIDDLE",
        T::Xrc,
        Op::ReadResponse,
        P::Middle,
        NONE,
    ),
    entry(
        Opcode::XrcReadResponseLast,
        "XRC_RDMA_READ_RESPONSE_LAST",
        T::Xrc,
        Op::ReadResponse,
        P::Last,
        H::AETH,
    ),
    entry(
        Opcode::XrcReadResponseOnly,
        "XRC_RDMA_READ_RESPONSE_ONLY",
        T::Xrc,
        Op::ReadResponse,
        P::Only,
        H::AETH,
    ),
    entry(
        Opcode::XrcAck,
        "XRC_ACKNOWLEDGE",
        T::Xrc,
        Op::Ack,
        P::Only,
        H::AETH,
    ),
    entry(
        Opcode::XrcAtomicAck,
        "XRC_ATOMIC_ACKNOWLEDGE",
        T::Xrc,
        Op::AtomicAck,
        P::Only,
        AETH_ATMACK,
    ),
    entry(
        Opcode::XrcCompareSwap,
        "XRC_COMPARE_SWAP",
        T::Xrc,
        Op::CompareSwap,
        P::Only,
        H::XRCETH.union(H::ATOMIC_ETH),
    ),
    entry(
        Opcode::XrcFetchAdd,
        "XRC_FETCH_ADD",
        T::Xrc,
        Op::FetchAdd,
        P::Only,
        H::XRCETH.union(H::ATOMIC_ETH),
    ),
    entry(
        Opcode::XrcSendLastInv,
        "XRC_SEND_LAST_WITH_INVALIDATE",
        T::Xrc,
        Op::Send,
        P::Last,
        H::XRCETH.union(H::IETH),
    ),
    entry(
        Opcode::XrcSendOnlyInv,
        "XRC_SEND_ONLY_WITH_INVALIDATE",
        T::Xrc,
        Op::Send,
        P::Only,
        H::XRCETH.union(H::IETH),
    ),
];

/// Index into [`OPCODES`] by wire value; `NO_ENTRY` for unsupported values.
const NO_ENTRY: u8 = u8::MAX;
static INDEX: [u8; 256] = {
    let mut t = [NO_ENTRY; 256];
    let mut i = 0;
    while i < OPCODES.len() {
        let v = OPCODES[i].opcode as usize;
        // Compile-time check: no opcode listed twice.
        assert!(t[v] == NO_ENTRY);
        t[v] = i as u8;
        i += 1;
    }
    t
};

/// Table lookup by wire value: `None` for unsupported/reserved opcodes.
#[inline]
pub fn lookup(value: u8) -> Option<&'static OpcodeInfo> {
    OPCODES.get(INDEX[value as usize] as usize)
}

impl Opcode {
    /// The opcode with wire value `v`, if supported.
    #[inline]
    pub fn from_u8(v: u8) -> Option<Opcode> {
        lookup(v).map(|i| i.opcode)
    }

    /// Wire value.
    #[inline]
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// This opcode's table row.
    #[inline]
    pub fn info(self) -> &'static OpcodeInfo {
        match lookup(self as u8) {
            Some(i) => i,
            // Every variant is in OPCODES (checked by the unit test `every_variant_has_a_row`).
            None => unreachable!("opcode {:#x} missing from OPCODES", self as u8),
        }
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.info().name)
    }
}

impl TryFrom<u8> for Opcode {
    type Error = super::WireError;
    fn try_from(v: u8) -> Result<Self, Self::Error> {
        Opcode::from_u8(v).ok_or(super::WireError::UnknownOpcode(v))
    }
}

#[cfg(test)]
mod tests;
