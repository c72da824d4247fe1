//! TAP uplink: a Linux TAP device opened through /dev/net/tun with `IFF_TAP | IFF_NO_PI` (each
//! read/write is exactly one Ethernet frame, no packet-info header), non-blocking.
//!
//! `TapUplink::open(name)` attaches to an existing TAP device of that name or creates it (needs
//! CAP_NET_ADMIN), and brings the interface up. A device created here disappears when the uplink is
//! dropped. Addresses, bridges etc. are the caller's business (`ip link set tapX master br0`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};

use super::{recv_frame, Uplink, UplinkError, MAX_FRAME};

/// `_IOW('T', 202, int)`
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` with the flags member of the union (40 bytes on Linux).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl IfReqFlags {
    fn new(name: &str) -> IfReqFlags {
        let mut r = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
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
        let mut req = IfReqFlags::new(name);
        req.flags = IFF_TAP | IFF_NO_PI;
        // SAFETY: TUNSETIFF reads (and may write back the name into) a `struct ifreq`; `req` is a
        // properly sized, initialised #[repr(C)] ifreq that outlives the call.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                TUNSETIFF as _,
                &mut req as *mut IfReqFlags,
            )
        };
        if rc < 0 {
            return Err(tap_err(name, "TUNSETIFF")(std::io::Error::last_os_error()));
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

    /// SIOCGIFFLAGS / SIOCSIFFLAGS |= IFF_UP through a throwaway AF_INET socket.
    fn set_up(&self) -> Result<(), UplinkError> {
        // SAFETY: plain socket(2) call; the fd is owned (and closed) by `sock` below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(tap_err(&self.name, "socket")(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh socket we own exclusively.
        let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut req = IfReqFlags::new(&self.name);
        // SAFETY: SIOCGIFFLAGS fills ifr_flags of a valid `struct ifreq`, which `req` is.
        let rc = unsafe {
            libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCGIFFLAGS as _,
                &mut req as *mut IfReqFlags,
            )
        };
        if rc < 0 {
            return Err(tap_err(&self.name, "SIOCGIFFLAGS")(
                std::io::Error::last_os_error(),
            ));
        }
        req.flags |= libc::IFF_UP as libc::c_short;
        // SAFETY: SIOCSIFFLAGS reads a valid `struct ifreq`, which `req` is.
        let rc = unsafe {
            libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCSIFFLAGS as _,
                &req as *const IfReqFlags,
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
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        if frame.len() > MAX_FRAME {
            return Err(UplinkError::TooLarge(frame.len()));
        }
        loop {
            match (&self.file).write(frame) {
                // A TAP write takes the whole frame or fails.
                Ok(n) if n == frame.len() => return Ok(()),
                Ok(n) => {
                    return Err(UplinkError::Send(std::io::Error::other(format!(
                        "short TAP write: {n} of {} bytes",
                        frame.len()
                    ))))
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        return Err(UplinkError::WouldBlock)
                    }
                    _ => return Err(UplinkError::Send(e)),
                },
            }
        }
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        // A TAP read truncates silently to the buffer; with MAX_FRAME-sized buffers nothing is lost.
        recv_frame(self.file.as_raw_fd(), buf, false)
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
