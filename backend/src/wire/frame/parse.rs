//! Receive: a RoCEv2 frame located ([`locate`]), then parsed and checked into a borrowed
//! [`RocePacket`].

use super::*;

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
    ip: IpLayer<'a>,
    udp: UdpHeader,
    /// The UDP header's bytes.
    udp_header: &'a [u8],
    /// BTH .. pad (the UDP payload without the ICRC).
    body: &'a [u8],
    icrc_found: u32,
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
        self.ip.dst_gid
    }

    /// The BTH's destination QP, if the UDP payload holds a whole BTH.
    pub fn dest_qpn(&self) -> Option<u32> {
        Bth::parse(self.body).ok().map(|(b, _)| b.dest_qp)
    }
}

/// The IP layer of a received frame: its header bytes, the UDP datagram it carries and the
/// fields [`Located`] keeps.
#[derive(Debug, Clone, Copy)]
struct IpLayer<'a> {
    version: IpVersion,
    header: &'a [u8],
    payload: &'a [u8],
    src_gid: Gid,
    dst_gid: Gid,
    hop: u8,
    tc: u8,
    fl: u32,
}

/// An IPv4 header with its total length checked against `l3`, unfragmented, carrying UDP.
fn ipv4_layer(l3: &[u8]) -> Result<IpLayer<'_>, WireError> {
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
    Ok(IpLayer {
        version: IpVersion::V4,
        header: &l3[..Ipv4Header::LEN],
        payload: &after[..total - Ipv4Header::LEN],
        src_gid: gid_from_ipv4(ip.src),
        dst_gid: gid_from_ipv4(ip.dst),
        hop: ip.ttl,
        tc: ip.tos,
        fl: 0,
    })
}

/// An IPv6 header with its payload length checked against `l3`, carrying UDP.
fn ipv6_layer(l3: &[u8]) -> Result<IpLayer<'_>, WireError> {
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
    Ok(IpLayer {
        version: IpVersion::V6,
        header: &l3[..Ipv6Header::LEN],
        payload: &after[..plen],
        src_gid: ip.src,
        dst_gid: ip.dst,
        hop: ip.hop_limit,
        tc: ip.traffic_class,
        fl: ip.flow_label,
    })
}

/// Locate and length-check the Ethernet, IP and UDP headers of a RoCEv2 frame. Frames that are
/// not RoCEv2 at all fail with [`WireError::is_not_roce`] errors; the others are malformed.
pub fn locate(frame: &[u8]) -> Result<Located<'_>, WireError> {
    let (eth, l3) = EthHeader::parse(frame)?;
    let ip = match eth.ethertype {
        ETHERTYPE_IPV4 => ipv4_layer(l3)?,
        ETHERTYPE_IPV6 => ipv6_layer(l3)?,
        t => return Err(WireError::NotIp(t)),
    };
    let ip_payload = ip.payload;
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
        ip,
        udp,
        udp_header,
        body,
        icrc_found: u32::from_le_bytes([
            icrc_bytes[0],
            icrc_bytes[1],
            icrc_bytes[2],
            icrc_bytes[3],
        ]),
    })
}

/// Compute and store the ICRC of a RoCEv2 frame built without one ([`PacketBuilder::icrc`]
/// false), before it leaves the process (spec §16.2). `Ok(false)`: not a RoCEv2 frame (not
/// IP/UDP to port 4791), left unchanged; a malformed RoCEv2 frame is an error, also unchanged.
pub fn seal_icrc(frame: &mut [u8]) -> Result<bool, WireError> {
    let (icrc, at) = match locate(frame) {
        Ok(l) => {
            let icrc = crate::wire::icrc::compute(l.ip.header, l.udp_header, l.body)?;
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
            ip,
            udp,
            body,
            icrc_found: found,
            udp_header,
        } = l;
        if check == IcrcCheck::Verify {
            let computed = crate::wire::icrc::compute(ip.header, udp_header, body)?;
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
                src_gid: ip.src_gid,
                dst_gid: ip.dst_gid,
                hop_limit: ip.hop,
                traffic_class: ip.tc,
                flow_label: ip.fl,
                udp_src_port: udp.src_port,
            },
            ip_version: ip.version,
            ip_header: ip.header,
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
