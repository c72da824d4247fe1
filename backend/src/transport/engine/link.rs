//! The uplink's link state, polled by the receiving worker (spec §2.2: UDP has none; TAP's is
//! `IFF_UP` + `IFF_RUNNING`).

use std::time::{Duration, Instant};

use crate::handoff::HandoffLock;
use crate::transport::Device;
use crate::uplink::Uplink;

/// How often the engine reads the uplink's link state (spec §2.2: a change reaches the guest
/// within this, plus the event's delivery).
pub const LINK_POLL: Duration = Duration::from_millis(250);

/// When the link state is read next.
pub(super) struct LinkPoll {
    next: Instant,
}

impl LinkPoll {
    /// For the worker that receives, if `uplink` has a link state (read at once).
    pub(super) fn of(uplink: &dyn Uplink, receives: bool) -> Option<LinkPoll> {
        (receives && uplink.link_up().is_some()).then(|| LinkPoll {
            next: Instant::now(),
        })
    }

    /// The epoll timeout (ms, at least 1) that wakes the worker for the next read.
    pub(super) fn timeout_ms(&self) -> i32 {
        let ms = self
            .next
            .saturating_duration_since(Instant::now())
            .as_millis();
        i32::try_from(ms).unwrap_or(i32::MAX).max(1)
    }

    /// Is it time to read the link state?
    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Read the link state if it is time, and apply a change. A change is rare and needs the
    /// device exclusively (spec §2.2: `port_state` and the event), so the worker does this
    /// before its batch takes its share of the device lock.
    pub(super) fn poll(&mut self, uplink: &dyn Uplink, dev: &HandoffLock<Device>) {
        if Instant::now() < self.next {
            return;
        }
        self.next = Instant::now() + LINK_POLL;
        if let Some(up) = uplink.link_up() {
            if dev.lock_long().config.port_active != up {
                dev.lock().set_port_active(up);
            }
        }
    }
}
