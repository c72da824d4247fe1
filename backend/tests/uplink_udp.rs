//! Two UDP uplinks on loopback exchanging RoCEv2 frames (QEMU `-netdev dgram` framing: one frame
//! per datagram, nothing else in it).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use vrdma_backend::uplink::{UdpUplink, Uplink, UplinkError, UplinkSpec, MAX_FRAME};
use vrdma_backend::wire::*;

fn pair() -> (UdpUplink, UdpUplink) {
    // Bind both first on free ports, then point them at each other.
    let a0 = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b0 = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (pa, pb) = (a0.local_addr().unwrap(), b0.local_addr().unwrap());
    let a = UdpUplink::from_socket(a0, pb).unwrap();
    let b = UdpUplink::from_socket(b0, pa).unwrap();
    assert_eq!(a.local_addr().unwrap(), pa);
    assert_eq!(a.remote_addr(), pb);
    (a, b)
}

fn wait_recv(u: &dyn Uplink, buf: &mut [u8]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut pfd = libc::pollfd {
            fd: u.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        if let Some(n) = u.recv(buf).unwrap() {
            return n;
        }
        assert!(Instant::now() < deadline, "no frame within 5 s");
    }
}

fn frame(seq: u32, len: usize) -> Vec<u8> {
    let addr = Addressing::new(
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 2],
        gid_from_ipv4([127, 0, 0, 1]),
        gid_from_ipv4([127, 0, 0, 2]),
        udp_src_port(1, 2),
    );
    let b = PacketBuilder::new(addr, Bth::new(Opcode::RcSendOnly, 2, seq));
    let data: Vec<u8> = (0..len).map(|i| (i as u32 ^ seq) as u8).collect();
    let mut f = Vec::new();
    b.build(&[&data], &mut f).unwrap();
    f
}

#[test]
fn frames_cross_both_ways_in_order() {
    let (a, b) = pair();
    let mut buf = vec![0u8; MAX_FRAME];
    assert_eq!(a.recv(&mut buf).unwrap(), None, "nothing pending yet");
    for seq in 0..200u32 {
        let f = frame(seq, (seq as usize * 13) % 1500);
        a.send(&f).unwrap();
        let n = wait_recv(&b, &mut buf);
        assert_eq!(&buf[..n], &f[..]);
        let p = RocePacket::parse(&buf[..n]).unwrap();
        assert_eq!(p.bth.psn, seq);
        // And back.
        b.send(&f).unwrap();
        let n = wait_recv(&a, &mut buf);
        assert_eq!(&buf[..n], &f[..]);
    }
    // A burst is delivered in order.
    for seq in 0..50u32 {
        a.send(&frame(seq, 64)).unwrap();
    }
    for seq in 0..50u32 {
        let n = wait_recv(&b, &mut buf);
        assert_eq!(RocePacket::parse(&buf[..n]).unwrap().bth.psn, seq);
    }
}

#[test]
fn jumbo_frames_and_truncation() {
    let (a, b) = pair();
    let big = frame(1, 9000);
    a.send(&big).unwrap();
    let mut buf = vec![0u8; MAX_FRAME];
    let n = wait_recv(&b, &mut buf);
    assert_eq!(n, big.len());
    // A buffer too small: the frame is reported (and consumed), not silently cut.
    a.send(&big).unwrap();
    let mut small = vec![0u8; 1000];
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        match b.recv(&mut small) {
            Ok(None) => {
                assert!(Instant::now() < deadline);
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(Some(n)) => panic!("got {n} bytes instead of an error"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, UplinkError::Truncated { len, buf: 1000 } if len == big.len()));
    assert_eq!(b.recv(&mut small).unwrap(), None);
    assert!(matches!(
        a.send(&vec![0u8; MAX_FRAME + 1]),
        Err(UplinkError::TooLarge(_))
    ));
}

#[test]
fn interoperates_with_a_plain_dgram_peer() {
    // What QEMU's dgram netdev does: sendto() the bare frame, recv() one frame per datagram.
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    let ours = probe.local_addr().unwrap();
    drop(probe);
    let up = UdpUplink::new(ours, peer.local_addr().unwrap()).unwrap();
    let f = frame(7, 33);
    up.send(&f).unwrap();
    let mut buf = [0u8; 2048];
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (n, from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], &f[..]);
    assert_eq!(from, ours);
    peer.send_to(&f, ours).unwrap();
    let n = wait_recv(&up, &mut buf);
    assert_eq!(&buf[..n], &f[..]);
}

#[test]
fn peer_not_listening_is_loss_not_error() {
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead = probe.local_addr().unwrap();
    drop(probe);
    let up = UdpUplink::new("127.0.0.1:0".parse().unwrap(), dead).unwrap();
    for _ in 0..5 {
        up.send(b"x").unwrap();
    }
    let mut buf = [0u8; 64];
    assert_eq!(up.recv(&mut buf).unwrap(), None);
}

#[test]
fn spec_opens_a_working_uplink() {
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    let p = probe.local_addr().unwrap();
    drop(probe);
    let spec: UplinkSpec = format!("udp:local={p},remote={p}").parse().unwrap();
    let up = spec.open().unwrap();
    // Looped back to itself.
    up.send(b"loop").unwrap();
    let mut buf = [0u8; 16];
    let n = wait_recv(&*up, &mut buf);
    assert_eq!(&buf[..n], b"loop");
    // Binding the same address twice fails with a clear error.
    let e = spec.open().err().expect("second bind fails");
    assert!(e.to_string().contains("cannot bind"), "{e}");
}
