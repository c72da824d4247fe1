//! Spec §16.5 "Logs" on the engine's threads: what a device's engine logs about its packets
//! (here: receive errors of its port, one line each) names the device and counts against that
//! device's own limit. Two engines of one process: one floods, the other's first warning is
//! still logged. Its own test binary: it installs a logger that records the lines.

mod log_capture;

use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrdma_backend::device::{Device, DeviceConfig, DeviceOutput, Ticket};
use vrdma_backend::devlog::{DeviceLog, LogLimit};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::uplink::{Uplink, UplinkError};
use vrdma_spec::{VrdmaEvent, VrdmaPageReq};

/// A device output that only carries the device's label and limit, as the vhost-user one does.
struct Labelled(Arc<DeviceLog>);

impl DeviceOutput for Labelled {
    fn event(&self, _ev: VrdmaEvent) {}
    fn page_request(&self, _req: VrdmaPageReq) {}
    fn eth_rx(&self, _frame: &[u8], _port: Option<usize>) {}
    fn command_done(&self, _ticket: Ticket, _status: u32) {}
    fn device_log(&self) -> Option<Arc<DeviceLog>> {
        Some(self.0.clone())
    }
}

/// A port whose receive fails `errors` times once it is made readable, then reports nothing
/// and is quiet again. Each failure is one warning of the engine (`engine: uplink receive`).
struct FailingPort {
    ready: EventFd,
    errors: AtomicUsize,
    /// Set by the receive after the last failure: the engine thread has logged every one.
    drained: AtomicBool,
}

impl FailingPort {
    fn new(errors: usize) -> Arc<FailingPort> {
        Arc::new(FailingPort {
            ready: EventFd::new(EFD_NONBLOCK).unwrap(),
            errors: AtomicUsize::new(errors),
            drained: AtomicBool::new(false),
        })
    }

    /// Make the port readable and wait until the engine has met every failure.
    fn fail_and_wait(&self) {
        self.ready.write(1).unwrap();
        let t0 = Instant::now();
        while !self.drained.load(Ordering::SeqCst) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the engine stopped receiving"
            );
            std::thread::yield_now();
        }
    }
}

impl Uplink for FailingPort {
    fn send(&self, _frame: &[u8]) -> Result<(), UplinkError> {
        Ok(())
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let left = self.errors.load(Ordering::SeqCst);
        if left > 0 {
            self.errors.store(left - 1, Ordering::SeqCst);
            return Err(UplinkError::Recv(std::io::Error::other(
                "device read failed",
            )));
        }
        // Quiet again; the engine thread logged the failures before it came back here.
        let _ = self.ready.read();
        self.drained.store(true, Ordering::SeqCst);
        Ok(None)
    }
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

fn engine(label: &str, port: &Arc<FailingPort>) -> (Arc<DeviceLog>, Engine) {
    let log = DeviceLog::new(label);
    let dev = Arc::new(HandoffLock::new(Device::new(
        DeviceConfig::default(),
        GuestMem::empty(),
        Arc::new(Labelled(log.clone())),
    )));
    let engine = Engine::start(dev, port.clone()).expect("engine starts");
    (log, engine)
}

fn lines_of(label: &str) -> usize {
    let prefix = format!("{label}: engine: uplink receive");
    log_capture::lines()
        .iter()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

/// What [`LogLimit`] lets through of `n` occurrences.
fn allowed_of(n: usize) -> usize {
    let limit = LogLimit::new();
    (0..n).filter(|_| limit.allow()).count()
}

#[test]
fn an_engine_flooding_the_log_does_not_silence_another_devices_first_warning() {
    log_capture::install();
    const FLOOD: usize = 3000;
    let port_a = FailingPort::new(FLOOD);
    let port_b = FailingPort::new(1);
    let (log_a, _engine_a) = engine("tenant-a", &port_a);
    let (log_b, _engine_b) = engine("tenant-b", &port_b);

    port_a.fail_and_wait();
    // The flood: a burst, then one in 1024, each line naming the device.
    assert_eq!(lines_of("tenant-a"), allowed_of(FLOOD));
    assert_eq!(log_a.suppressed() as usize, FLOOD - allowed_of(FLOOD));

    port_b.fail_and_wait();
    assert_eq!(
        lines_of("tenant-b"),
        1,
        "tenant-b's first warning: {:?}",
        log_capture::lines()
    );
    assert_eq!(log_b.suppressed(), 0);
    for l in log_capture::lines().iter() {
        assert!(
            l.starts_with("tenant-a: ") || l.starts_with("tenant-b: "),
            "unlabelled: {l}"
        );
    }
}
