//! `start_backend(config)`: build the device, its virtqueue outputs, the uplink and the engine,
//! then run the vhost-user daemon loop until the process is stopped.

use std::path::Path;
use std::sync::Arc;

use log::{info, warn};
use thiserror::Error;
use vhost::vhost_user::Listener;

use super::daemon::{listen_with_access, serve, DaemonError, ServeParts};
use super::delay::CommandDelays;
use super::glue::{NoUplink, UplinkTx};
use super::{VirtqOutput, CONFIG_SIZE};
use crate::budget::{Budget, Charge, OverBudget};
use crate::cli::access::SocketAccess;
use crate::cli::{Config, DaemonConfig};
use crate::device::Device;
use crate::exporter::{device_label, stats_socket_path, ExtraStats, StatsServer};
use crate::fabric::{Bridge, DeviceOptions, Fabric, FabricBuilder, FabricError, PortSecurity};
use crate::guest::GuestMem;
use crate::handoff::HandoffLock;
use crate::stats::Metered;
use crate::transport::engine::{Engine, EngineError, EngineGroup, GroupSlot};
use crate::uplink::{Impaired, PcapError, PcapTee, PcapWriter, Uplink, UplinkError};

/// Errors of daemon start-up (each printed as one line by `main`).
#[derive(Debug, Error)]
pub enum StartError {
    #[error("cannot open uplink {spec}: {source}")]
    Uplink { spec: String, source: UplinkError },
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("config space is {0} bytes, expected {CONFIG_SIZE}")]
    ConfigSpace(usize),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error("--pcap: {0}")]
    Pcap(#[from] PcapError),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("no device to serve")]
    NoDevices,
    #[error("cannot start a device thread: {0}")]
    Thread(std::io::Error),
    #[error(
        "--max-host-memory is too small for the fabric's receive queues ({queues} bytes for \
         {devices} device(s), spec §16.4): {source}"
    )]
    QueuesOverBudget {
        queues: u64,
        devices: usize,
        source: OverBudget,
    },
    #[error("--stats-socket {path}: {source}")]
    Stats {
        path: String,
        source: std::io::Error,
    },
}

/// Open the uplink of `config`: the `--pcap` capture right on the uplink (so it records what is
/// really sent and received; its queue charged to `pool`, the daemon's budget), the test-only
/// impairment in front of it when asked.
pub fn open_uplink(config: &Config, pool: &Budget) -> Result<Arc<dyn Uplink>, StartError> {
    let raw: Box<dyn Uplink> = match &config.uplink {
        Some(spec) => {
            let u = spec
                .open_for_mtu(config.mtu)
                .map_err(|source| StartError::Uplink {
                    spec: spec.to_string(),
                    source,
                })?;
            info!("uplink {spec}");
            u
        }
        None => {
            info!("no --uplink: frames leaving the port are dropped");
            Box::new(NoUplink)
        }
    };
    let uplink: Box<dyn Uplink> = match &config.pcap {
        Some(path) => {
            let w = PcapWriter::create(path, config.pcap_max_bytes)?;
            w.charge_to(pool);
            info!("capturing the uplink's frames to {}", path.display());
            Box::new(PcapTee::new(raw, w))
        }
        None => raw,
    };
    Ok(match config.impair {
        Some(imp) => {
            info!(
                "uplink impaired (test only): drop={} dup={} reorder={} seed={}",
                imp.drop, imp.dup, imp.reorder, imp.seed
            );
            Arc::new(Impaired::new(uplink, imp))
        }
        None => Arc::from(uplink),
    })
}

/// A daemon ready to serve: the bound socket, the per-connection parts and the running engine.
pub struct Prepared {
    pub listener: Listener,
    pub parts: ServeParts<Device>,
    pub engine: Engine,
}

/// Build the device, outputs, uplink and engine for `config` and bind the socket: a daemon of
/// this one device, whose host-memory bound is the device's (spec §16.1).
pub fn prepare(config: &Config) -> Result<Prepared, StartError> {
    prepare_in(config, &Budget::new(config.max_host_memory))
}

/// [`prepare`] for a device of a daemon whose host-memory budget is `pool`.
fn prepare_in(config: &Config, pool: &Budget) -> Result<Prepared, StartError> {
    let uplink = open_uplink(config, pool)?;
    prepare_with_uplink(config, uplink, pool)
}

/// [`prepare`] with the device's port already opened (a fabric port, or a test's uplink); the
/// device's budget is part of `pool`, the daemon's (spec §16.1).
pub fn prepare_with_uplink(
    config: &Config,
    uplink: Arc<dyn Uplink>,
    pool: &Budget,
) -> Result<Prepared, StartError> {
    prepare_in_group(config, uplink, pool, None)
}

/// [`prepare_with_uplink`] with the device's engine workers in `group` if given (a fabric's
/// engine group, the default).
fn prepare_in_group(
    config: &Config,
    uplink: Arc<dyn Uplink>,
    pool: &Budget,
    group: Option<(&EngineGroup, GroupSlot)>,
) -> Result<Prepared, StartError> {
    let mut dev_config = config.device_config();
    dev_config.host_memory_pool = Some(pool.clone());
    let config_bytes = dev_config.config_space();
    let config_space: [u8; CONFIG_SIZE] = config_bytes
        .as_slice()
        .try_into()
        .map_err(|_| StartError::ConfigSpace(config_bytes.len()))?;
    let device_features = dev_config.odp_feature_bits();
    let limits = &config.limits;
    let event_backlog = (limits.max_qp as usize)
        .saturating_add(limits.max_cq as usize)
        .saturating_add(limits.max_srq as usize)
        .saturating_add(64);
    let out = Arc::new(VirtqOutput::with_label(
        event_backlog,
        &device_label(&config.socket_path),
    ));
    if let Some(spec) = &config.delay_commands {
        warn!("control command responses delayed (test only): {spec:?}");
        out.parked().set_delays(CommandDelays::new(spec));
    }
    let device = Arc::new(HandoffLock::new(Device::new(
        dev_config,
        GuestMem::empty(),
        out.clone(),
    )));

    // The socket appears last: launchers start QEMU once it exists, so every other start-up
    // error (uplink bind, TAP open) happens before.
    let port_stats = device.lock().port_stats.clone();
    let uplink: Arc<dyn Uplink> = Arc::new(Metered::new(uplink, port_stats));
    let engine = match group {
        Some((g, slot)) => {
            Engine::start_in(g, slot, device.clone(), uplink.clone(), config.engine)?
        }
        None => Engine::start_with(device.clone(), uplink.clone(), config.engine)?,
    };
    let listener = listen_with_access(&config.socket_path, config.socket_access)?;
    let parts = ServeParts {
        device,
        out,
        doorbells: Arc::new(engine.sender()),
        eth_tx: Arc::new(UplinkTx(uplink)),
        config: config_space,
        device_features,
        mtu: config.mtu,
        accept_failures: Default::default(),
    };
    Ok(Prepared {
        listener,
        parts,
        engine,
    })
}

/// Run the daemon described by `config` until the process is stopped (SIGINT/SIGTERM are
/// handled by `main`). Returns only on a start-up error.
pub fn start_backend(config: Config) -> Result<(), StartError> {
    let pool = Budget::new(config.max_host_memory);
    start_backend_in(config, &pool)
}

fn start_backend_in(config: Config, pool: &Budget) -> Result<(), StartError> {
    let prepared = prepare_in(&config, pool)?;
    run_device(&config, prepared, None)
}

/// Serve one prepared device: its stats socket, then vhost-user connections one after another.
fn run_device(
    config: &Config,
    prepared: Prepared,
    extra_stats: Option<ExtraStats>,
) -> Result<(), StartError> {
    let Prepared {
        mut listener,
        parts,
        engine,
    } = prepared;
    // The counters are for operators: a daemon that cannot offer them still serves the guest
    // (e.g. a --socket-path whose ".stats" sibling passes the 107-byte unix path limit).
    let stats_path = stats_socket_path(&config.socket_path);
    let label = device_label(&config.socket_path);
    let stats = match config.socket_access {
        a if a.is_default() => {
            StatsServer::start_with(&stats_path, parts.device.clone(), label, extra_stats)
        }
        // The counters are as private as the device's socket (spec §16.5).
        a => super::socket_bind::bind_with_access(&stats_path, a)
            .map_err(|source| crate::exporter::StatsError::Listen {
                path: stats_path.display().to_string(),
                source,
            })
            .and_then(|l| {
                StatsServer::start_on(l, &stats_path, parts.device.clone(), label, extra_stats)
            }),
    };
    let stats = match stats {
        Ok(s) => {
            info!("counters on {}", stats_path.display());
            Some(s)
        }
        Err(e) => {
            warn!("no counters socket: {e}");
            None
        }
    };
    info!(
        "listening on {} (mac {}, mtu {}, odp {})",
        config.socket_path.display(),
        mac_string(&config.mac),
        config.mtu,
        if config.odp.enabled { "on" } else { "off" },
    );
    let r = serve(&mut listener, &parts, None);
    drop(stats);
    engine.stop();
    if r.is_err() {
        let _ = std::fs::remove_file(&config.socket_path);
    }
    r.map_err(StartError::from)
}

fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The devices of a fabric daemon, ready to serve, and the fabric's bridge threads.
pub struct PreparedFabric {
    pub fabric: Arc<Fabric>,
    pub devices: Vec<Prepared>,
    pub bridges: Vec<Bridge>,
    /// The daemon's host-memory budget (spec §16.1), every device's budget part of it.
    pub pool: Budget,
    /// The fabric's receive queues' bound, reserved on `pool` for the daemon's life.
    pub queues: Charge,
}

/// Build the fabric of `config` (uplink ports first, so start-up errors come before any socket
/// exists), then every device on it.
pub fn prepare_fabric(config: &DaemonConfig) -> Result<PreparedFabric, StartError> {
    let (Some(fc), Some(first)) = (&config.fabric, config.devices.first()) else {
        return Err(StartError::NoDevices);
    };
    let pool = Budget::new(config.max_host_memory);
    // Each device port's receive queue may hold its bound at any time (spec §16.4): reserved
    // up front, so the queues never need a charge on the frame path.
    let queue_bytes =
        (config.devices.len() as u64).saturating_mul(crate::fabric::rxqueue::RXQ_MAX_BYTES as u64);
    let queues = pool
        .try_charge(queue_bytes)
        .map_err(|source| StartError::QueuesOverBudget {
            queues: queue_bytes,
            devices: config.devices.len(),
            source,
        })?;
    let mut b = FabricBuilder::new();
    b.forward_between_uplinks(fc.forward_between_uplinks);
    for (i, spec) in fc.uplinks.iter().enumerate() {
        let u = spec
            .open_for_mtu(first.mtu)
            .map_err(|source| StartError::Uplink {
                spec: spec.to_string(),
                source,
            })?;
        info!("fabric uplink {spec}");
        let nets = fc.uplink_nets.get(i).cloned().unwrap_or_default();
        let id = b.add_uplink_with(Arc::from(u), nets);
        b.name_port(id, spec.to_string());
    }
    if let Some(path) = &first.pcap {
        let w = PcapWriter::create(path, first.pcap_max_bytes)?;
        w.charge_to(&pool);
        info!("capturing the fabric's frames to {}", path.display());
        b.capture(w);
    }
    let mut ids = Vec::new();
    for d in &config.devices {
        // Spec §16.3: an address list turns on port security.
        let security =
            (!d.fabric_port.ips.is_empty()).then(|| PortSecurity::new(d.mac, &d.fabric_port.ips));
        let net = d.fabric_port.net;
        let id = b.add_device_with(d.mac, DeviceOptions { security, net })?;
        b.name_port(id, device_label(&d.socket_path));
        ids.push(id);
    }
    let fabric = b.build();
    // The group lives as long as an engine in it (each holds it).
    let group = fc.shared_engine.then(|| {
        let slots = fc
            .shared_engine_threads
            .map_or_else(EngineGroup::default_slots, usize::from);
        EngineGroup::new(first.engine.poll, slots)
    });
    // The devices of one network can only talk among themselves: one slot's threads, for a
    // fair share of the slots at a time (`EngineGroup::plan`).
    let nets: Vec<u64> = config
        .devices
        .iter()
        .map(|d| u64::from(d.fabric_port.net))
        .collect();
    let mut slots = group.as_ref().map(|g| g.plan(&nets).into_iter());
    match &group {
        Some(g) => info!(
            "engine threads shared by the devices: {} set(s) (--shared-engine-threads), a \
             tenant network's devices together as far as they go; --own-engine-threads for a \
             thread per device",
            g.slots()
        ),
        None => info!("engine threads of each device's own (--own-engine-threads)"),
    }
    let mut devices = Vec::new();
    for (d, id) in config.devices.iter().zip(ids) {
        let port = fabric.device_port(id)?;
        let placed = group.as_ref().zip(slots.as_mut().and_then(Iterator::next));
        let port: Arc<dyn Uplink> = match (d.impair, placed) {
            // The impairment works on single frames: no segments for that port (§16.2).
            (Some(imp), _) => Arc::new(Impaired::new(port, imp)),
            (None, _) if d.payload_refs => Arc::new(port.with_segments().with_payload_refs()),
            // In a group: one copy between the devices of a slot (spec §16.2 rule 6).
            (None, Some((_, slot))) => {
                Arc::new(port.with_segments().with_payload_refs_on_slot(slot.index()))
            }
            (None, None) => Arc::new(port.with_segments()),
        };
        devices.push(prepare_in_group(d, port, &pool, placed)?);
    }
    let bridges = fabric.start_bridges()?;
    Ok(PreparedFabric {
        fabric,
        devices,
        bridges,
        pool,
        queues,
    })
}

/// Run the daemon of `config`: one device on its own uplink, or every device on the fabric,
/// each served by its own thread. Returns on a start-up error; a device's accept loop never
/// ends on an error (it logs and retries, spec §16.5).
pub fn start_daemon(config: DaemonConfig) -> Result<(), StartError> {
    super::fd_limit::prepare_for(config.devices.len());
    if config.fabric.is_none() {
        let pool = Budget::new(config.max_host_memory);
        let Some(device) = config.devices.into_iter().next() else {
            return Err(StartError::NoDevices);
        };
        return start_backend_in(device, &pool);
    }
    let PreparedFabric {
        fabric,
        devices,
        bridges,
        pool: _pool,
        queues: _queues,
    } = prepare_fabric(&config)?;
    info!(
        "fabric: {} device(s), {} uplink(s)",
        devices.len(),
        fabric.port_count() - devices.len()
    );
    let operator_stats = match config.fabric.as_ref().and_then(|f| f.stats_socket.as_ref()) {
        Some(path) => Some(start_operator_stats(path, &fabric)?),
        None => None,
    };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for (cfg, prepared) in config.devices.into_iter().zip(devices) {
        let done = done_tx.clone();
        // A device's counters are its own (spec §16.5): the fabric's per-port counters name
        // every tenant's port and traffic, so only the operator socket has them.
        let t = std::thread::Builder::new()
            .name("vrdma-device".into())
            .spawn(move || {
                let r = run_device(&cfg, prepared, None);
                let _ = done.send(r);
            })
            .map_err(StartError::Thread)?;
        threads.push(t);
    }
    drop(done_tx);
    // Device loops do not end (accept errors are retried); should one end anyway, the daemon
    // ends rather than look alive half-served.
    let r = done_rx.recv().unwrap_or(Ok(()));
    drop(operator_stats);
    drop(bridges);
    r
}

/// The operator's socket (`--stats-socket`, mode 0600 whatever the umask): the fabric-wide
/// counters of every port (spec §16.5).
fn start_operator_stats(path: &Path, fabric: &Arc<Fabric>) -> Result<StatsServer, StartError> {
    let private = SocketAccess {
        mode: Some(0o600),
        ..SocketAccess::default()
    };
    let err = |source| StartError::Stats {
        path: path.display().to_string(),
        source,
    };
    let listener = super::socket_bind::bind_with_access(path, private).map_err(err)?;
    let f = fabric.clone();
    let render: ExtraStats = Arc::new(move || f.render_stats());
    let server = StatsServer::start_text(listener, path, render)
        .map_err(|e| err(std::io::Error::other(e.to_string())))?;
    info!("fabric counters on {} (operator socket)", path.display());
    Ok(server)
}
