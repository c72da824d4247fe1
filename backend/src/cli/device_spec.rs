//! `--device socket=PATH,mac=MAC[,net=N][,ip=ADDR]...[,max-host-memory=BYTES][,owner=UID]
//! [,group=GID][,mode=MODE]`: one device on the daemon's fabric, how its port is attached (spec
//! §16.3), its own host-memory bound (spec §16.1) and who may use its sockets (spec §16.5).

use std::net::IpAddr;
use std::path::PathBuf;

use super::host_memory::host_memory;
use super::{access, check_socket_path, parse_mac, CliError};

/// Largest network number: networks map one to one onto 802.1Q VLAN ids 0..=4094 on a
/// trunk uplink (`vlans=`); 4095 is reserved by 802.1Q.
pub const MAX_NET: u16 = 4094;
/// Most `ip=` addresses per device (the list is scanned per frame).
pub const MAX_DEVICE_IPS: usize = 16;

/// How a device's fabric port is attached (spec §16.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricPortConfig {
    /// The tenant network (`net=`, default 0).
    pub net: u16,
    /// The device's addresses (`ip=`, repeatable). Empty: the port is checked on its source
    /// MAC only; otherwise port security is on.
    pub ips: Vec<IpAddr>,
}

/// One parsed `--device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub socket: PathBuf,
    pub mac: [u8; 6],
    pub port: FabricPortConfig,
    /// `max-host-memory=`: this device's bound instead of `--max-host-memory-per-device`.
    pub max_host_memory: Option<u64>,
    /// `owner=`, `group=`, `mode=`: this device's sockets, over the daemon-wide options.
    pub socket_access: access::SocketAccess,
}

/// A network number `net=` / `vlans=` take: 0..=[`MAX_NET`].
pub fn parse_net(v: &str) -> Result<u16, String> {
    v.parse::<u16>()
        .ok()
        .filter(|&n| n <= MAX_NET)
        .ok_or_else(|| format!("network {v:?} is not a number between 0 and {MAX_NET}"))
}

/// Parse the text of one `--device`.
pub fn parse_device(spec: &str) -> Result<DeviceSpec, CliError> {
    let bad = |reason: String| CliError::BadDevice {
        spec: spec.to_string(),
        reason,
    };
    let (mut socket, mut mac, mut net, mut memory) = (None, None, None, None);
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut socket_access = access::SocketAccess::default();
    for kv in spec.split(',') {
        if socket_access
            .parse_device_key(kv)
            .map_err(|e| bad(e.to_string()))?
        {
            continue;
        }
        match kv.split_once('=') {
            Some(("socket", v)) if socket.is_none() => socket = Some(PathBuf::from(v)),
            Some(("mac", v)) if mac.is_none() => {
                mac = Some(parse_mac(v).map_err(|e| bad(e.to_string()))?)
            }
            Some(("net", v)) if net.is_none() => net = Some(parse_net(v).map_err(bad)?),
            Some(("max-host-memory", v)) if memory.is_none() => {
                memory = Some(host_memory(v).map_err(|e| bad(e.to_string()))?)
            }
            Some(("ip", v)) => {
                let ip: IpAddr = v.parse().map_err(|_| {
                    bad(format!(
                        "ip={v:?} is not an IPv4 or IPv6 address (one address per ip=)"
                    ))
                })?;
                if ip.is_unspecified() || ip.is_multicast() {
                    return Err(bad(format!("ip={v}: not a unicast host address")));
                }
                if ips.contains(&ip) {
                    return Err(bad(format!("ip={v} given twice")));
                }
                if ips.len() == MAX_DEVICE_IPS {
                    return Err(bad(format!("more than {MAX_DEVICE_IPS} ip= addresses")));
                }
                ips.push(ip);
            }
            Some(("socket" | "mac" | "net" | "max-host-memory", _)) => {
                return Err(bad(format!("{kv:?} given twice")))
            }
            _ => {
                return Err(bad(format!(
                    "unknown key in {kv:?} (expected socket=, mac=, net=, ip=, max-host-memory=, owner=, group=, mode=)"
                )))
            }
        }
    }
    let socket = socket.ok_or_else(|| bad("socket=PATH missing".to_string()))?;
    let mac = mac.ok_or_else(|| bad("mac=MAC missing".to_string()))?;
    check_socket_path(&socket).map_err(|e| bad(e.to_string()))?;
    Ok(DeviceSpec {
        socket,
        mac,
        port: FabricPortConfig {
            net: net.unwrap_or(0),
            ips,
        },
        max_host_memory: memory,
        socket_access,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(spec: &str) -> String {
        match parse_device(spec) {
            Err(CliError::BadDevice { reason, .. }) => reason,
            other => panic!("{spec}: {other:?}"),
        }
    }

    #[test]
    fn net_and_ips_parse() {
        let d =
            parse_device("socket=/tmp/a.sock,mac=52:54:00:00:00:01,net=7,ip=10.0.0.1,ip=fd00::1")
                .unwrap();
        assert_eq!(d.port.net, 7);
        assert_eq!(
            d.port.ips,
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        let d = parse_device("socket=/tmp/a.sock,mac=52:54:00:00:00:01").unwrap();
        assert_eq!(
            d.port,
            FabricPortConfig::default(),
            "defaults: network 0, no list"
        );
        let d = parse_device("socket=/tmp/a.sock,mac=52:54:00:00:00:01,net=4094").unwrap();
        assert_eq!(d.port.net, MAX_NET);
    }

    #[test]
    fn bad_net_and_ips_are_refused_with_a_reason() {
        let base = "socket=/tmp/a.sock,mac=52:54:00:00:00:01";
        assert!(reason(&format!("{base},net=4095")).contains("between 0 and 4094"));
        assert!(reason(&format!("{base},net=-1")).contains("between 0 and 4094"));
        assert!(reason(&format!("{base},net=1,net=2")).contains("given twice"));
        assert!(reason(&format!("{base},ip=10.0.0")).contains("not an IPv4 or IPv6"));
        assert!(reason(&format!("{base},ip=10.0.0.1/24")).contains("not an IPv4 or IPv6"));
        assert!(reason(&format!("{base},ip=0.0.0.0")).contains("not a unicast"));
        assert!(reason(&format!("{base},ip=ff02::1")).contains("not a unicast"));
        assert!(reason(&format!("{base},ip=10.0.0.1,ip=10.0.0.1")).contains("given twice"));
        let many: String = (1..=17).map(|i| format!(",ip=10.0.0.{i}")).collect();
        assert!(reason(&format!("{base}{many}")).contains("more than 16"));
        assert!(reason(&format!("{base},vlan=3")).contains("expected socket=, mac=, net=, ip="));
    }
}
