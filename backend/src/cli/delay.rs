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

/// The §11 commands by name (without `VRDMA_CMD_`), for the spec string.
const OPCODES: &[(&str, u16)] = &[
    ("query_device", VRDMA_CMD_QUERY_DEVICE),
    ("query_port", VRDMA_CMD_QUERY_PORT),
    ("add_gid", VRDMA_CMD_ADD_GID),
    ("del_gid", VRDMA_CMD_DEL_GID),
    ("create_pd", VRDMA_CMD_CREATE_PD),
    ("destroy_pd", VRDMA_CMD_DESTROY_PD),
    ("create_cq", VRDMA_CMD_CREATE_CQ),
    ("destroy_cq", VRDMA_CMD_DESTROY_CQ),
    ("resize_cq", VRDMA_CMD_RESIZE_CQ),
    ("create_qp", VRDMA_CMD_CREATE_QP),
    ("modify_qp", VRDMA_CMD_MODIFY_QP),
    ("query_qp", VRDMA_CMD_QUERY_QP),
    ("destroy_qp", VRDMA_CMD_DESTROY_QP),
    ("create_srq", VRDMA_CMD_CREATE_SRQ),
    ("modify_srq", VRDMA_CMD_MODIFY_SRQ),
    ("query_srq", VRDMA_CMD_QUERY_SRQ),
    ("destroy_srq", VRDMA_CMD_DESTROY_SRQ),
    ("create_ah", VRDMA_CMD_CREATE_AH),
    ("destroy_ah", VRDMA_CMD_DESTROY_AH),
    ("reg_mr", VRDMA_CMD_REG_MR),
    ("reg_dma_mr", VRDMA_CMD_REG_DMA_MR),
    ("alloc_fast_reg_mr", VRDMA_CMD_ALLOC_FAST_REG_MR),
    ("reg_odp_mr", VRDMA_CMD_REG_ODP_MR),
    ("reg_implicit_mr", VRDMA_CMD_REG_IMPLICIT_MR),
    ("dereg_mr", VRDMA_CMD_DEREG_MR),
    ("advise_mr", VRDMA_CMD_ADVISE_MR),
    ("odp_page_resp", VRDMA_CMD_ODP_PAGE_RESP),
    ("odp_invalidate", VRDMA_CMD_ODP_INVALIDATE),
    ("rereg_mr", VRDMA_CMD_REREG_MR),
];

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
        if OPCODES.iter().any(|&(_, op)| op == n) {
            return Ok(n);
        }
    }
    OPCODES
        .iter()
        .find(|&&(n, _)| n == name)
        .map(|&(_, op)| op)
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
