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
//!    with a local device's MAC. Otherwise dropped (`drop_spoofed`). A device port with an
//!    address list also sends only its own ARP / IP / ND / RoCE addresses and no VLAN tag
//!    ([`port_security`], spec §16.3; `drop_security`, per reason).
//! 3. Group destination (broadcast, multicast): every other port.
//! 4. A local device's MAC: that device (never back to the port it came from).
//! 5. Other unicast: the uplink port the MAC was learned on (learning only with two or more
//!    uplinks, [`MacTable`]), else every uplink port but the ingress one.
//! 6. A frame from an uplink port never leaves through another uplink port unless the fabric
//!    was built with [`FabricBuilder::forward_between_uplinks`] (spec §16.3 "Uplink trust";
//!    `drop_uplink_to_uplink`): the daemon is not a bridge between the networks it is
//!    attached to.
//!
//! Networks (spec §16.3, [`network`]): every port belongs to one tenant network (a device) or
//! carries one or several (an uplink, several as 802.1Q VLANs). The rules above apply within
//! the frame's network only: a frame, a flood, a multicast and a learned MAC never cross
//! networks (learning is per network). A port's network is fixed when the fabric is built; the
//! switch compares it per frame.
//!
//! No spanning tree: two uplinks bridged to the same segment make a loop, as with any switch.
//!
//! Fair share (spec §16.4): a device's [`RxQueue`] keeps each sending port's frames apart and a
//! full queue drops the excess of the port holding the most (counted `over_share` at the
//! sender, `full` at the destination); each ingress port's broadcasts and multicasts pass a
//! token bucket first ([`group_rate::GroupRate`], counted `bcast_rate`).
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
mod builder;
pub mod edge;
pub mod group_rate;
pub mod learning;
pub mod network;
pub mod port;
pub mod port_security;
mod port_stats;
mod refs_scope;
pub mod rxqueue;
mod stats_text;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use thiserror::Error;

pub use bridge::Bridge;
pub use builder::{DeviceOptions, FabricBuilder};
pub use learning::MacTable;
pub use network::{NetId, UplinkNets};
pub use port::DevicePort;
pub use port_security::{PortSecurity, Violation};
pub use port_stats::FabricPortStats;
use refs_scope::gathered;
pub(crate) use refs_scope::RefsScope;
pub use rxqueue::RxQueue;

use crate::stats::bump;
use crate::sync::lock;
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

enum PortKind {
    /// `segments`: the port's engine takes fabric segments as they are (opt-in,
    /// [`DevicePort::with_segments`]: only an engine directly on the port knows to split them).
    Device {
        mac: MacAddr,
        rx: RxQueue,
        segments: AtomicBool,
        /// With `segments`: to which devices its engine's payloads go by reference (a
        /// [`RefsScope`] as `u8`; [`DevicePort::with_payload_refs`],
        /// [`DevicePort::with_payload_refs_on_slot`]).
        refs: AtomicU8,
        /// The engine group slot whose threads run the port's engine, plus one (0: threads of
        /// its own).
        slot: AtomicUsize,
        /// `Some`: the device's address list (spec §16.3); `None`: its source MAC only. Boxed:
        /// the list is sized for its bound, and only ports with one pay for it.
        security: Option<Box<PortSecurity>>,
        /// The device's network.
        net: NetId,
    },
    Uplink {
        uplink: Arc<dyn Uplink>,
        nets: UplinkNets,
    },
}

struct Port {
    kind: PortKind,
    stats: FabricPortStats,
    /// Its broadcast and multicast rate bounds (spec §16.4): netdev and RoCEv2 frames.
    group_rate: [group_rate::GroupRate; 2],
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
    /// The device ports of each network, in port order: where its floods go.
    devices_of_net: HashMap<NetId, Vec<PortId>>,
    /// The uplink ports that carry each network, in port order.
    uplinks_of_net: HashMap<NetId, Vec<PortId>>,
    /// A table for each network that two or more uplinks carry.
    learned: HashMap<NetId, Mutex<MacTable>>,
    capture: Option<Arc<PcapWriter>>,
    /// Rule 6: frames from an uplink port may leave through another uplink port.
    between_uplinks: bool,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("ports", &self.ports.len())
            .field("uplinks", &self.uplinks)
            .finish_non_exhaustive()
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
            if let PortKind::Uplink { uplink, .. } = &self.ports[id].kind {
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

    pub(crate) fn set_takes_segments(&self, id: PortId, on: bool) {
        if let Some(PortKind::Device { segments, .. }) = self.ports.get(id).map(|p| &p.kind) {
            segments.store(on, Ordering::Relaxed);
        }
    }

    /// The switching rules on the Ethernet addresses of `frame` (module documentation).
    /// `net`: the frame's network (its port's, or its tag's on a trunk uplink).
    fn decide(&self, from: PortId, net: NetId, frame: &[u8], now: Option<Instant>) -> Dest {
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
        let learning = now.and_then(|now| Some((self.learned.get(&net)?, now)));
        match &port.kind {
            PortKind::Device { mac, .. } if *mac != s => return Dest::Drop,
            PortKind::Device { .. } => {}
            PortKind::Uplink { .. } => {
                if self.devices.contains_key(&s) {
                    return Dest::Drop;
                }
                if let Some((t, now)) = learning {
                    lock(t).learn(s, from, now);
                }
            }
        }
        if is_multicast(&d) {
            return Dest::All;
        }
        if let Some(&p) = self.devices.get(&d) {
            if self.device_net(p) == Some(net) {
                return if p == from { Dest::Drop } else { Dest::Port(p) };
            }
        }
        if let Some((t, now)) = learning {
            if let Some(p) = lock(t).lookup(&d, now) {
                return if p == from { Dest::Drop } else { Dest::Port(p) };
            }
        }
        Dest::Uplinks
    }

    /// The network of device port `id`.
    fn device_net(&self, id: PortId) -> Option<NetId> {
        match self.ports.get(id)?.kind {
            PortKind::Device { net, .. } => Some(net),
            PortKind::Uplink { .. } => None,
        }
    }

    /// Does port `id` carry network `net`?
    fn carries(&self, id: PortId, net: NetId) -> bool {
        match self.ports.get(id).map(|p| &p.kind) {
            Some(PortKind::Device { net: n, .. }) => *n == net,
            Some(PortKind::Uplink { nets, .. }) => nets.carries(net),
            None => false,
        }
    }

    /// `Instant::now()` if any network learns.
    fn learning_now(&self) -> Option<Instant> {
        (!self.learned.is_empty()).then(Instant::now)
    }

    fn deliver_to_device(&self, from: PortId, to: PortId, frame: &[u8]) {
        let Some(port) = self.ports.get(to) else {
            return;
        };
        if let PortKind::Device { rx, .. } = &port.kind {
            self.count_admission(from, to, 1, rx.push(from, frame));
        }
    }

    /// Count what a device queue did with `frames` frames from `from` (spec §16.4): queued,
    /// or dropped as `from`'s excess, and the frames it pushed out, each as its sender's.
    fn count_admission(&self, from: PortId, to: PortId, frames: usize, a: rxqueue::Admission) {
        let stats = &self.ports[to].stats;
        if a.queued {
            crate::stats::add(&stats.out_frames, frames);
        } else {
            crate::stats::add(&stats.drop_full, frames);
            if let Some(p) = self.ports.get(from) {
                crate::stats::add(&p.stats.drop_over_share, frames);
            }
        }
        for (sender, n) in a.evicted {
            crate::stats::add(&stats.drop_full, n);
            if let Some(p) = self.ports.get(sender) {
                crate::stats::add(&p.stats.drop_over_share, n);
            }
        }
    }

    /// Switch `frames` that entered on port `from` (module documentation). Runs on the
    /// caller's thread: device deliveries are queue pushes, uplink deliveries the uplink's
    /// `send_batch`. Never blocks on a full queue or a busy uplink (those frames are dropped
    /// and counted).
    pub fn forward(&self, from: PortId, frames: &[&[u8]]) {
        let Some(port) = self.ports.get(from) else {
            return;
        };
        let net = match &port.kind {
            PortKind::Device { net, .. } => *net,
            PortKind::Uplink {
                nets: UplinkNets::Untagged(net),
                ..
            } => *net,
            PortKind::Uplink {
                nets: UplinkNets::Tagged(vlans),
                ..
            } => return self.forward_from_trunk(from, vlans, &port.stats, frames),
        };
        for chunk in frames.chunks(IO_BATCH) {
            self.forward_chunk(from, &[net; IO_BATCH][..chunk.len()], chunk);
        }
    }

    /// Frames from a trunk uplink: each untagged by its tag and switched in that network;
    /// without a tag of one of the uplink's networks, dropped and counted.
    fn forward_from_trunk(
        &self,
        from: PortId,
        vlans: &[NetId],
        stats: &FabricPortStats,
        frames: &[&[u8]],
    ) {
        UNTAGGED.with(|cell| {
            let mut untagged = cell.borrow_mut();
            for chunk in frames.chunks(IO_BATCH) {
                let mut nets = [0; IO_BATCH];
                let mut n = 0;
                untagged.clear();
                for f in chunk {
                    match network::vlan_of(f) {
                        Some(v) if vlans.binary_search(&v).is_ok() => {
                            nets[n] = v;
                            n += 1;
                            untagged.push_with(|out| network::untag_onto(f, out));
                        }
                        _ => bump(&stats.drop_unknown_vlan),
                    }
                }
                let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
                let n = untagged.slices(&mut slices);
                self.forward_chunk(from, &nets[..n], &slices[..n]);
            }
        });
    }

    /// Switch one chunk (at most `IO_BATCH`) of borrowed frames, frame `i` in network `nets[i]`.
    fn forward_chunk(&self, from: PortId, nets: &[NetId], chunk: &[&[u8]]) {
        let now = self.learning_now();
        let from_uplink = matches!(self.ports[from].kind, PortKind::Uplink { .. });
        {
            let mut dest = [Dest::Drop; IO_BATCH];
            self.decide_chunk(from, nets, chunk.iter().copied(), &mut dest, now);
            for (d, f) in dest.iter_mut().zip(chunk) {
                // The devices trust what the fabric hands them: check a frame from the network
                // once, here (spec §16.2).
                if from_uplink && self.reaches_device(*d) && !edge::intact(f) {
                    bump(&self.ports[from].stats.drop_bad_icrc);
                    *d = Dest::Drop;
                }
            }
            self.capture_chunk(&dest[..chunk.len()], chunk.iter().copied());
            self.deliver(from, &dest[..chunk.len()], nets, chunk, false);
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
        let now = self.learning_now();
        let net = self.device_net(from).unwrap_or_default();
        let d = self.decide(from, net, seg, now);
        // Port security looks at every frame of the segment (the engine builds them all from
        // one QP's addresses, so one refused frame refuses the segment).
        if d != Dest::Drop {
            if let Some(v) = parsed.frames().find_map(|f| self.violation(from, f)) {
                crate::stats::add(&ingress.stats.drop_security[v.index()], n);
                recycle(refs);
                return;
            }
        }
        match d {
            Dest::Drop => {
                crate::stats::add(&ingress.stats.drop_spoofed, n);
                recycle(refs);
                return;
            }
            Dest::Port(p) if self.capture.is_none() && self.takes_segments(p) => {
                // Outside the sender's scope the segment goes on as bytes, copied here on the
                // sender's thread.
                if !self.keeps_refs(from, p) && !gathered(seg, refs.take(), &ingress.stats, n) {
                    return;
                }
                crate::stats::add(&ingress.stats.in_frames, n);
                self.push_segment_to(from, p, seg, refs, n);
                return;
            }
            _ => {}
        }
        if gathered(seg, refs, &ingress.stats, n) {
            self.forward_as_frames(from, seg);
        }
    }

    /// A segment (of `n` frames) for a device port that takes segments: handed to its receive
    /// queue whole, by reference if it came so.
    fn push_segment_to(
        &self,
        from: PortId,
        to: PortId,
        seg: &mut Vec<u8>,
        refs: Option<Box<dyn segment::PayloadRefs>>,
        n: usize,
    ) {
        let PortKind::Device { rx, .. } = &self.ports[to].kind else {
            if let Some(r) = refs {
                r.recycle();
            }
            return;
        };
        let a = match refs {
            None => rx.push_segment(from, seg),
            Some(r) => {
                let (a, back) = rx.push_segment_refs(from, seg, r);
                if let Err(r) = back {
                    r.recycle();
                }
                a
            }
        };
        self.count_admission(from, to, n, a);
    }

    /// Software GSO: a segment of bytes goes on as the standard frames, each in its own buffer.
    fn forward_as_frames(&self, from: PortId, seg: &[u8]) {
        let Some(parsed) = segment::Segment::parse(seg) else {
            return;
        };
        let mut frames: Vec<Vec<u8>> = parsed.frames().map(<[u8]>::to_vec).collect();
        self.forward_owned_plain(from, &mut frames);
    }

    fn forward_owned_plain(&self, from: PortId, frames: &mut [Vec<u8>]) {
        let now = self.learning_now();
        // Owned frames come from a device's engine: all in the device's network.
        let nets = [self.device_net(from).unwrap_or_default(); IO_BATCH];
        for chunk in frames.chunks_mut(IO_BATCH) {
            let nets = &nets[..chunk.len()];
            let mut dest = [Dest::Drop; IO_BATCH];
            self.decide_chunk(from, nets, chunk.iter().map(Vec::as_slice), &mut dest, now);
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
                        ..
                    }) = self.ports.get(p)
                    {
                        self.count_admission(from, p, 1, rx.push_owned(from, f));
                    }
                }
            }
            let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
            for (s, f) in slices.iter_mut().zip(chunk.iter()) {
                *s = f;
            }
            self.deliver(
                from,
                &dest[..chunk.len()],
                nets,
                &slices[..chunk.len()],
                true,
            );
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

    /// Would a frame from port `from` sent to `d` go out of an uplink port other than `from`?
    fn reaches_other_uplink(&self, from: PortId, net: NetId, d: Dest) -> bool {
        match d {
            Dest::All | Dest::Uplinks => self
                .uplinks_of_net
                .get(&net)
                .is_some_and(|carriers| carriers.iter().any(|&u| u != from)),
            Dest::Port(p) => p != from && self.uplinks.contains(&p),
            Dest::Drop => false,
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
        nets: &[NetId],
        frames: impl Iterator<Item = &'a [u8]>,
        dest: &mut [Dest; IO_BATCH],
        now: Option<Instant>,
    ) {
        let ingress = &self.ports[from];
        let mut group_now = None;
        let between_uplinks_refused =
            !self.between_uplinks && matches!(ingress.kind, PortKind::Uplink { .. });
        for ((d, f), &net) in dest.iter_mut().zip(frames).zip(nets) {
            *d = self.decide(from, net, f, now);
            if *d == Dest::Drop {
                bump(&ingress.stats.drop_spoofed);
                continue;
            }
            if let Some(v) = self.violation(from, f) {
                bump(&ingress.stats.drop_security[v.index()]);
                *d = Dest::Drop;
                continue;
            }
            if between_uplinks_refused && self.reaches_other_uplink(from, net, *d) {
                // Rule 6: counted once per frame; what also reaches a device goes on there.
                bump(&ingress.stats.drop_uplink_to_uplink);
                if !self.reaches_device(*d) {
                    *d = Dest::Drop;
                    continue;
                }
            }
            if *d == Dest::All {
                let t = *group_now.get_or_insert_with(|| now.unwrap_or_else(Instant::now));
                let class = rxqueue::Class::of(f);
                if !ingress.group_rate[class as usize].admit(t) {
                    bump(&ingress.stats.drop_bcast_rate);
                    *d = Dest::Drop;
                    continue;
                }
            }
            bump(&ingress.stats.in_frames);
        }
    }

    /// Port security (spec §16.3): why device port `from` may not send `frame`, if it may not.
    /// Nothing for a port without an address list or an uplink port.
    fn violation(&self, from: PortId, frame: &[u8]) -> Option<Violation> {
        match &self.ports.get(from)?.kind {
            PortKind::Device {
                security: Some(policy),
                ..
            } => policy.check(frame).err(),
            _ => None,
        }
    }

    /// Deliver a decided chunk; `skip_devices`: unicast device frames were delivered already.
    /// Frame `i` is in network `nets[i]`: a flood reaches that network's ports only.
    fn deliver(
        &self,
        from: PortId,
        dest: &[Dest],
        nets: &[NetId],
        chunk: &[&[u8]],
        skip_devices: bool,
    ) {
        for ((d, f), &net) in dest.iter().zip(chunk).zip(nets) {
            match *d {
                Dest::Port(p) if !skip_devices => self.deliver_to_device(from, p, f),
                Dest::All => {
                    for &p in self.devices_of_net.get(&net).map_or(&[][..], Vec::as_slice) {
                        if p != from {
                            self.deliver_to_device(from, p, f);
                        }
                    }
                }
                Dest::Port(_) | Dest::Drop | Dest::Uplinks => {}
            }
        }
        let from_uplink = matches!(self.ports[from].kind, PortKind::Uplink { .. });
        for &u in &self.uplinks {
            if u == from || from_uplink && !self.between_uplinks {
                continue;
            }
            let mut out: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
            let mut out_nets = [0; IO_BATCH];
            let mut n = 0;
            for ((d, f), &net) in dest.iter().zip(chunk).zip(nets) {
                if matches!(*d, Dest::All | Dest::Uplinks) && self.carries(u, net)
                    || *d == Dest::Port(u)
                {
                    out[n] = f;
                    out_nets[n] = net;
                    n += 1;
                }
            }
            if n > 0 {
                self.send_uplink(u, &out[..n], &out_nets[..n]);
            }
        }
    }

    /// Frame `i` is in network `nets[i]`: tagged with it on a trunk uplink.
    fn send_uplink(&self, id: PortId, frames: &[&[u8]], nets: &[NetId]) {
        let port = &self.ports[id];
        let PortKind::Uplink {
            uplink,
            nets: carried,
        } = &port.kind
        else {
            return;
        };
        let sent = match carried {
            UplinkNets::Untagged(_) => send_batch(&**uplink, frames),
            UplinkNets::Tagged(_) => TAGGED.with(|cell| {
                let mut tagged = cell.borrow_mut();
                tagged.clear();
                for (f, &net) in frames.iter().zip(nets) {
                    tagged.push_with(|out| network::tag_onto(f, net, out));
                }
                let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
                let n = tagged.slices(&mut slices);
                send_batch(&**uplink, &slices[..n])
            }),
        };
        crate::stats::add(&port.stats.out_frames, sent);
        crate::stats::add(&port.stats.drop_full, frames.len().saturating_sub(sent));
    }
}

thread_local! {
    /// The frames of a trunk uplink's chunk without their tags ([`Fabric::forward_from_trunk`]).
    static UNTAGGED: RefCell<network::RewrittenChunk> = RefCell::default();
    /// A chunk's frames tagged for a trunk uplink ([`Fabric::send_uplink`]); a separate buffer:
    /// an untagged chunk is still borrowed while it is delivered to the uplinks.
    static TAGGED: RefCell<network::RewrittenChunk> = RefCell::default();
}

/// Hand `frames` to `uplink`; how many it took (a busy uplink takes none).
fn send_batch(uplink: &dyn Uplink, frames: &[&[u8]]) -> usize {
    match uplink.send_batch(frames) {
        Ok(n) => n,
        Err(UplinkError::WouldBlock) => 0,
        Err(e) => {
            guest_warn!("fabric: uplink send: {e}");
            0
        }
    }
}

#[cfg(test)]
mod test_support;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fair_tests;

#[cfg(test)]
mod security_tests;

#[cfg(test)]
mod network_tests;
