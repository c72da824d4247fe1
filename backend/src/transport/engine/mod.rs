//! The engine: the threads that run a device's transport. A device has one or more workers
//! (`--engine-threads`; `transport/workers.rs`: a QP belongs to one worker for its life), each
//! a thread of its own (one device, or `--own-engine-threads`) or, on a fabric by default, run
//! by the thread of an [`EngineGroup`] that serves the workers of that index of the devices
//! placed in its slot (`group.rs`), and each repeats one
//! round of phases ([`worker`]):
//! 1. wait (`wakeup.rs`): spin on the worker's flags, then sleep in epoll on its kick eventfd
//!    (doorbell records queued by [`EngineSender`], or a plain kick after a control command
//!    that may unblock QPs, e.g. ODP_PAGE_RESP), its timerfd (the earliest transport / ODP
//!    deadline) and, for worker 0 only, the uplink fd;
//! 2. receive (`receive.rs`): worker 0 takes a batch of buffers from the uplink, and polls the
//!    uplink's link state (`link.rs`);
//! 3. run units (`units.rs`): holding the device lock (`HandoffLock`) shared, doorbell records,
//!    the buffers other workers routed or the engine looped back, then the received buffers,
//!    each one routed (`route.rs`: to the transport, the guest's netdev, or the worker of its
//!    QP), with a hand-off point after each unit for a waiting control command; then timers;
//! 4. drain the outbox (`outbox.rs`): the frames the transport queued go back to this device's
//!    own QPs (loopback) or, after the lock is released, to the uplink.
//!
//! Workers of one device run their batches at the same time: what they change is behind
//! per-object locks (a QP, a CQ or SRQ, the MR table, their timer shard and outbox;
//! ARCHITECTURE.md "Locks").
//!
//! The vhost-user thread never blocks on the engine: [`EngineSender::doorbell`] only adds to a
//! bounded, merging queue (`doorbells.rs`) and writes the eventfd.

mod group;
mod link;
mod outbox;
mod receive;
mod route;
mod sender;
mod units;
mod wakeup;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;

use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::workers::{Inbox, MAX_WORKERS};
use crate::devlog::DeviceLog;
use crate::handoff::HandoffLock;
use crate::transport::Device;
use crate::uplink::Uplink;
use wakeup::Waiter;
use worker::{Shared, Worker};

pub use super::engine_options::{EngineOptions, DEFAULT_POLL, DEFAULT_POLL_US};
pub use group::{EngineGroup, GroupSlot};
pub use link::LINK_POLL;
pub use sender::EngineSender;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("engine: cannot create {what}: {source}")]
    Setup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("engine: cannot spawn the thread: {0}")]
    Spawn(std::io::Error),
}

/// The running engine threads. Dropping it stops and joins them.
pub struct Engine {
    sender: EngineSender,
    threads: Vec<JoinHandle<()>>,
    /// Its workers in an engine group: each one's sender is dropped when it leaves the group.
    grouped: Vec<Receiver<()>>,
    /// Keeps the group's threads for as long as this engine's workers are in it.
    _group: Option<EngineGroup>,
    /// The device's label and log limit: what the engine logs names it (spec §16.5 "Logs").
    log: Option<Arc<DeviceLog>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

impl Engine {
    /// Start the engine for `dev` on `uplink` with the default [`EngineOptions`].
    pub fn start(
        dev: Arc<HandoffLock<Device>>,
        uplink: Arc<dyn Uplink>,
    ) -> Result<Engine, EngineError> {
        Self::start_with(dev, uplink, EngineOptions::default())
    }

    /// Start the engine for `dev` on `uplink`. Installs the transport's flush hook in the device
    /// and spreads its QPs over the workers.
    pub fn start_with(
        dev: Arc<HandoffLock<Device>>,
        uplink: Arc<dyn Uplink>,
        opts: EngineOptions,
    ) -> Result<Engine, EngineError> {
        Self::start_maybe_in(None, dev, uplink, opts)
    }

    /// Start the engine for `dev` on `uplink` with its workers in the threads of `group`'s
    /// slot `slot` (one per worker index, shared with the slot's other devices: `group.rs`),
    /// where they can be (a worker that receives from an uplink without `rx_pending` gets a
    /// thread of its own). `opts.poll` is the group's.
    pub fn start_in(
        group: &EngineGroup,
        slot: GroupSlot,
        dev: Arc<HandoffLock<Device>>,
        uplink: Arc<dyn Uplink>,
        opts: EngineOptions,
    ) -> Result<Engine, EngineError> {
        Self::start_maybe_in(Some((group, slot)), dev, uplink, opts)
    }

    fn start_maybe_in(
        group: Option<(&EngineGroup, GroupSlot)>,
        dev: Arc<HandoffLock<Device>>,
        uplink: Arc<dyn Uplink>,
        opts: EngineOptions,
    ) -> Result<Engine, EngineError> {
        let n = opts.threads.clamp(1, MAX_WORKERS);
        let mut inboxes = Vec::with_capacity(n);
        let mut waiters = Vec::with_capacity(n);
        for w in 0..n {
            let kick = EventFd::new(EFD_NONBLOCK).map_err(|source| EngineError::Setup {
                what: "eventfd",
                source,
            })?;
            // Worker 0 receives for all (`workers.rs`).
            let uplink_fd = Some(uplink.as_raw_fd()).filter(|&fd| w == 0 && fd >= 0);
            waiters.push(Waiter::new(&kick, uplink_fd, opts.poll)?);
            inboxes.push(Inbox::new(kick));
        }
        let (port, units, log) = {
            let mut d = dev.lock();
            d.flush_hook = Some(super::flush);
            // What the port does with the ICRC is the uplink's for its life (a reset keeps it).
            d.icrc_offload = uplink.icrc_offload();
            super::timers::set_workers(&mut d, n);
            (d.port_stats.clone(), d.units.clone(), d.out.device_log())
        };
        let sender = EngineSender {
            inboxes: inboxes.into(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let mut engine = Engine {
            sender: sender.clone(),
            threads: Vec::with_capacity(n),
            grouped: Vec::new(),
            _group: group.map(|(g, _)| g.clone()),
            log: log.clone(),
        };
        for (w, waiter) in waiters.into_iter().enumerate() {
            let shared = Shared {
                index: w,
                dev: dev.clone(),
                uplink: uplink.clone(),
                sender: sender.clone(),
                port: port.clone(),
                units: units.clone(),
            };
            // Worker 0 receives: the group's pass looks at its uplink's queue without a
            // system call, which only `rx_pending` allows.
            let groupable = w != 0 || uplink.rx_pending().is_some();
            if let Some((group, slot)) = group.filter(|_| groupable) {
                let (left, gone) = std::sync::mpsc::sync_channel(0);
                group.join(
                    slot,
                    w,
                    group::Joining {
                        shared,
                        waiter,
                        log: log.clone(),
                        left,
                    },
                )?;
                engine.grouped.push(gone);
                continue;
            }
            let name = if n == 1 {
                "vrdma-engine".to_string()
            } else {
                format!("vrdma-engine{w}")
            };
            let log = log.clone();
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    // The worker's whole life is its device's: all it logs names the device.
                    let _device = log.as_ref().map(crate::devlog::enter);
                    Worker::new(shared, waiter).run()
                })
                .map_err(EngineError::Spawn)?;
            engine.threads.push(thread);
        }
        Ok(engine)
    }

    /// Its workers run in an engine group's threads (`start_in`), not in threads of its own.
    pub fn in_group(&self) -> bool {
        !self.grouped.is_empty()
    }

    pub fn sender(&self) -> EngineSender {
        self.sender.clone()
    }

    /// Stop the thread and wait for it (clean shutdown: the current batch finishes first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _device = self.log.as_ref().map(crate::devlog::enter);
        self.sender.stop.store(true, Ordering::Release);
        self.sender.kick();
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                guest_error!("engine thread panicked");
            }
        }
        // A grouped worker's group thread drops its sender when the worker leaves (after its
        // round, on the stop flag and the kick above): `recv` then fails.
        for gone in self.grouped.drain(..) {
            let _ = gone.recv();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
