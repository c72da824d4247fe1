//! UDP uplink: each Ethernet frame is exactly one UDP datagram payload (QEMU `-netdev dgram`
//! framing). The socket is bound to LOCAL and sends to REMOTE with `sendto` (not connected, like
//! QEMU, so datagrams from any source are accepted).

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::io::{AsRawFd, RawFd};

use super::{recv_frame, Uplink, UplinkError, MAX_FRAME};

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
}
