//! Shared receive queues (spec §4, §6.2).

use vrdma_spec::{VRDMA_EV_SRQ_ERR, VRDMA_EV_SRQ_LIMIT_REACHED};

use crate::budget::Charge;
use crate::guest::output::{event, DeviceOutput};
use crate::guest::{GuestMem, Ring, RingError};

/// An SRQ.
#[derive(Debug)]
pub struct Srq {
    pub srqn: u32,
    pub pd: u32,
    pub ring: Ring,
    pub max_sge: u32,
    /// srq_limit; 0 = not armed. After the limit event fires it is reset to 0 (IBTA).
    pub limit: u32,
    /// Set after an index/access error (SRQ_ERR sent); the device stops using it.
    pub broken: bool,
    /// Number of QPs attached (DESTROY_SRQ while attached → BUSY).
    pub qp_refs: u32,
    /// Host memory the SRQ holds (spec §16): its struct and ring page list.
    pub charge: Charge,
    /// An XRC SRQ's domain and CQ (spec §13.7); `None` for a basic SRQ.
    pub xrc: Option<SrqXrc>,
}

/// What makes an SRQ an XRC SRQ (spec §13.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqXrc {
    pub xrcdn: u32,
    /// The CQ its receive completions go to.
    pub cqn: u32,
}

impl Srq {
    /// Take the next receive WQE (the first `buf.len()` bytes of its slot) and advance the
    /// consumer. `Ok(false)` = the SRQ is empty. Fires SRQ_LIMIT_REACHED (and disarms) when the
    /// number of posted WQEs drops below the limit. An index or access error marks the SRQ broken
    /// and sends SRQ_ERR.
    pub fn pop(
        &mut self,
        mem: &GuestMem,
        out: &dyn DeviceOutput,
        buf: &mut [u8],
    ) -> Result<bool, RingError> {
        if self.broken {
            return Err(RingError::Broken);
        }
        let r = (|| {
            let n = self.ring.pending(mem)?;
            if n == 0 {
                return Ok(false);
            }
            let idx = self.ring.dev_index();
            self.ring.read_entry(mem, idx, buf)?;
            self.ring.advance_consumer(mem, 1)?;
            Ok(true)
        })();
        match r {
            Ok(took) => {
                if took {
                    self.check_limit(mem, out);
                }
                Ok(took)
            }
            Err(e) => {
                self.fail(mem, out, &e);
                Err(e)
            }
        }
    }

    fn fail(&mut self, mem: &GuestMem, out: &dyn DeviceOutput, e: &RingError) {
        self.broken = true;
        let _ = self.ring.set_error(mem, e.ring_error_code());
        out.event(event(VRDMA_EV_SRQ_ERR, self.srqn, e.ring_error_code()));
    }

    /// Limit check: posted WQEs < limit → one SRQ_LIMIT_REACHED, limit back to 0 (disarmed).
    pub fn check_limit(&mut self, mem: &GuestMem, out: &dyn DeviceOutput) {
        if self.limit == 0 {
            return;
        }
        if let Ok(n) = self.ring.pending(mem) {
            if n < self.limit {
                // §9: info = the limit that fired.
                out.event(event(VRDMA_EV_SRQ_LIMIT_REACHED, self.srqn, self.limit));
                self.limit = 0;
            }
        }
    }

    /// MODIFY_SRQ with `VRDMA_SRQ_MAX_WR` (spec §11.7): copy the posted, not yet taken WQEs
    /// (whole slots, in order) to slots 0..n−1 of `new` (same slot size), write its control page
    /// (`producer` = n, `consumer` = 0, `error` = 0) and switch to it. `limit` is the limit the
    /// SRQ has after the command. Fails with nothing changed if the SRQ is in error, the old
    /// indices are invalid, guest memory is inaccessible, or `new` is shallower than n or `limit`.
    pub fn resize(&mut self, mem: &GuestMem, mut new: Ring, limit: u32) -> Result<u32, RingError> {
        if self.broken {
            return Err(RingError::Broken);
        }
        if new.entry_shift() != self.ring.entry_shift() {
            return Err(RingError::BadEntryShift(new.entry_shift()));
        }
        let n = self.ring.pending(mem)?;
        if n > new.depth() || limit > new.depth() {
            return Err(RingError::BadDepth(new.depth()));
        }
        let first = self.ring.dev_index();
        let mut slot = vec![0u8; self.ring.entry_size() as usize];
        for i in 0..n {
            self.ring
                .read_entry(mem, first.wrapping_add(i), &mut slot)?;
            new.write_entry(mem, i, &slot)?;
        }
        let c = new.ctrl_gpa();
        mem.store_u32_release(c + crate::guest::ring::CTRL_CONSUMER, 0)?;
        mem.store_u32_release(c + crate::guest::ring::CTRL_ERROR, 0)?;
        // The producer last: the slots before it are written (§4.4).
        mem.store_u32_release(c + crate::guest::ring::CTRL_PRODUCER, n)?;
        new.set_dev_index(0);
        self.ring = new;
        Ok(n)
    }
}
