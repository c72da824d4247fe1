//! The host-memory bounds of a command line (spec §16.1): the devices' and the daemon's.

use super::{Args, CliError, MIN_HOST_MEMORY};

/// A host-memory byte count of the command line (at least [`MIN_HOST_MEMORY`]).
pub(super) fn host_memory(s: &str) -> Result<u64, CliError> {
    crate::budget::parse_bytes(s)
        .filter(|&n| n >= MIN_HOST_MEMORY)
        .ok_or_else(|| CliError::BadHostMemory(s.to_string()))
}

/// The host-memory bounds of the command line (spec §16.1): each device's (`max-host-memory=`
/// of its `--device`, else `--max-host-memory-per-device`, else 1 GiB, at most the daemon's)
/// and the daemon's (`--max-host-memory`, else the sum of the devices' plus, on a fabric, what
/// the daemon reserves or charges beside them: each device's receive queue and the capture
/// queue, so that every device can reach its own bound). On a `--socket-path` command line
/// `--max-host-memory` is the one device's bound as well, as it always was.
pub(super) fn host_memory_bounds(
    args: &Args,
    overrides: &[Option<u64>],
    single: bool,
) -> Result<(Vec<u64>, u64), CliError> {
    let total = args
        .max_host_memory
        .as_deref()
        .map(host_memory)
        .transpose()?;
    let per_device = args
        .max_host_memory_per_device
        .as_deref()
        .map(host_memory)
        .transpose()?;
    let default = match (per_device, total) {
        (Some(p), _) => p,
        (None, Some(t)) if single => t,
        (None, t) => crate::budget::DEFAULT_MAX_HOST_MEMORY.min(t.unwrap_or(u64::MAX)),
    };
    let devices: Vec<u64> = overrides.iter().map(|o| o.unwrap_or(default)).collect();
    let total = total.unwrap_or_else(|| {
        let beside = if single {
            0
        } else {
            let queues =
                (devices.len() as u64).saturating_mul(crate::fabric::rxqueue::RXQ_MAX_BYTES as u64);
            let capture = if args.pcap.is_some() {
                crate::uplink::pcap::QUEUE_BYTES
            } else {
                0
            };
            queues.saturating_add(capture)
        };
        devices.iter().fold(beside, |a, &d| a.saturating_add(d))
    });
    Ok((devices, total))
}
