//! Binding the daemon's unix sockets with the owner, group and mode the operator asked for
//! (spec §16.5 "Sockets"). The socket is bound under a temporary name in the same directory,
//! given its mode and owner there, and renamed onto its path: a frontend never finds it at
//! its path with any other permissions, and a stale socket there is replaced atomically.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use crate::cli::access::SocketAccess;

/// Bind a listening unix socket at `path` with `access` applied before it appears there.
pub fn bind_with_access(path: &Path, access: SocketAccess) -> io::Result<UnixListener> {
    let tmp = temporary_name(path);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    let applied = apply(&tmp, access).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = applied {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// A short name next to `path` (unix socket paths are limited to 107 bytes).
fn temporary_name(path: &Path) -> PathBuf {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!(".vrdma-{}-{n}", std::process::id()))
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
