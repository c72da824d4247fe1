//! The tenant networks of an `--uplink` on the fabric (spec §16.3): `,net=N` (one network,
//! frames untagged; default 0) or `,vlans=N1+N2...` (several, as 802.1Q tags with VLAN id =
//! network number), appended to the uplink's spec.

use crate::fabric::{NetId, UplinkNets};

use super::device_spec::parse_net;

/// Split `--uplink` text into the uplink's own spec (for `UplinkSpec`) and its networks.
pub fn split_uplink_nets(text: &str) -> Result<(String, UplinkNets), String> {
    let mut rest: Vec<&str> = Vec::new();
    let mut nets: Option<UplinkNets> = None;
    for item in text.split(',') {
        let parsed = match item.trim().split_once('=') {
            Some((k, v)) if k.eq_ignore_ascii_case("net") => UplinkNets::Untagged(parse_net(v)?),
            Some((k, v)) if k.eq_ignore_ascii_case("vlans") => parse_vlans(v)?,
            _ => {
                rest.push(item);
                continue;
            }
        };
        if nets.is_some() {
            return Err("give one net= or one vlans=, not both or twice".to_string());
        }
        nets = Some(parsed);
    }
    Ok((rest.join(","), nets.unwrap_or_default()))
}

fn parse_vlans(v: &str) -> Result<UplinkNets, String> {
    let mut list: Vec<NetId> = Vec::new();
    for n in v.split('+') {
        let n = parse_net(n)?;
        if n == 0 {
            return Err(
                "vlans=: VLAN id 0 is a priority tag, not a network; carry network 0 untagged \
                 on an uplink of its own"
                    .to_string(),
            );
        }
        if list.contains(&n) {
            return Err(format!("vlans=: network {n} given twice"));
        }
        list.push(n);
    }
    list.sort_unstable();
    Ok(UplinkNets::Tagged(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_are_split_off_the_uplink_spec() {
        let (spec, nets) =
            split_uplink_nets("udp:local=127.0.0.1:1,remote=127.0.0.1:2,vlans=7+3").unwrap();
        assert_eq!(spec, "udp:local=127.0.0.1:1,remote=127.0.0.1:2");
        assert_eq!(nets, UplinkNets::Tagged(vec![3, 7]));
        let (spec, nets) = split_uplink_nets("tap:vr0,net=5").unwrap();
        assert_eq!((spec.as_str(), nets), ("tap:vr0", UplinkNets::Untagged(5)));
        let (spec, nets) = split_uplink_nets("tap:vr0").unwrap();
        assert_eq!((spec.as_str(), nets), ("tap:vr0", UplinkNets::Untagged(0)));
    }

    #[test]
    fn bad_networks_are_refused_with_a_reason() {
        let e = |s: &str| split_uplink_nets(s).unwrap_err();
        assert!(e("tap:vr0,net=1,vlans=2").contains("not both"));
        assert!(e("tap:vr0,net=1,net=1").contains("not both or twice"));
        assert!(e("tap:vr0,vlans=0+1").contains("priority tag"));
        assert!(e("tap:vr0,vlans=3+3").contains("given twice"));
        assert!(e("tap:vr0,vlans=3+4095").contains("between 0 and 4094"));
        assert!(e("tap:vr0,vlans=").contains("between 0 and 4094"));
        assert!(e("tap:vr0,net=x").contains("between 0 and 4094"));
    }
}
