//! Device -> driver queues: event (§9, 16-byte `vrdma_event`), pagereq (§10, 32-byte
//! `vrdma_page_req`) and eth rx (raw Ethernet frames). The driver posts writable buffers; a
//! record goes into the next buffer, or waits in a bounded internal queue until the driver
//! posts one (the queue's kick flushes it). Interrupts are coalesced with EVENT_IDX.
//!
//! It also owns the [`ParkedCommands`] (control chains of commands completed later), attached
//! and dropped with the other queues.
//!
//! [`VirtqOutput`] outlives connections: each new connection attaches its vrings and memory,
//! a disconnect or device reset detaches them and discards what was pending.

use std::sync::{Arc, Mutex};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;
use vrdma_spec::{Abi, VrdmaEvent, VrdmaPageReq};

use super::backlog::{Backlog, Pushed, Sender};
use super::chain::{SplitChain, MAX_CHAIN_DESCS};
use super::parked::ParkedCommands;
use super::region_check::CheckedTable;
use super::{
    GuestMemoryAtomic, GuestMemoryMmap, Vring, VQ_CONTROL, VQ_ETH_RX, VQ_EVENT, VQ_PAGEREQ,
};
use crate::devlog::{self, DeviceLog};
use crate::sync::lock;

/// `sizeof(struct vrdma_event)`.
pub const EVENT_LEN: usize = VrdmaEvent::SIZE;
/// `sizeof(struct vrdma_page_req)`.
pub const PAGE_REQ_LEN: usize = VrdmaPageReq::SIZE;
/// Frames kept while the driver has no eth rx buffer (like a NIC's rx FIFO); more are dropped,
/// fairly between the frames' senders ([`Backlog`]).
pub const ETH_RX_BACKLOG: usize = 256;
/// Page requests kept while the driver has no pagereq buffer.
pub const PAGE_REQ_BACKLOG: usize = 65536;

/// What happens to a record that does not fit the buffer it was offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TooSmall {
    /// Return the buffer with len 0 and keep the record for the next buffer.
    Retry,
    /// Return the buffer with len 0 and drop the record (frames).
    Drop,
}

struct OutState {
    pending: Backlog,
    target: Option<Target>,
    dropped: u64,
}

/// Where a queue's records go: the connection's vring, its memory, and the record of which
/// memory table passed the region check (spec §16.5).
#[derive(Clone)]
pub(super) struct Target {
    pub vring: Vring,
    pub mem: GuestMemoryAtomic,
    pub checked: Arc<CheckedTable>,
}

impl Target {
    /// The current table, if its regions passed the check: every access of one delivery
    /// goes through it (never through the vring's own view of the memory), so a table the
    /// frontend swaps in meanwhile is not touched before it is checked.
    pub fn table(&self) -> Option<Arc<GuestMemoryMmap>> {
        self.checked.checked(self.mem.memory().into_inner())
    }
}

/// One device -> driver virtqueue with its backlog.
pub struct OutQueue {
    index: u16,
    name: &'static str,
    too_small: TooSmall,
    state: Mutex<OutState>,
}

impl OutQueue {
    fn new(index: u16, name: &'static str, backlog: usize, too_small: TooSmall) -> Self {
        OutQueue {
            index,
            name,
            too_small,
            state: Mutex::new(OutState {
                pending: Backlog::new(backlog),
                target: None,
                dropped: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutState> {
        lock(&self.state)
    }

    /// Queue `record` of `sender` and deliver whatever fits into posted buffers. A full
    /// backlog drops the newest record of the sender holding the most ([`Backlog`]).
    pub fn push(&self, sender: Sender, record: &[u8]) {
        let mut st = self.lock();
        let pushed = st.pending.push(sender, record);
        if pushed != Pushed::Queued {
            st.dropped += 1;
            if st.dropped.is_power_of_two() {
                guest_warn!(
                    "{}: backlog of {} full, {} record(s) dropped so far (from the sender \
                     holding the most)",
                    self.name,
                    st.pending.len(),
                    st.dropped
                );
            }
        }
        // A dropped record changed nothing a posted buffer could take: no pass over the ring
        // (it would re-arm the kick, a guest memory write, once per frame of a flood).
        if pushed != Pushed::Dropped {
            self.deliver(&mut st);
        }
    }

    /// The driver posted buffers (queue kick): deliver the backlog.
    pub fn flush(&self) {
        let mut st = self.lock();
        self.deliver(&mut st);
    }

    /// Records waiting for a buffer.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Records dropped because the backlog was full.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    fn attach(&self, target: Target) {
        let mut st = self.lock();
        st.target = Some(target);
    }

    fn detach(&self) {
        let mut st = self.lock();
        st.pending.clear();
        st.target = None;
    }

    fn deliver(&self, st: &mut OutState) {
        if st.pending.is_empty() {
            return;
        }
        let Some(target) = st.target.clone() else {
            return;
        };
        let Some(mem) = target.table() else {
            return;
        };
        let mut state = target.vring.get_mut();
        if !state.get_queue().ready() || !state.is_enabled() {
            return;
        }
        let mut used = 0usize;
        // Set once `enable_notification` reported buffers: if the next pass then pops none,
        // the avail ring is inconsistent (its index runs more than the queue size ahead, so
        // nothing can be popped while "more" stays true). The records wait in the backlog
        // instead of this thread spinning on the ring (spec §16).
        let mut rearmed = false;
        loop {
            let mut popped = false;
            while !st.pending.is_empty() {
                let Some(chain) = state.get_queue_mut().pop_descriptor_chain(&*mem) else {
                    break;
                };
                popped = true;
                let split = SplitChain::gather(chain, 0, MAX_CHAIN_DESCS);
                let len = self.fill(st, &split, &mem);
                if let Err(e) = state.get_queue_mut().add_used(&*mem, split.head, len) {
                    guest_warn!("{}: add_used: {e}", self.name);
                    break;
                }
                used += 1;
            }
            if st.pending.is_empty() {
                break;
            }
            if rearmed && !popped {
                guest_warn!(
                    "{}: avail ring announces buffers that cannot be popped; {} record(s) wait",
                    self.name,
                    st.pending.len()
                );
                break;
            }
            // Records left and no buffer: re-arm the kick (EVENT_IDX: avail_event =
            // next_avail) and look once more, so a buffer posted meanwhile is not missed.
            match state.get_queue_mut().enable_notification(&*mem) {
                Ok(true) => {
                    rearmed = true;
                    continue;
                }
                Ok(false) => break,
                Err(e) => {
                    guest_warn!("{}: enable_notification: {e}", self.name);
                    break;
                }
            }
        }
        if used > 0 {
            match state.get_queue_mut().needs_notification(&*mem) {
                Ok(true) => {
                    if let Err(e) = state.signal_used_queue() {
                        guest_warn!("{}: signal: {e}", self.name);
                    }
                }
                Ok(false) => {}
                Err(e) => guest_warn!("{}: needs_notification: {e}", self.name),
            }
        }
    }

    /// Puts the oldest pending record into the buffer `split`; returns the used length (0 when
    /// the buffer is too small or the copy failed: the buffer goes back empty).
    fn fill(&self, st: &mut OutState, split: &SplitChain, mem: &GuestMemoryMmap) -> u32 {
        let record_len = st.pending.front_len().unwrap_or(0);
        if split.writable_len() < record_len as u64 {
            guest_debug!(
                "{}: buffer {} of {} bytes too small for {record_len}",
                self.name,
                split.head,
                split.writable_len()
            );
            if self.too_small == TooSmall::Drop {
                st.pending.pop_front();
                st.dropped += 1;
            }
            0
        } else {
            let rec = st.pending.pop_front().unwrap_or_default();
            match split.scatter(mem, &rec) {
                Ok(n) => n as u32,
                Err(e) => {
                    guest_warn!("{}: buffer {}: {e}; record dropped", self.name, split.head);
                    st.dropped += 1;
                    0
                }
            }
        }
    }
}

/// The device's outputs over the event, pagereq and eth rx virtqueues. Implements the device's
/// `DeviceOutput` contract (events, page requests, eth rx frames) and is shared with the engine.
pub struct VirtqOutput {
    events: OutQueue,
    page_reqs: OutQueue,
    eth_rx: OutQueue,
    parked: ParkedCommands,
    /// The device's label and rate limit for guest-triggered warnings (spec §16.5).
    log: Arc<DeviceLog>,
}

impl VirtqOutput {
    /// `event_backlog` bounds queued events (DESIGN.md: by the number of objects).
    pub fn new(event_backlog: usize) -> Self {
        Self::with_label(event_backlog, "vrdma")
    }

    /// [`VirtqOutput::new`] for the device called `label` in the log.
    pub fn with_label(event_backlog: usize, label: &str) -> Self {
        VirtqOutput {
            log: DeviceLog::new(label),
            events: OutQueue::new(VQ_EVENT, "eventq", event_backlog.max(1), TooSmall::Retry),
            page_reqs: OutQueue::new(VQ_PAGEREQ, "pagereqq", PAGE_REQ_BACKLOG, TooSmall::Retry),
            eth_rx: OutQueue::new(VQ_ETH_RX, "eth rxq", ETH_RX_BACKLOG, TooSmall::Drop),
            parked: ParkedCommands::default(),
        }
    }

    /// The device's label and guest-warning limit.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// Post a `vrdma_event` (§9).
    pub fn push_event(&self, ev: &VrdmaEvent) {
        let _device = devlog::enter(&self.log);
        self.events.push(Sender::Shared, ev.as_bytes());
    }

    /// Post a `vrdma_page_req` (§10).
    pub fn push_page_req(&self, req: &VrdmaPageReq) {
        let _device = devlog::enter(&self.log);
        self.page_reqs.push(Sender::Shared, req.as_bytes());
    }

    /// Post a raw Ethernet frame to the guest's netdev. Its sender, for the backlog's fair
    /// share: `port`, the fabric port it came from; without a fabric its source MAC (a frame
    /// too short to have one counts as no sender).
    pub fn push_eth_rx(&self, frame: &[u8], port: Option<usize>) {
        let _device = devlog::enter(&self.log);
        let sender = match port {
            Some(p) => Sender::Port(p),
            None => frame
                .get(6..12)
                .and_then(|m| <[u8; 6]>::try_from(m).ok())
                .map_or(Sender::Shared, Sender::Mac),
        };
        self.eth_rx.push(sender, frame);
    }

    /// Control chains of parked commands.
    pub fn parked(&self) -> &ParkedCommands {
        &self.parked
    }

    /// The queue for a virtqueue index, if it is an output queue.
    pub fn queue(&self, index: u16) -> Option<&OutQueue> {
        match index {
            VQ_EVENT => Some(&self.events),
            VQ_PAGEREQ => Some(&self.page_reqs),
            VQ_ETH_RX => Some(&self.eth_rx),
            _ => None,
        }
    }

    /// A connection's vrings became available (`vrings` indexed by queue number).
    pub fn attach(&self, vrings: &[Vring], mem: &GuestMemoryAtomic) {
        self.attach_checked(vrings, mem, &Arc::default());
    }

    /// [`VirtqOutput::attach`] sharing the connection's record of checked tables (spec
    /// §16.5), so a table is checked once for the rings and the outputs.
    pub fn attach_checked(
        &self,
        vrings: &[Vring],
        mem: &GuestMemoryAtomic,
        checked: &Arc<CheckedTable>,
    ) {
        let target = |v: &Vring| Target {
            vring: v.clone(),
            mem: mem.clone(),
            checked: Arc::clone(checked),
        };
        for q in [&self.events, &self.page_reqs, &self.eth_rx] {
            if let Some(v) = vrings.get(usize::from(q.index)) {
                q.attach(target(v));
            }
        }
        if let Some(v) = vrings.get(usize::from(VQ_CONTROL)) {
            self.parked.attach(target(v));
        }
    }

    /// Forget the connection's vrings, every pending record and parked chain (disconnect or
    /// reset).
    pub fn detach(&self) {
        for q in [&self.events, &self.page_reqs, &self.eth_rx] {
            q.detach();
        }
        self.parked.detach();
    }

    /// Discard pending records and parked chains but keep the vrings (device reset while
    /// connected).
    pub fn clear_pending(&self) {
        for q in [&self.events, &self.page_reqs, &self.eth_rx] {
            q.lock().pending.clear();
        }
        self.parked.clear();
    }
}
