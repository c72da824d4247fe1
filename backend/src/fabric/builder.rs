//! [`FabricBuilder`]: the fabric's ports (devices with their network and address list,
//! uplinks with theirs), fixed before the fabric is built (spec §16.2, §16.3).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
use std::sync::{Arc, Mutex};

use super::{
    group_rate, Fabric, FabricError, FabricPortStats, MacTable, NetId, Port, PortId, PortKind,
    PortSecurity, RxQueue, UplinkNets,
};
use crate::uplink::{PcapWriter, Uplink};
use crate::wire::eth::MacAddr;

/// How a device port is attached (spec §16.3).
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// The device's address list: `Some` turns on port security.
    pub security: Option<PortSecurity>,
    /// The device's network (default 0).
    pub net: NetId,
}

/// Collects the ports, then [`FabricBuilder::build`]s the fabric.
#[derive(Default)]
pub struct FabricBuilder {
    ports: Vec<Port>,
    capture: Option<Arc<PcapWriter>>,
    between_uplinks: bool,
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

    /// A device port with the device's (unicast) MAC, checked on its source MAC only.
    pub fn add_device(&mut self, mac: MacAddr) -> Result<PortId, FabricError> {
        self.add_device_with(mac, DeviceOptions::default())
    }

    /// A device port with the device's (unicast) MAC and `options` (spec §16.3).
    pub fn add_device_with(
        &mut self,
        mac: MacAddr,
        options: DeviceOptions,
    ) -> Result<PortId, FabricError> {
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
                refs: AtomicU8::new(super::RefsScope::Off as u8),
                slot: AtomicUsize::new(0),
                security: options.security.map(Box::new),
                net: options.net,
            },
            stats: FabricPortStats::default(),
            group_rate: group_rate::GroupRate::per_class(),
            name: format!("port{}", self.ports.len()),
        });
        Ok(self.ports.len() - 1)
    }

    /// An uplink port. Its frames come in through a [`Bridge`] ([`Fabric::start_bridges`]).
    pub fn add_uplink(&mut self, uplink: Arc<dyn Uplink>) -> PortId {
        self.add_uplink_with(uplink, UplinkNets::default())
    }

    /// An uplink port carrying `nets` (spec §16.3).
    pub fn add_uplink_with(&mut self, uplink: Arc<dyn Uplink>, nets: UplinkNets) -> PortId {
        self.ports.push(Port {
            kind: PortKind::Uplink { uplink, nets },
            stats: FabricPortStats::default(),
            group_rate: group_rate::GroupRate::per_class(),
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

    /// Let frames from one uplink port leave through another (rule 6; off by default,
    /// `--forward-between-uplinks`).
    pub fn forward_between_uplinks(&mut self, on: bool) {
        self.between_uplinks = on;
    }

    pub fn build(self) -> Arc<Fabric> {
        let mut devices = HashMap::new();
        let mut uplinks = Vec::new();
        let mut devices_of_net: HashMap<NetId, Vec<PortId>> = HashMap::new();
        let mut uplinks_of_net: HashMap<NetId, Vec<PortId>> = HashMap::new();
        for (i, p) in self.ports.iter().enumerate() {
            match &p.kind {
                PortKind::Device { mac, net, .. } => {
                    devices.insert(*mac, i);
                    devices_of_net.entry(*net).or_default().push(i);
                }
                PortKind::Uplink { nets, .. } => {
                    uplinks.push(i);
                    for n in nets.list() {
                        uplinks_of_net.entry(n).or_default().push(i);
                    }
                }
            }
        }
        // Learning only where a network has two or more uplinks to choose between.
        let learned = uplinks_of_net
            .iter()
            .filter(|(_, carriers)| carriers.len() > 1)
            .map(|(&n, _)| (n, Mutex::new(MacTable::new())))
            .collect();
        Arc::new(Fabric {
            ports: self.ports,
            devices,
            uplinks,
            devices_of_net,
            uplinks_of_net,
            learned,
            capture: self.capture,
            between_uplinks: self.between_uplinks,
        })
    }
}
