//! What a control command produced (spec §3.1, §11.8): a status now, or a ticket for a command the
//! device parked and completes later.
//!
//! Only ADVISE_MR with `VRDMA_ADVISE_F_FLUSH` parks: it completes when the page requests it waits
//! for have ended. The device then reports `DeviceOutput::command_done(ticket, status)` from
//! whichever thread ended the last request (the vhost-user thread for ODP_PAGE_RESP,
//! ODP_INVALIDATE and DEREG_MR, the engine thread for a timeout), under the device lock; the
//! vhost-user layer keeps the parked descriptor chain by ticket until then.

/// Names one parked command. Tickets are never reused by a device (the counter survives resets),
/// so a late report can never complete a newer command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Result of `Device::handle_command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdOutcome {
    /// Completed with this `VRDMA_STATUS_*`; the response body (if any) is in `resp`.
    Done(u32),
    /// Parked: no response yet. `command_done(ticket, status)` follows exactly once, unless the
    /// device is reset first (then never: the driver gets the chain back through the virtio reset).
    Parked(Ticket),
}

impl CmdOutcome {
    /// The status of a completed command; `None` while parked.
    pub fn status(self) -> Option<u32> {
        match self {
            CmdOutcome::Done(s) => Some(s),
            CmdOutcome::Parked(_) => None,
        }
    }
}
