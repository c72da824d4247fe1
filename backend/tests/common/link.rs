//! Two nodes joined in-process: a cable of two in-memory pipes (optionally through the wire
//! impairment wrapper), and pumps that move frames and fire timers in virtual time; also a pair
//! of UDP uplinks on loopback.

use std::collections::VecDeque;
use std::os::unix::io::RawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vrdma_backend::transport::{self, ctx::Cqe};
use vrdma_backend::uplink::{ImpairConfig, Impaired, Uplink, UplinkError};

use super::{Node, RingH};

#[derive(Default)]
pub struct MemPipe {
    q: Mutex<VecDeque<Vec<u8>>>,
}

impl Uplink for MemPipe {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.q.lock().unwrap().push_back(frame.to_vec());
        Ok(())
    }
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        match self.q.lock().unwrap().pop_front() {
            Some(f) => {
                let n = f.len().min(buf.len());
                buf[..n].copy_from_slice(&f[..n]);
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }
    fn as_raw_fd(&self) -> RawFd {
        -1
    }
}

impl MemPipe {
    fn drain(&self) -> Vec<Vec<u8>> {
        self.q.lock().unwrap().drain(..).collect()
    }
}

/// A frame filter: return false to drop the frame.
pub type Filter = Box<dyn FnMut(&[u8]) -> bool>;

/// Two directions of a cable, each optionally impaired.
pub struct Link {
    ab: Impaired<MemPipe>,
    ba: Impaired<MemPipe>,
    /// Optional frame filter (a → b): return false to drop.
    pub filter_ab: Option<Filter>,
    pub filter_ba: Option<Filter>,
    /// Frames a → b delivered.
    pub frames_ab: u64,
    pub frames_ba: u64,
}

impl Link {
    pub fn clean() -> Link {
        Self::impaired(ImpairConfig::default())
    }

    pub fn impaired(cfg: ImpairConfig) -> Link {
        let cfg2 = ImpairConfig {
            seed: cfg.seed.wrapping_add(77),
            ..cfg
        };
        Link {
            ab: Impaired::new(MemPipe::default(), cfg),
            ba: Impaired::new(MemPipe::default(), cfg2),
            filter_ab: None,
            filter_ba: None,
            frames_ab: 0,
            frames_ba: 0,
        }
    }
}

impl Link {
    /// Deliver every frame `a` and `b` have sent to the other (through the impairments);
    /// `observe` applies the filters and counts the frames delivered. Returns how many were.
    fn carry(&mut self, a: &mut Node, b: &mut Node, observe: bool) -> usize {
        let ab = Self::carry_one_way(&self.ab, self.filter_ab.as_mut(), a, b, observe);
        let ba = Self::carry_one_way(&self.ba, self.filter_ba.as_mut(), b, a, observe);
        if observe {
            self.frames_ab += ab as u64;
            self.frames_ba += ba as u64;
        }
        ab + ba
    }

    fn carry_one_way(
        pipe: &Impaired<MemPipe>,
        filter: Option<&mut Filter>,
        from: &mut Node,
        to: &mut Node,
        observe: bool,
    ) -> usize {
        let mut filter = filter.filter(|_| observe);
        for f in std::mem::take(&mut from.dev.outbox(0).frames) {
            if filter.as_mut().is_none_or(|flt| flt(&f)) {
                let _ = pipe.send(&f);
            }
        }
        let _ = pipe.flush();
        let mut moved = 0;
        for f in pipe.inner().drain() {
            transport::on_frame(&to.dev, &f);
            moved += 1;
        }
        moved
    }
}

/// Move frames between two nodes until `done` holds, firing timers in virtual time whenever the
/// link is quiet. Panics after `limit` of wall-clock time.
pub fn pump_until(
    a: &mut Node,
    b: &mut Node,
    link: &mut Link,
    limit: Duration,
    mut done: impl FnMut(&mut Node, &mut Node) -> bool,
) {
    let start = Instant::now();
    let mut vt = Instant::now();
    loop {
        if done(a, b) {
            return;
        }
        assert!(start.elapsed() < limit, "pump: timed out");
        let moved = link.carry(a, b, true);
        if moved == 0 && a.dev.outbox(0).frames.is_empty() && b.dev.outbox(0).frames.is_empty() {
            // Quiet: advance virtual time to the earliest transport deadline.
            let now = Instant::now().max(vt);
            let na = transport::on_tick(&a.dev, now);
            let nb = transport::on_tick(&b.dev, now);
            if !a.dev.outbox(0).frames.is_empty() || !b.dev.outbox(0).frames.is_empty() {
                continue;
            }
            match (na, nb) {
                (None, None) => {
                    if done(a, b) {
                        return;
                    }
                    panic!("pump: idle with no timers and the condition not met");
                }
                (x, y) => {
                    let d = match (x, y) {
                        (Some(x), Some(y)) => x.min(y),
                        (Some(x), None) | (None, Some(x)) => x,
                        _ => unreachable!(),
                    };
                    vt = d.max(vt);
                    let na = transport::on_tick(&a.dev, vt);
                    let nb = transport::on_tick(&b.dev, vt);
                    let _ = (na, nb);
                }
            }
        }
    }
}

/// Pump until `cq` (a CQ of `a`) gave `n` CQEs, failing after `limit`; returns them.
pub fn pump_cqes(
    a: &mut Node,
    b: &mut Node,
    link: &mut Link,
    cq: &mut RingH,
    n: usize,
    limit: Duration,
) -> Vec<Cqe> {
    let mut got = Vec::new();
    pump_until(a, b, link, limit, |a, _| {
        got.extend(a.poll_cq(cq));
        got.len() >= n
    });
    got
}

/// Pump until both nodes are quiet with no timers left (or `limit`).
pub fn pump_idle(a: &mut Node, b: &mut Node, link: &mut Link) {
    let start = Instant::now();
    loop {
        let moved = link.carry(a, b, false);
        if moved == 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "pump_idle: timed out"
        );
    }
}

/// Two UDP uplinks on loopback sending to each other (4 MiB socket buffers when allowed).
pub fn udp_pair() -> (
    vrdma_backend::uplink::UdpUplink,
    vrdma_backend::uplink::UdpUplink,
) {
    use std::net::UdpSocket;
    use std::os::unix::io::AsRawFd;
    let sa = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let sb = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for s in [&sa, &sb] {
        let v: libc::c_int = 4 << 20;
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            // SAFETY: setsockopt on a valid socket fd with a pointer to a live c_int and its size.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
    let (aa, ab) = (sa.local_addr().unwrap(), sb.local_addr().unwrap());
    (
        vrdma_backend::uplink::UdpUplink::from_socket(sa, ab).expect("uplink a"),
        vrdma_backend::uplink::UdpUplink::from_socket(sb, aa).expect("uplink b"),
    )
}
