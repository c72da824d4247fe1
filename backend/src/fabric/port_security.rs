//! Port security (spec §16.3): what a device port with an address list may send.
//!
//! A device given `ip=` addresses on the command line sends only frames whose addresses are
//! its own. The fabric's switching rule 2 has already checked the Ethernet source MAC (every
//! device port, with or without a list); [`PortSecurity::check`] looks inside the frame:
//!
//! - 802.1Q / 802.1ad tagged frames: refused (a guest does not choose its network).
//! - ARP: sender hardware address = the port's MAC; sender IP one of its IPv4 addresses, or
//!   0.0.0.0 (an RFC 5227 probe).
//! - IPv4: source one of its addresses; 0.0.0.0 only for a DHCP client datagram (UDP 68 -> 67).
//! - IPv6: source one of its addresses or the link-local address derived from its MAC
//!   (EUI-64); `::` only for ICMPv6 router/neighbour solicitations (duplicate address
//!   detection) and MLDv2 reports, which RFC 4861/4862/3810 send from it.
//! - ICMPv6 neighbour discovery: source / target link-layer address options = the port's MAC;
//!   the target of a neighbour advertisement one of its IPv6 addresses; router advertisements
//!   and redirects refused (a device is a host, not a router).
//! - RoCEv2 (UDP port 4791): the IP source is the source GID, so the IP rules above decide;
//!   a refused RoCEv2 frame is counted as [`Violation::Gid`]. RoCE v1 (EtherType 0x8915, a GRH
//!   without an IP header): the GRH source GID must be one of the port's GIDs (its IPv6
//!   addresses and the IPv4-mapped form of its IPv4 addresses).
//! - Any other EtherType passes (it carries no address of the network layer).
//!
//! Malformed headers of a checked kind are refused as that kind. The classification is a few
//! loads and compares per frame, no allocation; the address lists are short (linear scans).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::eth::MacAddr;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_ROCE_V1: u16 = 0x8915;
/// 802.1Q, 802.1ad and the old pre-standard QinQ tag.
const TAG_ETHERTYPES: [u16; 3] = [0x8100, 0x88a8, 0x9100];

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_DSTOPTS: u8 = 60;
/// Extension headers walked before the upper-layer header; a longer chain is refused.
const MAX_EXTENSION_HEADERS: usize = 8;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const ROCEV2_PORT: u16 = 4791;
const DHCP_CLIENT_PORT: u16 = 68;
const DHCP_SERVER_PORT: u16 = 67;

const ICMPV6_ROUTER_SOLICIT: u8 = 133;
const ICMPV6_NEIGHBOR_SOLICIT: u8 = 135;
const ICMPV6_NEIGHBOR_ADVERT: u8 = 136;
const ICMPV6_REDIRECT: u8 = 137;
const ICMPV6_MLD2_REPORT: u8 = 143;
const ND_OPT_SOURCE_LLADDR: u8 = 1;
const ND_OPT_TARGET_LLADDR: u8 = 2;

/// Why a frame was refused; each is a drop counter (`reason` label in the fabric's stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A VLAN-tagged frame from a device.
    Tagged,
    /// ARP with another sender MAC or IP.
    Arp,
    /// IPv4 / IPv6 with another source address.
    Ip,
    /// ICMPv6 neighbour discovery with another link-layer address or target, or a router
    /// advertisement / redirect.
    Nd,
    /// RoCE with another source GID.
    Gid,
}

impl Violation {
    pub const ALL: [Violation; 5] = [
        Violation::Tagged,
        Violation::Arp,
        Violation::Ip,
        Violation::Nd,
        Violation::Gid,
    ];

    /// Index into a per-reason counter array ([`Violation::ALL`] order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `reason` label of its drop counter.
    pub fn label(self) -> &'static str {
        match self {
            Violation::Tagged => "vlan_tagged",
            Violation::Arp => "spoofed_arp",
            Violation::Ip => "spoofed_ip",
            Violation::Nd => "spoofed_nd",
            Violation::Gid => "spoofed_gid",
        }
    }
}

/// A device port's address list (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSecurity {
    mac: MacAddr,
    v4: Vec<Ipv4Addr>,
    /// The configured IPv6 addresses and the EUI-64 link-local address of `mac`.
    v6: Vec<Ipv6Addr>,
}

/// The IPv6 link-local address a host derives from its MAC (RFC 4291 appendix A: EUI-64 with
/// the universal/local bit flipped), which Linux assigns by default.
pub fn link_local_of(mac: &MacAddr) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a[0] = 0xfe;
    a[1] = 0x80;
    a[8] = mac[0] ^ 0x02;
    a[9] = mac[1];
    a[10] = mac[2];
    a[11] = 0xff;
    a[12] = 0xfe;
    a[13] = mac[3];
    a[14] = mac[4];
    a[15] = mac[5];
    Ipv6Addr::from(a)
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn v4_at(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(s))
}

fn v6_at(b: &[u8], at: usize) -> Option<Ipv6Addr> {
    let s: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
    Some(Ipv6Addr::from(s))
}

impl PortSecurity {
    /// The list of a device with MAC `mac` and addresses `ips` (the link-local address of
    /// `mac` is added).
    pub fn new(mac: MacAddr, ips: &[IpAddr]) -> PortSecurity {
        let mut v4 = Vec::new();
        let mut v6 = vec![link_local_of(&mac)];
        for ip in ips {
            match ip {
                IpAddr::V4(a) if !v4.contains(a) => v4.push(*a),
                IpAddr::V6(a) if !v6.contains(a) => v6.push(*a),
                _ => {}
            }
        }
        PortSecurity { mac, v4, v6 }
    }

    /// Is `ip` one of the port's addresses (for the device's own GID table, spec §16.3)?
    pub fn owns(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.contains(&a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => self.v4.contains(&v4),
                None => self.v6.contains(&a),
            },
        }
    }

    /// May the port send `frame` (its source MAC already checked)? See the module
    /// documentation for the rules.
    pub fn check(&self, frame: &[u8]) -> Result<(), Violation> {
        let Some(ethertype) = be16(frame, 12) else {
            // Shorter than a header: the switch drops it before asking.
            return Ok(());
        };
        let l3 = frame.get(14..).unwrap_or_default();
        match ethertype {
            t if TAG_ETHERTYPES.contains(&t) => Err(Violation::Tagged),
            ETHERTYPE_ARP => self.check_arp(l3).ok_or(Violation::Arp),
            ETHERTYPE_IPV4 => self.check_ipv4(l3),
            ETHERTYPE_IPV6 => self.check_ipv6(l3),
            ETHERTYPE_ROCE_V1 => {
                // The GRH: source GID at bytes 8..24.
                match v6_at(l3, 8) {
                    Some(gid) if self.owns(IpAddr::V6(gid)) => Ok(()),
                    _ => Err(Violation::Gid),
                }
            }
            _ => Ok(()),
        }
    }

    fn check_arp(&self, arp: &[u8]) -> Option<()> {
        // Ethernet/IPv4 ARP only: htype 1, ptype IPv4, hlen 6, plen 4.
        if be16(arp, 0)? != 1 || be16(arp, 2)? != ETHERTYPE_IPV4 || arp.get(4..6)? != [6, 4] {
            return None;
        }
        let sender_mac = arp.get(8..14)?;
        let sender_ip = v4_at(arp, 14)?;
        (sender_mac == self.mac && (sender_ip.is_unspecified() || self.v4.contains(&sender_ip)))
            .then_some(())
    }

    fn check_ipv4(&self, ip: &[u8]) -> Result<(), Violation> {
        let header = (|| {
            let vihl = *ip.first()?;
            let ihl = usize::from(vihl & 0x0f) * 4;
            (vihl >> 4 == 4 && ihl >= 20 && ip.len() >= ihl).then_some(())?;
            Some((ihl, *ip.get(9)?, v4_at(ip, 12)?))
        })();
        let Some((ihl, proto, src)) = header else {
            return Err(Violation::Ip);
        };
        if self.v4.contains(&src) {
            return Ok(());
        }
        let udp_ports = (proto == IPPROTO_UDP)
            .then(|| Some((be16(ip, ihl)?, be16(ip, ihl + 2)?)))
            .flatten();
        match udp_ports {
            Some((DHCP_CLIENT_PORT, DHCP_SERVER_PORT)) if src.is_unspecified() => Ok(()),
            Some((_, ROCEV2_PORT)) => Err(Violation::Gid),
            _ => Err(Violation::Ip),
        }
    }

    fn check_ipv6(&self, ip: &[u8]) -> Result<(), Violation> {
        let (Some(first), Some(mut next), Some(src)) = (ip.first(), ip.get(6), v6_at(ip, 8)) else {
            return Err(Violation::Ip);
        };
        if first >> 4 != 6 || ip.len() < 40 {
            return Err(Violation::Ip);
        }
        // The extension headers before the upper-layer header (MLD reports carry a hop-by-hop
        // header; anything may carry destination options): neighbour discovery behind any of
        // them is checked like ND without them (RFC 7113), and ND in a fragment is refused
        // (RFC 6980). A non-first fragment shows no upper-layer header.
        let mut at = 40;
        let mut fragmented = false;
        let mut headers = 0;
        let mut upper = true;
        while matches!(
            *next,
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_FRAGMENT | IPPROTO_DSTOPTS
        ) {
            headers += 1;
            let (Some(n), Some(len)) = (ip.get(at), ip.get(at + 1)) else {
                return Err(Violation::Ip);
            };
            if headers > MAX_EXTENSION_HEADERS {
                return Err(Violation::Ip);
            }
            if *next == IPPROTO_FRAGMENT {
                let offset = be16(ip, at + 2).ok_or(Violation::Ip)? >> 3;
                fragmented = true;
                upper = offset == 0;
                at += 8;
            } else {
                at += (usize::from(*len) + 1) * 8;
            }
            next = n;
            if !upper {
                break;
            }
        }
        let icmp_type = if upper && *next == IPPROTO_ICMPV6 {
            match ip.get(at) {
                Some(t) => Some(*t),
                None => return Err(Violation::Nd),
            }
        } else {
            None
        };
        if let Some(t) = icmp_type {
            if (ICMPV6_ROUTER_SOLICIT..=ICMPV6_REDIRECT).contains(&t) {
                if fragmented {
                    return Err(Violation::Nd);
                }
                self.check_nd(t, ip.get(at..).unwrap_or_default())
                    .ok_or(Violation::Nd)?;
            }
        }
        if self.v6.contains(&src) {
            return Ok(());
        }
        if src.is_unspecified()
            && matches!(
                icmp_type,
                Some(ICMPV6_ROUTER_SOLICIT | ICMPV6_NEIGHBOR_SOLICIT | ICMPV6_MLD2_REPORT)
            )
        {
            return Ok(());
        }
        if upper && *next == IPPROTO_UDP && be16(ip, at + 2) == Some(ROCEV2_PORT) {
            return Err(Violation::Gid);
        }
        Err(Violation::Ip)
    }

    /// Neighbour discovery message `icmp` (from its type byte) of type `t`.
    fn check_nd(&self, t: u8, icmp: &[u8]) -> Option<()> {
        let options_at = match t {
            ICMPV6_ROUTER_SOLICIT => 8,
            ICMPV6_NEIGHBOR_SOLICIT => 24,
            ICMPV6_NEIGHBOR_ADVERT => {
                // A device announces only its own addresses.
                let target = v6_at(icmp, 8)?;
                self.v6.contains(&target).then_some(())?;
                24
            }
            // Router advertisements (134) and redirects (137): a device is a host.
            _ => return None,
        };
        let mut opts = icmp.get(options_at..)?;
        while !opts.is_empty() {
            let kind = *opts.first()?;
            let len = usize::from(*opts.get(1)?) * 8;
            if len == 0 {
                return None;
            }
            let opt = opts.get(..len)?;
            if (kind == ND_OPT_SOURCE_LLADDR || kind == ND_OPT_TARGET_LLADDR)
                && opt.get(2..8)? != self.mac
            {
                return None;
            }
            opts = &opts[len..];
        }
        Some(())
    }
}

#[cfg(test)]
mod tests;
