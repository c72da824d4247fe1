//! Unit tests of `udp`.

use super::*;

/// Two uplinks on loopback, each the other's remote.
fn pair() -> (UdpUplink, UdpUplink) {
    let sa = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sb = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (aa, ab) = (sa.local_addr().unwrap(), sb.local_addr().unwrap());
    grow_buffers(&sa);
    grow_buffers(&sb);
    (
        UdpUplink::from_socket(sa, ab).unwrap(),
        UdpUplink::from_socket(sb, aa).unwrap(),
    )
}

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
    let (a, b) = pair();
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

/// sendmmsg / recvmmsg (with GSO / GRO where the kernel has them) move frames in order and
/// whole: mixed sizes, a jumbo frame (MTU 9000 + VLAN), a 12000-byte one.
#[test]
fn batches_in_order_with_jumbo_and_truncated_frames() {
    let (a, b) = pair();
    // 150 frames (more than one IO_BATCH), frame 7 a full 9000-MTU Ethernet frame + VLAN,
    // frame 70 larger still.
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
    let mut bufs: Vec<Vec<u8>> = (0..IO_BATCH).map(|_| vec![0u8; MAX_FRAME]).collect();
    let mut rx = Vec::new();
    let mut got: Vec<Vec<u8>> = Vec::new();
    for _ in 0..1000 {
        rx.clear();
        let n = a.recv_batch(&mut bufs, &mut rx).unwrap();
        got.extend(
            rx.iter()
                .map(|f| bufs[f.slot][f.off..f.off + f.len].to_vec()),
        );
        if got.len() >= 150 {
            break;
        }
        if n == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(got.len(), frames.len());
    assert!(got == frames, "frames differ or are out of order");
}

/// A WRITE-like stream (runs of full-size frames, a short last one, small ACK-size frames)
/// through GSO on send and GRO on receive arrives as the same frames, in order; with the
/// offloads off too.
#[test]
fn gso_gro_stream_round_trips() {
    for no_offload in [false, true] {
        let (a, b) = pair();
        if no_offload {
            b.gso.store(false, Ordering::Relaxed);
        }
        let mut frames: Vec<Vec<u8>> = Vec::new();
        for m in 0..20u32 {
            for p in 0..16u32 {
                let len = if p == 15 { 500 + m as usize } else { 1082 };
                frames.push((0..len).map(|j| (m * 16 + p + j as u32) as u8).collect());
            }
            frames.push(vec![m as u8; 62]);
        }
        let slices: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut sent = 0;
        while sent < slices.len() {
            sent += b.send_batch(&slices[sent..]).unwrap();
        }
        let mut bufs: Vec<Vec<u8>> = (0..IO_BATCH).map(|_| vec![0u8; MAX_FRAME]).collect();
        let mut rx = Vec::new();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut slots = 0;
        for _ in 0..2000 {
            rx.clear();
            let n = a.recv_batch(&mut bufs, &mut rx).unwrap();
            slots += n;
            got.extend(
                rx.iter()
                    .map(|f| bufs[f.slot][f.off..f.off + f.len].to_vec()),
            );
            if got.len() >= frames.len() {
                break;
            }
            if n == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        eprintln!(
            "offloads {:?}: {} frames in {slots} datagrams",
            b.offloads(),
            got.len()
        );
        assert_eq!(got.len(), frames.len(), "no_offload={no_offload}");
        if !no_offload && b.offloads().0 && a.offloads().1 {
            // The point of GSO/GRO: many frames per datagram through the stack.
            assert!(
                slots * 4 < got.len(),
                "{slots} datagrams for {} frames",
                got.len()
            );
        }
        assert!(got == frames, "frames differ (no_offload={no_offload})");
    }
}

#[test]
fn gso_groups_follow_the_kernel_rule() {
    let big = [0u8; 1082];
    let short = [0u8; 100];
    let f: Vec<&[u8]> = vec![&big, &big, &big, &short, &big, &short, &short, &big];
    let mut g = [(0, 0, 0); IO_BATCH];
    let n = gso_groups(&f, &mut g);
    // Equal runs, closed by (and including) one shorter frame; a longer frame starts anew.
    assert_eq!(
        &g[..n],
        &[(0, 4, 1082), (4, 2, 1082), (6, 1, 100), (7, 1, 1082)]
    );
    // Bounded by the segment count and the datagram size.
    let many: Vec<&[u8]> = vec![&big; 100];
    let n = gso_groups(&many, &mut g);
    assert!(g[..n]
        .iter()
        .all(|x| x.1 <= GSO_MAX_SEGS && x.1 * x.2 <= GSO_MAX_BYTES));
    assert_eq!(g[..n].iter().map(|x| x.1).sum::<usize>(), 100);
}

/// With GRO on, the single-frame `recv` still returns one frame per call, in order, when a
/// datagram arrives merged (sent with GSO); mixing it with `recv_batch` loses nothing.
#[test]
fn single_frame_recv_splits_merged_datagrams() {
    let (a, b) = pair();
    let frames: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1082]).collect();
    let slices: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    assert_eq!(b.send_batch(&slices).unwrap(), 40);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 2000];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got.len() < 20 {
        match a.recv(&mut buf).unwrap() {
            Some(n) => got.push(buf[..n].to_vec()),
            None => {
                assert!(std::time::Instant::now() < deadline, "frames missing");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    let mut bufs: Vec<Vec<u8>> = (0..IO_BATCH).map(|_| vec![0u8; MAX_FRAME]).collect();
    let mut rx = Vec::new();
    while got.len() < 40 {
        rx.clear();
        let n = a.recv_batch(&mut bufs, &mut rx).unwrap();
        got.extend(
            rx.iter()
                .map(|f| bufs[f.slot][f.off..f.off + f.len].to_vec()),
        );
        if n == 0 {
            assert!(std::time::Instant::now() < deadline, "frames missing");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert!(got == frames, "frames differ or are out of order");
}

/// Spec §16.3 "Uplink trust": only the configured remote's datagrams are frames; another
/// source's (another port on the same host, here) are dropped and counted, on the single-frame
/// path and the batched one, with and without GRO.
#[test]
fn datagrams_from_another_source_are_refused_and_counted() {
    for no_offload in [false, true] {
        let (a, b) = pair();
        let a = if no_offload {
            UdpUplink { gro: false, ..a }
        } else {
            a
        };
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = a.local_addr().unwrap();
        // Same address as the remote, other port: still a stranger.
        stranger.send_to(b"injected-1", to).unwrap();
        b.send(b"frame-1").unwrap();
        stranger.send_to(b"injected-2", to).unwrap();
        b.send(b"frame-2").unwrap();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut buf = [0u8; 64];
        for _ in 0..2000 {
            if got.len() == 1 {
                break;
            }
            if let Some(n) = a.recv(&mut buf).unwrap() {
                got.push(buf[..n].to_vec());
            } else {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let mut bufs = vec![vec![0u8; 64]; 4];
        for _ in 0..2000 {
            if got.len() == 2 {
                break;
            }
            let mut frames = Vec::new();
            a.recv_batch(&mut bufs, &mut frames).unwrap();
            for f in &frames {
                got.push(bufs[f.slot][f.off..f.off + f.len].to_vec());
            }
            if frames.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        assert_eq!(got, vec![b"frame-1".to_vec(), b"frame-2".to_vec()]);
        assert_eq!(a.refused_sources(), 2, "GRO off: {no_offload}");
        assert_eq!(b.refused_sources(), 0);
    }
}
