//! What one control-queue kick can make the daemon allocate (spec §11.1 size limits): chains are
//! gathered one at a time, each at most `VRDMA_CMD_MAX_LEN` bytes and `VRDMA_CMD_MAX_DESCS`
//! descriptors, however their descriptors alias guest memory.
//!
//! The driver side is written by hand into a small guest memory (descriptor table, avail ring,
//! indirect tables) and the queue is served by the real `drain_queue` + `controlq::run_command`
//! over a mock device. A counting global allocator measures the peak heap growth of one drain;
//! the tests of this binary take `heap::serial()` so they never measure each other.

mod common;

use std::sync::Arc;

use common::heap;
use vhost_user_backend::VringT;
use vm_memory::{Bytes, GuestAddress};
use vrdma_backend::budget::Budget;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::vhost_user::controlq;
use vrdma_backend::vhost_user::inputq::{drain_queue, drain_queue_charged};
use vrdma_backend::vhost_user::parked::ParkedCommands;
use vrdma_backend::vhost_user::{
    CmdOutcome, GuestMemoryAtomic, GuestMemoryMmap, RdmaDevice, Vring, VQ_CONTROL,
};
use vrdma_spec::*;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

/// Peak heap growth while `f` runs.
fn peak_growth(f: impl FnOnce()) -> usize {
    let base = heap::mark();
    f();
    (heap::peak() - base).max(0) as usize
}

const MIB: usize = 1 << 20;
const QSIZE: u16 = 64;
const DESC_TABLE: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// The one 4 KiB page every readable descriptor points at: a DESTROY_PD command header.
const CMD_PAGE: u64 = 0x10000;
/// Where every response goes.
const RESP: u64 = 0x11000;
/// Indirect tables.
const TABLES: u64 = 0x20000;
const GUEST_SIZE: usize = 4 * MIB;

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// Counts the commands it executes; every command succeeds with an empty body.
#[derive(Default)]
struct CountingDevice {
    executed: usize,
}

impl RdmaDevice for CountingDevice {
    fn handle_command(&mut self, _opcode: u16, _req: &[u8], _resp: &mut Vec<u8>) -> CmdOutcome {
        self.executed += 1;
        CmdOutcome::Done(VRDMA_STATUS_OK)
    }
    fn reset(&mut self) {}
    fn set_guest_memory(&mut self, _mem: GuestMemoryAtomic) {}
}

struct Queue {
    mem: GuestMemoryMmap,
    atomic: GuestMemoryAtomic,
    vring: Vring,
    avail_idx: u16,
}

impl Queue {
    fn new() -> Queue {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), GUEST_SIZE)]).expect("mem");
        let atomic = GuestMemoryAtomic::new(mem.clone());
        let vring = Vring::new(atomic.clone(), QSIZE).expect("vring");
        vring.set_queue_size(QSIZE);
        vring
            .set_queue_info(DESC_TABLE, AVAIL, USED)
            .expect("queue info");
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        // DESTROY_PD (no response body), flags 0: well formed whatever follows.
        let hdr = VrdmaCmdHdr {
            opcode: VRDMA_CMD_DESTROY_PD,
            flags: 0,
            reserved: 0,
        };
        mem.write_slice(hdr.as_bytes(), GuestAddress(CMD_PAGE))
            .expect("cmd");
        Queue {
            mem,
            atomic,
            vring,
            avail_idx: 0,
        }
    }

    fn write_desc(&self, at: u64, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&d, GuestAddress(at)).expect("desc");
    }

    /// An indirect table at `table`: `readable` descriptors of `len` bytes each, all at
    /// `CMD_PAGE`, then one 16-byte writable descriptor for the response.
    fn indirect_table(&self, table: u64, readable: u16, len: u32) -> u32 {
        for i in 0..readable {
            self.write_desc(table + 16 * i as u64, CMD_PAGE, len, F_NEXT, i + 1);
        }
        self.write_desc(table + 16 * readable as u64, RESP, 16, F_WRITE, 0);
        (readable as u32 + 1) * 16
    }

    /// Make the chain whose head is descriptor `head`, pointing at indirect table `table` of
    /// `table_len` bytes, available.
    fn add_indirect(&mut self, head: u16, table: u64, table_len: u32) {
        self.write_desc(
            DESC_TABLE + 16 * head as u64,
            table,
            table_len,
            F_INDIRECT,
            0,
        );
        let slot = AVAIL + 4 + 2 * (self.avail_idx % QSIZE) as u64;
        self.mem
            .write_obj(head, GuestAddress(slot))
            .expect("avail slot");
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .expect("avail idx");
    }

    /// Serve the queue once, as the backend does on a kick. Returns the peak heap growth.
    fn drain(&self, dev: &HandoffLock<CountingDevice>, parked: &ParkedCommands) -> usize {
        peak_growth(|| {
            drain_queue(
                VQ_CONTROL,
                &self.vring,
                &self.atomic,
                false,
                controlq::LIMITS,
                |c| controlq::run_command(dev, &self.mem, c, parked),
            )
            .expect("drain");
        })
    }

    /// [`Queue::drain`] charging the gathered chains to `budget` (spec §16.1).
    fn drain_charged(
        &self,
        dev: &HandoffLock<CountingDevice>,
        parked: &ParkedCommands,
        budget: &Budget,
    ) -> usize {
        peak_growth(|| {
            drain_queue_charged(
                VQ_CONTROL,
                &self.vring,
                &self.atomic,
                false,
                controlq::LIMITS,
                Some(budget),
                |c| controlq::run_command(dev, &self.mem, c, parked),
            )
            .expect("drain");
        })
    }

    /// The used ring: `(id, len)` of every returned chain.
    fn used(&self) -> Vec<(u32, u32)> {
        let n: u16 = self.mem.read_obj(GuestAddress(USED + 2)).expect("used idx");
        (0..n)
            .map(|i| {
                let e = USED + 4 + 8 * (i % QSIZE) as u64;
                let id: u32 = self.mem.read_obj(GuestAddress(e)).expect("id");
                let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).expect("len");
                (id, len)
            })
            .collect()
    }

    fn resp_status(&self) -> u32 {
        self.mem.read_obj(GuestAddress(RESP)).expect("status")
    }
}

/// 32 chains of 1024 readable descriptors that all alias one 4 KiB page declare 4 MiB each. Every
/// one is a valid command and is executed, but the daemon never holds more than one chain's
/// bytes: gathering all 32 before handling any (the old drain) allocated 128 MiB at once.
#[test]
fn one_kick_gathers_one_chain_at_a_time() {
    let _serial = heap::serial();
    let mut q = Queue::new();
    let table_len = q.indirect_table(TABLES, 1024, 4096);
    let chains = 32u16;
    for head in 0..chains {
        q.add_indirect(head, TABLES, table_len);
    }
    let dev = Arc::new(HandoffLock::new(CountingDevice::default()));
    let parked = ParkedCommands::default();
    let peak = q.drain(&dev, &parked);
    let per_chain = 1024 * 4096;
    assert_eq!(dev.lock().executed, chains as usize);
    let used = q.used();
    assert_eq!(used.len(), chains as usize);
    assert!(used.iter().all(|&(_, len)| len == 8), "{used:?}");
    assert_eq!(q.resp_status(), VRDMA_STATUS_OK);
    assert!(
        peak < per_chain + per_chain / 2,
        "peak heap growth {peak} bytes for chains of {per_chain}: more than one chain held"
    );
}

/// A chain whose readable descriptors declare more than `VRDMA_CMD_MAX_LEN` (here 80 MiB over
/// one 4 KiB page) is answered INVALID without being read or executed, and without allocating
/// a buffer for it.
#[test]
fn chain_longer_than_the_command_limit_is_invalid_and_not_read() {
    let _serial = heap::serial();
    let mut q = Queue::new();
    let table_len = q.indirect_table(TABLES, 80, MIB as u32);
    q.add_indirect(0, TABLES, table_len);
    assert!(80 * MIB > VRDMA_CMD_MAX_LEN as usize);
    let dev = Arc::new(HandoffLock::new(CountingDevice::default()));
    let parked = ParkedCommands::default();
    let peak = q.drain(&dev, &parked);
    assert_eq!(dev.lock().executed, 0);
    assert_eq!(q.used(), vec![(0, 8)]);
    assert_eq!(q.resp_status(), VRDMA_STATUS_INVALID);
    assert!(peak < MIB, "peak heap growth {peak} bytes");
}

/// A chain of more than `VRDMA_CMD_MAX_DESCS` descriptors (zero-length ones: no byte limit
/// applies) is returned with `len` 0 and not executed; the walk stops at the limit. A chain of
/// exactly the limit is still executed.
#[test]
fn chain_with_too_many_descriptors_is_returned_unexecuted() {
    let _serial = heap::serial();
    let mut q = Queue::new();
    let max = VRDMA_CMD_MAX_DESCS as u16;
    // Readable descriptors: the 8-byte header once, then zero-length ones; one writable.
    let build = |q: &Queue, table: u64, readable: u16| -> u32 {
        let len = q.indirect_table(table, readable, 0);
        q.write_desc(table, CMD_PAGE, 8, F_NEXT, 1);
        len
    };
    let over = build(&q, TABLES, max);
    q.add_indirect(0, TABLES, over);
    let at_limit_table = TABLES + 0x10_0000;
    let at_limit = build(&q, at_limit_table, max - 1);
    q.add_indirect(1, at_limit_table, at_limit);
    let dev = Arc::new(HandoffLock::new(CountingDevice::default()));
    let parked = ParkedCommands::default();
    q.drain(&dev, &parked);
    assert_eq!(q.used(), vec![(0, 0), (1, 8)]);
    assert_eq!(dev.lock().executed, 1);
}

/// With a host-memory budget (spec §16.1), a chain that does not fit it is answered
/// NO_RESOURCES without being read or executed, one that fits is executed, and the budget is
/// back to zero once the chains are returned.
#[test]
fn chain_beyond_the_host_memory_budget_is_no_resources_and_not_read() {
    let _serial = heap::serial();
    let mut q = Queue::new();
    let budget = Budget::new(2 * MIB as u64);
    // 4 MiB declared over one page: within VRDMA_CMD_MAX_LEN, beyond the budget.
    let big = q.indirect_table(TABLES, 1024, 4096);
    q.add_indirect(0, TABLES, big);
    let dev = Arc::new(HandoffLock::new(CountingDevice::default()));
    let parked = ParkedCommands::default();
    let peak = q.drain_charged(&dev, &parked, &budget);
    assert_eq!(dev.lock().executed, 0);
    assert_eq!(q.used(), vec![(0, 8)]);
    assert_eq!(q.resp_status(), VRDMA_STATUS_NO_RESOURCES);
    assert!(peak < MIB, "peak heap growth {peak} bytes");
    // 1 MiB fits.
    let small_table = TABLES + 0x10_0000;
    let small = q.indirect_table(small_table, 256, 4096);
    q.add_indirect(1, small_table, small);
    q.drain_charged(&dev, &parked, &budget);
    assert_eq!(dev.lock().executed, 1);
    assert_eq!(q.used(), vec![(0, 8), (1, 8)]);
    assert_eq!(q.resp_status(), VRDMA_STATUS_OK);
    assert!(budget.peak() > MIB as u64 && budget.peak() <= 2 * MIB as u64);
    assert_eq!(budget.used(), 0);
}
