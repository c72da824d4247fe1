//! [`Bridge`]: the thread that feeds what an uplink receives into the fabric.

use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{Fabric, FabricError, PortId};
use crate::uplink::{RxFrame, Uplink, IO_BATCH, MAX_FRAME};

/// Receive buffers per bridge (each holds one datagram, or several frames with UDP GRO).
const RX_BUFS: usize = 64;

const TOKEN_STOP: u64 = 1;
const TOKEN_UPLINK: u64 = 2;

/// A running bridge thread; dropping it stops and joins the thread.
pub struct Bridge {
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").finish_non_exhaustive()
    }
}

impl Bridge {
    pub(super) fn start(
        fabric: Arc<Fabric>,
        port: PortId,
        uplink: Arc<dyn Uplink>,
    ) -> Result<Bridge, FabricError> {
        let setup = |what| move |source| FabricError::Setup { what, source };
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(setup("eventfd"))?);
        let epoll = Epoll::new().map_err(setup("epoll"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                wake.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_STOP),
            )
            .map_err(setup("epoll add eventfd"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                uplink.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_UPLINK),
            )
            .map_err(setup("epoll add uplink"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vrdma-bridge{port}"))
            .spawn(move || run(&fabric, port, &*uplink, &epoll, &s2))
            .map_err(setup("the bridge thread"))?;
        Ok(Bridge {
            stop,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("fabric bridge thread panicked");
            }
        }
    }
}

fn run(fabric: &Fabric, port: PortId, uplink: &dyn Uplink, epoll: &Epoll, stop: &AtomicBool) {
    let mut events = vec![EpollEvent::default(); 4];
    let mut bufs: Vec<Vec<u8>> = (0..RX_BUFS).map(|_| vec![0u8; MAX_FRAME]).collect();
    let mut frames: Vec<RxFrame> = Vec::with_capacity(RX_BUFS * 4);
    loop {
        match epoll.wait(-1, &mut events) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                guest_error!("fabric bridge: epoll_wait: {e}");
                return;
            }
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        // Drain what is pending now; the level-triggered epoll brings us back for more.
        for _ in 0..4 {
            frames.clear();
            match uplink.recv_batch(&mut bufs, &mut frames) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    guest_warn!("fabric bridge: uplink receive: {e}");
                    break;
                }
            }
            for chunk in frames.chunks(IO_BATCH) {
                let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
                let mut n = 0;
                for rx in chunk {
                    if let Some(f) = bufs
                        .get(rx.slot)
                        .and_then(|b| b.get(rx.off..rx.off.saturating_add(rx.len)))
                    {
                        slices[n] = f;
                        n += 1;
                    }
                }
                fabric.forward(port, &slices[..n]);
            }
        }
    }
}
