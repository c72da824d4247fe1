//! Host-side counters (`stats.rs`): per-QP transport counters under loss and RNR (in-process
//! fixtures), port counters and the Prometheus text served on the stats socket by engines over
//! UDP, and the daemon binary's `.stats` socket read by `vrdma-backend stats --socket`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::engine::*;
use common::*;
use vrdma_backend::exporter::{fetch, stats_socket_path, StatsServer};
use vrdma_backend::stats::{Metered, PortStats};
use vrdma_backend::transport;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

const RC_RDMA_WRITE_MIDDLE: u8 = 0x07;
const RC_ACK: u8 = 0x11;

/// The BTH opcode of an IPv4 RoCEv2 frame.
fn opcode(f: &[u8]) -> u8 {
    f[14 + 20 + 8]
}

/// A link filter that drops the first frame with BTH opcode `op`, once; the count (0 or 1) is
/// how many it dropped.
fn drop_first(op: u8) -> (Filter, Arc<AtomicUsize>) {
    let lost = Arc::new(AtomicUsize::new(0));
    let l2 = lost.clone();
    let filter: Filter = Box::new(move |f| {
        if opcode(f) == op && l2.load(Ordering::Relaxed) == 0 {
            l2.store(1, Ordering::Relaxed);
            return false;
        }
        true
    });
    (filter, lost)
}

/// An RC pair with 64-deep CQs and 8 KiB MRs whose `wait_a` gives up after 20 s.
fn pair() -> RcPair {
    RcPair::new()
        .cq_depth(64)
        .mrs(8192, 8192)
        .patience(Duration::from_secs(20))
        .build()
}

/// RDMA WRITE 1: 4 KiB from A's MR to B's; returns A's completion.
fn write_4k(p: &mut RcPair) -> Vec<vrdma_backend::transport::ctx::Cqe> {
    let w = rdma(1, VRDMA_WR_RDMA_WRITE, (p.src, 4096, p.ka), p.dst, p.kb);
    p.post(&w);
    p.wait_a(1)
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vrdma-stats-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn qp_counters_count_packets_naks_retransmits_and_timeouts() {
    // Path MTU 1024 (3): a 4 KiB WRITE is FIRST, MIDDLE, MIDDLE, LAST.
    let mut p = pair();
    p.a.write(p.src, &pattern(3, 4096));

    // 1. Lose the first MIDDLE once: B NAKs the gap once (IBTA 9.7.5.2.2), A goes back.
    let (filter, lost) = drop_first(RC_RDMA_WRITE_MIDDLE);
    p.link.filter_ab = Some(filter);
    let done = write_4k(&mut p);
    assert_eq!((done[0].wr_id, done[0].status), (1, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(p.dst, 4096), pattern(3, 4096));
    let sa = p.a.dev.qps.get(p.qa.qpn).unwrap().stats;
    let sb = p.b.dev.qps.get(p.qb.qpn).unwrap().stats;
    assert_eq!(lost.load(Ordering::Relaxed), 1);
    assert_eq!((sb.seq_naks_tx, sa.seq_naks_rx), (1, 1), "{sa:?} {sb:?}");
    // Go-back-N resends the lost MIDDLE and what followed it: 3 packets.
    assert_eq!(sa.retransmits, 3, "{sa:?}");
    // A sent 4 + 3 request packets, B received the 6 that were not lost.
    assert_eq!(sa.tx_packets, 7, "{sa:?}");
    assert_eq!(sb.rx_packets, 6, "{sb:?}");
    // Every packet B sent (NAK, ACKs) reached A, and only those reached A.
    assert_eq!(sa.rx_packets, sb.tx_packets);
    assert!(sa.tx_bytes > 4096 + 6 * 42 && sb.rx_bytes < sa.tx_bytes);
    assert_eq!(sa.timeouts, 0);

    // 2. Lose the ACK of a SEND once: A's retransmission timer fires and it resends.
    let before = p.a.dev.qps.get(p.qa.qpn).unwrap().stats;
    let (filter, lost_ack) = drop_first(RC_ACK);
    p.link.filter_ab = None;
    p.link.filter_ba = Some(filter);
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 20, &[(p.dst + 4096, 1024, p.kb)]);
    p.a.post_send(&mut p.qa, &send_inline(2, b"stats"));
    let done = p.wait_a(1);
    assert_eq!((done[0].wr_id, done[0].status), (2, VRDMA_WC_SUCCESS));
    let sa = p.a.dev.qps.get(p.qa.qpn).unwrap().stats;
    assert_eq!(lost_ack.load(Ordering::Relaxed), 1);
    assert_eq!(sa.timeouts - before.timeouts, 1, "{sa:?}");
    assert_eq!(sa.retransmits - before.retransmits, 1, "{sa:?}");
    assert_eq!(p.b.poll_cq(&mut p.cqb).len(), 1);

    // 3. A SEND with no receive posted: B answers RNR NAK (IBTA 9.7.5.2.8), A waits and resends.
    p.link.filter_ba = None;
    p.a.post_send(&mut p.qa, &send_inline(3, b"rnr"));
    pump_until(
        &mut p.a,
        &mut p.b,
        &mut p.link,
        Duration::from_secs(20),
        |_, b| b.dev.qps.get(p.qb.qpn).unwrap().stats.rnr_naks_tx >= 1,
    );
    p.b.post_recv(&mut rq, 21, &[(p.dst + 4096, 1024, p.kb)]);
    let done = p.wait_a(1);
    assert_eq!((done[0].wr_id, done[0].status), (3, VRDMA_WC_SUCCESS));
    let sa = p.a.dev.qps.get(p.qa.qpn).unwrap().stats;
    let sb = p.b.dev.qps.get(p.qb.qpn).unwrap().stats;
    assert!(
        sb.rnr_naks_tx >= 1 && sa.rnr_naks_rx == sb.rnr_naks_tx,
        "{sa:?} {sb:?}"
    );
}

#[test]
fn transport_drops_are_counted_by_reason() {
    let mut rc = RcPair::new().cq_depth(64).no_mrs().build();
    rc.a.post_send(
        &mut rc.qa,
        &Wqe {
            wr_id: 1,
            opcode: VRDMA_WR_SEND,
            inline: Some(b"x".to_vec()),
            ..Default::default()
        },
    );
    let frame = rc.a.dev.outbox(0).frames.pop().expect("a SEND frame");
    let p = rc.b.dev.port_stats.clone();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);

    // Bad ICRC.
    let mut bad = frame.clone();
    *bad.last_mut().unwrap() ^= 0xff;
    transport::on_frame(&rc.b.dev, &bad);
    assert_eq!(
        (load(&p.drop_bad_icrc), load(&p.drop_malformed)),
        (1, 0),
        "ICRC errors are their own reason (spec §11.9)"
    );
    // A QPN that does not exist (ICRC recomputed: the BTH is covered).
    let mut other = frame.clone();
    let bth = 14 + 20 + 8;
    other[bth + 5..bth + 8].copy_from_slice(&[0x00, 0x0f, 0xff]);
    fix_icrc(&mut other);
    transport::on_frame(&rc.b.dev, &other);
    assert_eq!(load(&p.drop_unknown_qp), 1, "ICRC fix-up or QPN lookup");
    // The QP in ERROR does not accept requests.
    rc.b.qp_to_err(rc.qb.qpn);
    transport::on_frame(&rc.b.dev, &frame);
    assert_eq!(load(&p.drop_qp_state), 1);
    assert_eq!(load(&p.drop_bad_icrc), 1);
    assert_eq!(p.rx_dropped(), 3);
    assert_eq!(rc.b.dev.qps.get(rc.qb.qpn).unwrap().stats.rx_packets, 0);
}

/// Recompute the RoCEv2 ICRC of an IPv4 frame.
fn fix_icrc(f: &mut [u8]) {
    let n = f.len();
    let icrc = vrdma_backend::wire::icrc::compute(&f[14..34], &f[34..42], &f[42..n - 4]).unwrap();
    f[n - 4..].copy_from_slice(&icrc.to_le_bytes());
}

/// The value of the sample `name{labels}` in Prometheus text.
fn sample(text: &str, name_labels: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_labels)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name_labels} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn stats_socket_serves_port_and_qp_counters() {
    let mut p = RcPair::new().cq_depth(64).mrs(4096, 4096).build();

    let (ua, ub) = udp_pair();
    let da = detach(&mut p.a);
    let db = detach(&mut p.b);
    let port: Arc<PortStats> = da.lock().port_stats.clone();
    let ea = Engine::start(da.clone(), Arc::new(Metered::new(ua, port.clone()))).unwrap();
    let eb = Engine::start(db.clone(), Arc::new(ub)).unwrap();
    post_sq(
        &ea,
        &p.a.mem,
        &mut p.qa,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (p.src, 4096, p.ka), p.dst, p.kb),
    );
    wait_cqes(&mut p.a, &mut p.cqa, 1, Duration::from_secs(20), "WRITE");
    ea.stop();
    eb.stop();

    let dir = tmpdir("server");
    let vhost_sock = dir.join("vrdma7.sock");
    let path = stats_socket_path(&vhost_sock);
    assert_eq!(path, dir.join("vrdma7.sock.stats"));
    let server = StatsServer::start(&path, da.clone(), "vrdma7".into()).unwrap();
    let text = fetch(&vhost_sock).unwrap();
    let d = "{device=\"vrdma7\"}";
    // 4 WRITE packets out, one coalesced ACK back.
    assert_eq!(sample(&text, &format!("vrdma_port_tx_frames_total{d}")), 4);
    assert_eq!(sample(&text, &format!("vrdma_port_rx_frames_total{d}")), 1);
    assert_eq!(
        sample(&text, &format!("vrdma_port_rx_engine_frames_total{d}")),
        1
    );
    assert_eq!(
        sample(&text, &format!("vrdma_port_tx_bytes_total{d}")),
        port.tx_bytes.load(Ordering::Relaxed)
    );
    assert!(sample(&text, &format!("vrdma_port_tx_bytes_total{d}")) > 4096);
    let dl = "device=\"vrdma7\"";
    assert_eq!(
        sample(&text, &format!("vrdma_objects{{{dl},kind=\"qp\"}}")),
        1
    );
    assert_eq!(
        sample(&text, &format!("vrdma_objects{{{dl},kind=\"mr\"}}")),
        1
    );
    assert_eq!(
        sample(&text, &format!("vrdma_objects{{{dl},kind=\"cq\"}}")),
        1
    );
    let q = format!("{{{dl},qpn=\"{}\",type=\"rc\"}}", p.qa.qpn);
    assert_eq!(sample(&text, &format!("vrdma_qp_tx_packets_total{q}")), 4);
    assert_eq!(sample(&text, &format!("vrdma_qp_rx_packets_total{q}")), 1);
    assert_eq!(sample(&text, &format!("vrdma_qp_retransmits_total{q}")), 0);
    assert_eq!(
        sample(
            &text,
            &format!("vrdma_port_drops_total{{{dl},reason=\"malformed\"}}")
        ),
        0
    );
    assert!(text.contains("# TYPE vrdma_qp_tx_packets_total counter"));

    // Spec §16.5: the exporter reads under the shared device lock, so it answers while an
    // engine worker holds the lock for a batch without handing it off (an exclusive lock
    // would wait for that worker: `fetch` would time out after 5 s).
    {
        let _worker_batch = da.lock_long();
        let during = fetch(&vhost_sock).expect("counters while a worker holds the device lock");
        assert_eq!(sample(&during, &format!("vrdma_qp_tx_packets_total{q}")), 4);
    }

    // The binary's `stats` subcommand reads the same socket.
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
        .args(["stats", "--socket"])
        .arg(&vhost_sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        sample(&printed, &format!("vrdma_qp_tx_packets_total{q}")),
        4
    );

    drop(server);
    assert!(!path.exists(), "the stats socket is removed on drop");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn daemon_serves_stats_next_to_its_socket() {
    let dir = tmpdir("daemon");
    let sock = dir.join("vrdma0.sock");
    let sock_str = sock.to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
        .args(["--socket-path", sock_str, "--mac", "52:54:00:00:00:07"])
        .args(["--log-file", dir.join("log").to_str().unwrap()])
        .spawn()
        .unwrap();
    let stats = stats_socket_path(&sock);
    let start = Instant::now();
    while !(sock.exists() && stats.exists()) {
        assert!(start.elapsed() < Duration::from_secs(20), "no sockets");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
        .args(["stats", "--socket", sock_str])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sample(&text, "vrdma_objects{device=\"vrdma0\",kind=\"qp\"}"),
        0
    );
    assert_eq!(
        sample(&text, "vrdma_port_rx_frames_total{device=\"vrdma0\"}"),
        0
    );
    assert!(st.success());
    assert!(!stats.exists(), "SIGTERM removes the stats socket");
    // Without a daemon: one error line, non-zero exit.
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
        .args(["stats", "--socket", sock_str])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("vrdma0.sock.stats"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn daemon_without_room_for_the_stats_socket_still_serves() {
    let dir = tmpdir("long");
    // 104 bytes: a valid vhost-user socket path whose ".stats" sibling passes the 107-byte limit.
    let base = dir.to_str().unwrap().len() + 1;
    assert!(base < 90, "temp dir too long for this test");
    let sock = dir.join(format!("{}.sock", "v".repeat(104 - base - 5)));
    assert_eq!(sock.as_os_str().len(), 104);
    let log = dir.join("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
        .args([
            "--socket-path",
            sock.to_str().unwrap(),
            "--mac",
            "52:54:00:00:00:08",
        ])
        .args(["--log-file", log.to_str().unwrap()])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no vhost-user socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // "listening on" is logged after the stats socket was tried.
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("listening on")) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no log line");
        std::thread::sleep(Duration::from_millis(10));
    }
    let alive = child.try_wait().unwrap().is_none();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(alive && st.success(), "{text}");
    assert!(text.contains("no counters socket"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn query_stats(n: &mut Node, qpn: u32) -> Result<VrdmaStats, u32> {
    let r = n.cmd(
        VRDMA_CMD_QUERY_STATS,
        VrdmaCmdQueryStats { qpn, flags: 0 }.as_bytes(),
    )?;
    assert_eq!(r.len(), VrdmaStats::SIZE);
    Ok(VrdmaStats::read_from(&r).unwrap())
}

/// Spec §11.9: QUERY_STATS returns a QP's transport counters, and for the port the sum over
/// every QP the device has had (destroyed ones included) plus ICRC errors and drops.
#[test]
fn query_stats_reports_qp_and_port_counters() {
    let mut p = pair();
    // Lose the first MIDDLE once: a NAK, a go-back-N; keep a copy of one frame A sent.
    let (mut drop, _) = drop_first(RC_RDMA_WRITE_MIDDLE);
    let seen: Arc<std::sync::Mutex<Vec<u8>>> = Arc::default();
    let s2 = seen.clone();
    p.link.filter_ab = Some(Box::new(move |f| {
        s2.lock().unwrap().clone_from(&f.to_vec());
        drop(f)
    }));
    let done = write_4k(&mut p);
    assert_eq!(done[0].status, VRDMA_WC_SUCCESS);

    let sa = query_stats(&mut p.a, p.qa.qpn).unwrap();
    let want = p.a.dev.qps.get(p.qa.qpn).unwrap().stats;
    assert_eq!(
        (sa.tx_packets, sa.tx_bytes, sa.rx_packets, sa.rx_bytes),
        (
            want.tx_packets,
            want.tx_bytes,
            want.rx_packets,
            want.rx_bytes
        )
    );
    assert_eq!((sa.retransmits, sa.seq_naks_rx), (3, 1), "{want:?}");
    assert_eq!((sa.icrc_errors, sa.rx_dropped, sa.odp_faults), (0, 0, 0));
    let sb = query_stats(&mut p.b, p.qb.qpn).unwrap();
    assert_eq!(sb.seq_naks_tx, 1);

    // The port: every QP (a second, idle QP adds nothing), and it survives the QP's destroy.
    let idle = p.a.create_qp(QpSpec::rc(p.pda, p.cqna));
    let port = query_stats(&mut p.a, 0).unwrap();
    assert_eq!((port.tx_packets, port.retransmits), (7, 3));
    assert_eq!(port.rx_packets, sa.rx_packets);
    p.a.cmd(
        VRDMA_CMD_DESTROY_QP,
        VrdmaHandle {
            handle: p.qa.qpn,
            reserved: 0,
        }
        .as_bytes(),
    )
    .unwrap();
    let after = query_stats(&mut p.a, 0).unwrap();
    assert_eq!((after.tx_packets, after.tx_bytes), (7, port.tx_bytes));
    assert_eq!(
        query_stats(&mut p.a, p.qa.qpn).unwrap_err(),
        VRDMA_STATUS_NOT_FOUND
    );
    assert_eq!(query_stats(&mut p.a, idle.qpn).unwrap().tx_packets, 0);
    // A device reset destroys the QPs, not the port's totals.
    p.b.dev.reset();
    let bp = query_stats(&mut p.b, 0).unwrap();
    assert_eq!((bp.rx_packets, bp.seq_naks_tx), (sb.rx_packets, 1));

    // A frame with a broken ICRC: counted as an ICRC error and a drop; a frame for a QPN that
    // is gone (qa was destroyed): a drop only.
    let mut f = seen.lock().unwrap().clone();
    assert!(!f.is_empty());
    let n = f.len();
    f[n - 1] ^= 0xff;
    let before = query_stats(&mut p.b, 0).unwrap();
    transport::on_frame(&p.b.dev, &f);
    f[n - 1] ^= 0xff;
    transport::on_frame(&p.b.dev, &f);
    let bp = query_stats(&mut p.b, 0).unwrap();
    assert_eq!(bp.icrc_errors, before.icrc_errors + 1);
    assert_eq!(bp.rx_dropped, before.rx_dropped + 2);
    assert_eq!(bp.rx_packets, before.rx_packets);

    // flags must be 0.
    assert_eq!(
        p.a.cmd(
            VRDMA_CMD_QUERY_STATS,
            VrdmaCmdQueryStats { qpn: 0, flags: 1 }.as_bytes()
        )
        .unwrap_err(),
        VRDMA_STATUS_INVALID
    );
}
