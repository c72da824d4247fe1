//! Host-side counters: what an operator sees without looking into the guest.
//!
//! - [`PortStats`]: per-device port counters (frames/bytes to and from the uplink, where received
//!   frames went, drops by reason). Atomics, shared by the engine thread, the vhost-user thread
//!   (guest eth tx through [`Metered`]) and the stats server; relaxed increments on the hot path.
//! - [`QpStats`]: per-QP transport counters in `Qp::stats`, plain integers changed under the
//!   device lock by `transport/` (the only writer).
//! - [`Metered`]: the [`Uplink`] wrapper that counts into a [`PortStats`].
//!
//! Who reads them: `exporter.rs` (the Prometheus text and the `<socket>.stats` server) and
//! QUERY_STATS (`device/`). This module sits low (it knows only `uplink/`), so `qp/` and
//! `transport/` can hold the counters without depending on the device.
//!
//! Counters count from daemon start (port) or QP creation (QP); a device reset destroys the QPs
//! and their counters, not the port's.

use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::uplink::{RxFrame, Uplink, UplinkError, IO_BATCH};

/// The port's counters (see the module doc). Every field counts events since daemon start.
#[derive(Debug, Default)]
pub struct PortStats {
    /// Frames received from the uplink, and their bytes.
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames handed to the uplink successfully (engine and guest eth tx), and their bytes.
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Received frames the port demux gave the RoCEv2 engine / the guest netdev.
    pub rx_to_engine: AtomicU64,
    pub rx_to_guest: AtomicU64,
    /// RoCEv2 frames between two QPs of this device, looped back without the uplink.
    pub loopback_frames: AtomicU64,
    /// Received or looped RoCEv2 frames one engine worker routed to the worker of their QP
    /// (`--engine-threads`, `transport/workers.rs`).
    pub routed_to_worker: AtomicU64,
    /// Drops by reason: runts and unicast for another MAC (port demux, `port.rs`).
    pub drop_filtered: AtomicU64,
    /// RoCEv2 frames the transport could not parse (bad headers, unsupported opcode).
    pub drop_malformed: AtomicU64,
    /// RoCEv2 frames dropped for a bad ICRC (spec §15.7).
    pub drop_bad_icrc: AtomicU64,
    /// RoCEv2 frames for a QPN that does not exist.
    pub drop_unknown_qp: AtomicU64,
    /// RoCEv2 frames whose QP's type or state does not accept them (IBTA 9.6, 10.3).
    pub drop_qp_state: AtomicU64,
    /// RoCEv2 frames whose P_Key does not match the QP's (IBTA 10.9, spec §14.6).
    pub drop_bad_pkey: AtomicU64,
    /// RC/UC frames not from the QP's peer (source/destination GID ≠ the QP's path, §14.6).
    pub drop_bad_address: AtomicU64,
    /// UC frames ahead of the expected PSN by the UC window or more (§14.6).
    pub drop_uc_out_of_window: AtomicU64,
    /// RC WRITE packets whose payload came by reference on the fabric (`--payload-refs`) and
    /// was copied straight from the sender's guest memory into this guest's (spec §16.2
    /// rule 6).
    pub rx_by_reference: AtomicU64,
    /// Packets of a by-reference fabric segment whose payload the sender had fenced (DEREG_MR,
    /// invalidation, reset, SET_MEM_TABLE, suspend) before this device copied it: lost, the
    /// RC requester retransmits (spec §16.2 rule 6).
    pub drop_stale_ref: AtomicU64,
    /// Frames the uplink could not take (socket buffer full): lost like on a wire.
    pub drop_tx_busy: AtomicU64,
    /// Received or looped frames for a QP of another engine worker whose inbox was full
    /// (`transport/workers.rs`): lost, RC retransmits.
    pub drop_worker_busy: AtomicU64,
    /// Other uplink send / receive errors.
    pub tx_errors: AtomicU64,
    pub rx_errors: AtomicU64,
}

/// `counter += 1` for a [`PortStats`] field (relaxed: counters order nothing).
#[inline]
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[inline]
pub fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

/// Per-QP transport counters (`Qp::stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets (frames) the QP sent — requests, responses and acknowledgements — and bytes.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Packets for this QP the transport accepted for processing, and bytes.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N after a NAK, timeout or RNR NAK; IBTA 9.7.5).
    pub retransmits: u64,
    /// Retransmission timer expiries (IBTA 9.7.6.1).
    pub timeouts: u64,
    /// RNR NAKs received (requester) / sent (responder) (IBTA 9.7.5.2.8).
    pub rnr_naks_rx: u64,
    pub rnr_naks_tx: u64,
    /// PSN sequence error NAKs received (requester) / sent (responder) (IBTA 9.7.5.2.2).
    pub seq_naks_rx: u64,
    pub seq_naks_tx: u64,
}

impl QpStats {
    /// `self += o`, field by field (wrapping, like the 64-bit counters of spec §11.9).
    pub fn add(&mut self, o: &QpStats) {
        self.tx_packets = self.tx_packets.wrapping_add(o.tx_packets);
        self.tx_bytes = self.tx_bytes.wrapping_add(o.tx_bytes);
        self.rx_packets = self.rx_packets.wrapping_add(o.rx_packets);
        self.rx_bytes = self.rx_bytes.wrapping_add(o.rx_bytes);
        self.retransmits = self.retransmits.wrapping_add(o.retransmits);
        self.timeouts = self.timeouts.wrapping_add(o.timeouts);
        self.rnr_naks_rx = self.rnr_naks_rx.wrapping_add(o.rnr_naks_rx);
        self.rnr_naks_tx = self.rnr_naks_tx.wrapping_add(o.rnr_naks_tx);
        self.seq_naks_rx = self.seq_naks_rx.wrapping_add(o.seq_naks_rx);
        self.seq_naks_tx = self.seq_naks_tx.wrapping_add(o.seq_naks_tx);
    }

    /// The QP part of a QUERY_STATS response (spec §11.9); the port-only fields are 0.
    pub fn to_vrdma(&self) -> vrdma_spec::VrdmaStats {
        vrdma_spec::VrdmaStats {
            tx_packets: self.tx_packets,
            tx_bytes: self.tx_bytes,
            rx_packets: self.rx_packets,
            rx_bytes: self.rx_bytes,
            retransmits: self.retransmits,
            timeouts: self.timeouts,
            rnr_naks_rx: self.rnr_naks_rx,
            rnr_naks_tx: self.rnr_naks_tx,
            seq_naks_rx: self.seq_naks_rx,
            seq_naks_tx: self.seq_naks_tx,
            ..Default::default()
        }
    }
}

impl PortStats {
    /// RoCEv2 frames dropped before reaching a QP (spec §11.9 `rx_dropped`).
    pub fn rx_dropped(&self) -> u64 {
        [
            &self.drop_malformed,
            &self.drop_bad_icrc,
            &self.drop_unknown_qp,
            &self.drop_qp_state,
            &self.drop_bad_pkey,
            &self.drop_bad_address,
            &self.drop_uc_out_of_window,
            &self.drop_stale_ref,
            &self.drop_worker_busy,
        ]
        .iter()
        .fold(0u64, |a, c| a.wrapping_add(c.load(Ordering::Relaxed)))
    }
}

/// An [`Uplink`] that counts the frames and bytes passing through it into a [`PortStats`].
pub struct Metered<U> {
    inner: U,
    stats: Arc<PortStats>,
}

impl<U> Metered<U> {
    pub fn new(inner: U, stats: Arc<PortStats>) -> Self {
        Metered { inner, stats }
    }
}

impl<U: Uplink> Metered<U> {
    /// Send one fabric segment through `send` and count it as the frames in it: those the
    /// inner uplink took as sent, the rest as `tx_busy` drops.
    fn count_segment(
        &self,
        seg: &mut Vec<u8>,
        send: impl FnOnce(&U, &mut Vec<u8>) -> Result<usize, UplinkError>,
    ) -> Result<usize, UplinkError> {
        let len = seg.len();
        let count = crate::wire::segment::frame_count(seg, true);
        let r = send(&self.inner, seg);
        match &r {
            Ok(n) => {
                add(&self.stats.tx_frames, *n);
                add(&self.stats.tx_bytes, len);
                add(&self.stats.drop_tx_busy, count.saturating_sub(*n));
            }
            Err(UplinkError::WouldBlock) => add(&self.stats.drop_tx_busy, count),
            Err(_) => bump(&self.stats.tx_errors),
        }
        r
    }
}

impl<U: Uplink> Uplink for Metered<U> {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        let r = self.inner.send(frame);
        match &r {
            Ok(()) => {
                bump(&self.stats.tx_frames);
                add(&self.stats.tx_bytes, frame.len());
            }
            Err(UplinkError::WouldBlock) => bump(&self.stats.drop_tx_busy),
            Err(_) => bump(&self.stats.tx_errors),
        }
        r
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let r = self.inner.recv(buf);
        match &r {
            Ok(Some(n)) => {
                bump(&self.stats.rx_frames);
                add(&self.stats.rx_bytes, *n);
            }
            Ok(None) => {}
            Err(_) => bump(&self.stats.rx_errors),
        }
        r
    }

    // The batch calls forward to the inner uplink's own (sendmmsg / recvmmsg on UDP): the
    // engine moves frames in batches, and the wrapper must not turn them back into one system
    // call per frame.
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        let r = self.inner.send_batch(frames);
        match &r {
            Ok(n) => {
                let sent = frames.get(..*n).unwrap_or(frames);
                add(&self.stats.tx_frames, sent.len());
                add(&self.stats.tx_bytes, sent.iter().map(|f| f.len()).sum());
                // Frames not handed over are lost (a full socket buffer; RC retransmits).
                add(&self.stats.drop_tx_busy, frames.len() - sent.len());
            }
            Err(UplinkError::WouldBlock) => add(&self.stats.drop_tx_busy, frames.len()),
            Err(_) => bump(&self.stats.tx_errors),
        }
        r
    }

    fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
        let mut sent = 0;
        for chunk in frames.chunks_mut(IO_BATCH) {
            // Lengths first: the inner uplink may swap the buffers.
            let mut lens = [0usize; IO_BATCH];
            for (l, f) in lens.iter_mut().zip(chunk.iter()) {
                *l = f.len();
            }
            match self.inner.send_frames(chunk) {
                Ok(n) => {
                    add(&self.stats.tx_frames, n.min(chunk.len()));
                    add(&self.stats.tx_bytes, lens[..n.min(IO_BATCH)].iter().sum());
                    add(&self.stats.drop_tx_busy, chunk.len().saturating_sub(n));
                    sent += n;
                }
                Err(UplinkError::WouldBlock) => add(&self.stats.drop_tx_busy, chunk.len()),
                Err(e) => {
                    bump(&self.stats.tx_errors);
                    if sent == 0 {
                        return Err(e);
                    }
                }
            }
        }
        Ok(sent)
    }

    /// A fabric segment counts as the frames in it (spec §16.2 rule 6).
    fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, UplinkError> {
        self.count_segment(seg, |inner, seg| inner.send_segment(seg))
    }

    fn send_segment_refs(
        &self,
        seg: &mut Vec<u8>,
        refs: Box<dyn crate::wire::segment::PayloadRefs>,
    ) -> Result<usize, UplinkError> {
        self.count_segment(seg, |inner, seg| inner.send_segment_refs(seg, refs))
    }

    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        let before = frames.len();
        let r = self.inner.recv_batch(bufs, frames);
        match &r {
            Ok(_) => {
                let got = frames.get(before..).unwrap_or_default();
                // A fabric segment counts as the frames in it (spec §16.2 rule 6).
                let n = got
                    .iter()
                    .map(|f| {
                        bufs.get(f.slot)
                            .and_then(|b| b.get(f.off..f.off + f.len))
                            .map_or(1, |b| crate::wire::segment::frame_count(b, f.segment))
                    })
                    .sum();
                add(&self.stats.rx_frames, n);
                add(&self.stats.rx_bytes, got.iter().map(|f| f.len).sum());
            }
            Err(_) => bump(&self.stats.rx_errors),
        }
        r
    }

    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
    fn rx_pending(&self) -> Option<bool> {
        self.inner.rx_pending()
    }
    fn set_rx_polling(&self, polling: bool) {
        self.inner.set_rx_polling(polling)
    }
    fn link_up(&self) -> Option<bool> {
        self.inner.link_up()
    }
    fn icrc_offload(&self) -> crate::uplink::IcrcOffload {
        self.inner.icrc_offload()
    }
}
