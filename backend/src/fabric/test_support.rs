//! What the switch's unit tests share: an uplink that records what it is given, a fabric of
//! device ports and recorded uplinks, a minimal frame, and a device port's queue drained into a
//! list.

use std::sync::{Arc, Mutex};

use super::{DevicePort, Fabric, FabricBuilder, PortId};
use crate::uplink::{RxFrame, Uplink, UplinkError};
use crate::wire::eth::MacAddr;

/// An uplink that records what it is given (and never receives).
#[derive(Default)]
pub(super) struct Recorder {
    pub(super) sent: Mutex<Vec<Vec<u8>>>,
}

impl Uplink for Recorder {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.sent.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Ok(None)
    }
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        -1
    }
}

/// A built fabric with its device ports (in the order they were added) and its uplinks with
/// what records them.
pub(super) struct Bed {
    pub fabric: Arc<Fabric>,
    pub ports: Vec<DevicePort>,
    pub uplinks: Vec<(PortId, Arc<Recorder>)>,
}

impl Bed {
    /// Builds `b`, whose devices `devices` and uplinks `add_uplink(recorder)` added.
    pub fn build(
        mut b: FabricBuilder,
        devices: &[PortId],
        uplinks: usize,
        mut add_uplink: impl FnMut(&mut FabricBuilder, usize, Arc<Recorder>) -> PortId,
    ) -> Bed {
        let uplinks = (0..uplinks)
            .map(|i| {
                let r = Arc::new(Recorder::default());
                (add_uplink(&mut b, i, r.clone()), r)
            })
            .collect();
        let fabric = b.build();
        let ports = devices
            .iter()
            .map(|&i| fabric.device_port(i).unwrap())
            .collect();
        Bed {
            fabric,
            ports,
            uplinks,
        }
    }
}

/// What `r` was given since the last call.
pub(super) fn sent(r: &Recorder) -> Vec<Vec<u8>> {
    std::mem::take(&mut *r.sent.lock().unwrap())
}

/// An IPv4-typed frame from `src` to `dst` whose first payload byte is `tag`.
pub(super) fn frame(dst: MacAddr, src: MacAddr, tag: u8) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00, tag, 1, 2, 3]);
    f
}

/// Every frame queued for `p` (at most 64), in the order its engine would take them.
pub(super) fn drain(p: &DevicePort) -> Vec<Vec<u8>> {
    let mut bufs = vec![Vec::new(); 64];
    let mut frames: Vec<RxFrame> = Vec::new();
    let n = p.recv_batch(&mut bufs, &mut frames).unwrap();
    assert_eq!(n, frames.len());
    bufs.truncate(n);
    bufs
}
