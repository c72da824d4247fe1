//! Spec §16.5: a failed accept (here EMFILE: the process is out of file descriptors) is logged
//! and retried; the device's accept loop does not end, and the frontend that was waiting is
//! served once descriptors are free again. Its own test binary: it lowers RLIMIT_NOFILE for
//! the whole process.

mod vhost_user_support;

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost::vhost_user::Frontend;
use vhost::VhostBackend;
use vhost_user_support::no_command_parts;
use vrdma_backend::vhost_user::daemon::listen;
use vrdma_backend::vhost_user::{serve, VirtqOutput};

fn nofile() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid `lim`.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim
}

fn set_nofile(lim: &libc::rlimit) {
    // SAFETY: setrlimit reads the valid `lim`.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) }, 0);
}

/// Occupy every free descriptor number below the current highest one, so that the lowest
/// free number is `returned.1` and a soft limit of that number makes every new fd fail.
fn fill_descriptor_holes() -> (Vec<OwnedFd>, RawFd) {
    let highest = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
        .max()
        .unwrap();
    let mut filler = Vec::new();
    loop {
        // SAFETY: dup of stdin's descriptor; the new fd (checked) is owned below.
        let fd = unsafe { libc::dup(0) };
        assert!(fd >= 0, "dup");
        if fd > highest {
            // SAFETY: `fd` is the fresh descriptor just made; closing frees its number again.
            unsafe { libc::close(fd) };
            return (filler, fd);
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        filler.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
}

#[test]
fn accept_failure_is_retried_and_the_waiting_frontend_is_served() {
    let dir = std::env::temp_dir().join(format!("vrdma-test-accept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vrdma.sock");
    let parts = no_command_parts(VirtqOutput::new(8));
    let failures = parts.accept_failures.clone();
    let mut listener = listen(&path).unwrap();
    // Whether the daemon is in accept or still setting the connection up when the limit
    // drops, one of the two fails with EMFILE: both are retried alike.
    let before = nofile();
    let frontend_sock = {
        // The frontend's socket exists before the limit drops; it connects after.
        // SAFETY: socket() with constant arguments; the fd (checked) is owned below.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nobody else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    let daemon = std::thread::spawn(move || {
        serve(&mut listener, &parts, Some(1)).expect("serve");
    });
    let (filler, lowest_free) = fill_descriptor_holes();
    set_nofile(&libc::rlimit {
        rlim_cur: lowest_free as libc::rlim_t,
        rlim_max: before.rlim_max,
    });
    // Connect the prepared socket: the daemon's accept (or its per-connection set-up) now
    // fails with EMFILE.
    let addr = {
        // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
        let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in a
            .sun_path
            .iter_mut()
            .zip(path.as_os_str().as_encoded_bytes())
        {
            *d = *s as libc::c_char;
        }
        a
    };
    // SAFETY: connect reads `addr` (a valid sockaddr_un of the given size) on our socket.
    let rc = unsafe {
        libc::connect(
            std::os::fd::AsRawFd::as_raw_fd(&frontend_sock),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
    let deadline = Instant::now() + Duration::from_secs(10);
    while failures.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "the daemon never failed to accept"
        );
        assert!(!daemon.is_finished(), "the accept loop ended");
        std::thread::yield_now();
    }
    set_nofile(&before);
    drop(filler);
    // The daemon retries and serves the waiting frontend; if the failure hit the set-up of
    // its already accepted connection, that connection was closed and the frontend
    // reconnects (as QEMU's reconnect-ms does).
    let mut fe = Frontend::from_stream(UnixStream::from(frontend_sock), 6);
    let features = match fe.get_features() {
        Ok(f) => f,
        Err(_) => {
            fe = Frontend::from_stream(UnixStream::connect(&path).unwrap(), 6);
            fe.get_features()
                .expect("the frontend is served after the failure")
        }
    };
    assert_ne!(features, 0);
    drop(fe);
    daemon.join().expect("the accept loop ran to its end");
    assert!(failures.load(Ordering::Relaxed) >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}
