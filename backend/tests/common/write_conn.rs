//! One RC connection between two nodes with a patterned source MR on one side and a
//! destination MR on the other: what the multi-connection engine tests and benches write over.

use std::sync::Arc;

use vrdma_backend::device::Device;
use vrdma_backend::fabric::FabricBuilder;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::engine::{Engine, EngineOptions};
use vrdma_backend::transport::timers::set_workers;

use super::{detach, pattern, MrPair, Node, QpH, QpPair, QpPairSpec, RingH, RtsAttrs};

/// See the module documentation.
pub struct WriteConn {
    pub qa: QpH,
    pub cqa: RingH,
    pub src: u64,
    pub dst: u64,
    pub ka: u32,
    pub kb: u32,
    pub len: u64,
    /// What `src` holds (pattern `seed`).
    pub data: Vec<u8>,
}

impl WriteConn {
    /// A PD, CQ (256) and RC QP on each side, connected, and a `len`-byte MR on each: a's
    /// filled with pattern `seed`.
    pub fn new(a: &mut Node, b: &mut Node, len: u64, seed: u64) -> WriteConn {
        let pda = a.create_pd();
        let pdb = b.create_pd();
        let QpPair { qa, cqa, .. } =
            QpPair::open(a, b, pda, pdb, QpPairSpec::rc(256, RtsAttrs::mtu(5)));
        let MrPair { src, ka, dst, kb } = MrPair::new(a, b, pda, pdb, len);
        let data = pattern(seed, len as usize);
        a.write(src, &data);
        WriteConn {
            qa,
            cqa,
            src,
            dst,
            ka,
            kb,
            len,
            data,
        }
    }
}

/// Devices a and b on one fabric (ports with segments), `workers` engine workers each, with
/// WRITE connections from a to b.
pub struct FabricPair {
    pub a: Node,
    pub b: Node,
    pub conns: Vec<WriteConn>,
    pub da: Arc<HandoffLock<Device>>,
    pub db: Arc<HandoffLock<Device>>,
    pub ea: Engine,
    pub eb: Engine,
}

/// [`FabricPair`] with `conns` connections of `len` bytes (a's MRs filled with patterns from
/// `seed`); `refs`: RC WRITE payloads cross the fabric by reference.
pub fn fabric_pair(conns: u64, len: u64, seed: u64, workers: usize, refs: bool) -> FabricPair {
    let mut a = Node::new(1, 64, 9000);
    let mut b = Node::new(2, 64, 9000);
    set_workers(&mut a.dev, workers);
    set_workers(&mut b.dev, workers);
    let conns = (0..conns)
        .map(|i| WriteConn::new(&mut a, &mut b, len, seed + i))
        .collect();
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(a.mac).expect("port a");
    let pb = fb.add_device(b.mac).expect("port b");
    let fabric = fb.build();
    let opts = EngineOptions {
        threads: workers,
        ..Default::default()
    };
    let start = |dev: &Arc<HandoffLock<Device>>, p| {
        let port = fabric.device_port(p).expect("port").with_segments();
        let port = if refs { port.with_payload_refs() } else { port };
        Engine::start_with(dev.clone(), Arc::new(port), opts).expect("engine")
    };
    let (da, db) = (detach(&mut a), detach(&mut b));
    let (ea, eb) = (start(&da, pa), start(&db, pb));
    FabricPair {
        a,
        b,
        conns,
        da,
        db,
        ea,
        eb,
    }
}
