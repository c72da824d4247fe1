//! The ODP commands on the MR table (spec §10, §11.8): ODP_PAGE_RESP installs a chunk (and
//! enforces the residency budgets), ODP_INVALIDATE drops a range, ADVISE_MR prefetches, and the
//! tick times out requests and expires failed chunks. The chunk states they move between are
//! described in `odp.rs`.

use super::*;
use crate::guest::GuestMem;

/// An ODP_PAGE_RESP command's fields (`struct vrdma_cmd_odp_page_resp`, spec §11.8) and its
/// trailing pages.
struct PageResp<'a> {
    req_id: u32,
    key: u32,
    status: u32,
    flags: u32,
    iova: u64,
    pages: &'a [u64],
}

impl OdpState {
    /// Sends the page request for chunk `c` of MR `key` (spanning `mr`: iova, length) and makes
    /// the chunk pending on it (a failed chunk is forgotten, a resident one's pages are kept as
    /// its prior pages); returns the request id.
    fn request_chunk(
        &mut self,
        o: &mut OdpMr,
        key: u32,
        c: u64,
        mr: (u64, u64),
        write: bool,
        now: Instant,
    ) -> u32 {
        self.remove_failed(o, key, c);
        let prior = self.remove_resident(o, c).unwrap_or_default();
        let req_id = self.send_fault(key, c, mr.0, mr.1, write, now);
        o.chunks.insert(
            c,
            Chunk::Pending {
                req_id,
                write,
                sent: now,
                waiters: Vec::new(),
                prior,
            },
        );
        req_id
    }

    /// Makes `chunk` (a `Chunk::Resident`, its `last_use` set here) chunk `c` of MR `idx`'s
    /// `o`, youngest in both LRUs; over the MR's residency budget, reclaims the MR's least
    /// recently used other chunk and returns it.
    fn install(&mut self, o: &mut OdpMr, idx: u32, c: u64, mut chunk: Chunk) -> Option<u64> {
        let t = self.next_tick();
        if let Chunk::Resident { last_use, .. } = &mut chunk {
            *last_use = t;
        }
        o.chunks.insert(c, chunk);
        o.lru.insert(t, c);
        self.lru.insert(t, (idx, c));
        o.resident += 1;
        self.resident_total += 1;
        if o.resident <= self.config.max_resident_per_mr {
            return None;
        }
        // The MR's least recently used chunk (never the one just installed, which has the
        // youngest tick).
        let victim = o.lru.values().copied().find(|&v| v != c)?;
        self.remove_resident(o, victim);
        Some(victim)
    }
}

impl PageResp<'_> {
    /// The answer's outcome for a chunk of `npages` pages from `sp`: `Err((chunk status,
    /// command status))` when the driver reported a failure or the answer is malformed.
    fn check(&self, sp: u64, npages: usize, mem: &GuestMem) -> Result<(), (u32, u32)> {
        use vrdma_spec::*;
        let (iova, pages) = (self.iova, self.pages);
        if self.status != VRDMA_STATUS_OK {
            // The driver could not map the range (ACCESS, BAD_ADDRESS, NO_RESOURCES...): the
            // answer is accepted and the waiters fail with its status.
            Err((self.status, VRDMA_STATUS_OK))
        } else if iova & (ODP_PAGE_SIZE - 1) != 0
            || iova < sp
            || pages.is_empty()
            || ((iova - sp) >> ODP_PAGE_SHIFT) as usize + pages.len() > npages
            || pages.iter().any(|&p| p & (ODP_PAGE_SIZE - 1) != 0)
        {
            // The answer may cover part of the chunk (§12.4), never more.
            Err((VRDMA_STATUS_INVALID, VRDMA_STATUS_INVALID))
        } else if pages.iter().any(|&p| !mem.check_range(p, ODP_PAGE_SIZE)) {
            Err((VRDMA_STATUS_BAD_ADDRESS, VRDMA_STATUS_BAD_ADDRESS))
        } else {
            Ok(())
        }
    }

    /// The chunk's page table with the answer's pages written over the ones a partially
    /// resident chunk already had (`prior`), and whether every present page is writable.
    fn merge_pages(&self, prior: Vec<u64>, sp: u64, npages: usize) -> (Vec<u64>, bool) {
        let mut table = if prior.len() == npages {
            prior
        } else {
            vec![ODP_ABSENT; npages]
        };
        let w = if self.flags & vrdma_spec::VRDMA_ODP_RESP_F_WRITABLE != 0 {
            ODP_PAGE_WRITABLE
        } else {
            0
        };
        let first = ((self.iova - sp) >> ODP_PAGE_SHIFT) as usize;
        for (slot, &p) in table[first..].iter_mut().zip(self.pages) {
            *slot = p | w;
        }
        let writable = table
            .iter()
            .all(|&p| p == ODP_ABSENT || p & ODP_PAGE_WRITABLE != 0);
        (table, writable)
    }
}

impl MrTable {
    /// ODP_PAGE_RESP. `pages` are the trailing 4 KiB GPAs. An install beyond a residency budget
    /// reclaims the least recently used chunk and sends its RECLAIM notice.
    pub fn odp_page_resp(
        &mut self,
        req_id: u32,
        key: u32,
        status: u32,
        flags: u32,
        iova: u64,
        pages: &[u64],
    ) -> OdpStatus {
        let r = PageResp {
            req_id,
            key,
            status,
            flags,
            iova,
            pages,
        };
        self.page_resp(r, true)
            .unwrap_or(vrdma_spec::VRDMA_STATUS_INVALID)
    }

    /// ODP_PAGE_RESP as the command `c` carries it, with its trailing `pages`. Beside the engine
    /// workers (`may_reclaim` false) an answer whose install would reclaim a chunk changes
    /// nothing and returns `None` (the command then runs on the exclusive device). A reclaim
    /// sends the RECLAIM notice, after which the driver may unmap the chunk, so no unit of work
    /// may still copy through the victim's translation when it leaves; only the exclusive
    /// device promises that at the moment the notice goes out (ARCHITECTURE.md "Invariants").
    pub fn odp_page_resp_cmd(
        &mut self,
        c: &vrdma_spec::VrdmaCmdOdpPageResp,
        pages: &[u64],
        may_reclaim: bool,
    ) -> Option<OdpStatus> {
        let r = PageResp {
            req_id: c.req_id,
            key: c.mr_key,
            status: c.status,
            flags: c.flags,
            iova: c.iova,
            pages,
        };
        self.page_resp(r, may_reclaim)
    }

    /// The answer `r`; `None` if it would reclaim a chunk and `may_reclaim` is false.
    fn page_resp(&mut self, r: PageResp<'_>, may_reclaim: bool) -> Option<OdpStatus> {
        let PageResp { req_id, key, .. } = r;
        use vrdma_spec::*;
        let now = self.odp.now();
        let Some(&Req {
            key: rkey,
            chunk: c,
            ..
        }) = self.odp.reqs.get(&req_id)
        else {
            return Some(VRDMA_STATUS_NOT_FOUND);
        };
        // Spec §12.4 step 4: a request id that is not outstanding *for this key* is unknown. The
        // request stays outstanding (a stray answer must not end another MR's fault).
        if rkey != key {
            return Some(VRDMA_STATUS_NOT_FOUND);
        }
        let shift = self.odp.config.chunk_shift;
        let Ok((mr, odp, mem)) = self.odp_parts(key) else {
            return Some(VRDMA_STATUS_NOT_FOUND);
        };
        let (mr_iova, mr_len) = (mr.iova, mr.length);
        let o = match &mut mr.kind {
            MrKind::Odp(o) | MrKind::ImplicitOdp(o) => o,
            _ => return Some(VRDMA_STATUS_INVALID),
        };
        let (s, e) = chunk_range(c, shift, mr_iova, mr_len);
        let (sp, ep) = page_span(s, e);
        let npages_need = ((ep - sp) >> ODP_PAGE_SHIFT) as usize;
        // Decide the outcome, then update the chunk once.
        let outcome = r.check(sp, npages_need, mem);
        // The same test as the install's below: one chunk more than a budget allows reclaims.
        let reclaims = o.resident + 1 > odp.config.max_resident_per_mr
            || odp.resident_total + 1 > odp.config.max_resident;
        if outcome.is_ok() && reclaims && !may_reclaim {
            return None;
        }
        odp.end_request(req_id);
        let (waiters, prior) = match o.chunks.remove(&c) {
            Some(Chunk::Pending { waiters, prior, .. }) => (waiters, prior),
            Some(other) => {
                // Should not happen (a request id maps to a pending chunk); keep the state.
                o.chunks.insert(c, other);
                (Vec::new(), Vec::new())
            }
            None => (Vec::new(), Vec::new()),
        };
        odp.resume(waiters);
        match outcome {
            Err((chunk_status, cmd_status)) => {
                odp.set_failed(o, key, c, chunk_status, now);
                Some(cmd_status)
            }
            Ok(()) => {
                let (table, writable) = r.merge_pages(prior, sp, npages_need);
                let idx = key_index(key);
                let resident = Chunk::Resident {
                    base: sp,
                    pages: table,
                    writable,
                    last_use: 0, // set by `install`
                };
                let reclaimed_own = odp.install(o, idx, c, resident);
                // The driver may unmap a reclaimed chunk's pages as soon as it reads the
                // notice: fabric references through the MR (spec §16.2 rule 6) die before it
                // is sent, as they do for ODP_INVALIDATE. Only a reclaim fences: an install
                // alone takes no permission away, and fencing it would drop the MR's
                // references in flight.
                if let Some(victim) = reclaimed_own {
                    self.fence_slot(key);
                    self.odp.send_reclaim(key, victim, mr_iova, mr_len);
                }
                self.enforce_device_budget(idx, c);
                Some(VRDMA_STATUS_OK)
            }
        }
    }

    /// Drop device-wide LRU chunks until the device budget holds (never the chunk just installed).
    /// The device LRU map gives the victim directly: no walk over MRs or chunks.
    fn enforce_device_budget(&mut self, keep_mr: u32, keep_chunk: u64) {
        // The chunks reclaimed: their keys fenced once each, then the notices sent (see
        // odp_page_resp).
        let mut reclaimed: Vec<(u32, u64, u64, u64)> = Vec::new();
        while self.odp.resident_total > self.odp.config.max_resident {
            let Some((idx, c)) = self
                .odp
                .lru
                .values()
                .copied()
                .find(|&v| v != (keep_mr, keep_chunk))
            else {
                return;
            };
            let Some((mr, odp)) = self.odp_parts_by_index(idx) else {
                // An LRU entry without its MR would be a bookkeeping bug; drop it, don't spin.
                self.odp.lru.retain(|_, v| *v != (idx, c));
                continue;
            };
            let (key, mr_iova, mr_len) = (mr.key, mr.iova, mr.length);
            let (MrKind::Odp(o) | MrKind::ImplicitOdp(o)) = &mut mr.kind else {
                odp.lru.retain(|_, v| *v != (idx, c));
                continue;
            };
            if odp.remove_resident(o, c).is_none() {
                odp.lru.retain(|_, v| *v != (idx, c));
                continue;
            }
            reclaimed.push((key, c, mr_iova, mr_len));
        }
        for (i, &(key, ..)) in reclaimed.iter().enumerate() {
            if !reclaimed[..i].iter().any(|r| r.0 == key) {
                self.fence_slot(key);
            }
        }
        for (key, c, mr_iova, mr_len) in reclaimed {
            self.odp.send_reclaim(key, c, mr_iova, mr_len);
        }
    }

    /// ODP_INVALIDATE: drop translations overlapping `[iova, iova + length)` of the ODP MR `key`.
    pub fn odp_invalidate(&mut self, key: u32, iova: u64, length: u64) -> OdpStatus {
        use vrdma_spec::*;
        let Ok((mr, odp, _)) = self.odp_parts(key) else {
            return VRDMA_STATUS_NOT_FOUND;
        };
        let shift = odp.config.chunk_shift;
        let o = match &mut mr.kind {
            MrKind::Odp(o) | MrKind::ImplicitOdp(o) => o,
            _ => return VRDMA_STATUS_INVALID,
        };
        if length == 0 {
            return VRDMA_STATUS_OK;
        }
        let end = iova.saturating_add(length);
        let first = iova >> shift;
        let last = (end - 1) >> shift;
        // Iterate over the chunks that exist (the range may be huge for implicit MRs).
        let hit: Vec<u64> = o
            .chunks
            .keys()
            .copied()
            .filter(|&c| c >= first && c <= last)
            .collect();
        for c in hit {
            match o.chunks.get(&c) {
                Some(Chunk::Resident { .. }) => {
                    odp.remove_resident(o, c);
                }
                Some(Chunk::Pending { .. }) => {
                    if let Some(Chunk::Pending {
                        req_id, waiters, ..
                    }) = o.chunks.remove(&c)
                    {
                        odp.end_request(req_id);
                        odp.resume(waiters);
                    }
                }
                Some(Chunk::Failed { .. }) => odp.remove_failed(o, key, c),
                None => {}
            }
        }
        // Fabric references through this MR (spec §16.2 rule 6) die with the translation.
        self.fence_slot(key);
        VRDMA_STATUS_OK
    }

    /// ADVISE_MR (see the module documentation). `Parked` only with F_FLUSH while requests of
    /// the range are outstanding.
    pub fn odp_advise(
        &mut self,
        key: u32,
        advice: u32,
        flags: u32,
        iova: u64,
        length: u64,
    ) -> CmdOutcome {
        use vrdma_spec::*;
        let done = CmdOutcome::Done;
        let now = self.odp.now();
        let (write, flush) = match advice_mode(advice, flags) {
            Ok(mode) => mode,
            Err(status) => return done(status),
        };
        let max = self.odp.config.max_resident as u64;
        let Ok((mr, odp, _)) = self.odp_parts(key) else {
            return done(VRDMA_STATUS_NOT_FOUND);
        };
        if write && mr.access & vrdma_spec::VRDMA_ACCESS_LOCAL_WRITE == 0 {
            return done(VRDMA_STATUS_ACCESS);
        }
        let (mr_iova, mr_len) = (mr.iova, mr.length);
        let implicit = matches!(mr.kind, MrKind::ImplicitOdp(_));
        let o = match &mut mr.kind {
            MrKind::Odp(o) | MrKind::ImplicitOdp(o) => o,
            // Advice on a non-ODP MR is meaningless but harmless: everything is resident.
            _ => return done(VRDMA_STATUS_OK),
        };
        if length == 0 {
            return done(VRDMA_STATUS_OK);
        }
        let Some(end) = iova.checked_add(length) else {
            return done(VRDMA_STATUS_INVALID);
        };
        if !implicit && (iova < mr_iova || end > mr_iova + mr_len) {
            return done(VRDMA_STATUS_INVALID);
        }
        if advice == VRDMA_ADVISE_PREFETCH_NO_FAULT {
            return done(VRDMA_STATUS_OK);
        }
        // Refused before anything is sent, so the command has no effect (§11.1).
        if flush && odp.flush.is_full() {
            return done(VRDMA_STATUS_NO_RESOURCES);
        }
        let shift = odp.config.chunk_shift;
        let first = iova >> shift;
        let last = (end - 1) >> shift;
        let count = (last - first + 1).min(max);
        // Requests a flush waits for: the ones sent here and the ones already outstanding.
        // Advice is a hint: over the request cap (§12.4) the rest of the range is not
        // requested; a flush then waits only for the requests that exist.
        let room = odp.config.max_requests.saturating_sub(odp.reqs.len());
        let (mut awaited, to_request) =
            chunks_to_request(o, first..first + count, write, flush, room, now);
        // The new chunk entries are charged up front, so an advise the budget cannot take has
        // no effect (§11.1, §16: NO_RESOURCES).
        let new = to_request
            .iter()
            .filter(|c| !o.chunks.contains_key(c))
            .count() as u64;
        if !odp.charge_entries(o, new) {
            return done(VRDMA_STATUS_NO_RESOURCES);
        }
        for c in to_request {
            awaited.push(odp.request_chunk(o, key, c, (mr_iova, mr_len), write, now));
        }
        if !flush || awaited.is_empty() {
            return done(VRDMA_STATUS_OK);
        }
        CmdOutcome::Parked(odp.flush.park(&awaited))
    }

    /// What [`MrTable::odp_tick`] at `now` would return when it has nothing to change (no
    /// request or failed chunk due, no QP waiting for budget, `now` not ahead of the wall
    /// clock): its next deadline. `None`: it has work, call it. Every engine batch ticks, and
    /// this runs under the table's read lock, beside the other workers' translations.
    pub fn odp_tick_idle(&self, now: Instant) -> Option<Option<Instant>> {
        let o = &self.odp;
        if !o.budget_waiters.is_empty() || now > Instant::now() {
            return None;
        }
        let a = o.deadlines.first().map(|d| d.0);
        let b = o.failed.first().map(|f| f.0);
        if a.is_some_and(|d| d <= now) || b.is_some_and(|d| d <= now) {
            return None;
        }
        Some(match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Expire page requests older than the timeout (their chunks fail, waiters are resumed) and
    /// drop failed chunks whose `FAIL_HOLD` is over. Returns the next deadline of either kind.
    /// Call from the engine's timer tick; it costs what expires, not what is outstanding.
    pub fn odp_tick(&mut self, now: Instant) -> Option<Instant> {
        self.odp.clock = Some(self.odp.clock.map_or(now, |c| c.max(now)));
        let now = self.odp.now();
        let starved = std::mem::take(&mut self.odp.budget_waiters);
        let retry = (!starved.is_empty()).then(|| now + BUDGET_RETRY);
        self.odp.resume(starved);
        while let Some(&(deadline, req_id)) = self.odp.deadlines.first() {
            if deadline > now {
                break;
            }
            let Some(&Req { key, chunk: c, .. }) = self.odp.reqs.get(&req_id) else {
                self.odp.deadlines.pop_first();
                continue;
            };
            let Ok((mr, odp, _)) = self.odp_parts(key) else {
                self.odp.end_request(req_id);
                continue;
            };
            let (MrKind::Odp(o) | MrKind::ImplicitOdp(o)) = &mut mr.kind else {
                odp.end_request(req_id);
                continue;
            };
            let ours =
                matches!(o.chunks.get(&c), Some(Chunk::Pending { req_id: r, .. }) if *r == req_id);
            odp.end_request(req_id);
            if ours {
                if let Some(Chunk::Pending { waiters, .. }) = o.chunks.remove(&c) {
                    odp.resume(waiters);
                }
                odp.set_failed(o, key, c, ODP_STATUS_TIMEOUT, now);
            }
        }
        while let Some(&(expiry, key, c)) = self.odp.failed.first() {
            if expiry > now {
                break;
            }
            self.odp.failed.pop_first();
            if let Ok((mr, _, _)) = self.odp_parts(key) {
                if let MrKind::Odp(o) | MrKind::ImplicitOdp(o) = &mut mr.kind {
                    if matches!(o.chunks.get(&c), Some(Chunk::Failed { at, .. }) if *at + FAIL_HOLD == expiry)
                    {
                        o.chunks.remove(&c);
                    }
                }
            }
        }
        let a = self.odp.deadlines.first().map(|d| d.0);
        let b = self.odp.failed.first().map(|f| f.0);
        let next = match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (next, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// ADVISE_MR's `advice` and `flags`: (whether the prefetch is for writing, whether F_FLUSH
/// waits for it), or the status refusing them.
fn advice_mode(advice: u32, flags: u32) -> Result<(bool, bool), OdpStatus> {
    use vrdma_spec::*;
    if flags & !VRDMA_ADVISE_F_FLUSH != 0 {
        return Err(VRDMA_STATUS_INVALID);
    }
    let flush = flags & VRDMA_ADVISE_F_FLUSH != 0;
    let write = match advice {
        VRDMA_ADVISE_PREFETCH => false,
        VRDMA_ADVISE_PREFETCH_WRITE => true,
        VRDMA_ADVISE_PREFETCH_NO_FAULT => false,
        _ => return Err(VRDMA_STATUS_INVALID),
    };
    Ok((write, flush))
}

/// The advised chunks of `o` in `chunks`: the requests already outstanding for them (a flush
/// waits for those too) and the chunks to request, at most `room` of them. Without a flush the
/// walk stops once nothing more can be requested.
fn chunks_to_request(
    o: &OdpMr,
    chunks: std::ops::Range<u64>,
    write: bool,
    flush: bool,
    room: usize,
    now: Instant,
) -> (Vec<u32>, Vec<u64>) {
    let mut awaited: Vec<u32> = Vec::new();
    let mut to_request: Vec<u64> = Vec::new();
    for c in chunks {
        let need = match o.chunks.get(&c) {
            None => true,
            Some(Chunk::Resident { writable, .. }) => write && !*writable,
            Some(Chunk::Failed { at, .. }) => now.duration_since(*at) >= FAIL_HOLD,
            Some(Chunk::Pending { req_id, .. }) => {
                awaited.push(*req_id);
                false
            }
        };
        if need && to_request.len() < room {
            to_request.push(c);
        } else if to_request.len() >= room && !flush {
            break; // nothing more will be requested, and no flush waits for the rest
        }
    }
    (awaited, to_request)
}
