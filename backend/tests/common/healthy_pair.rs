//! `HealthyPair`: an RC pair beside the QPs under attack, whose rounds prove nothing is lost.

use std::time::Duration;

use vrdma_spec::*;

use super::{
    pattern, pump_until, rdma, send, Link, MrPair, Node, QpH, QpPair, QpPairSpec, RingH, RtsAttrs,
};

/// its rounds prove that other QPs lose nothing (the "never loses another QP's data" rule).
pub struct HealthyPair {
    pub qa: QpH,
    pub qb: QpH,
    cqa: RingH,
    cqb: RingH,
    pub src: u64,
    pub dst: u64,
    pub ka: u32,
    pub kb: u32,
}

impl HealthyPair {
    /// Connected RC QPs with their own CQs and 64 KiB MRs on `a` (source) and `b` (target).
    pub fn new(a: &mut Node, b: &mut Node, pda: u32, pdb: u32) -> HealthyPair {
        let QpPair {
            qa, qb, cqa, cqb, ..
        } = QpPair::open(a, b, pda, pdb, QpPairSpec::rc(1024, RtsAttrs::mtu(3)));
        let MrPair { src, ka, dst, kb } = MrPair::new(a, b, pda, pdb, 65536);
        HealthyPair {
            qa,
            qb,
            cqa,
            cqb,
            src,
            dst,
            ka,
            kb,
        }
    }

    /// One RDMA WRITE of `write_len` bytes (≤ 32 KiB) and one SEND of `send_len` bytes (≤ 8 KiB,
    /// `send_len` ≤ `write_len`): both complete successfully, the data lands, both QPs stay in RTS.
    #[allow(clippy::too_many_arguments)]
    pub fn round(
        &mut self,
        a: &mut Node,
        b: &mut Node,
        link: &mut Link,
        round: u64,
        write_len: u32,
        send_len: u32,
    ) {
        let data = pattern(round, write_len as usize);
        a.write(self.src, &data);
        let mut rq = self.qb.rq.clone().unwrap();
        b.post_recv(&mut rq, round, &[(self.dst + 32768, 8192, self.kb)]);
        self.qb.rq = Some(rq);
        let mut qa = self.qa.clone();
        a.post_send(
            &mut qa,
            &rdma(
                round,
                VRDMA_WR_RDMA_WRITE,
                (self.src, write_len, self.ka),
                self.dst,
                self.kb,
            ),
        );
        a.post_send(
            &mut qa,
            &send(round + 1_000_000, (self.src, send_len, self.ka)),
        );
        self.qa = qa;
        let (mut ca, mut cb) = (Vec::new(), Vec::new());
        let (cqa, cqb) = (&mut self.cqa, &mut self.cqb);
        pump_until(a, b, link, Duration::from_secs(30), |a, b| {
            ca.extend(a.poll_cq(cqa));
            cb.extend(b.poll_cq(cqb));
            ca.len() >= 2 && !cb.is_empty()
        });
        assert!(
            ca.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
            "round {round}: healthy requester {ca:?}"
        );
        assert_eq!(cb.len(), 1);
        assert_eq!(cb[0].status, VRDMA_WC_SUCCESS, "round {round}");
        assert_eq!(cb[0].byte_len, send_len);
        assert_eq!(
            b.read(self.dst, write_len as usize),
            data,
            "round {round}: WRITE data"
        );
        assert_eq!(
            b.read(self.dst + 32768, send_len as usize),
            data[..send_len as usize].to_vec(),
            "round {round}: SEND data"
        );
        assert_eq!(a.qp_state(self.qa.qpn), VRDMA_QPS_RTS);
        assert_eq!(b.qp_state(self.qb.qpn), VRDMA_QPS_RTS);
    }
}
