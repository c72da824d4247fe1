//! UDP uplink: each Ethernet frame is exactly one UDP datagram payload (QEMU `-netdev dgram`
//! framing). The socket is bound to LOCAL and sends to REMOTE with `sendto`. It takes
//! datagrams from REMOTE only (address and port, spec §16.3 "Uplink trust"): any other
//! source's datagram is dropped and counted ([`Uplink::refused_sources`]), so a host that can
//! merely reach the port cannot inject frames.

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::io::{AsRawFd, RawFd};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{RxFrame, Uplink, UplinkError, IO_BATCH, MAX_FRAME};
use crate::sync::lock;

/// Send and receive buffer size requested by [`UdpUplink::new`].
pub const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Best effort: SO_{RCV,SND}BUFFORCE (CAP_NET_ADMIN) else SO_{RCV,SND}BUF (capped by the sysctls).
fn grow_buffers(sock: &UdpSocket) {
    let v: libc::c_int = SOCKET_BUFFER;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        for opt in [force, plain] {
            // SAFETY: setsockopt on a socket we own with a pointer to a live c_int and its size.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                break;
            }
        }
    }
}

/// `remote` as a C socket address for `sendmmsg`.
fn sockaddr_of(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is a plain C struct for which all-zero bytes are valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

#[derive(Debug)]
pub struct UdpUplink {
    sock: UdpSocket,
    remote: SocketAddr,
    /// UDP GSO (UDP_SEGMENT) is used for batches; probed at creation, turned off for good if
    /// the kernel refuses a segmented send.
    gso: AtomicBool,
    /// UDP GRO is on for this socket (received buffers may hold several frames).
    gro: bool,
    /// See [`Leftover`].
    leftover: std::sync::Mutex<Leftover>,
    /// Datagrams dropped for coming from another source than `remote`.
    refused: AtomicU64,
}

/// The socket address the kernel wrote into `ss` (`len` bytes), if it is IPv4 or IPv6.
fn socket_addr_of(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and sockaddr_storage
            // is large enough and suitably aligned for one.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::from((
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::from((
                sin6.sin6_addr.s6_addr,
                u16::from_be(sin6.sin6_port),
            )))
        }
        _ => None,
    }
}

/// Probe UDP GSO (reading UDP_SEGMENT works where the kernel has it, Linux >= 4.18) and turn
/// on UDP GRO (Linux >= 5.0). Either may be missing; the uplink then moves one datagram per
/// frame.
fn offloads(sock: &UdpSocket) -> (bool, bool) {
    let fd = sock.as_raw_fd();
    let mut v: libc::c_int = 0;
    let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a live c_int with its size, on a socket we own.
    let gso = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_UDP,
            UDP_SEGMENT,
            (&mut v as *mut libc::c_int).cast(),
            &mut l,
        )
    } == 0;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to a live c_int and its size, on a socket we own.
    let gro = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_UDP,
            UDP_GRO,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } == 0;
    (gso, gro)
}

impl UdpUplink {
    /// Bind `local` (port 0 picks a free port, see [`UdpUplink::local_addr`]) and send to `remote`.
    /// Socket buffers are raised to [`SOCKET_BUFFER`] where allowed: a window of RoCE packets
    /// would otherwise overflow the default ~200 KiB and cost retransmissions.
    pub fn new(local: SocketAddr, remote: SocketAddr) -> Result<UdpUplink, UplinkError> {
        let sock = UdpSocket::bind(local).map_err(|source| UplinkError::Bind {
            addr: local,
            source,
        })?;
        sock.set_nonblocking(true)
            .map_err(|source| UplinkError::Bind {
                addr: local,
                source,
            })?;
        grow_buffers(&sock);
        Ok(Self::with_offloads(sock, remote))
    }

    /// Use an already bound socket (made non-blocking here), sending to `remote`.
    pub fn from_socket(sock: UdpSocket, remote: SocketAddr) -> Result<UdpUplink, UplinkError> {
        let addr = sock
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        sock.set_nonblocking(true)
            .map_err(|source| UplinkError::Bind { addr, source })?;
        Ok(Self::with_offloads(sock, remote))
    }

    fn with_offloads(sock: UdpSocket, remote: SocketAddr) -> UdpUplink {
        let (gso, gro) = if std::env::var_os("VRDMA_UDP_NO_OFFLOAD").is_some() {
            (false, false)
        } else {
            offloads(&sock)
        };
        UdpUplink {
            sock,
            remote,
            gso: AtomicBool::new(gso),
            gro,
            leftover: Default::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// Whether UDP GSO / GRO are in use (probed at creation).
    pub fn offloads(&self) -> (bool, bool) {
        (self.gso.load(Ordering::Relaxed), self.gro)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn remote_addr(&self) -> SocketAddr {
        self.remote
    }

    /// Did a datagram with source `from` come from the configured remote? (An IPv4 remote
    /// matches its IPv4-mapped form on a dual-stack socket.)
    fn is_remote(&self, from: Option<SocketAddr>) -> bool {
        from.is_some_and(|f| {
            f.port() == self.remote.port()
                && f.ip().to_canonical() == self.remote.ip().to_canonical()
        })
    }

    /// `recvfrom` of one datagram into `buf`: its length, or `None` if none is pending. A
    /// datagram from another source than the remote is dropped and counted.
    fn recv_from_remote(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        loop {
            // SAFETY: sockaddr_storage is a plain C struct for which all-zero bytes are valid.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: `buf` is writable for `buf.len()` bytes and `ss` for `len` bytes during
            // the call; MSG_TRUNC only changes the return value (the datagram's real length).
            let n = unsafe {
                libc::recvfrom(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    // A pending ICMP error is not a frame (see `recv`).
                    Some(libc::EINTR) | Some(libc::ECONNREFUSED) => continue,
                    Some(libc::EAGAIN) => return Ok(None),
                    _ => return Err(UplinkError::Recv(e)),
                }
            }
            if !self.is_remote(socket_addr_of(&ss, len)) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let n = n as usize;
            if n > buf.len() {
                return Err(UplinkError::Truncated {
                    len: n,
                    buf: buf.len(),
                });
            }
            return Ok(Some(n));
        }
    }
}

impl Uplink for UdpUplink {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        if frame.len() > MAX_FRAME {
            return Err(UplinkError::TooLarge(frame.len()));
        }
        loop {
            match self.sock.send_to(frame, self.remote) {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        return Err(UplinkError::WouldBlock)
                    }
                    // Nobody listening on the remote yet (ICMP port unreachable reported on a later
                    // send): a cable without a peer just loses the frame.
                    Some(libc::ECONNREFUSED) => return Ok(()),
                    _ => return Err(UplinkError::Send(e)),
                },
            }
        }
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        if self.gro {
            return self.recv_one_gro(buf);
        }
        self.recv_from_remote(buf)
    }

    fn refused_sources(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// `sendmmsg`: up to [`IO_BATCH`] frames per system call; with UDP GSO, runs of equal-size
    /// frames (the last may be shorter) go as one message the kernel segments ([`gso_groups`]).
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        if let Some(f) = frames.iter().find(|f| f.len() > MAX_FRAME) {
            return Err(UplinkError::TooLarge(f.len()));
        }
        let mut done = 0;
        while done < frames.len() {
            let chunk = &frames[done..(done + IO_BATCH).min(frames.len())];
            let gso = self.gso.load(Ordering::Relaxed);
            match self.sendmmsg_chunk(chunk, gso) {
                Ok(n) => done += n,
                Err(SendStop::Busy) => return Ok(done),
                // The kernel refused a segmented message (e.g. no checksum offload on the
                // route): GSO off for good, resend the chunk frame by frame.
                Err(SendStop::Failed(e))
                    if gso && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) =>
                {
                    log::info!("UDP uplink: GSO refused ({e}); sending one datagram per frame");
                    self.gso.store(false, Ordering::Relaxed);
                }
                // Nobody listening on the remote yet (see `send`): that frame is lost.
                Err(SendStop::Failed(e)) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    done += 1
                }
                Err(SendStop::Failed(_)) if done > 0 => return Ok(done),
                Err(SendStop::Failed(e)) => return Err(UplinkError::Send(e)),
            }
        }
        Ok(done)
    }

    /// `recvmmsg`: up to [`IO_BATCH`] datagrams per system call; with UDP GRO a buffer may hold
    /// several frames of the cmsg's segment size, which are split here (no copy). Truncated
    /// datagrams are dropped.
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        if self.gro {
            // Frames a single-frame recv left over come first (rare: only when both are used).
            let mut lo = lock(&self.leftover);
            let mut used = 0;
            while used < bufs.len() {
                let Some(f) = lo.frames.pop_front() else {
                    break;
                };
                let (Some(src), Some(dst)) = (
                    lo.buf.get(f.off..f.off + f.len),
                    bufs[used].get_mut(..f.len),
                ) else {
                    continue;
                };
                dst.copy_from_slice(src);
                frames.push(RxFrame {
                    slot: used,
                    off: 0,
                    len: f.len,
                    segment: false,
                    refs: None,
                    source: None,
                });
                used += 1;
            }
            if used > 0 {
                return Ok(used);
            }
        }
        self.recv_batch_raw(bufs, frames)
    }
}

impl UdpUplink {
    /// `recvmmsg` into `bufs` (see [`Uplink::recv_batch`]): one message header per buffer,
    /// one system call, then each datagram taken (spec §16.3 "Uplink trust") and cut into its
    /// frames.
    fn recv_batch_raw(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        let want = bufs.len().min(IO_BATCH);
        if want == 0 {
            return Ok(0);
        }
        let gro = self.gro;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; IO_BATCH];
        let mut ctl = [CmsgBuf::default(); IO_BATCH];
        // SAFETY: sockaddr_storage is a plain C struct for which all-zero bytes are valid.
        let mut names: [libc::sockaddr_storage; IO_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are valid.
        let mut msgs: [libc::mmsghdr; IO_BATCH] = unsafe { std::mem::zeroed() };
        for (((m, v), c), (name, buf)) in msgs
            .iter_mut()
            .zip(iov.iter_mut())
            .zip(ctl.iter_mut())
            .zip(names.iter_mut().zip(bufs.iter_mut()))
            .take(want)
        {
            prepare_msg(m, v, name, buf, gro.then_some(c));
        }
        // SAFETY: `msgs[..want]` were prepared just above from distinct buffers (`bufs`, `iov`,
        // `names`, `ctl`) that live, unmoved and otherwise unused, until the call returns.
        let Some(n) = (unsafe { self.recvmmsg_now(&mut msgs[..want]) })? else {
            return Ok(0);
        };
        for (slot, m) in msgs.iter().enumerate().take(n) {
            let name = &names[slot];
            if let Some(len) = self.take_datagram(m, name, bufs[slot].len()) {
                let seg = if gro { gro_segment(&m.msg_hdr) } else { None };
                push_frames(frames, slot, len, seg);
            }
        }
        Ok(n)
    }

    /// One `recvmmsg` of what is queued now (`MSG_DONTWAIT`, no timeout), retried on EINTR and
    /// on a pending ICMP error, which is not a frame (see `recv`). `None`: nothing queued.
    ///
    /// # Safety
    /// Each header of `msgs` must point at one iovec describing a distinct, live, writable
    /// buffer, at its own live name buffer and (GRO) at its own live control buffer.
    unsafe fn recvmmsg_now(
        &self,
        msgs: &mut [libc::mmsghdr],
    ) -> Result<Option<usize>, UplinkError> {
        loop {
            // SAFETY: the caller's contract covers every header of `msgs`; a null timeout with
            // MSG_DONTWAIT returns what is queued now.
            let n = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    msgs.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // A pending ICMP error is not a frame (see `recv`).
                Some(libc::EINTR) | Some(libc::ECONNREFUSED) => continue,
                Some(libc::EAGAIN) => return Ok(None),
                _ => return Err(UplinkError::Recv(e)),
            }
        }
    }

    /// The length of a received datagram (clipped to its buffer's `cap`), or `None` if it is
    /// dropped: truncated, or from another source than REMOTE (spec §16.3 "Uplink trust",
    /// counted in [`Uplink::refused_sources`]).
    fn take_datagram(
        &self,
        m: &libc::mmsghdr,
        name: &libc::sockaddr_storage,
        cap: usize,
    ) -> Option<usize> {
        if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return None;
        }
        if !self.is_remote(socket_addr_of(name, m.msg_hdr.msg_namelen)) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some((m.msg_len as usize).min(cap))
    }
}

/// Point `m` at `buf` (through the iovec `v`), at its name buffer and, with GRO, at its
/// control buffer `ctl`. Nothing is read or written through the pointers here.
fn prepare_msg(
    m: &mut libc::mmsghdr,
    v: &mut libc::iovec,
    name: &mut libc::sockaddr_storage,
    buf: &mut [u8],
    ctl: Option<&mut CmsgBuf>,
) {
    m.msg_hdr.msg_name = (name as *mut libc::sockaddr_storage).cast();
    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    *v = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    m.msg_hdr.msg_iov = v;
    m.msg_hdr.msg_iovlen = 1;
    if let Some(c) = ctl {
        m.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
        m.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>();
    }
}

/// The frames of the `len`-byte datagram in buffer `slot`: with a GRO segment size `seg`
/// smaller than it, one frame per segment (the last may be shorter), split in place without a
/// copy; else the datagram is one frame.
fn push_frames(frames: &mut Vec<RxFrame>, slot: usize, len: usize, seg: Option<usize>) {
    match seg {
        Some(g) if g > 0 && g < len => {
            let mut off = 0;
            while off < len {
                let l = g.min(len - off);
                frames.push(RxFrame {
                    slot,
                    off,
                    len: l,
                    segment: false,
                    refs: None,
                    source: None,
                });
                off += l;
            }
        }
        _ => frames.push(RxFrame {
            slot,
            off: 0,
            len,
            segment: false,
            refs: None,
            source: None,
        }),
    }
}

/// `linux/udp.h` socket options (SOL_UDP): GSO segment size, GRO on receive.
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments in one GSO send (`UDP_MAX_SEGMENTS` is 64 on older kernels) and most bytes
/// (a UDP datagram's payload over IPv4).
const GSO_MAX_SEGS: usize = 64;
const GSO_MAX_BYTES: usize = 65507;

/// Room for one control message with a small payload (`CMSG_SPACE(4)` is 24 on 64-bit Linux),
/// aligned for `cmsghdr`.
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
struct CmsgBuf([u8; 32]);

enum SendStop {
    /// EAGAIN / ENOBUFS: stop, the rest is loss.
    Busy,
    Failed(std::io::Error),
}

/// Split `frames` into GSO groups: runs of equal length, the last frame of a run may be
/// shorter (the kernel's rule for UDP_SEGMENT), bounded by [`GSO_MAX_SEGS`] and
/// [`GSO_MAX_BYTES`]. Returns (start, count, segment size) per group.
fn gso_groups(frames: &[&[u8]], out: &mut [(usize, usize, usize); IO_BATCH]) -> usize {
    let mut groups = 0;
    let mut i = 0;
    while i < frames.len() && groups < IO_BATCH {
        let seg = frames[i].len();
        let mut n = 1;
        let mut bytes = seg;
        while i + n < frames.len() && n < GSO_MAX_SEGS && seg > 0 {
            let l = frames[i + n].len();
            if l > seg || l == 0 || bytes + l > GSO_MAX_BYTES {
                break;
            }
            n += 1;
            bytes += l;
            if l < seg {
                break;
            }
        }
        out[groups] = (i, n, seg);
        groups += 1;
        i += n;
    }
    groups
}

/// The GRO segment size a received message's control data carries, if any.
fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    if h.msg_control.is_null() {
        return None;
    }
    // SAFETY: `h` is the header recvmmsg filled: msg_control/msg_controllen describe our live
    // control buffer and the kernel wrote well-formed cmsgs into it; CMSG_* stay within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let mut v: libc::c_int = 0;
                std::ptr::copy_nonoverlapping(
                    libc::CMSG_DATA(c),
                    (&mut v as *mut libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// Frames of a GRO-merged datagram that a single-frame [`Uplink::recv`] has not returned yet.
#[derive(Debug, Default)]
struct Leftover {
    buf: Vec<u8>,
    frames: std::collections::VecDeque<RxFrame>,
}

impl UdpUplink {
    /// `recv` with GRO on: a datagram may hold several frames; hand them out one per call.
    fn recv_one_gro(&self, out: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let mut lo = lock(&self.leftover);
        if lo.frames.is_empty() {
            if lo.buf.len() < MAX_FRAME {
                lo.buf = vec![0u8; MAX_FRAME];
            }
            let mut found = Vec::new();
            let Leftover { buf, frames } = &mut *lo;
            // A datagram from another source leaves nothing: read the next one.
            while found.is_empty() {
                if self.recv_batch_raw(std::slice::from_mut(buf), &mut found)? == 0 {
                    return Ok(None);
                }
            }
            frames.extend(found);
        }
        let Some(f) = lo.frames.pop_front() else {
            return Ok(None);
        };
        let Some(src) = lo.buf.get(f.off..f.off + f.len) else {
            return Ok(None);
        };
        if src.len() > out.len() {
            return Err(UplinkError::Truncated {
                len: src.len(),
                buf: out.len(),
            });
        }
        out[..src.len()].copy_from_slice(src);
        Ok(Some(src.len()))
    }

    /// One `sendmmsg` for `chunk` (≤ IO_BATCH frames): returns how many frames went.
    fn sendmmsg_chunk(&self, chunk: &[&[u8]], gso: bool) -> Result<usize, SendStop> {
        let (mut addr, addr_len) = sockaddr_of(self.remote);
        let mut groups = [(0usize, 1usize, 0usize); IO_BATCH];
        let ngroups = if gso {
            gso_groups(chunk, &mut groups)
        } else {
            for (i, g) in groups.iter_mut().enumerate().take(chunk.len()) {
                *g = (i, 1, chunk[i].len());
            }
            chunk.len()
        };
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; IO_BATCH];
        for (v, f) in iov.iter_mut().zip(chunk) {
            // sendmmsg only reads through iov_base.
            *v = libc::iovec {
                iov_base: f.as_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            };
        }
        let mut ctl = [CmsgBuf::default(); IO_BATCH];
        // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are valid.
        let mut msgs: [libc::mmsghdr; IO_BATCH] = unsafe { std::mem::zeroed() };
        for (k, &(start, n, seg)) in groups.iter().enumerate().take(ngroups) {
            let h = &mut msgs[k].msg_hdr;
            h.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = addr_len;
            h.msg_iov = &mut iov[start];
            h.msg_iovlen = n;
            if n > 1 {
                h.msg_control = ctl[k].0.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE only computes a size.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
                // SAFETY: the control buffer is live, aligned and larger than CMSG_SPACE(2);
                // CMSG_FIRSTHDR of a header with that buffer is inside it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    let v = seg as u16;
                    std::ptr::copy_nonoverlapping(
                        (&v as *const u16).cast::<u8>(),
                        libc::CMSG_DATA(c),
                        2,
                    );
                }
            }
        }
        loop {
            // SAFETY: `msgs[..ngroups]` point at live iovecs (the caller's frames), at `addr`
            // and at their own control buffers; all outlive the call and the kernel only reads
            // them (it writes msg_len).
            let r = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    ngroups as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                let sent_groups = r as usize;
                return Ok(groups[..sent_groups].iter().map(|g| g.1).sum());
            }
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => Err(SendStop::Busy),
                _ => Err(SendStop::Failed(e)),
            };
        }
    }
}

#[cfg(test)]
mod tests;
