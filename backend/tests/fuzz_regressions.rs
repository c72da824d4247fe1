//! Findings of the coverage-guided fuzz targets (`fuzz/`, `make fuzz`), each kept as a plain test
//! of the outcome the spec defines for it.

mod common;

use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use vhost_user_backend::VringT;
use vm_memory::{Bytes, GuestAddress};
use vrdma_backend::vhost_user::{
    GuestMemoryAtomic, GuestMemoryMmap, VirtqOutput, Vring, VQ_ETH_RX, VQ_EVENT,
};
use vrdma_spec::*;

const QSIZE: u16 = 16;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const BUF: u64 = 0x3000;
const F_WRITE: u16 = 2;

/// A device → driver queue (event or eth rx) whose avail index the driver set far beyond the
/// queue size (found by the `vring` target, with and without EVENT_IDX): nothing can be popped,
/// yet `enable_notification` keeps reporting buffers, and `OutQueue::deliver` used to loop on
/// that forever, holding the queue lock — the engine thread pushing the next event or frame
/// hung with it. Now the record waits in the backlog (spec §16: a corrupt ring has an outcome
/// for its own queue only) and is delivered once the driver posts a valid ring.
#[test]
fn output_queue_with_avail_index_beyond_the_ring_does_not_spin() {
    for (queue, event_idx) in [(VQ_EVENT, false), (VQ_EVENT, true), (VQ_ETH_RX, true)] {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).expect("mem");
        let atomic = GuestMemoryAtomic::new(mem.clone());
        let vring = Vring::new(atomic.clone(), QSIZE).expect("vring");
        vring.set_queue_size(QSIZE);
        vring.set_queue_info(0, AVAIL, USED).expect("queue info");
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        vring.set_queue_event_idx(event_idx);
        // One valid writable buffer in descriptor 0, but avail idx 0x4444.
        let mut d = BUF.to_le_bytes().to_vec();
        d.extend_from_slice(&2048u32.to_le_bytes());
        d.extend_from_slice(&F_WRITE.to_le_bytes());
        d.extend_from_slice(&0u16.to_le_bytes());
        mem.write_slice(&d, GuestAddress(0)).expect("desc");
        mem.write_obj(0x4444u16, GuestAddress(AVAIL + 2))
            .expect("avail idx");

        let out = Arc::new(VirtqOutput::new(16));
        let idle = Vring::new(atomic.clone(), QSIZE).expect("vring");
        let mut vrings = vec![idle; 6];
        vrings[usize::from(queue)] = vring.clone();
        out.attach(&vrings, &atomic);
        let (tx, rx) = mpsc::channel();
        let o = out.clone();
        thread::spawn(move || {
            if queue == VQ_EVENT {
                o.push_event(&VrdmaEvent {
                    type_: VRDMA_EV_PORT_ACTIVE,
                    ..Default::default()
                });
            } else {
                o.push_eth_rx(&[0x42; 60], None);
            }
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(5)).is_ok(),
            "queue {queue} (event_idx {event_idx}): push spins on an avail index beyond the ring"
        );
        let q = out.queue(queue).expect("queue");
        assert_eq!(q.pending(), 1, "the record waits for a valid buffer");
        let used: u16 = mem.read_obj(GuestAddress(USED + 2)).expect("used idx");
        assert_eq!(used, 0);

        // The driver repairs its ring: the record goes into descriptor 0.
        mem.write_obj(0u16, GuestAddress(AVAIL + 4)).expect("slot");
        mem.write_obj(1u16, GuestAddress(AVAIL + 2))
            .expect("avail idx");
        q.flush();
        assert_eq!(q.pending(), 0);
        let used: u16 = mem.read_obj(GuestAddress(USED + 2)).expect("used idx");
        assert_eq!(used, 1, "queue {queue}: delivered after the repair");
    }
}

/// A migration state stream (found by the `snapshot` target, `tests/data/`) whose RC requester
/// resumes with its SQ fetch index ahead of the ring's producer. The first doorbell finds the
/// ring inconsistent and moves the QP to ERROR, whose flush completed the ring's WQEs "from the
/// fetch index to the producer": it walked the ~2^32 indices around the index space, posting a
/// CQE for each, and the doorbell never returned (the engine worker hung with it). Now the flush
/// takes at most a ring's depth (spec §16: a corrupt ring has an outcome for its own QP only).
#[test]
fn a_fetch_index_ahead_of_the_producer_does_not_spin_the_flush() {
    use common::*;
    use vrdma_backend::device::snapshot;

    let stream = include_bytes!("data/snapshot_fetch_ahead_of_producer.bin");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut n = Node::new(1, 8, 1500);
        snapshot::restore(&mut n.dev, stream).expect("the stream restores");
        let qpns: Vec<u32> = n.dev.qps.iter().map(|q| q.qpn).collect();
        for &qpn in &qpns {
            n.ring_doorbell(VRDMA_DB_SQ, qpn);
        }
        tx.send(qpns.len()).expect("send");
    });
    let qps = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("every doorbell returned");
    assert!(qps > 0);
}
