//! Binding the daemon's unix sockets with the owner, group and mode the operator asked for
//! (spec §16.5 "Sockets"). The socket is bound inside a fresh directory of mode 0700 next to
//! its path (nobody else can reach it there, whatever the umask), given its mode and owner,
//! and renamed onto its path: a frontend never finds it anywhere with other permissions, and a
//! stale socket at the path is replaced atomically.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use crate::cli::access::SocketAccess;

/// Bind a listening unix socket at `path` with `access` applied before it appears there.
pub fn bind_with_access(path: &Path, access: SocketAccess) -> io::Result<UnixListener> {
    let dir = private_dir(path)?;
    let tmp = dir.join("s");
    let bound = UnixListener::bind(&tmp).and_then(|listener| {
        apply(&tmp, access)?;
        std::fs::rename(&tmp, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&dir);
    bound
}

/// A new directory of mode 0700 next to `path`, with a short name (unix socket paths are
/// limited to 107 bytes).
fn private_dir(path: &Path) -> io::Result<PathBuf> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!(".vb{}.{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            // Left by an earlier process with this pid: take the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            r => return r.map(|()| dir),
        }
    }
}

fn apply(path: &Path, access: SocketAccess) -> io::Result<()> {
    if let Some(mode) = access.mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    if access.owner.is_some() || access.group.is_some() {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // u32::MAX (-1) leaves that id unchanged.
        let uid = access.owner.unwrap_or(u32::MAX);
        let gid = access.group.unwrap_or(u32::MAX);
        // SAFETY: `c` is a NUL-terminated path that outlives the call; lchown only reads it.
        if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_socket_is_bound_in_a_private_directory_that_is_then_removed() {
        let dir = std::env::temp_dir().join(format!("vrdma-sockpriv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.sock");
        let private = private_dir(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&private).unwrap().mode() & 0o777,
            0o700,
            "nobody else may reach a socket before its mode is set"
        );
        std::fs::remove_dir(&private).unwrap();
        let l = bind_with_access(&path, SocketAccess::default()).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("d.sock")]);
        drop(l);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn socket_appears_with_its_mode_and_group() {
        let dir = std::env::temp_dir().join(format!("vrdma-sockbind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.sock");
        // A stale socket at the path is replaced.
        drop(UnixListener::bind(&path).unwrap());
        // SAFETY: getegid has no preconditions.
        let gid = unsafe { libc::getegid() };
        let access = SocketAccess {
            owner: None,
            group: Some(gid),
            mode: Some(0o640),
        };
        let l = bind_with_access(&path, access).unwrap();
        let md = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(md.mode() & 0o777, 0o640);
        assert_eq!(md.gid(), gid);
        // It is the bound socket: a client reaches this listener.
        let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        l.accept().unwrap();
        // No temporary name is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
