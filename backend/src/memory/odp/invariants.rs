//! The ODP bookkeeping's self-check (tests and fuzzing): counters, request ids and budgets agree.

use super::*;

impl MrTable {
    /// Check the ODP bookkeeping (tests): the device and per-MR resident counters match the
    /// resident chunks, every outstanding request id maps to a pending chunk with that id and
    /// every pending chunk has its request id registered, the budgets hold, and parked flush
    /// advises wait only for outstanding requests.
    pub fn odp_check_invariants(&self) -> Result<(), String> {
        let mut total = 0usize;
        let mut pending = 0usize;
        let mut failed = 0usize;
        for idx in 1..self.slot_count() {
            let Ok(mr) = self.get_by_index(idx) else {
                continue;
            };
            let o = match &mr.kind {
                MrKind::Odp(o) | MrKind::ImplicitOdp(o) => o,
                _ => continue,
            };
            let (res, p, f) = self.check_odp_mr(idx, mr, o)?;
            pending += p;
            failed += f;
            total += res;
        }
        if total != self.odp.resident_total {
            return Err(format!(
                "{total} resident, counter {}",
                self.odp.resident_total
            ));
        }
        if total > self.odp.config.max_resident {
            return Err("device over its budget".into());
        }
        if pending != self.odp.reqs.len() || pending != self.odp.deadlines.len() {
            return Err(format!(
                "{pending} pending chunks, {} requests, {} deadlines",
                self.odp.reqs.len(),
                self.odp.deadlines.len()
            ));
        }
        if pending > self.odp.config.max_requests {
            return Err("over the request cap".into());
        }
        if total != self.odp.lru.len() {
            return Err(format!(
                "{total} resident, {} in the device LRU",
                self.odp.lru.len()
            ));
        }
        if failed != self.odp.failed.len() {
            return Err(format!(
                "{failed} failed chunks, {} expiry entries",
                self.odp.failed.len()
            ));
        }
        self.odp.flush.check(|r| self.odp.reqs.contains_key(&r))
    }

    /// One ODP MR's part of [`MrTable::odp_check_invariants`]: its chunks are where the device's
    /// LRU, request and expiry tables say, its counters match, its budget holds. Returns its
    /// (resident, pending, failed) chunk counts.
    fn check_odp_mr(&self, idx: u32, mr: &Mr, o: &OdpMr) -> Result<(usize, usize, usize), String> {
        let (mut res, mut pending, mut failed) = (0usize, 0usize, 0usize);
        for (c, ch) in &o.chunks {
            match ch {
                Chunk::Resident { last_use, .. } => {
                    res += 1;
                    if o.lru.get(last_use) != Some(c)
                        || self.odp.lru.get(last_use) != Some(&(idx, *c))
                    {
                        return Err(format!("resident chunk {c} of {:#x} not in LRU", mr.key));
                    }
                }
                Chunk::Pending { req_id, .. } => {
                    pending += 1;
                    let ok = self.odp.reqs.get(req_id).is_some_and(|r| {
                        r.key == mr.key
                            && r.chunk == *c
                            && self.odp.deadlines.contains(&(r.deadline, *req_id))
                    });
                    if !ok {
                        return Err(format!("pending chunk {c} of {:#x} not registered", mr.key));
                    }
                }
                Chunk::Failed { at, .. } => {
                    failed += 1;
                    if !self.odp.failed.contains(&(*at + FAIL_HOLD, mr.key, *c)) {
                        return Err(format!("failed chunk {c} of {:#x} never expires", mr.key));
                    }
                }
            }
        }
        if o.lru.len() != res {
            return Err(format!(
                "MR {:#x}: {res} resident, {} in LRU",
                mr.key,
                o.lru.len()
            ));
        }
        if res != o.resident {
            return Err(format!(
                "MR {:#x}: {res} resident, counter {}",
                mr.key, o.resident
            ));
        }
        if res > self.odp.config.max_resident_per_mr {
            return Err(format!("MR {:#x} over its budget", mr.key));
        }
        Ok((res, pending, failed))
    }
}
