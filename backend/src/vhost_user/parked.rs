//! Control chains of parked commands (spec §3.1: ADVISE_MR with F_FLUSH may complete after
//! commands made available later).
//!
//! The control queue parks a chain here, by ticket, while it still holds the exclusive device
//! lock that produced the ticket, so the completion (`DeviceOutput::command_done`, under the
//! device lock) always finds it; or, for a command beside the engine workers, inside a
//! [`ParkWindow`] opened before the command ran, which keeps a completion that comes first. Completion writes the 8-byte response header, returns the chain to the
//! used ring and signals the driver, all under this object's lock, from whichever thread ended
//! the command (vhost-user or engine). Lock order: device -> parked -> vring.
//!
//! Device reset, ring stop and disconnect drop the parked chains unwritten: the driver gets them
//! back through the virtio reset (`virtqueue_detach_unused_buf`), and nothing is written into a
//! ring the frontend has taken back.
//!
//! TEST ONLY: with `--delay-commands` ([`super::delay`]) an executed command's whole response is
//! returned from here after its delay ([`ParkedCommands::deliver_later`]), unless a reset or a
//! disconnect came first.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vrdma_spec::{Abi, VrdmaCmdRespHdr};

use super::chain::SplitChain;
use super::delay::CommandDelays;
use super::output::Target;
use crate::guest::Ticket;
use crate::sync::modeled::{lock, Mutex, MutexGuard};

#[derive(Default)]
struct ParkedState {
    chains: HashMap<Ticket, SplitChain>,
    /// The control vring of the current connection.
    target: Option<Target>,
    /// Counts resets and disconnects: a delayed response of an earlier generation is dropped.
    generation: u64,
    /// A command beside the engine workers is running and may park ([`ParkWindow`]).
    window: bool,
    /// Completions that came, while the window was open, for tickets not parked (yet).
    early: Vec<(Ticket, u32)>,
}

/// The parked control chains of one device.
#[derive(Default)]
pub struct ParkedCommands {
    state: Arc<Mutex<ParkedState>>,
    /// TEST ONLY: `--delay-commands`.
    delays: OnceLock<CommandDelays>,
}

impl std::fmt::Debug for ParkedCommands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedCommands")
            .field("parked", &self.len())
            .finish_non_exhaustive()
    }
}

impl ParkedCommands {
    fn lock(&self) -> MutexGuard<'_, ParkedState> {
        lock(&self.state)
    }

    /// TEST ONLY: hold the responses of the commands `delays` names. Set once, at start-up.
    pub fn set_delays(&self, delays: CommandDelays) {
        if self.delays.set(delays).is_err() {
            log::warn!("--delay-commands set twice; the first setting stays");
        }
    }

    /// TEST ONLY: how long to hold the response of an executed command with `opcode`.
    pub fn delay_for(&self, opcode: u16) -> Option<Duration> {
        self.delays.get()?.next(opcode)
    }

    /// TEST ONLY: return `chain` with `response` (header and body) written after `delay`, from
    /// a thread of its own. Dropped unwritten if the device is reset or the connection ends
    /// first, like a parked chain. False if no thread could be started: the caller returns the
    /// chain now.
    pub fn deliver_later(&self, chain: SplitChain, response: Vec<u8>, delay: Duration) -> bool {
        let state = Arc::clone(&self.state);
        let generation = self.lock().generation;
        // The response is the device's that ran the command (spec §16.5 "Logs").
        let device = crate::devlog::current();
        std::thread::Builder::new()
            .name("vrdma-delayed-cmd".to_string())
            .spawn(move || {
                let _device = device.as_ref().map(crate::devlog::enter);
                std::thread::sleep(delay);
                let st = lock(&state);
                if st.generation == generation {
                    return_chain(&st, &chain, &response);
                }
            })
            .is_ok()
    }

    /// Chains waiting for their completion.
    pub fn len(&self) -> usize {
        self.lock().chains.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A connection's control vring became available.
    pub(super) fn attach(&self, target: Target) {
        self.lock().target = Some(target);
    }

    /// Disconnect: drop the parked chains and forget the vring.
    pub fn detach(&self) {
        let mut st = self.lock();
        st.chains.clear();
        st.target = None;
        st.generation += 1;
    }

    /// Device reset or control ring stopped: drop the parked chains, keep the vring.
    pub fn clear(&self) {
        let mut st = self.lock();
        st.chains.clear();
        st.generation += 1;
    }

    /// Keep `chain` until `complete(ticket, ..)`. Call with the device lock held, or inside a
    /// [`ParkWindow`] opened before the command ran: a completion that came first is then
    /// delivered at once.
    pub fn park(&self, ticket: Ticket, chain: SplitChain) {
        let mut st = self.lock();
        if let Some(i) = st.early.iter().position(|&(t, _)| t == ticket) {
            let (_, status) = st.early.swap_remove(i);
            return_chain(&st, &chain, response_header(status).as_bytes());
            return;
        }
        st.chains.insert(ticket, chain);
    }

    /// Open the window for a command that runs beside the engine workers and may park: its
    /// completion may come from a worker before the control queue has parked the chain (the
    /// device lock, held shared, does not order them). Until the window closes (dropped), a
    /// completion for a ticket that is not parked is kept for [`ParkedCommands::park`]; at
    /// the close, those never parked (a reset dropped their chains) are forgotten. One
    /// control queue per device runs one command at a time, so windows never overlap.
    pub fn window(&self) -> ParkWindow<'_> {
        self.lock().window = true;
        ParkWindow { parked: self }
    }

    /// Complete the chain parked as `ticket` with `status` (no response body). A ticket that is
    /// not parked (dropped by a reset) is ignored, unless a [`ParkWindow`] is open.
    pub fn complete(&self, ticket: Ticket, status: u32) {
        let mut st = self.lock();
        let Some(chain) = st.chains.remove(&ticket) else {
            if st.window {
                st.early.push((ticket, status));
            }
            return;
        };
        return_chain(&st, &chain, response_header(status).as_bytes());
    }
}

/// While alive, completions may come before their chain is parked ([`ParkedCommands::window`]).
#[must_use = "the window closes when dropped"]
pub struct ParkWindow<'a> {
    parked: &'a ParkedCommands,
}

impl Drop for ParkWindow<'_> {
    fn drop(&mut self) {
        let mut st = self.parked.lock();
        st.window = false;
        st.early.clear();
    }
}

/// The 8-byte response of a parked command (it has no body).
fn response_header(status: u32) -> VrdmaCmdRespHdr {
    VrdmaCmdRespHdr {
        status,
        reserved: 0,
    }
}

/// Write `bytes` into `chain`'s writable part, put it in the used ring and signal the driver.
fn return_chain(st: &ParkedState, chain: &SplitChain, bytes: &[u8]) {
    let Some(target) = st.target.clone() else {
        return;
    };
    // Only a table whose regions passed the check is touched (spec §16.5).
    let Some(mem) = target.table() else {
        return;
    };
    let vring = &target.vring;
    // Nothing moves on a ring the frontend has disabled (or not set up again): the chain is
    // dropped unanswered, as at a reset; the driver recovers it with the device reset that
    // must precede using the ring again.
    let mut state = vring.get_mut();
    if !state.get_queue().ready() || !state.is_enabled() {
        guest_warn!(
            "controlq: parked chain {} completed while the ring is stopped; dropped",
            chain.head
        );
        return;
    }
    let len = match chain.scatter(&*mem, bytes) {
        Ok(n) => n as u32,
        Err(e) => {
            guest_warn!("controlq: chain {}: response not written: {e}", chain.head);
            0
        }
    };
    if let Err(e) = state.get_queue_mut().add_used(&*mem, chain.head, len) {
        guest_warn!("controlq: parked chain {}: add_used: {e}", chain.head);
        return;
    }
    match state.get_queue_mut().needs_notification(&*mem) {
        Ok(true) => {
            if let Err(e) = state.signal_used_queue() {
                guest_warn!("controlq: signal: {e}");
            }
        }
        Ok(false) => {}
        Err(e) => guest_warn!("controlq: needs_notification: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(head: u16) -> SplitChain {
        SplitChain {
            head,
            readable: Vec::new(),
            read_error: None,
            writable: Vec::new(),
        }
    }

    #[test]
    fn a_completion_inside_the_window_before_the_park_answers_the_park() {
        let p = ParkedCommands::default();
        let w = p.window();
        p.complete(Ticket(7), 0);
        p.park(Ticket(7), chain(1));
        assert!(
            p.is_empty(),
            "the early completion was not delivered at the park"
        );
        // A completion of a ticket that never parks is forgotten when the window closes.
        p.complete(Ticket(8), 0);
        drop(w);
        p.park(Ticket(8), chain(2));
        assert_eq!(
            p.len(),
            1,
            "a completion from a closed window answered a later park"
        );
    }

    #[test]
    fn without_a_window_a_completion_before_the_park_is_ignored() {
        let p = ParkedCommands::default();
        p.complete(Ticket(3), 0);
        p.park(Ticket(3), chain(1));
        assert_eq!(p.len(), 1);
        p.complete(Ticket(3), 0);
        assert!(p.is_empty());
    }
}

/// The loom model (issue 38 item 1): `make loom-test`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;

    /// Inside a window, an engine worker completes a command while the control queue parks
    /// its chain, in either order: the chain is answered once and nothing stays parked or
    /// kept early. Without the window's early list (a completion before the park ignored, as
    /// outside a window) the model fails: the chain stays parked forever.
    #[test]
    fn loom_a_completion_beside_its_park_inside_a_window_answers_the_chain() {
        crate::sync::modeled::model(|| {
            let parked = loom::sync::Arc::new(ParkedCommands::default());
            let window = parked.window();
            let worker = {
                let parked = parked.clone();
                loom::thread::spawn(move || parked.complete(Ticket(5), 0))
            };
            parked.park(
                Ticket(5),
                SplitChain {
                    head: 1,
                    readable: Vec::new(),
                    read_error: None,
                    writable: Vec::new(),
                },
            );
            worker.join().expect("worker");
            assert!(
                parked.is_empty(),
                "the chain is still parked after its completion"
            );
            drop(window);
            assert!(parked.lock().early.is_empty());
        });
    }
}
