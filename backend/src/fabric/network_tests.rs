//! Tenant networks in the switch (spec §16.3): unicast, floods, multicast and learning stay in
//! their network; trunk uplinks tag on egress and untag on ingress.

use std::sync::atomic::Ordering::Relaxed;

use super::test_support::{drain, frame, sent, Bed};
use super::*;
use crate::uplink::Uplink;

const A: MacAddr = [0x02, 0, 0, 0, 0, 0xa]; // network 0
const B: MacAddr = [0x02, 0, 0, 0, 0, 0xb]; // network 0
const C: MacAddr = [0x02, 0, 0, 0, 0, 0xc]; // network 5
const D: MacAddr = [0x02, 0, 0, 0, 0, 0xd]; // network 5
const REMOTE: MacAddr = [0x02, 0, 0, 0, 0, 0x77];
const MCAST: MacAddr = [0x01, 0x00, 0x5e, 0, 0, 1];

fn tagged(f: &[u8], vlan: NetId) -> Vec<u8> {
    let mut out = Vec::new();
    network::tag_onto(f, vlan, &mut out);
    out
}

fn bed(uplinks: &[UplinkNets]) -> Bed {
    let mut b = FabricBuilder::new();
    let ids: Vec<PortId> = [(A, 0), (B, 0), (C, 5), (D, 5)]
        .iter()
        .map(|&(mac, net)| {
            b.add_device_with(
                mac,
                DeviceOptions {
                    security: None,
                    net,
                },
            )
            .unwrap()
        })
        .collect();
    // Ports A, B (network 0), C, D (network 5).
    Bed::build(b, &ids, uplinks.len(), |b, i, r| {
        b.add_uplink_with(r, uplinks[i].clone())
    })
}

#[test]
fn unicast_never_crosses_networks() {
    let t = bed(&[UplinkNets::Untagged(0), UplinkNets::Tagged(vec![5])]);
    // A (network 0) to C's MAC (network 5): C is not on A's network, so this is an unknown
    // unicast of network 0: out of the uplink that carries network 0, not to C.
    let f = frame(C, A, 1);
    t.ports[0].send(&f).unwrap();
    assert!(drain(&t.ports[2]).is_empty());
    assert_eq!(sent(&t.uplinks[0].1), vec![f]);
    assert!(sent(&t.uplinks[1].1).is_empty());
    // Within a network, as before; also for engine (owned) frames.
    let f = frame(D, C, 2);
    t.ports[2].send_frames(&mut [f.clone()]).unwrap();
    assert_eq!(drain(&t.ports[3]), vec![f]);
    let f = frame(A, D, 3);
    t.ports[3].send_frames(&mut [f]).unwrap();
    assert!(drain(&t.ports[0]).is_empty());
}

#[test]
fn floods_and_multicast_stay_in_their_network() {
    let t = bed(&[UplinkNets::Untagged(0), UplinkNets::Tagged(vec![5])]);
    for dst in [[0xff; 6], MCAST] {
        let f = frame(dst, A, 4);
        t.ports[0].send(&f).unwrap();
        assert_eq!(drain(&t.ports[1]), vec![f.clone()], "B, same network");
        assert!(drain(&t.ports[2]).is_empty() && drain(&t.ports[3]).is_empty());
        assert_eq!(sent(&t.uplinks[0].1), vec![f]);
        assert!(
            sent(&t.uplinks[1].1).is_empty(),
            "the trunk does not carry network 0"
        );
        let f = frame(dst, C, 5);
        t.ports[2].send(&f).unwrap();
        assert_eq!(drain(&t.ports[3]), vec![f.clone()]);
        assert!(drain(&t.ports[0]).is_empty() && drain(&t.ports[1]).is_empty());
        assert!(sent(&t.uplinks[0].1).is_empty());
        assert_eq!(
            sent(&t.uplinks[1].1),
            vec![tagged(&f, 5)],
            "tagged on the trunk"
        );
    }
}

#[test]
fn a_trunk_untags_by_vlan_and_drops_other_frames() {
    let t = bed(&[UplinkNets::Tagged(vec![5, 9])]);
    let (u, _) = t.uplinks[0].clone();
    let to_d = frame(D, REMOTE, 6);
    let bc = frame([0xff; 6], REMOTE, 7);
    t.fabric.forward(u, &[&tagged(&to_d, 5), &tagged(&bc, 5)]);
    assert_eq!(
        drain(&t.ports[3]),
        vec![to_d, bc.clone()],
        "untagged for the device"
    );
    assert_eq!(drain(&t.ports[2]), vec![bc]);
    assert!(drain(&t.ports[0]).is_empty() && drain(&t.ports[1]).is_empty());
    // VLAN 9 is carried but has no device: nothing delivered, nothing dropped as unknown.
    // Untagged, VLAN 0 and VLAN 7 are not the trunk's: dropped and counted.
    let to_a = frame(A, REMOTE, 8);
    t.fabric.forward(
        u,
        &[
            &tagged(&to_a, 9),
            &to_a,
            &tagged(&to_a, 0),
            &tagged(&to_a, 7),
        ],
    );
    assert!(drain(&t.ports[0]).is_empty());
    let s = t.fabric.port_stats(u).unwrap();
    assert_eq!(s.drop_unknown_vlan.load(Relaxed), 3);
    assert_eq!(s.in_frames.load(Relaxed), 3);
}

#[test]
fn learning_is_per_network() {
    // Two uplinks for each network; REMOTE is seen on the second uplink of network 0 and on
    // the first of network 5.
    let t = bed(&[
        UplinkNets::Untagged(0),
        UplinkNets::Untagged(0),
        UplinkNets::Tagged(vec![5]),
        UplinkNets::Tagged(vec![5]),
    ]);
    let u = |i: usize| t.uplinks[i].0;
    t.fabric.forward(u(1), &[&frame(A, REMOTE, 9)]);
    t.fabric.forward(u(2), &[&tagged(&frame(C, REMOTE, 10), 5)]);
    assert_eq!(drain(&t.ports[0]).len(), 1);
    assert_eq!(drain(&t.ports[2]).len(), 1);
    let from_a = frame(REMOTE, A, 11);
    t.ports[0].send(&from_a).unwrap();
    let from_c = frame(REMOTE, C, 12);
    t.ports[2].send(&from_c).unwrap();
    let got: Vec<Vec<Vec<u8>>> = t.uplinks.iter().map(|(_, r)| sent(r)).collect();
    assert_eq!(
        got,
        vec![vec![], vec![from_a], vec![tagged(&from_c, 5)], vec![]],
        "each network's frame goes where REMOTE was learned in that network"
    );
}

#[test]
fn counters_name_each_ports_networks() {
    let t = bed(&[UplinkNets::Tagged(vec![5, 9])]);
    t.ports[2].send(&frame(D, C, 13)).unwrap();
    let text = t.fabric.render_stats();
    for needle in [
        "vrdma_fabric_port_network{port=\"port2\",kind=\"device\",net=\"5\"} 1",
        "vrdma_fabric_port_network{port=\"port4\",kind=\"uplink\",net=\"9\"} 1",
        "vrdma_fabric_network_frames_total{net=\"5\",dir=\"in\"} 1",
        "vrdma_fabric_network_frames_total{net=\"5\",dir=\"out\"} 1",
        "vrdma_fabric_network_frames_total{net=\"0\",dir=\"in\"} 0",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}
