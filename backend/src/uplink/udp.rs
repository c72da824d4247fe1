//! UDP uplink: each Ethernet frame is exactly one UDP datagram payload (QEMU `-netdev dgram`
//! framing). The socket is bound to LOCAL and sends to REMOTE with `sendto` (not connected, like
//! QEMU, so datagrams from any source are accepted).

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::io::{AsRawFd, RawFd};

use super::{recv_frame, Uplink, UplinkError, IO_BATCH, MAX_FRAME};

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
        Ok(UdpUplink { sock, remote })
    }

    /// Use an already bound socket (made non-blocking here), sending to `remote`.
    pub fn from_socket(sock: UdpSocket, remote: SocketAddr) -> Result<UdpUplink, UplinkError> {
        let addr = sock
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        sock.set_nonblocking(true)
            .map_err(|source| UplinkError::Bind { addr, source })?;
        Ok(UdpUplink { sock, remote })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn remote_addr(&self) -> SocketAddr {
        self.remote
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
        loop {
            match recv_frame(self.sock.as_raw_fd(), buf, true) {
                // A pending ICMP error surfaces on recv too; it is not a frame.
                Err(UplinkError::Recv(e)) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    continue
                }
                r => return r,
            }
        }
    }

    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// `sendmmsg`: up to [`IO_BATCH`] datagrams per system call.
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        let (mut addr, addr_len) = sockaddr_of(self.remote);
        let mut done = 0;
        while done < frames.len() {
            let chunk = &frames[done..(done + IO_BATCH).min(frames.len())];
            if let Some(f) = chunk.iter().find(|f| f.len() > MAX_FRAME) {
                return Err(UplinkError::TooLarge(f.len()));
            }
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; IO_BATCH];
            // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are valid.
            let mut msgs: [libc::mmsghdr; IO_BATCH] = unsafe { std::mem::zeroed() };
            for (i, f) in chunk.iter().enumerate() {
                iov[i] = libc::iovec {
                    // sendmmsg only reads through iov_base.
                    iov_base: f.as_ptr() as *mut libc::c_void,
                    iov_len: f.len(),
                };
                msgs[i].msg_hdr.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
                msgs[i].msg_hdr.msg_namelen = addr_len;
                msgs[i].msg_hdr.msg_iov = &mut iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `msgs[..chunk.len()]` point at live iovecs, which point at the caller's
            // frames, and at `addr`; all outlive the call, and the kernel only reads them
            // (it writes msg_len).
            let n = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    chunk.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                done += n as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Ok(done),
                // Nobody listening on the remote yet (see `send`): that frame is lost.
                Some(libc::ECONNREFUSED) => done += 1,
                _ if done > 0 => return Ok(done),
                _ => return Err(UplinkError::Send(e)),
            }
        }
        Ok(done)
    }

    /// `recvmmsg`: up to [`IO_BATCH`] datagrams per system call; truncated ones are dropped.
    fn recv_batch(&self, bufs: &mut [Vec<u8>], lens: &mut [usize]) -> Result<usize, UplinkError> {
        let want = bufs.len().min(lens.len()).min(IO_BATCH);
        if want == 0 {
            return Ok(0);
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; IO_BATCH];
        // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are valid.
        let mut msgs: [libc::mmsghdr; IO_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..want {
            iov[i] = libc::iovec {
                iov_base: bufs[i].as_mut_ptr().cast(),
                iov_len: bufs[i].len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        let n = loop {
            // SAFETY: each of `msgs[..want]` points at one iovec describing a distinct, live,
            // writable buffer of `bufs`; no name or control buffers. A null timeout with
            // MSG_DONTWAIT returns what is queued now.
            let n = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    want as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // A pending ICMP error is not a frame (see `recv`).
                Some(libc::EINTR) | Some(libc::ECONNREFUSED) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                _ => return Err(UplinkError::Recv(e)),
            }
        };
        // Keep the whole datagrams, in order: a truncated one (larger than its buffer) is
        // dropped and the later ones move down.
        let mut kept = 0;
        for (i, m) in msgs.iter().enumerate().take(n) {
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                continue;
            }
            let len = m.msg_len as usize;
            if kept != i {
                bufs.swap(kept, i);
            }
            lens[kept] = len;
            kept += 1;
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_grown() {
        let u = UdpUplink::new(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
        )
        .unwrap();
        let mut v: libc::c_int = 0;
        let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into a live c_int with its size.
        let rc = unsafe {
            libc::getsockopt(
                u.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&mut v as *mut libc::c_int).cast(),
                &mut l,
            )
        };
        assert_eq!(rc, 0);
        // The kernel doubles the request; without privileges it is capped by rmem_max, still
        // more than nothing. As root (CI) the full size is granted.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert!(v >= SOCKET_BUFFER, "SO_RCVBUF {v}");
        } else {
            assert!(v > 0);
        }
    }

    #[test]
    fn pair_on_loopback() {
        let a = UdpUplink::new(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
        )
        .unwrap();
        let b = UdpUplink::new("127.0.0.1:0".parse().unwrap(), a.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 64];
        assert!(a.recv(&mut buf).unwrap().is_none());
        b.send(b"frame-1").unwrap();
        let mut got = None;
        for _ in 0..1000 {
            if let Some(n) = a.recv(&mut buf).unwrap() {
                got = Some(n);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, Some(7));
        assert_eq!(&buf[..7], b"frame-1");
    }

    /// sendmmsg / recvmmsg move frames in order, jumbo frames (MTU 9000) whole; a datagram larger
    /// than its receive buffer is dropped and the later ones still arrive.
    #[test]
    fn batches_in_order_with_jumbo_and_truncated_frames() {
        let a = UdpUplink::new(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
        )
        .unwrap();
        let b = UdpUplink::new("127.0.0.1:0".parse().unwrap(), a.local_addr().unwrap()).unwrap();
        // 150 frames (more than one IO_BATCH), frame 7 a full 9000-MTU Ethernet frame + VLAN,
        // frame 70 larger than the receive buffers below.
        let frames: Vec<Vec<u8>> = (0..150u32)
            .map(|i| {
                let len = match i {
                    7 => 9018,
                    70 => 12000,
                    _ => 60 + (i as usize * 37) % 1400,
                };
                (0..len).map(|j| (i as usize + j) as u8).collect()
            })
            .collect();
        let slices: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert_eq!(b.send_batch(&slices).unwrap(), 150);
        let mut bufs: Vec<Vec<u8>> = (0..IO_BATCH).map(|_| vec![0u8; 10000]).collect();
        let mut lens = [0usize; IO_BATCH];
        let mut got: Vec<Vec<u8>> = Vec::new();
        for _ in 0..1000 {
            let n = a.recv_batch(&mut bufs, &mut lens).unwrap();
            got.extend((0..n).map(|i| bufs[i][..lens[i]].to_vec()));
            if got.len() >= 149 {
                break;
            }
            if n == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let want: Vec<Vec<u8>> = frames
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 70)
            .map(|(_, f)| f.clone())
            .collect();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "frames differ or are out of order");
    }
}
