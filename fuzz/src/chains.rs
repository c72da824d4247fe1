//! Target `vring`: vhost-user descriptor chains from the input (spec §11.1, §16): the real
//! `drain_queue` walks a split virtqueue whose descriptor table, avail ring and buffers the
//! input writes, `SplitChain::gather` splits each chain and the control queue
//! (`controlq::run_command` on a real `Device`), the doorbell queue or the eth tx queue consume
//! it.
//!
//! The device → driver queues (event, pagereq, eth rx: `VirtqOutput`) are served the same way:
//! the device posts records into the chains the input made available.
//!
//! Input: `ctl u8` (bit 0: EVENT_IDX; `(ctl >> 1) % 5`: control, doorbell, eth tx, event +
//! pagereq, eth rx queue),
//! `avail_idx u16` (any value, also beyond the queue size), 16 avail ring slots `u16`, the
//! descriptor table (16 × 16 bytes: addr u64, len u32, flags u16, next u16), then the bytes
//! of guest memory from `DATA` on (commands, indirect tables, frames).

use std::sync::Arc;

use vhost_user_backend::VringT;
use vm_memory::{Bytes, GuestAddress};
use vrdma_backend::device::{Device, DeviceConfig, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::vhost_user::chain::SplitChain;
use vrdma_backend::vhost_user::inputq::{self, drain_queue, ChainLimits};
use vrdma_backend::vhost_user::parked::ParkedCommands;
use vrdma_backend::vhost_user::{
    controlq, DoorbellSink, FrameSink, GuestMemoryAtomic, GuestMemoryMmap, RdmaDevice, VirtqOutput,
    Vring, VQ_CONTROL, VQ_ETH_RX, VQ_EVENT, VQ_PAGEREQ,
};
use vrdma_spec::*;

pub const QSIZE: u16 = 16;
pub const DESC_TABLE: u64 = 0x0;
pub const AVAIL: u64 = 0x1000;
pub const USED: u64 = 0x2000;
/// Guest memory the input fills from here on.
pub const DATA: u64 = 0x3000;
pub const GUEST_SIZE: usize = 0x10000;
/// Largest eth tx frame accepted (the backend's default MTU plus headers).
const MAX_FRAME: usize = 1514;

struct NullSink;

impl DoorbellSink for NullSink {
    fn doorbell(&self, _db: VrdmaDoorbell) {}
}

impl FrameSink for NullSink {
    fn send_frame(&self, frame: &[u8]) -> std::io::Result<()> {
        assert!(
            frame.len() <= MAX_FRAME,
            "eth tx passed a frame over the limit"
        );
        Ok(())
    }
}

pub fn run(data: &[u8]) {
    let mut inp = crate::Input::new(data);
    let ctl = inp.u8();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), GUEST_SIZE)]).expect("mem");
    let avail_idx = inp.u16();
    let mut avail = vec![0u8; 4];
    avail[2..4].copy_from_slice(&avail_idx.to_le_bytes());
    avail.extend_from_slice(&inp.padded(2 * usize::from(QSIZE)));
    mem.write_slice(&avail, GuestAddress(AVAIL)).expect("avail");
    mem.write_slice(
        &inp.padded(16 * usize::from(QSIZE)),
        GuestAddress(DESC_TABLE),
    )
    .expect("desc table");
    let rest = inp.bytes(GUEST_SIZE - DATA as usize);
    mem.write_slice(rest, GuestAddress(DATA)).expect("data");

    let atomic = GuestMemoryAtomic::new(mem.clone());
    let vring = Vring::new(atomic.clone(), QSIZE).expect("vring");
    vring.set_queue_size(QSIZE);
    vring
        .set_queue_info(DESC_TABLE, AVAIL, USED)
        .expect("queue info");
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    let event_idx = ctl & 1 != 0;
    vring.set_queue_event_idx(event_idx);

    let mut device = Device::new(
        DeviceConfig::default(),
        GuestMem::empty(),
        Arc::new(RecordingOutput::new()),
    );
    RdmaDevice::set_guest_memory(&mut device, atomic.clone());
    let device = HandoffLock::new(device);
    let parked = ParkedCommands::default();
    // The used length may never exceed what the chain lets the device write (virtio 2.7.8).
    let check = |c: &SplitChain, len: Option<u32>| {
        if let Some(l) = len {
            assert!(
                u64::from(l) <= c.writable_len(),
                "used len {l} > writable {}",
                c.writable_len()
            );
        }
        len
    };
    let other = ChainLimits {
        max_readable: MAX_FRAME,
        max_descs: vrdma_backend::vhost_user::chain::MAX_CHAIN_DESCS,
    };
    if (ctl >> 1) % 5 >= 3 {
        output(&vring, &atomic, ctl);
        return;
    }
    // A malformed ring is an error for the queue (the backend logs it), never a panic.
    let _ = match (ctl >> 1) % 5 {
        0 => drain_queue(
            VQ_CONTROL,
            &vring,
            &atomic,
            event_idx,
            controlq::LIMITS,
            |c| check(c, controlq::run_command(&device, &mem, c, &parked)),
        ),
        1 => drain_queue(2, &vring, &atomic, event_idx, other, |c| {
            check(c, Some(inputq::doorbells(c, &NullSink)))
        }),
        _ => drain_queue(5, &vring, &atomic, event_idx, other, |c| {
            check(c, Some(inputq::eth_tx(c, &NullSink, MAX_FRAME)))
        }),
    };
    // The used index moved by at most the number of chains made available.
    let used: u16 = mem.read_obj(GuestAddress(USED + 2)).expect("used idx");
    assert!(
        used <= avail_idx,
        "used idx {used} beyond avail idx {avail_idx}"
    );
}

/// Device → driver records into the input's chains: events and page requests
/// (`(ctl >> 1) % 5 == 3`, the vring serving as both queues) or eth rx frames of several sizes.
fn output(vring: &Vring, atomic: &GuestMemoryAtomic, ctl: u8) {
    let out = VirtqOutput::new(16);
    let idle = Vring::new(atomic.clone(), QSIZE).expect("vring");
    let mut vrings = vec![idle; 6];
    if (ctl >> 1) % 5 == 3 {
        vrings[usize::from(VQ_EVENT)] = vring.clone();
        vrings[usize::from(VQ_PAGEREQ)] = vring.clone();
    } else {
        vrings[usize::from(VQ_ETH_RX)] = vring.clone();
    }
    out.attach(&vrings, atomic);
    for i in 0..4u32 {
        out.push_event(&VrdmaEvent {
            type_: i,
            ..Default::default()
        });
        out.push_page_req(&VrdmaPageReq {
            req_id: i,
            ..Default::default()
        });
        out.push_eth_rx(&vec![0x42; [60, 1514, 128, 9000][i as usize]], None);
    }
    for q in [VQ_EVENT, VQ_PAGEREQ, VQ_ETH_RX] {
        if let Some(q) = out.queue(q) {
            q.flush();
        }
    }
    out.detach();
}
