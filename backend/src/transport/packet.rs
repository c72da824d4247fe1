//! The transport's view of packets: [`RxPkt`] (a parsed RoCEv2 frame plus the network facts the
//! responder needs for UD/GSI receives) and [`TxMeta`] + `build` (what the transport wants sent). The
//! conversion to and from Ethernet frames is `wire::frame` (parse, ICRC, build); this file only
//! adapts it so the state machines stay independent of frame layout details.

use crate::wire::{
    Addressing, Aeth, AtomicAckEth, AtomicEth, Bth, Deth, ExtHeaders, Feth, IcrcCheck, Ieth, ImmDt,
    IpVersion, Opcode, OpcodeInfo, Operation, PacketBuilder, Position, Reth, RocePacket, Transport,
    WireError, Xrceth,
};

/// Addressing of a QP's primary path or of an AH (spec §15): everything below the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Path {
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// 802.1Q VLAN id, `None` when untagged.
    pub vlan: Option<u16>,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
    /// Compute the ICRC (false on a fabric port: the fabric seals frames that leave the
    /// process, spec §16.2).
    pub icrc: bool,
}

/// A received RoCEv2 packet, already validated by `wire` (lengths, ICRC).
#[derive(Debug, Clone)]
pub struct RxPkt<'a> {
    pub info: &'static OpcodeInfo,
    pub bth: Bth,
    /// XRC requests (spec §13.7): the XRC SRQ the request is for.
    pub xrceth: Option<Xrceth>,
    pub feth: Option<Feth>,
    pub reth: Option<Reth>,
    pub aeth: Option<Aeth>,
    pub atomic: Option<AtomicEth>,
    pub atomic_ack: Option<AtomicAckEth>,
    pub deth: Option<Deth>,
    pub imm: Option<ImmDt>,
    pub ieth: Option<Ieth>,
    /// Payload without pad and ICRC.
    pub payload: &'a [u8],
    /// Source MAC (UD CQE `smac`).
    pub smac: [u8; 6],
    pub vlan: Option<u16>,
    /// The 40-byte GRH area a UD/GSI receive gets (spec §6.2): the IPv6 header, or the IPv4 header
    /// in bytes 20..39.
    pub grh: [u8; 40],
    /// True for IPv4 (network_hdr_type IPv4), false for IPv6.
    pub ipv4: bool,
    /// Source GID of the packet (IPv4-mapped for IPv4).
    pub sgid: [u8; 16],
    /// Destination GID of the packet (IPv4-mapped for IPv4).
    pub dgid: [u8; 16],
    /// The payload is held by reference in the sender's guest memory (a by-reference fabric
    /// segment, spec §16.2 rule 6): then `payload` has the right length but NOT the bytes (it
    /// must not be read), and the responder copies from here (`onecopy::write_payload`). Set
    /// only by `transport::on_frame_ref_at`, never from a frame's bytes.
    pub payload_ref: Option<PayloadSrc<'a>>,
}

/// The by-reference payload of one frame of a fabric segment: the segment's references and the
/// frame's index in it.
#[derive(Debug, Clone, Copy)]
pub struct PayloadSrc<'a> {
    pub refs: &'a dyn crate::wire::segment::PayloadRefs,
    pub frame: usize,
}

impl RxPkt<'_> {
    pub fn opcode(&self) -> Opcode {
        self.bth.opcode
    }
    pub fn psn(&self) -> u32 {
        self.bth.psn
    }
    pub fn op(&self) -> Operation {
        self.info.operation
    }
    pub fn pos(&self) -> Position {
        self.info.position
    }
}

/// Pick the opcode for (transport, operation, position, immediate, invalidate) from the table.
pub fn opcode_for(
    t: Transport,
    op: Operation,
    pos: Position,
    imm: bool,
    inv: bool,
) -> Option<Opcode> {
    // The table is small (62 rows): a linear search keeps this table-driven, not a hand switch.
    crate::wire::opcode::OPCODES
        .iter()
        .find(|r| {
            r.transport == t
                && r.operation == op
                && r.position == pos
                && r.has_imm() == imm
                && r.has_inv() == inv
        })
        .map(|r| r.opcode)
}

/// Parse and verify a frame (`wire` checks lengths, checksums, the opcode table and the ICRC).
pub fn parse(frame: &[u8]) -> Option<RxPkt<'_>> {
    parse_checked(frame).ok()
}

/// [`parse`] that says why a frame was refused (the port counts ICRC errors apart, §11.9).
pub fn parse_checked(frame: &[u8]) -> Result<RxPkt<'_>, crate::wire::WireError> {
    parse_checked_with(frame, IcrcCheck::Verify)
}

/// [`parse_checked`], checking the ICRC or not (a frame from a fabric port, spec §16.2).
pub fn parse_checked_with(
    frame: &[u8],
    icrc: IcrcCheck,
) -> Result<RxPkt<'_>, crate::wire::WireError> {
    rx_pkt(RocePacket::parse_with(frame, icrc)?)
}

/// [`parse_checked_with`] for a frame whose headers up to UDP are located already.
pub fn parse_located(
    l: crate::wire::Located<'_>,
    icrc: IcrcCheck,
) -> Result<RxPkt<'_>, crate::wire::WireError> {
    rx_pkt(RocePacket::from_located(l, icrc)?)
}

fn rx_pkt(p: RocePacket<'_>) -> Result<RxPkt<'_>, crate::wire::WireError> {
    let ipv4 = p.ip_version == IpVersion::V4;
    let mut grh = [0u8; 40];
    if ipv4 {
        let n = p.ip_header.len().min(20);
        grh[20..20 + n].copy_from_slice(&p.ip_header[..n]);
    } else {
        let n = p.ip_header.len().min(40);
        grh[..n].copy_from_slice(&p.ip_header[..n]);
    }
    Ok(RxPkt {
        info: p.info,
        bth: p.bth,
        xrceth: p.ext.xrceth,
        feth: p.ext.feth,
        reth: p.ext.reth,
        aeth: p.ext.aeth,
        atomic: p.ext.atomic_eth,
        atomic_ack: p.ext.atomic_ack_eth,
        deth: p.ext.deth,
        imm: p.ext.immdt,
        ieth: p.ext.ieth,
        payload: p.payload,
        smac: p.addr.src_mac,
        vlan: p.addr.vlan,
        grh,
        ipv4,
        sgid: p.addr.src_gid,
        dgid: p.addr.dst_gid,
        payload_ref: None,
    })
}

thread_local! {
    /// Frame buffers of this thread, reused: the engine returns every frame it has sent
    /// ([`recycle_frame`]) and [`build`] takes from here, so the steady state allocates no frame.
    /// Per thread because the engine thread both builds and sends; no lock on the data path.
    static FRAME_POOL: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most buffers a thread's frame pool keeps (beyond that, returned frames are freed).
pub const FRAME_POOL_MAX: usize = 1024;

thread_local! {
    /// Large buffers (fabric segments, [`SEGMENT_BUF_MIN`] bytes or more) of this thread, kept
    /// apart so a segment gets a buffer that already has its size (no reallocation per
    /// segment) and single frames never pin one.
    static SEGMENT_POOL: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A returned buffer at least this large goes to the segment pool.
pub const SEGMENT_BUF_MIN: usize = 32 << 10;
/// Most buffers a thread's segment pool keeps (64 x at most 72 KiB).
pub const SEGMENT_POOL_MAX: usize = 64;

/// A buffer for a fabric segment: a large returned one if there is one, else any frame buffer,
/// else a new one of a segment's full size (a small new one would be reallocated as the
/// segment grows, and circulate on the fabric at that small size).
pub fn segment_buf() -> Vec<u8> {
    SEGMENT_POOL
        .with(|p| p.borrow_mut().pop())
        .or_else(|| FRAME_POOL.with(|p| p.borrow_mut().pop()))
        .unwrap_or_else(|| Vec::with_capacity(crate::wire::segment::MAX_BYTES))
}

/// A buffer for a new frame: an earlier frame's (any length and contents, which the builder
/// overwrites) if one was returned, else a new one.
pub fn frame_buf() -> Vec<u8> {
    // Then a large one: a thread that only sends small frames (a responder's ACKs) but gets
    // large buffers back must not starve.
    FRAME_POOL
        .with(|p| p.borrow_mut().pop())
        .or_else(|| SEGMENT_POOL.with(|p| p.borrow_mut().pop()))
        .unwrap_or_default()
}

/// Return a frame that has been sent (or dropped) to this thread's pool.
pub fn recycle_frame(f: Vec<u8>) {
    if f.capacity() == 0 {
        return;
    }
    // Not cleared: the builder overwrites every byte (`wire::frame`, `set_frame_len`).
    // Large ones (segments; also the 64 KiB receive buffers that circulate on a fabric) first
    // fill the segment pool; beyond it they serve single frames like any buffer.
    let f = if f.capacity() >= SEGMENT_BUF_MIN {
        let kept = SEGMENT_POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < SEGMENT_POOL_MAX {
                p.push(f);
                None
            } else {
                Some(f)
            }
        });
        match kept {
            None => return,
            Some(f) => f,
        }
    } else {
        f
    };
    FRAME_POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < FRAME_POOL_MAX {
            p.push(f);
        }
    });
}

/// Build one frame of `m` carrying `payload`. `None` only if `wire` rejects the header
/// combination (a transport bug, which is then visible as a missing packet and a retransmission
/// rather than a crash).
pub fn build(m: &TxMeta<'_>, payload: &[u8]) -> Option<Vec<u8>> {
    let b = builder(m);
    let mut out = frame_buf();
    match b.build(&[payload], &mut out) {
        Ok(()) => Some(out),
        Err(e) => {
            recycle_frame(out);
            guest_warn!("transport: cannot build {:?}: {e}", m.opcode);
            None
        }
    }
}

/// Why [`build_with`]'s fill failed.
enum Built<E> {
    Wire(WireError),
    Fill(E),
}

impl<E> From<WireError> for Built<E> {
    fn from(e: WireError) -> Self {
        Built::Wire(e)
    }
}

/// Build one frame of `m` whose `payload_len`-byte payload `fill` writes in place, straight into
/// the frame buffer (e.g. gathered from guest memory: one copy per packet, no intermediate
/// buffer). `Err` is `fill`'s error (the frame is dropped); `Ok(None)` means `wire` rejected the
/// header combination (a transport bug, logged, seen as a lost packet).
pub fn build_with<E>(
    m: &TxMeta<'_>,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Option<Vec<u8>>, E> {
    let b = builder(m);
    let mut out = frame_buf();
    match b.build_with(payload_len, &mut out, |buf| fill(buf).map_err(Built::Fill)) {
        Ok(()) => Ok(Some(out)),
        Err(Built::Fill(e)) => {
            recycle_frame(out);
            Err(e)
        }
        Err(Built::Wire(e)) => {
            recycle_frame(out);
            guest_warn!("transport: cannot build {:?}: {e}", m.opcode);
            Ok(None)
        }
    }
}

/// What one packet to send carries besides its payload: its addressing, BTH fields and
/// extension headers (which of them are present is the opcode's, `wire::opcode`).
#[derive(Debug, Clone, Copy)]
pub struct TxMeta<'a> {
    pub path: &'a Path,
    pub src_qpn: u32,
    pub dst_qpn: u32,
    pub opcode: Opcode,
    pub psn: u32,
    pub solicited: bool,
    pub ack_req: bool,
    pub ext: ExtHeaders,
}

/// [`build_with`] appending the frame to a fabric segment (`wire::segment`), built in place.
/// `Ok(Some(len))`: added (the frame's length); `Ok(None)`: `wire` rejected the header
/// combination or the segment refused the frame (a transport bug, logged, seen as a lost
/// packet); `Err`: `fill`'s error. The segment is unchanged unless the frame was added.
pub fn build_into_segment<E>(
    m: &TxMeta<'_>,
    payload_len: usize,
    seg: &mut crate::wire::segment::SegmentWriter,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    let b = builder(m);
    let max = crate::wire::segment::max_frame_len(payload_len);
    let r = seg.push_with(max, |room: &mut [u8]| {
        b.build_with_in(payload_len, room, |p| fill(p).map_err(Built::Fill))
    });
    match r {
        Ok(Some(len)) => Ok(Some(len)),
        Ok(None) => {
            guest_warn!("transport: a segment refused a {:?} frame", m.opcode);
            Ok(None)
        }
        Err(Built::Fill(e)) => Err(e),
        Err(Built::Wire(e)) => {
            guest_warn!("transport: cannot build {:?}: {e}", m.opcode);
            Ok(None)
        }
    }
}

/// The wire builder for `m`: addressing from its path (spec §15.4), BTH and extension headers.
fn builder(m: &TxMeta<'_>) -> PacketBuilder {
    let path = m.path;
    // Spec §15.4: the AV's flow label if set, else a hash of the QP pair (as Linux
    // rdma_calc_flow_label); the UDP source port is derived from it.
    let fl = if path.flow_label & 0xf_ffff != 0 {
        path.flow_label & 0xf_ffff
    } else {
        calc_flow_label(m.src_qpn, m.dst_qpn)
    };
    let addr = Addressing {
        src_mac: path.smac,
        dst_mac: path.dmac,
        vlan: path.vlan,
        src_gid: path.sgid,
        dst_gid: path.dgid,
        hop_limit: path.hop_limit,
        traffic_class: path.traffic_class,
        flow_label: fl,
        udp_src_port: flow_label_to_udp_sport(fl),
    };
    let mut bth = Bth::new(m.opcode, m.dst_qpn, m.psn);
    bth.solicited = m.solicited;
    bth.ack_req = m.ack_req;
    let mut b = PacketBuilder::new(addr, bth);
    b.icrc = path.icrc;
    b.ext = m.ext;
    b
}

/// Spec §15.4 flow label of a QP pair: `v = lqpn × rqpn`, `v ^= v >> 20`, `v ^= v >> 40`,
/// 20 bits.
pub fn calc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = (lqpn as u64).wrapping_mul(rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xf_ffff) as u32
}

/// Spec §15.4 UDP source port from a flow label (range 0xC000..=0xFFFF).
pub fn flow_label_to_udp_sport(fl: u32) -> u16 {
    let fl_low = fl & 0x3fff;
    let fl_high = (fl & 0xf_c000) >> 14;
    (0xc000 | (fl_low ^ fl_high)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_sport_follows_spec_15_4() {
        // v = 17 * 19 = 323 (no high bits), fl = 323, sport = 0xC000 | 323.
        assert_eq!(calc_flow_label(17, 19), 323);
        assert_eq!(flow_label_to_udp_sport(323), 0xc000 | 323);
        // High flow label bits fold into the low 14.
        assert_eq!(flow_label_to_udp_sport(0xf_c000 | 1), 0xc000 | (1 ^ 0x3f));
        for q in [1u32, 16, 0xff_ffff] {
            assert!(flow_label_to_udp_sport(calc_flow_label(q, 0x12_3456)) >= 0xc000);
        }
    }
}
