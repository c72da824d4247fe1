//! ADVISE_MR with `VRDMA_ADVISE_F_FLUSH` (spec §11.8): commands parked until the page requests of
//! their range have ended.
//!
//! A flush advise waits for a set of outstanding FAULT request ids: the ones it sent and the ones
//! already pending in its range when it arrived. Every way a request ends — answered (resident or
//! failed), timed out, cancelled by ODP_INVALIDATE or DEREG_MR — goes through
//! `OdpState::end_request`, which calls [`FlushWaits::request_ended`]; an advise whose last
//! request ended is finished (status OK: advice is a hint). Waiting on request ids rather than
//! chunk states keeps this exact and cheap: a chunk faulted again later is a new request the
//! advise does not wait for, so every advise finishes within one ODP timeout.

use std::collections::HashMap;

use crate::guest::Ticket;

/// Flush advises the device keeps waiting at once; one more is refused with NO_RESOURCES (spec
/// §11.8). Each holds a control-queue chain, so this also bounds what a driver can pin there.
pub const MAX_PARKED_ADVISE: usize = 64;

/// The parked flush advises of a device.
#[derive(Debug, Default)]
pub struct FlushWaits {
    /// Next ticket; never reset, so tickets are unique for the device's lifetime.
    next: u64,
    /// Ticket → number of its requests still outstanding (always ≥ 1).
    remaining: HashMap<Ticket, usize>,
    /// Request id → the tickets waiting for it.
    by_req: HashMap<u32, Vec<Ticket>>,
}

impl FlushWaits {
    /// No room for another parked advise.
    pub fn is_full(&self) -> bool {
        self.remaining.len() >= MAX_PARKED_ADVISE
    }

    /// Advises parked now.
    pub fn parked(&self) -> usize {
        self.remaining.len()
    }

    /// Park an advise waiting for `reqs` (outstanding, distinct, non-empty); returns its ticket.
    pub fn park(&mut self, reqs: &[u32]) -> Ticket {
        debug_assert!(!reqs.is_empty());
        self.next += 1;
        let t = Ticket(self.next);
        self.remaining.insert(t, reqs.len());
        for &r in reqs {
            self.by_req.entry(r).or_default().push(t);
        }
        t
    }

    /// Request `req_id` ended: returns the tickets that waited for nothing else.
    pub fn request_ended(&mut self, req_id: u32) -> Vec<Ticket> {
        let Some(tickets) = self.by_req.remove(&req_id) else {
            return Vec::new();
        };
        let mut done = Vec::new();
        for t in tickets {
            if let Some(n) = self.remaining.get_mut(&t) {
                *n -= 1;
                if *n == 0 {
                    self.remaining.remove(&t);
                    done.push(t);
                }
            }
        }
        done
    }

    /// Device reset: forget every parked advise without finishing it (the driver recovers the
    /// chains through the virtio reset).
    pub fn clear(&mut self) {
        self.remaining.clear();
        self.by_req.clear();
    }

    /// Check the bookkeeping against the outstanding request ids (tests): every awaited request
    /// is outstanding and every ticket's count matches its requests.
    pub fn check(&self, outstanding: impl Fn(u32) -> bool) -> Result<(), String> {
        let mut counts: HashMap<Ticket, usize> = HashMap::new();
        for (&r, ts) in &self.by_req {
            if !outstanding(r) {
                return Err(format!("advise waits for ended request {r}"));
            }
            for t in ts {
                *counts.entry(*t).or_default() += 1;
            }
        }
        if counts != self.remaining {
            return Err(format!(
                "advise counts {:?}, awaited {:?}",
                self.remaining, counts
            ));
        }
        if self.remaining.len() > MAX_PARKED_ADVISE {
            return Err("too many parked advises".into());
        }
        Ok(())
    }
}
