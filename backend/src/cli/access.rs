//! Who may connect to the daemon's sockets (spec §16.5 "Sockets"): owner, group and mode of
//! each device's vhost-user and `.stats` sockets, daemon-wide (`--socket-owner`,
//! `--socket-group`, `--socket-mode`) or per `--device` (`owner=`, `group=`, `mode=`), and the
//! operator's stats socket (`--stats-socket`).

use std::path::PathBuf;

use clap::Args as ClapArgs;
use thiserror::Error;

/// Owner, group and permission bits given to a socket the daemon creates. `None` fields keep
/// what the daemon's user, group and umask give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SocketAccess {
    pub owner: Option<u32>,
    pub group: Option<u32>,
    /// Permission bits (at most 0o777).
    pub mode: Option<u32>,
}

impl SocketAccess {
    /// Nothing asked: the socket is created as before (umask, the daemon's ids).
    pub fn is_default(&self) -> bool {
        *self == SocketAccess::default()
    }

    /// `self` with the fields `over` sets replaced (a `--device` key over the daemon-wide
    /// option).
    pub fn overridden_by(self, over: SocketAccess) -> SocketAccess {
        SocketAccess {
            owner: over.owner.or(self.owner),
            group: over.group.or(self.group),
            mode: over.mode.or(self.mode),
        }
    }

    /// Apply one `owner=`, `group=` or `mode=` key of `--device`. `Ok(false)`: not one of
    /// these keys.
    pub fn parse_device_key(&mut self, kv: &str) -> Result<bool, AccessError> {
        let Some((k, v)) = kv.split_once('=') else {
            return Ok(false);
        };
        let slot = match k {
            "owner" => &mut self.owner,
            "group" => &mut self.group,
            "mode" => &mut self.mode,
            _ => return Ok(false),
        };
        if slot.is_some() {
            return Err(AccessError::Twice(k.to_string()));
        }
        *slot = Some(if k == "mode" {
            parse_mode(v)?
        } else {
            parse_id(v)?
        });
        Ok(true)
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AccessError {
    #[error("invalid mode {0:?}: expected octal permission bits, at most 0777 (e.g. 0660)")]
    Mode(String),
    #[error("invalid user or group id {0:?}: expected a number")]
    Id(String),
    #[error("{0}= given twice")]
    Twice(String),
}

/// Octal permission bits, e.g. `0660` or `600`.
pub fn parse_mode(s: &str) -> Result<u32, AccessError> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| AccessError::Mode(s.to_string()))
}

/// A numeric user or group id (names would need NSS inside a sandboxed daemon).
pub fn parse_id(s: &str) -> Result<u32, AccessError> {
    s.parse::<u32>()
        .ok()
        .filter(|&id| id != u32::MAX)
        .ok_or_else(|| AccessError::Id(s.to_string()))
}

/// The socket options of the command line (flattened into `cli::Args`).
#[derive(Debug, Clone, Default, PartialEq, Eq, ClapArgs)]
pub struct AccessArgs {
    /// Numeric user id to own every vhost-user and `.stats` socket (a --device's `owner=`
    /// overrides it). Give each tenant's sockets to its own QEMU user (or group, below) so
    /// that no tenant's frontend can connect to another's socket (spec §16.5).
    #[arg(long, value_name = "UID", value_parser = parse_id_arg)]
    pub socket_owner: Option<u32>,

    /// Numeric group id of every vhost-user and `.stats` socket (a --device's `group=`
    /// overrides it).
    #[arg(long, value_name = "GID", value_parser = parse_id_arg)]
    pub socket_group: Option<u32>,

    /// Permission bits (octal, e.g. 0600 or 0660) of every vhost-user and `.stats` socket (a
    /// --device's `mode=` overrides it). Without it (and without `mode=`) the umask decides.
    /// The socket appears at its path with these settings already applied.
    #[arg(long, value_name = "MODE", value_parser = parse_mode_arg)]
    pub socket_mode: Option<u32>,

    /// Operator socket (mode 0600) answering the fabric-wide counters of a --device daemon:
    /// every port's frames and drops. A device's own `.stats` socket shows that device only.
    #[arg(long, value_name = "PATH", requires = "device")]
    pub stats_socket: Option<PathBuf>,
}

fn parse_id_arg(s: &str) -> Result<u32, String> {
    parse_id(s).map_err(|e| e.to_string())
}

fn parse_mode_arg(s: &str) -> Result<u32, String> {
    parse_mode(s).map_err(|e| e.to_string())
}

impl AccessArgs {
    /// The daemon-wide socket access.
    pub fn access(&self) -> SocketAccess {
        SocketAccess {
            owner: self.socket_owner,
            group: self.socket_group,
            mode: self.socket_mode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_keys_parse_and_override() {
        let mut a = SocketAccess::default();
        assert_eq!(a.parse_device_key("owner=1001"), Ok(true));
        assert_eq!(a.parse_device_key("mode=0600"), Ok(true));
        assert_eq!(a.parse_device_key("mac=52:54:00:00:00:01"), Ok(false));
        assert_eq!(
            a.parse_device_key("owner=7"),
            Err(AccessError::Twice("owner".into()))
        );
        assert_eq!(
            a.parse_device_key("group=x"),
            Err(AccessError::Id("x".into()))
        );
        let wide = SocketAccess {
            owner: Some(5),
            group: Some(6),
            mode: Some(0o660),
        };
        assert_eq!(
            wide.overridden_by(a),
            SocketAccess {
                owner: Some(1001),
                group: Some(6),
                mode: Some(0o600)
            }
        );
    }

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert!(parse_mode("0800").is_err());
        assert!(parse_mode("01777").is_err());
        assert!(parse_mode("").is_err());
    }
}
