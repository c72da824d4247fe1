//! [`FabricPortStats`]: what one fabric port counts (spec §16.2–§16.4), read by the stats
//! socket (`stats_text.rs`) and by tests.

use std::sync::atomic::AtomicU64;

use super::Violation;

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
    /// Frames from this port dropped at a full device queue where this port held the largest
    /// share (spec §16.4; the same frames count as `drop_full` at the destination).
    pub drop_over_share: AtomicU64,
    /// Broadcast and multicast frames from this port beyond its rate bound (spec §16.4).
    pub drop_bcast_rate: AtomicU64,
    /// Frames from this (device) port refused by its port security (spec §16.3), per
    /// [`Violation`] ([`Violation::index`]).
    pub drop_security: [AtomicU64; Violation::ALL.len()],
    /// Frames from this (uplink) port that did not go out of another uplink because
    /// forwarding between uplinks is off (spec §16.3; rule 6).
    pub drop_uplink_to_uplink: AtomicU64,
    /// Frames from this (trunk uplink) port without an 802.1Q tag of one of its networks.
    pub drop_unknown_vlan: AtomicU64,
}
