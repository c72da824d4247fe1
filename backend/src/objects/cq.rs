//! Completion queues (spec §5.3, §7).

use thiserror::Error;
use vrdma_spec::{Abi, VrdmaCqe, VRDMA_EV_CQ_COMP, VRDMA_EV_CQ_ERR};

use crate::budget::Charge;
use crate::device::output::{event, DeviceOutput};
use crate::guest::ring::{RING_ERR_ACCESS, RING_ERR_OVERFLOW};
use crate::guest::{GuestMem, Ring, RingError};

/// CQE size (fixed by the ABI).
pub const CQE_SIZE: u32 = 64;
pub const CQE_SHIFT: u32 = 6;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CqError {
    /// The CQ overflowed now: ring error set, CQ_ERR sent; the caller moves its QPs to ERROR.
    #[error("CQ overflow")]
    Overflow,
    /// The CQ is already in error (earlier overflow or ring access failure); nothing written.
    #[error("CQ is in error")]
    Broken,
    /// The ring is not accessible (guest memory changed under it): ring error ACCESS, CQ_ERR sent.
    #[error("CQ ring access failed: {0}")]
    Access(RingError),
}

/// A CQ.
#[derive(Debug)]
pub struct Cq {
    pub cqn: u32,
    pub ring: Ring,
    /// Set after an overflow / access error: the device stops writing CQEs.
    pub broken: bool,
    /// Host memory the CQ holds (spec §16): its struct and ring page list.
    pub charge: Charge,
}

impl Cq {
    pub fn new(cqn: u32, ring: Ring) -> Self {
        Cq {
            cqn,
            ring,
            broken: false,
            charge: Charge::default(),
        }
    }

    pub fn depth(&self) -> u32 {
        self.ring.depth()
    }

    /// Write `cqe` and advance the producer (release). Then, if the CQ is armed for it, exchange
    /// `cq_arm` to NONE and send one `VRDMA_EV_CQ_COMP` (one event per arm). `solicited` marks a
    /// solicited completion; a CQE with a non-zero status counts as solicited for SOLICITED arms.
    pub fn post_cqe(
        &mut self,
        mem: &GuestMem,
        out: &dyn DeviceOutput,
        cqe: &VrdmaCqe,
        solicited: bool,
    ) -> Result<(), CqError> {
        if self.broken {
            return Err(CqError::Broken);
        }
        match self.ring.cq_push(mem, cqe.as_bytes()) {
            Ok(()) => {}
            Err(RingError::Overflow) => {
                self.fail(mem, out, RING_ERR_OVERFLOW);
                return Err(CqError::Overflow);
            }
            Err(e) => {
                self.fail(mem, out, RING_ERR_ACCESS);
                return Err(CqError::Access(e));
            }
        }
        let sol = solicited || cqe.status != 0;
        match self.ring.cq_take_arm(mem, sol) {
            Ok(true) => out.event(event(VRDMA_EV_CQ_COMP, self.cqn, 0)),
            Ok(false) => {}
            Err(e) => {
                self.fail(mem, out, RING_ERR_ACCESS);
                return Err(CqError::Access(e));
            }
        }
        Ok(())
    }

    fn fail(&mut self, mem: &GuestMem, out: &dyn DeviceOutput, code: u32) {
        self.broken = true;
        let _ = self.ring.set_error(mem, code);
        out.event(event(VRDMA_EV_CQ_ERR, self.cqn, code));
    }

    /// A CQ_ARM doorbell: the arm is in memory; fire right away if completions are already
    /// pending and the CQ is armed (lets a driver that armed after the last CQE get an event).
    pub fn on_arm_doorbell(&mut self, mem: &GuestMem, out: &dyn DeviceOutput) {
        if self.broken {
            return;
        }
        if let Ok(n) = self.ring.cq_unpolled(mem) {
            if n > 0 {
                if let Ok(true) = self.ring.cq_take_arm(mem, false) {
                    out.event(event(VRDMA_EV_CQ_COMP, self.cqn, 0));
                }
            }
        }
    }

    /// RESIZE_CQ: copy the unpolled CQEs to the start of `new` and switch to it. Returns the
    /// number copied. Fails (nothing changed) if memory is inaccessible or if `new` cannot hold
    /// the unpolled CQEs plus `reserve` more (completions already owed, see the caller).
    pub fn resize(
        &mut self,
        mem: &GuestMem,
        mut new: Ring,
        reserve: u32,
    ) -> Result<u32, RingError> {
        let consumer = self.ring.guest_consumer(mem)?;
        let n = self.ring.cq_unpolled(mem)?;
        if n.saturating_add(reserve) > new.depth() {
            return Err(RingError::BadDepth(new.depth()));
        }
        let mut buf = [0u8; CQE_SIZE as usize];
        for i in 0..n {
            self.ring
                .read_entry(mem, consumer.wrapping_add(i), &mut buf)?;
            new.write_entry(mem, i, &buf)?;
        }
        let arm = mem.load_u32_acquire(self.ring.ctrl_gpa() + crate::guest::ring::CTRL_CQ_ARM)?;
        let c = new.ctrl_gpa();
        mem.store_u32_release(c + crate::guest::ring::CTRL_CONSUMER, 0)?;
        mem.store_u32_release(c + crate::guest::ring::CTRL_ERROR, 0)?;
        mem.store_u32_release(c + crate::guest::ring::CTRL_CQ_ARM, arm)?;
        mem.store_u32_release(c + crate::guest::ring::CTRL_PRODUCER, n)?;
        new.set_dev_index(n);
        self.ring = new;
        self.broken = false;
        Ok(n)
    }
}
