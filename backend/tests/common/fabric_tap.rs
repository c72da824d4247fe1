//! A fabric device port that records what passes and forwards everything — segments and
//! payload references included, so the offloads stay on — as the fabric tests' view of the
//! wire; it can also lose one frame inside a segment.

use std::sync::{Arc, Mutex};

use vrdma_backend::fabric::DevicePort;
use vrdma_backend::uplink::{IcrcOffload, RxFrame, Uplink, UplinkError};
use vrdma_backend::wire::aeth::Syndrome;
use vrdma_backend::wire::segment::{PayloadRefs, Segment, SegmentWriter};
use vrdma_backend::wire::{IcrcCheck, RocePacket};

/// What a port saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every request packet received: opcode, PSN, payload length, AckReq.
    pub requests: Vec<(u8, u32, usize, bool)>,
    /// Every response packet received: opcode, PSN, payload length.
    pub responses: Vec<(u8, u32, usize)>,
    /// Received RNR NAKs (responses whose AETH syndrome is an RNR NAK).
    pub rnr_naks: usize,
    pub segments_in: usize,
    pub segments_out: usize,
    /// Received segments whose payloads came by reference.
    pub refs_in: usize,
    /// Drop this frame (0-based) of the first received segment (copied payloads) with more
    /// frames than that.
    pub drop_in_first: Option<usize>,
    pub dropped: usize,
    /// The receiving device's counters of payloads copied by reference and of stale
    /// references dropped (`PortStats::rx_by_reference`, `drop_stale_ref`), for the tests that
    /// read them.
    pub copied_by_reference: u64,
    pub stale_references: u64,
}

impl Seen {
    /// The first transmission of each request PSN: opcode, PSN, payload length.
    pub fn first_sends(&self) -> Vec<(u8, u32, usize)> {
        let mut psns = std::collections::HashSet::new();
        self.requests
            .iter()
            .filter(|r| psns.insert(r.1))
            .map(|r| (r.0, r.1, r.2))
            .collect()
    }
}

/// See the module documentation.
pub struct Tap {
    pub inner: DevicePort,
    pub seen: Arc<Mutex<Seen>>,
}

impl Tap {
    pub fn new(inner: DevicePort, seen: &Arc<Mutex<Seen>>) -> Tap {
        Tap {
            inner,
            seen: seen.clone(),
        }
    }
}

/// `buf` without its frame `lost`, as a segment again.
fn without_frame(buf: &[u8], lost: usize) -> Vec<u8> {
    let mut w = SegmentWriter::default();
    for (i, f) in Segment::parse(buf)
        .expect("a valid segment")
        .frames()
        .enumerate()
    {
        if i != lost {
            let r = w.push_with(f.len(), |room: &mut [u8]| {
                room[..f.len()].copy_from_slice(f);
                Ok::<usize, ()>(f.len())
            });
            assert!(r.unwrap().is_some());
        }
    }
    w.take().unwrap()
}

impl Uplink for Tap {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.inner.send(frame)
    }
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        self.inner.recv(buf)
    }
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        self.inner.as_raw_fd()
    }
    fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
        self.inner.send_frames(frames)
    }
    fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, UplinkError> {
        self.seen.lock().unwrap().segments_out += 1;
        self.inner.send_segment(seg)
    }
    fn send_segment_refs(
        &self,
        seg: &mut Vec<u8>,
        refs: Box<dyn PayloadRefs>,
    ) -> Result<usize, UplinkError> {
        self.seen.lock().unwrap().segments_out += 1;
        self.inner.send_segment_refs(seg, refs)
    }
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        let from = frames.len();
        let n = self.inner.recv_batch(bufs, frames)?;
        let mut seen = self.seen.lock().unwrap();
        for rx in frames[from..].iter_mut() {
            let buf = &mut bufs[rx.slot];
            if rx.segment {
                seen.segments_in += 1;
                seen.refs_in += usize::from(rx.refs.is_some());
                let count = Segment::parse(buf).map_or(0, |s| s.count());
                if let Some(lost) = seen.drop_in_first.filter(|&k| count > k) {
                    assert!(rx.refs.is_none(), "a loss inside a by-reference segment");
                    *buf = without_frame(buf, lost);
                    rx.off = 0;
                    rx.len = buf.len();
                    seen.drop_in_first = None;
                    seen.dropped += 1;
                }
            }
            let buf = &bufs[rx.slot][rx.off..rx.off + rx.len];
            for f in vrdma_backend::transport::frames_of(buf, rx.segment) {
                if let Ok(p) = RocePacket::parse_with(f, IcrcCheck::Trusted) {
                    let (op, psn, len) = (p.bth.opcode as u8, p.bth.psn, p.payload.len());
                    if p.info.is_response() {
                        seen.responses.push((op, psn, len));
                        if matches!(
                            p.ext.aeth.map(|a| a.syndrome),
                            Some(Syndrome::RnrNak { .. })
                        ) {
                            seen.rnr_naks += 1;
                        }
                    } else {
                        seen.requests.push((op, psn, len, p.bth.ack_req));
                    }
                }
            }
        }
        Ok(n)
    }
    fn icrc_offload(&self) -> IcrcOffload {
        self.inner.icrc_offload()
    }
}
