//! Control chains of parked commands (spec §3.1: ADVISE_MR with F_FLUSH may complete after
//! commands made available later).
//!
//! The control queue parks a chain here, by ticket, while it still holds the device lock that
//! produced the ticket, so the completion (`DeviceOutput::command_done`, also under the device
//! lock) always finds it. Completion writes the 8-byte response header, returns the chain to the
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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;
use vrdma_spec::{Abi, VrdmaCmdRespHdr};

use super::chain::SplitChain;
use super::delay::CommandDelays;
use super::{GuestMemoryAtomic, Vring};
use crate::guest::Ticket;

#[derive(Default)]
struct ParkedState {
    chains: HashMap<Ticket, SplitChain>,
    /// The control vring of the current connection.
    target: Option<(Vring, GuestMemoryAtomic)>,
    /// Counts resets and disconnects: a delayed response of an earlier generation is dropped.
    generation: u64,
}

fn lock_state(m: &Mutex<ParkedState>) -> std::sync::MutexGuard<'_, ParkedState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    fn lock(&self) -> std::sync::MutexGuard<'_, ParkedState> {
        lock_state(&self.state)
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
        std::thread::Builder::new()
            .name("vrdma-delayed-cmd".to_string())
            .spawn(move || {
                std::thread::sleep(delay);
                let st = lock_state(&state);
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
    pub fn attach(&self, vring: Vring, mem: GuestMemoryAtomic) {
        self.lock().target = Some((vring, mem));
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

    /// Keep `chain` until `complete(ticket, ..)`. Call with the device lock held.
    pub fn park(&self, ticket: Ticket, chain: SplitChain) {
        self.lock().chains.insert(ticket, chain);
    }

    /// Complete the chain parked as `ticket` with `status` (no response body). A ticket that is
    /// not parked (dropped by a reset) is ignored.
    pub fn complete(&self, ticket: Ticket, status: u32) {
        let mut st = self.lock();
        let Some(chain) = st.chains.remove(&ticket) else {
            return;
        };
        let hdr = VrdmaCmdRespHdr {
            status,
            reserved: 0,
        };
        return_chain(&st, &chain, hdr.as_bytes());
    }
}

/// Write `bytes` into `chain`'s writable part, put it in the used ring and signal the driver.
fn return_chain(st: &ParkedState, chain: &SplitChain, bytes: &[u8]) {
    let Some((vring, atomic)) = st.target.clone() else {
        return;
    };
    // Nothing moves on a ring the frontend has disabled (or not set up again): the chain is
    // dropped unanswered, as at a reset; the driver recovers it with the device reset that
    // must precede using the ring again.
    {
        let state = vring.get_mut();
        if !state.get_queue().ready() || !state.is_enabled() {
            guest_warn!(
                "controlq: parked chain {} completed while the ring is stopped; dropped",
                chain.head
            );
            return;
        }
    }
    let mem = atomic.memory();
    let len = match chain.scatter(&*mem, bytes) {
        Ok(n) => n as u32,
        Err(e) => {
            guest_warn!("controlq: chain {}: response not written: {e}", chain.head);
            0
        }
    };
    if let Err(e) = vring.add_used(chain.head, len) {
        guest_warn!("controlq: parked chain {}: add_used: {e}", chain.head);
        return;
    }
    match vring.needs_notification() {
        Ok(true) => {
            if let Err(e) = vring.signal_used_queue() {
                guest_warn!("controlq: signal: {e}");
            }
        }
        Ok(false) => {}
        Err(e) => guest_warn!("controlq: needs_notification: {e}"),
    }
}
