//! Interop check: this process is one vrdma device (the test `Node` fixture: device + engine + UDP
//! uplink, no guest) and talks RC to Linux rxe in a QEMU guest. Driven by
//! `backend/tests/data/rxe_interop.py`, which boots the guest, runs the pyverbs side and relays
//! the QP parameters between the two over stdin/stdout:
//!
//! ```text
//! host -> "HOST qpn=N psn=N rkey=N addr=N"      guest -> "GUEST qpn=N psn=N rkey=N addr=N"
//! host -> "HOST READY" (engine running)          guest SENDs 3000 bytes, then host:
//! RDMA WRITE 5000 B, RDMA READ 5000 B, FETCH_ADD +5, SEND 2000 B; prints "HOST DONE ok".
//! ```
//!
//! Usage: rxe_interop LOCAL_ADDR:PORT REMOTE_ADDR:PORT GUEST_MAC [v6]
//! (GUEST_MAC e.g. 52:54:00:00:00:02; `v6`: use the link-local IPv6 GIDs derived from the MACs
//! instead of 10.0.0.1 / 10.0.0.2.) Env `VRDMA_IMPAIR=drop=..,dup=..,reorder=..,seed=..` impairs
//! what this side sends.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::BufRead;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::uplink::{ImpairConfig, Impaired, UdpUplink, Uplink};
use vrdma_spec::*;

fn pat(mul: usize, add: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * mul + add) & 0xff) as u8).collect()
}

/// fe80::/64 with the modified EUI-64 of `mac` (the GID Linux derives for a netdev).
fn link_local(mac: &[u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..11].copy_from_slice(&[mac[0] ^ 2, mac[1], mac[2]]);
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13..].copy_from_slice(&mac[3..]);
    g
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

fn wait_cqe(n: &mut Node, cq: &mut RingH, what: &str) -> Cqe {
    let start = Instant::now();
    loop {
        if let Some(c) = n.poll_cq(cq).into_iter().next() {
            println!(
                "host: {what}: wr_id={} status={} byte_len={}",
                c.wr_id, c.status, c.byte_len
            );
            assert_eq!(c.status, VRDMA_WC_SUCCESS, "{what} failed");
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: no completion"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let local: SocketAddr = args[1].parse().expect("LOCAL");
    let remote: SocketAddr = args[2].parse().expect("REMOTE");
    let gmac = vrdma_backend::cli::parse_mac(&args[3]).expect("GUEST_MAC");

    let v6 = args.get(4).is_some_and(|a| a == "v6");
    let mut a = if v6 {
        Node::with_gid(1, 64, 1500, link_local(&[0x52, 0x54, 0, 0, 0, 1]))
    } else {
        Node::new(1, 64, 1500)
    };
    let pd = a.create_pd();
    let (cq, mut cqr) = a.create_cq(256);
    let mut q = a.create_qp(QpSpec::rc(pd, cq));
    let buf = a.alloc(65536);
    let k = a.reg_mr(pd, buf, 65536, ACC_ALL);
    let psn = 0x00ab_cdef;
    println!("HOST qpn={} psn={psn} rkey={k} addr={buf}", q.qpn);

    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        stdin.lock().read_line(&mut line).expect("stdin");
        if line.starts_with("GUEST ") {
            break;
        }
    }
    let (gqpn, gpsn, grkey, gaddr) = (
        field(&line, "qpn") as u32,
        field(&line, "psn") as u32,
        field(&line, "rkey") as u32,
        field(&line, "addr"),
    );
    let mut av = a.av_to(&a);
    av.dgid = if v6 {
        link_local(&gmac)
    } else {
        gid_v4([10, 0, 0, 2])
    };
    av.dmac = gmac;
    rts(&mut a, &q, gqpn, av, RtsAttrs::mtu(3), (psn, gpsn));
    let mut rq = q.rq.clone().unwrap();
    a.post_recv(&mut rq, 1, &[(buf + 24576, 4096, k)]);

    let up = UdpUplink::new(local, remote).expect("uplink");
    let (up, impaired): (Arc<dyn Uplink>, _) = match std::env::var("VRDMA_IMPAIR") {
        Ok(spec) => {
            let cfg: ImpairConfig = spec.parse().expect("VRDMA_IMPAIR");
            println!("host: impairing sends: {cfg:?}");
            let i = Arc::new(Impaired::new(up, cfg));
            (i.clone(), Some(i))
        }
        Err(_) => (Arc::new(up), None),
    };
    let d = detach(&mut a);
    let e = Engine::start(d, up).expect("engine");
    println!("HOST READY");

    // 1. The guest's SEND (3000 bytes, multi-packet at MTU 1024).
    let c = wait_cqe(&mut a, &mut cqr, "recv of guest SEND");
    assert_eq!((c.wr_id, c.byte_len), (1, 3000));
    assert!(a.read(buf + 24576, 3000) == pat(11, 3, 3000), "SEND data");

    let ring = |a: &mut Node, q: &mut QpH, w: Wqe| {
        post_send_mem(&a.mem, q, &w);
        e.sender().push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: q.qpn,
        });
    };
    // 2. RDMA WRITE 5000 bytes to the guest's buffer at offset 0.
    a.write(buf, &pat(13, 5, 5000));
    let w = Wqe {
        wr_id: 10,
        opcode: VRDMA_WR_RDMA_WRITE,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(buf, 5000, k)],
        remote_addr: gaddr,
        rkey: grkey,
        ..Default::default()
    };
    ring(&mut a, &mut q, w);
    wait_cqe(&mut a, &mut cqr, "RDMA WRITE");
    // 3. RDMA READ 5000 bytes from the guest's offset 8192.
    let w = Wqe {
        wr_id: 11,
        opcode: VRDMA_WR_RDMA_READ,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(buf + 32768, 5000, k)],
        remote_addr: gaddr + 8192,
        rkey: grkey,
        ..Default::default()
    };
    ring(&mut a, &mut q, w);
    wait_cqe(&mut a, &mut cqr, "RDMA READ");
    assert!(a.read(buf + 32768, 5000) == pat(7, 1, 5000), "READ data");
    // 4. FETCH_ADD +5 on the guest's u64 at offset 16384 (initially 100).
    let w = Wqe {
        wr_id: 12,
        opcode: VRDMA_WR_ATOMIC_FETCH_AND_ADD,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(buf + 40960, 8, k)],
        remote_addr: gaddr + 16384,
        rkey: grkey,
        compare_add: 5,
        ..Default::default()
    };
    ring(&mut a, &mut q, w);
    wait_cqe(&mut a, &mut cqr, "FETCH_ADD");
    let old = u64::from_le_bytes(a.read(buf + 40960, 8).try_into().unwrap());
    assert_eq!(old, 100, "FETCH_ADD original value");
    // 5. SEND 2000 bytes to the guest.
    a.write(buf + 45056, &pat(3, 2, 2000));
    let w = Wqe {
        wr_id: 13,
        opcode: VRDMA_WR_SEND,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(buf + 45056, 2000, k)],
        ..Default::default()
    };
    ring(&mut a, &mut q, w);
    wait_cqe(&mut a, &mut cqr, "SEND");
    if let Some(i) = &impaired {
        println!("host: impairment: {:?}", i.stats());
    }
    println!("HOST DONE ok");
    e.stop();
}
