//! RoCEv2 wire format (IBTA Annex A17; spec §15): typed headers, the per-opcode table, ICRC and whole
//! Ethernet frames.
//!
//! Every header type has `parse(&[u8]) -> Result<(Self, &[u8]), WireError>` (returns the rest of the
//! buffer) and `write(&self, &mut [u8]) -> Result<usize, WireError>` (returns the bytes written).
//! Parsing never panics on any input; every length is checked and a bad input yields a typed
//! [`WireError`]. Nothing here allocates except [`frame::PacketBuilder`] growing the caller's `Vec`.
//!
//! Transport code normally uses only [`frame::RocePacket::parse`] (receive) and
//! [`frame::PacketBuilder`] (send), plus the [`opcode`] table.

#[macro_use]
mod fixed_header;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
pub mod eth;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod mtu;
pub mod opcode;
pub mod reth;
pub mod segment;
pub mod udp;
pub mod xrceth;

pub use aeth::{Aeth, NakCode, Syndrome};
pub use atomic_ack_eth::AtomicAckEth;
pub use atomic_eth::AtomicEth;
pub use bth::Bth;
pub use deth::Deth;
pub use eth::{EthHeader, MacAddr};
pub use feth::Feth;
pub use frame::{
    gid_from_ipv4, gid_to_ipv4, is_ipv4_mapped, locate, seal_icrc, udp_src_port, Addressing,
    ExtHeaders, Gid, IcrcCheck, IpVersion, Located, PacketBuilder, RocePacket,
};
pub use icrc::Icrc;
pub use ieth::Ieth;
pub use immdt::ImmDt;
pub use ipv4::Ipv4Header;
pub use ipv6::Ipv6Header;
pub use opcode::{Direction, HdrMask, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use reth::Reth;
pub use udp::UdpHeader;
pub use xrceth::Xrceth;

/// UDP destination port of RoCEv2 (IANA "roce").
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
/// The only P_Key vrdma uses (spec §15).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Everything that can be wrong with a frame or a header, on parse or on build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A header or the frame ends before a field it must contain.
    #[error("{what}: truncated, need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// An output buffer is too small for what is being written.
    #[error("{what}: output buffer too small, need {need} bytes, have {have}")]
    BufferTooSmall {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// The Ethernet type is neither IPv4 nor IPv6 (after an optional 802.1Q tag).
    #[error("ethertype {0:#06x} is not IPv4/IPv6")]
    NotIp(u16),
    /// The IP version nibble does not match the ethertype.
    #[error("IP version {0} does not match the ethertype")]
    BadIpVersion(u8),
    /// IPv4 IHL below 5 (or beyond the data).
    #[error("bad IPv4 header length {0} (words)")]
    BadIpv4HeaderLength(u8),
    /// IPv4 options are not supported for RoCEv2 (the ICRC covers a 20-byte header).
    #[error("IPv4 options are not supported (IHL {0})")]
    Ipv4Options(u8),
    /// IPv4 header checksum is wrong.
    #[error("bad IPv4 header checksum")]
    BadIpv4Checksum,
    /// A fragment (MF set or fragment offset nonzero).
    #[error("IP fragment")]
    Fragmented,
    /// The IP total/payload length does not fit the frame or the headers.
    #[error("IP length {ip_len} inconsistent with {available} bytes available")]
    IpLengthMismatch { ip_len: usize, available: usize },
    /// The IP protocol / next header is not UDP.
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// UDP destination port is not 4791.
    #[error("UDP destination port {0} is not RoCEv2 (4791)")]
    WrongPort(u16),
    /// UDP length field inconsistent with the IP payload.
    #[error("UDP length {udp_len} does not match IP payload length {ip_payload}")]
    UdpLengthMismatch { udp_len: usize, ip_payload: usize },
    /// BTH opcode not in the opcode table (reserved, RD, or unsupported).
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// BTH transport header version is not 0.
    #[error("BTH TVer {0} is not 0")]
    BadTver(u8),
    /// The packet is too short for the headers its opcode requires, plus ICRC.
    #[error("opcode {opcode:#04x} needs {need} header bytes + ICRC, packet has {have}")]
    HeadersTruncated {
        opcode: u8,
        need: usize,
        have: usize,
    },
    /// Pad count is larger than the payload.
    #[error("pad count {pad} exceeds payload length {payload}")]
    PadBeyondPayload { pad: u8, payload: usize },
    /// An opcode without payload carries payload bytes.
    #[error("opcode {opcode:#04x} carries no payload, but {len} bytes follow the headers")]
    UnexpectedPayload { opcode: u8, len: usize },
    /// ICRC check failed.
    #[error("bad ICRC: computed {computed:#010x}, frame has {found:#010x}")]
    BadIcrc { computed: u32, found: u32 },
    /// Builder: the extension headers given do not match the opcode table entry.
    #[error(
        "opcode {opcode:#04x}: extension headers {given:?} given, table requires {required:?}"
    )]
    HeaderMismatch {
        opcode: u8,
        given: HdrMask,
        required: HdrMask,
    },
    /// Builder: source and destination GIDs are of different IP families.
    #[error("source and destination GIDs mix IPv4-mapped and IPv6")]
    MixedAddressFamilies,
    /// Builder: the frame would exceed the maximum size (IP length field or 64 KiB).
    #[error("frame too large: {0} bytes")]
    FrameTooLarge(usize),
}

impl WireError {
    /// The frame is not a RoCEv2 datagram at all (not IP, not UDP, not to port 4791, or an IP
    /// fragment), as opposed to a RoCEv2 datagram that is malformed.
    pub fn is_not_roce(&self) -> bool {
        matches!(
            self,
            WireError::NotIp(_)
                | WireError::NotUdp(_)
                | WireError::WrongPort(_)
                | WireError::Fragmented
        )
    }
}

/// Bounds-checked slice split: `buf[..n]`, `buf[n..]` or `Truncated`.
#[inline]
pub(crate) fn take<'a>(
    buf: &'a [u8],
    n: usize,
    what: &'static str,
) -> Result<(&'a [u8], &'a [u8]), WireError> {
    if buf.len() < n {
        return Err(WireError::Truncated {
            what,
            need: n,
            have: buf.len(),
        });
    }
    Ok(buf.split_at(n))
}

/// Bounds-checked mutable prefix of an output buffer.
#[inline]
pub(crate) fn out<'a>(
    buf: &'a mut [u8],
    n: usize,
    what: &'static str,
) -> Result<&'a mut [u8], WireError> {
    let have = buf.len();
    buf.get_mut(..n).ok_or(WireError::BufferTooSmall {
        what,
        need: n,
        have,
    })
}

#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
