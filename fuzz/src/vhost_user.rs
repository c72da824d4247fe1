//! Target `vhost_user`: frontend messages into the backend (spec §16.5, §17): the daemon's real
//! connection handling (`vhost_user::serve`, the `vhost-user-backend` crate's request handler
//! and `VhostUserRdma`, with a real `Device` behind it) on one end of a Unix socket, the input
//! on the other, played as a frontend would send it: message headers and payloads with the file
//! descriptors each message carries (guest RAM as a sealed memfd, kick / call / error eventfds,
//! the state pipe). The guest memory's bytes and the kicks come from the input too, so the
//! queues the messages set up get chains to walk.
//!
//! Input: records of `kind u8, flags u8, len u16, payload[len]`.
//! - `kind < 0xf0`: a message with request code `kind % 48` (codes past the last one test the
//!   unknown-request path); `flags & 1` asks for a reply (NEED_REPLY), `flags & 2` makes the
//!   header's size field lie (`len ^ 0x40`). The descriptors sent with it follow the request:
//!   SET_MEM_TABLE one memfd per region it claims (at most 8), ADD_MEM_REG / SET_LOG_BASE /
//!   SET_LOG_FD a memfd, SET_VRING_KICK / CALL / ERR an eventfd (unless the payload sets the
//!   no-fd bit), SET_DEVICE_STATE_FD a pipe end: the read end for a load (direction 1), whose
//!   other end gets the payload's bytes past the first 8 and is closed, the write end for a
//!   save.
//! - `0xf0..=0xf7`: kick the eventfd last given to queue `kind & 7`.
//! - `0xf8..=0xff`: write the payload past its first 4 bytes into guest RAM at offset
//!   `u32 % size`.
//!
//! The harness closes the socket at the end and waits until the daemon has ended the
//! connection and stopped its threads. A panic anywhere (the daemon's threads included: the
//! binary aborts on one) is a finding; so is a daemon that does not end the connection.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use vrdma_backend::device::{Device, DeviceConfig};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport;
use vrdma_backend::vhost_user::{
    daemon::listen, serve, NullSink, ServeParts, VirtqOutput, CONFIG_SIZE,
};

use crate::Input;

/// Guest RAM the frontend offers (one sealed memfd).
pub const GUEST_BYTES: u64 = 1 << 20;
/// Most records per input.
const MAX_RECORDS: usize = 96;
/// Most state bytes put into a load pipe (its buffer holds them without a reader).
const MAX_PIPE_BYTES: usize = 60 * 1024;

pub const GET_FEATURES: u8 = 1;
pub const SET_FEATURES: u8 = 2;
pub const SET_OWNER: u8 = 3;
pub const SET_MEM_TABLE: u8 = 5;
pub const SET_LOG_BASE: u8 = 6;
pub const SET_LOG_FD: u8 = 7;
pub const SET_VRING_NUM: u8 = 8;
pub const SET_VRING_ADDR: u8 = 9;
pub const SET_VRING_BASE: u8 = 10;
pub const GET_VRING_BASE: u8 = 11;
pub const SET_VRING_KICK: u8 = 12;
pub const SET_VRING_CALL: u8 = 13;
pub const SET_VRING_ERR: u8 = 14;
pub const GET_PROTOCOL_FEATURES: u8 = 15;
pub const SET_PROTOCOL_FEATURES: u8 = 16;
pub const GET_QUEUE_NUM: u8 = 17;
pub const SET_VRING_ENABLE: u8 = 18;
pub const GET_CONFIG: u8 = 24;
pub const GET_MAX_MEM_SLOTS: u8 = 36;
pub const ADD_MEM_REG: u8 = 37;
pub const REM_MEM_REG: u8 = 38;
pub const SET_DEVICE_STATE_FD: u8 = 42;
pub const CHECK_DEVICE_STATE: u8 = 43;
/// Record kinds that are not messages.
pub const KICK: u8 = 0xf0;
pub const WRITE_GUEST: u8 = 0xf8;

/// Requests that always get a reply (the harness waits a little for it).
const REPLYING: [u8; 8] = [
    GET_FEATURES,
    GET_VRING_BASE,
    GET_PROTOCOL_FEATURES,
    GET_QUEUE_NUM,
    GET_CONFIG,
    GET_MAX_MEM_SLOTS,
    SET_DEVICE_STATE_FD,
    CHECK_DEVICE_STATE,
];

/// The vhost-user "no file descriptor" bit of a vring index payload.
const VRING_NOFD: u64 = 0x100;

fn memfd(len: u64) -> File {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor (checked) is owned by the
    // File from here on.
    let file = unsafe {
        let fd = libc::memfd_create(
            c"vrdma-fuzz-guest".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(fd >= 0, "memfd_create");
        File::from_raw_fd(fd)
    };
    file.set_len(len).expect("memfd size");
    // Sealed like QEMU's memory-backend-memfd (the daemon refuses regions it could SIGBUS on).
    // SAFETY: F_ADD_SEALS on an open descriptor, an int of seal bits.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    assert_eq!(rc, 0, "F_ADD_SEALS");
    file
}

fn eventfd() -> File {
    // SAFETY: eventfd returns a new descriptor (checked), owned by the File from here on.
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
        assert!(fd >= 0, "eventfd");
        File::from_raw_fd(fd)
    }
}

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the valid array; each is owned below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors nobody else owns.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Send `bytes` with `fds` attached (SCM_RIGHTS); false if the daemon hung up.
fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> bool {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut control = vec![0u64; space.div_ceil(8).max(1)];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` bytes, room for one header and `fds`; the
        // header pointer CMSG_FIRSTHDR returns lies inside that buffer, and CMSG_DATA has
        // room for `fd_bytes` bytes after it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes as usize,
            );
        }
    }
    let mut sent = 0usize;
    while sent < bytes.len() {
        if sent > 0 {
            // The descriptors went with the first part; the rest is plain bytes.
            msg.msg_control = std::ptr::null_mut();
            msg.msg_controllen = 0;
            iov = libc::iovec {
                iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
                iov_len: bytes.len() - sent,
            };
            msg.msg_iov = &mut iov;
        }
        // SAFETY: `msg` points at the live iovec and control buffer above.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n < 0 && e.kind() == std::io::ErrorKind::WouldBlock {
                // The daemon reads slower than we write: wait for room.
                wait_fd(sock.as_raw_fd(), libc::POLLOUT, 200);
                continue;
            }
            return false;
        }
        sent += n as usize;
    }
    true
}

/// Wait up to `ms` for `events` on `fd`; true if ready.
fn wait_fd(fd: RawFd, events: libc::c_short, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// Read and drop whatever the daemon replied; with `wait`, wait a little for a first byte.
/// False once the daemon closed the connection.
fn drain_replies(sock: &mut UnixStream, wait: bool) -> bool {
    if wait && !wait_fd(sock.as_raw_fd(), libc::POLLIN, 200) {
        return true;
    }
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// A socket path in a directory of its own for every execution, made by `mkdtemp`: persistent
/// mode runs many executions in one process, and parallel fuzzers run in PID namespaces of
/// their own (`fuzz.sh`), where PIDs repeat. A name built from the PID and a counter collided
/// there: one instance's clean-up removed another's socket (the crash of 2026-12-07).
fn socket_path() -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let dir = std::env::temp_dir().join("vrdma-fuzz-vu-XXXXXX");
    let mut template = dir.as_os_str().as_bytes().to_vec();
    template.push(0);
    // SAFETY: `template` is a writable NUL-terminated path ending in XXXXXX; mkdtemp replaces
    // those six bytes in place and writes nothing else.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    assert!(
        !made.is_null(),
        "mkdtemp: {}",
        std::io::Error::last_os_error()
    );
    template.pop();
    PathBuf::from(std::ffi::OsString::from_vec(template)).join("vrdma.sock")
}

/// The configuration of the device the daemon serves: the default with ODP offered.
pub fn device_config() -> DeviceConfig {
    let mut cfg = DeviceConfig {
        mac: [0x52, 0x54, 0x00, 0x00, 0x00, 0x01],
        ..DeviceConfig::default()
    };
    cfg.odp.enabled = true;
    cfg.odp.implicit = true;
    cfg
}

fn parts() -> ServeParts<Device> {
    let cfg = device_config();
    let bytes = cfg.config_space();
    let mut config = [0u8; CONFIG_SIZE];
    let n = bytes.len().min(CONFIG_SIZE);
    config[..n].copy_from_slice(&bytes[..n]);
    let device_features = cfg.odp_feature_bits();
    let out = Arc::new(VirtqOutput::new(256));
    let mut dev = Device::new(cfg, GuestMem::empty(), out.clone());
    dev.flush_hook = Some(transport::flush);
    ServeParts {
        device: Arc::new(HandoffLock::new(dev)),
        out,
        doorbells: Arc::new(NullSink),
        eth_tx: Arc::new(NullSink),
        config,
        device_features,
        mtu: 1500,
        accept_failures: Default::default(),
    }
}

/// One message's bytes: header (request, flags, size) and payload.
pub fn message(request: u8, need_reply: bool, payload: &[u8]) -> Vec<u8> {
    let flags = 1u32 | if need_reply { 8 } else { 0 };
    let mut m = Vec::with_capacity(12 + payload.len());
    m.extend_from_slice(&u32::from(request).to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    m.extend_from_slice(payload);
    m
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

pub fn run(data: &[u8]) {
    let path = socket_path();
    let mut listener = listen(&path).expect("listen");
    let parts = parts();
    let daemon = std::thread::spawn(move || {
        serve(&mut listener, &parts, Some(1)).expect("serve");
    });
    let mut sock = UnixStream::connect(&path).expect("connect");
    sock.set_nonblocking(true).expect("nonblocking");
    let guest = memfd(GUEST_BYTES);
    // The eventfds the daemon was last given per queue (to kick), and the readers that take
    // what a save writes into its pipe (as QEMU does) until the daemon closes it.
    let mut kicks: HashMap<u64, File> = HashMap::new();
    let mut save_pipes = Vec::new();
    let mut inp = Input::new(data);
    for _ in 0..MAX_RECORDS {
        if inp.is_empty() {
            break;
        }
        let kind = inp.u8();
        let flags = inp.u8();
        let len = usize::from(inp.u16());
        let payload = inp.bytes(len).to_vec();
        if kind >= WRITE_GUEST {
            let off = u64::from(u32_at(&payload, 0)) % GUEST_BYTES;
            let bytes = payload.get(4..).unwrap_or_default();
            let room = (GUEST_BYTES - off) as usize;
            let _ = guest.write_all_at(&bytes[..bytes.len().min(room)], off);
            continue;
        }
        if kind >= KICK {
            if let Some(k) = kicks.get(&u64::from(kind & 7)) {
                let _ = (&*k).write(&1u64.to_ne_bytes());
            }
            continue;
        }
        let request = kind % 48;
        // The descriptors this message carries; dropped (closed on our side) after sending.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut body = payload.clone();
        match request {
            SET_MEM_TABLE => {
                let n = u32_at(&payload, 0).min(8);
                for _ in 0..n {
                    fds.push(guest.try_clone().expect("dup").into());
                }
            }
            ADD_MEM_REG | SET_LOG_BASE | SET_LOG_FD => {
                fds.push(guest.try_clone().expect("dup").into());
            }
            SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => {
                let v = u64_at(&payload, 0);
                if v & VRING_NOFD == 0 {
                    let e = eventfd();
                    if request == SET_VRING_KICK {
                        kicks.insert(v & 0xff, e.try_clone().expect("dup"));
                    }
                    fds.push(e.into());
                }
            }
            SET_DEVICE_STATE_FD => {
                let (r, mut w) = pipe();
                if u32_at(&payload, 0) == 1 {
                    let state = payload.get(8..).unwrap_or_default();
                    let _ = w.write_all(&state[..state.len().min(MAX_PIPE_BYTES)]);
                    drop(w);
                    fds.push(r.into());
                } else {
                    save_pipes.push(std::thread::spawn(move || {
                        let mut r = r;
                        let _ = std::io::copy(&mut r, &mut std::io::sink());
                    }));
                    fds.push(w.into());
                }
                body.truncate(8);
            }
            _ => {}
        }
        let mut msg = message(request, flags & 1 != 0, &body);
        if flags & 2 != 0 {
            let lie = (body.len() as u32) ^ 0x40;
            msg[8..12].copy_from_slice(&lie.to_le_bytes());
        }
        if crate::trace() {
            eprintln!(
                "vhost_user: request {request}, {} payload bytes, {} fds",
                body.len(),
                fds.len()
            );
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        if !send_with_fds(&sock, &msg, &raw) {
            break;
        }
        drop(fds);
        let wait = flags & 1 != 0 || REPLYING.contains(&request);
        if !drain_replies(&mut sock, wait) {
            break;
        }
    }
    if crate::trace() {
        // The control queue of the seeds sits at GPA 0x10000: its used index and the first
        // response's status.
        let (mut used, mut status) = ([0u8; 2], [0u8; 4]);
        let _ = guest.read_exact_at(&mut used, 0x12002);
        let _ = guest.read_exact_at(&mut status, 0x81000);
        eprintln!(
            "vhost_user: control queue used index {}, first response status {}",
            u16::from_le_bytes(used),
            u32::from_le_bytes(status)
        );
    }
    // Hang up; the daemon must end the connection and stop its threads (the hang limit of
    // the fuzzer catches one that does not).
    let _ = sock.shutdown(std::net::Shutdown::Both);
    drop(sock);
    daemon.join().expect("the daemon thread");
    for r in save_pipes {
        r.join().expect("a save pipe's reader");
    }
    let _ = std::fs::remove_dir_all(path.parent().expect("socket dir"));
}

/// Seeds: sessions as QEMU plays them (see [`seeds::all`]).
pub mod seeds {
    use std::sync::Arc;

    use vrdma_backend::device::Device;
    use vrdma_backend::guest::GuestMem;
    use vrdma_backend::vhost_user::{VirtqOutput, VIRTIO_RDMA_F_ETH};
    use vrdma_spec::*;

    use super::*;

    /// Where the frontend has guest RAM mapped (what SET_VRING_ADDR's addresses are in).
    const UVA: u64 = 0x7f00_0000_0000;
    const RING: u16 = 64;
    const CMD_AT: u64 = 0x8_0000;
    const RESP_AT: u64 = 0x8_1000;

    fn record(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut r = vec![kind, flags];
        r.extend_from_slice(&(payload.len() as u16).to_le_bytes());
        r.extend_from_slice(payload);
        r
    }

    fn words(ws: &[u64], widths: &[usize]) -> Vec<u8> {
        let mut b = Vec::new();
        for (w, &n) in ws.iter().zip(widths) {
            b.extend_from_slice(&w.to_le_bytes()[..n]);
        }
        b
    }

    fn write_guest(gpa: u64, bytes: &[u8]) -> Vec<u8> {
        let mut p = (gpa as u32).to_le_bytes().to_vec();
        p.extend_from_slice(bytes);
        record(WRITE_GUEST, 0, &p)
    }

    fn ring_base(q: u16) -> u64 {
        0x10000 * (u64::from(q) + 1)
    }

    /// Feature negotiation as QEMU does it; `log_all` acks VHOST_F_LOG_ALL (a migration).
    fn handshake(log_all: bool) -> Vec<Vec<u8>> {
        let pf: u64 = 1 | 1 << 1 | 1 << 3 | 1 << 9 | 1 << 13 | 1 << 15 | 1 << 19;
        let mut features: u64 = 1 << 32 | 1 << 30 | 1 << 28 | VIRTIO_RDMA_F_ETH;
        if log_all {
            features |= 1 << 26;
        }
        let mut get_config = words(&[0, 256, 0], &[4, 4, 4]);
        get_config.resize(12 + 256, 0);
        vec![
            record(GET_FEATURES, 0, &[]),
            record(GET_PROTOCOL_FEATURES, 0, &[]),
            record(SET_PROTOCOL_FEATURES, 0, &pf.to_le_bytes()),
            record(SET_OWNER, 0, &[]),
            record(SET_FEATURES, 1, &features.to_le_bytes()),
            record(GET_QUEUE_NUM, 0, &[]),
            record(GET_CONFIG, 0, &get_config),
        ]
    }

    /// One region: all of guest RAM at GPA 0.
    fn mem_table() -> Vec<u8> {
        let region = words(&[0, GUEST_BYTES, UVA, 0], &[8; 4]);
        let mut p = words(&[1, 0], &[4, 4]);
        p.extend_from_slice(&region);
        record(SET_MEM_TABLE, 1, &p)
    }

    /// Every queue set up and enabled, as vhost_virtqueue_start does.
    fn rings() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for q in 0..6u16 {
            let b = ring_base(q);
            let qi = u64::from(q);
            out.push(record(
                SET_VRING_NUM,
                0,
                &words(&[qi, u64::from(RING)], &[4, 4]),
            ));
            let addr = words(
                &[qi, 0, UVA + b, UVA + b + 0x2000, UVA + b + 0x1000, 0],
                &[4, 4, 8, 8, 8, 8],
            );
            out.push(record(SET_VRING_ADDR, 0, &addr));
            out.push(record(SET_VRING_BASE, 0, &words(&[qi, 0], &[4, 4])));
            out.push(record(SET_VRING_CALL, 0, &qi.to_le_bytes()));
            out.push(record(SET_VRING_KICK, 0, &qi.to_le_bytes()));
            out.push(record(SET_VRING_ENABLE, 1, &words(&[qi, 1], &[4, 4])));
        }
        out
    }

    /// A CREATE_PD command on the control queue, kicked.
    fn command() -> Vec<Vec<u8>> {
        let mut cmd = words(&[u64::from(VRDMA_CMD_CREATE_PD), 0, 0], &[2, 2, 4]);
        cmd.extend_from_slice(&[0; 8]);
        let desc = |addr: u64, len: u32, flags: u16, next: u16| {
            words(
                &[addr, u64::from(len), u64::from(flags), u64::from(next)],
                &[8, 4, 2, 2],
            )
        };
        let mut table = desc(CMD_AT, cmd.len() as u32, 1, 1);
        table.extend_from_slice(&desc(RESP_AT, 64, 2, 0));
        let b = ring_base(0);
        vec![
            write_guest(CMD_AT, &cmd),
            write_guest(b, &table),
            write_guest(b + 0x1000, &words(&[0, 1, 0], &[2, 2, 2])),
            record(KICK, 0, &[]),
            // Round trips: the queue's worker takes the chain meanwhile.
            record(GET_QUEUE_NUM, 0, &[]),
            record(GET_QUEUE_NUM, 0, &[]),
        ]
    }

    fn stop_all() -> Vec<Vec<u8>> {
        (0..6u64)
            .map(|q| record(GET_VRING_BASE, 0, &words(&[q, 0], &[4, 4])))
            .collect()
    }

    /// The state a destination loads: the served device's, with a PD.
    fn state() -> Vec<u8> {
        let out = Arc::new(VirtqOutput::new(16));
        let mut dev = Device::new(device_config(), GuestMem::empty(), out);
        let mut resp = Vec::new();
        let _ = dev.handle_command(VRDMA_CMD_CREATE_PD, &[0; 8], &mut resp);
        vrdma_backend::device::snapshot::save(&dev).expect("save")
    }

    pub fn all() -> Vec<(String, Vec<u8>)> {
        let session = [
            handshake(false),
            vec![mem_table()],
            rings(),
            command(),
            stop_all(),
        ];
        let mut save = words(&[0, 0], &[4, 4]);
        let migrate_out = [
            handshake(true),
            vec![mem_table()],
            rings(),
            command(),
            stop_all(),
            vec![
                record(SET_DEVICE_STATE_FD, 0, &save),
                record(CHECK_DEVICE_STATE, 0, &[]),
            ],
        ];
        save[0] = 1;
        let mut load = save.clone();
        load.extend_from_slice(&state());
        let migrate_in = [
            handshake(false),
            vec![
                mem_table(),
                record(SET_DEVICE_STATE_FD, 0, &load),
                record(CHECK_DEVICE_STATE, 0, &[]),
            ],
            rings(),
            command(),
        ];
        let region = |offset: u64, size: u64| {
            let mut p = vec![0u8; 8];
            p.extend_from_slice(&words(&[0x20_0000, size, UVA + 0x20_0000, offset], &[8; 4]));
            p
        };
        let mut beyond = words(&[1, 0], &[4, 4]);
        beyond.extend_from_slice(&words(&[0, GUEST_BYTES, UVA, GUEST_BYTES / 2], &[8; 4]));
        let slots = [
            handshake(false),
            vec![
                record(GET_MAX_MEM_SLOTS, 0, &[]),
                record(ADD_MEM_REG, 1, &region(0, GUEST_BYTES / 2)),
                record(REM_MEM_REG, 1, &region(0, GUEST_BYTES / 2)),
                record(ADD_MEM_REG, 1, &region(GUEST_BYTES / 2, GUEST_BYTES)),
                record(SET_MEM_TABLE, 1, &beyond),
                record(SET_VRING_KICK, 0, &(0x100u64).to_le_bytes()),
                record(SET_LOG_BASE, 1, &words(&[GUEST_BYTES / 32, 0], &[8, 8])),
            ],
        ];
        vec![
            ("session".to_string(), session.concat().concat()),
            ("migrate_out".to_string(), migrate_out.concat().concat()),
            ("migrate_in".to_string(), migrate_in.concat().concat()),
            ("mem_slots".to_string(), slots.concat().concat()),
        ]
    }
}
