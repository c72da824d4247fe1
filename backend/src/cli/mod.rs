//! Command line of `vrdma-backend`: clap-derive [`Args`] -> validated [`Config`] (`TryFrom`),
//! which `main.rs` hands to [`crate::vhost_user::start_backend`].
//!
//! Every option is documented in `--help`; the test-only `--impair` option says so there.

pub mod access;
pub mod delay;
pub mod device_spec;
mod host_memory;
pub mod uplink_nets;

use std::path::{Path, PathBuf};

use clap::Parser;
use thiserror::Error;

use crate::fabric::UplinkNets;
use crate::memory::OdpConfig;
use crate::tables::config::guid_from_mac;
use crate::tables::DeviceConfig;
use crate::uplink::{ImpairConfig, UplinkSpec};
use delay::DelaySpec;
pub use device_spec::{DeviceSpec, FabricPortConfig};
use host_memory::host_memory_bounds;
use vrdma_spec::{VRDMA_ODP_CHUNK_SHIFT_MAX, VRDMA_ODP_CHUNK_SHIFT_MIN};

/// Default QP limit (DESIGN.md: max QPs >= 16384, not bound by virtqueues).
pub const DEFAULT_MAX_QP: u32 = 16384;
/// Default CQ limit.
pub const DEFAULT_MAX_CQ: u32 = 16384;
/// Default MR limit (MR key index has 24 bits, §12.1).
pub const DEFAULT_MAX_MR: u32 = 65536;
/// Default PD limit.
pub const DEFAULT_MAX_PD: u32 = 16384;
/// Default SRQ limit.
pub const DEFAULT_MAX_SRQ: u32 = 4096;
/// Default AH limit.
pub const DEFAULT_MAX_AH: u32 = 65536;
/// Default ODP chunk: 1 << 21 = 2 MiB (§10).
pub const DEFAULT_ODP_CHUNK_SHIFT: u32 = 21;
/// Default budget of resident ODP chunks (4 GiB of 2 MiB chunks).
pub const DEFAULT_ODP_RESIDENT_CHUNKS: u32 = 2048;
/// `--poll-us` above this is taken as this (10 ms: the back-off halves from there).
pub const MAX_POLL_US: u64 = 10_000;
/// Smallest `--max-host-memory` accepted (a device needs a few hundred KiB for a handful of QPs).
pub const MIN_HOST_MEMORY: u64 = 1 << 20;
/// Default Ethernet (IP) MTU.
pub const DEFAULT_MTU: u16 = 1500;
/// Smallest accepted MTU (IPv4 minimum datagram).
pub const MIN_MTU: u16 = 576;
/// Largest accepted MTU (jumbo frames).
pub const MAX_MTU: u16 = 9000;

/// Errors found while turning the command line into a [`Config`]. Each one is printed as a
/// single line by `main.rs`, which then exits non-zero.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CliError {
    #[error("invalid --mac {0:?}: expected six hex octets like 52:54:00:12:34:56")]
    BadMac(String),
    #[error("invalid --mac {0}: must be a unicast address (lowest bit of the first octet clear)")]
    MulticastMac(String),
    #[error("invalid --mac {0}: the all-zero address is not usable")]
    ZeroMac(String),
    #[error("invalid --socket-path {path}: {reason}")]
    BadSocketPath { path: String, reason: String },
    #[error("invalid --uplink {spec:?}: {reason}")]
    BadUplink { spec: String, reason: String },
    #[error("invalid --mtu {0}: must be between {MIN_MTU} and {MAX_MTU}")]
    BadMtu(u16),
    #[error("invalid --{name} {value}: must be between 1 and {max}")]
    BadLimit {
        name: &'static str,
        value: u32,
        max: u32,
    },
    #[error("invalid --odp-chunk-shift {0}: must be between 12 (4 KiB) and 30 (1 GiB)")]
    BadChunkShift(u32),
    #[error("invalid --odp-resident-chunks {0}: must be at least 1")]
    BadResidentChunks(u32),
    #[error(
        "invalid host-memory bound {0:?} (--max-host-memory, --max-host-memory-per-device, \
         max-host-memory=): expected a byte count of at least 1M, e.g. 512M or 2G"
    )]
    BadHostMemory(String),
    #[error("invalid --impair {spec:?}: {reason}")]
    BadImpair { spec: String, reason: String },
    #[error("invalid --device {spec:?}: {reason}")]
    BadDevice { spec: String, reason: String },
    #[error("more than one --uplink needs the fabric: describe the devices with --device")]
    UplinksNeedFabric,
    #[error("--forward-between-uplinks needs the fabric: describe the devices with --device")]
    BetweenUplinksNeedFabric,
    #[error("--shared-engine and --shared-engine-threads need the fabric: describe the devices with --device")]
    SharedEngineNeedsFabric,
    #[error("an uplink's net= or vlans= needs the fabric: describe the devices with --device")]
    NetworksNeedFabric,
    #[error("this command line describes devices on a fabric, not one device")]
    NotSingleDevice,
    #[error("invalid --delay-commands {spec:?}: {reason}")]
    BadDelayCommands { spec: String, reason: String },
}

/// vhost-user back end of the vrdma virtual RDMA (RoCEv2) device, virtio ID 42.
///
/// Listens on a unix socket for QEMU's vhost-user-rdma-pci device, serves one QEMU connection at
/// a time and keeps listening for the next one after a disconnect (each connection starts with a
/// freshly reset device). RoCEv2 traffic goes out on the uplink. Logging honours RUST_LOG
/// (default "info"). SIGINT/SIGTERM stop the daemon cleanly with exit status 0.
///
/// The daemon serves host-side counters (Prometheus text format) on the unix socket
/// `<socket-path>.stats`; `vrdma-backend stats --socket <socket-path>` prints them (see
/// `vrdma-backend stats --help`).
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "vrdma-backend", version, about, long_about)]
pub struct Args {
    /// Unix socket to listen on for the vhost-user connection (created; a stale socket there is
    /// replaced, any other kind of file is an error).
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "device",
        conflicts_with = "device"
    )]
    pub socket_path: Option<PathBuf>,

    /// MAC address of the device's Ethernet port, e.g. 52:54:00:12:34:56 (unicast, not zero).
    #[arg(
        long,
        value_name = "MAC",
        required_unless_present = "device",
        conflicts_with = "device"
    )]
    pub mac: Option<String>,

    /// Serve a device on the daemon's fabric: `socket=PATH,mac=MAC[,net=N][,ip=ADDR]...
    /// [,max-host-memory=BYTES][,owner=UID][,group=GID][,mode=MODE]` (its vhost-user socket, port MAC and, optionally, its own
    /// host-memory bound instead of --max-host-memory-per-device). Repeat for more devices; they share an in-process
    /// Ethernet switch, to which every --uplink is connected as another port (instead of
    /// --socket-path and --mac). `ip=` (repeatable, IPv4 or IPv6) turns on port security: the
    /// device may then send only from its MAC, these addresses and the link-local address of
    /// its MAC (ARP, IP, neighbour discovery, RoCE source GID; no VLAN tags). Without `ip=`
    /// only the source MAC is checked: the device can claim any IP address on its network.
    /// `owner=UID`, `group=GID`, `mode=MODE` set this device's sockets apart from the
    /// --socket-owner/--socket-group/--socket-mode of the others.
    #[arg(long, value_name = "SPEC")]
    pub device: Vec<String>,

    /// Uplink carrying the Ethernet frames: `udp:local=ADDR:PORT,remote=ADDR:PORT` (frames
    /// tunnelled in UDP datagrams, like QEMU's -netdev dgram; datagrams from any other source
    /// than the remote are dropped) or `tap:NAME` (a TAP interface). With --device, append
    /// `,net=N` (the uplink carries tenant network N untagged; default 0) or `,vlans=N1+N2`
    /// (networks N1, N2 as 802.1Q VLANs N1, N2; untagged or other frames dropped).
    /// Without it frames sent by the guest are dropped and nothing is received (on a fabric:
    /// only the daemon's devices are reachable). Repeatable with --device (each uplink is a
    /// port of the fabric).
    #[arg(long, value_name = "SPEC")]
    pub uplink: Vec<String>,

    /// With --device and two or more uplinks: let a frame that came in on one uplink leave
    /// through another (the daemon then bridges the networks its uplinks reach). Off by
    /// default: frames from an uplink go to the daemon's devices only (spec §16.3).
    #[arg(long)]
    pub forward_between_uplinks: bool,

    /// With --device (the default there, named for clarity): the devices share engine
    /// threads (one per --engine-threads index in each of --shared-engine-threads sets)
    /// instead of each having its own. A frame between two devices of one thread is then
    /// handled by that thread's next pass without a wake-up, and the daemon runs as many
    /// engine threads as the host has CPUs, however many guests it serves.
    #[arg(long, conflicts_with = "own_engine_threads")]
    pub shared_engine: bool,

    /// With --device: how many sets of shared engine threads the devices are placed over
    /// (1-64; default: the CPUs the daemon may run on). The devices of one tenant network
    /// (`net=`) share a set up to max(2, devices / sets); each new network, and each further
    /// run of a large one, goes to the set with the fewest devices.
    #[arg(long, value_name = "N", conflicts_with = "own_engine_threads",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shared_engine_threads: Option<u16>,

    /// With --device: give each device engine threads of its own (--engine-threads of them)
    /// instead of sharing them. A device then never waits for another's round, at the cost of
    /// a thread per device and worker, and a wake-up for every frame between devices.
    #[arg(long)]
    pub own_engine_threads: bool,

    /// Ethernet MTU (IP MTU) of the port; the RoCE path MTU follows from it.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MTU)]
    pub mtu: u16,

    /// Maximum number of queue pairs.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_QP)]
    pub max_qp: u32,

    /// Maximum number of completion queues.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CQ)]
    pub max_cq: u32,

    /// Maximum number of memory regions.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_MR)]
    pub max_mr: u32,

    /// Maximum number of protection domains.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PD)]
    pub max_pd: u32,

    /// Maximum number of shared receive queues.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SRQ)]
    pub max_srq: u32,

    /// Maximum number of address handles.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_AH)]
    pub max_ah: u32,

    /// log2 of the on-demand-paging chunk size (12..=30; 21 = 2 MiB).
    #[arg(long, value_name = "SHIFT", default_value_t = DEFAULT_ODP_CHUNK_SHIFT)]
    pub odp_chunk_shift: u32,

    /// Budget of resident ODP chunks; beyond it the least recently used chunks are reclaimed.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ODP_RESIDENT_CHUNKS)]
    pub odp_resident_chunks: u32,

    /// Host memory the whole daemon may use for what guests and frontends decide: every
    /// device's guest-controlled state (MR page lists, cached WQEs, ODP chunk tables,
    /// QP/CQ/SRQ state, control commands in progress), the fabric's receive queues (16 MiB per
    /// device), the --pcap capture queue and migration state being loaded; in bytes with an
    /// optional K/M/G suffix. Beyond it commands fail with NO_RESOURCES, WQE fetches wait,
    /// incoming requests are RNR-NAKed and a state load fails (spec §16.1). Default: the sum of
    /// the devices' bounds plus their receive queues and the capture queue, so every device can
    /// reach its own bound. With one device (--socket-path) it is that device's bound too, as
    /// before.
    #[arg(long, value_name = "BYTES")]
    pub max_host_memory: Option<String>,

    /// Host memory each device may use (its share of --max-host-memory; a device's own
    /// `--device ...,max-host-memory=BYTES` overrides it). Default 1G, at most
    /// --max-host-memory.
    #[arg(long, value_name = "BYTES")]
    pub max_host_memory_per_device: Option<String>,

    /// Do not offer on-demand paging (VIRTIO_RDMA_F_ODP / _ODP_IMPLICIT are not advertised).
    #[arg(long)]
    pub no_odp: bool,

    /// TEST ONLY: impair the uplink, `drop=F,dup=F,reorder=F,seed=N` (F = probability 0..1
    /// per frame, N = PRNG seed; every key optional).
    #[arg(long, value_name = "SPEC")]
    pub impair: Option<String>,

    /// TEST ONLY: execute the named control commands at once but return their responses late,
    /// `OPCODE=MS[:MS...],...` (OPCODE: a command name without VRDMA_CMD_, e.g. resize_cq, or
    /// its number). The n-th command of an opcode (from 0) is answered after MS[n mod count]
    /// milliseconds, 0 = at once. Makes the driver's command timeout fire after the command took
    /// effect, or two commands complete in the opposite order of their execution.
    #[arg(long, value_name = "SPEC")]
    pub delay_commands: Option<String>,

    /// Append log lines to this file instead of standard error.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,

    /// Capture every frame the port sends to and receives from the uplink (RoCEv2 and the
    /// guest's other Ethernet traffic) into this pcap file (Ethernet link type, microsecond
    /// timestamps; created with mode 0600, and FILE must not exist: an existing file or symlink
    /// is refused, never overwritten). Read it with `tshark -r FILE` (RoCEv2 is UDP port 4791).
    /// Frames between two QPs of this device stay inside the daemon and are not captured. With
    /// --device, every frame the fabric switches (between its devices and uplinks) is
    /// captured once, as it enters the fabric.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,

    /// Stop capturing before the --pcap file would grow beyond this many bytes (default 1 GiB).
    #[arg(long, value_name = "BYTES", requires = "pcap")]
    pub pcap_max_bytes: Option<u64>,

    /// Busy-poll: after a batch an engine whose uplink is an in-process fabric port spins for
    /// up to this many microseconds for its next doorbell or frame before it sleeps (yielding
    /// the CPU between checks; the window shrinks to nothing while the device is idle, so an
    /// idle engine never spins). 0 never spins. UDP and TAP uplinks are never polled.
    #[arg(long, value_name = "US", default_value_t = crate::transport::engine::DEFAULT_POLL_US)]
    pub poll_us: u64,

    /// Engine worker threads per device (1-16): each QP belongs to one worker, which runs its
    /// doorbells, frames and timers. Workers of a device run at the same time (each QP, CQ and
    /// the MR table under its own lock), so more of them help on a host with cores to spare.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=crate::transport::workers::MAX_WORKERS as i64))]
    pub engine_threads: u16,

    /// One copy between all the fabric's guests (spec §16.2 rule 6): an RC WRITE's payload
    /// stays in the sending guest's memory and the receiving engine copies it from there,
    /// behind a DMA fence. By default only between the devices of one set of shared engine
    /// threads, whose threads did both copies (there it measured faster), and for packets of
    /// 2 KiB or more; between engines on different threads it measured slower than copying
    /// twice on a 2-core host (the receiving engine then does all the memory traffic while the
    /// sender's idles).
    #[arg(long)]
    pub payload_refs: bool,

    /// Sockets: owner, group, mode; the operator's stats socket (spec §16.5).
    #[command(flatten)]
    pub access: access::AccessArgs,
}

/// `vrdma-backend stats --socket PATH`: print the host-side counters (Prometheus text format) of
/// the daemon listening on the vhost-user socket PATH (read from `PATH.stats`): port frames and
/// bytes, drops by reason, live objects, ODP faults, and per-QP packets, bytes, retransmits, RNR
/// and sequence-error NAKs.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "vrdma-backend stats", version, about, long_about)]
pub struct StatsArgs {
    /// The daemon's --socket-path (or its `.stats` socket).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
}

/// Object limits advertised in `vrdma_config` (§2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_srq: u32,
    pub max_ah: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_qp: DEFAULT_MAX_QP,
            max_cq: DEFAULT_MAX_CQ,
            max_mr: DEFAULT_MAX_MR,
            max_pd: DEFAULT_MAX_PD,
            max_srq: DEFAULT_MAX_SRQ,
            max_ah: DEFAULT_MAX_AH,
        }
    }
}

/// On-demand paging settings (§10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OdpSettings {
    pub enabled: bool,
    pub chunk_shift: u32,
    pub resident_chunks: u32,
}

impl Default for OdpSettings {
    fn default() -> Self {
        OdpSettings {
            enabled: true,
            chunk_shift: DEFAULT_ODP_CHUNK_SHIFT,
            resident_chunks: DEFAULT_ODP_RESIDENT_CHUNKS,
        }
    }
}

/// The validated daemon configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub socket_path: PathBuf,
    pub mac: [u8; 6],
    /// `None`: no uplink, frames from the guest and the engine are dropped.
    pub uplink: Option<UplinkSpec>,
    pub mtu: u16,
    pub limits: Limits,
    pub odp: OdpSettings,
    /// This device's host-memory bound in bytes (spec §16.1; `DaemonConfig::max_host_memory`
    /// is the daemon's).
    pub max_host_memory: u64,
    pub impair: Option<ImpairConfig>,
    /// TEST ONLY: `--delay-commands`.
    pub delay_commands: Option<DelaySpec>,
    pub log_file: Option<PathBuf>,
    /// `--pcap`: capture file for the uplink's frames.
    pub pcap: Option<PathBuf>,
    /// `--pcap-max-bytes`.
    pub pcap_max_bytes: Option<u64>,
    /// `--poll-us`.
    pub engine: crate::transport::engine::EngineOptions,
    /// `--payload-refs`.
    pub payload_refs: bool,
    /// `--device ...,net=N,ip=ADDR`: the device's fabric port (spec §16.3).
    pub fabric_port: FabricPortConfig,
    /// Owner, group and mode of the device's vhost-user and `.stats` sockets (spec §16.5).
    pub socket_access: access::SocketAccess,
}

impl Config {
    /// A configuration with defaults for everything but the socket and MAC (used by tests).
    pub fn new(socket_path: PathBuf, mac: [u8; 6]) -> Self {
        Config {
            socket_path,
            mac,
            uplink: None,
            mtu: DEFAULT_MTU,
            limits: Limits::default(),
            odp: OdpSettings::default(),
            max_host_memory: crate::budget::DEFAULT_MAX_HOST_MEMORY,
            impair: None,
            delay_commands: None,
            log_file: None,
            pcap: None,
            pcap_max_bytes: None,
            engine: Default::default(),
            payload_refs: false,
            fabric_port: FabricPortConfig::default(),
            socket_access: Default::default(),
        }
    }
}

/// What the daemon serves: one device wired straight to its uplink (`--socket-path`, `--mac`),
/// or devices on an in-process fabric (`--device`, repeatable) with the uplinks as ports.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonConfig {
    /// One configuration per device; every option but the socket and MAC is shared. On a
    /// fabric each device's `uplink` is `None` (the fabric owns the uplinks).
    pub devices: Vec<Config>,
    /// `--max-host-memory`: the daemon's host-memory bound in bytes (spec §16.1).
    pub max_host_memory: u64,
    /// `Some`: the devices share a fabric with these uplinks as ports.
    pub fabric: Option<FabricConfig>,
}

/// The fabric's uplink ports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricConfig {
    pub uplinks: Vec<UplinkSpec>,
    /// The networks of `uplinks[i]` (spec §16.3), same length.
    pub uplink_nets: Vec<UplinkNets>,
    /// `--forward-between-uplinks`.
    pub forward_between_uplinks: bool,
    /// The devices' workers run in one engine group (the default; off with
    /// `--own-engine-threads`).
    pub shared_engine: bool,
    /// `--shared-engine-threads`: the group's slots (`None`: the CPUs the daemon may use).
    pub shared_engine_threads: Option<u16>,
    /// `--stats-socket`: the operator's socket for the fabric-wide counters.
    pub stats_socket: Option<PathBuf>,
}

impl DaemonConfig {
    /// Every vhost-user socket the daemon creates.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.devices.iter().map(|d| d.socket_path.clone()).collect()
    }
}

fn parse_uplink(s: &str) -> Result<UplinkSpec, CliError> {
    let bad = |reason: String| CliError::BadUplink {
        spec: s.to_string(),
        reason,
    };
    let spec = s.parse::<UplinkSpec>().map_err(|e| bad(e.to_string()))?;
    if let UplinkSpec::Udp { local, remote } = &spec {
        if local.is_ipv4() != remote.is_ipv4() {
            return Err(bad(
                "local and remote must be the same address family".to_string()
            ));
        }
    }
    Ok(spec)
}

impl TryFrom<Args> for DaemonConfig {
    type Error = CliError;

    fn try_from(args: Args) -> Result<Self, Self::Error> {
        let mut uplinks = Vec::new();
        let mut uplink_nets = Vec::new();
        for text in &args.uplink {
            let (spec, nets) =
                uplink_nets::split_uplink_nets(text).map_err(|reason| CliError::BadUplink {
                    spec: text.clone(),
                    reason,
                })?;
            uplinks.push(parse_uplink(&spec)?);
            uplink_nets.push(nets);
        }
        let template = shared_options(&args)?;
        if args.device.is_empty() {
            let (bounds, total) = host_memory_bounds(&args, &[None], true)?;
            let mac = parse_mac(args.mac.as_deref().unwrap_or_default())?;
            let socket_path = args.socket_path.clone().unwrap_or_default();
            check_socket_path(&socket_path)?;
            if uplinks.len() > 1 {
                return Err(CliError::UplinksNeedFabric);
            }
            if args.forward_between_uplinks {
                return Err(CliError::BetweenUplinksNeedFabric);
            }
            if args.shared_engine || args.shared_engine_threads.is_some() {
                return Err(CliError::SharedEngineNeedsFabric);
            }
            if uplink_nets.iter().any(|n| *n != UplinkNets::default()) {
                return Err(CliError::NetworksNeedFabric);
            }
            let device = Config {
                socket_path,
                mac,
                uplink: uplinks.pop(),
                max_host_memory: bounds[0],
                ..template
            };
            return Ok(DaemonConfig {
                devices: vec![device],
                max_host_memory: total,
                fabric: None,
            });
        }
        let parsed = args
            .device
            .iter()
            .map(|spec| device_spec::parse_device(spec))
            .collect::<Result<Vec<_>, _>>()?;
        let overrides: Vec<Option<u64>> = parsed.iter().map(|p| p.max_host_memory).collect();
        let (bounds, total) = host_memory_bounds(&args, &overrides, false)?;
        let mut devices: Vec<Config> = Vec::new();
        for ((spec, parsed), max_host_memory) in args.device.iter().zip(parsed).zip(bounds) {
            let DeviceSpec {
                socket: socket_path,
                mac,
                port: fabric_port,
                max_host_memory: _,
                socket_access,
            } = parsed;
            let bad = |reason: &str| CliError::BadDevice {
                spec: spec.clone(),
                reason: reason.to_string(),
            };
            if devices.iter().any(|d| d.socket_path == socket_path) {
                return Err(bad("another --device has this socket"));
            }
            if devices.iter().any(|d| d.mac == mac) {
                return Err(bad("another --device has this MAC"));
            }
            devices.push(Config {
                socket_path,
                mac,
                max_host_memory,
                fabric_port,
                socket_access: template.socket_access.overridden_by(socket_access),
                ..template.clone()
            });
        }
        Ok(DaemonConfig {
            devices,
            max_host_memory: total,
            fabric: Some(FabricConfig {
                uplinks,
                uplink_nets,
                forward_between_uplinks: args.forward_between_uplinks,
                shared_engine: !args.own_engine_threads,
                shared_engine_threads: args.shared_engine_threads,
                stats_socket: args.access.stats_socket.clone(),
            }),
        })
    }
}

impl TryFrom<Args> for Config {
    type Error = CliError;

    /// The one device of a `--socket-path` / `--mac` command line.
    fn try_from(args: Args) -> Result<Self, Self::Error> {
        let mut d = DaemonConfig::try_from(args)?;
        match (d.fabric.is_none(), d.devices.len()) {
            (true, 1) => Ok(d.devices.remove(0)),
            _ => Err(CliError::NotSingleDevice),
        }
    }
}

/// Every option but the socket, MAC and uplink, validated (socket and MAC left empty).
fn shared_options(args: &Args) -> Result<Config, CliError> {
    if !(MIN_MTU..=MAX_MTU).contains(&args.mtu) {
        return Err(CliError::BadMtu(args.mtu));
    }
    let limits = Limits {
        max_qp: check_limit("max-qp", args.max_qp, 1 << 24)?,
        max_cq: check_limit("max-cq", args.max_cq, 1 << 24)?,
        max_mr: check_limit("max-mr", args.max_mr, 1 << 24)?,
        max_pd: check_limit("max-pd", args.max_pd, 1 << 24)?,
        max_srq: check_limit("max-srq", args.max_srq, 1 << 24)?,
        max_ah: check_limit("max-ah", args.max_ah, 1 << 24)?,
    };
    if !(VRDMA_ODP_CHUNK_SHIFT_MIN..=VRDMA_ODP_CHUNK_SHIFT_MAX).contains(&args.odp_chunk_shift) {
        return Err(CliError::BadChunkShift(args.odp_chunk_shift));
    }
    if args.odp_resident_chunks == 0 {
        return Err(CliError::BadResidentChunks(0));
    }
    let impair = args
        .impair
        .as_deref()
        .map(|s| {
            s.parse::<ImpairConfig>().map_err(|e| CliError::BadImpair {
                spec: s.to_string(),
                reason: e.to_string(),
            })
        })
        .transpose()?;
    let delay_commands = args
        .delay_commands
        .as_deref()
        .map(|s| {
            s.parse::<DelaySpec>()
                .map_err(|e| CliError::BadDelayCommands {
                    spec: s.to_string(),
                    reason: e.to_string(),
                })
        })
        .transpose()?;
    Ok(Config {
        socket_path: PathBuf::new(),
        mac: [0; 6],
        uplink: None,
        mtu: args.mtu,
        limits,
        odp: OdpSettings {
            enabled: !args.no_odp,
            chunk_shift: args.odp_chunk_shift,
            resident_chunks: args.odp_resident_chunks,
        },
        max_host_memory: crate::budget::DEFAULT_MAX_HOST_MEMORY,
        impair,
        delay_commands,
        log_file: args.log_file.clone(),
        pcap: args.pcap.clone(),
        pcap_max_bytes: args.pcap_max_bytes,
        engine: crate::transport::engine::EngineOptions {
            poll: std::time::Duration::from_micros(args.poll_us.min(MAX_POLL_US)),
            threads: usize::from(args.engine_threads),
        },
        payload_refs: args.payload_refs,
        fabric_port: FabricPortConfig::default(),
        socket_access: args.access.access(),
    })
}

fn check_limit(name: &'static str, value: u32, max: u32) -> Result<u32, CliError> {
    if value == 0 || value > max {
        return Err(CliError::BadLimit { name, value, max });
    }
    Ok(value)
}

/// Parse `aa:bb:cc:dd:ee:ff` (also accepts `-` separators). Rejects multicast and all-zero.
pub fn parse_mac(s: &str) -> Result<[u8; 6], CliError> {
    let bad = || CliError::BadMac(s.to_string());
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(parts) {
        if part.len() != 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if mac == [0; 6] {
        return Err(CliError::ZeroMac(s.to_string()));
    }
    if mac[0] & 1 != 0 {
        return Err(CliError::MulticastMac(s.to_string()));
    }
    Ok(mac)
}

/// The socket is created by the daemon: its directory must exist and the path must not name
/// something other than a (stale) socket, which the listener would otherwise delete.
pub fn check_socket_path(path: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::FileTypeExt;
    let bad = |reason: &str| CliError::BadSocketPath {
        path: path.display().to_string(),
        reason: reason.to_string(),
    };
    if path.as_os_str().is_empty() {
        return Err(bad("empty path"));
    }
    // sun_path holds 108 bytes including the terminating NUL.
    if path.as_os_str().len() > 107 {
        return Err(bad("longer than 107 bytes (unix socket path limit)"));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(bad("its directory does not exist"));
    }
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => Ok(()),
        Ok(_) => Err(bad("exists and is not a socket (refusing to replace it)")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bad(&e.to_string())),
    }
}

impl Config {
    /// The device limits and identity from this CLI configuration (here, not in `device/`: the
    /// device does not know the CLI, ARCHITECTURE.md "Layers"). ODP on the CLI enables
    /// both explicit and implicit ODP; `resident_chunks` is the device budget (an MR may use
    /// all of it).
    pub fn device_config(&self) -> DeviceConfig {
        let c = self;
        let d = DeviceConfig::default();
        let resident = (c.odp.resident_chunks as usize).max(2);
        DeviceConfig {
            mac: c.mac,
            mtu: c.mtu,
            node_guid: guid_from_mac(&c.mac),
            max_pd: c.limits.max_pd,
            max_qp: c.limits.max_qp,
            max_cq: c.limits.max_cq,
            max_srq: c.limits.max_srq,
            max_mr: c.limits.max_mr,
            max_ah: c.limits.max_ah,
            max_mw: c.limits.max_mr,
            max_host_memory: c.max_host_memory,
            odp: OdpConfig {
                enabled: c.odp.enabled,
                implicit: c.odp.enabled,
                chunk_shift: c
                    .odp
                    .chunk_shift
                    .clamp(VRDMA_ODP_CHUNK_SHIFT_MIN, VRDMA_ODP_CHUNK_SHIFT_MAX),
                max_resident: resident,
                max_resident_per_mr: resident,
                ..d.odp.clone()
            },
            ..d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_config_maps_limits_and_odp() {
        let mut c = Config::new("/tmp/x.sock".into(), [2, 0, 0, 0, 0, 9]);
        c.mtu = 9000;
        c.limits.max_qp = 100;
        c.odp.enabled = false;
        let d = c.device_config();
        assert_eq!(d.mac, [2, 0, 0, 0, 0, 9]);
        assert_eq!(d.max_qp, 100);
        assert_eq!(d.port_mtu(), 5);
        assert!(!d.odp.enabled && !d.odp.implicit);
        assert_eq!(d.odp_feature_bits(), 0);
        let v = d.to_vrdma_config();
        assert_eq!((v.max_qp, v.mtu, v.odp_general_caps), (100, 9000, 0));
        c.odp.enabled = true;
        c.odp.chunk_shift = 22;
        let d = c.device_config();
        assert_eq!(d.odp_feature_bits(), 0b11);
        assert_eq!(d.to_vrdma_config().odp_chunk_shift, 22);
    }
}
