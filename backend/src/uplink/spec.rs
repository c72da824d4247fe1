//! Uplink specifications: `udp:local=ADDR:PORT,remote=ADDR:PORT` and `tap:NAME`.
//!
//! Scheme and keys are case-insensitive; addresses are numeric socket addresses
//! (`127.0.0.1:5000`, `[::1]:5000`).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use super::{tap, TapUplink, UdpUplink, Uplink, UplinkError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UplinkSpec {
    Udp {
        local: SocketAddr,
        remote: SocketAddr,
    },
    Tap {
        name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("uplink spec {0:?}: expected udp:local=ADDR:PORT,remote=ADDR:PORT or tap:NAME")]
    UnknownScheme(String),
    #[error("udp uplink: {0:?} is not key=value")]
    NotKeyValue(String),
    #[error("udp uplink: unknown key {0:?} (expected local, remote)")]
    UnknownKey(String),
    #[error("udp uplink: key {0:?} given twice")]
    DuplicateKey(String),
    #[error("udp uplink: missing {0}=ADDR:PORT")]
    MissingKey(&'static str),
    #[error("udp uplink: {key}={value:?} is not an ADDR:PORT socket address")]
    BadAddress { key: &'static str, value: String },
    #[error("tap uplink: bad interface name {0:?} (1-15 characters, no '/', ':' or spaces)")]
    BadTapName(String),
}

impl FromStr for UplinkSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (scheme, rest) = s
            .split_once(':')
            .ok_or_else(|| SpecError::UnknownScheme(s.to_owned()))?;
        match scheme.to_ascii_lowercase().as_str() {
            "tap" => {
                if tap::valid_ifname(rest) {
                    Ok(UplinkSpec::Tap {
                        name: rest.to_owned(),
                    })
                } else {
                    Err(SpecError::BadTapName(rest.to_owned()))
                }
            }
            "udp" => {
                let mut local = None;
                let mut remote = None;
                for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    let (k, v) = item
                        .split_once('=')
                        .ok_or_else(|| SpecError::NotKeyValue(item.to_owned()))?;
                    let k = k.trim().to_ascii_lowercase();
                    let (slot, key) = match k.as_str() {
                        "local" => (&mut local, "local"),
                        "remote" => (&mut remote, "remote"),
                        _ => return Err(SpecError::UnknownKey(k)),
                    };
                    if slot.is_some() {
                        return Err(SpecError::DuplicateKey(k));
                    }
                    let v = v.trim();
                    *slot = Some(v.parse::<SocketAddr>().map_err(|_| SpecError::BadAddress {
                        key,
                        value: v.to_owned(),
                    })?);
                }
                Ok(UplinkSpec::Udp {
                    local: local.ok_or(SpecError::MissingKey("local"))?,
                    remote: remote.ok_or(SpecError::MissingKey("remote"))?,
                })
            }
            _ => Err(SpecError::UnknownScheme(s.to_owned())),
        }
    }
}

impl fmt::Display for UplinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UplinkSpec::Udp { local, remote } => write!(f, "udp:local={local},remote={remote}"),
            UplinkSpec::Tap { name } => write!(f, "tap:{name}"),
        }
    }
}

impl UplinkSpec {
    /// Open the uplink this spec describes.
    pub fn open(&self) -> Result<Box<dyn Uplink>, UplinkError> {
        Ok(match self {
            UplinkSpec::Udp { local, remote } => Box::new(UdpUplink::new(*local, *remote)?),
            UplinkSpec::Tap { name } => Box::new(TapUplink::open(name)?),
        })
    }

    /// Open for a port of Ethernet MTU `mtu`: a TAP interface's MTU is raised to it (a UDP
    /// datagram carries any frame up to `MAX_FRAME`).
    pub fn open_for_mtu(&self, mtu: u16) -> Result<Box<dyn Uplink>, UplinkError> {
        Ok(match self {
            UplinkSpec::Tap { name } => Box::new(TapUplink::open_with_mtu(name, mtu)?),
            _ => self.open()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_specs() {
        let s: UplinkSpec = "udp:local=127.0.0.1:5000,remote=127.0.0.1:5001"
            .parse()
            .unwrap();
        assert_eq!(
            s,
            UplinkSpec::Udp {
                local: "127.0.0.1:5000".parse().unwrap(),
                remote: "127.0.0.1:5001".parse().unwrap()
            }
        );
        assert_eq!(s.to_string().parse::<UplinkSpec>().unwrap(), s);
        let s: UplinkSpec = "UDP:Remote=[::1]:7,LOCAL=[::1]:8".parse().unwrap();
        assert_eq!(
            s,
            UplinkSpec::Udp {
                local: "[::1]:8".parse().unwrap(),
                remote: "[::1]:7".parse().unwrap()
            }
        );
        assert_eq!(
            "tap:vrdma0".parse::<UplinkSpec>().unwrap(),
            UplinkSpec::Tap {
                name: "vrdma0".into()
            }
        );
        assert_eq!("TAP:t".parse::<UplinkSpec>().unwrap().to_string(), "tap:t");
    }

    #[test]
    fn bad_specs() {
        use SpecError::*;
        let e = |s: &str| s.parse::<UplinkSpec>().unwrap_err();
        assert!(matches!(e("udp"), UnknownScheme(_)));
        assert!(matches!(e("eth:x"), UnknownScheme(_)));
        assert!(matches!(e("udp:local=127.0.0.1:1"), MissingKey("remote")));
        assert!(matches!(e("udp:remote=127.0.0.1:1"), MissingKey("local")));
        assert!(matches!(
            e("udp:local=127.0.0.1:1,local=127.0.0.1:2,remote=127.0.0.1:3"),
            DuplicateKey(_)
        ));
        assert!(matches!(
            e("udp:local=localhost,remote=127.0.0.1:3"),
            BadAddress { key: "local", .. }
        ));
        assert!(matches!(
            e("udp:local=127.0.0.1:99999,remote=127.0.0.1:3"),
            BadAddress { .. }
        ));
        assert!(matches!(e("udp:peer=127.0.0.1:1"), UnknownKey(_)));
        assert!(matches!(e("udp:127.0.0.1:1"), NotKeyValue(_)));
        assert!(matches!(e("tap:"), BadTapName(_)));
        assert!(matches!(e("tap:waytoolonginterfacename"), BadTapName(_)));
        // Messages are readable.
        assert!(e("udp:local=127.0.0.1:1")
            .to_string()
            .contains("missing remote"));
    }
}
