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

/// A parsed, verified RoCEv2 frame borrowing from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<'a> {
    /// MACs, VLAN, GIDs (IPv4 → IPv4-mapped), TTL/hop limit, traffic class, flow label, UDP sport.
    pub addr: Addressing,
    pub ip_version: IpVersion,
    /// The raw IP header (20 bytes IPv4 / 40 bytes IPv6), e.g. for a UD receive's GRH area.
    pub ip_header: &'a [u8],
    pub bth: Bth,
    /// The opcode's table row.
    pub info: &'static OpcodeInfo,
    pub ext: ExtHeaders,
    /// Payload without pad (empty for opcodes without payload).
    pub payload: &'a [u8],
    /// Pad byte count (== `bth.pad_count`).
    pub pad: u8,
    /// The ICRC as carried (and verified).
    pub icrc: u32,
}

/// Give a (reused) frame buffer the length `total` without zeroing what it held: the builder
/// writes every byte of a frame (headers, payload, pad, ICRC), so stale bytes of an earlier frame
/// never survive (the test `every_byte_of_a_frame_is_written` checks each header combination).
/// Buffers circulate between devices on a fabric; zeroing each one cost a memset per packet.
fn set_frame_len(out: &mut Vec<u8>, total: usize) {
    if out.len() >= total {
        out.truncate(total);
    } else {
        out.resize(total, 0);
    }
}

/// Whether [`RocePacket::parse_with`] checks the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcCheck {
    /// Compare the carried ICRC with the computed one (frames from a network).
    Verify,
    /// Do not look at the ICRC field: the frame never left the process (a fabric hop, spec
    /// §16.2) or its ICRC was verified where it entered.
    Trusted,
}

/// The headers of a RoCEv2 frame up to UDP, located and length-checked (what parsing, the
/// port's classification and [`seal_icrc`] need): a received frame's Ethernet, IP and UDP
/// headers are read once, by [`locate`], and [`RocePacket::from_located`] goes on from here.
#[derive(Debug, Clone, Copy)]
pub struct Located<'a> {
    /// The whole frame.
    frame: &'a [u8],
    eth: EthHeader,
    ip_version: IpVersion,
    ip_header: &'a [u8],
    udp: UdpHeader,
    /// The UDP header's bytes.
    udp_header: &'a [u8],
    /// BTH .. pad (the UDP payload without the ICRC).
    body: &'a [u8],
    icrc_found: u32,
    src_gid: Gid,
    dst_gid: Gid,
    hop: u8,
    tc: u8,
    fl: u32,
}

impl<'a> Located<'a> {
    /// The whole frame.
    pub fn frame(&self) -> &'a [u8] {
        self.frame
    }

    /// The Ethernet destination MAC.
    pub fn dst_mac(&self) -> MacAddr {
        self.eth.dst
    }

    /// The IP destination address as a GID (IPv4 as `::ffff:a.b.c.d`).
    pub fn dst_gid(&self) -> Gid {
        self.dst_gid
    }
}

/// Locate and length-check the Ethernet, IP and UDP headers of a RoCEv2 frame. Frames that are
/// not RoCEv2 at all fail with [`WireError::is_not_roce`] errors; the others are malformed.
pub fn locate(frame: &[u8]) -> Result<Located<'_>, WireError> {
    let (eth, l3) = EthHeader::parse(frame)?;
    let (ip_version, ip_header, ip_payload, src_gid, dst_gid, hop, tc, fl) = match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let (ip, after) = Ipv4Header::parse(l3)?;
            let total = usize::from(ip.total_len);
            if total < Ipv4Header::LEN || total > l3.len() {
                return Err(WireError::IpLengthMismatch {
                    ip_len: total,
                    available: l3.len(),
                });
            }
            if ip.is_fragment() {
                return Err(WireError::Fragmented);
            }
            if ip.protocol != PROTO_UDP {
                return Err(WireError::NotUdp(ip.protocol));
            }
            let payload = &after[..total - Ipv4Header::LEN];
            (
                IpVersion::V4,
                &l3[..Ipv4Header::LEN],
                payload,
                gid_from_ipv4(ip.src),
                gid_from_ipv4(ip.dst),
                ip.ttl,
                ip.tos,
                0,
            )
        }
        ETHERTYPE_IPV6 => {
            let (ip, after) = Ipv6Header::parse(l3)?;
            let plen = usize::from(ip.payload_len);
            if plen > after.len() {
                return Err(WireError::IpLengthMismatch {
                    ip_len: plen + Ipv6Header::LEN,
                    available: l3.len(),
                });
            }
            if ip.next_header != PROTO_UDP {
                return Err(WireError::NotUdp(ip.next_header));
            }
            (
                IpVersion::V6,
                &l3[..Ipv6Header::LEN],
                &after[..plen],
                ip.src,
                ip.dst,
                ip.hop_limit,
                ip.traffic_class,
                ip.flow_label,
            )
        }
        t => return Err(WireError::NotIp(t)),
    };
    let (udp, udp_payload) = UdpHeader::parse(ip_payload)?;
    if udp.dst_port != ROCEV2_UDP_PORT {
        return Err(WireError::WrongPort(udp.dst_port));
    }
    if usize::from(udp.length) != ip_payload.len() {
        return Err(WireError::UdpLengthMismatch {
            udp_len: usize::from(udp.length),
            ip_payload: ip_payload.len(),
        });
    }
    let udp_header = &ip_payload[..UdpHeader::LEN];
    if udp_payload.len() < Bth::LEN + ICRC_LEN {
        return Err(WireError::Truncated {
            what: "BTH + ICRC",
            need: Bth::LEN + ICRC_LEN,
            have: udp_payload.len(),
        });
    }
    let (body, icrc_bytes) = udp_payload.split_at(udp_payload.len() - ICRC_LEN);
    Ok(Located {
        frame,
        eth,
        ip_version,
        ip_header,
        udp,
        udp_header,
        body,
        icrc_found: u32::from_le_bytes([
            icrc_bytes[0],
            icrc_bytes[1],
            icrc_bytes[2],
            icrc_bytes[3],
        ]),
        src_gid,
        dst_gid,
        hop,
        tc,
        fl,
    })
}

/// Compute and store the ICRC of a RoCEv2 frame built without one ([`PacketBuilder::icrc`]
/// false), before it leaves the process (spec §16.2). `Ok(false)`: not a RoCEv2 frame (not
/// IP/UDP to port 4791), left unchanged; a malformed RoCEv2 frame is an error, also unchanged.
pub fn seal_icrc(frame: &mut [u8]) -> Result<bool, WireError> {
    let (icrc, at) = match locate(frame) {
        Ok(l) => {
            let icrc = super::icrc::compute(l.ip_header, l.udp_header, l.body)?;
            let at = l.body.as_ptr() as usize - frame.as_ptr() as usize + l.body.len();
            (icrc, at)
        }
        Err(e) if e.is_not_roce() => return Ok(false),
        Err(e) => return Err(e),
    };
    frame[at..at + ICRC_LEN].copy_from_slice(&icrc.to_le_bytes());
    Ok(true)
}

impl<'a> RocePacket<'a> {
    /// Parse and verify a whole Ethernet frame. Trailing bytes after the IP datagram (Ethernet
    /// minimum-size padding) are ignored. The UDP checksum is not checked (the ICRC covers the
    /// datagram; RoCEv2 senders commonly send 0).
    pub fn parse(frame: &'a [u8]) -> Result<RocePacket<'a>, WireError> {
        Self::parse_with(frame, IcrcCheck::Verify)
    }

    /// [`RocePacket::parse`], checking the ICRC or not (`check`).
    pub fn parse_with(frame: &'a [u8], check: IcrcCheck) -> Result<RocePacket<'a>, WireError> {
        Self::from_located(locate(frame)?, check)
    }

    /// Parse the rest of a frame whose headers up to UDP [`locate`] found (BTH, extension
    /// headers, payload, pad), checking the ICRC or not (`check`).
    pub fn from_located(l: Located<'a>, check: IcrcCheck) -> Result<RocePacket<'a>, WireError> {
        let Located {
            frame: _,
            eth,
            ip_version,
            ip_header,
            udp,
            body,
            icrc_found: found,
            src_gid,
            dst_gid,
            hop,
            tc,
            fl,
            udp_header,
        } = l;
        if check == IcrcCheck::Verify {
            let computed = super::icrc::compute(ip_header, udp_header, body)?;
            if computed != found {
                return Err(WireError::BadIcrc { computed, found });
            }
        }

        let (bth, after_bth) = Bth::parse(body)?;
        if bth.tver != 0 {
            return Err(WireError::BadTver(bth.tver));
        }
        let info = bth.opcode.info();
        if body.len() < info.hdr_len {
            return Err(WireError::HeadersTruncated {
                opcode: bth.opcode as u8,
                need: info.hdr_len,
                have: body.len(),
            });
        }
        let (ext, rest) = ExtHeaders::parse(info.headers, after_bth)?;
        let pad = bth.pad_count;
        if !info.payload && !rest.is_empty() {
            return Err(WireError::UnexpectedPayload {
                opcode: bth.opcode as u8,
                len: rest.len(),
            });
        }
        if usize::from(pad) > rest.len() {
            return Err(WireError::PadBeyondPayload {
                pad,
                payload: rest.len(),
            });
        }
        let payload = &rest[..rest.len() - usize::from(pad)];
        Ok(RocePacket {
            addr: Addressing {
                src_mac: eth.src,
                dst_mac: eth.dst,
                vlan: eth.vlan,
                src_gid,
                dst_gid,
                hop_limit: hop,
                traffic_class: tc,
                flow_label: fl,
                udp_src_port: udp.src_port,
            },
            ip_version,
            ip_header,
            bth,
            info,
            ext,
            payload,
            pad,
            icrc: found,
        })
    }
}

impl RocePacket<'_> {
    /// The 40-byte GRH area a UD/GSI receive gets (spec §6, DESIGN "WQEs"): for IPv6 the IPv6
    /// header; for IPv4 the IPv4 header in bytes 20..39 with bytes 0..19 zero.
    pub fn grh(&self) -> [u8; 40] {
        let mut g = [0u8; 40];
        let h = self.ip_header;
        match self.ip_version {
            IpVersion::V6 => g.copy_from_slice(&h[..Ipv6Header::LEN]),
            IpVersion::V4 => g[20..].copy_from_slice(&h[..Ipv4Header::LEN]),
        }
        g
    }
}

/// Describes a packet to send. Set `addr`, `bth` (pad count is computed) and the extension headers
/// the opcode requires, then call one of the `build*` methods.
///
/// ```
/// use vrdma_backend::wire::*;
/// let addr = Addressing {
///     src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2], vlan: None,
///     src_gid: gid_from_ipv4([10, 0, 0, 1]), dst_gid: gid_from_ipv4([10, 0, 0, 2]),
///     hop_limit: 64, traffic_class: 0, flow_label: 0, udp_src_port: udp_src_port(17, 18),
/// };
/// let b = PacketBuilder::new(addr, Bth::new(Opcode::RcWriteOnly, 18, 100))
///     .with_reth(Reth { va: 0x1000, rkey: 0x100, dma_len: 5 });
/// let mut frame = Vec::new();
/// b.build(&[b"hello"], &mut frame).unwrap();
/// let p = RocePacket::parse(&frame).unwrap();
/// assert_eq!(p.payload, b"hello");
/// assert_eq!(p.pad, 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketBuilder {
    pub addr: Addressing,
    pub bth: Bth,
    pub ext: ExtHeaders,
    /// IPv6 only: compute the UDP checksum (`true`) or send 0 (`false`, the default — what Linux
    /// rxe sends, RFC 6935 zero-checksum UDP tunnels; the ICRC protects the packet). IPv4 always
    /// sends 0.
    pub udp6_checksum: bool,
    /// Compute the ICRC (`true`, the default). `false` leaves the field zero (and skips the IPv6
    /// UDP checksum, which would cover it): for frames that go to a fabric, which seals them with
    /// [`seal_icrc`] only if they leave the process (spec §16.2).
    pub icrc: bool,
}

/// Offsets computed by [`PacketBuilder::layout`].
#[derive(Debug, Clone, Copy)]
struct Layout {
    v: IpVersion,
    eth_len: usize,
    ip_len: usize,
    /// UDP payload: BTH .. ICRC inclusive.
    udp_data: usize,
    pad: usize,
    total: usize,
}

impl PacketBuilder {
    pub fn new(addr: Addressing, bth: Bth) -> PacketBuilder {
        PacketBuilder {
            addr,
            bth,
            ext: ExtHeaders::default(),
            udp6_checksum: false,
            icrc: true,
        }
    }

    pub fn with_deth(mut self, h: Deth) -> Self {
        self.ext.deth = Some(h);
        self
    }
    pub fn with_xrceth(mut self, h: Xrceth) -> Self {
        self.ext.xrceth = Some(h);
        self
    }
    pub fn with_feth(mut self, h: Feth) -> Self {
        self.ext.feth = Some(h);
        self
    }
    pub fn with_reth(mut self, h: Reth) -> Self {
        self.ext.reth = Some(h);
        self
    }
    pub fn with_atomic_eth(mut self, h: AtomicEth) -> Self {
        self.ext.atomic_eth = Some(h);
        self
    }
    pub fn with_aeth(mut self, h: Aeth) -> Self {
        self.ext.aeth = Some(h);
        self
    }
    pub fn with_atomic_ack_eth(mut self, h: AtomicAckEth) -> Self {
        self.ext.atomic_ack_eth = Some(h);
        self
    }
    pub fn with_immdt(mut self, h: ImmDt) -> Self {
        self.ext.immdt = Some(h);
        self
    }
    pub fn with_ieth(mut self, h: Ieth) -> Self {
        self.ext.ieth = Some(h);
        self
    }

    /// Length of everything before the payload (Ethernet through extension headers).
    pub fn header_len(&self) -> Result<usize, WireError> {
        let l = self.layout(0)?;
        Ok(l.eth_len + l.ip_len + UdpHeader::LEN + self.bth.opcode.info().hdr_len)
    }

    /// Total frame length for a payload of `payload_len` bytes.
    pub fn frame_len(&self, payload_len: usize) -> Result<usize, WireError> {
        Ok(self.layout(payload_len)?.total)
    }

    fn layout(&self, payload_len: usize) -> Result<Layout, WireError> {
        let info = self.bth.opcode.info();
        let given = self.ext.mask();
        if given != info.headers {
            return Err(WireError::HeaderMismatch {
                opcode: info.opcode as u8,
                given,
                required: info.headers,
            });
        }
        if !info.payload && payload_len != 0 {
            return Err(WireError::UnexpectedPayload {
                opcode: info.opcode as u8,
                len: payload_len,
            });
        }
        let v = self.addr.ip_version()?;
        let eth_len = if self.addr.vlan.is_some() {
            EthHeader::LEN_VLAN
        } else {
            EthHeader::LEN
        };
        let ip_len = match v {
            IpVersion::V4 => Ipv4Header::LEN,
            IpVersion::V6 => Ipv6Header::LEN,
        };
        let pad = payload_len.wrapping_neg() & 3;
        let udp_data = info.hdr_len + payload_len + pad + ICRC_LEN;
        // IPv4 total length and UDP length are 16-bit.
        let limit = match v {
            IpVersion::V4 => usize::from(u16::MAX) - Ipv4Header::LEN - UdpHeader::LEN,
            IpVersion::V6 => usize::from(u16::MAX) - UdpHeader::LEN,
        };
        if udp_data > limit {
            return Err(WireError::FrameTooLarge(
                eth_len + ip_len + UdpHeader::LEN + udp_data,
            ));
        }
        Ok(Layout {
            v,
            eth_len,
            ip_len,
            udp_data,
            pad,
            total: eth_len + ip_len + UdpHeader::LEN + udp_data,
        })
    }

    /// Write everything except payload and ICRC into `buf[..total]`: headers, zeroed pad.
    /// Returns the payload range.
    fn write_headers(
        &self,
        l: &Layout,
        buf: &mut [u8],
    ) -> Result<core::ops::Range<usize>, WireError> {
        if buf.len() < l.total {
            return Err(WireError::BufferTooSmall {
                what: "frame",
                need: l.total,
                have: buf.len(),
            });
        }
        let a = &self.addr;
        let mut off = EthHeader {
            dst: a.dst_mac,
            src: a.src_mac,
            vlan: a.vlan,
            ethertype: match l.v {
                IpVersion::V4 => ETHERTYPE_IPV4,
                IpVersion::V6 => ETHERTYPE_IPV6,
            },
        }
        .write(buf)?;
        let udp_len = (UdpHeader::LEN + l.udp_data) as u16;
        match l.v {
            IpVersion::V4 => {
                let mut src = [0u8; 4];
                let mut dst = [0u8; 4];
                src.copy_from_slice(&a.src_gid[12..]);
                dst.copy_from_slice(&a.dst_gid[12..]);
                off += Ipv4Header {
                    tos: a.traffic_class,
                    total_len: (Ipv4Header::LEN as u16) + udp_len,
                    id: 0,
                    flags_frag: FLAG_DF,
                    ttl: a.hop_limit,
                    protocol: PROTO_UDP,
                    checksum: 0,
                    src,
                    dst,
                }
                .write(&mut buf[off..])?;
            }
            IpVersion::V6 => {
                off += Ipv6Header {
                    traffic_class: a.traffic_class,
                    flow_label: a.flow_label & 0xfffff,
                    payload_len: udp_len,
                    next_header: PROTO_UDP,
                    hop_limit: a.hop_limit,
                    src: a.src_gid,
                    dst: a.dst_gid,
                }
                .write(&mut buf[off..])?;
            }
        }
        off += UdpHeader {
            src_port: a.udp_src_port,
            dst_port: ROCEV2_UDP_PORT,
            length: udp_len,
            checksum: 0,
        }
        .write(&mut buf[off..])?;
        let mut bth = self.bth;
        bth.pad_count = l.pad as u8;
        off += bth.write(&mut buf[off..])?;
        off += self.ext.write(&mut buf[off..])?;
        let payload_end = l.total - ICRC_LEN - l.pad;
        buf[payload_end..l.total - ICRC_LEN].fill(0);
        Ok(off..payload_end)
    }

    /// Compute the IPv6 UDP checksum (if IPv6) and the ICRC over a frame whose headers and payload
    /// are in place.
    fn finish(&self, l: &Layout, frame: &mut [u8]) -> Result<(), WireError> {
        let ip_start = l.eth_len;
        let udp_start = ip_start + l.ip_len;
        let icrc_at = l.total - ICRC_LEN;
        if !self.icrc {
            frame[icrc_at..l.total].fill(0);
            return Ok(());
        }
        // ICRC first: the optional IPv6 UDP checksum covers it (the ICRC masks the UDP checksum).
        let icrc = {
            let (ip, rest) = frame[ip_start..icrc_at].split_at(l.ip_len);
            let (udp, rest) = rest.split_at(UdpHeader::LEN);
            let (bth, rest) = rest.split_at(Bth::LEN);
            let mut c = Icrc::start(ip, udp, bth)?;
            c.update(rest);
            c.finish()
        };
        frame[icrc_at..l.total].copy_from_slice(&icrc.to_le_bytes());
        if l.v == IpVersion::V6 && self.udp6_checksum {
            let sum = ipv6_udp_checksum(
                &self.addr.src_gid,
                &self.addr.dst_gid,
                &[&frame[udp_start..l.total]],
            );
            frame[udp_start + 6..udp_start + 8].copy_from_slice(&sum.to_be_bytes());
        }
        Ok(())
    }

    /// Build into a fixed buffer; the payload is the concatenation of `payload` pieces.
    /// Returns the frame length.
    pub fn build_into(&self, payload: &[&[u8]], buf: &mut [u8]) -> Result<usize, WireError> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let l = self.layout(len)?;
        let range = self.write_headers(&l, buf)?;
        let mut at = range.start;
        for p in payload {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.finish(&l, &mut buf[..l.total])?;
        Ok(l.total)
    }

    /// Build into `out` (resized to the frame length, every byte written); the payload is the
    /// concatenation of the `payload` pieces (scatter list).
    pub fn build(&self, payload: &[&[u8]], out: &mut Vec<u8>) -> Result<(), WireError> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let l = self.layout(len)?;
        set_frame_len(out, l.total);
        self.build_into(payload, out).map(|_| ())
    }

    /// Build into `out` (resized to the frame length) with a payload of `payload_len` bytes
    /// written in place by `fill` (e.g. straight from guest memory). `fill` gets exactly
    /// `payload_len` bytes and must write all of them; its error aborts the build.
    pub fn build_with<E: From<WireError>>(
        &self,
        payload_len: usize,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let l = self.layout(payload_len)?;
        set_frame_len(out, l.total);
        let range = self.write_headers(&l, out)?;
        fill(&mut out[range])?;
        self.finish(&l, out)?;
        Ok(())
    }

    /// [`PacketBuilder::build_with`] into the start of `buf` (which must be at least the frame
    /// long; bytes after the frame are left alone); returns the frame length. For frames
    /// written back to back into one buffer without zeroing it first, e.g. a fabric segment
    /// (`wire::segment`).
    pub fn build_with_in<E: From<WireError>>(
        &self,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        let l = self.layout(payload_len)?;
        let have = buf.len();
        let frame = buf.get_mut(..l.total).ok_or(WireError::BufferTooSmall {
            what: "frame",
            need: l.total,
            have,
        })?;
        let range = self.write_headers(&l, frame)?;
        fill(&mut frame[range])?;
        self.finish(&l, frame)?;
        Ok(l.total)
    }
}
