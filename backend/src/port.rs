//! The integrated Ethernet port's demultiplexer (DESIGN "Ethernet port"): decides for each frame
//! arriving from the uplink whether the RoCEv2 engine, the guest's netdev (eth rx queue) or nobody
//! gets it.
//!
//! Rules, in order:
//! 1. Shorter than an Ethernet header → [`Destination::Drop`].
//! 2. Destination MAC: group (broadcast/multicast) → `Engine` if it is a RoCEv2 datagram to a
//!    multicast group the device has QPs attached to (spec §15.8), else `Guest`; one of the
//!    port's MACs → go on; any
//!    other unicast MAC → `Drop`, unless `promiscuous`, then `Guest` (never the engine). Like a NIC
//!    with a unicast MAC filter; the UDP uplink is a point-to-point "cable", a TAP/bridge may flood.
//! 3. Unicast to our MAC, IPv4 or IPv6 (after at most one 802.1Q tag), not a fragment, UDP
//!    destination port 4791, destination IP equal to one of the port's GIDs (IPv4 as ::ffff:a.b.c.d)
//!    → [`Destination::Engine`]. The engine does the full checks (ICRC etc.) and drops bad frames.
//! 4. Everything else (ARP, ND, other IP traffic, RoCEv2 to other addresses, multicast RoCEv2, which
//!    vrdma does not support) → [`Destination::Guest`].
//!
//! Transmit side: [`tx_destination`] loops RoCEv2 frames addressed to one of our own GIDs back into
//! the engine instead of the uplink (local QP-to-QP traffic); everything else goes out.

use crate::wire::eth::{is_multicast, EthHeader, MacAddr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::wire::frame::{gid_from_ipv4, locate, Gid, Located};
use crate::wire::ipv4::PROTO_UDP;
use crate::wire::ROCEV2_UDP_PORT;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A RoCEv2 frame for one of our GIDs: `transport::on_frame`.
    Engine,
    /// The guest's network stack (eth rx queue).
    Guest,
    Drop,
}

/// Classify with a GID list.
pub fn classify(frame: &[u8], macs: &[MacAddr], gids: &[Gid], promiscuous: bool) -> Destination {
    classify_with(frame, macs, promiscuous, |g| gids.contains(g))
}

/// Classify with a GID predicate (e.g. a lookup in the device's GID table).
pub fn classify_with(
    frame: &[u8],
    macs: &[MacAddr],
    promiscuous: bool,
    is_our_gid: impl Fn(&Gid) -> bool,
) -> Destination {
    let Ok((eth, l3)) = EthHeader::parse(frame) else {
        return Destination::Drop;
    };
    decide(
        &eth.dst,
        roce_dst_gid(eth.ethertype, l3),
        macs,
        promiscuous,
        is_our_gid,
    )
}

/// [`classify_with`] for the engine's receive path, which reads a frame's headers once: a
/// well-formed RoCEv2 frame is located here ([`locate`]) and, when it is for the engine, handed
/// on with its located headers for the transport to parse on from. Frames that are not
/// well-formed RoCEv2 (ARP, other IP, a malformed RoCEv2 datagram) get [`classify_with`]'s
/// verdict and no headers; a malformed one for the engine is dropped there, as before.
pub fn classify_located<'a>(
    frame: &'a [u8],
    macs: &[MacAddr],
    promiscuous: bool,
    is_our_gid: impl Fn(&Gid) -> bool,
) -> (Destination, Option<Located<'a>>) {
    match locate(frame) {
        Ok(l) => {
            let d = decide(
                &l.dst_mac(),
                Some(l.dst_gid()),
                macs,
                promiscuous,
                is_our_gid,
            );
            (d, (d == Destination::Engine).then_some(l))
        }
        Err(_) => (classify_with(frame, macs, promiscuous, is_our_gid), None),
    }
}

/// Rules 2-4 of the module comment, given the destination MAC and, for a RoCEv2 datagram, its
/// destination GID.
fn decide(
    dst: &MacAddr,
    roce_gid: Option<Gid>,
    macs: &[MacAddr],
    promiscuous: bool,
    is_our_gid: impl Fn(&Gid) -> bool,
) -> Destination {
    if is_multicast(dst) {
        return match roce_gid {
            Some(g) if crate::objects::is_multicast_gid(&g) && is_our_gid(&g) => {
                Destination::Engine
            }
            _ => Destination::Guest,
        };
    }
    if !macs.contains(dst) {
        return if promiscuous {
            Destination::Guest
        } else {
            Destination::Drop
        };
    }
    match roce_gid {
        Some(gid) if is_our_gid(&gid) => Destination::Engine,
        _ => Destination::Guest,
    }
}

/// Where a frame the port transmits (engine output or guest eth tx) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxDestination {
    /// Loop back into the engine: RoCEv2 to one of our own GIDs (a QP talking to a QP of the same
    /// device, as pyverbs tests and `ibv_rc_pingpong` to the local GID do). The MAC is not looked at.
    Engine,
    /// Out on the uplink.
    Uplink,
    /// Both: a multicast datagram to a group some of our QPs are attached to (spec §15.8).
    EngineAndUplink,
}

/// Classify an outgoing frame (see [`TxDestination`]).
pub fn tx_destination(frame: &[u8], is_our_gid: impl Fn(&Gid) -> bool) -> TxDestination {
    match EthHeader::parse(frame) {
        Ok((eth, l3)) => match roce_dst_gid(eth.ethertype, l3) {
            Some(g) if is_our_gid(&g) => {
                if crate::objects::is_multicast_gid(&g) {
                    TxDestination::EngineAndUplink
                } else {
                    TxDestination::Engine
                }
            }
            _ => TxDestination::Uplink,
        },
        Err(_) => TxDestination::Uplink,
    }
}

/// The destination GID if `l3` looks like a RoCEv2 datagram (UDP to port 4791, unfragmented).
fn roce_dst_gid(ethertype: u16, l3: &[u8]) -> Option<Gid> {
    match ethertype {
        ETHERTYPE_IPV4 => {
            let ip = l3.get(..20)?;
            let ihl = usize::from(ip[0] & 0xf) * 4;
            let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff; // MF + offset
            if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != PROTO_UDP || frag != 0 {
                return None;
            }
            let udp = l3.get(ihl..ihl + 8)?;
            if u16::from_be_bytes([udp[2], udp[3]]) != ROCEV2_UDP_PORT {
                return None;
            }
            Some(gid_from_ipv4([ip[16], ip[17], ip[18], ip[19]]))
        }
        ETHERTYPE_IPV6 => {
            let ip = l3.get(..40)?;
            if ip[0] >> 4 != 6 || ip[6] != PROTO_UDP {
                return None;
            }
            let udp = l3.get(40..48)?;
            if u16::from_be_bytes([udp[2], udp[3]]) != ROCEV2_UDP_PORT {
                return None;
            }
            let mut g = [0u8; 16];
            g.copy_from_slice(&ip[24..40]);
            Some(g)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{gid_from_ipv4, udp_src_port, Addressing, PacketBuilder};
    use crate::wire::{Aeth, Bth, Opcode};

    const OURS: MacAddr = [0x02, 0, 0, 0, 0, 0x01];
    const PEER: MacAddr = [0x02, 0, 0, 0, 0, 0x02];

    fn our_v4() -> Gid {
        gid_from_ipv4([10, 0, 0, 1])
    }
    fn our_v6() -> Gid {
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    }

    fn roce(dst_mac: MacAddr, dst_gid: Gid, vlan: Option<u16>) -> Vec<u8> {
        let v4 = crate::wire::is_ipv4_mapped(&dst_gid);
        let src_gid = if v4 {
            gid_from_ipv4([10, 0, 0, 2])
        } else {
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]
        };
        let mut b = PacketBuilder::new(
            Addressing {
                vlan,
                ..Addressing::new(PEER, dst_mac, src_gid, dst_gid, udp_src_port(1, 2))
            },
            Bth::new(Opcode::RcAck, 17, 1),
        );
        b.ext.aeth = Some(Aeth::ack(1));
        let mut f = Vec::new();
        b.build(&[], &mut f).unwrap();
        f
    }

    fn gids() -> Vec<Gid> {
        vec![our_v6(), our_v4()]
    }

    #[test]
    fn roce_for_our_gids_goes_to_the_engine() {
        let g = gids();
        for vlan in [None, Some(100)] {
            assert_eq!(
                classify(&roce(OURS, our_v4(), vlan), &[OURS], &g, false),
                Destination::Engine
            );
            assert_eq!(
                classify(&roce(OURS, our_v6(), vlan), &[OURS], &g, false),
                Destination::Engine
            );
        }
        // Same frames with the predicate form.
        assert_eq!(
            classify_with(&roce(OURS, our_v4(), None), &[OURS], false, |x| *x
                == our_v4()),
            Destination::Engine
        );
    }

    #[test]
    fn roce_for_other_gids_goes_to_the_guest() {
        let g = gids();
        let other = gid_from_ipv4([10, 0, 0, 9]);
        assert_eq!(
            classify(&roce(OURS, other, None), &[OURS], &g, false),
            Destination::Guest
        );
        // No GIDs configured yet: everything to the guest.
        assert_eq!(
            classify(&roce(OURS, our_v4(), None), &[OURS], &[], false),
            Destination::Guest
        );
    }

    #[test]
    fn other_traffic_goes_to_the_guest() {
        let g = gids();
        // UDP to another port.
        let mut f = roce(OURS, our_v4(), None);
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(classify(&f, &[OURS], &g, false), Destination::Guest);
        // TCP.
        let mut f = roce(OURS, our_v4(), None);
        f[23] = 6;
        assert_eq!(classify(&f, &[OURS], &g, false), Destination::Guest);
        // A non-first IPv4 fragment (bytes where the UDP header would be are data).
        let mut f = roce(OURS, our_v4(), None);
        f[20] = 0x00;
        f[21] = 0x10;
        assert_eq!(classify(&f, &[OURS], &g, false), Destination::Guest);
        // ARP request (broadcast).
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&PEER);
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        assert_eq!(classify(&arp, &[OURS], &g, false), Destination::Guest);
        // IPv6 neighbour solicitation to a solicited-node multicast MAC.
        let mut ns = vec![0x33, 0x33, 0xff, 0, 0, 1];
        ns.extend_from_slice(&PEER);
        ns.extend_from_slice(&[0x86, 0xdd]);
        ns.extend_from_slice(&[0x60, 0, 0, 0, 0, 32, 58, 255]);
        ns.extend_from_slice(&[0u8; 64]);
        assert_eq!(classify(&ns, &[OURS], &g, false), Destination::Guest);
        // Multicast RoCE for a group nobody attached is the guest's.
        let group = gid_from_ipv4([239, 1, 2, 3]);
        let mc = roce([0x01, 0, 0x5e, 1, 2, 3], group, None);
        assert_eq!(classify(&mc, &[OURS], &g, false), Destination::Guest);
        // With QPs attached to the group (the predicate says so): the engine's.
        let mut with_group = g.clone();
        with_group.push(group);
        assert_eq!(
            classify(&mc, &[OURS], &with_group, false),
            Destination::Engine
        );
        // Sending to an attached group also loops back to the device's own members.
        assert_eq!(
            tx_destination(&mc, |x| *x == group),
            TxDestination::EngineAndUplink
        );
        assert_eq!(tx_destination(&mc, |_| false), TxDestination::Uplink);
        // Unicast to us, IPv4 header truncated: guest (its stack will drop it).
        let f = roce(OURS, our_v4(), None);
        assert_eq!(classify(&f[..20], &[OURS], &g, false), Destination::Guest);
    }

    /// The engine's classifier reads the headers once; it must decide exactly as
    /// `classify_with` for every frame, and hand on located headers only with an engine
    /// verdict and only for frames that parse. Frames: well-formed RoCEv2 of each kind above,
    /// and each of them with every single byte of its headers changed (wrong ethertype,
    /// version, IHL, checksum, protocol, fragment bits, port, lengths, truncations).
    #[test]
    fn located_classification_agrees_with_classify_with() {
        let group = gid_from_ipv4([239, 1, 2, 3]);
        let ours = |x: &Gid| *x == our_v4() || *x == our_v6() || *x == group;
        let mut frames = Vec::new();
        for vlan in [None, Some(7)] {
            for (mac, gid) in [
                (OURS, our_v4()),
                (OURS, our_v6()),
                (OURS, gid_from_ipv4([10, 0, 0, 9])),
                (PEER, our_v4()),
                ([0x01, 0, 0x5e, 1, 2, 3], group),
                ([0x01, 0, 0x5e, 1, 2, 4], gid_from_ipv4([239, 1, 2, 4])),
            ] {
                frames.push(roce(mac, gid, vlan));
            }
        }
        let mut corpus = Vec::new();
        for f in &frames {
            corpus.push(f.clone());
            for n in [0, 13, 14, 20, 33, 41, f.len() - 4] {
                corpus.push(f[..n].to_vec());
            }
            for i in 0..f.len().min(66) {
                for x in [0x01u8, 0x40, 0xff] {
                    let mut m = f.clone();
                    m[i] ^= x;
                    corpus.push(m);
                }
            }
        }
        let mut engine_located = 0;
        for f in &corpus {
            for promiscuous in [false, true] {
                let want = classify_with(f, &[OURS], promiscuous, ours);
                let (got, located) = classify_located(f, &[OURS], promiscuous, ours);
                assert_eq!(got, want, "frame {f:02x?}");
                if let Some(l) = located {
                    assert_eq!(got, Destination::Engine);
                    assert_eq!(l.frame(), &f[..]);
                    engine_located += 1;
                }
            }
        }
        // Not vacuous: the unmodified frames for the engine came with their headers.
        assert!(
            engine_located >= 8,
            "{engine_located} located engine frames"
        );
    }

    #[test]
    fn foreign_unicast_is_dropped_unless_promiscuous() {
        let g = gids();
        let f = roce(PEER, our_v4(), None);
        assert_eq!(classify(&f, &[OURS], &g, false), Destination::Drop);
        assert_eq!(classify(&f, &[OURS], &g, true), Destination::Guest);
        // Second MAC of the port.
        assert_eq!(classify(&f, &[OURS, PEER], &g, false), Destination::Engine);
    }

    #[test]
    fn transmit_to_our_own_gid_loops_back() {
        let ours = |g: &Gid| *g == our_v4() || *g == our_v6();
        assert_eq!(
            tx_destination(&roce(OURS, our_v4(), None), ours),
            TxDestination::Engine
        );
        assert_eq!(
            tx_destination(&roce(OURS, our_v6(), Some(3)), ours),
            TxDestination::Engine
        );
        let other = gid_from_ipv4([10, 0, 0, 9]);
        assert_eq!(
            tx_destination(&roce(PEER, other, None), ours),
            TxDestination::Uplink
        );
        let mut f = roce(OURS, our_v4(), None);
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(tx_destination(&f, ours), TxDestination::Uplink);
        assert_eq!(tx_destination(&[1, 2, 3], ours), TxDestination::Uplink);
    }

    #[test]
    fn runts_are_dropped() {
        assert_eq!(classify(&[], &[OURS], &[], false), Destination::Drop);
        assert_eq!(classify(&[0u8; 13], &[OURS], &[], false), Destination::Drop);
        // Truncated 802.1Q tag.
        let mut f = OURS.to_vec();
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&[0x81, 0x00, 0x00]);
        assert_eq!(classify(&f, &[OURS], &[], false), Destination::Drop);
    }
}
