//! The fabric: an in-process Ethernet switch between the devices one daemon serves and its
//! uplinks (ARCHITECTURE.md "One daemon, many devices").
//!
//! Ports are fixed when the fabric is built: one [`DevicePort`] per device (static MAC, a bounded
//! [`RxQueue`] its engine polls) and one port per uplink (frames to it are sent on the caller's
//! thread; a [`Bridge`] thread feeds what the uplink receives into [`Fabric::forward`]).
//!
//! Switching rules, per frame (spec §16.2):
//! 1. Shorter than an Ethernet header, or a group source MAC: dropped.
//! 2. Ingress filter: a device port sends only with its own MAC as source; an uplink port never
//!    with a local device's MAC. Otherwise dropped (`drop_spoofed`).
//! 3. Group destination (broadcast, multicast): every other port.
//! 4. A local device's MAC: that device (never back to the port it came from).
//! 5. Other unicast: the uplink port the MAC was learned on (learning only with two or more
//!    uplinks, [`MacTable`]), else every uplink port but the ingress one.
//!
//! No spanning tree: two uplinks bridged to the same segment make a loop, as with any switch.
//!
//! Segments (`wire::segment`, spec §16.2 rule 6): an engine may hand [`Fabric::forward_segment`]
//! several consecutive frames of one QP in one buffer. The switch decides on the segment's
//! addresses (those of every frame in it) and moves it whole, marked as a segment, to a device
//! port that takes segments; for anything else (an uplink, flooding, the capture, a port that
//! does not take them) it splits the segment into its standard frames first. The mark travels
//! beside the buffer (this call, the [`RxQueue`] entry, `RxFrame::segment`), never in its
//! bytes: every buffer from any other path (a guest's netdev, an uplink, `forward_owned`) is
//! an ordinary frame and switched as one, whatever its EtherType or payload.

pub mod bridge;
pub mod edge;
pub mod learning;
pub mod port;
pub mod rxqueue;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use thiserror::Error;

pub use bridge::Bridge;
pub use learning::MacTable;
pub use port::DevicePort;
pub use rxqueue::RxQueue;

use crate::stats::bump;
use crate::uplink::{PcapWriter, Uplink, UplinkError, IO_BATCH};
use crate::wire::eth::{is_multicast, MacAddr};
use crate::wire::segment;

/// A port's index in its fabric.
pub type PortId = usize;

#[derive(Debug, Error)]
pub enum FabricError {
    #[error("two devices on the fabric have the MAC address {0}")]
    DuplicateMac(String),
    #[error("fabric: cannot create {what}: {source}")]
    Setup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("fabric: no device port {0}")]
    NoSuchDevice(PortId),
}

/// Counters of one fabric port (monotonic, relaxed atomics).
#[derive(Debug, Default)]
pub struct FabricPortStats {
    /// Frames that entered the fabric from this port and were switched.
    pub in_frames: AtomicU64,
    /// Frames delivered to this port (queued for a device, handed to an uplink).
    pub out_frames: AtomicU64,
    /// Frames from this port dropped by the ingress filter (rules 1 and 2).
    pub drop_spoofed: AtomicU64,
    /// Frames for this port dropped because its queue was full / the uplink was busy.
    pub drop_full: AtomicU64,
    /// RoCEv2 frames from this (uplink) port dropped for a wrong ICRC (spec §16.2).
    pub drop_bad_icrc: AtomicU64,
    /// Frames of a by-reference segment from this (device) port dropped because the sender
    /// fenced a reference before it could be gathered (spec §16.2 rule 6).
    pub drop_stale_ref: AtomicU64,
}

enum PortKind {
    /// `segments`: the port's engine takes fabric segments as they are (opt-in,
    /// [`DevicePort::with_segments`]: only an engine directly on the port knows to split them).
    Device {
        mac: MacAddr,
        rx: RxQueue,
        segments: AtomicBool,
        /// With `segments`: its engine sends payloads by reference (opt-in,
        /// [`DevicePort::with_payload_refs`]).
        refs: AtomicBool,
    },
    Uplink {
        uplink: Arc<dyn Uplink>,
    },
}

struct Port {
    kind: PortKind,
    stats: FabricPortStats,
    /// For the counters: the device's label or the uplink's spec.
    name: String,
}

/// Where one frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    Drop,
    Port(PortId),
    /// Every port but the ingress one.
    All,
    /// Every uplink port but the ingress one.
    Uplinks,
}

/// See the module documentation.
pub struct Fabric {
    ports: Vec<Port>,
    devices: HashMap<MacAddr, PortId>,
    uplinks: Vec<PortId>,
    /// Some with two or more uplinks.
    learned: Option<Mutex<MacTable>>,
    capture: Option<Arc<PcapWriter>>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("ports", &self.ports.len())
            .field("uplinks", &self.uplinks)
            .finish_non_exhaustive()
    }
}

/// Collects the ports, then [`FabricBuilder::build`]s the fabric.
#[derive(Default)]
pub struct FabricBuilder {
    ports: Vec<Port>,
    capture: Option<Arc<PcapWriter>>,
}

impl std::fmt::Debug for FabricBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricBuilder")
            .field("ports", &self.ports.len())
            .finish_non_exhaustive()
    }
}

fn mac_string(mac: &MacAddr) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl FabricBuilder {
    pub fn new() -> FabricBuilder {
        FabricBuilder::default()
    }

    /// A device port with the device's (unicast) MAC.
    pub fn add_device(&mut self, mac: MacAddr) -> Result<PortId, FabricError> {
        let dup = self
            .ports
            .iter()
            .any(|p| matches!(&p.kind, PortKind::Device { mac: m, .. } if *m == mac));
        if dup {
            return Err(FabricError::DuplicateMac(mac_string(&mac)));
        }
        let rx = RxQueue::new().map_err(|source| FabricError::Setup {
            what: "a port's eventfd",
            source,
        })?;
        self.ports.push(Port {
            kind: PortKind::Device {
                mac,
                rx,
                segments: AtomicBool::new(false),
                refs: AtomicBool::new(false),
            },
            stats: FabricPortStats::default(),
            name: format!("port{}", self.ports.len()),
        });
        Ok(self.ports.len() - 1)
    }

    /// An uplink port. Its frames come in through a [`Bridge`] ([`Fabric::start_bridges`]).
    pub fn add_uplink(&mut self, uplink: Arc<dyn Uplink>) -> PortId {
        self.ports.push(Port {
            kind: PortKind::Uplink { uplink },
            stats: FabricPortStats::default(),
            name: format!("port{}", self.ports.len()),
        });
        self.ports.len() - 1
    }

    /// Name port `id` in the counters (default `port<N>`).
    pub fn name_port(&mut self, id: PortId, name: impl Into<String>) {
        if let Some(p) = self.ports.get_mut(id) {
            p.name = name.into();
        }
    }

    /// Capture every frame the fabric switches, once, as it enters (`--pcap`).
    pub fn capture(&mut self, writer: Arc<PcapWriter>) {
        self.capture = Some(writer);
    }

    pub fn build(self) -> Arc<Fabric> {
        let mut devices = HashMap::new();
        let mut uplinks = Vec::new();
        for (i, p) in self.ports.iter().enumerate() {
            match &p.kind {
                PortKind::Device { mac, .. } => {
                    devices.insert(*mac, i);
                }
                PortKind::Uplink { .. } => uplinks.push(i),
            }
        }
        let learned = (uplinks.len() > 1).then(|| Mutex::new(MacTable::new()));
        Arc::new(Fabric {
            ports: self.ports,
            devices,
            uplinks,
            learned,
            capture: self.capture,
        })
    }
}

impl Fabric {
    /// The [`Uplink`] the device on port `id` uses.
    pub fn device_port(self: &Arc<Self>, id: PortId) -> Result<DevicePort, FabricError> {
        match self.ports.get(id).map(|p| &p.kind) {
            Some(PortKind::Device { .. }) => Ok(DevicePort::new(self.clone(), id)),
            _ => Err(FabricError::NoSuchDevice(id)),
        }
    }

    /// Start one [`Bridge`] thread per uplink port.
    pub fn start_bridges(self: &Arc<Self>) -> Result<Vec<Bridge>, FabricError> {
        let mut out = Vec::new();
        for &id in &self.uplinks {
            if let PortKind::Uplink { uplink } = &self.ports[id].kind {
                if uplink.as_raw_fd() >= 0 {
                    out.push(Bridge::start(self.clone(), id, uplink.clone())?);
                }
            }
        }
        Ok(out)
    }

    /// Number of ports.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// The counters of port `id`.
    pub fn port_stats(&self, id: PortId) -> Option<&FabricPortStats> {
        self.ports.get(id).map(|p| &p.stats)
    }

    /// Every port's counters in the Prometheus text format (the operator's `--stats-socket`;
    /// never a device's own `.stats` answer, spec §16.5).
    pub fn render_stats(&self) -> String {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = String::new();
        let kind = |p: &Port| match p.kind {
            PortKind::Device { .. } => "device",
            PortKind::Uplink { .. } => "uplink",
        };
        let _ = writeln!(
            out,
            "# HELP vrdma_fabric_frames_total Frames switched by the daemon's fabric, per port: \
             in = entered from the port, out = delivered to it."
        );
        let _ = writeln!(out, "# TYPE vrdma_fabric_frames_total counter");
        for p in &self.ports {
            for (dir, c) in [("in", &p.stats.in_frames), ("out", &p.stats.out_frames)] {
                let _ = writeln!(
                    out,
                    "vrdma_fabric_frames_total{{port=\"{}\",kind=\"{}\",dir=\"{dir}\"}} {}",
                    p.name,
                    kind(p),
                    c.load(Relaxed)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP vrdma_fabric_drops_total Frames the fabric dropped, per port: spoofed = \
             refused at ingress (source MAC), full = the port's queue or uplink had no room, \
             bad_icrc = a RoCEv2 frame from an uplink with a wrong ICRC, stale_ref = a \
             by-reference segment the sender fenced before it left."
        );
        let _ = writeln!(out, "# TYPE vrdma_fabric_drops_total counter");
        for p in &self.ports {
            for (why, c) in [
                ("spoofed", &p.stats.drop_spoofed),
                ("full", &p.stats.drop_full),
                ("bad_icrc", &p.stats.drop_bad_icrc),
                ("stale_ref", &p.stats.drop_stale_ref),
            ] {
                let _ = writeln!(
                    out,
                    "vrdma_fabric_drops_total{{port=\"{}\",kind=\"{}\",reason=\"{why}\"}} {}",
                    p.name,
                    kind(p),
                    c.load(Relaxed)
                );
            }
        }
        out
    }

    pub(crate) fn rx_queue(&self, id: PortId) -> Option<&RxQueue> {
        match &self.ports.get(id)?.kind {
            PortKind::Device { rx, .. } => Some(rx),
            PortKind::Uplink { .. } => None,
        }
    }

    /// Does device port `id` take segments whole?
    pub(crate) fn takes_segments(&self, id: PortId) -> bool {
        matches!(
            self.ports.get(id).map(|p| &p.kind),
            Some(PortKind::Device { segments, .. }) if segments.load(Ordering::Relaxed)
        )
    }

    /// Does device port `id`'s engine send payloads by reference (it takes segments and was
    /// opted in)?
    pub(crate) fn sends_refs(&self, id: PortId) -> bool {
        matches!(
            self.ports.get(id).map(|p| &p.kind),
            Some(PortKind::Device { segments, refs, .. })
                if segments.load(Ordering::Relaxed) && refs.load(Ordering::Relaxed)
        )
    }

    pub(crate) fn set_refs(&self, id: PortId, on: bool) {
        if let Some(PortKind::Device { refs, .. }) = self.ports.get(id).map(|p| &p.kind) {
            refs.store(on, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_takes_segments(&self, id: PortId, on: bool) {
        if let Some(PortKind::Device { segments, .. }) = self.ports.get(id).map(|p| &p.kind) {
            segments.store(on, Ordering::Relaxed);
        }
    }

    /// The switching rules on the Ethernet addresses of `frame` (module documentation).
    fn decide(&self, from: PortId, frame: &[u8], now: Option<Instant>) -> Dest {
        let (Some(dst), Some(src)) = (frame.get(0..6), frame.get(6..12)) else {
            return Dest::Drop;
        };
        if frame.len() < 14 {
            return Dest::Drop;
        }
        let mut d = [0u8; 6];
        let mut s = [0u8; 6];
        d.copy_from_slice(dst);
        s.copy_from_slice(src);
        if is_multicast(&s) {
            return Dest::Drop;
        }
        let Some(port) = self.ports.get(from) else {
            return Dest::Drop;
        };
        match &port.kind {
            PortKind::Device { mac, .. } if *mac != s => return Dest::Drop,
            PortKind::Device { .. } => {}
            PortKind::Uplink { .. } => {
                if self.devices.contains_key(&s) {
                    return Dest::Drop;
                }
                if let (Some(t), Some(now)) = (&self.learned, now) {
                    t.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .learn(s, from, now);
                }
            }
        }
        if is_multicast(&d) {
            return Dest::All;
        }
        if let Some(&p) = self.devices.get(&d) {
            return if p == from { Dest::Drop } else { Dest::Port(p) };
        }
        if let (Some(t), Some(now)) = (&self.learned, now) {
            if let Some(p) = t.lock().unwrap_or_else(|p| p.into_inner()).lookup(&d, now) {
                return if p == from { Dest::Drop } else { Dest::Port(p) };
            }
        }
        Dest::Uplinks
    }

    fn deliver_to_device(&self, to: PortId, frame: &[u8]) {
        let Some(port) = self.ports.get(to) else {
            return;
        };
        if let PortKind::Device { rx, .. } = &port.kind {
            if rx.push(frame) {
                bump(&port.stats.out_frames);
            } else {
                bump(&port.stats.drop_full);
            }
        }
    }

    /// Switch `frames` that entered on port `from` (module documentation). Runs on the
    /// caller's thread: device deliveries are queue pushes, uplink deliveries the uplink's
    /// `send_batch`. Never blocks on a full queue or a busy uplink (those frames are dropped
    /// and counted).
    pub fn forward(&self, from: PortId, frames: &[&[u8]]) {
        if from >= self.ports.len() {
            return;
        }
        let now = self.learned.as_ref().map(|_| Instant::now());
        let from_uplink = matches!(self.ports[from].kind, PortKind::Uplink { .. });
        for chunk in frames.chunks(IO_BATCH) {
            let mut dest = [Dest::Drop; IO_BATCH];
            self.decide_chunk(from, chunk.iter().copied(), &mut dest, now);
            for (d, f) in dest.iter_mut().zip(chunk) {
                // The devices trust what the fabric hands them: check a frame from the network
                // once, here (spec §16.2).
                if from_uplink && self.reaches_device(*d) && !edge::intact(f) {
                    bump(&self.ports[from].stats.drop_bad_icrc);
                    *d = Dest::Drop;
                }
            }
            self.capture_chunk(&dest[..chunk.len()], chunk.iter().copied());
            self.deliver(from, &dest[..chunk.len()], chunk, false);
        }
    }

    /// [`Fabric::forward`] for owned frames: a frame for one local device moves into its
    /// queue without a copy (a spare buffer takes its place in `frames`, for the caller to
    /// recycle); flooded and uplink-bound frames are copied as in `forward`. Every buffer is
    /// one ordinary frame (segments come through [`Fabric::forward_segment`] only).
    pub fn forward_owned(&self, from: PortId, frames: &mut [Vec<u8>]) {
        if from >= self.ports.len() {
            return;
        }
        self.forward_owned_plain(from, frames);
    }

    /// One engine segment (`wire::segment`; a device port's engine only): moved whole into the
    /// queue of a device port that takes segments (no capture configured), marked as a
    /// segment there, else split into its standard frames, which are switched as owned frames
    /// (sealed where they leave, captured, flooded). A malformed segment, or one from an
    /// uplink port, is dropped. `seg` may be left holding a spare buffer (for the caller to
    /// recycle).
    pub fn forward_segment(&self, from: PortId, seg: &mut Vec<u8>) {
        self.forward_segment_with(from, seg, None);
    }

    /// [`Fabric::forward_segment`] for a segment whose payloads are held by reference (spec
    /// §16.2 rule 6): moved whole with `refs` beside it to a device port that takes segments;
    /// anywhere else (an uplink, the capture, flooding, a port without segments) its payloads
    /// are first gathered into the buffer (`wire::segment::materialize`), which then goes on
    /// exactly as a segment built by copy would. A stale reference drops the segment.
    pub fn forward_segment_refs(
        &self,
        from: PortId,
        seg: &mut Vec<u8>,
        refs: Box<dyn segment::PayloadRefs>,
    ) {
        self.forward_segment_with(from, seg, Some(refs));
    }

    fn forward_segment_with(
        &self,
        from: PortId,
        seg: &mut Vec<u8>,
        mut refs: Option<Box<dyn segment::PayloadRefs>>,
    ) {
        let recycle = |r: Option<Box<dyn segment::PayloadRefs>>| {
            if let Some(r) = r {
                r.recycle();
            }
        };
        let Some(ingress) = self.ports.get(from) else {
            recycle(refs);
            return;
        };
        let Some(parsed) = segment::Segment::parse(seg) else {
            bump(&ingress.stats.drop_spoofed);
            recycle(refs);
            return;
        };
        let n = parsed.count();
        if !matches!(ingress.kind, PortKind::Device { .. }) {
            crate::stats::add(&ingress.stats.drop_spoofed, n);
            recycle(refs);
            return;
        }
        let now = self.learned.as_ref().map(|_| Instant::now());
        let d = self.decide(from, seg, now);
        match d {
            Dest::Drop => {
                crate::stats::add(&ingress.stats.drop_spoofed, n);
                recycle(refs);
                return;
            }
            Dest::Port(p) if self.capture.is_none() && self.takes_segments(p) => {
                crate::stats::add(&ingress.stats.in_frames, n);
                let port = &self.ports[p];
                if let PortKind::Device { rx, .. } = &port.kind {
                    let queued = match refs {
                        None => rx.push_segment(seg),
                        Some(r) => rx
                            .push_segment_refs(seg, r)
                            .map_err(|r| r.recycle())
                            .is_ok(),
                    };
                    if queued {
                        crate::stats::add(&port.stats.out_frames, n);
                    } else {
                        crate::stats::add(&port.stats.drop_full, n);
                    }
                } else {
                    recycle(refs);
                }
                return;
            }
            _ => {}
        }
        if let Some(r) = refs.take() {
            // Leaving as bytes: the frames a copying writer would have built.
            let ok = segment::materialize(seg, &*r);
            r.recycle();
            if !ok {
                crate::stats::add(&ingress.stats.drop_stale_ref, n);
                return;
            }
        }
        let Some(parsed) = segment::Segment::parse(seg) else {
            return;
        };
        // Software GSO: the standard frames, each in its own buffer.
        let mut frames: Vec<Vec<u8>> = parsed.frames().map(<[u8]>::to_vec).collect();
        self.forward_owned_plain(from, &mut frames);
    }

    fn forward_owned_plain(&self, from: PortId, frames: &mut [Vec<u8>]) {
        let now = self.learned.as_ref().map(|_| Instant::now());
        for chunk in frames.chunks_mut(IO_BATCH) {
            let mut dest = [Dest::Drop; IO_BATCH];
            self.decide_chunk(from, chunk.iter().map(Vec::as_slice), &mut dest, now);
            // An engine on a fabric sends its RoCEv2 frames without an ICRC: a frame that leaves
            // the process (or is captured) gets it now (spec §16.2).
            for (d, f) in dest.iter().zip(chunk.iter_mut()) {
                if self.capture.is_some() && *d != Dest::Drop || self.leaves(*d) {
                    edge::seal(f);
                }
            }
            self.capture_chunk(&dest[..chunk.len()], chunk.iter().map(Vec::as_slice));
            for (d, f) in dest.iter().zip(chunk.iter_mut()) {
                if let Dest::Port(p) = *d {
                    if let Some(Port {
                        kind: PortKind::Device { rx, .. },
                        stats,
                        ..
                    }) = self.ports.get(p)
                    {
                        if rx.push_owned(f) {
                            bump(&stats.out_frames);
                        } else {
                            bump(&stats.drop_full);
                        }
                    }
                }
            }
            let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
            for (s, f) in slices.iter_mut().zip(chunk.iter()) {
                *s = f;
            }
            self.deliver(from, &dest[..chunk.len()], &slices[..chunk.len()], true);
        }
    }

    /// Does a frame sent to `d` reach a device port?
    fn reaches_device(&self, d: Dest) -> bool {
        match d {
            Dest::All => true,
            Dest::Port(p) => matches!(
                self.ports.get(p).map(|p| &p.kind),
                Some(PortKind::Device { .. })
            ),
            Dest::Drop | Dest::Uplinks => false,
        }
    }

    /// Does a frame sent to `d` leave the process (through an uplink)?
    fn leaves(&self, d: Dest) -> bool {
        match d {
            Dest::All | Dest::Uplinks => !self.uplinks.is_empty(),
            Dest::Port(p) => matches!(
                self.ports.get(p).map(|p| &p.kind),
                Some(PortKind::Uplink { .. })
            ),
            Dest::Drop => false,
        }
    }

    /// Capture the frames of a decided chunk that were not dropped (once each, at ingress).
    fn capture_chunk<'a>(&self, dest: &[Dest], frames: impl Iterator<Item = &'a [u8]>) {
        if let Some(c) = &self.capture {
            for (d, f) in dest.iter().zip(frames) {
                if *d != Dest::Drop {
                    c.capture(f);
                }
            }
        }
    }

    /// Decide every frame of a chunk (at most `IO_BATCH`) and count it at ingress.
    fn decide_chunk<'a>(
        &self,
        from: PortId,
        frames: impl Iterator<Item = &'a [u8]>,
        dest: &mut [Dest; IO_BATCH],
        now: Option<Instant>,
    ) {
        let ingress = &self.ports[from];
        for (d, f) in dest.iter_mut().zip(frames) {
            *d = self.decide(from, f, now);
            if *d == Dest::Drop {
                bump(&ingress.stats.drop_spoofed);
                continue;
            }
            bump(&ingress.stats.in_frames);
        }
    }

    /// Deliver a decided chunk; `skip_devices`: unicast device frames were delivered already.
    fn deliver(&self, from: PortId, dest: &[Dest], chunk: &[&[u8]], skip_devices: bool) {
        for (d, f) in dest.iter().zip(chunk) {
            match *d {
                Dest::Port(p) if !skip_devices => self.deliver_to_device(p, f),
                Dest::All => {
                    for (p, port) in self.ports.iter().enumerate() {
                        if p != from && matches!(port.kind, PortKind::Device { .. }) {
                            self.deliver_to_device(p, f);
                        }
                    }
                }
                Dest::Port(_) | Dest::Drop | Dest::Uplinks => {}
            }
        }
        for &u in &self.uplinks {
            if u == from {
                continue;
            }
            let mut out: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
            let mut n = 0;
            for (d, f) in dest.iter().zip(chunk) {
                if matches!(*d, Dest::All | Dest::Uplinks) || *d == Dest::Port(u) {
                    out[n] = f;
                    n += 1;
                }
            }
            if n > 0 {
                self.send_uplink(u, &out[..n]);
            }
        }
    }

    fn send_uplink(&self, id: PortId, frames: &[&[u8]]) {
        let port = &self.ports[id];
        let PortKind::Uplink { uplink } = &port.kind else {
            return;
        };
        let sent = match uplink.send_batch(frames) {
            Ok(n) => n,
            Err(UplinkError::WouldBlock) => 0,
            Err(e) => {
                log::warn!("fabric: uplink send: {e}");
                0
            }
        };
        crate::stats::add(&port.stats.out_frames, sent);
        crate::stats::add(&port.stats.drop_full, frames.len().saturating_sub(sent));
    }
}

#[cfg(test)]
mod tests;
