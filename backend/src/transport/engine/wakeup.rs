//! The wait phase of a worker's round: how it sleeps until there is work, and what woke it.
//! Its epoll watches the kick eventfd, the timerfd ([`Alarm`]) and, on worker 0, the uplink;
//! before it sleeps there it may busy-poll ([`Poller`]).

use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::EngineError;
use crate::transport::wait::{Alarm, Poller};
use crate::transport::workers::Inbox;
use crate::uplink::Uplink;

const TOKEN_KICK: u64 = 1;
const TOKEN_TIMER: u64 = 2;
const TOKEN_UPLINK: u64 = 3;

/// A worker's epoll, timerfd and busy-poll window.
pub(super) struct Waiter {
    epoll: Epoll,
    alarm: Alarm,
    poller: Poller,
    events: Vec<EpollEvent>,
}

/// How a wait ended.
pub(super) enum Woken {
    /// Work may be there: the epoll events (none after a spin that found work) are to be
    /// taken with [`Waiter::take_events`].
    Ready(usize),
    /// A signal ended the wait: the worker waits again.
    Interrupted,
    /// epoll failed: the worker ends.
    Failed,
}

/// What a wait is for.
pub(super) struct WaitFor<'a> {
    /// The worker's inbox (its busy-poll flags).
    pub(super) inbox: &'a Inbox,
    /// The uplink the worker receives from and may poll, if any (`Poller::spin`).
    pub(super) uplink: Option<&'a dyn Uplink>,
    /// Busy-polling is possible: configured, and the worker receives nothing or from an
    /// uplink that tells without a system call whether frames wait (`Uplink::rx_pending`).
    pub(super) can_poll: bool,
    /// Work is known to be left (frames on the uplink or looped back): do not sleep.
    pub(super) busy: bool,
    /// How long epoll may sleep when not busy (ms; -1: until an fd is readable).
    pub(super) timeout_ms: i32,
}

impl Waiter {
    /// A new epoll that watches `kick`, a new timerfd and the uplink's `uplink_fd` if given;
    /// busy-polling for at most `poll` (`--poll-us`).
    pub(super) fn new(
        kick: &EventFd,
        uplink_fd: Option<RawFd>,
        poll: Duration,
    ) -> Result<Waiter, EngineError> {
        let setup = |what| move |source| EngineError::Setup { what, source };
        let timer = TimerFd::new().map_err(|e| EngineError::Setup {
            what: "timerfd",
            source: std::io::Error::from_raw_os_error(e.errno()),
        })?;
        let epoll = Epoll::new().map_err(setup("epoll"))?;
        let watch = |fd, token| {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        };
        watch(kick.as_raw_fd(), TOKEN_KICK).map_err(setup("epoll add eventfd"))?;
        watch(timer.as_raw_fd(), TOKEN_TIMER).map_err(setup("epoll add timerfd"))?;
        if let Some(fd) = uplink_fd {
            watch(fd, TOKEN_UPLINK).map_err(setup("epoll add uplink"))?;
        }
        Ok(Waiter {
            epoll,
            alarm: Alarm { timer, armed: None },
            poller: Poller::new(poll),
            events: vec![EpollEvent::default(); 8],
        })
    }

    /// Busy-polling configured at all (`--poll-us` not 0)?
    pub(super) fn polls(&self) -> bool {
        self.poller.enabled()
    }

    /// Wait for work. Unless busy, spin first (`Poller`): work found there needs no epoll
    /// round, and the fds are then not read (a readable eventfd or timerfd stays readable for
    /// the next epoll round, and the timers run every batch anyway). The sleep is timed, to
    /// adapt the spin window, only where the worker can poll: a clock read costs on some hosts.
    pub(super) fn wait(&mut self, what: WaitFor<'_>) -> Woken {
        let timeout = if what.busy { 0 } else { what.timeout_ms };
        let pollable = what.can_poll && !what.busy;
        let polled = pollable && self.poller.spin(&what.inbox.wake, what.uplink);
        let slept = (pollable && !polled && timeout != 0).then(Instant::now);
        let n = if polled {
            0
        } else {
            match self.epoll.wait(timeout, &mut self.events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Woken::Interrupted,
                Err(e) => {
                    guest_error!("engine: epoll_wait: {e}");
                    return Woken::Failed;
                }
            }
        };
        if let Some(t) = slept {
            self.poller.slept(t.elapsed());
        }
        Woken::Ready(n)
    }

    /// The epoll fd: readable when one of the worker's fds is (an engine group's epoll
    /// watches it, `group.rs`).
    pub(super) fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// The events that are there now, without sleeping (an engine group found this worker's
    /// epoll readable); to be taken with [`Waiter::take_events`].
    pub(super) fn poll_now(&mut self) -> Woken {
        match self.epoll.wait(0, &mut self.events) {
            Ok(n) => Woken::Ready(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Woken::Interrupted,
            Err(e) => {
                guest_error!("engine: epoll_wait: {e}");
                Woken::Failed
            }
        }
    }

    /// The timer is armed for `now` or earlier: its deadline is due (seen without the fd).
    pub(super) fn due(&self, now: Instant) -> bool {
        self.alarm.armed.is_some_and(|a| a <= now)
    }

    /// A round runs the timers now: forget a deadline that is due, so that the next
    /// [`Waiter::arm`] sets the timerfd again (its expiry, if read later, is a spare wake-up).
    pub(super) fn clear_due(&mut self, now: Instant) {
        if self.due(now) {
            self.alarm.armed = None;
        }
    }

    /// Consume the first `n` events of the last wait: the kick eventfd's count, the timer's
    /// expiry. The uplink's readiness needs nothing: the receive phase reads it.
    pub(super) fn take_events(&mut self, n: usize, inbox: &Inbox) {
        for ev in self.events.iter().take(n) {
            match ev.data() {
                TOKEN_KICK => {
                    let _ = inbox.kick.read();
                }
                TOKEN_TIMER => self.alarm.fired(),
                _ => {}
            }
        }
        // Before the worker takes its queue: a kick after the take sets it again.
        inbox.wake.work.store(false, Ordering::SeqCst);
    }

    /// Make sure the timer fires no later than `deadline` (`Alarm::set`).
    pub(super) fn arm(&mut self, deadline: Option<Instant>) {
        self.alarm.set(deadline, Instant::now());
    }
}
