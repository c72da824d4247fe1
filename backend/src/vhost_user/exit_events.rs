//! [`ExitEvents`]: the exit events of one connection's vring worker threads, closed when the
//! connection's backend goes away.
//!
//! `vhost-user-backend` 0.24 registers the consumer end that `VhostUserBackend::exit_event`
//! returns in its worker's epoll with `into_raw_fd` and never closes it: without this, every
//! frontend connection left one descriptor open per worker thread for the daemon's lifetime
//! (found by the `vhost_user` fuzz target, spec §16.5: a frontend that reconnects must not
//! exhaust the daemon's descriptors).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use log::warn;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// The consumer ends handed out, by descriptor number.
#[derive(Debug, Default)]
pub struct ExitEvents {
    consumers: Mutex<Vec<RawFd>>,
}

impl ExitEvents {
    /// A new exit event for a worker thread; its consumer end is closed when `self` drops.
    pub fn create(&self) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) =
            new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
                .map_err(|e| warn!("cannot create exit event: {e}"))
                .ok()?;
        self.consumers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }
}

impl Drop for ExitEvents {
    fn drop(&mut self) {
        let consumers = self.consumers.get_mut().unwrap_or_else(|e| e.into_inner());
        for fd in consumers.drain(..) {
            // SAFETY: the crate took this descriptor out of the consumer we returned
            // (`into_raw_fd`, the only thing it does with it besides adding it to its worker's
            // epoll) and never closes it, so nothing else owns it. `self` lives in the
            // connection's backend, which every worker's handler holds a reference to: it
            // drops only after the last worker and its epoll are gone.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}
