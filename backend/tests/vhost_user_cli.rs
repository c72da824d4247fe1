//! Command line: parsing and validation (`Args` -> `Config`), `--help`, and the built binary's
//! exit behaviour (one-line errors, clean exit on SIGTERM/SIGINT, the socket it leaves behind).
//!
//! Long because the option table is long: each option has its parse, validation and error
//! cases here, beside the few that run the built binary.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use vrdma_backend::cli::{Args, CliError, Config, DaemonConfig};
use vrdma_backend::fabric::UplinkNets;
use vrdma_backend::uplink::UplinkSpec;

fn tmpdir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("vrdma-cli-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn parse(extra: &[&str]) -> Result<Config, CliError> {
    let sock = tmpdir("parse").join("s.sock");
    let mut argv = vec![
        "vrdma-backend".to_string(),
        "--socket-path".to_string(),
        sock.display().to_string(),
    ];
    if !extra.contains(&"--mac") {
        argv.extend(["--mac".to_string(), "52:54:00:12:34:56".to_string()]);
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    Config::try_from(Args::try_parse_from(argv).expect("clap accepts the syntax"))
}

#[test]
fn defaults() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.mac, [0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    assert_eq!(c.mtu, 1500);
    assert_eq!(c.limits.max_qp, 16384);
    assert!(c.odp.enabled);
    assert_eq!(c.odp.chunk_shift, 21);
    assert_eq!(c.uplink, None);
    assert!(c.impair.is_none());
    assert_eq!((c.pcap.clone(), c.pcap_max_bytes), (None, None));
}

/// `--poll-us`: the engines' busy-poll window (default DEFAULT_POLL_US, 0 = never spin, bounded).
#[test]
fn poll_us() {
    use vrdma_backend::transport::engine::DEFAULT_POLL;
    assert_eq!(parse(&[]).unwrap().engine.poll, DEFAULT_POLL);
    assert!(parse(&["--poll-us", "0"]).unwrap().engine.poll.is_zero());
    assert_eq!(
        parse(&["--poll-us", "20"]).unwrap().engine.poll,
        Duration::from_micros(20)
    );
    assert_eq!(
        parse(&["--poll-us", "99999999"]).unwrap().engine.poll,
        Duration::from_micros(vrdma_backend::cli::MAX_POLL_US)
    );
}

/// `--engine-threads`: engine workers per device, 1 by default, 1..=MAX_WORKERS.
#[test]
fn engine_threads() {
    use vrdma_backend::transport::workers::MAX_WORKERS;
    assert_eq!(parse(&[]).unwrap().engine.threads, 1);
    assert_eq!(parse(&["--engine-threads", "2"]).unwrap().engine.threads, 2);
    let max = MAX_WORKERS.to_string();
    assert_eq!(
        parse(&["--engine-threads", &max]).unwrap().engine.threads,
        MAX_WORKERS
    );
    let too_many = (MAX_WORKERS + 1).to_string();
    for bad in ["0", too_many.as_str(), "two"] {
        let argv = [
            "vrdma-backend",
            "--socket-path",
            "/tmp/x.sock",
            "--mac",
            "52:54:00:12:34:56",
            "--engine-threads",
            bad,
        ];
        let e = Args::try_parse_from(argv).expect_err(bad);
        assert!(e.to_string().contains("--engine-threads"), "{bad}: {e}");
    }
}

/// `--payload-refs`: one copy between the fabric's guests (spec §16.2 rule 6), off by default.
#[test]
fn payload_refs() {
    assert!(!parse(&[]).unwrap().payload_refs);
    assert!(parse(&["--payload-refs"]).unwrap().payload_refs);
}

#[test]
fn pcap_options() {
    let c = parse(&["--pcap", "/tmp/x.pcap", "--pcap-max-bytes", "1000000"]).unwrap();
    assert_eq!(c.pcap, Some(PathBuf::from("/tmp/x.pcap")));
    assert_eq!(c.pcap_max_bytes, Some(1_000_000));
    // A size bound without a capture file is a clap error.
    let sock = tmpdir("pcap").join("s.sock");
    let argv = ["vrdma-backend", "--socket-path", sock.to_str().unwrap()];
    let mut argv: Vec<&str> = argv.to_vec();
    argv.extend(["--mac", "52:54:00:12:34:56", "--pcap-max-bytes", "10"]);
    assert!(Args::try_parse_from(argv).is_err());
}

#[test]
fn mac_validation() {
    for good in [
        "52:54:00:12:34:56",
        "02-00-00-00-00-01",
        "AA:bb:CC:dd:EE:f0",
    ] {
        assert!(parse(&["--mac", good]).is_ok(), "{good}");
    }
    for bad in [
        "",
        "52:54:00:12:34",
        "52:54:00:12:34:56:78",
        "52:54:00:12:34:5g",
        "5254.0012.3456",
        "152:54:00:12:34:56",
    ] {
        assert!(
            matches!(parse(&["--mac", bad]), Err(CliError::BadMac(_))),
            "{bad:?} accepted"
        );
    }
    assert!(matches!(
        parse(&["--mac", "01:00:5e:00:00:01"]),
        Err(CliError::MulticastMac(_))
    ));
    assert!(matches!(
        parse(&["--mac", "00:00:00:00:00:00"]),
        Err(CliError::ZeroMac(_))
    ));
}

#[test]
fn uplink_specs() {
    let ok = [
        "udp:local=127.0.0.1:5000,remote=127.0.0.1:5001",
        "udp:remote=127.0.0.1:5001,local=127.0.0.1:5000",
        "udp:local=[::1]:5000,remote=[::1]:5001",
        "tap:vrdma0",
    ];
    for spec in ok {
        let c = parse(&["--uplink", spec]).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(c.uplink, Some(spec.parse::<UplinkSpec>().unwrap()));
    }
    let bad = [
        "udp:local=127.0.0.1:5000",
        "udp:local=127.0.0.1,remote=127.0.0.1:5001",
        "udp:local=127.0.0.1:5000,remote=[::1]:5001",
        "udp:local=127.0.0.1:5000,remote=127.0.0.1:5001,local=127.0.0.1:5002",
        "udp:local=127.0.0.1:5000,remote=127.0.0.1:5001,bogus=1",
        "tap:",
        "tap:a/b",
        "tap:waytoolonginterfacename",
        "eth0",
        "udp:",
    ];
    for spec in bad {
        assert!(
            matches!(parse(&["--uplink", spec]), Err(CliError::BadUplink { .. })),
            "{spec:?} accepted"
        );
    }
}

#[test]
fn limits_odp_mtu_impair() {
    let c = parse(&[
        "--max-qp",
        "100",
        "--max-cq",
        "200",
        "--max-mr",
        "300",
        "--max-pd",
        "400",
        "--max-srq",
        "500",
        "--max-ah",
        "600",
        "--odp-chunk-shift",
        "16",
        "--odp-resident-chunks",
        "9",
        "--no-odp",
        "--mtu",
        "9000",
    ])
    .unwrap();
    assert_eq!(
        (c.limits.max_qp, c.limits.max_cq, c.limits.max_mr),
        (100, 200, 300)
    );
    assert_eq!(
        (c.limits.max_pd, c.limits.max_srq, c.limits.max_ah),
        (400, 500, 600)
    );
    assert_eq!((c.odp.chunk_shift, c.odp.resident_chunks), (16, 9));
    assert!(!c.odp.enabled);
    assert_eq!(c.mtu, 9000);

    type Refusal = fn(&CliError) -> bool;
    let refused: [(&[&str], Refusal); 5] = [
        (&["--max-qp", "0"], |e| {
            matches!(e, CliError::BadLimit { .. })
        }),
        (&["--odp-chunk-shift", "11"], |e| {
            matches!(e, CliError::BadChunkShift(11))
        }),
        (&["--odp-chunk-shift", "31"], |e| {
            matches!(e, CliError::BadChunkShift(31))
        }),
        (&["--odp-resident-chunks", "0"], |e| {
            matches!(e, CliError::BadResidentChunks(0))
        }),
        (&["--mtu", "100"], |e| matches!(e, CliError::BadMtu(100))),
    ];
    for (argv, is_expected) in refused {
        assert!(parse(argv).is_err_and(|e| is_expected(&e)), "{argv:?}");
    }

    let c = parse(&["--impair", "drop=0.1,dup=0.05,reorder=0.2,seed=42"]).unwrap();
    let i = c.impair.unwrap();
    assert_eq!((i.drop, i.dup, i.reorder, i.seed), (0.1, 0.05, 0.2, 42));
    let i = parse(&["--impair", "drop=1"]).unwrap().impair.unwrap();
    assert_eq!((i.drop, i.dup, i.reorder), (1.0, 0.0, 0.0));
    for bad in ["drop=1.5", "drop=-0.1", "loss=0.1", "drop", "seed=x"] {
        assert!(
            matches!(parse(&["--impair", bad]), Err(CliError::BadImpair { .. })),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn socket_path_checks() {
    let d = tmpdir("sock");
    let file = d.join("regular");
    std::fs::write(&file, b"x").unwrap();
    let args = |p: &str| {
        Args::try_parse_from([
            "vrdma-backend",
            "--socket-path",
            p,
            "--mac",
            "52:54:00:00:00:01",
        ])
        .unwrap()
    };
    assert!(matches!(
        Config::try_from(args(file.to_str().unwrap())),
        Err(CliError::BadSocketPath { .. })
    ));
    assert!(
        std::fs::read(&file).is_ok(),
        "a regular file is never deleted"
    );
    assert!(matches!(
        Config::try_from(args("/nonexistent-dir/vrdma.sock")),
        Err(CliError::BadSocketPath { .. })
    ));
    let long = format!("{}/{}", d.display(), "s".repeat(120));
    assert!(matches!(
        Config::try_from(args(&long)),
        Err(CliError::BadSocketPath { .. })
    ));
    // Missing required options are clap errors.
    assert!(Args::try_parse_from(["vrdma-backend", "--mac", "52:54:00:00:00:01"]).is_err());
    assert!(Args::try_parse_from(["vrdma-backend", "--socket-path", "/tmp/x"]).is_err());
}

#[test]
fn help_documents_every_option() {
    let help = Args::command().render_long_help().to_string();
    for opt in [
        "--socket-path",
        "--mac",
        "--device",
        "socket=PATH,mac=MAC",
        "--uplink",
        "--mtu",
        "--max-qp",
        "--max-cq",
        "--max-mr",
        "--max-pd",
        "--max-srq",
        "--max-ah",
        "--odp-chunk-shift",
        "--odp-resident-chunks",
        "--no-odp",
        "--impair",
        "--log-file",
        "--pcap",
        "--pcap-max-bytes",
        "--poll-us",
        "--engine-threads",
        "--payload-refs",
        "--socket-owner",
        "--socket-group",
        "--socket-mode",
        "--stats-socket",
        "owner=UID",
        "vrdma-backend stats --socket",
        "RUST_LOG",
        "TEST ONLY",
        "udp:local=ADDR:PORT,remote=ADDR:PORT",
        "tap:NAME",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}");
    }
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vrdma-backend")
}

#[test]
fn binary_rejects_bad_mac_with_one_line() {
    let d = tmpdir("badmac");
    let out = Command::new(bin())
        .args([
            "--socket-path",
            d.join("s").to_str().unwrap(),
            "--mac",
            "zz:00:00:00:00:00",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "stderr: {err}");
    assert!(err.contains("--mac"), "stderr: {err}");
}

fn wait_for(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(path: &std::path::Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

fn wait_for_log(path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !read(path).contains(what) {
        assert!(Instant::now() < deadline, "log never said {what:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn binary_exits_cleanly_on_sigterm_and_sigint() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let d = tmpdir(&format!("sig{sig}"));
        let sock = d.join("vrdma.sock");
        let log = d.join("daemon.log");
        let mut child = Command::new(bin())
            .args([
                "--socket-path",
                sock.to_str().unwrap(),
                "--mac",
                "52:54:00:00:00:02",
                "--log-file",
                log.to_str().unwrap(),
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(&sock);
        wait_for_log(&log, "listening on");
        // SAFETY: kill() on the pid of a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "signal {sig}");
        assert!(!sock.exists(), "socket removed on exit");
        let s = read(&log);
        assert!(s.contains(&format!("signal {sig} received")), "log: {s}");
    }
}

#[test]
fn binary_reports_an_uplink_bind_failure_before_creating_the_socket() {
    let busy = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let d = tmpdir("bind");
    let sock = d.join("vrdma.sock");
    let out = Command::new(bin())
        .args([
            "--socket-path",
            sock.to_str().unwrap(),
            "--mac",
            "52:54:00:00:00:03",
            "--uplink",
            &format!("udp:local={addr},remote=127.0.0.1:9"),
        ])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "stderr: {err}");
    assert!(err.contains(&addr.to_string()), "stderr: {err}");
    assert!(!sock.exists(), "no socket left behind");
}

#[test]
fn max_host_memory_takes_suffixes_and_reaches_the_device() {
    assert_eq!(parse(&[]).unwrap().max_host_memory, 1 << 30);
    for (arg, bytes) in [("64M", 64u64 << 20), ("2G", 2 << 30), ("1048576", 1 << 20)] {
        let c = parse(&["--max-host-memory", arg]).unwrap();
        assert_eq!(c.max_host_memory, bytes, "{arg}");
        let d = c.device_config();
        assert_eq!(d.max_host_memory, bytes);
    }
    for bad in ["0", "1K", "12Q", "", "M"] {
        assert!(
            matches!(
                parse(&["--max-host-memory", bad]),
                Err(CliError::BadHostMemory(_))
            ),
            "{bad}"
        );
    }
    let help = Args::command().render_long_help().to_string();
    assert!(help.contains("--max-host-memory"), "{help}");
}

fn daemon(argv: &[&str]) -> Result<DaemonConfig, CliError> {
    let mut v = vec!["vrdma-backend"];
    v.extend(argv);
    DaemonConfig::try_from(Args::try_parse_from(v).expect("clap accepts the syntax"))
}

/// Spec §16.1: `--max-host-memory` bounds the daemon, `--max-host-memory-per-device` and a
/// device's `max-host-memory=` each device; a single-device command line keeps its meaning.
#[test]
fn host_memory_bounds_per_daemon_and_per_device() {
    const G: u64 = 1 << 30;
    let d = tmpdir("hostmem");
    let dev = |n: u8, extra: &str| {
        format!(
            "socket={},mac=52:54:00:00:00:0{n}{extra}",
            d.join(format!("s{n}")).display()
        )
    };
    let (s1, s2) = (dev(1, ""), dev(2, ",max-host-memory=3G"));
    // Defaults: 1 GiB per device, the daemon the sum plus the two receive queues it reserves
    // (so that each device can still reach its own bound), plus the capture queue with --pcap.
    const RXQ: u64 = vrdma_backend::fabric::rxqueue::RXQ_MAX_BYTES as u64;
    let c = daemon(&["--device", &s1, "--device", &dev(2, "")]).unwrap();
    assert_eq!(c.max_host_memory, 2 * G + 2 * RXQ);
    let pcap = d.join("c.pcap");
    let c = daemon(&["--device", &s1, "--pcap", pcap.to_str().unwrap()]).unwrap();
    assert_eq!(
        c.max_host_memory,
        G + RXQ + vrdma_backend::uplink::pcap::QUEUE_BYTES
    );
    assert!(c.devices.iter().all(|x| x.max_host_memory == G));
    // The daemon's total; each device at most 1 GiB by default, at most the total.
    let c = daemon(&["--device", &s1, "--device", &s2, "--max-host-memory", "4G"]).unwrap();
    assert_eq!(c.max_host_memory, 4 * G);
    assert_eq!(
        c.devices
            .iter()
            .map(|x| x.max_host_memory)
            .collect::<Vec<_>>(),
        vec![G, 3 * G]
    );
    let c = daemon(&["--device", &s1, "--max-host-memory", "512M"]).unwrap();
    assert_eq!(
        (c.max_host_memory, c.devices[0].max_host_memory),
        (512 << 20, 512 << 20)
    );
    let c = daemon(&[
        "--device",
        &s1,
        "--device",
        &s2,
        "--max-host-memory-per-device",
        "256M",
    ])
    .unwrap();
    assert_eq!(
        c.devices
            .iter()
            .map(|x| x.max_host_memory)
            .collect::<Vec<_>>(),
        vec![256 << 20, 3 * G]
    );
    assert_eq!(c.max_host_memory, 3 * G + (256 << 20) + 2 * RXQ, "the sum");
    // The single-device form: --max-host-memory is the device's bound and the daemon's.
    let legacy = [
        "--socket-path",
        "/tmp/x.sock",
        "--mac",
        "52:54:00:00:00:09",
        "--max-host-memory",
        "2G",
    ];
    let c = daemon(&legacy).unwrap();
    assert_eq!(
        (c.max_host_memory, c.devices[0].max_host_memory),
        (2 * G, 2 * G)
    );
    for bad in [
        dev(3, ",max-host-memory=1K"),
        dev(3, ",max-host-memory=1G,max-host-memory=2G"),
    ] {
        assert!(
            matches!(daemon(&["--device", &bad]), Err(CliError::BadDevice { .. })),
            "{bad}"
        );
    }
    assert!(matches!(
        daemon(&["--device", &s1, "--max-host-memory-per-device", "0"]),
        Err(CliError::BadHostMemory(_))
    ));
    let help = Args::command().render_long_help().to_string();
    assert!(help.contains("--max-host-memory-per-device"), "{help}");
}

/// Spec §16.1/§16.4: a fabric daemon reserves its devices' receive queues on its budget; one
/// whose --max-host-memory cannot hold them refuses to start, before any socket exists.
#[test]
fn a_daemon_budget_below_its_queues_refuses_to_start() {
    let d = tmpdir("queues");
    let (s0, s1) = (
        format!("socket={},mac=52:54:00:00:00:01", d.join("a").display()),
        format!("socket={},mac=52:54:00:00:00:02", d.join("b").display()),
    );
    let c = daemon(&["--device", &s0, "--device", &s1, "--max-host-memory", "24M"]).unwrap();
    match vrdma_backend::vhost_user::prepare_fabric(&c) {
        Err(vrdma_backend::vhost_user::StartError::QueuesOverBudget { devices, .. }) => {
            assert_eq!(devices, 2)
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("two 16 MiB queues fit a 24 MiB daemon budget"),
    }
    assert!(!d.join("a").exists() && !d.join("b").exists(), "no socket");
}

#[test]
fn devices_on_a_fabric() {
    let d = tmpdir("fabric");
    let s0 = format!("socket={},mac=52:54:00:00:00:01", d.join("a").display());
    let s1 = format!("socket={},mac=52:54:00:00:00:02", d.join("b").display());
    let up = "udp:local=127.0.0.1:4000,remote=127.0.0.1:4001";
    let c = daemon(&[
        "--device", &s0, "--device", &s1, "--uplink", up, "--mtu", "9000",
    ])
    .unwrap();
    assert_eq!(c.devices.len(), 2);
    assert_eq!(c.devices[1].mac, [0x52, 0x54, 0, 0, 0, 2]);
    assert_eq!(c.devices[0].socket_path, d.join("a"));
    assert!(c
        .devices
        .iter()
        .all(|x| x.mtu == 9000 && x.uplink.is_none()));
    let fabric = c.fabric.clone().expect("fabric");
    assert_eq!(fabric.uplinks, vec![up.parse::<UplinkSpec>().unwrap()]);
    assert_eq!(c.sockets(), vec![d.join("a"), d.join("b")]);
    // One --device is a fabric of one (the uplinks are its ports); two uplinks are allowed.
    let c = daemon(&["--device", &s0, "--uplink", up, "--uplink", "tap:vr0"]).unwrap();
    assert_eq!(c.fabric.unwrap().uplinks.len(), 2);
    // The single-device form: no fabric, at most one uplink.
    let legacy = ["--socket-path", "/tmp/x.sock", "--mac", "52:54:00:00:00:09"];
    let c = daemon(&legacy).unwrap();
    assert!(c.fabric.is_none());
    let mut two = legacy.to_vec();
    two.extend(["--uplink", up, "--uplink", "tap:vr0"]);
    assert_eq!(daemon(&two), Err(CliError::UplinksNeedFabric));
    assert_eq!(
        Config::try_from(Args::try_parse_from(["vrdma-backend", "--device", &s0]).unwrap()),
        Err(CliError::NotSingleDevice)
    );
}

#[test]
fn bad_device_specs() {
    let d = tmpdir("baddev");
    let a = d.join("a").display().to_string();
    for spec in [
        format!("socket={a}"),
        "mac=52:54:00:00:00:01".to_string(),
        format!("socket={a},mac=52:54:00:00:00:01,mtu=9000"),
        format!("socket={a},mac=zz:54:00:00:00:01"),
        format!("socket={a},mac=01:54:00:00:00:01"),
        format!("socket={a},socket={a},mac=52:54:00:00:00:01"),
        "socket=/nonexistent-dir/s,mac=52:54:00:00:00:01".to_string(),
    ] {
        assert!(
            matches!(
                daemon(&["--device", &spec]),
                Err(CliError::BadDevice { .. })
            ),
            "{spec} accepted"
        );
    }
    let x = format!("socket={a},mac=52:54:00:00:00:01");
    let same_mac = format!("socket={}/b,mac=52:54:00:00:00:01", d.display());
    let same_sock = format!("socket={a},mac=52:54:00:00:00:02");
    assert!(matches!(
        daemon(&["--device", &x, "--device", &same_mac]),
        Err(CliError::BadDevice { .. })
    ));
    assert!(matches!(
        daemon(&["--device", &x, "--device", &same_sock]),
        Err(CliError::BadDevice { .. })
    ));
    // --device and the single-device options exclude each other (a clap error).
    assert!(Args::try_parse_from([
        "vrdma-backend",
        "--device",
        &x,
        "--mac",
        "52:54:00:00:00:03"
    ])
    .is_err());
}

#[test]
fn binary_serves_several_devices_and_removes_every_socket() {
    let d = tmpdir("multi");
    let log = d.join("daemon.log");
    let socks: Vec<PathBuf> = (0..3).map(|i| d.join(format!("vu{i}.sock"))).collect();
    let mut args: Vec<String> = Vec::new();
    for (i, s) in socks.iter().enumerate() {
        args.push("--device".into());
        args.push(format!(
            "socket={},mac=52:54:00:00:01:{:02x}",
            s.display(),
            i + 1
        ));
    }
    let operator = d.join("fabric.stats");
    args.extend(["--log-file".into(), log.display().to_string()]);
    args.extend(["--stats-socket".into(), operator.display().to_string()]);
    let mut child = Command::new(bin()).args(&args).spawn().unwrap();
    for s in &socks {
        wait_for(s);
        wait_for(&PathBuf::from(format!("{}.stats", s.display())));
    }
    wait_for_log(&log, "fabric: 3 device(s), 0 uplink(s)");
    // Spec §16.5: a device's counters are its own; no other tenant's port appears there.
    let own = vrdma_backend::exporter::fetch(&socks[0]).expect("device stats");
    assert!(
        own.contains("vrdma_port_rx_frames_total{device=\"vu0\"}"),
        "{own}"
    );
    for other in ["vu1", "vu2", "vrdma_fabric_"] {
        assert!(
            !own.contains(other),
            "device vu0's stats show {other}:\n{own}"
        );
    }
    // The fabric's per-port counters are on the operator socket, mode 0600.
    wait_for(&operator);
    {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(&operator).unwrap();
        assert_eq!(md.mode() & 0o777, 0o600);
    }
    let text = vrdma_backend::exporter::fetch(&operator).expect("operator stats");
    for port in ["vu0", "vu1", "vu2"] {
        for needle in [
            format!("vrdma_fabric_frames_total{{port=\"{port}\",kind=\"device\",dir=\"in\"}} "),
            format!(
                "vrdma_fabric_drops_total{{port=\"{port}\",kind=\"device\",reason=\"spoofed\"}} 0"
            ),
        ] {
            assert!(text.contains(&needle), "stats lack {needle}:\n{text}");
        }
    }
    // SAFETY: kill() on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    for s in &socks {
        assert!(!s.exists(), "{} removed on exit", s.display());
    }
    assert!(!operator.exists(), "operator socket removed on exit");
}

/// Spec §16.5: `--socket-mode` / `--socket-group` (daemon-wide) and a device's `mode=` are on
/// the vhost-user and `.stats` sockets as soon as they exist, and a --device key overrides
/// the daemon-wide value for that device only.
#[test]
fn sockets_get_their_owner_group_and_mode() {
    use std::os::unix::fs::MetadataExt;
    let d = tmpdir("access");
    let log = d.join("daemon.log");
    let a = d.join("a.sock");
    let b = d.join("b.sock");
    // SAFETY: getegid has no preconditions.
    let gid = unsafe { libc::getegid() };
    let mut child = Command::new(bin())
        .args([
            "--device",
            &format!("socket={},mac=52:54:00:00:02:01", a.display()),
            "--device",
            &format!("socket={},mac=52:54:00:00:02:02,mode=0600", b.display()),
            "--socket-mode",
            "0660",
            "--socket-group",
            &gid.to_string(),
            "--log-file",
            log.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    wait_for_log(&log, "fabric: 2 device(s)");
    for (sock, mode) in [(&a, 0o660), (&b, 0o600)] {
        let stats = PathBuf::from(format!("{}.stats", sock.display()));
        wait_for(&stats);
        for p in [sock, &stats] {
            let md = std::fs::symlink_metadata(p).unwrap();
            assert_eq!(md.mode() & 0o777, mode, "{}", p.display());
            assert_eq!(md.gid(), gid, "{}", p.display());
        }
    }
    // SAFETY: kill() on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn socket_access_options_parse() {
    let c = parse(&["--socket-mode", "0640", "--socket-owner", "1000"]).unwrap();
    assert_eq!(c.socket_access.mode, Some(0o640));
    assert_eq!(c.socket_access.owner, Some(1000));
    assert!(Args::try_parse_from([
        "vrdma-backend",
        "--socket-path",
        "/tmp/x.sock",
        "--mac",
        "52:54:00:00:00:01",
        "--socket-mode",
        "0999"
    ])
    .is_err());
    let e = daemon(&[
        "--device",
        "socket=/tmp/x.sock,mac=52:54:00:00:00:01,mode=07777",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("mode"), "{e}");
}

/// A fabric daemon's devices share engine threads unless `--own-engine-threads` says
/// otherwise; `--shared-engine` names the default and conflicts with the opt-out; without
/// --device (one device, no fabric) the sharing options are refused, the opt-out changes
/// nothing.
#[test]
fn fabric_devices_share_engine_threads_unless_told_otherwise() {
    let d = tmpdir("shared-engine");
    let a = format!("socket={},mac=52:54:00:00:00:01", d.join("a").display());
    let b = format!("socket={},mac=52:54:00:00:00:02", d.join("b").display());
    let grouped = |extra: &[&str]| {
        let mut args = vec!["--device", a.as_str(), "--device", b.as_str()];
        args.extend_from_slice(extra);
        let c = daemon(&args).expect("fabric command line");
        let f = vrdma_backend::vhost_user::prepare_fabric(&c).expect("fabric daemon");
        let in_group: Vec<bool> = f.devices.iter().map(|p| p.engine.in_group()).collect();
        (c.fabric.unwrap().shared_engine, in_group)
    };
    assert_eq!(grouped(&[]), (true, vec![true, true]), "the default");
    assert_eq!(grouped(&["--shared-engine"]), (true, vec![true, true]));
    assert_eq!(
        grouped(&["--own-engine-threads"]),
        (false, vec![false, false])
    );
    let refused = |extra: &[&str]| {
        let mut args = vec!["vrdma-backend", "--device", a.as_str()];
        args.extend_from_slice(extra);
        Args::try_parse_from(args).is_err()
    };
    assert!(refused(&["--own-engine-threads", "--shared-engine"]));
    assert!(refused(&[
        "--own-engine-threads",
        "--shared-engine-threads",
        "2"
    ]));
    assert_eq!(
        one_device_with("--shared-engine"),
        Err(CliError::SharedEngineNeedsFabric)
    );
    let one = one_device_with("--own-engine-threads").expect("one device");
    assert!(one.fabric.is_none());
}

/// `--shared-engine-threads N` (the group's slots) reaches the fabric's configuration, with
/// or without `--shared-engine`, from 1 to 64; unset, the daemon takes the CPUs it may run
/// on; with one device (no fabric, no group) it is refused.
#[test]
fn shared_engine_threads_are_counted_from_one_to_64() {
    let d = tmpdir("shared-engine-threads");
    let a = format!("socket={},mac=52:54:00:00:00:01", d.join("a").display());
    let with = |extra: &[&str]| {
        let mut args = vec!["--device", a.as_str()];
        args.extend_from_slice(extra);
        daemon(&args)
    };
    let c = with(&["--shared-engine", "--shared-engine-threads", "3"]).unwrap();
    assert_eq!(c.fabric.as_ref().unwrap().shared_engine_threads, Some(3));
    let c = with(&["--shared-engine-threads", "64"]).unwrap();
    assert_eq!(c.fabric.as_ref().unwrap().shared_engine_threads, Some(64));
    let c = with(&[]).unwrap();
    assert_eq!(c.fabric.as_ref().unwrap().shared_engine_threads, None);
    let refused = |extra: &[&str]| {
        let mut args = vec!["vrdma-backend", "--device", a.as_str()];
        args.extend_from_slice(extra);
        Args::try_parse_from(args).is_err()
    };
    for n in ["0", "65", "x"] {
        assert!(refused(&["--shared-engine-threads", n]), "{n} sets");
    }
    let one = daemon(&[
        "--socket-path",
        "/tmp/x.sock",
        "--mac",
        "52:54:00:00:00:09",
        "--shared-engine-threads",
        "2",
    ]);
    assert_eq!(one, Err(CliError::SharedEngineNeedsFabric));
}

/// A one-device command line (no --device, so no fabric) with `flag` added.
fn one_device_with(flag: &str) -> Result<DaemonConfig, CliError> {
    daemon(&[
        "--socket-path",
        "/tmp/x.sock",
        "--mac",
        "52:54:00:00:00:09",
        flag,
    ])
}

/// Spec §16.3: `ip=` / `net=` per device and `--forward-between-uplinks` reach the
/// configuration; bad values are refused with a message naming the problem.
#[test]
fn tenant_options_parse() {
    let d = tmpdir("tenant");
    let a = format!(
        "socket={},mac=52:54:00:00:00:01,net=3,ip=10.0.0.1,ip=fd00::1",
        d.join("a").display()
    );
    let c = daemon(&["--device", &a]).unwrap();
    assert_eq!(c.devices[0].fabric_port.net, 3);
    assert_eq!(c.devices[0].fabric_port.ips.len(), 2);
    assert!(!c.fabric.as_ref().unwrap().forward_between_uplinks);
    let c = daemon(&["--device", &a, "--forward-between-uplinks"]).unwrap();
    assert!(c.fabric.unwrap().forward_between_uplinks);
    // Only with --device.
    assert_eq!(
        one_device_with("--forward-between-uplinks"),
        Err(CliError::BetweenUplinksNeedFabric)
    );
    // An uplink's networks.
    let up = "udp:local=127.0.0.1:5000,remote=127.0.0.1:5001";
    let trunk = format!("{up},vlans=5+3");
    let c = daemon(&[
        "--device",
        &a,
        "--uplink",
        &trunk,
        "--uplink",
        "tap:vr0,net=3",
    ])
    .unwrap();
    let f = c.fabric.unwrap();
    assert_eq!(f.uplinks[0], up.parse::<UplinkSpec>().unwrap());
    assert_eq!(
        f.uplink_nets,
        vec![UplinkNets::Tagged(vec![3, 5]), UplinkNets::Untagged(3)]
    );
    let e = daemon(&["--device", &a, "--uplink", &format!("{up},vlans=0")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("priority tag"), "{e}");
    let legacy = ["--socket-path", "/tmp/x.sock", "--mac", "52:54:00:00:00:09"];
    let mut with_net = legacy.to_vec();
    let netted = format!("{up},net=2");
    with_net.extend(["--uplink", &netted]);
    assert_eq!(daemon(&with_net), Err(CliError::NetworksNeedFabric));
    let bad = format!(
        "socket={},mac=52:54:00:00:00:01,ip=10.0.0.300",
        d.join("b").display()
    );
    let e = daemon(&["--device", &bad]).unwrap_err().to_string();
    assert!(
        e.contains("ip=\"10.0.0.300\" is not an IPv4 or IPv6 address"),
        "{e}"
    );
}
