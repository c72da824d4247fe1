//! On-demand paging (spec §10, DESIGN.md "Memory").
//!
//! ODP MRs are not translated at registration. Their iova space is cut into chunks of
//! `1 << chunk_shift` bytes (default 2 MiB); each chunk of each ODP MR is in one of these states:
//!
//! - absent: never touched (or dropped by invalidation / reclaim);
//! - `Pending`: a `VRDMA_PAGEREQ_FAULT` was sent with `req_id`; accesses join it (one request per
//!   chunk) and the QPNs that wait are recorded so they can be resumed;
//! - `Resident`: the driver answered with ODP_PAGE_RESP: the GPAs of the chunk's 4 KiB pages (from
//!   the page containing the chunk's first byte, clipped to the MR), each marked writable or not.
//!   An answer may cover part of the chunk (spec §12.4 step 3: a chunk often straddles holes and
//!   read-only mappings); the pages it does not cover stay absent, an access to them faults the
//!   chunk again, and the next answer is merged with the pages already present;
//! - `Failed`: the driver answered with an error status or did not answer within the timeout
//!   (5 s). Accesses fail with `MrError::OdpFailed` for `FAIL_HOLD`; then the chunk is dropped
//!   (absent again, by `odp_tick` or by the next access, which faults again), so failed state
//!   holds at most the requests that ended within the last `FAIL_HOLD`.
//!
//! Outstanding FAULT requests are capped per device (`max_requests`, spec §12.4): an access that
//! needs a new request while the cap is reached sends none and gets `MrError::Fault` all the
//! same (RNR NAK at the responder, suspension at the requester); its QP is resumed when any
//! request ends. So a peer touching fresh chunks cannot grow the chunk tables beyond
//! `max_requests` pending + the resident budgets + recently failed chunks.
//!
//! Timers and budgets cost what changed, never a walk of every chunk: outstanding requests are
//! kept in deadline order, failed chunks in expiry order, and resident chunks in LRU order (per
//! device and per MR, keyed by their unique `last_use` tick).
//!
//! A write access to a read-only page of a resident chunk faults again with
//! `VRDMA_PAGEREQ_F_WRITE`.
//!
//! Residency is bounded per device (`max_resident`) and per MR (`max_resident_per_mr`); installing
//! a chunk above a budget drops the least recently used resident chunk (of the device, resp. of
//! that MR) and tells the driver with `VRDMA_PAGEREQ_RECLAIM` (req_id 0, the dropped range).
//! Installing runs in ODP_PAGE_RESP, a command that holds the device exclusively, so no access of
//! this device is in flight; fabric references through the victim's MR (read later by another
//! device's engine) are fenced before the command completes, as for ODP_INVALIDATE.
//!
//! Invalidation (ODP_INVALIDATE) drops resident chunks that overlap the range and cancels pending
//! requests there (their waiters are resumed and fault again; a late answer to a cancelled request
//! gets STATUS_NOT_FOUND). The device only touches guest memory while holding the device lock and
//! never keeps a translation across lock releases, so when ODP_INVALIDATE is executed no access to
//! the range is in flight and the command completes immediately. Transport rule that makes this
//! true: resolve again for every packet / WQE step; never cache a `GuestRange` across calls.
//! Whole SGE / RETH ranges are checked with `MrTable::check_access`, which never faults: only the
//! bytes a packet moves are resolved, so a transfer larger than the budget does not evict its own
//! chunks forever.
//!
//! ADVISE_MR: PREFETCH / PREFETCH_WRITE send fault requests for every non-resident chunk of the
//! range (at most `max_resident` chunks); PREFETCH_NO_FAULT does nothing (the device cannot map
//! without asking the driver). Without VRDMA_ADVISE_F_FLUSH the command completes right after the
//! requests are queued. With it, the command is parked (`CmdOutcome::Parked`) until every request
//! of its range — the ones it sent and the ones already pending — has ended: answered (resident
//! or failed), timed out, or cancelled by ODP_INVALIDATE / DEREG_MR; it then completes with OK
//! through `DeviceOutput::command_done` (see `advise.rs`). A device reset forgets parked advises.
//!
//! Every end of a request goes through `OdpState::end_request` (the one place that removes a
//! request id), so parked advises cannot miss one.

mod commands;
mod invariants;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_spec::{
    VrdmaPageReq, VRDMA_ODP_CHUNK_SHIFT_MAX, VRDMA_ODP_CHUNK_SHIFT_MIN, VRDMA_PAGEREQ_FAULT,
    VRDMA_PAGEREQ_F_WRITE, VRDMA_PAGEREQ_RECLAIM,
};

use super::advise::FlushWaits;
use super::mr::{key_index, GuestRange, Mr, MrError, MrKind, MrTable};
use super::Access;
use crate::budget::{Budget, Charge};
use crate::guest::output::DeviceOutput;
use crate::guest::CmdOutcome;

/// 4 KiB ODP page.
pub const ODP_PAGE_SHIFT: u32 = 12;
pub const ODP_PAGE_SIZE: u64 = 1 << ODP_PAGE_SHIFT;
/// A page of a resident chunk that no answer covered yet.
pub const ODP_ABSENT: u64 = u64::MAX;
/// Low bit of a resident page entry: the page may be written.
pub const ODP_PAGE_WRITABLE: u64 = 1;
/// `MrError::OdpFailed::status` for a request that timed out.
pub const ODP_STATUS_TIMEOUT: u32 = u32::MAX;
/// How long a failed chunk keeps failing accesses before it may be faulted again.
pub const FAIL_HOLD: Duration = Duration::from_secs(1);

/// ODP configuration (from the CLI / `DeviceConfig`).
#[derive(Debug, Clone)]
pub struct OdpConfig {
    /// Explicit ODP MRs accepted (VIRTIO_RDMA_F_ODP).
    pub enabled: bool,
    /// Implicit ODP MRs accepted (VIRTIO_RDMA_F_ODP_IMPLICIT).
    pub implicit: bool,
    /// log2 of the chunk size (12..=30).
    pub chunk_shift: u32,
    /// Resident chunk budget of the device.
    pub max_resident: usize,
    /// Resident chunk budget of one MR.
    pub max_resident_per_mr: usize,
    /// Page request timeout.
    pub timeout: Duration,
    /// FAULT requests outstanding at once (device-wide, spec §12.4); at least 1.
    pub max_requests: usize,
}

impl Default for OdpConfig {
    fn default() -> Self {
        OdpConfig {
            enabled: true,
            implicit: true,
            chunk_shift: 21,
            max_resident: 4096,
            max_resident_per_mr: 2048,
            timeout: Duration::from_secs(5),
            max_requests: 1024,
        }
    }
}

/// One chunk of an ODP MR.
#[derive(Debug, Clone)]
pub enum Chunk {
    Pending {
        req_id: u32,
        write: bool,
        sent: Instant,
        waiters: Vec<u32>,
        /// Pages of a partially resident chunk that faulted again (see `Resident::pages`),
        /// merged with the answer; empty when the chunk had none.
        prior: Vec<u64>,
    },
    Resident {
        /// iova of `pages[0]` (4 KiB aligned).
        base: u64,
        /// One entry per 4 KiB page of the chunk: `ODP_ABSENT`, or the GPA with `ODP_PAGE_WRITABLE`
        /// set in its (otherwise zero) low bits.
        pages: Vec<u64>,
        /// Every present page is writable.
        writable: bool,
        /// Unique tick of the last access: the chunk's key in the LRU maps.
        last_use: u64,
    },
    Failed {
        status: u32,
        at: Instant,
    },
}

/// Per-MR ODP state: chunk index (iova >> chunk_shift) → chunk.
#[derive(Debug, Clone, Default)]
pub struct OdpMr {
    pub chunks: HashMap<u64, Chunk>,
    pub resident: usize,
    /// Resident chunks by `last_use` (oldest first): the per-MR reclaim order.
    lru: BTreeMap<u64, u64>,
    /// Chunk entries charged to the host-memory budget: the most `chunks` has held (a map
    /// keeps its capacity), each at [`OdpState::entry_cost`]; given back at DEREG_MR (§16).
    pub charged_entries: u64,
}

impl OdpMr {
    /// Number of resident chunks.
    pub fn resident_chunks(&self) -> usize {
        self.resident
    }
    /// Is the chunk containing `iova` resident?
    pub fn is_resident(&self, iova: u64, chunk_shift: u32) -> bool {
        matches!(
            self.chunks.get(&(iova >> chunk_shift)),
            Some(Chunk::Resident { .. })
        )
    }
}

/// An outstanding FAULT request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Req {
    /// MR key at the time of the request.
    key: u32,
    chunk: u64,
    /// When it times out (its entry in `OdpState::deadlines`).
    deadline: Instant,
}

/// Device-wide ODP bookkeeping.
pub struct OdpState {
    pub config: OdpConfig,
    out: Arc<dyn DeviceOutput>,
    next_req: u32,
    /// Outstanding FAULT requests.
    reqs: HashMap<u32, Req>,
    /// Outstanding requests by timeout deadline: (deadline, req_id).
    deadlines: BTreeSet<(Instant, u32)>,
    /// Failed chunks by expiry: (at + FAIL_HOLD, MR key, chunk).
    failed: BTreeSet<(Instant, u32, u64)>,
    /// Resident chunks of the device by `last_use`: tick → (MR index, chunk).
    lru: BTreeMap<u64, (u32, u64)>,
    /// QPs whose access found the request cap reached; resumed when a request ends.
    cap_waiters: BTreeSet<u32>,
    resident_total: usize,
    tick: u64,
    resumed: Vec<u32>,
    /// Fault page requests sent since daemon start (host-side stats).
    faults: u64,
    /// Latest time seen by `odp_tick` (the engine may run timers in virtual time ahead of the
    /// wall clock); accesses use max(wall clock, this) so both agree on expiry.
    clock: Option<Instant>,
    /// Parked ADVISE_MR + F_FLUSH commands.
    flush: FlushWaits,
    /// The device's host-memory budget and what all ODP MRs' chunk entries hold of it.
    budget: Budget,
    charge: Charge,
    /// QPs whose access needed a new chunk entry the budget had no room for: no page request
    /// was sent; they are resumed by the next `odp_tick` and try again (spec §16).
    budget_waiters: Vec<u32>,
}

/// How often QPs that wait for budget room try again.
pub const BUDGET_RETRY: Duration = Duration::from_millis(10);

/// `[start, end)` of chunk `c` clipped to the MR `[mr_iova, mr_end)`.
fn chunk_range(c: u64, shift: u32, mr_iova: u64, mr_len: u64) -> (u64, u64) {
    let cs = c << shift;
    let ce = cs.saturating_add(1u64 << shift);
    let me = mr_iova.saturating_add(mr_len);
    (cs.max(mr_iova), ce.min(me))
}

/// Page-aligned span `[start_page, end_page)` covering `[s, e)`.
fn page_span(s: u64, e: u64) -> (u64, u64) {
    let sp = s & !(ODP_PAGE_SIZE - 1);
    let ep = e
        .checked_next_multiple_of(ODP_PAGE_SIZE)
        .unwrap_or(!(ODP_PAGE_SIZE - 1));
    (sp, ep)
}

impl OdpState {
    /// Budgets below 2 chunks are raised to 2 (one packet may span two chunks); the chunk shift
    /// is clamped to 12..=30, `max_requests` to at least 1, the timeout to at most an hour.
    pub fn new(mut config: OdpConfig, out: Arc<dyn DeviceOutput>) -> Self {
        config.max_resident = config.max_resident.max(2);
        config.max_resident_per_mr = config.max_resident_per_mr.max(2);
        config.chunk_shift = config
            .chunk_shift
            .clamp(VRDMA_ODP_CHUNK_SHIFT_MIN, VRDMA_ODP_CHUNK_SHIFT_MAX);
        config.max_requests = config.max_requests.max(1);
        // Deadlines are `Instant + timeout`: keep the sum far from overflowing.
        config.timeout = config.timeout.min(Duration::from_secs(3600));
        OdpState {
            config,
            out,
            next_req: 1,
            reqs: HashMap::new(),
            deadlines: BTreeSet::new(),
            failed: BTreeSet::new(),
            lru: BTreeMap::new(),
            cap_waiters: BTreeSet::new(),
            resident_total: 0,
            tick: 0,
            resumed: Vec::new(),
            faults: 0,
            clock: None,
            flush: FlushWaits::default(),
            budget: Budget::default(),
            charge: Charge::default(),
            budget_waiters: Vec::new(),
        }
    }

    /// Charge chunk entries to `budget` (the device's) instead of a private one.
    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = budget;
    }

    /// Host memory one chunk entry may hold: the map entry, the request that fills it and the
    /// page table of a resident chunk (one u64 per 4 KiB page, one extra for a chunk that does
    /// not start on a page boundary).
    pub fn entry_cost(&self) -> u64 {
        let pages = (1u64 << self.config.chunk_shift.saturating_sub(ODP_PAGE_SHIFT)) + 1;
        (std::mem::size_of::<(u64, Chunk)>() + std::mem::size_of::<(u32, (u32, u64))>()) as u64
            + pages * 8
    }

    /// Make room in `o`'s charge for `new` more chunk entries; false if the budget has none.
    fn charge_entries(&mut self, o: &mut OdpMr, new: u64) -> bool {
        let want = (o.chunks.len() as u64 + new).saturating_sub(o.charged_entries);
        if want == 0 {
            return true;
        }
        let bytes = want.saturating_mul(self.entry_cost());
        if self.charge.try_grow(&self.budget, bytes).is_err() {
            return false;
        }
        o.charged_entries += want;
        true
    }

    pub fn set_output(&mut self, out: Arc<dyn DeviceOutput>) {
        self.out = out;
    }

    /// Device reset: every request and parked advise is forgotten (none is completed).
    pub fn clear(&mut self) {
        self.charge = Charge::default();
        self.budget_waiters.clear();
        self.reqs.clear();
        self.deadlines.clear();
        self.failed.clear();
        self.lru.clear();
        self.cap_waiters.clear();
        self.flush.clear();
        self.resident_total = 0;
        self.resumed.clear();
    }

    /// Resident chunks of the whole device.
    pub fn resident_total(&self) -> usize {
        self.resident_total
    }

    /// Outstanding page requests.
    pub fn pending_requests(&self) -> usize {
        self.reqs.len()
    }

    /// The ODP clock: the wall clock, or the latest tick time if that is ahead.
    pub fn now(&self) -> Instant {
        let n = Instant::now();
        self.clock.map_or(n, |c| c.max(n))
    }

    /// The QPs resumed since the last take (sorted, each once).
    pub fn take_resumed(&mut self) -> Vec<u32> {
        self.take_resumed_where(|_| true)
    }

    /// [`take_resumed`](Self::take_resumed) for the QPs `mine` accepts (one engine worker's);
    /// the others stay for their worker.
    pub fn take_resumed_where(&mut self, mine: impl Fn(u32) -> bool) -> Vec<u32> {
        let (mut v, rest): (Vec<u32>, Vec<u32>) = self.resumed.drain(..).partition(|&q| mine(q));
        self.resumed = rest;
        v.sort_unstable();
        v.dedup();
        v
    }

    /// QPs resumed and not taken yet.
    pub fn resumed_pending(&self) -> bool {
        !self.resumed.is_empty()
    }

    fn resume(&mut self, waiters: Vec<u32>) {
        self.resumed.extend(waiters);
    }

    /// Request `req_id` ended (answered, timed out or cancelled): forget it and complete the
    /// flush advises that waited for nothing else.
    fn end_request(&mut self, req_id: u32) {
        if let Some(r) = self.reqs.remove(&req_id) {
            self.deadlines.remove(&(r.deadline, req_id));
            // Room for another request: accesses refused by the cap try again.
            let w = std::mem::take(&mut self.cap_waiters);
            self.resumed.extend(w);
        }
        for t in self.flush.request_ended(req_id) {
            self.out.command_done(t, vrdma_spec::VRDMA_STATUS_OK);
        }
    }

    /// An MR is going away: drop its requests and residency, resume its waiters.
    pub fn forget_mr(&mut self, mr: &Mr) {
        let o = match &mr.kind {
            MrKind::Odp(o) | MrKind::ImplicitOdp(o) => o,
            _ => return,
        };
        self.resident_total = self.resident_total.saturating_sub(o.resident);
        let cost = self.entry_cost();
        self.charge.shrink(o.charged_entries.saturating_mul(cost));
        let key = mr.key;
        // Proportional to the MR's own chunks, not to the device's requests.
        for (&c, ch) in &o.chunks {
            match ch {
                Chunk::Pending {
                    waiters, req_id, ..
                } => {
                    self.resumed.extend(waiters.iter().copied());
                    self.end_request(*req_id);
                }
                Chunk::Resident { last_use, .. } => {
                    self.lru.remove(last_use);
                }
                Chunk::Failed { at, .. } => {
                    self.failed.remove(&(*at + FAIL_HOLD, key, c));
                }
            }
        }
    }

    /// Whether another FAULT request may be sent (spec §12.4: `max_requests` outstanding).
    fn can_send_fault(&self) -> bool {
        self.reqs.len() < self.config.max_requests
    }

    /// Send a FAULT for chunk `c` (the caller checked `can_send_fault`).
    fn send_fault(
        &mut self,
        key: u32,
        c: u64,
        mr_iova: u64,
        mr_len: u64,
        write: bool,
        now: Instant,
    ) -> u32 {
        // Skip ids still outstanding after a wrap (at most max_requests of them).
        while self.reqs.contains_key(&self.next_req) {
            self.next_req = self.next_req.wrapping_add(1).max(1);
        }
        let req_id = self.next_req;
        self.next_req = self.next_req.wrapping_add(1).max(1);
        self.faults = self.faults.wrapping_add(1);
        let (s, e) = chunk_range(c, self.config.chunk_shift, mr_iova, mr_len);
        let deadline = now + self.config.timeout;
        self.reqs.insert(
            req_id,
            Req {
                key,
                chunk: c,
                deadline,
            },
        );
        self.deadlines.insert((deadline, req_id));
        self.out.page_request(VrdmaPageReq {
            type_: VRDMA_PAGEREQ_FAULT,
            req_id,
            mr_key: key,
            flags: if write { VRDMA_PAGEREQ_F_WRITE } else { 0 },
            iova: s,
            length: e - s,
        });
        req_id
    }

    fn send_reclaim(&self, key: u32, c: u64, mr_iova: u64, mr_len: u64) {
        let (s, e) = chunk_range(c, self.config.chunk_shift, mr_iova, mr_len);
        self.out.page_request(VrdmaPageReq {
            type_: VRDMA_PAGEREQ_RECLAIM,
            req_id: 0,
            mr_key: key,
            flags: 0,
            iova: s,
            length: e - s,
        });
    }

    /// A fresh, unique LRU tick.
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drop chunk `c` of `o` if it is resident (counters and LRU maps follow); returns its pages.
    fn remove_resident(&mut self, o: &mut OdpMr, c: u64) -> Option<Vec<u64>> {
        if !matches!(o.chunks.get(&c), Some(Chunk::Resident { .. })) {
            return None;
        }
        let Some(Chunk::Resident {
            pages, last_use, ..
        }) = o.chunks.remove(&c)
        else {
            return None;
        };
        o.resident -= 1;
        o.lru.remove(&last_use);
        self.lru.remove(&last_use);
        self.resident_total = self.resident_total.saturating_sub(1);
        Some(pages)
    }

    /// Drop chunk `c` of MR `key` if it is failed (with its expiry entry).
    fn remove_failed(&mut self, o: &mut OdpMr, key: u32, c: u64) {
        if let Some(Chunk::Failed { at, .. }) = o.chunks.get(&c) {
            self.failed.remove(&(*at + FAIL_HOLD, key, c));
            o.chunks.remove(&c);
        }
    }

    /// Chunk `c` of MR `key` fails with `status`, replacing whatever it was (the counters and
    /// maps of a resident or failed chunk follow).
    fn set_failed(&mut self, o: &mut OdpMr, key: u32, c: u64, status: u32, now: Instant) {
        self.remove_failed(o, key, c);
        self.remove_resident(o, c);
        o.chunks.insert(c, Chunk::Failed { status, at: now });
        self.failed.insert((now + FAIL_HOLD, key, c));
    }

    /// Translate the range of `a` (its key is the ODP MR `o` of `[mr_iova, mr_iova + mr_len)`;
    /// PD, rights and bounds already checked), chunk by chunk (spec §12.4): resident chunks are
    /// translated, absent ones faulted, and the first chunk that faults or has failed decides
    /// the error.
    pub(crate) fn resolve(
        &mut self,
        o: &mut OdpMr,
        mr_iova: u64,
        mr_len: u64,
        a: Access,
        waiter: Option<u32>,
        now: Instant,
    ) -> Result<Vec<GuestRange>, MrError> {
        let acc = OdpAccess {
            key: a.key,
            idx: key_index(a.key),
            write: a.writes(),
            waiter,
            mr_iova,
            mr_len,
            now,
        };
        let shift = self.config.chunk_shift;
        let end = a.iova + a.len; // caller checked overflow
        let first = a.iova >> shift;
        let last = (end - 1) >> shift;
        let mut walk = Walk::default();
        for c in first..=last {
            let cs = (c << shift).max(a.iova);
            let ce = (c << shift).saturating_add(1 << shift).min(end);
            match self.inspect_chunk(o, c, (cs, ce), &acc, &mut walk) {
                ChunkAction::Done => {}
                ChunkAction::TimedOut { req_id, waiters } => {
                    self.end_request(req_id);
                    self.set_failed(o, acc.key, c, ODP_STATUS_TIMEOUT, now);
                    self.resume(waiters);
                    walk.failed.get_or_insert((cs, ODP_STATUS_TIMEOUT));
                }
                ChunkAction::Refault => {
                    walk.fault.get_or_insert(cs);
                    self.refault_chunk(o, c, &acc);
                }
            }
        }
        walk.into_result(acc.key)
    }

    /// Look at chunk `c`'s state for an access to `[cs, ce)` of it: a resident chunk becomes
    /// the most recently used and, while the walk has neither a fault nor a failure, is
    /// translated into `walk.out`; a pending request gains the waiter (one request per chunk);
    /// a failed chunk fails the access for `FAIL_HOLD`. Returns what the walk must do next.
    fn inspect_chunk(
        &mut self,
        o: &mut OdpMr,
        c: u64,
        (cs, ce): (u64, u64),
        acc: &OdpAccess,
        walk: &mut Walk,
    ) -> ChunkAction {
        match o.chunks.get_mut(&c) {
            Some(Chunk::Resident {
                base,
                pages,
                last_use,
                ..
            }) => {
                // Most recently used now: move it to the young end of both LRU maps.
                self.tick += 1;
                let t = self.tick;
                o.lru.remove(last_use);
                self.lru.remove(last_use);
                o.lru.insert(t, c);
                self.lru.insert(t, (acc.idx, c));
                *last_use = t;
                if walk.fault.is_none() && walk.failed.is_none() {
                    match translate_chunk(*base, pages, cs, ce, acc.write, &mut walk.out) {
                        Translation::Done => {}
                        Translation::Missing => return ChunkAction::Refault,
                        Translation::Outside => {
                            walk.failed = Some((cs, vrdma_spec::VRDMA_STATUS_BAD_ADDRESS));
                        }
                    }
                }
                ChunkAction::Done
            }
            Some(Chunk::Pending {
                sent,
                waiters,
                req_id,
                ..
            }) => {
                if elapsed_at_least(acc.now, *sent, self.config.timeout) {
                    return ChunkAction::TimedOut {
                        req_id: *req_id,
                        waiters: std::mem::take(waiters),
                    };
                }
                if let Some(q) = acc.waiter {
                    if !waiters.contains(&q) {
                        waiters.push(q);
                    }
                }
                walk.fault.get_or_insert(cs);
                ChunkAction::Done
            }
            Some(Chunk::Failed { status, at }) => {
                if elapsed_at_least(acc.now, *at, FAIL_HOLD) {
                    return ChunkAction::Refault;
                }
                walk.failed.get_or_insert((cs, *status));
                ChunkAction::Done
            }
            None => ChunkAction::Refault,
        }
    }

    /// Fault chunk `c` (again) with a new FAULT request, unless the request cap (spec §12.4) or
    /// the host-memory budget (spec §16) leaves no room: then nothing is sent and the waiter is
    /// recorded to be resumed when a request ends, resp. when room is given back.
    fn refault_chunk(&mut self, o: &mut OdpMr, c: u64, acc: &OdpAccess) {
        if !self.can_send_fault() {
            // Spec §12.4: over the request cap nothing is sent; the access faults all
            // the same (RNR NAK / suspension) and its QP is resumed when a request ends.
            if let Some(q) = acc.waiter {
                self.cap_waiters.insert(q);
            }
            return;
        }
        // A new chunk entry must fit the budget (spec §16); without room no request is
        // sent: the responder RNR-NAKs (a Fault), a local waiter retries from odp_tick.
        if !o.chunks.contains_key(&c) && !self.charge_entries(o, 1) {
            if let Some(q) = acc.waiter {
                if !self.budget_waiters.contains(&q) {
                    self.budget_waiters.push(q);
                }
            }
            return;
        }
        self.remove_failed(o, acc.key, c);
        let prior = self.remove_resident(o, c).unwrap_or_default();
        let (key, write, now) = (acc.key, acc.write, acc.now);
        let req_id = self.send_fault(key, c, acc.mr_iova, acc.mr_len, write, now);
        o.chunks.insert(
            c,
            Chunk::Pending {
                req_id,
                write,
                sent: now,
                waiters: acc.waiter.into_iter().collect(),
                prior,
            },
        );
    }
}

/// Whether `hold` has passed between `since` and `now`.
fn elapsed_at_least(now: Instant, since: Instant, hold: Duration) -> bool {
    now.duration_since(since) >= hold
}

/// An access being resolved ([`OdpState::resolve`]), as its per-chunk steps need it.
struct OdpAccess {
    key: u32,
    /// `key_index(key)`, the MR's entry in the device-wide LRU map.
    idx: u32,
    write: bool,
    /// The QP to resume when a fault it waits for ends.
    waiter: Option<u32>,
    mr_iova: u64,
    mr_len: u64,
    now: Instant,
}

/// What a [`OdpState::resolve`] walk has found so far: the guest ranges of the resident
/// chunks, and the start of the first chunk that faults or has failed (with its status).
#[derive(Default)]
struct Walk {
    out: Vec<GuestRange>,
    fault: Option<u64>,
    failed: Option<(u64, u32)>,
}

impl Walk {
    /// A failed chunk fails the access (spec §12.4: ODP fault failed); else a fault makes it
    /// wait; else it is translated.
    fn into_result(self, key: u32) -> Result<Vec<GuestRange>, MrError> {
        if let Some((at, status)) = self.failed {
            return Err(MrError::OdpFailed {
                key,
                iova: at,
                status,
            });
        }
        if let Some(at) = self.fault {
            return Err(MrError::Fault { key, iova: at });
        }
        Ok(self.out)
    }
}

/// What [`OdpState::resolve`] does with a chunk after [`OdpState::inspect_chunk`].
enum ChunkAction {
    /// Nothing more (translated, joined a pending request, or failed).
    Done,
    /// Its request timed out: fail the chunk and resume its waiters.
    TimedOut { req_id: u32, waiters: Vec<u32> },
    /// Absent, partly absent, or failed long enough ago: send a FAULT request.
    Refault,
}

/// What `translate_chunk` found.
enum Translation {
    /// Every page of the range is present (and writable for a write).
    Done,
    /// A page is absent, or read-only for a write: fault the chunk again.
    Missing,
    /// A page lies beyond the chunk's page table (only the last page of the 64-bit space, which
    /// no answer can cover).
    Outside,
}

/// Append the translation of `[s, e)` (inside one resident chunk).
fn translate_chunk(
    base: u64,
    pages: &[u64],
    s: u64,
    e: u64,
    write: bool,
    out: &mut Vec<GuestRange>,
) -> Translation {
    let mut a = s;
    while a < e {
        let pi = ((a - base) >> ODP_PAGE_SHIFT) as usize;
        let in_page = a & (ODP_PAGE_SIZE - 1);
        let n = (ODP_PAGE_SIZE - in_page).min(e - a);
        let Some(&p) = pages.get(pi) else {
            return Translation::Outside;
        };
        if p == ODP_ABSENT || (write && p & ODP_PAGE_WRITABLE == 0) {
            return Translation::Missing;
        }
        let gpa = (p & !(ODP_PAGE_SIZE - 1)) + in_page;
        match out.last_mut() {
            Some(l) if l.gpa + l.len == gpa => l.len += n,
            _ => out.push(GuestRange { gpa, len: n }),
        }
        a += n;
    }
    Translation::Done
}

/// Result of an ODP command, as a VRDMA_STATUS_* value.
pub type OdpStatus = u32;

impl MrTable {
    /// Resident chunks of the device (tests, stats).
    pub fn odp_resident_total(&self) -> usize {
        self.odp.resident_total()
    }

    /// Chunk table entries (pending, resident or failed) of every ODP MR (tests, stats).
    pub fn odp_chunk_count(&self) -> usize {
        (1..self.slot_count())
            .filter_map(|idx| self.get_by_index(idx).ok())
            .map(|mr| match &mr.kind {
                MrKind::Odp(o) | MrKind::ImplicitOdp(o) => o.chunks.len(),
                _ => 0,
            })
            .sum()
    }

    /// Outstanding page requests (tests, stats).
    pub fn odp_pending_requests(&self) -> usize {
        self.odp.pending_requests()
    }

    /// Fault page requests sent since daemon start (stats).
    pub fn odp_faults(&self) -> u64 {
        self.odp.faults
    }

    /// ADVISE_MR + F_FLUSH commands parked (tests, stats).
    pub fn odp_parked_advises(&self) -> usize {
        self.odp.flush.parked()
    }
}
