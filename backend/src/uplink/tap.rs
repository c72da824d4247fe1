//! TAP uplink: a Linux TAP device opened through /dev/net/tun with `IFF_TAP | IFF_NO_PI |
//! IFF_VNET_HDR`, non-blocking: each read/write is one Ethernet frame behind a 10-byte
//! `virtio_net_hdr` (no packet-info header). No offloads are enabled (TUNSETOFFLOAD 0), so the
//! kernel hands over whole, checksummed frames and the header we write is all zeros; the header
//! is there so offloads can be turned on later without changing the framing. The engine reads
//! until EAGAIN each round (`Uplink::recv_batch`).
//!
//! `TapUplink::open(name)` attaches to an existing TAP device of that name or creates it (needs
//! CAP_NET_ADMIN), and brings the interface up. A device created here disappears when the uplink is
//! dropped. Addresses, bridges etc. are the caller's business (`ip link set tapX master br0`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};

use super::{Uplink, UplinkError, MAX_FRAME};

/// `_IOW('T', 202, int)`
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `_IOW('T', 208, unsigned int)`
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// `_IOW('T', 216, int)`
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
/// `struct virtio_net_hdr` (virtio 1.x §5.1.6 without num_buffers): flags, gso_type, hdr_len,
/// gso_size, csum_start, csum_offset.
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
const VNET_F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`.
const VNET_GSO_NONE: u8 = 0;

/// `struct ifreq` (40 bytes on Linux) with one member of its union, `value`: the flags
/// (`c_short`) or the MTU (`c_int`). The padding covers the rest of the union whatever `T` is
/// (the struct may be a few bytes longer than the kernel's; it reads and writes 40).
#[repr(C)]
struct IfReq<T> {
    name: [u8; libc::IFNAMSIZ],
    value: T,
    _pad: [u8; 24],
}

impl<T> IfReq<T> {
    fn new(name: &str, value: T) -> IfReq<T> {
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            value,
            _pad: [0; 24],
        };
        // Caller checked name.len() < IFNAMSIZ: the last byte stays NUL.
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        r
    }
}

#[derive(Debug)]
pub struct TapUplink {
    file: File,
    name: String,
}

fn tap_err<'a>(name: &'a str, op: &'static str) -> impl FnOnce(std::io::Error) -> UplinkError + 'a {
    move |source| UplinkError::Tap {
        name: name.to_owned(),
        op,
        source,
    }
}

/// Whether `name` is a usable Linux interface name.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
}

impl TapUplink {
    /// Open (attach to or create) TAP device `name` and bring it up.
    pub fn open(name: &str) -> Result<TapUplink, UplinkError> {
        if !valid_ifname(name) {
            return Err(UplinkError::TapName(name.to_owned()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(tap_err(name, "open /dev/net/tun"))?;
        let mut req: IfReq<libc::c_short> = IfReq::new(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR);
        // SAFETY: TUNSETIFF reads (and may write back the name into) a `struct ifreq`; `req` is a
        // properly sized, initialised #[repr(C)] ifreq that outlives the call.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                TUNSETIFF as _,
                &mut req as *mut IfReq<libc::c_short>,
            )
        };
        if rc < 0 {
            return Err(tap_err(name, "TUNSETIFF")(std::io::Error::last_os_error()));
        }
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which is live.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETVNETHDRSZ as _, &hdr_len) };
        if rc < 0 {
            return Err(tap_err(name, "TUNSETVNETHDRSZ")(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: TUNSETOFFLOAD takes the offload flags by value; 0 = none.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD as _, 0 as libc::c_ulong) };
        if rc < 0 {
            return Err(tap_err(name, "TUNSETOFFLOAD")(
                std::io::Error::last_os_error(),
            ));
        }
        let tap = TapUplink {
            file,
            name: name.to_owned(),
        };
        tap.set_up()?;
        Ok(tap)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Open like [`TapUplink::open`] and raise the interface MTU to at least `mtu` (e.g. 9000
    /// for path MTU 4096, spec §15.6): a bridge drops frames larger than a port's MTU.
    pub fn open_with_mtu(name: &str, mtu: u16) -> Result<TapUplink, UplinkError> {
        let tap = Self::open(name)?;
        if tap.mtu()? < u32::from(mtu) {
            tap.set_mtu(mtu)?;
        }
        Ok(tap)
    }

    fn ifreq_socket(&self) -> Result<std::os::fd::OwnedFd, UplinkError> {
        // SAFETY: plain socket(2) call; the fd is owned (and closed) by the OwnedFd.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(tap_err(&self.name, "socket")(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh socket we own exclusively.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    /// The interface MTU (SIOCGIFMTU).
    pub fn mtu(&self) -> Result<u32, UplinkError> {
        let sock = self.ifreq_socket()?;
        let mut req = IfReq::<libc::c_int>::new(&self.name, 0);
        // SAFETY: SIOCGIFMTU fills ifr_mtu of a valid `struct ifreq`, which `req` is.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) };
        if rc < 0 {
            return Err(tap_err(&self.name, "SIOCGIFMTU")(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(req.value.max(0) as u32)
    }

    fn set_mtu(&self, mtu: u16) -> Result<(), UplinkError> {
        let sock = self.ifreq_socket()?;
        let req = IfReq::<libc::c_int>::new(&self.name, libc::c_int::from(mtu));
        // SAFETY: SIOCSIFMTU reads a valid `struct ifreq`, which `req` is.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU as _, &req) };
        if rc < 0 {
            return Err(tap_err(&self.name, "SIOCSIFMTU")(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// The interface flags (SIOCGIFFLAGS).
    fn flags(&self) -> Result<libc::c_short, UplinkError> {
        let sock = self.ifreq_socket()?;
        let mut req: IfReq<libc::c_short> = IfReq::new(&self.name, 0);
        // SAFETY: SIOCGIFFLAGS fills ifr_flags of a valid `struct ifreq`, which `req` is.
        let rc = unsafe {
            libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCGIFFLAGS as _,
                &mut req as *mut IfReq<libc::c_short>,
            )
        };
        if rc < 0 {
            return Err(tap_err(&self.name, "SIOCGIFFLAGS")(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(req.value)
    }

    /// SIOCGIFFLAGS / SIOCSIFFLAGS |= IFF_UP through throwaway AF_INET sockets.
    fn set_up(&self) -> Result<(), UplinkError> {
        let flags = self.flags()?;
        let sock = self.ifreq_socket()?;
        let req = IfReq::new(&self.name, flags | libc::IFF_UP as libc::c_short);
        // SAFETY: SIOCSIFFLAGS reads a valid `struct ifreq`, which `req` is.
        let rc = unsafe {
            libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCSIFFLAGS as _,
                &req as *const IfReq<libc::c_short>,
            )
        };
        if rc < 0 {
            return Err(tap_err(&self.name, "SIOCSIFFLAGS")(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

impl Uplink for TapUplink {
    /// Up = the interface is administratively up and has carrier (IFF_UP and IFF_RUNNING, what
    /// `ip link` shows as UP and LOWER_UP). An interface that cannot be asked (gone) is down.
    fn link_up(&self) -> Option<bool> {
        let up = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        Some(self.flags().is_ok_and(|f| f & up == up))
    }

    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        if frame.len() > MAX_FRAME {
            return Err(UplinkError::TooLarge(frame.len()));
        }
        // No offload requested: flags 0, GSO_NONE.
        let hdr = [0u8; VNET_HDR_LEN];
        let iov = [
            libc::iovec {
                iov_base: hdr.as_ptr() as *mut libc::c_void,
                iov_len: hdr.len(),
            },
            libc::iovec {
                iov_base: frame.as_ptr() as *mut libc::c_void,
                iov_len: frame.len(),
            },
        ];
        let want = hdr.len() + frame.len();
        loop {
            // SAFETY: both iovecs describe live buffers that writev only reads.
            let n = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), 2) };
            if n >= 0 {
                // A TAP write takes the whole frame or fails.
                if n as usize == want {
                    return Ok(());
                }
                return Err(UplinkError::Send(std::io::Error::other(format!(
                    "short TAP write: {n} of {want} bytes"
                ))));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Err(UplinkError::WouldBlock),
                _ => return Err(UplinkError::Send(e)),
            }
        }
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let mut hdr = [0u8; VNET_HDR_LEN];
        loop {
            let iov = [
                libc::iovec {
                    iov_base: hdr.as_mut_ptr().cast(),
                    iov_len: hdr.len(),
                },
                libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                },
            ];
            // SAFETY: both iovecs describe live, writable, distinct buffers. A TAP read
            // returns one frame (truncated silently to the buffers; with MAX_FRAME-sized
            // buffers nothing is lost).
            let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), 2) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => return Ok(None),
                    _ => return Err(UplinkError::Recv(e)),
                }
            }
            let n = n as usize;
            // Without offloads the kernel sends neither GSO nor partial checksums; a frame that
            // has them anyway (or no header) is not one we can pass on as is.
            if n < VNET_HDR_LEN || hdr[1] != VNET_GSO_NONE || hdr[0] & VNET_F_NEEDS_CSUM != 0 {
                continue;
            }
            return Ok(Some(n - VNET_HDR_LEN));
        }
    }

    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_ifname("tap0"));
        assert!(valid_ifname("vrdma-uplink_1"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname("0123456789abcdef"));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a b"));
        assert!(!valid_ifname(".."));
        assert!(matches!(TapUplink::open(""), Err(UplinkError::TapName(_))));
    }
}
