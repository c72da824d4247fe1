//! `vrdma-backend`: parse the command line, set up logging and signals, run the daemon.
//! `vrdma-backend stats --socket PATH` instead prints a running daemon's counters.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use log::{error, info};

use vrdma_backend::cli::{Args, Config, DaemonConfig, StatsArgs};
use vrdma_backend::exporter::{fetch, stats_socket_path};
use vrdma_backend::vhost_user::start_daemon;

fn init_logging(config: &Config) -> Result<(), String> {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if let Some(path) = &config.log_file {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open --log-file {}: {e}", path.display()))?;
        builder.target(env_logger::Target::Pipe(Box::new(file)));
    }
    builder.init();
    Ok(())
}

/// Block SIGINT and SIGTERM in every thread (called before any thread is spawned) and wait for
/// them on a dedicated thread, which removes the sockets and exits with status 0.
fn install_signal_thread(sockets: Vec<PathBuf>) -> Result<(), String> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it before use and
    // pthread_sigmask only reads it. No other thread exists yet, so every thread spawned later
    // inherits the blocked mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(format!(
                "pthread_sigmask: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".to_string())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is an initialised sigset_t owned by this closure and `sig` a valid
            // out-pointer; sigwait does not retain either.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc == 0 {
                info!("signal {sig} received, exiting");
                for socket in &sockets {
                    let _ = std::fs::remove_file(stats_socket_path(socket));
                    let _ = std::fs::remove_file(socket);
                }
                std::process::exit(0);
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// `vrdma-backend stats --socket PATH`: print the counters of the daemon serving PATH.
fn stats_main(argv: Vec<std::ffi::OsString>) -> ExitCode {
    let args = StatsArgs::parse_from(argv);
    match fetch(&args.socket) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vrdma-backend stats: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "stats") {
        // `vrdma-backend stats ...` parses as a program named "vrdma-backend stats".
        let mut rest = vec![std::ffi::OsString::from("vrdma-backend stats")];
        rest.extend(argv.into_iter().skip(2));
        return stats_main(rest);
    }
    let args = Args::parse_from(argv);
    let config = match DaemonConfig::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vrdma-backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(first) = config.devices.first() else {
        eprintln!("vrdma-backend: no device to serve");
        return ExitCode::FAILURE;
    };
    if let Err(e) = init_logging(first) {
        eprintln!("vrdma-backend: {e}");
        return ExitCode::FAILURE;
    }
    let logs_to_file = first.log_file.is_some();
    let mut sockets = config.sockets();
    // The operator's stats socket is removed at exit too (spec §16.5).
    sockets.extend(config.fabric.iter().filter_map(|f| f.stats_socket.clone()));
    if let Err(e) = install_signal_thread(sockets) {
        eprintln!("vrdma-backend: {e}");
        return ExitCode::FAILURE;
    }
    match start_daemon(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if logs_to_file {
                error!("{e}");
            }
            eprintln!("vrdma-backend: {e}");
            ExitCode::FAILURE
        }
    }
}
