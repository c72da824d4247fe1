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

use std::collections::HashMap;
use std::sync::Mutex;

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;
use vrdma_spec::{Abi, VrdmaCmdRespHdr};

use super::chain::SplitChain;
use super::{GuestMemoryAtomic, Vring};
use crate::device::Ticket;

#[derive(Default)]
struct ParkedState {
    chains: HashMap<Ticket, SplitChain>,
    /// The control vring of the current connection.
    target: Option<(Vring, GuestMemoryAtomic)>,
}

/// The parked control chains of one device.
#[derive(Default)]
pub struct ParkedCommands {
    state: Mutex<ParkedState>,
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
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
    }

    /// Device reset or control ring stopped: drop the parked chains, keep the vring.
    pub fn clear(&self) {
        self.lock().chains.clear();
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
        let Some((vring, atomic)) = st.target.clone() else {
            return;
        };
        let hdr = VrdmaCmdRespHdr {
            status,
            reserved: 0,
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
        let len = match chain.scatter(&*mem, hdr.as_bytes()) {
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
}
