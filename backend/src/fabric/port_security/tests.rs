//! One test per rule of `port_security` (spec §16.3): each refused frame is refused for its
//! reason, and the same frame with the device's own address passes.

use super::*;

const MAC: MacAddr = [0x52, 0x54, 0, 0, 0, 0x0a];
const OTHER_MAC: MacAddr = [0x52, 0x54, 0, 0, 0, 0x0b];
const IP4: [u8; 4] = [10, 0, 0, 1];
const OTHER4: [u8; 4] = [10, 0, 0, 2];

fn ip6() -> Ipv6Addr {
    "fd00::1".parse().unwrap()
}
fn other6() -> Ipv6Addr {
    "fd00::2".parse().unwrap()
}

fn policy() -> PortSecurity {
    PortSecurity::new(MAC, &[IpAddr::V4(IP4.into()), IpAddr::V6(ip6())])
}

fn eth(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn arp(sender_mac: MacAddr, sender_ip: [u8; 4]) -> Vec<u8> {
    let mut a = vec![0, 1, 0x08, 0x00, 6, 4, 0, 1];
    a.extend_from_slice(&sender_mac);
    a.extend_from_slice(&sender_ip);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&OTHER4);
    eth(ETHERTYPE_ARP, &a)
}

fn ipv4(src: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0];
    h.extend_from_slice(&src);
    h.extend_from_slice(&OTHER4);
    h.extend_from_slice(l4);
    eth(ETHERTYPE_IPV4, &h)
}

fn udp(sport: u16, dport: u16) -> Vec<u8> {
    let mut u = sport.to_be_bytes().to_vec();
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&[0, 8, 0, 0]);
    u
}

fn ipv6(src: Ipv6Addr, next: u8, rest: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0, 0, 0, next, 255];
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&other6().octets());
    h.extend_from_slice(rest);
    eth(ETHERTYPE_IPV6, &h)
}

/// An ICMPv6 ND message: type, target (NS / NA), options (kind, MAC).
fn nd(t: u8, target: Option<Ipv6Addr>, opts: &[(u8, MacAddr)]) -> Vec<u8> {
    let mut m = vec![t, 0, 0, 0, 0, 0, 0, 0];
    if let Some(a) = target {
        m.extend_from_slice(&a.octets());
    }
    for (kind, mac) in opts {
        m.extend_from_slice(&[*kind, 1]);
        m.extend_from_slice(mac);
    }
    m
}

fn link_local() -> Ipv6Addr {
    link_local_of(&MAC)
}

#[test]
fn link_local_is_eui64_of_the_mac() {
    assert_eq!(
        link_local(),
        "fe80::5054:ff:fe00:a".parse::<Ipv6Addr>().unwrap()
    );
}

#[test]
fn tagged_frames_are_refused() {
    let p = policy();
    let inner = ipv4(IP4, 1, &[8, 0, 0, 0]);
    for tpid in [0x8100u16, 0x88a8, 0x9100] {
        let mut f = inner[..12].to_vec();
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&[0, 5]);
        f.extend_from_slice(&inner[12..]);
        assert_eq!(p.check(&f), Err(Violation::Tagged), "tpid {tpid:#x}");
    }
    assert_eq!(p.check(&inner), Ok(()));
}

#[test]
fn arp_sender_must_be_the_device() {
    let p = policy();
    assert_eq!(p.check(&arp(MAC, IP4)), Ok(()));
    assert_eq!(p.check(&arp(MAC, [0; 4])), Ok(()), "RFC 5227 probe");
    assert_eq!(
        p.check(&arp(MAC, OTHER4)),
        Err(Violation::Arp),
        "gratuitous ARP for a neighbour's IP"
    );
    assert_eq!(
        p.check(&arp(OTHER_MAC, IP4)),
        Err(Violation::Arp),
        "another sender MAC"
    );
    let mut short = arp(MAC, IP4);
    short.truncate(14 + 17);
    assert_eq!(p.check(&short), Err(Violation::Arp), "truncated");
    let mut not_ipv4 = arp(MAC, IP4);
    not_ipv4[14 + 2] = 0x86;
    assert_eq!(
        p.check(&not_ipv4),
        Err(Violation::Arp),
        "not Ethernet/IPv4 ARP"
    );
    let v6_only = PortSecurity::new(MAC, &[IpAddr::V6(ip6())]);
    assert_eq!(v6_only.check(&arp(MAC, IP4)), Err(Violation::Arp));
}

#[test]
fn ipv4_source_must_be_the_device() {
    let p = policy();
    let icmp = [8u8, 0, 0, 0];
    assert_eq!(p.check(&ipv4(IP4, 1, &icmp)), Ok(()));
    assert_eq!(p.check(&ipv4(OTHER4, 1, &icmp)), Err(Violation::Ip));
    assert_eq!(
        p.check(&ipv4(OTHER4, 17, &udp(1000, 53))),
        Err(Violation::Ip)
    );
    assert_eq!(
        p.check(&ipv4([0; 4], 1, &icmp)),
        Err(Violation::Ip),
        "0.0.0.0 only for DHCP"
    );
    assert_eq!(
        p.check(&ipv4([0; 4], 17, &udp(68, 67))),
        Ok(()),
        "DHCP discover"
    );
    assert_eq!(p.check(&ipv4([0; 4], 17, &udp(67, 68))), Err(Violation::Ip));
    let mut bad_version = ipv4(IP4, 1, &icmp);
    bad_version[14] = 0x65;
    assert_eq!(p.check(&bad_version), Err(Violation::Ip));
    let mut short = ipv4(IP4, 1, &icmp);
    short.truncate(14 + 15);
    assert_eq!(p.check(&short), Err(Violation::Ip));
}

#[test]
fn ipv6_source_must_be_the_device_or_its_link_local() {
    let p = policy();
    let u = udp(1000, 53);
    assert_eq!(p.check(&ipv6(ip6(), 17, &u)), Ok(()));
    assert_eq!(
        p.check(&ipv6(link_local(), 17, &u)),
        Ok(()),
        "EUI-64 link-local"
    );
    assert_eq!(p.check(&ipv6(other6(), 17, &u)), Err(Violation::Ip));
    assert_eq!(
        p.check(&ipv6(link_local_of(&OTHER_MAC), 17, &u)),
        Err(Violation::Ip),
        "a neighbour's link-local"
    );
    assert_eq!(
        p.check(&ipv6(Ipv6Addr::UNSPECIFIED, 17, &u)),
        Err(Violation::Ip)
    );
    let mut short = ipv6(ip6(), 17, &u);
    short.truncate(14 + 30);
    assert_eq!(p.check(&short), Err(Violation::Ip));
}

#[test]
fn unspecified_source_only_for_dad_rs_and_mld() {
    let p = policy();
    let dad = nd(135, Some(ip6()), &[]);
    assert_eq!(
        p.check(&ipv6(Ipv6Addr::UNSPECIFIED, 58, &dad)),
        Ok(()),
        "DAD"
    );
    let rs = nd(133, None, &[]);
    assert_eq!(p.check(&ipv6(Ipv6Addr::UNSPECIFIED, 58, &rs)), Ok(()));
    // MLDv2 report behind a hop-by-hop header with the router alert option.
    let mut hbh = vec![58u8, 0, 5, 2, 0, 0, 1, 0];
    hbh.extend_from_slice(&[143, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        p.check(&ipv6(Ipv6Addr::UNSPECIFIED, 0, &hbh)),
        Ok(()),
        "MLDv2 report"
    );
    // An echo request from :: is not one of them.
    let echo = [128u8, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        p.check(&ipv6(Ipv6Addr::UNSPECIFIED, 58, &echo)),
        Err(Violation::Ip)
    );
}

#[test]
fn neighbour_discovery_carries_only_the_devices_addresses() {
    let p = policy();
    let ns_ok = nd(135, Some(other6()), &[(1, MAC)]);
    assert_eq!(
        p.check(&ipv6(ip6(), 58, &ns_ok)),
        Ok(()),
        "asking about a neighbour"
    );
    let ns_bad = nd(135, Some(other6()), &[(1, OTHER_MAC)]);
    assert_eq!(
        p.check(&ipv6(ip6(), 58, &ns_bad)),
        Err(Violation::Nd),
        "source link-layer"
    );
    let na_ok = nd(136, Some(ip6()), &[(2, MAC)]);
    assert_eq!(p.check(&ipv6(ip6(), 58, &na_ok)), Ok(()));
    let na_ll = nd(136, Some(link_local()), &[(2, MAC)]);
    assert_eq!(p.check(&ipv6(link_local(), 58, &na_ll)), Ok(()));
    let na_target = nd(136, Some(other6()), &[(2, MAC)]);
    assert_eq!(
        p.check(&ipv6(ip6(), 58, &na_target)),
        Err(Violation::Nd),
        "NA for a neighbour"
    );
    let na_lladdr = nd(136, Some(ip6()), &[(2, OTHER_MAC)]);
    assert_eq!(
        p.check(&ipv6(ip6(), 58, &na_lladdr)),
        Err(Violation::Nd),
        "target link-layer"
    );
    let ra = nd(134, None, &[]);
    assert_eq!(
        p.check(&ipv6(link_local(), 58, &ra)),
        Err(Violation::Nd),
        "router advert"
    );
    let redirect = nd(137, Some(other6()), &[]);
    assert_eq!(
        p.check(&ipv6(link_local(), 58, &redirect)),
        Err(Violation::Nd)
    );
    let mut zero_len_opt = nd(135, Some(other6()), &[(1, MAC)]);
    zero_len_opt[25] = 0;
    assert_eq!(
        p.check(&ipv6(ip6(), 58, &zero_len_opt)),
        Err(Violation::Nd),
        "malformed"
    );
}

#[test]
fn roce_source_gid_must_be_the_devices() {
    let p = policy();
    assert_eq!(p.check(&ipv4(IP4, 17, &udp(0xc000, 4791))), Ok(()));
    assert_eq!(
        p.check(&ipv4(OTHER4, 17, &udp(0xc000, 4791))),
        Err(Violation::Gid)
    );
    assert_eq!(p.check(&ipv6(ip6(), 17, &udp(0xc000, 4791))), Ok(()));
    assert_eq!(p.check(&ipv6(link_local(), 17, &udp(0xc000, 4791))), Ok(()));
    assert_eq!(
        p.check(&ipv6(other6(), 17, &udp(0xc000, 4791))),
        Err(Violation::Gid)
    );
    // RoCE v1: a GRH, no IP header.
    let grh = |sgid: Ipv6Addr| {
        let mut g = vec![0x60, 0, 0, 0, 0, 0, 0x1b, 64];
        g.extend_from_slice(&sgid.octets());
        g.extend_from_slice(&other6().octets());
        eth(ETHERTYPE_ROCE_V1, &g)
    };
    assert_eq!(p.check(&grh(ip6())), Ok(()));
    assert_eq!(p.check(&grh(Ipv4Addr::from(IP4).to_ipv6_mapped())), Ok(()));
    assert_eq!(p.check(&grh(other6())), Err(Violation::Gid));
    assert_eq!(
        p.check(&grh(Ipv4Addr::from(OTHER4).to_ipv6_mapped())),
        Err(Violation::Gid)
    );
}

#[test]
fn other_ethertypes_pass() {
    let p = policy();
    assert_eq!(p.check(&eth(0x88b5, &[1, 2, 3, 4])), Ok(()));
    assert_eq!(p.check(&eth(0x88cc, &[])), Ok(()), "LLDP");
}

#[test]
fn owns_knows_every_form_of_the_addresses() {
    let p = policy();
    assert!(p.owns(IpAddr::V4(IP4.into())));
    assert!(p.owns(IpAddr::V6(Ipv4Addr::from(IP4).to_ipv6_mapped())));
    assert!(p.owns(IpAddr::V6(ip6())));
    assert!(p.owns(IpAddr::V6(link_local())));
    assert!(!p.owns(IpAddr::V4(OTHER4.into())));
    assert!(!p.owns(IpAddr::V6(other6())));
}

/// Untrusted input: every prefix of every kind of frame, and every single-byte corruption of
/// its headers, gets an answer (no panic, no over-read).
#[test]
fn truncated_and_corrupt_frames_get_an_answer() {
    let p = policy();
    let mut hbh = vec![58u8, 0, 5, 2, 0, 0, 1, 0];
    hbh.extend_from_slice(&[143, 0, 0, 0, 0, 0, 0, 0]);
    let frames = [
        arp(MAC, IP4),
        ipv4(IP4, 17, &udp(0xc000, 4791)),
        ipv4([0; 4], 17, &udp(68, 67)),
        ipv6(ip6(), 58, &nd(136, Some(ip6()), &[(2, MAC)])),
        ipv6(Ipv6Addr::UNSPECIFIED, 0, &hbh),
        ipv6(ip6(), 17, &udp(0xc000, 4791)),
    ];
    for f in &frames {
        for len in 0..=f.len() {
            let _ = p.check(&f[..len]);
        }
        for i in 12..f.len().min(14 + 64) {
            for v in [0u8, 0xff, 0x3a, 0x11] {
                let mut g = f.clone();
                g[i] = v;
                let _ = p.check(&g);
            }
        }
    }
}

/// RFC 7113: neighbour discovery behind extension headers is checked as without them, and
/// ND in a fragment is refused (RFC 6980); a chain too long or cut short is refused.
#[test]
fn neighbour_discovery_behind_extension_headers_is_checked() {
    let p = policy();
    let ll = link_local();
    // An empty destination-options header (8 bytes: next header, length 0, PadN).
    let dstopts = |next: u8| vec![next, 0, 1, 4, 0, 0, 0, 0];
    let behind = |headers: &[Vec<u8>], msg: Vec<u8>| {
        let mut rest: Vec<u8> = headers.concat();
        rest.extend_from_slice(&msg);
        ipv6(ll, IPPROTO_DSTOPTS, &rest)
    };
    let ra = nd(134, None, &[]);
    assert_eq!(
        p.check(&behind(&[dstopts(58)], ra.clone())),
        Err(Violation::Nd),
        "a router advertisement behind destination options"
    );
    assert_eq!(
        p.check(&behind(&[dstopts(60), dstopts(58)], ra.clone())),
        Err(Violation::Nd),
        "behind two of them"
    );
    let foreign_na = nd(136, Some(other6()), &[(2, MAC)]);
    assert_eq!(
        p.check(&behind(&[dstopts(58)], foreign_na)),
        Err(Violation::Nd),
        "an advertisement of a neighbour's address"
    );
    let own_na = nd(136, Some(ip6()), &[(2, MAC)]);
    assert_eq!(p.check(&behind(&[dstopts(58)], own_na.clone())), Ok(()));
    // A first fragment (offset 0, more fragments) carrying an NA: refused even for its own.
    let fragment = |next: u8, offset: u16| {
        let o = (offset << 3) | 1;
        vec![next, 0, (o >> 8) as u8, o as u8, 0, 0, 0, 1]
    };
    let mut rest = fragment(58, 0);
    rest.extend_from_slice(&own_na);
    assert_eq!(
        p.check(&ipv6(ll, IPPROTO_FRAGMENT, &rest)),
        Err(Violation::Nd)
    );
    // A later fragment shows no upper-layer header: only the source is checked.
    let mut rest = fragment(58, 100);
    rest.extend_from_slice(&[0u8; 16]);
    assert_eq!(p.check(&ipv6(ll, IPPROTO_FRAGMENT, &rest)), Ok(()));
    let many: Vec<Vec<u8>> = (0..9).map(|_| dstopts(60)).collect();
    assert_eq!(
        p.check(&behind(&many, ra.clone())),
        Err(Violation::Ip),
        "too many extension headers"
    );
    let mut cut = behind(&[dstopts(58)], ra);
    cut.truncate(14 + 40 + 1);
    assert_eq!(p.check(&cut), Err(Violation::Ip));
}
