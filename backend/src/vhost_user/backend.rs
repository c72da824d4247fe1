//! [`VhostUserRdma`]: the `VhostUserBackend` for one frontend connection.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use log::{info, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::VhostUserBackend;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::chain::MAX_CHAIN_DESCS;
use super::controlq;
use super::inputq::{
    self, drain_queue, drain_queue_charged, ChainLimits, ETH_OVERHEAD, MAX_DOORBELL_BYTES,
};
use super::{
    DoorbellSink, FrameSink, GuestMemoryAtomic, RdmaDevice, VhostUserRdmaError, VirtqOutput, Vring,
    CONFIG_SIZE, MAX_QUEUE_SIZE, NUM_QUEUES, VIRTIO_RDMA_F_ETH, VIRTIO_RDMA_F_ODP,
    VIRTIO_RDMA_F_ODP_IMPLICIT, VQ_CONTROL, VQ_DOORBELL, VQ_ETH_RX, VQ_ETH_TX, VQ_EVENT,
    VQ_PAGEREQ,
};

/// The vrdma device as a vhost-user backend, for one connection. Created per connection by
/// the daemon loop; the device, its outputs and the sinks outlive it.
pub struct VhostUserRdma<D: RdmaDevice> {
    device: Arc<Mutex<D>>,
    out: Arc<VirtqOutput>,
    doorbells: Arc<dyn DoorbellSink>,
    eth_tx: Arc<dyn FrameSink>,
    config: [u8; CONFIG_SIZE],
    features: u64,
    max_frame: usize,
    mem: GuestMemoryAtomic,
    event_idx: AtomicBool,
    attached: AtomicBool,
    /// The device's host-memory budget, charged for control chains being gathered (§16).
    budget: Option<crate::budget::Budget>,
}

impl<D: RdmaDevice> VhostUserRdma<D> {
    /// `config` is the `vrdma_config` served by GET_CONFIG; `device_features` are the
    /// `VIRTIO_RDMA_F_*` masks offered besides ETH (the ODP bits when the device has ODP);
    /// `mtu` bounds eth tx frames; `mem` must be the atomic given to the `VhostUserDaemon`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: Arc<Mutex<D>>,
        out: Arc<VirtqOutput>,
        doorbells: Arc<dyn DoorbellSink>,
        eth_tx: Arc<dyn FrameSink>,
        config: [u8; CONFIG_SIZE],
        device_features: u64,
        mtu: u16,
        mem: GuestMemoryAtomic,
    ) -> Self {
        let features = 1u64 << VIRTIO_F_VERSION_1
            | 1u64 << VIRTIO_RING_F_INDIRECT_DESC
            | 1u64 << VIRTIO_RING_F_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VIRTIO_RDMA_F_ETH
            | (device_features & (VIRTIO_RDMA_F_ODP | VIRTIO_RDMA_F_ODP_IMPLICIT));
        let budget = device.lock().unwrap_or_else(|p| p.into_inner()).budget();
        VhostUserRdma {
            device,
            out,
            doorbells,
            eth_tx,
            config,
            features,
            max_frame: usize::from(mtu) + ETH_OVERHEAD,
            mem,
            event_idx: AtomicBool::new(false),
            attached: AtomicBool::new(false),
            budget,
        }
    }

    fn lock_device(&self) -> std::sync::MutexGuard<'_, D> {
        self.device.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reset the device model and drop pending device -> driver records and parked control
    /// chains (never completed: the ring is being reset too). Called on
    /// RESET_DEVICE / RESET_OWNER, when the frontend stops the control queue (QEMU does on a
    /// virtio reset of the guest) and when the connection ends.
    pub fn reset_state(&self, why: &str) {
        info!("device reset ({why})");
        self.lock_device().reset();
        self.out.clear_pending();
    }

    fn dispatch(&self, index: u16, vrings: &[Vring]) -> Result<(), VhostUserRdmaError> {
        let Some(vring) = vrings.get(usize::from(index)) else {
            return Err(VhostUserRdmaError::UnknownEvent(index));
        };
        let event_idx = self.event_idx.load(Ordering::Acquire);
        match index {
            VQ_CONTROL => {
                let device = &*self.device;
                let mut ran = false;
                let budget = self.budget.as_ref();
                let limits = controlq::LIMITS;
                let r =
                    drain_queue_charged(index, vring, &self.mem, event_idx, limits, budget, |c| {
                        ran = true;
                        let mem = vm_memory::GuestAddressSpace::memory(&self.mem);
                        controlq::run_command(device, &*mem, c, self.out.parked())
                    });
                if ran {
                    // Commands may have unblocked QPs (ODP_PAGE_RESP, MODIFY_QP): wake the engine.
                    self.doorbells.kick();
                }
                r
            }
            VQ_DOORBELL => drain_queue(
                index,
                vring,
                &self.mem,
                event_idx,
                ChainLimits {
                    max_readable: MAX_DOORBELL_BYTES,
                    max_descs: MAX_CHAIN_DESCS,
                },
                |c| Some(inputq::doorbells(c, &*self.doorbells)),
            ),
            VQ_ETH_TX => {
                let limits = ChainLimits {
                    max_readable: self.max_frame,
                    max_descs: MAX_CHAIN_DESCS,
                };
                drain_queue(index, vring, &self.mem, event_idx, limits, |c| {
                    Some(inputq::eth_tx(c, &*self.eth_tx, self.max_frame))
                })
            }
            VQ_EVENT | VQ_PAGEREQ | VQ_ETH_RX => {
                if let Some(q) = self.out.queue(index) {
                    q.flush();
                }
                Ok(())
            }
            _ => Err(VhostUserRdmaError::UnknownEvent(index)),
        }
    }
}

impl<D: RdmaDevice> VhostUserBackend for VhostUserRdma<D> {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn acked_features(&self, features: u64) {
        info!(
            "virtio features: offered {:#x}, acked {features:#x}",
            self.features
        );
    }

    /// Exactly the table of spec §2.5: QEMU uses every feature both sides offer, so nothing the
    /// vhost crate does not implement (STATUS) and nothing a restart could not honour
    /// (INFLIGHT_SHMFD: a restarted daemon asks for a reset instead, §2.4).
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn reset_device(&self) {
        self.reset_state("frontend RESET_DEVICE");
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let start = offset as usize;
        match start.checked_add(size as usize) {
            Some(end) if end <= CONFIG_SIZE && size > 0 => self.config[start..end].to_vec(),
            _ => {
                warn!(
                    "GET_CONFIG offset {offset} size {size} outside the {CONFIG_SIZE}-byte config"
                );
                Vec::new()
            }
        }
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        // The config space is read-only (§2.2): writes are ignored. Not an error, because the
        // vhost crate ends the whole connection when a handler fails.
        warn!(
            "SET_CONFIG offset {offset} size {} ignored: config is read-only",
            buf.len()
        );
        Ok(())
    }

    fn update_memory(&self, mem: GuestMemoryAtomic) -> io::Result<()> {
        {
            use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};
            let table = mem.memory();
            info!("guest memory table: {} region(s)", table.num_regions());
            for r in table.iter() {
                info!(
                    "  gpa {:#x}..{:#x} ({} MiB)",
                    r.start_addr().0,
                    r.start_addr().0 + r.len(),
                    r.len() >> 20
                );
            }
        }
        self.lock_device().set_guest_memory(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
            .map_err(|e| warn!("cannot create exit event: {e}"))
            .ok()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        if queue_index == u32::from(VQ_CONTROL) {
            // QEMU stops every ring on a virtio reset / driver unload: the next driver instance
            // must find a power-on device.
            self.reset_state("control queue stopped");
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            warn!("queue {device_event}: unexpected epoll events {evset:?}");
            return Ok(());
        }
        if !self.attached.swap(true, Ordering::AcqRel) {
            self.out.attach(vrings, &self.mem);
        }
        // A failing queue is logged, not propagated: an error here would end the vring worker
        // thread and silence every queue of the device.
        if let Err(e) = self.dispatch(device_event, vrings) {
            warn!("{e}");
        }
        Ok(())
    }
}
