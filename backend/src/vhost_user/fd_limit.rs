//! The daemon's file descriptor limit (spec §16.5): raised to the hard limit at start, because
//! every frontend connection may hold a descriptor per memory region (up to the vhost crate's
//! 509 slots for ADD_MEM_REG) plus its vring, log and state descriptors, and one daemon serves
//! many frontends. Running out shows as a failed accept, which the accept loop retries.

use std::io;

use log::{info, warn};

/// Descriptors one frontend connection can make the daemon hold at most: 509 memory slots,
/// kick/call/err for each of the 6 queues, the log, state-transfer and backend-request fds
/// and the connection itself, rounded up.
pub const FDS_PER_FRONTEND: u64 = 544;

/// Descriptors the daemon needs besides its frontends (sockets, uplinks, eventfds, logs).
pub const FDS_BASE: u64 = 256;

/// Raise the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit.
pub fn raise_to_hard_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid, exclusively borrowed `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit only reads the valid `lim`.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// Raise the limit for a daemon of `devices` devices and say whether it is enough for every
/// frontend at its worst (logged; a frontend beyond it is served until an accept or a region
/// descriptor fails, which ends or delays that connection only).
pub fn prepare_for(devices: usize) {
    let need = FDS_BASE + FDS_PER_FRONTEND * devices as u64;
    match raise_to_hard_limit() {
        Ok(have) if have >= need => info!("file descriptor limit {have}"),
        Ok(have) => warn!(
            "file descriptor limit {have} is below the {need} that {devices} frontend(s) can \
             hold at most (raise LimitNOFILE=); accepts that fail are retried"
        ),
        Err(e) => warn!("cannot raise the file descriptor limit: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_limit_ends_at_the_hard_limit() {
        let soft = raise_to_hard_limit().unwrap();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in raise_to_hard_limit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(soft, lim.rlim_cur);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
    }
}
