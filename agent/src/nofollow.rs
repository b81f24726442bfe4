//! Walking a path one component at a time under a directory the agent trusts, never following a
//! symlink (`openat` with `O_NOFOLLOW` at every step), and changing what was opened through its
//! descriptor (`fchown`, `fchmod`), never through a path. The agent runs as root; a tree another
//! account owns (the browser's, a workspace) may hold a symlink that account planted, and a
//! path-based `chown`, `chmod`, `open` or `stat` would follow it to wherever it points.
//!
//! A symlink met on the way is refused as `ELOOP` (or `ENOTDIR`); a caller that must not tell
//! a symlink from a missing file maps both alike.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::path::Component;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

fn io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The plain names of a relative path; `..`, `/` or a prefix is refused (`.` is skipped).
pub fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "only plain names below the directory")),
        }
    }
    Ok(out)
}

/// Opens the directory `path` itself, as given (its symlinks followed): the trusted start.
pub fn open_start(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).map_err(io)
}

/// Opens the directory `name` in `dir`, refusing a symlink.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)
}

/// Opens the directory `rel` under `dir`, refusing a symlink at every step.
pub fn walk_dirs(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    let mut at = nix::unistd::dup(dir).map_err(io)?;
    for n in names(rel)? {
        at = open_dir_at(at.as_fd(), n)?;
    }
    Ok(at)
}

/// Opens the file `rel` under the directory `base` for reading, refusing a symlink at every
/// step, the last one included; opened without blocking (a FIFO is not waited on) and without
/// taking a terminal. What it is (a regular file or not) is for the caller to check by `fstat`.
pub fn open_read_under(base: &Path, rel: &Path) -> io::Result<std::fs::File> {
    let names = names(rel)?;
    let Some((last, dirs)) = names.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file name"));
    };
    let mut at = open_start(base)?;
    for n in dirs {
        at = open_dir_at(at.as_fd(), n)?;
    }
    let fd = nix::fcntl::openat(
        at.as_fd(),
        *last,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)?;
    Ok(std::fs::File::from(fd))
}

/// Makes (or keeps) the directory `name` in `dir` and makes it private: mode 0700, owned by
/// `owner` when given. An existing symlink (or anything but a directory) is refused, never
/// followed; the mode and owner are set through the opened descriptor.
pub fn private_dir_at(dir: BorrowedFd<'_>, name: &OsStr, owner: Option<(u32, u32)>) -> io::Result<OwnedFd> {
    match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::Error::EEXIST) => {}
        Err(e) => return Err(io(e)),
    }
    let fd = open_dir_at(dir, name)?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(&fd, Some(uid.into()), Some(gid.into())).map_err(io)?;
    }
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700)).map_err(io)?;
    Ok(fd)
}

/// [`private_dir_at`] for every step of `rel` under `dir`: each directory on the way is made
/// private too. Answers the last one, open.
pub fn private_dirs(dir: BorrowedFd<'_>, rel: &Path, owner: Option<(u32, u32)>) -> io::Result<OwnedFd> {
    let mut at = nix::unistd::dup(dir).map_err(io)?;
    for n in names(rel)? {
        at = private_dir_at(at.as_fd(), n, owner)?;
    }
    Ok(at)
}

/// Creates the new file `name` in `dir` (`O_EXCL`, never through a symlink), mode `mode`, owned
/// by `owner` when given (set through its descriptor), open for writing.
pub fn create_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32, owner: Option<(u32, u32)>) -> io::Result<std::fs::File> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(io)?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(&fd, Some(uid.into()), Some(gid.into())).map_err(io)?;
    }
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(io)?;
    Ok(std::fs::File::from(fd))
}

/// Replaces the file `name` in `dir` with `bytes`: a new file beside it (see [`create_at`]),
/// renamed over it. Whatever was there (a symlink, a hard link) is replaced, never written
/// through.
pub fn replace_at(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".computer-agent-{}", hex::encode(rand::random::<[u8; 6]>())));
    let written = create_at(dir, &tmp, mode, owner).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let placed = written.and_then(|()| nix::fcntl::renameat(dir, tmp.as_os_str(), dir, name).map_err(io));
    if placed.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_os_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    placed
}
