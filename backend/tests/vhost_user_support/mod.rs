//! Test support: a memfd-backed "guest", a driver-side split virtqueue, and the `vhost` crate's
//! `Frontend` playing QEMU against an in-process `vrdma-backend` daemon.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;
use vrdma_spec::{Abi, VrdmaHandle};

pub type Mem = GuestMemoryMmap<()>;

pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// A memfd of `len` bytes, created the way QEMU's `memory-backend-memfd` (seal=on) makes guest
/// RAM: sealed against shrinking and growing, which the daemon requires (spec §16.5).
pub fn sealed_memfd(len: u64) -> File {
    let file = unsealed_memfd(len);
    // SAFETY: F_ADD_SEALS takes an int of seal bits; the descriptor is open.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    };
    assert_eq!(rc, 0, "F_ADD_SEALS");
    file
}

/// A memfd of `len` bytes that can still be resized (and sealed).
pub fn unsealed_memfd(len: u64) -> File {
    // SAFETY: memfd_create with a valid NUL-terminated name; the returned fd (checked) is
    // owned by the File from here on.
    let file = unsafe {
        let fd = libc::memfd_create(
            c"vrdma-test-guest".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(fd >= 0, "memfd_create failed");
        File::from_raw_fd(fd)
    };
    file.set_len(len).expect("memfd set_len");
    file
}

/// A region that `fe` offers: `size` bytes of `file` at GPA `gpa`, at the frontend address
/// `uva` (never dereferenced by this process).
pub fn region_of(file: &File, gpa: u64, size: u64, uva: u64) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: size,
        userspace_addr: uva,
        mmap_offset: 0,
        mmap_handle: std::os::fd::AsRawFd::as_raw_fd(file),
    }
}

/// Guest RAM: one shared memfd region at GPA `base`, mapped in this process too.
pub struct Guest {
    pub mem: Mem,
    pub base: u64,
    pub size: usize,
    next_free: u64,
}

impl Guest {
    pub fn new(base: u64, size: usize) -> Guest {
        Self::with_file(base, size, sealed_memfd(size as u64))
    }

    /// Guest RAM of `size` bytes at `base`, mapped from `file` (at least `size` bytes long).
    pub fn with_file(base: u64, size: usize, file: File) -> Guest {
        let mem = Mem::from_ranges_with_files([(
            GuestAddress(base),
            size,
            Some(FileOffset::new(file, 0)),
        )])
        .expect("guest memory");
        Guest {
            mem,
            base,
            size,
            next_free: base,
        }
    }

    /// Bump-allocate `len` bytes aligned to `align` (zeroed).
    pub fn alloc(&mut self, len: usize, align: u64) -> u64 {
        let addr = self.next_free.div_ceil(align) * align;
        self.next_free = addr + len as u64;
        assert!(
            self.next_free <= self.base + self.size as u64,
            "test guest out of memory"
        );
        self.mem
            .write_slice(&vec![0u8; len], GuestAddress(addr))
            .expect("zero");
        addr
    }

    pub fn region_info(&self) -> VhostUserMemoryRegionInfo {
        let region = self.mem.iter().next().expect("one region");
        VhostUserMemoryRegionInfo::from_guest_region(region).expect("file-backed region")
    }

    /// The frontend-side virtual address of a GPA (what SET_VRING_ADDR carries).
    pub fn uva(&self, gpa: u64) -> u64 {
        let region = self.mem.iter().next().expect("one region");
        region.as_ptr() as u64 + (gpa - region.start_addr().0)
    }

    pub fn write(&self, gpa: u64, data: &[u8]) {
        self.mem
            .write_slice(data, GuestAddress(gpa))
            .expect("write");
    }

    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(gpa))
            .expect("read");
        v
    }
}

pub const VRING_DESC_F_NEXT: u16 = 1;
pub const VRING_DESC_F_WRITE: u16 = 2;
pub const VRING_DESC_F_INDIRECT: u16 = 4;

/// A buffer of a chain: (GPA, length, device-writable).
pub type Buf = (u64, u32, bool);

/// Driver side of one split virtqueue living in `Guest` memory.
pub struct DriverRing {
    pub index: usize,
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    next_desc: u16,
    avail_idx: u16,
    last_used: u16,
    pub kick: EventFd,
    pub call: EventFd,
}

impl DriverRing {
    pub fn new(guest: &mut Guest, index: usize, size: u16) -> DriverRing {
        let n = usize::from(size);
        let desc = guest.alloc(16 * n, 16);
        let avail = guest.alloc(6 + 2 * n, 2);
        let used = guest.alloc(6 + 8 * n, 4);
        DriverRing {
            index,
            size,
            desc,
            avail,
            used,
            next_desc: 0,
            avail_idx: 0,
            last_used: 0,
            kick: EventFd::new(libc::EFD_NONBLOCK).expect("kick eventfd"),
            call: EventFd::new(libc::EFD_NONBLOCK).expect("call eventfd"),
        }
    }

    /// Give the ring to the backend (QEMU's vhost_virtqueue_start sequence).
    pub fn setup(&self, fe: &Frontend, guest: &Guest) {
        fe.set_vring_num(self.index, self.size)
            .expect("SET_VRING_NUM");
        let cfg = VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: guest.uva(self.desc),
            used_ring_addr: guest.uva(self.used),
            avail_ring_addr: guest.uva(self.avail),
            log_addr: None,
        };
        fe.set_vring_addr(self.index, &cfg).expect("SET_VRING_ADDR");
        fe.set_vring_base(self.index, 0).expect("SET_VRING_BASE");
        fe.set_vring_call(self.index, &self.call)
            .expect("SET_VRING_CALL");
        fe.set_vring_kick(self.index, &self.kick)
            .expect("SET_VRING_KICK");
    }

    fn write_desc(&self, guest: &Guest, table: u64, i: u16, buf: Buf, next: Option<u16>) {
        let mut flags = if buf.2 { VRING_DESC_F_WRITE } else { 0 };
        if next.is_some() {
            flags |= VRING_DESC_F_NEXT;
        }
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&buf.0.to_le_bytes());
        d[8..12].copy_from_slice(&buf.1.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.unwrap_or(0).to_le_bytes());
        guest.write(table + 16 * u64::from(i), &d);
    }

    /// Add a direct chain and make it available; returns its head index.
    pub fn add(&mut self, guest: &Guest, bufs: &[Buf]) -> u16 {
        let head = self.next_desc;
        for (k, buf) in bufs.iter().enumerate() {
            let i = (head + k as u16) % self.size;
            let next = (k + 1 < bufs.len()).then(|| (i + 1) % self.size);
            self.write_desc(guest, self.desc, i, *buf, next);
        }
        self.next_desc = (head + bufs.len().max(1) as u16) % self.size;
        self.publish(guest, head);
        head
    }

    /// Add a chain through one indirect table (allocated in guest memory).
    pub fn add_indirect(&mut self, guest: &mut Guest, bufs: &[Buf]) -> u16 {
        let table = guest.alloc(16 * bufs.len(), 16);
        for (k, buf) in bufs.iter().enumerate() {
            let next = (k + 1 < bufs.len()).then_some(k as u16 + 1);
            self.write_desc(guest, table, k as u16, *buf, next);
        }
        let head = self.next_desc;
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&table.to_le_bytes());
        d[8..12].copy_from_slice(&(16 * bufs.len() as u32).to_le_bytes());
        d[12..14].copy_from_slice(&VRING_DESC_F_INDIRECT.to_le_bytes());
        guest.write(self.desc + 16 * u64::from(head), &d);
        self.next_desc = (head + 1) % self.size;
        self.publish(guest, head);
        head
    }

    /// Write raw descriptors (addr, len, flags, next) at consecutive slots and publish the
    /// first as a chain head, whatever they contain (fuzzing).
    pub fn add_raw(&mut self, guest: &Guest, descs: &[(u64, u32, u16, u16)]) -> u16 {
        let head = self.next_desc;
        for (k, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let i = (head + k as u16) % self.size;
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.to_le_bytes());
            guest.write(self.desc + 16 * u64::from(i), &d);
        }
        self.next_desc = (head + descs.len().max(1) as u16) % self.size;
        self.publish(guest, head);
        head
    }

    fn publish(&mut self, guest: &Guest, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        guest.write(self.avail + 4 + 2 * slot, &head.to_le_bytes());
        fence(Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        guest.write(self.avail + 2, &self.avail_idx.to_le_bytes());
        fence(Ordering::SeqCst);
    }

    pub fn notify(&self) {
        self.kick.write(1).expect("kick");
    }

    /// Next used element (id, len), waiting up to `timeout`.
    pub fn wait_used(&mut self, guest: &Guest, timeout: Duration) -> Option<(u32, u32)> {
        let deadline = Instant::now() + timeout;
        loop {
            fence(Ordering::SeqCst);
            let b = guest.read(self.used + 2, 2);
            let idx = u16::from_le_bytes([b[0], b[1]]);
            if idx != self.last_used {
                let slot = u64::from(self.last_used % self.size);
                let e = guest.read(self.used + 4 + 8 * slot, 8);
                self.last_used = self.last_used.wrapping_add(1);
                return Some((
                    u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                ));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Used elements that arrived so far (no waiting).
    pub fn used_count(&self, guest: &Guest) -> u16 {
        let b = guest.read(self.used + 2, 2);
        u16::from_le_bytes([b[0], b[1]]).wrapping_sub(self.last_used)
    }
}

/// A unique socket path in a fresh temporary directory.
pub fn socket_path(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "vrdma-test-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join("vrdma.sock")
}

/// Connect and negotiate like QEMU: features (with EVENT_IDX unless `no_event_idx`), protocol
/// features MQ + CONFIG + REPLY_ACK, owner. Returns the frontend and the acked features.
pub fn connect(path: &Path, event_idx: bool) -> (Frontend, u64) {
    let (fe, acked, _) = connect_raw(path, event_idx);
    (fe, acked)
}

/// Like [`connect`], also returning a clone of the socket for hand-made messages.
pub fn connect_raw(path: &Path, event_idx: bool) -> (Frontend, u64, UnixStream) {
    connect_with(path, event_idx, VhostUserProtocolFeatures::empty())
}

/// Like [`connect_raw`], also acking the `extra` protocol features.
pub fn connect_with(
    path: &Path,
    event_idx: bool,
    extra: VhostUserProtocolFeatures,
) -> (Frontend, u64, UnixStream) {
    let sock = UnixStream::connect(path).expect("connect");
    let raw = sock.try_clone().expect("clone socket");
    let mut fe = Frontend::from_stream(sock, 6);
    let features = fe.get_features().expect("GET_FEATURES");
    let pf = fe.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
    let want_pf = VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK;
    let want_pf = want_pf | extra;
    assert!(pf.contains(want_pf), "protocol features {pf:?}");
    fe.set_protocol_features(want_pf)
        .expect("SET_PROTOCOL_FEATURES");
    fe.set_owner().expect("SET_OWNER");
    // Like QEMU: VHOST_F_LOG_ALL only while a migration runs (spec §17.1).
    let log_all = vhost::vhost_user::message::VhostUserVirtioFeatures::LOG_ALL.bits();
    let mut acked = features & !VIRTIO_RING_F_EVENT_IDX & !log_all;
    if event_idx {
        acked |= features & VIRTIO_RING_F_EVENT_IDX;
    }
    fe.set_features(acked).expect("SET_FEATURES");
    (fe, acked, raw)
}

/// VHOST_USER_GET_CONFIG by hand (the vhost crate's Frontend waits forever for a payload when
/// the backend rejects a read with a zero-size reply, which QEMU handles). Returns the reply's
/// size field and payload.
pub fn raw_get_config(sock: &mut UnixStream, offset: u32, size: u32) -> (u32, Vec<u8>) {
    const GET_CONFIG: u32 = 24;
    let mut msg = Vec::new();
    for v in [GET_CONFIG, 1, 12 + size, offset, size, 0] {
        msg.extend_from_slice(&v.to_le_bytes());
    }
    msg.resize(msg.len() + size as usize, 0);
    sock.write_all(&msg).expect("send GET_CONFIG");
    let mut hdr = [0u8; 12];
    sock.read_exact(&mut hdr).expect("reply header");
    let word = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    assert_eq!(word(&hdr, 0), GET_CONFIG);
    let mut body = vec![0u8; word(&hdr, 8) as usize];
    sock.read_exact(&mut body).expect("reply body");
    (word(&body, 4), body[12..].to_vec())
}

/// Install `guest` as the memory table and start `rings` (enabled).
pub fn start_rings(fe: &mut Frontend, guest: &Guest, rings: &[&DriverRing]) {
    fe.set_mem_table(&[guest.region_info()])
        .expect("SET_MEM_TABLE");
    for r in rings {
        r.setup(fe, guest);
        fe.set_vring_enable(r.index, true)
            .expect("SET_VRING_ENABLE");
    }
}

/// Driver rings of `size` entries for the virtqueues `queues` in `guest`, started as by
/// `start_rings`.
pub fn start_queues<const N: usize>(
    fe: &mut Frontend,
    guest: &mut Guest,
    queues: [u16; N],
    size: u16,
) -> [DriverRing; N] {
    let rings = queues.map(|q| DriverRing::new(guest, q as usize, size));
    start_rings(fe, guest, &rings.each_ref());
    rings
}

/// Read `len` bytes of config space at `offset`.
pub fn get_config(fe: &mut Frontend, offset: u32, len: usize) -> vhost::Result<Vec<u8>> {
    let buf = vec![0u8; len];
    fe.get_config(offset, len as u32, VhostUserConfigFlags::empty(), &buf)
        .map(|(_, data)| data)
}

/// Serve the daemon `prepared` (the real daemon's parts) for `connections` connections on a
/// thread; its engine stops when they are done.
pub fn serve_on_thread(
    prepared: vrdma_backend::vhost_user::Prepared,
    connections: usize,
) -> JoinHandle<()> {
    let vrdma_backend::vhost_user::Prepared {
        mut listener,
        parts,
        engine,
    } = prepared;
    std::thread::spawn(move || {
        vrdma_backend::vhost_user::serve(&mut listener, &parts, Some(connections)).expect("serve");
        engine.stop();
    })
}

/// Connect to the daemon on `path` (EVENT_IDX as `event_idx`), with a guest of `size` bytes at
/// `base` and the control queue (`qsize` entries) started.
pub fn control_session(
    path: &Path,
    event_idx: bool,
    base: u64,
    size: usize,
    qsize: u16,
) -> (Frontend, Guest, DriverRing) {
    let (mut fe, _) = connect(path, event_idx);
    let mut guest = Guest::new(base, size);
    let [ctrl] = start_queues(&mut fe, &mut guest, [vrdma_spec::VRDMA_VQ_CONTROL], qsize);
    (fe, guest, ctrl)
}

/// A daemon thread serving `connections` connections on `path`.
pub struct DaemonThread {
    pub handle: JoinHandle<()>,
}

/// Build a control command: header + request bytes.
pub fn cmd(opcode: u16, req: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + req.len());
    v.extend_from_slice(&opcode.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(req);
    v
}

/// A control-queue handle request (`VrdmaHandle`) for object `h`.
pub fn handle(h: u32) -> Vec<u8> {
    VrdmaHandle {
        handle: h,
        reserved: 0,
    }
    .as_bytes()
    .to_vec()
}

/// Run one command on the control `ring`: `command` in one readable buffer, a writable
/// response buffer of `resp_len` bytes; the next used chain (within 5 s) must be this one.
/// Returns (used len, response bytes).
pub fn run_command(
    ring: &mut DriverRing,
    guest: &mut Guest,
    command: &[u8],
    resp_len: usize,
) -> (u32, Vec<u8>) {
    let req = guest.alloc(command.len(), 8);
    guest.write(req, command);
    let resp = guest.alloc(resp_len, 8);
    let head = ring.add(
        guest,
        &[
            (req, command.len() as u32, false),
            (resp, resp_len as u32, true),
        ],
    );
    ring.notify();
    let (id, len) = ring
        .wait_used(guest, Duration::from_secs(5))
        .expect("command completed");
    assert_eq!(id, u32::from(head), "another chain completed first");
    (len, guest.read(resp, resp_len))
}

/// Response status of a response buffer.
pub fn status_of(resp: &[u8]) -> u32 {
    u32::from_le_bytes([resp[0], resp[1], resp[2], resp[3]])
}

/// A device model that refuses every command (for tests of the vhost-user side only).
pub struct NoCommands;

impl vrdma_backend::vhost_user::RdmaDevice for NoCommands {
    fn handle_command(
        &mut self,
        _opcode: u16,
        _req: &[u8],
        _resp: &mut Vec<u8>,
    ) -> vrdma_backend::vhost_user::CmdOutcome {
        vrdma_backend::vhost_user::CmdOutcome::Done(vrdma_spec::VRDMA_STATUS_INVALID)
    }
    fn reset(&mut self) {}
    fn set_guest_memory(&mut self, _mem: vrdma_backend::vhost_user::GuestMemoryAtomic) {}
}

/// Serve parts for a device that refuses every command and sinks doorbells and frames: for
/// tests of the vhost-user side only (`out` carries the device's label, if any).
pub fn no_command_parts(
    out: vrdma_backend::vhost_user::VirtqOutput,
) -> vrdma_backend::vhost_user::ServeParts<NoCommands> {
    use vrdma_backend::vhost_user::NullSink;
    vrdma_backend::vhost_user::ServeParts {
        device: std::sync::Arc::new(vrdma_backend::handoff::HandoffLock::new(NoCommands)),
        out: std::sync::Arc::new(out),
        doorbells: std::sync::Arc::new(NullSink),
        eth_tx: std::sync::Arc::new(NullSink),
        config: [0u8; vrdma_backend::vhost_user::CONFIG_SIZE],
        device_features: 0,
        mtu: 1500,
        accept_failures: Default::default(),
    }
}
