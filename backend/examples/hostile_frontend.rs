//! A vhost-user frontend that is not QEMU and offers a daemon guest memory it must refuse
//! (spec §16.5). The VM scenario `refused_frontend_beside_traffic` (tests/vm/scenarios/
//! neighbours.py) runs it against a spare device of the daemon that serves the guests.
//!
//!   hostile_frontend SOCKET beyond|unsealed
//!
//! `beyond`: a region twice as long as its (sealed) memfd; `unsealed`: a memfd of the right
//! length without F_SEAL_SHRINK (the frontend could truncate it under the daemon later).
//! Prints "refused: ..." and exits 0 when the daemon ended the connection after
//! SET_MEM_TABLE (the next request gets no answer); exits 1 when the table was accepted.
//! Build: `cargo build --release -p vrdma-backend --example hostile_frontend`.

#[path = "../tests/vhost_user_support/mod.rs"]
mod vhost_user_support;

use std::path::Path;
use std::process::ExitCode;

use vhost::VhostBackend;
use vhost_user_support::{connect, region_of, sealed_memfd, unsealed_memfd};

/// Where the offered region claims to be, in the guest and in the (absent) frontend process.
const GPA: u64 = 0x10_0000;
const UVA: u64 = 0x7f00_0000_0000;
const FILE_LEN: u64 = 1 << 20;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (socket, how) = match args.as_slice() {
        [_, socket, how] if how == "beyond" || how == "unsealed" => (socket, how.as_str()),
        _ => {
            eprintln!("usage: hostile_frontend SOCKET beyond|unsealed");
            return ExitCode::from(2);
        }
    };
    let (fe, _) = connect(Path::new(socket), true);
    let (file, size) = match how {
        "beyond" => (sealed_memfd(FILE_LEN), 2 * FILE_LEN),
        _ => (unsealed_memfd(FILE_LEN), FILE_LEN),
    };
    // The answer (or its absence) to SET_MEM_TABLE itself is not the verdict: a daemon that
    // refuses the table ends the connection, so the next request is what tells.
    let _ = fe.set_mem_table(&[region_of(&file, GPA, size, UVA)]);
    match fe.get_features() {
        Err(e) => {
            println!("refused: the daemon ended the connection after a {how} region ({e})");
            ExitCode::SUCCESS
        }
        Ok(_) => {
            println!("accepted: the daemon took a {how} region and still answers");
            ExitCode::FAILURE
        }
    }
}
