//! The fabric's counters in the Prometheus text format (spec §16.2, §16.3).

use super::{Fabric, NetId, Port, PortKind, Violation};

impl Fabric {
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
             by-reference segment the sender fenced before it left, over_share = the port's \
             frames dropped at a full device queue where it held the largest share (counted \
             again as full at the destination), bcast_rate = broadcast or multicast beyond the \
             port's rate bound (spec §16.4); vlan_tagged, spoofed_arp, \
             spoofed_ip, spoofed_nd, spoofed_gid = refused by a device port's address list \
             (spec §16.3); uplink_to_uplink = a frame from an uplink not forwarded to another \
             uplink (off by default); foreign_source = a UDP datagram from another source than \
             the uplink's remote (spec §16.3)."
        );
        let _ = writeln!(out, "# TYPE vrdma_fabric_drops_total counter");
        for p in &self.ports {
            for (why, c) in [
                ("spoofed", &p.stats.drop_spoofed),
                ("full", &p.stats.drop_full),
                ("bad_icrc", &p.stats.drop_bad_icrc),
                ("stale_ref", &p.stats.drop_stale_ref),
                ("over_share", &p.stats.drop_over_share),
                ("bcast_rate", &p.stats.drop_bcast_rate),
                ("uplink_to_uplink", &p.stats.drop_uplink_to_uplink),
                ("unknown_vlan", &p.stats.drop_unknown_vlan),
            ]
            .into_iter()
            .chain(
                Violation::ALL
                    .iter()
                    .map(|v| (v.label(), &p.stats.drop_security[v.index()])),
            ) {
                let _ = writeln!(
                    out,
                    "vrdma_fabric_drops_total{{port=\"{}\",kind=\"{}\",reason=\"{why}\"}} {}",
                    p.name,
                    kind(p),
                    c.load(Relaxed)
                );
            }
            if let PortKind::Uplink { uplink, .. } = &p.kind {
                let _ = writeln!(
                    out,
                    "vrdma_fabric_drops_total{{port=\"{}\",kind=\"uplink\",reason=\"foreign_source\"}} {}",
                    p.name,
                    uplink.refused_sources()
                );
            }
        }
        self.render_networks(&mut out);
        out
    }

    /// Spec §16.3: which networks each port carries, and per network the frames its device
    /// ports sent into and received from the fabric.
    fn render_networks(&self, out: &mut String) {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let _ = writeln!(
            out,
            "# HELP vrdma_fabric_port_network The tenant networks of each fabric port (spec \
             §16.3): 1 per port and network it belongs to (a device) or carries (an uplink)."
        );
        let _ = writeln!(out, "# TYPE vrdma_fabric_port_network gauge");
        let mut per_net: std::collections::BTreeMap<NetId, (u64, u64)> = Default::default();
        for p in &self.ports {
            let (kind, nets) = match &p.kind {
                PortKind::Device { net, .. } => {
                    let e = per_net.entry(*net).or_default();
                    e.0 += p.stats.in_frames.load(Relaxed);
                    e.1 += p.stats.out_frames.load(Relaxed);
                    ("device", vec![*net])
                }
                PortKind::Uplink { nets, .. } => ("uplink", nets.list()),
            };
            for net in nets {
                let _ = writeln!(
                    out,
                    "vrdma_fabric_port_network{{port=\"{}\",kind=\"{kind}\",net=\"{net}\"}} 1",
                    p.name
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP vrdma_fabric_network_frames_total Frames per tenant network: in = sent by \
             its devices into the fabric, out = delivered to its devices."
        );
        let _ = writeln!(out, "# TYPE vrdma_fabric_network_frames_total counter");
        for (net, (i, o)) in per_net {
            for (dir, c) in [("in", i), ("out", o)] {
                let _ = writeln!(
                    out,
                    "vrdma_fabric_network_frames_total{{net=\"{net}\",dir=\"{dir}\"}} {c}"
                );
            }
        }
    }
}
