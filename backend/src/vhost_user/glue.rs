//! Thin glue between the vhost-user plumbing's traits and the other modules: the device model
//! ([`Device`]), the engine's doorbell channel ([`EngineSender`]) and the uplink.

use std::io;
use std::sync::Arc;

use vrdma_spec::{VrdmaDoorbell, VrdmaEvent, VrdmaPageReq};

use super::{DoorbellSink, FrameSink, GuestMemoryAtomic, RdmaDevice, VirtqOutput};
use crate::device::Device;
use crate::guest::{CmdOutcome, DeviceOutput, Ticket};
use crate::transport::engine::EngineSender;
use crate::uplink::{Uplink, UplinkError};

impl RdmaDevice for Device {
    fn handle_command(&mut self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> CmdOutcome {
        Device::handle_command(self, opcode, req, resp)
    }
    fn handle_shared(&self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> Option<u32> {
        Device::handle_shared(self, opcode, req, resp)
    }
    fn handle_shared_parking(
        &self,
        opcode: u16,
        req: &[u8],
        resp: &mut Vec<u8>,
    ) -> Option<CmdOutcome> {
        Device::handle_shared_parking(self, opcode, req, resp)
    }

    fn reset(&mut self) {
        Device::reset(self);
    }

    fn set_guest_memory(&mut self, mem: GuestMemoryAtomic) {
        Device::set_guest_memory(self, &mem);
    }

    fn budget(&self) -> Option<crate::budget::Budget> {
        Some(self.budget.clone())
    }

    fn suspend(&mut self) {
        self.suspended = true;
        // Spec §17.1: a suspended device's memory is not read, by its peers' engines neither
        // (spec §16.2 rule 6).
        self.mrs.get_mut().fence().fence_device();
    }

    fn resume(&mut self) {
        if std::mem::take(&mut self.suspended) {
            self.announce();
        }
    }

    fn suspended(&self) -> bool {
        self.suspended
    }

    fn save_state(&mut self) -> Result<Vec<u8>, String> {
        crate::device::snapshot::save(self).map_err(|e| e.to_string())
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), String> {
        let r = crate::device::snapshot::restore(self, state).map_err(|e| e.to_string());
        self.suspended = true;
        self.mrs.get_mut().fence().fence_device();
        r
    }
}

impl DeviceOutput for VirtqOutput {
    fn event(&self, ev: VrdmaEvent) {
        self.push_event(&ev);
    }

    fn page_request(&self, req: VrdmaPageReq) {
        self.push_page_req(&req);
    }

    fn eth_rx(&self, frame: &[u8], port: Option<usize>) {
        self.push_eth_rx(frame, port);
    }

    fn command_done(&self, ticket: Ticket, status: u32) {
        let _device = crate::devlog::enter(self.log());
        self.parked().complete(ticket, status);
    }

    fn device_log(&self) -> Option<Arc<crate::devlog::DeviceLog>> {
        Some(Arc::clone(self.log()))
    }
}

impl DoorbellSink for EngineSender {
    fn doorbell(&self, db: VrdmaDoorbell) {
        EngineSender::push(self, db);
    }

    fn doorbells(&self, dbs: &[VrdmaDoorbell]) {
        EngineSender::doorbells(self, dbs);
    }

    fn kick(&self) {
        EngineSender::kick(self);
    }

    fn fence(&self) {
        if !EngineSender::fence(self, DOORBELL_FENCE_LIMIT) {
            // Rate-limited: a guest that keeps its engine busy must not flood the log.
            guest_warn!(
                "controlq: the engine did not run the pending doorbells within \
                 {DOORBELL_FENCE_LIMIT:?}; the command runs without them"
            );
        }
    }
}

/// How long a command waits for the doorbells before it (spec §8) at most: a stopped or
/// wedged engine must not stall the control queue.
pub const DOORBELL_FENCE_LIMIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The guest's eth tx frames go straight to the uplink (non-blocking; a busy uplink drops).
pub struct UplinkTx(pub Arc<dyn Uplink>);

impl FrameSink for UplinkTx {
    fn send_frame(&self, frame: &[u8]) -> io::Result<()> {
        self.0.send(frame).map_err(|e| match e {
            UplinkError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
            e => io::Error::other(e),
        })
    }
}

/// No uplink configured: nothing is received, sent frames are dropped.
#[derive(Debug, Default)]
pub struct NoUplink;

impl Uplink for NoUplink {
    fn send(&self, _frame: &[u8]) -> Result<(), UplinkError> {
        Ok(())
    }

    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Ok(None)
    }

    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        -1
    }
}
