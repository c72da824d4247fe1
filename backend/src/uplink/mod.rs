//! Uplinks: where the port's Ethernet frames go to and come from.
//!
//! - [`udp::UdpUplink`]: one Ethernet frame per UDP datagram, no header or length prefix — the
//!   framing of QEMU's `-netdev dgram,local.type=inet,...,remote.type=inet,...` (net/dgram.c sends
//!   the frame with one `sendto()` and hands each `recv()`ed datagram to the NIC as one frame), so a
//!   vrdma backend can talk to another backend or to a QEMU guest NIC (e.g. Linux rxe in a VM).
//! - [`tap::TapUplink`]: a Linux TAP device (`IFF_TAP | IFF_NO_PI`), needs CAP_NET_ADMIN.
//! - [`impair::Impaired`]: test wrapper dropping / duplicating / reordering frames (seeded).
//! - [`pcap::PcapTee`]: `--pcap` capture of every frame sent and received, written off the
//!   engine thread.
//!
//! Specs (`--uplink`): `udp:local=ADDR:PORT,remote=ADDR:PORT` or `tap:NAME`, see [`UplinkSpec`].

pub mod impair;
pub mod pcap;
pub mod spec;
pub mod tap;
pub mod udp;

use std::os::unix::io::RawFd;
use std::sync::Arc;

pub use impair::{ImpairConfig, ImpairStats, Impaired};
pub use pcap::{PcapError, PcapStats, PcapTee, PcapWriter};
pub use spec::{SpecError, UplinkSpec};
pub use tap::TapUplink;
pub use udp::UdpUplink;

/// Largest frame an uplink carries (a UDP datagram payload; far above any Ethernet MTU we use).
/// Receive buffers of this size never see [`UplinkError::Truncated`].
pub const MAX_FRAME: usize = 65535;

#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    #[error("UDP uplink: cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("TAP uplink {name}: {op}: {source}")]
    Tap {
        name: String,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("TAP device name {0:?} is empty or longer than 15 bytes")]
    TapName(String),
    /// The socket/device cannot take the frame now (EAGAIN/ENOBUFS). The frame was not sent;
    /// callers may treat this as loss (RoCE retransmits).
    #[error("uplink busy, frame not sent")]
    WouldBlock,
    #[error("uplink send: {0}")]
    Send(std::io::Error),
    #[error("uplink receive: {0}")]
    Recv(std::io::Error),
    /// The received frame was larger than the buffer; it has been consumed and dropped.
    #[error("received frame of {len} bytes does not fit a {buf}-byte buffer (dropped)")]
    Truncated { len: usize, buf: usize },
    #[error("frame of {0} bytes too large for the uplink")]
    TooLarge(usize),
}

/// See [`Uplink::icrc_offload`]. The default (both false) is a plain network link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IcrcOffload {
    /// RoCEv2 frames handed to [`Uplink::send_frames`] may lack their ICRC: the uplink computes
    /// it for every one that leaves the process.
    pub seals_tx: bool,
    /// Received frames never crossed a link, or their ICRC was checked where they entered: the
    /// engine need not check it.
    pub checked_rx: bool,
    /// [`Uplink::send_frames`] takes fabric segments (several frames of one QP in one buffer,
    /// `wire::segment`) and received buffers may be segments (spec §16.2 rule 6). Only a
    /// fabric device port; a wrapper never forwards it (it would see segments, not frames).
    pub segments: bool,
    /// Segments handed to [`Uplink::send_segment_refs`] may keep their payload by reference
    /// (`wire::segment::PayloadRefs`, spec §16.2 rule 6): the sender's engine then leaves it in
    /// guest memory. Only with `segments`; a fabric device port that opted in.
    pub payload_refs: bool,
    /// With `payload_refs`: the smallest packet payload that goes by reference (0: every one);
    /// smaller ones are copied when built.
    pub refs_min_payload: usize,
}

impl IcrcOffload {
    /// A wrapper that passes received frames through untouched and sends through the inner
    /// port's `send` (which no uplink seals): the inner port's receive promise holds, nothing
    /// else is offered.
    pub fn of_wrapper(inner: IcrcOffload) -> IcrcOffload {
        IcrcOffload {
            checked_rx: inner.checked_rx,
            ..IcrcOffload::default()
        }
    }
}

/// Frames moved per batched system call (`sendmmsg` / `recvmmsg` on the UDP uplink).
pub const IO_BATCH: usize = 64;

/// An Ethernet frame pipe. Frames are whole Ethernet frames without FCS. All calls are
/// non-blocking; wait for readability on [`Uplink::as_raw_fd`] (epoll) before `recv`.
pub trait Uplink: Send + Sync {
    /// Send one frame.
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError>;
    /// Receive one frame into `buf`: `Ok(Some(len))`, or `Ok(None)` if none is pending.
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError>;
    /// The fd to poll for readability.
    fn as_raw_fd(&self) -> RawFd;

    /// The link state of the uplink (spec §2.2 `port_state`): `Some(up)` for an uplink that has
    /// one (TAP: the interface is up and has carrier), `None` for one that has none (UDP: the
    /// port stays ACTIVE). Called by the engine every `LINK_POLL`, so it must be cheap.
    fn link_up(&self) -> Option<bool> {
        None
    }

    /// Are received frames waiting? Answered without a system call, for the engine's busy-poll
    /// (`transport/wait.rs` `Poller`); `None` if the uplink cannot tell cheaply (sockets),
    /// and then the engine never busy-polls it. Only an in-memory queue (a fabric device port)
    /// answers.
    fn rx_pending(&self) -> Option<bool> {
        None
    }

    /// The engine starts (`true`) or stops busy-polling [`Uplink::rx_pending`]: while it polls,
    /// an in-memory queue may skip the eventfd that wakes a sleeping engine. After it stops, the
    /// engine looks at `rx_pending` once more before it sleeps. Sockets ignore it.
    fn set_rx_polling(&self, _polling: bool) {}

    /// What the uplink does with the RoCEv2 ICRC for the engine (spec §16.2). Only a fabric
    /// device port offloads it: the fabric seals the frames that leave the process and checks
    /// those that enter it, so frames between devices are never checksummed. A wrapper forwards
    /// each half only if it keeps that half's promise.
    fn icrc_offload(&self) -> IcrcOffload {
        IcrcOffload::default()
    }

    /// Datagrams this uplink received and refused because they did not come from its
    /// configured remote (spec §16.3 "Uplink trust"; UDP only, 0 for the others).
    fn refused_sources(&self) -> u64 {
        0
    }

    /// Send frames in order; returns how many were handed to the uplink. Frames after a
    /// [`UplinkError::WouldBlock`] are not sent (loss, which RC retransmits); other per-frame
    /// errors are logged by the caller's policy and skipped. Uplinks with a batched system
    /// call override this (UDP: `sendmmsg`).
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        for (i, f) in frames.iter().enumerate() {
            match self.send(f) {
                Ok(()) => {}
                Err(UplinkError::WouldBlock) => return Ok(i),
                Err(e) if i == 0 => return Err(e),
                Err(_) => return Ok(i),
            }
        }
        Ok(frames.len())
    }

    /// Send owned frames in order (same outcome as [`Uplink::send_batch`]). An uplink that
    /// keeps frames in memory (the fabric) may take a frame's buffer and leave another buffer
    /// (any capacity, possibly empty) in its place, saving a copy; the caller recycles whatever
    /// `frames` holds afterwards. The default sends slices through `send_batch`.
    fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
        let mut sent = 0;
        for chunk in frames.chunks(IO_BATCH) {
            let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
            for (s, f) in slices.iter_mut().zip(chunk) {
                *s = f;
            }
            match self.send_batch(&slices[..chunk.len()]) {
                Ok(n) => sent += n,
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(sent)
    }

    /// Send one fabric segment (`wire::segment`, spec §16.2 rule 6), marked as one by this
    /// call and by nothing in its bytes; returns how many of its frames were handed on. Only
    /// an engine whose uplink has [`IcrcOffload::segments`] calls it, in order with its
    /// [`Uplink::send_frames`] calls. The default splits it into its standard frames (software
    /// GSO) and sends those, so any uplink stays correct; a fabric device port moves it whole.
    /// A buffer that does not parse as a segment is dropped.
    fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, UplinkError> {
        let Some(s) = crate::wire::segment::Segment::parse(seg) else {
            return Ok(0);
        };
        let mut frames: Vec<Vec<u8>> = s.frames().map(<[u8]>::to_vec).collect();
        self.send_frames(&mut frames)
    }

    /// [`Uplink::send_segment`] for a segment whose payloads are held by reference (`refs`,
    /// out of band like the segment mark; spec §16.2 rule 6). The default gathers them into
    /// the buffer (`wire::segment::materialize`: the frames a copying writer would have built)
    /// and sends that; a stale reference loses the segment (`Ok(0)`). A fabric device port
    /// moves it whole to an engine that takes segments.
    fn send_segment_refs(
        &self,
        seg: &mut Vec<u8>,
        refs: Box<dyn crate::wire::segment::PayloadRefs>,
    ) -> Result<usize, UplinkError> {
        let ok = crate::wire::segment::materialize(seg, &*refs);
        refs.recycle();
        if !ok {
            return Ok(0);
        }
        self.send_segment(seg)
    }

    /// Receive into up to `bufs.len()` buffers; returns how many buffers were used (0: none
    /// pending) and appends the frames found to `frames` (a buffer may hold several frames when
    /// the uplink merges datagrams, UDP GRO). Truncated frames are dropped. Uplinks with a
    /// batched system call override this (UDP: `recvmmsg`).
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        let mut n = 0;
        while n < bufs.len() {
            match self.recv(&mut bufs[n]) {
                Ok(Some(len)) => {
                    frames.push(RxFrame {
                        slot: n,
                        off: 0,
                        len,
                        segment: false,
                        refs: None,
                        source: None,
                    });
                    n += 1;
                }
                Ok(None) => break,
                Err(UplinkError::Truncated { .. }) => continue,
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(n)
    }
}

/// One received frame: `bufs[slot][off..off + len]` of a [`Uplink::recv_batch`] call.
#[derive(Debug, Default)]
pub struct RxFrame {
    pub slot: usize,
    pub off: usize,
    pub len: usize,
    /// The buffer is a fabric segment (`wire::segment`, spec §16.2 rule 6), not one frame.
    /// Set only by a fabric device port for what an engine handed to `send_segment`: every
    /// other buffer is an ordinary frame, whatever its bytes.
    pub segment: bool,
    /// The segment's payloads held by reference (`wire::segment::PayloadRefs`), if any: only
    /// with `segment`, only from a fabric device port. A wrapper that changes the buffer must
    /// first `materialize` them (and drop them).
    pub refs: Option<Box<dyn crate::wire::segment::PayloadRefs>>,
    /// The fabric port that sent the buffer (a device's or an uplink's index), set by a
    /// fabric device port: what the netdev backlog keeps its fair share by (spec §16.4 rule
    /// 4). None from any other uplink.
    pub source: Option<usize>,
}

/// An uplink behind a smart pointer is that uplink: every method, the batch calls included,
/// goes to it (a pointer left on the per-frame defaults would undo the batching).
macro_rules! forward_uplink {
    ($ptr:ident) => {
        impl<T: Uplink + ?Sized> Uplink for $ptr<T> {
            fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
                (**self).send(frame)
            }
            fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
                (**self).send_frames(frames)
            }
            fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, UplinkError> {
                (**self).send_segment(seg)
            }
            fn send_segment_refs(
                &self,
                seg: &mut Vec<u8>,
                refs: Box<dyn crate::wire::segment::PayloadRefs>,
            ) -> Result<usize, UplinkError> {
                (**self).send_segment_refs(seg, refs)
            }
            fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
                (**self).send_batch(frames)
            }
            fn recv_batch(
                &self,
                bufs: &mut [Vec<u8>],
                frames: &mut Vec<RxFrame>,
            ) -> Result<usize, UplinkError> {
                (**self).recv_batch(bufs, frames)
            }
            fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
                (**self).recv(buf)
            }
            fn as_raw_fd(&self) -> RawFd {
                (**self).as_raw_fd()
            }
            fn link_up(&self) -> Option<bool> {
                (**self).link_up()
            }
            fn rx_pending(&self) -> Option<bool> {
                (**self).rx_pending()
            }
            fn set_rx_polling(&self, polling: bool) {
                (**self).set_rx_polling(polling)
            }
            fn icrc_offload(&self) -> IcrcOffload {
                (**self).icrc_offload()
            }
            fn refused_sources(&self) -> u64 {
                (**self).refused_sources()
            }
        }
    };
}

forward_uplink!(Box);
forward_uplink!(Arc);
