//! `--delay-commands` (TEST ONLY): the option's string, parsed into a [`DelaySpec`] that
//! `vhost_user::delay::CommandDelays` applies. See there for what a delay does.
//!
//! Spec string: `OPCODE=MS[:MS...][,OPCODE=MS[:MS...]...]`. OPCODE is a §11 command name without
//! its `VRDMA_CMD_` prefix (case-insensitive, e.g. `resize_cq`) or its number; with several
//! values the n-th command of that opcode (counted from 0) is held `MS[n % count]` ms, 0 meaning
//! "returned at once".

use std::str::FromStr;

use thiserror::Error;
use vrdma_spec::*;

/// Longest delay accepted: a minute is beyond every driver timeout worth testing.
pub const MAX_DELAY_MS: u32 = 60_000;

/// The §11 command opcodes by their `VRDMA_CMD_*` name, taken from the spec's constant list
/// (so every command of the ABI is accepted, and no list here can fall behind it). The
/// `VRDMA_CMD_MAX_*` entries are limits of a command, not opcodes.
fn opcodes() -> impl Iterator<Item = (&'static str, u16)> {
    ABI_CONSTANTS.iter().filter_map(|&(name, value)| {
        let op = name.strip_prefix("VRDMA_CMD_")?;
        if op.starts_with("MAX_") {
            return None;
        }
        Some((op, u16::try_from(value).ok()?))
    })
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DelayError {
    #[error("{0:?}: expected OPCODE=MS[:MS...]")]
    NotKeyValue(String),
    #[error("opcode {0:?} unknown (a §11 command name such as resize_cq, or its number)")]
    UnknownOpcode(String),
    #[error("opcode {0:?} given twice")]
    DuplicateOpcode(String),
    #[error("delay {0:?}: expected milliseconds between 0 and {MAX_DELAY_MS}")]
    BadDelay(String),
}

/// The parsed `--delay-commands` string: per opcode, the delays in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelaySpec {
    pub rules: Vec<(u16, Vec<u32>)>,
}

fn parse_opcode(s: &str) -> Result<u16, DelayError> {
    let name = s.trim().to_ascii_lowercase();
    let name = name.strip_prefix("vrdma_cmd_").unwrap_or(&name);
    if let Ok(n) = name.parse::<u16>() {
        if opcodes().any(|(_, op)| op == n) {
            return Ok(n);
        }
    }
    opcodes()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, op)| op)
        .ok_or_else(|| DelayError::UnknownOpcode(s.to_string()))
}

impl FromStr for DelaySpec {
    type Err = DelayError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut rules: Vec<(u16, Vec<u32>)> = Vec::new();
        for item in s.split(',').filter(|i| !i.trim().is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| DelayError::NotKeyValue(item.to_string()))?;
            let opcode = parse_opcode(key)?;
            if rules.iter().any(|(op, _)| *op == opcode) {
                return Err(DelayError::DuplicateOpcode(key.to_string()));
            }
            let delays = value
                .split(':')
                .map(|ms| {
                    ms.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| n <= MAX_DELAY_MS)
                        .ok_or_else(|| DelayError::BadDelay(ms.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            rules.push((opcode, delays));
        }
        if rules.is_empty() {
            return Err(DelayError::NotKeyValue(s.to_string()));
        }
        Ok(DelaySpec { rules })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every §11 command is accepted by name (the hand-written list this replaced stopped at
    /// REREG_MR: ALLOC_MW, the multicast, QUERY_STATS, MODIFY_CQ and XRCD commands were unknown).
    #[test]
    fn every_command_of_the_abi_has_its_name() {
        let spec: DelaySpec = "alloc_mw=1,query_stats=2,modify_cq=3,dealloc_xrcd=4,query_device=5"
            .parse()
            .unwrap();
        assert_eq!(
            spec.rules,
            vec![
                (VRDMA_CMD_ALLOC_MW, vec![1]),
                (VRDMA_CMD_QUERY_STATS, vec![2]),
                (VRDMA_CMD_MODIFY_CQ, vec![3]),
                (VRDMA_CMD_DEALLOC_XRCD, vec![4]),
                (VRDMA_CMD_QUERY_DEVICE, vec![5]),
            ]
        );
        assert_eq!(opcodes().count(), 37);
        assert!(matches!(
            "max_len=1".parse::<DelaySpec>(),
            Err(DelayError::UnknownOpcode(_))
        ));
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(matches!(
            "resize_cq".parse::<DelaySpec>(),
            Err(DelayError::NotKeyValue(_))
        ));
        assert!(matches!(
            "frobnicate=1".parse::<DelaySpec>(),
            Err(DelayError::UnknownOpcode(_))
        ));
        assert!(matches!(
            "99=1".parse::<DelaySpec>(),
            Err(DelayError::UnknownOpcode(_))
        ));
        assert!(matches!(
            "resize_cq=1,9=2".parse::<DelaySpec>(),
            Err(DelayError::DuplicateOpcode(_))
        ));
        assert!(matches!(
            "resize_cq=60001".parse::<DelaySpec>(),
            Err(DelayError::BadDelay(_))
        ));
        assert!(matches!(
            "resize_cq=1:x".parse::<DelaySpec>(),
            Err(DelayError::BadDelay(_))
        ));
        assert!(matches!(
            "".parse::<DelaySpec>(),
            Err(DelayError::NotKeyValue(_))
        ));
    }
}
