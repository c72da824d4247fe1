//! [`EngineSender`]: how the vhost-user side feeds the engine's workers without waiting for
//! them.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use vrdma_spec::VrdmaDoorbell;

use crate::sync::lock;
use crate::transport::workers::{doorbell_worker, each_bit, Inbox};

/// Handle the vhost-user side uses to feed the engine. Cheap to clone.
#[derive(Clone)]
pub struct EngineSender {
    /// One per worker (`workers.rs`).
    pub(super) inboxes: Arc<[Inbox]>,
    /// Set when the engine stops; every worker checks it before and after each wait.
    pub(super) stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for EngineSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineSender").finish_non_exhaustive()
    }
}

impl EngineSender {
    /// Queue doorbell records (spec §8) and wake the engine. Never blocks on the network; O(1)
    /// per record, records for the same object merged, pending records bounded (see
    /// `doorbells.rs`).
    pub fn doorbells(&self, dbs: &[VrdmaDoorbell]) {
        let n = self.inboxes.len();
        let mut kicked = 0u32;
        if n == 1 {
            if let Some(inbox) = self.inboxes.first() {
                let mut q = lock(&inbox.queue);
                for db in dbs {
                    q.push(*db);
                }
                kicked = 1;
            }
        } else {
            // Each record to its QP's worker (`workers.rs`).
            for db in dbs {
                let w = doorbell_worker(db, n);
                if let Some(inbox) = self.inboxes.get(w) {
                    lock(&inbox.queue).push(*db);
                    kicked |= 1 << w;
                }
            }
        }
        self.kick_workers(kicked);
    }

    /// Queue one doorbell record.
    pub fn doorbell(&self, db: VrdmaDoorbell) {
        self.doorbells(&[db]);
    }

    /// Same as [`EngineSender::doorbell`].
    pub fn push(&self, db: VrdmaDoorbell) {
        self.doorbells(&[db]);
    }

    /// Wake the engine to re-run timers and resumed QPs (call after control commands that may
    /// unblock work, e.g. ODP_PAGE_RESP, MODIFY_QP): every worker.
    pub fn kick(&self) {
        for inbox in self.inboxes.iter() {
            inbox.kick();
        }
    }

    /// Wake the workers set in `mask`.
    pub(super) fn kick_workers(&self, mask: u32) {
        for w in each_bit(mask) {
            if let Some(inbox) = self.inboxes.get(w) {
                inbox.kick();
            }
        }
    }

    /// Wait, at most `limit` and holding no device lock, until every worker has run the
    /// doorbell records queued so far and sent their frames (spec §8; `workers::fence`).
    pub fn fence(&self, limit: Duration) -> bool {
        crate::transport::workers::fence(&self.inboxes, &self.stop, limit)
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.inboxes.len()
    }
}
