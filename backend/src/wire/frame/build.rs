//! Send: [`PacketBuilder`] writes a whole frame into a reused buffer.

use super::*;

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

/// Describes a packet to send. Set `addr`, `bth` (pad count is computed) and the extension headers
/// the opcode requires, then call one of the `build*` methods.
///
/// ```
/// use vrdma_backend::wire::*;
/// let addr = Addressing::new(
///     [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2],
///     gid_from_ipv4([10, 0, 0, 1]), gid_from_ipv4([10, 0, 0, 2]),
///     udp_src_port(17, 18),
/// );
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
