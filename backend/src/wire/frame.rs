//! Whole RoCEv2 frames: Ethernet [802.1Q] / IPv4|IPv6 / UDP 4791 / BTH / ext headers / payload /
//! pad / ICRC.
//!
//! Receive: [`RocePacket::parse`] gives a borrowed view with everything checked (lengths, IPv4
//! checksum, port, opcode table, pad, ICRC). Send: [`PacketBuilder`] writes a frame into a
//! caller-owned `Vec<u8>` (reused across packets, so the hot path does not allocate once it has
//! grown), computing pad, IP lengths and checksum, UDP length (and checksum for IPv6) and ICRC.

use super::eth::{EthHeader, MacAddr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use super::icrc::Icrc;
use super::ipv4::{Ipv4Header, FLAG_DF, PROTO_UDP};
use super::ipv6::Ipv6Header;
use super::opcode::{HdrMask, OpcodeInfo};
use super::udp::{ipv6_udp_checksum, UdpHeader};
use super::{
    Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Feth, Ieth, ImmDt, Reth, WireError, Xrceth, ICRC_LEN,
    ROCEV2_UDP_PORT,
};

/// A GID: an IPv6 address, or an IPv4-mapped one (::ffff:a.b.c.d) for IPv4.
pub type Gid = [u8; 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpVersion {
    V4,
    V6,
}

/// Whether `gid` is an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
#[inline]
pub fn is_ipv4_mapped(gid: &Gid) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// ::ffff:a.b.c.d
#[inline]
pub fn gid_from_ipv4(ip: [u8; 4]) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The IPv4 address of an IPv4-mapped GID.
#[inline]
pub fn gid_to_ipv4(gid: &Gid) -> Option<[u8; 4]> {
    if is_ipv4_mapped(gid) {
        let mut a = [0u8; 4];
        a.copy_from_slice(&gid[12..]);
        Some(a)
    } else {
        None
    }
}

/// RoCEv2 UDP source port for a flow: a hash of (source QPN, destination QPN) in 0xC000..=0xFFFF.
pub fn udp_src_port(src_qpn: u32, dst_qpn: u32) -> u16 {
    let mut x = (u64::from(src_qpn & 0xff_ffff) << 24) | u64::from(dst_qpn & 0xff_ffff);
    // splitmix64 finaliser: every input bit affects the low bits.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    0xc000 | (x as u16 & 0x3fff)
}

/// L2/L3/L4 addressing of a RoCEv2 packet. For IPv4, `traffic_class` is the TOS byte,
/// `hop_limit` the TTL and `flow_label` is not sent (parsed as 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    /// 802.1Q TCI if the frame is (to be) tagged.
    pub vlan: Option<u16>,
    pub src_gid: Gid,
    pub dst_gid: Gid,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub udp_src_port: u16,
}

impl Addressing {
    /// Untagged addressing with the IP defaults of a new flow: hop limit 64, traffic class 0,
    /// flow label 0.
    pub fn new(
        src_mac: MacAddr,
        dst_mac: MacAddr,
        src_gid: Gid,
        dst_gid: Gid,
        udp_src_port: u16,
    ) -> Addressing {
        Addressing {
            src_mac,
            dst_mac,
            vlan: None,
            src_gid,
            dst_gid,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            udp_src_port,
        }
    }

    /// IP version implied by the GIDs: both IPv4-mapped → V4, neither → V6, mixed → error.
    pub fn ip_version(&self) -> Result<IpVersion, WireError> {
        match (is_ipv4_mapped(&self.src_gid), is_ipv4_mapped(&self.dst_gid)) {
            (true, true) => Ok(IpVersion::V4),
            (false, false) => Ok(IpVersion::V6),
            _ => Err(WireError::MixedAddressFamilies),
        }
    }

    /// Addressing for a packet going back to the sender of a packet with this addressing:
    /// MACs and GIDs swapped; VLAN, hop limit, traffic class, flow label and UDP source port kept.
    pub fn reply(&self) -> Addressing {
        Addressing {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src_gid: self.dst_gid,
            dst_gid: self.src_gid,
            ..*self
        }
    }
}

/// The extension headers of a packet; which are present is given by the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    pub deth: Option<Deth>,
    pub xrceth: Option<Xrceth>,
    pub feth: Option<Feth>,
    pub reth: Option<Reth>,
    pub atomic_eth: Option<AtomicEth>,
    pub aeth: Option<Aeth>,
    pub atomic_ack_eth: Option<AtomicAckEth>,
    pub immdt: Option<ImmDt>,
    pub ieth: Option<Ieth>,
}

impl ExtHeaders {
    /// Which headers are present.
    pub fn mask(&self) -> HdrMask {
        let mut m = HdrMask::NONE;
        let mut add = |present: bool, h: HdrMask| {
            if present {
                m = m | h;
            }
        };
        add(self.deth.is_some(), HdrMask::DETH);
        add(self.xrceth.is_some(), HdrMask::XRCETH);
        add(self.feth.is_some(), HdrMask::FETH);
        add(self.reth.is_some(), HdrMask::RETH);
        add(self.atomic_eth.is_some(), HdrMask::ATOMIC_ETH);
        add(self.aeth.is_some(), HdrMask::AETH);
        add(self.atomic_ack_eth.is_some(), HdrMask::ATOMIC_ACK_ETH);
        add(self.immdt.is_some(), HdrMask::IMMDT);
        add(self.ieth.is_some(), HdrMask::IETH);
        m
    }

    /// Parse the headers in `mask`, in wire order.
    pub fn parse(mask: HdrMask, mut buf: &[u8]) -> Result<(ExtHeaders, &[u8]), WireError> {
        let mut e = ExtHeaders::default();
        if mask.contains(HdrMask::DETH) {
            let (h, r) = Deth::parse(buf)?;
            e.deth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::XRCETH) {
            let (h, r) = Xrceth::parse(buf)?;
            e.xrceth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::FETH) {
            let (h, r) = Feth::parse(buf)?;
            e.feth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::RETH) {
            let (h, r) = Reth::parse(buf)?;
            e.reth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::ATOMIC_ETH) {
            let (h, r) = AtomicEth::parse(buf)?;
            e.atomic_eth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::AETH) {
            let (h, r) = Aeth::parse(buf)?;
            e.aeth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::ATOMIC_ACK_ETH) {
            let (h, r) = AtomicAckEth::parse(buf)?;
            e.atomic_ack_eth = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::IMMDT) {
            let (h, r) = ImmDt::parse(buf)?;
            e.immdt = Some(h);
            buf = r;
        }
        if mask.contains(HdrMask::IETH) {
            let (h, r) = Ieth::parse(buf)?;
            e.ieth = Some(h);
            buf = r;
        }
        Ok((e, buf))
    }

    /// Write the present headers in wire order; returns the bytes written.
    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut n = 0;
        macro_rules! put {
            ($h:expr) => {
                if let Some(h) = &$h {
                    n += h.write(buf.get_mut(n..).unwrap_or_default())?;
                }
            };
        }
        put!(self.deth);
        put!(self.xrceth);
        put!(self.feth);
        put!(self.reth);
        put!(self.atomic_eth);
        put!(self.aeth);
        put!(self.atomic_ack_eth);
        put!(self.immdt);
        put!(self.ieth);
        Ok(n)
    }
}

mod build;
mod parse;
pub use build::*;
pub use parse::*;
