//! The device state stream's pipe (spec §17.3, §16.5): the threads that move the bytes give
//! up when the frontend makes no progress for [`STATE_IDLE_LIMIT`], so a frontend that never
//! reads or never closes its end cannot keep a thread, a descriptor and the state buffer of
//! the daemon forever.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// How long a state transfer may go without a byte moving (QEMU moves the stream at once).
pub const STATE_IDLE_LIMIT: Duration = Duration::from_secs(30);

/// Make `file` non-blocking (the pipe end is the daemon's own: the frontend kept the other).
fn set_nonblocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL / F_SETFL on a descriptor `file` keeps open; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Wait until `file` is ready for `events`, at most `idle`.
fn wait(file: &File, events: libc::c_short, idle: Duration) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events,
        revents: 0,
    };
    let ms = libc::c_int::try_from(idle.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        match n {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the frontend moved no state for too long",
                ))
            }
            n if n > 0 => return Ok(()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Read the whole stream, at most `max` bytes (the frontend's data is untrusted). The buffer
/// grows by doubling; `before_grow(capacity)` is asked first each time and may refuse (e.g. a
/// host-memory budget, spec §16.1), which fails the read.
pub fn read_state(
    file: &mut File,
    max: usize,
    idle: Duration,
    before_grow: &mut dyn FnMut(usize) -> io::Result<()>,
) -> io::Result<Vec<u8>> {
    set_nonblocking(file)?;
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => {
                let len = bytes.len();
                if len + n > max {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "device state stream too large",
                    ));
                }
                if bytes.capacity() - len < n {
                    // Doubling (no quadratic copying), never beyond what the bound can need.
                    let cap = (2 * bytes.capacity()).max(len + n).min(max);
                    before_grow(cap)?;
                    bytes.reserve_exact(cap - len);
                }
                bytes.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(file, libc::POLLIN, idle)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Write the whole stream.
pub fn write_state(file: &mut File, mut bytes: &[u8], idle: Duration) -> io::Result<()> {
    set_nonblocking(file)?;
    while !bytes.is_empty() {
        match file.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(file, libc::POLLOUT, idle)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::time::Instant;

    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the valid array; each is owned below.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors nobody else owns.
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
    }

    #[test]
    fn a_whole_stream_moves() {
        let (mut r, mut w) = pipe();
        let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let d2 = data.clone();
        let t = std::thread::spawn(move || write_state(&mut w, &d2, Duration::from_secs(5)));
        let got = read_state(&mut r, 1 << 20, Duration::from_secs(5), &mut |_| Ok(())).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(got, data);
    }

    #[test]
    fn a_silent_or_deaf_frontend_times_out() {
        let idle = Duration::from_millis(100);
        // A writer that keeps its end open and sends nothing.
        let (mut r, _w) = pipe();
        let t0 = Instant::now();
        let e = read_state(&mut r, 1 << 20, idle, &mut |_| Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(5));
        // A reader that never reads: more than the pipe holds.
        let (_r, mut w) = pipe();
        let e = write_state(&mut w, &vec![0u8; 4 << 20], idle).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn an_oversized_stream_is_refused() {
        let (mut r, mut w) = pipe();
        w.write_all(&[1u8; 2048]).unwrap();
        drop(w);
        let e = read_state(&mut r, 1024, Duration::from_secs(5), &mut |_| Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
