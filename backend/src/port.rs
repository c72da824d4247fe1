//! The integrated Ethernet port's demultiplexer (DESIGN "Ethernet port"): decides for each frame
//! arriving from the uplink whether the RoCEv2 engine, the guest's netdev (eth rx queue) or nobody
//! gets it.
//!
//! Rules, in order:
//! 1. Shorter than an Ethernet header → [`Destination::Drop`].
//! 2. Destination MAC: group (broadcast/multicast) → go on; one of the port's MACs → go on; any
//!    other unicast MAC → `Drop`, unless `promiscuous`, then `Guest` (never the engine). Like a NIC
//!    with a unicast MAC filter; the UDP uplink is a point-to-point "cable", a TAP/bridge may flood.
//! 3. Unicast to our MAC, IPv4 or IPv6 (after at most one 802.1Q tag), not a fragment, UDP
//!    destination port 4791, destination IP equal to one of the port's GIDs (IPv4 as ::ffff:a.b.c.d)
//!    → [`Destination::Engine`]. The engine does the full checks (ICRC etc.) and drops bad frames.
//! 4. Everything else (ARP, ND, other IP traffic, RoCEv2 to other addresses, multicast RoCEv2, which
//!    vrdma does not support) → [`Destination::Guest`].

use crate::wire::eth::{is_multicast, EthHeader, MacAddr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::wire::frame::{gid_from_ipv4, Gid};
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
    if is_multicast(&eth.dst) {
        return Destination::Guest;
    }
    if !macs.contains(&eth.dst) {
        return if promiscuous {
            Destination::Guest
        } else {
            Destination::Drop
        };
    }
    match roce_dst_gid(eth.ethertype, l3) {
        Some(gid) if is_our_gid(&gid) => Destination::Engine,
        _ => Destination::Guest,
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
