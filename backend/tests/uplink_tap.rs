//! TAP uplink, in a private network namespace (needs root / CAP_SYS_ADMIN + CAP_NET_ADMIN; CI runs
//! as root). Frames written to the TAP fd show up on the interface (seen with an AF_PACKET socket)
//! and frames transmitted on the interface come out of the TAP fd.

use std::os::unix::io::RawFd;
use std::time::{Duration, Instant};

use vrdma_backend::uplink::{TapUplink, Uplink, UplinkError, UplinkSpec};

/// Run `f` on a fresh thread that has moved into a new, empty network namespace.
fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) only changes this thread's namespace membership.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        f()
    })
    .join()
    .unwrap()
}

fn ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(i, 0, "no interface {name}");
    i
}

/// `struct ifreq` with its `ifr_flags` member, for SIOCGIFFLAGS and SIOCSIFFLAGS.
#[repr(C)]
struct IfFlagsReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl IfFlagsReq {
    fn new(name: &str, flags: libc::c_short) -> IfFlagsReq {
        let mut r = IfFlagsReq {
            name: [0; 16],
            flags,
            _pad: [0; 22],
        };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        r
    }
}

fn if_flags(name: &str) -> libc::c_short {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0");
    // In an empty netns "lo" is down, but binding 0.0.0.0 still works; use an AF_INET socket fd.
    let sock = sock.unwrap();
    let mut r = IfFlagsReq::new(name, 0);
    // SAFETY: SIOCGIFFLAGS on a valid ifreq-sized struct.
    let rc = unsafe {
        libc::ioctl(
            std::os::unix::io::AsRawFd::as_raw_fd(&sock),
            libc::SIOCGIFFLAGS as _,
            &mut r,
        )
    };
    assert_eq!(rc, 0);
    r.flags
}

/// AF_PACKET socket bound to interface `idx`, all protocols.
fn packet_socket(idx: u32) -> RawFd {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK,
            i32::from(proto),
        )
    };
    assert!(fd >= 0);
    // SAFETY: zeroed sockaddr_ll is a valid value; we fill the fields bind needs.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = idx as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0);
    fd
}

/// Read the packet socket `ps` into `buf` until frame `f` arrives (other frames are skipped);
/// fails with `what` after 5 s.
fn wait_on_interface(ps: RawFd, buf: &mut [u8], f: &[u8], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: valid buffer for the call.
        let n = unsafe { libc::recv(ps, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n > 0 && buf[..n as usize] == f[..] {
            return;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Read `tap` into `buf` until frame `g` comes out (the kernel's own frames are skipped); fails
/// with `what` after 5 s.
fn wait_from_tap(tap: &TapUplink, buf: &mut [u8], g: &[u8], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tap.recv(buf).unwrap() {
            Some(n) if buf[..n] == g[..] => return,
            _ => {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

fn frame(marker: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a, 0x88, 0xb5]; // local exp. type
    f.extend_from_slice(&[marker; 60]);
    f
}

#[test]
fn tap_frames_both_ways_in_a_private_netns() {
    in_netns(|| {
        let tap = TapUplink::open("vrdmat0").unwrap();
        assert_eq!(tap.name(), "vrdmat0");
        assert_ne!(
            if_flags("vrdmat0") & libc::IFF_UP as libc::c_short,
            0,
            "interface is up"
        );
        let idx = ifindex("vrdmat0");
        let ps = packet_socket(idx);

        // TAP fd -> interface (the kernel receives it; AF_PACKET sees it).
        let f = frame(0xa5);
        tap.send(&f).unwrap();
        let mut buf = vec![0u8; 65536];
        wait_on_interface(ps, &mut buf, &f, "frame never seen on the interface");

        // Interface transmit -> TAP fd. The kernel may also emit its own frames (IPv6 ND/MLD):
        // look for ours.
        let g = frame(0x5a);
        // SAFETY: valid buffer; the socket is bound to the interface so send goes out on it.
        let n = unsafe { libc::send(ps, g.as_ptr().cast(), g.len(), 0) };
        assert_eq!(n, g.len() as isize);
        wait_from_tap(&tap, &mut buf, &g, "frame never came out of the TAP");
        // SAFETY: closing our own fd.
        unsafe { libc::close(ps) };

        // Dropping the uplink removes the device we created.
        drop(tap);
        let c = std::ffi::CString::new("vrdmat0").unwrap();
        // SAFETY: valid NUL-terminated string.
        assert_eq!(unsafe { libc::if_nametoindex(c.as_ptr()) }, 0);
    });
}

#[test]
fn tap_errors_are_reported() {
    in_netns(|| {
        // "lo" exists and is not a TAP device.
        let e = TapUplink::open("lo").unwrap_err();
        assert!(
            matches!(
                e,
                UplinkError::Tap {
                    op: "TUNSETIFF",
                    ..
                }
            ),
            "{e}"
        );
        // The same TAP twice (single queue) is busy.
        let _t = TapUplink::open("vrdmat1").unwrap();
        assert!(matches!(
            TapUplink::open("vrdmat1"),
            Err(UplinkError::Tap { .. })
        ));
        // Through a spec.
        let spec: UplinkSpec = "tap:vrdmat2".parse().unwrap();
        let up = spec.open().unwrap();
        assert!(up.as_raw_fd() >= 0);
        let mut buf = [0u8; 2048];
        // Nothing was sent to it yet (or only kernel chatter); must not block or fail.
        let _ = up.recv(&mut buf).unwrap();
    });
}

#[test]
fn tap_attaches_to_an_existing_persistent_device() {
    in_netns(|| {
        // `ip` forked from this thread runs in the same (private) network namespace.
        let st = std::process::Command::new("ip")
            .args(["tuntap", "add", "dev", "vrdmat3", "mode", "tap"])
            .status()
            .expect("run ip");
        assert!(st.success(), "ip tuntap add failed");
        let before = ifindex("vrdmat3");
        let tap = TapUplink::open("vrdmat3").unwrap();
        assert_eq!(ifindex("vrdmat3"), before, "attached, not re-created");
        assert_ne!(if_flags("vrdmat3") & libc::IFF_UP as libc::c_short, 0);
        drop(tap);
        // A persistent device outlives the uplink.
        assert_eq!(ifindex("vrdmat3"), before);
    });
}

/// Ethernet MTU 9000 (path MTU 4096, spec §15.6) end to end on a TAP uplink: the interface MTU
/// is raised, and a full 9000-byte-payload frame goes both ways intact through the vnet header
/// framing.
#[test]
fn tap_carries_mtu_9000_frames_both_ways() {
    in_netns(|| {
        let tap = TapUplink::open_with_mtu("vrdmat9", 9000).unwrap();
        assert_eq!(tap.mtu().unwrap(), 9000);
        let ps = packet_socket(ifindex("vrdmat9"));
        let mut f = frame(0x11);
        f.truncate(14);
        f.extend((0..9000u32).map(|i| i as u8));
        tap.send(&f).unwrap();
        let mut buf = vec![0u8; 65536];
        wait_on_interface(ps, &mut buf, &f, "jumbo frame never seen");
        let mut g = f.clone();
        g[14..].reverse();
        // SAFETY: valid buffer; the socket is bound to the interface.
        let n = unsafe { libc::send(ps, g.as_ptr().cast(), g.len(), 0) };
        assert_eq!(
            n,
            g.len() as isize,
            "send on the interface: {}",
            std::io::Error::last_os_error()
        );
        wait_from_tap(&tap, &mut buf, &g, "jumbo frame never came out");
        // SAFETY: closing our own fd.
        unsafe { libc::close(ps) };
    });
}

/// `ip link set NAME up|down`: SIOCSIFFLAGS with IFF_UP set or cleared.
fn set_if_up(name: &str, up: bool) {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let mut r = IfFlagsReq::new(name, if_flags(name));
    if up {
        r.flags |= libc::IFF_UP as libc::c_short;
    } else {
        r.flags &= !(libc::IFF_UP as libc::c_short);
    }
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq-sized struct.
    let rc = unsafe {
        libc::ioctl(
            std::os::unix::io::AsRawFd::as_raw_fd(&sock),
            libc::SIOCSIFFLAGS as _,
            &r,
        )
    };
    assert_eq!(rc, 0, "SIOCSIFFLAGS: {}", std::io::Error::last_os_error());
}

/// Spec §2.2: a TAP uplink's link state is the interface's (up and carrier); the port follows.
#[test]
fn tap_link_state_follows_the_interface() {
    in_netns(|| {
        let tap = TapUplink::open("vrdmat3").unwrap();
        assert_eq!(
            tap.link_up(),
            Some(true),
            "open brings it up; the fd is the carrier"
        );
        set_if_up("vrdmat3", false);
        assert_eq!(tap.link_up(), Some(false), "ip link set down");
        set_if_up("vrdmat3", true);
        assert_eq!(tap.link_up(), Some(true), "ip link set up");
    });
}
