//! RC WRITE throughput between two engine threads over the UDP uplink on loopback (a measurement,
//! not a test): `cargo run --release --example rc_write_bw [MiB] [msg KiB] [mtu enum]`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let total_mib = args.first().copied().unwrap_or(512);
    let msg = args.get(1).copied().unwrap_or(1024) << 10;
    let mtu = args.get(2).copied().unwrap_or(5) as u32;
    let (mut a, mut b, pda, pdb) = Sides::new(64, 9000).parts();
    let (ca, mut cqa) = a.create_cq(4096);
    let (cb, _cqb) = b.create_cq(4096);
    let mut qa = a.create_qp(QpSpec {
        sq_depth: 1024,
        ..QpSpec::rc(pda, ca)
    });
    let qb = b.create_qp(QpSpec::rc(pdb, cb));
    // timeout 14 (67 ms) like perftest: a loaded 2-core host can starve an engine thread.
    connect(&mut a, &qa, &mut b, &qb, RtsAttrs::mtu(mtu));
    let buf = 16u64 << 20;
    let src = a.alloc(buf);
    let dst = b.alloc(buf);
    let ka = a.reg_mr(pda, src, buf, ACC_ALL);
    let kb = b.reg_mr(pdb, dst, buf, ACC_ALL);
    a.write(src, &pattern(1, buf as usize));
    let (ua, ub) = udp_pair();
    let da = detach(&mut a);
    let db = detach(&mut b);
    let ea = Engine::start(da, Arc::new(ua)).expect("engine a");
    let eb = Engine::start(db, Arc::new(ub)).expect("engine b");
    let n = total_mib * (1 << 20) / msg;
    let depth = 128u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    while done < n {
        while posted < n && posted - done < depth {
            let off = (posted * msg) % buf;
            post_send_mem(
                &a.mem,
                &mut qa,
                &Wqe {
                    wr_id: posted,
                    opcode: VRDMA_WR_RDMA_WRITE,
                    flags: VRDMA_SEND_SIGNALED,
                    sges: vec![(src + off, msg as u32, ka)],
                    remote_addr: dst + off,
                    rkey: kb,
                    ..Default::default()
                },
            );
            posted += 1;
        }
        ea.sender().push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: qa.qpn,
        });
        let c = a.poll_cq(&mut cqa);
        for e in &c {
            assert_eq!(e.status, VRDMA_WC_SUCCESS, "{e:?}");
        }
        done += c.len() as u64;
        if c.is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "stalled at {done}/{n}"
        );
    }
    let t = start.elapsed();
    let bytes = n * msg;
    println!(
        "RC WRITE over UDP loopback: {} MiB in {:.2?} = {:.2} Gbit/s ({} KiB messages, MTU {})",
        bytes >> 20,
        t,
        bytes as f64 * 8.0 / t.as_secs_f64() / 1e9,
        msg >> 10,
        128u32 << mtu
    );
    drop(ea);
    drop(eb);
}
