//! Completion queues (spec §5.3, §7).

use thiserror::Error;
use vrdma_spec::{
    Abi, VrdmaCqe, VRDMA_CQE_SIZE, VRDMA_EV_CQ_COMP, VRDMA_EV_CQ_ERR, VRDMA_RING_ERR_ACCESS,
    VRDMA_RING_ERR_OVERFLOW, VRDMA_WC_SUCCESS,
};

use crate::budget::Charge;
use crate::guest::output::{event, DeviceOutput};
use crate::guest::{GuestMem, Ring, RingError};
use std::time::{Duration, Instant};

/// log2 of the CQE size (`VRDMA_CQE_SIZE`, §5), the slot shift of a CQ ring.
pub const CQE_SHIFT: u32 = VRDMA_CQE_SIZE.trailing_zeros();

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

/// CQ moderation (spec §5.5): what MODIFY_CQ set, and the CQEs held back so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moderation {
    pub count: u16,
    pub period_us: u16,
    /// Qualifying CQEs written since the last event.
    pub held: u16,
    /// When the held CQEs fire at the latest (set with the first of them).
    pub deadline: Option<Instant>,
}

impl Moderation {
    pub fn active(&self) -> bool {
        self.count >= 2 && self.period_us >= 1
    }

    fn reset(&mut self) {
        self.held = 0;
        self.deadline = None;
    }
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
    /// Spec §5.5.
    pub moderation: Moderation,
}

impl Cq {
    pub fn new(cqn: u32, ring: Ring) -> Self {
        Cq {
            cqn,
            ring,
            broken: false,
            charge: Charge::default(),
            moderation: Moderation::default(),
        }
    }

    pub fn depth(&self) -> u32 {
        self.ring.depth()
    }

    /// Write `cqe` and advance the producer (release). Then, if the CQ is armed for it, exchange
    /// `cq_arm` to NONE and send one `VRDMA_EV_CQ_COMP` (one event per arm). `solicited` marks a
    /// solicited completion; a CQE with a non-zero status counts as solicited for SOLICITED arms.
    /// A moderated CQ (§5.5) holds successful CQEs back instead; `Ok(Some(deadline))` asks the
    /// caller to call [`Cq::moderation_expired`] at `deadline`.
    pub fn post_cqe(
        &mut self,
        mem: &GuestMem,
        out: &dyn DeviceOutput,
        cqe: &VrdmaCqe,
        solicited: bool,
    ) -> Result<Option<Instant>, CqError> {
        if self.broken {
            return Err(CqError::Broken);
        }
        match self.ring.cq_push(mem, cqe.as_bytes()) {
            Ok(()) => {}
            Err(RingError::Overflow) => {
                self.fail(mem, out, VRDMA_RING_ERR_OVERFLOW);
                return Err(CqError::Overflow);
            }
            Err(e) => {
                self.fail(mem, out, VRDMA_RING_ERR_ACCESS);
                return Err(CqError::Access(e));
            }
        }
        let sol = solicited || cqe.status != VRDMA_WC_SUCCESS;
        if self.moderation.active() && cqe.status == VRDMA_WC_SUCCESS {
            return self.hold(mem, out, sol);
        }
        self.fire(mem, out, sol)?;
        Ok(None)
    }

    /// §5.3 step 3 (exchange, event); the moderation count and timer restart.
    fn fire(&mut self, mem: &GuestMem, out: &dyn DeviceOutput, sol: bool) -> Result<(), CqError> {
        self.moderation.reset();
        match self.ring.cq_take_arm(mem, sol) {
            Ok(true) => out.event(event(VRDMA_EV_CQ_COMP, self.cqn, 0)),
            Ok(false) => {}
            Err(e) => {
                self.fail(mem, out, VRDMA_RING_ERR_ACCESS);
                return Err(CqError::Access(e));
            }
        }
        Ok(())
    }

    /// §5.5 rule 1: count a qualifying CQE; fire at `count`, start the timer with the first.
    fn hold(
        &mut self,
        mem: &GuestMem,
        out: &dyn DeviceOutput,
        sol: bool,
    ) -> Result<Option<Instant>, CqError> {
        match self.ring.cq_arm_matches(mem, sol) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => {
                self.fail(mem, out, VRDMA_RING_ERR_ACCESS);
                return Err(CqError::Access(e));
            }
        }
        let m = &mut self.moderation;
        m.held = m.held.saturating_add(1);
        if m.held >= m.count {
            self.fire(mem, out, sol)?;
            return Ok(None);
        }
        if m.deadline.is_none() {
            let d = Instant::now() + Duration::from_micros(u64::from(m.period_us));
            m.deadline = Some(d);
            return Ok(Some(d));
        }
        Ok(None)
    }

    /// §5.5 rule 2: the timer started at the first held CQE expired (`deadline` is the one
    /// [`Cq::post_cqe`] returned; a stale one, after the CQEs fired otherwise, does nothing).
    pub fn moderation_expired(
        &mut self,
        mem: &GuestMem,
        out: &dyn DeviceOutput,
        deadline: Instant,
    ) {
        if self.broken || self.moderation.deadline != Some(deadline) {
            return;
        }
        // The held CQEs qualified for the arm when they were written.
        let _ = self.fire(mem, out, true);
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
                // §5.5 rule 3: not held back.
                self.moderation.reset();
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
        let mut buf = [0u8; VRDMA_CQE_SIZE as usize];
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
