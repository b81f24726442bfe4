//! The files of an `upload`, checked and copied before anything reaches the browser.
//!
//! CDP's `DOM.setFileInputFiles` takes any path the browser can read, and a path that does not
//! exist as an empty file. So each path is checked here: absolute, under `/workspace` once its
//! symlinks are resolved, a regular file, not empty, at most 16 MiB. The file is opened once and
//! checked again through the open descriptor (what `/proc/self/fd` says it is, and `fstat`), so a
//! symlink swapped in after the check is caught. Its bytes are hashed while they are copied into
//! a directory only the browser's account reads; the browser gets the copy. So the file the page
//! receives is the file that was checked and hashed, whatever happens to the original after.

use std::io::Read;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::path::PathBuf;

use sha2::Digest;

/// A checked, copied file.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    /// The path asked for.
    pub source: String,
    /// The copy the browser gets.
    pub copy: PathBuf,
    /// The file's name (the page sees it).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// Checks every path, then copies each into a new directory under `stage_dir` (open as
/// `stage_fd`), owned by `owner` (uid, gid) when given. Nothing is copied unless every path
/// passes. The staging directory is the browser account's: everything in it is made through
/// `stage_fd` and the descriptors opened under it (`O_NOFOLLOW`, `O_EXCL`), and owned through
/// them (`fchown`), so a symlink that account plants leads nowhere.
pub fn stage(
    paths: &[String],
    root: &Path,
    stage_dir: &Path,
    stage_fd: std::os::fd::BorrowedFd<'_>,
    owner: Option<(u32, u32)>,
    max: u64,
) -> Result<Vec<Staged>, String> {
    use std::os::fd::AsFd;
    let root = root.canonicalize().map_err(|e| format!("{} cannot be resolved: {e}", root.display()))?;
    let reader = std::fs::metadata(&root).map_err(|e| format!("{}: {e}", root.display()))?.uid();
    let mut opened = Vec::with_capacity(paths.len());
    for p in paths {
        opened.push(open_checked(p, &root, reader, max)?);
    }
    let rand = hex::encode(rand::random::<[u8; 8]>());
    let dir = stage_dir.join(&rand);
    let dir_fd = crate::nofollow::private_dir_at(stage_fd, rand.as_ref(), owner)
        .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let mut out = Vec::with_capacity(opened.len());
    for (i, (source, name, mut file)) in opened.into_iter().enumerate() {
        // One directory per file, so two files of the same name keep their names.
        let sub = dir.join(i.to_string());
        let sub_fd = crate::nofollow::private_dir_at(dir_fd.as_fd(), i.to_string().as_ref(), owner)
            .map_err(|e| format!("cannot make {}: {e}", sub.display()))?;
        let copy = sub.join(&name);
        let mut w = crate::nofollow::create_at(sub_fd.as_fd(), name.as_ref(), 0o400, owner)
            .map_err(|e| format!("cannot copy {source}: {e}"))?;
        let mut hash = sha2::Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = file.read(&mut buf).map_err(|e| format!("cannot read {source}: {e}"))?;
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > max {
                return Err(format!("{source} grew past {max} bytes while it was read"));
            }
            hash.update(&buf[..n]);
            w.write_all(&buf[..n]).map_err(|e| format!("cannot copy {source}: {e}"))?;
        }
        if size == 0 {
            return Err(format!("{source} is empty"));
        }
        w.sync_all().map_err(|e| e.to_string())?;
        out.push(Staged { source, copy, name, size, sha256: hex::encode(hash.finalize()) });
    }
    Ok(out)
}

/// Opens `p` when it is an absolute path of a regular, non-empty file of at most `max` bytes
/// under `root` (already canonical), symlinks resolved, that the workspace's owner (`reader`)
/// may read: the agent reads as root, so a hard link to a file only root reads (where the
/// kernel allows one) would otherwise leave through the page. Answers the path, the file's name
/// and the open file.
fn open_checked(p: &str, root: &Path, reader: u32, max: u64) -> Result<(String, String, std::fs::File), String> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(format!("{p}: a path must be absolute (under {})", root.display()));
    }
    let real = path.canonicalize().map_err(|e| format!("{p}: {e}"))?;
    if !real.starts_with(root) {
        return Err(format!("{p}: resolves to {}, outside {}", real.display(), root.display()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&real)
        .map_err(|e| format!("{p}: {e}"))?;
    // What was opened, by the descriptor: the same place, and a regular file.
    let fd_path = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)))
        .map_err(|e| format!("{p}: {e}"))?;
    if !fd_path.starts_with(root) {
        return Err(format!("{p}: changed while it was opened (now {})", fd_path.display()));
    }
    let meta = file.metadata().map_err(|e| format!("{p}: {e}"))?;
    if !meta.file_type().is_file() {
        return Err(format!("{p}: not a regular file"));
    }
    if meta.len() == 0 {
        return Err(format!("{p}: the file is empty"));
    }
    if meta.len() > max {
        return Err(format!("{p}: {} bytes, over the {max}-byte limit", meta.len()));
    }
    let readable = (meta.uid() == reader && meta.mode() & 0o400 != 0) || meta.mode() & 0o004 != 0;
    if !readable {
        return Err(format!("{p}: not readable by the workspace's owner"));
    }
    let name = real
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("{p}: the file's name is not UTF-8"))?
        .to_string();
    Ok((p.to_string(), name, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_regular_nonempty_bounded_files_under_the_root() {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path().join("workspace");
        let stage_dir = t.path().join("stage");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::write(root.join("report.pdf"), b"%PDF-1.4 hello").expect("write");
        std::fs::write(root.join("empty"), b"").expect("write");
        std::fs::write(root.join("big"), vec![1u8; 101]).expect("write");
        std::fs::write(t.path().join("secret"), b"outside").expect("write");
        std::os::unix::fs::symlink(t.path().join("secret"), root.join("link-out")).expect("symlink");
        std::os::unix::fs::symlink(root.join("report.pdf"), root.join("sub/link-in")).expect("symlink");
        std::fs::create_dir(&stage_dir).expect("mkdir");
        let stage_fd = crate::nofollow::open_start(&stage_dir).expect("open");
        use std::os::fd::AsFd;
        let s = |p: PathBuf| stage(&[p.display().to_string()], &root, &stage_dir, stage_fd.as_fd(), None, 100);
        let err = |p: PathBuf| s(p).expect_err("refused");
        assert!(err(t.path().join("secret")).contains("outside"));
        assert!(err(root.join("link-out")).contains("outside"), "a symlink out is refused");
        assert!(err(root.join("empty")).contains("empty"));
        assert!(err(root.join("big")).contains("over the 100-byte limit"));
        assert!(err(root.join("missing")).contains("No such file"));
        assert!(err(root.join("sub")).contains("not a regular file"));
        assert!(
            stage(&["report.pdf".into()], &root, &stage_dir, stage_fd.as_fd(), None, 100)
                .expect_err("relative")
                .contains("absolute")
        );
        // Nothing was copied for the refusals.
        assert!(std::fs::read_dir(&stage_dir).expect("dir").next().is_none());
        std::fs::write(root.join("private"), b"root only").expect("write");
        std::fs::set_permissions(root.join("private"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::chown(root.join("private"), Some(4242), None).expect("chown (the tests run as root)");
        assert!(err(root.join("private")).contains("not readable"), "a file its owner cannot read");
        let ok = s(root.join("sub/link-in")).expect("a symlink inside is fine");
        assert_eq!(ok[0].name, "report.pdf");
        assert_eq!(ok[0].size, 14);
        assert_eq!(ok[0].sha256, hex::encode(sha2::Sha256::digest(b"%PDF-1.4 hello")));
        assert_eq!(std::fs::read(&ok[0].copy).expect("copy"), b"%PDF-1.4 hello");
    }
}
