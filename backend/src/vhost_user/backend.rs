//! [`VhostUserRdma`]: the `VhostUserBackend` for one frontend connection.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use log::{error, info, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::QueueT;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use super::chain::MAX_CHAIN_DESCS;
use super::controlq;
use super::daemon::ServeParts;
use super::exit_events::ExitEvents;
use super::inputq::{
    self, drain_queue, drain_queue_charged, ChainLimits, ETH_OVERHEAD, MAX_DOORBELL_BYTES,
};
use super::region_check;
use super::{
    DoorbellSink, FrameSink, GuestMemoryAtomic, RdmaDevice, VhostUserRdmaError, VirtqOutput, Vring,
    CONFIG_SIZE, MAX_QUEUE_SIZE, NUM_QUEUES, VIRTIO_RDMA_F_ETH, VIRTIO_RDMA_F_ODP,
    VIRTIO_RDMA_F_ODP_IMPLICIT, VQ_CONTROL, VQ_DOORBELL, VQ_ETH_RX, VQ_ETH_TX, VQ_EVENT,
    VQ_PAGEREQ,
};
use crate::handoff::HandoffLock;
use crate::sync::{lock, unpoisoned};

/// The vrdma device as a vhost-user backend, for one connection. Created per connection by
/// the daemon loop; the device, its outputs and the sinks outlive it.
pub struct VhostUserRdma<D: RdmaDevice> {
    device: Arc<HandoffLock<D>>,
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
    /// The frontend acked VHOST_F_LOG_ALL: a migration is running, stopping the control queue
    /// suspends the device instead of resetting it (spec §17.1).
    logging: AtomicBool,
    /// The state transfer started by SET_DEVICE_STATE_FD, finished by CHECK_DEVICE_STATE.
    transfer: Mutex<Option<Transfer>>,
    /// The last memory table whose regions passed [`region_check`] (spec §16.5).
    checked: Arc<region_check::CheckedTable>,
    /// The worker threads' exit events, closed with this connection's backend.
    exit_events: ExitEvents,
}

/// A device state transfer in progress (spec §17.3): a thread moves the bytes through the
/// frontend's pipe, because SET_DEVICE_STATE_FD must not block.
enum Transfer {
    /// Writing the saved state; `Err` if the device could not be saved.
    Save(Result<JoinHandle<io::Result<()>>, String>),
    /// Reading the state to load: the bytes, with their charge on the device's budget.
    Load(JoinHandle<io::Result<(Vec<u8>, crate::budget::Charge)>>),
}

impl<D: RdmaDevice> VhostUserRdma<D> {
    /// Did a dirty-log store fault in any region of the current table (guest/log_guard.rs)?
    fn dirty_log_lost(&self) -> bool {
        use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};
        self.mem
            .memory()
            .iter()
            .any(|region| region.bitmap().log_lost())
    }

    /// Logging turned off, the migration is over: what its logs missed does not count
    /// against the next one (`DirtyBitmap::end_migration`).
    fn end_migration_log(&self) {
        use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};
        for region in self.mem.memory().iter() {
            region.bitmap().end_migration();
        }
    }

    /// The backend of one connection, from the device's `parts`: `config` is the
    /// `vrdma_config` served by GET_CONFIG; `device_features` are the `VIRTIO_RDMA_F_*` masks
    /// offered besides ETH (the ODP bits when the device has ODP); `mtu` bounds eth tx frames.
    /// `mem` must be the atomic given to the `VhostUserDaemon`.
    pub fn new(parts: &ServeParts<D>, mem: GuestMemoryAtomic) -> Self {
        let device = Arc::clone(&parts.device);
        let (config, device_features, mtu) = (parts.config, parts.device_features, parts.mtu);
        let features = 1u64 << VIRTIO_F_VERSION_1
            | 1u64 << VIRTIO_RING_F_INDIRECT_DESC
            | 1u64 << VIRTIO_RING_F_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Every device write to guest memory is logged (guest/memory.rs, spec §17.1).
            | VhostUserVirtioFeatures::LOG_ALL.bits()
            | VIRTIO_RDMA_F_ETH
            | (device_features & (VIRTIO_RDMA_F_ODP | VIRTIO_RDMA_F_ODP_IMPLICIT));
        let budget = device.lock().budget();
        VhostUserRdma {
            device,
            out: Arc::clone(&parts.out),
            doorbells: Arc::clone(&parts.doorbells),
            eth_tx: Arc::clone(&parts.eth_tx),
            config,
            features,
            max_frame: usize::from(mtu) + ETH_OVERHEAD,
            mem,
            event_idx: AtomicBool::new(false),
            attached: AtomicBool::new(false),
            budget,
            logging: AtomicBool::new(false),
            transfer: Mutex::new(None),
            checked: Default::default(),
            exit_events: ExitEvents::default(),
        }
    }

    /// Is the table the rings see now one whose regions passed [`region_check`]? The
    /// vhost-user-backend crate installs a new table in the rings' memory before it calls
    /// `update_memory`: a queue event that arrives in between checks the table itself, so
    /// the rings never walk a region that could raise SIGBUS (spec §16.5). The caller holds
    /// the table's swap lock, so the answer holds until it lets go.
    fn rings_table_checked(&self) -> bool {
        let current = vm_memory::GuestAddressSpace::memory(&self.mem).into_inner();
        // `None`: `update_memory` logs the refusal and ends the connection.
        self.checked.checked(current).is_some()
    }

    fn lock_device(&self) -> crate::sync::modeled::RwLockWriteGuard<'_, D> {
        self.device.lock()
    }

    /// Reset the device model and drop pending device -> driver records and parked control
    /// chains (never completed: the ring is being reset too). Called on
    /// RESET_DEVICE / RESET_OWNER, when the frontend stops the control queue (QEMU does on a
    /// virtio reset of the guest) and when the connection ends.
    pub fn reset_state(&self, why: &str) {
        info!("{}: device reset ({why})", self.out.log().label());
        self.lock_device().reset();
        self.out.clear_pending();
    }

    /// Hand every available doorbell buffer's records to the engine.
    fn drain_doorbells(&self, vring: &Vring, event_idx: bool) -> Result<(), VhostUserRdmaError> {
        let limits = ChainLimits {
            max_readable: MAX_DOORBELL_BYTES,
            max_descs: MAX_CHAIN_DESCS,
        };
        drain_queue(VQ_DOORBELL, vring, &self.mem, event_idx, limits, |c| {
            Some(inputq::doorbells(c, &*self.doorbells))
        })
    }

    fn dispatch(&self, index: u16, vrings: &[Vring]) -> Result<(), VhostUserRdmaError> {
        let Some(vring) = vrings.get(usize::from(index)) else {
            return Err(VhostUserRdmaError::UnknownEvent(index));
        };
        let event_idx = self.event_idx.load(Ordering::Acquire);
        match index {
            VQ_CONTROL => {
                // Doorbells the driver rang before these commands are queued first, whatever
                // order this thread's epoll reports the two kicks in (spec §8).
                let started = |v: &&Vring| v.get_ref().get_queue().ready();
                if let Some(db) = vrings.get(usize::from(VQ_DOORBELL)).filter(started) {
                    if let Err(e) = self.drain_doorbells(db, event_idx) {
                        warn!("{e}");
                    }
                }
                let device = &*self.device;
                let mut ran = false;
                let budget = self.budget.as_ref();
                let limits = controlq::LIMITS;
                let r =
                    drain_queue_charged(index, vring, &self.mem, event_idx, limits, budget, |c| {
                        ran = true;
                        if controlq::ordered_after_doorbells(&c.readable) {
                            self.doorbells.fence();
                        }
                        let mem = vm_memory::GuestAddressSpace::memory(&self.mem);
                        controlq::run_command(device, &*mem, c, self.out.parked())
                    });
                if ran {
                    // Commands may have unblocked QPs (ODP_PAGE_RESP, MODIFY_QP): wake the engine.
                    self.doorbells.kick();
                }
                r
            }
            VQ_DOORBELL => self.drain_doorbells(vring, event_idx),
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

impl Transfer {
    /// Is the transfer's thread still moving bytes?
    fn running(&self) -> bool {
        match self {
            Transfer::Save(Ok(t)) => !t.is_finished(),
            Transfer::Save(Err(_)) => false,
            Transfer::Load(t) => !t.is_finished(),
        }
    }
}

/// The result of a state transfer thread (a panic there is an error, not ours).
fn joined<T>(r: std::thread::Result<io::Result<T>>) -> io::Result<T> {
    r.unwrap_or_else(|_| Err(io::Error::other("state transfer thread panicked")))
}

/// Read a whole state stream, at most `MAX_STATE_BYTES` (the frontend's data is untrusted),
/// giving up when the frontend stalls (spec §16.5), its buffer charged to `budget` (the
/// device's, within the daemon's: spec §16.1) as it grows: a stream the budget has no room for
/// fails the load. The charge is held until the state is loaded.
fn read_state(
    file: &mut File,
    budget: Option<crate::budget::Budget>,
) -> io::Result<(Vec<u8>, crate::budget::Charge)> {
    let max = crate::device::snapshot::MAX_STATE_BYTES;
    let mut charge = crate::budget::Charge::default();
    let bytes = super::state_pipe::read_state(
        file,
        max,
        super::state_pipe::STATE_IDLE_LIMIT,
        &mut |cap| {
            let Some(b) = &budget else {
                return Ok(());
            };
            let more = (cap as u64).saturating_sub(charge.bytes());
            charge.try_grow(b, more).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!("device state stream: {e} (spec §16.1)"),
                )
            })
        },
    )?;
    Ok((bytes, charge))
}

impl<D: RdmaDevice> VhostUserBackend for VhostUserRdma<D> {
    type Bitmap = crate::guest::DirtyBitmap;
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
        let log = features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        if self.logging.swap(log, Ordering::AcqRel) != log {
            info!("dirty page logging {}", if log { "on" } else { "off" });
            if !log {
                self.end_migration_log();
            }
        }
    }

    /// Exactly the table of spec §2.5: QEMU uses every feature both sides offer, so nothing the
    /// vhost crate does not implement (STATUS) and nothing a restart could not honour
    /// (INFLIGHT_SHMFD: a restarted daemon asks for a reset instead, §2.4). LOG_SHMFD and
    /// DEVICE_STATE are migration (§17).
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE
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
                // The frontend can send this at will: labelled and rate-limited (spec §16.5).
                let _device = crate::devlog::enter(self.out.log());
                guest_warn!(
                    "GET_CONFIG offset {offset} size {size} outside the {CONFIG_SIZE}-byte config"
                );
                Vec::new()
            }
        }
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        // The config space is read-only (§2.2): writes are ignored. Not an error, because the
        // vhost crate ends the whole connection when a handler fails.
        let _device = crate::devlog::enter(self.out.log());
        guest_warn!(
            "SET_CONFIG offset {offset} size {} ignored: config is read-only",
            buf.len()
        );
        Ok(())
    }

    fn update_memory(&self, mem: GuestMemoryAtomic) -> io::Result<()> {
        {
            use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};
            let table = mem.memory();
            if let Err(refused) = region_check::check_table(&table) {
                // Spec §16.5: the rings lose the table at once, the device never gets it and
                // the error ends this connection (the device is then reset).
                error!(
                    "{}: vhost-user frontend refused: {refused}",
                    self.out.log().label()
                );
                drop(table);
                unpoisoned(mem.lock()).replace(super::GuestMemoryMmap::new());
                return Err(io::Error::new(io::ErrorKind::InvalidInput, refused));
            }
            self.checked.remember(table.clone().into_inner());
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
        let mut dev = self.lock_device();
        dev.set_guest_memory(mem);
        // QEMU starts a device with SET_MEM_TABLE (vhost_dev_start): after a failed migration
        // on the source, or on the destination once the state is loaded (spec §17.4).
        if dev.suspended() {
            info!("device resumed");
            dev.resume();
            drop(dev);
            self.doorbells.kick();
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.exit_events.create()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        if queue_index == u32::from(VQ_CONTROL) {
            if self.logging.load(Ordering::Acquire) {
                // A migrating VM stops: keep every object for SET_DEVICE_STATE_FD (spec §17.1).
                info!("device suspended (control queue stopped while logging)");
                self.lock_device().suspend();
            } else {
                // QEMU stops every ring on a virtio reset / driver unload: the next driver
                // instance must find a power-on device.
                self.reset_state("control queue stopped");
            }
        }
        Ok(())
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        mut file: File,
    ) -> io::Result<Option<File>> {
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "only the STOPPED phase is supported",
            ));
        }
        // One transfer at a time (QEMU sends CHECK_DEVICE_STATE after each): a frontend that
        // keeps starting transfers must not pile up threads, pipes and state buffers (§16.5).
        if lock(&self.transfer).as_ref().is_some_and(Transfer::running) {
            return Err(io::Error::other(
                "a device state transfer is already in progress",
            ));
        }
        let job = match direction {
            VhostTransferStateDirection::SAVE => {
                let saved = {
                    let mut dev = self.lock_device();
                    if !dev.suspended() {
                        Err("the device is not stopped".to_string())
                    } else if self.dirty_log_lost() {
                        // Checked with the device stopped (it writes no guest memory, so no
                        // mark can fault after this): the frontend's log file does not cover
                        // the log (spec §16.5), pages this device wrote may be missing from
                        // it, so the destination must not start.
                        let why = "the dirty log missed pages: the frontend's log file is \
                                   shorter than the log";
                        warn!(
                            "{}: cannot save the device state: {why}",
                            self.out.log().label()
                        );
                        Err(why.to_string())
                    } else {
                        dev.save_state()
                    }
                };
                Transfer::Save(match saved {
                    Ok(bytes) => {
                        info!("saving device state: {} bytes", bytes.len());
                        std::thread::Builder::new()
                            .name("vrdma-state-save".into())
                            .spawn(move || {
                                super::state_pipe::write_state(
                                    &mut file,
                                    &bytes,
                                    super::state_pipe::STATE_IDLE_LIMIT,
                                )
                            })
                            .map_err(|e| e.to_string())
                    }
                    // Nothing is written: the frontend reads an empty stream and
                    // CHECK_DEVICE_STATE reports the error (the migration fails cleanly).
                    Err(e) => {
                        warn!(
                            "{}: cannot save the device state: {e}",
                            self.out.log().label()
                        );
                        Err(e)
                    }
                })
            }
            VhostTransferStateDirection::LOAD => {
                let budget = self.lock_device().budget();
                Transfer::Load(
                    std::thread::Builder::new()
                        .name("vrdma-state-load".into())
                        .spawn(move || read_state(&mut file, budget))?,
                )
            }
        };
        *lock(&self.transfer) = Some(job);
        Ok(None)
    }

    fn check_device_state(&self) -> io::Result<()> {
        let job = lock(&self.transfer).take();
        match job {
            None => Err(io::Error::other("no device state transfer was started")),
            Some(Transfer::Save(Err(e))) => Err(io::Error::other(e)),
            Some(Transfer::Save(Ok(t))) => joined(t.join()),
            Some(Transfer::Load(t)) => {
                let (bytes, _charge) = joined(t.join())?;
                let r = self.lock_device().load_state(&bytes);
                match r {
                    Ok(()) => {
                        info!("device state loaded: {} bytes", bytes.len());
                        Ok(())
                    }
                    Err(e) => {
                        warn!(
                            "{}: cannot load the device state: {e}",
                            self.out.log().label()
                        );
                        Err(io::Error::new(io::ErrorKind::InvalidData, e))
                    }
                }
            }
        }
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
        let _device = crate::devlog::enter(self.out.log());
        // The crate swaps the table under this lock (SET_MEM_TABLE, ADD/REM_MEM_REG): held for
        // the event, the table checked below is the one every ring access of the event uses
        // (spec §16.5). The swap waits for at most one event; nothing here waits for the
        // frontend's thread, and the device's own memory is another object.
        let _no_swap = unpoisoned(self.mem.lock());
        if !self.rings_table_checked() {
            return Ok(());
        }
        if !self.attached.swap(true, Ordering::AcqRel) {
            self.out.attach_checked(vrings, &self.mem, &self.checked);
        }
        // A failing queue is logged, not propagated: an error here would end the vring worker
        // thread and silence every queue of the device.
        if let Err(e) = self.dispatch(device_event, vrings) {
            warn!("{e}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};

    fn stream(len: usize) -> File {
        let path = std::env::temp_dir().join(format!("vrdma-state-{}-{len}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f.write_all(&vec![7u8; len]).unwrap();
        f.rewind().unwrap();
        f
    }

    /// Finding 5 of issue 39: a state stream's buffer is charged to the device's budget (inside
    /// the daemon's) while it is read and loaded; one beyond the budget fails the load.
    #[test]
    fn a_state_stream_is_charged_and_bounded_by_the_budget() {
        let daemon = crate::budget::Budget::new(8 << 20);
        let device = crate::budget::Budget::in_pool(64 << 20, &daemon);
        let (bytes, charge) = read_state(&mut stream(5 << 20), Some(device.clone())).unwrap();
        assert_eq!(bytes.len(), 5 << 20);
        assert!(charge.bytes() >= bytes.capacity() as u64);
        assert_eq!(daemon.used(), charge.bytes());
        drop(charge);
        assert_eq!(daemon.used(), 0);
        let e = read_state(&mut stream(9 << 20), Some(device)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory, "{e}");
        assert_eq!(daemon.used(), 0, "nothing stays charged");
        assert!(daemon.peak() <= 8 << 20);
    }
}
