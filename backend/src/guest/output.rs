//! What the device sends towards the guest outside immediate command responses: events (event
//! virtqueue), ODP page requests (pagereq virtqueue), Ethernet frames (eth rx virtqueue) and the
//! late completion of parked commands (control virtqueue, see `outcome.rs`). Implemented by the
//! vhost-user layer; [`RecordingOutput`] records everything for tests.

use std::sync::{Arc, Mutex};

use crate::devlog::DeviceLog;
use crate::sync::lock;

use vrdma_spec::{VrdmaEvent, VrdmaPageReq};

use super::outcome::Ticket;

/// Sink for device → driver messages. Implementations must not block on the guest: queue
/// internally when no buffer is available (DESIGN.md "CQ events").
pub trait DeviceOutput: Send + Sync {
    fn event(&self, ev: VrdmaEvent);
    fn page_request(&self, req: VrdmaPageReq);
    /// A frame for the guest's netdev; `port`: the fabric port that sent it (None: the
    /// device's own uplink, or no fabric).
    fn eth_rx(&self, frame: &[u8], port: Option<usize>);
    /// A parked command (`CmdOutcome::Parked(ticket)`) completed with `status` (`VRDMA_STATUS_*`,
    /// no response body). Called under the device lock, at most once per ticket.
    fn command_done(&self, ticket: Ticket, status: u32);
    /// The device's label and log limit (spec §16.5 "Logs"): the engine's workers enter it
    /// when they start, so what they log names this device. `None`: unlabelled, under the
    /// limit shared by all unlabelled lines.
    fn device_log(&self) -> Option<Arc<DeviceLog>> {
        None
    }
}

/// Discards everything (a device without a guest attached).
#[derive(Debug, Default)]
pub struct NullOutput;

impl DeviceOutput for NullOutput {
    fn event(&self, _ev: VrdmaEvent) {}
    fn page_request(&self, _req: VrdmaPageReq) {}
    fn eth_rx(&self, _frame: &[u8], _port: Option<usize>) {}
    fn command_done(&self, _ticket: Ticket, _status: u32) {}
}

/// Records every output (tests).
#[derive(Debug, Default)]
pub struct RecordingOutput {
    pub events: Mutex<Vec<VrdmaEvent>>,
    pub page_requests: Mutex<Vec<VrdmaPageReq>>,
    pub frames: Mutex<Vec<Vec<u8>>>,
    pub done: Mutex<Vec<(Ticket, u32)>>,
}

impl RecordingOutput {
    pub fn new() -> Self {
        Self::default()
    }
    /// Take the recorded events.
    pub fn take_events(&self) -> Vec<VrdmaEvent> {
        std::mem::take(&mut *lock(&self.events))
    }
    /// Take the recorded page requests.
    pub fn take_page_requests(&self) -> Vec<VrdmaPageReq> {
        std::mem::take(&mut *lock(&self.page_requests))
    }
    /// Take the recorded completions of parked commands.
    pub fn take_done(&self) -> Vec<(Ticket, u32)> {
        std::mem::take(&mut *lock(&self.done))
    }
    /// Take the recorded frames.
    pub fn take_frames(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *lock(&self.frames))
    }
}

impl DeviceOutput for RecordingOutput {
    fn event(&self, ev: VrdmaEvent) {
        lock(&self.events).push(ev);
    }
    fn page_request(&self, req: VrdmaPageReq) {
        lock(&self.page_requests).push(req);
    }
    fn eth_rx(&self, frame: &[u8], _port: Option<usize>) {
        lock(&self.frames).push(frame.to_vec());
    }
    fn command_done(&self, ticket: Ticket, status: u32) {
        lock(&self.done).push((ticket, status));
    }
}

/// Build an event record.
pub fn event(ty: u32, id: u32, info: u32) -> VrdmaEvent {
    VrdmaEvent {
        type_: ty,
        id,
        info,
        reserved: 0,
    }
}
