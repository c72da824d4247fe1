//! TEST ONLY (`--delay-commands`): control commands whose responses the device returns late.
//! The option's string is parsed by `cli::delay` ([`DelaySpec`]); this module applies it.
//!
//! Spec string: `OPCODE=MS[:MS...][,OPCODE=MS[:MS...]...]`. OPCODE is a §11 command name without
//! its `VRDMA_CMD_` prefix (case-insensitive, e.g. `resize_cq`) or its number. Such a command is
//! executed at once, like every other, and only its chain is returned MS milliseconds later; with
//! several values the n-th command of that opcode (counted from 0) is held `MS[n % count]` ms,
//! 0 meaning "returned at once".
//!
//! The device may complete commands in any order (§3.1): VM tests use this to make the driver's
//! command timeout fire while the command has already taken effect (§14.1), and to make two
//! commands of one kind complete in the opposite order of their execution.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::cli::delay::DelaySpec;

/// A [`DelaySpec`] in use: counts the commands of each listed opcode.
#[derive(Debug)]
pub struct CommandDelays {
    rules: Vec<(u16, Vec<u32>, AtomicUsize)>,
}

impl CommandDelays {
    pub fn new(spec: &DelaySpec) -> Self {
        CommandDelays {
            rules: spec
                .rules
                .iter()
                .map(|(op, d)| (*op, d.clone(), AtomicUsize::new(0)))
                .collect(),
        }
    }

    /// How long to hold the response of the command with `opcode` being returned now (`None`:
    /// not at all). Counts the command.
    pub fn next(&self, opcode: u16) -> Option<Duration> {
        let (_, delays, count) = self.rules.iter().find(|(op, _, _)| *op == opcode)?;
        let n = count.fetch_add(1, Ordering::Relaxed);
        let ms = *delays.get(n % delays.len().max(1))?;
        (ms > 0).then(|| Duration::from_millis(u64::from(ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma_spec::*;

    #[test]
    fn names_numbers_and_cycles() {
        let spec: DelaySpec = "resize_cq=1500:0, VRDMA_CMD_ODP_PAGE_RESP=20,7=5"
            .parse()
            .unwrap();
        assert_eq!(
            spec.rules,
            vec![
                (VRDMA_CMD_RESIZE_CQ, vec![1500, 0]),
                (VRDMA_CMD_ODP_PAGE_RESP, vec![20]),
                (VRDMA_CMD_CREATE_CQ, vec![5]),
            ]
        );
        let d = CommandDelays::new(&spec);
        let ms = |o| d.next(o).map(|x| x.as_millis());
        assert_eq!(ms(VRDMA_CMD_RESIZE_CQ), Some(1500));
        assert_eq!(ms(VRDMA_CMD_RESIZE_CQ), None);
        assert_eq!(ms(VRDMA_CMD_RESIZE_CQ), Some(1500));
        assert_eq!(ms(VRDMA_CMD_ODP_PAGE_RESP), Some(20));
        assert_eq!(ms(VRDMA_CMD_DESTROY_CQ), None);
    }
}
