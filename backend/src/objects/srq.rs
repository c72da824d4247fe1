//! Shared receive queues (spec §4, §6.2).

use vrdma_spec::{VRDMA_EV_SRQ_ERR, VRDMA_EV_SRQ_LIMIT_REACHED};

use crate::budget::Charge;
use crate::device::output::{event, DeviceOutput};
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
                self.limit = 0;
                out.event(event(VRDMA_EV_SRQ_LIMIT_REACHED, self.srqn, 0));
            }
        }
    }
}
