//! The frontend's Unix socket file: created with its final mode, removed only if still ours.
//!
//! Binding at the final path and then calling chmod leaves a window in which the socket
//! exists with the umask's mode. Instead the socket is bound inside a fresh private
//! directory (mode 0700, next to the final path so the rename stays on one filesystem),
//! given mode 0770 there, and renamed into place. On shutdown the path is unlinked only if
//! it still is the same inode: a newer server that replaced the socket keeps its socket.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Owner and group may connect (upstream's mode).
const SOCKET_MODE: u32 = 0o770;

/// The socket file a listener owns.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// Binds a listener at `path`. An existing file there is replaced when
    /// `delete_existing`, otherwise it is an `AddrInUse` error.
    pub(crate) fn bind(path: &Path, delete_existing: bool) -> io::Result<(UnixListener, Self)> {
        if !delete_existing && std::fs::symlink_metadata(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "a file already exists there (--delete-existing-uds-file=false)",
            ));
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let private = parent.join(format!(
            ".{}.tether-{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            unique()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&private)?;
        let staged = private.join("s");
        let bound = (|| {
            let listener = UnixListener::bind(&staged)?;
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(SOCKET_MODE))?;
            std::fs::rename(&staged, path)?;
            Ok::<_, io::Error>(listener)
        })();
        let _ = std::fs::remove_file(&staged);
        let _ = std::fs::remove_dir(&private);
        let listener = bound?;
        let meta = std::fs::symlink_metadata(path)?;
        Ok((
            listener,
            Self {
                path: path.to_owned(),
                dev: meta.dev(),
                ino: meta.ino(),
            },
        ))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => {
                let _ = std::fs::remove_file(&self.path);
            }
            Ok(_) => tracing::info!(
                path = %self.path.display(),
                "the socket was replaced by another process; leaving it in place"
            ),
            Err(_) => {}
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn socket_has_its_mode_and_a_replaced_socket_survives_our_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        let (_listener, first) = SocketFile::bind(&path, true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
        // Only the socket is left in the directory: no staging directory behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

        assert!(SocketFile::bind(&path, false).is_err(), "exists, no delete");
        // A successor replaces the socket; the old owner's drop must not remove it.
        let (_l2, second) = SocketFile::bind(&path, true).unwrap();
        drop(first);
        assert!(path.exists(), "the successor's socket was unlinked");
        drop(second);
        assert!(!path.exists());
    }
}
