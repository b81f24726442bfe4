//! File and directory calls. Relative paths resolve against the workspace (the agent's
//! `--workdir`, as a session's working directory does); paths with `..` are refused.
//!
//! Every function here touches the file system with the rights of the thread that calls it: the
//! service calls them on a thread holding the call's account ([`crate::users::run_as`]), so a
//! file is opened, created, renamed and removed exactly as that account could, and what it
//! creates belongs to it. Only regular files are read or replaced (a FIFO or a device is refused
//! before it is opened for use); a write goes to a temporary file beside the target, which takes
//! the mode of the file it replaces, and is renamed into place.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Component;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use crate::users::Account;

/// The largest file read or written in one call.
pub const MAX_FILE: u64 = 16 << 20;

/// Why a file call failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Bad path.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// Missing.
    #[error("not found")]
    NotFound,
    /// A directory where a file was expected.
    #[error("is a directory")]
    IsDirectory,
    /// Not a directory where one was expected.
    #[error("not a directory")]
    NotDirectory,
    /// Permission denied.
    #[error("permission denied")]
    PermissionDenied,
    /// Over the limit.
    #[error("larger than {MAX_FILE} bytes")]
    TooLarge,
    /// Not a regular file (a FIFO, a socket, a device).
    #[error("{0} is not a regular file: only regular files are read and written")]
    NotRegular(&'static str),
    /// Anything else.
    #[error("{0}")]
    Io(String),
}

impl From<io::Error> for FileError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => FileError::NotFound,
            io::ErrorKind::PermissionDenied => FileError::PermissionDenied,
            io::ErrorKind::IsADirectory => FileError::IsDirectory,
            io::ErrorKind::NotADirectory => FileError::NotDirectory,
            _ => FileError::Io(e.to_string()),
        }
    }
}

/// Resolves a caller's path: absolute, or relative to `base`; never with `..`.
pub fn resolve(base: &Path, path: &str) -> Result<PathBuf, FileError> {
    if path.is_empty() || path.len() > 4096 || path.contains('\0') {
        return Err(FileError::InvalidPath("a path is 1 to 4096 bytes without NUL".into()));
    }
    let p = Path::new(path);
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(FileError::InvalidPath("`..` is not allowed in a path".into()));
    }
    Ok(if p.is_absolute() { p.to_path_buf() } else { base.join(p) })
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// File name.
    pub name: String,
    /// `file`, `dir`, `symlink`, `other`.
    pub kind: &'static str,
    /// Bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Unix seconds.
    pub mtime: i64,
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    }
}

fn special(ft: std::fs::FileType) -> Result<(), FileError> {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        Err(FileError::IsDirectory)
    } else if ft.is_fifo() {
        Err(FileError::NotRegular("a FIFO"))
    } else if ft.is_socket() {
        Err(FileError::NotRegular("a socket"))
    } else if ft.is_char_device() || ft.is_block_device() {
        Err(FileError::NotRegular("a device"))
    } else if !ft.is_file() {
        Err(FileError::NotRegular("this"))
    } else {
        Ok(())
    }
}

/// Opens a regular file for reading, refusing directories, FIFOs, devices and files over the
/// limit. It is opened without blocking and checked again through the descriptor, so a FIFO put
/// in its place meanwhile is refused too, never waited on.
pub fn open_read(path: &Path) -> Result<std::fs::File, FileError> {
    open_checked(path, true).map(|(f, _)| f)
}

/// Opens a regular file of any size for a ranged read, positioned at `offset`; answers it and
/// the file's size. An offset past the end reads nothing.
pub fn open_range(path: &Path, offset: u64) -> Result<(std::fs::File, u64), FileError> {
    use std::io::Seek;
    let (mut f, size) = open_checked(path, false)?;
    f.seek(io::SeekFrom::Start(offset.min(size)))?;
    Ok((f, size))
}

fn open_checked(path: &Path, limited: bool) -> Result<(std::fs::File, u64), FileError> {
    let meta = std::fs::metadata(path)?;
    special(meta.file_type())?;
    if limited && meta.len() > MAX_FILE {
        return Err(FileError::TooLarge);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let now = f.metadata()?;
    special(now.file_type())?;
    if (now.dev(), now.ino()) != (meta.dev(), meta.ino()) {
        return Err(FileError::Io("the file changed while it was opened".into()));
    }
    Ok((f, now.len()))
}

/// Whether an opened file's real path (as the kernel has it: symlinks resolved, at the moment it
/// was opened) lies under one of `roots` (each resolved too; one that does not exist holds
/// nothing).
pub fn opened_within(f: &std::fs::File, roots: &[String]) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(real) = std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())) else { return false };
    roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).any(|root| real.starts_with(&root))
}

/// Lists a directory that lies under one of `roots` (its real path, as opened); `None` when it
/// does not. The listing reads the opened directory itself, so a path swapped meanwhile does
/// not lead out.
pub fn list_within(path: &Path, roots: &[String]) -> Result<Option<Vec<Entry>>, FileError> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path)?;
    if !opened_within(&dir, roots) {
        return Ok(None);
    }
    list(Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd()))).map(Some)
}

/// Lists a directory, sorted by name.
pub fn list(path: &Path) -> Result<Vec<Entry>, FileError> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Err(FileError::NotDirectory);
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(path)? {
        let e = e?;
        let m = std::fs::symlink_metadata(e.path())?;
        out.push(Entry {
            name: e.file_name().to_string_lossy().into_owned(),
            kind: kind_of(m.file_type()),
            size: m.len(),
            mode: m.mode() & 0o7777,
            mtime: m.mtime(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Removes a file (not a directory).
pub fn remove(path: &Path) -> Result<(), FileError> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        return Err(FileError::IsDirectory);
    }
    Ok(std::fs::remove_file(path)?)
}

/// The temporary file a write goes to before it is renamed into place.
pub fn temp_for(path: &Path) -> Result<PathBuf, FileError> {
    let name = path.file_name().ok_or_else(|| FileError::InvalidPath("no file name".into()))?;
    let tmp = format!(".{}.computer-agent-{}", name.to_string_lossy(), hex::encode(rand::random::<[u8; 6]>()));
    Ok(path.with_file_name(tmp))
}

/// The mode a new file gets.
pub const NEW_FILE_MODE: u32 = 0o644;

/// A write begun: its temporary file (open for writing) and the mode the file will have.
pub struct Begun {
    /// The temporary file's path.
    pub temp: PathBuf,
    /// It, open for writing.
    pub file: std::fs::File,
    /// The mode of the file it replaces, or [`NEW_FILE_MODE`].
    pub mode: u32,
}

/// Begins writing `path`: makes its missing parent directories, refuses a directory, FIFO or
/// device in its place, and creates the temporary file beside it (never following a link).
pub fn begin_write(path: &Path) -> Result<Begun, FileError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mode = match std::fs::metadata(path) {
        Ok(m) => {
            special(m.file_type())?;
            m.mode() & 0o7777
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => NEW_FILE_MODE,
        Err(e) => return Err(e.into()),
    };
    let temp = temp_for(path)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)?;
    Ok(Begun { temp, file, mode })
}

/// Finishes a write: the temporary file takes `mode`, is flushed to disk and renamed to `path`.
/// Answers whether the rename happened (the temporary file is gone) and the file's entry.
pub fn finish_write(file: &std::fs::File, mode: u32, temp: &Path, path: &Path) -> (bool, Result<Entry, FileError>) {
    let placed = file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(temp, path));
    match placed {
        Ok(()) => (true, stat(path)),
        Err(e) => (false, Err(e.into())),
    }
}

/// A temporary file that is removed when dropped (with the rights of the account that made it),
/// unless it was renamed into place.
pub struct TempFile(Option<(PathBuf, Arc<Account>)>);

impl TempFile {
    /// Takes charge of `path`, made by `account`.
    pub fn new(path: PathBuf, account: Arc<Account>) -> Self {
        Self(Some((path, account)))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        self.0.as_ref().map(|(p, _)| p.as_path()).unwrap_or(Path::new(""))
    }

    /// It was renamed into place: nothing is left to remove.
    pub fn placed(mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some((p, account)) = self.0.take() {
            if account.switches {
                crate::users::run_as_detached(&account, move || {
                    let _ = std::fs::remove_file(p);
                });
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Metadata of one path, as an entry.
pub fn stat(path: &Path) -> Result<Entry, FileError> {
    let m = std::fs::symlink_metadata(path)?;
    Ok(Entry {
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        kind: kind_of(m.file_type()),
        size: m.len(),
        mode: m.mode() & 0o7777,
        mtime: m.mtime(),
    })
}

/// Why an edit was refused.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// `old` is not in the file.
    #[error("`old` does not occur in the file")]
    Missing,
    /// `old` occurs more than once.
    #[error("`old` occurs {0} times in the file: give more of the text around it, so that it occurs once")]
    NotUnique(usize),
    /// The file changed between its read and its replacement.
    #[error("the file changed while it was being edited: read it again and retry")]
    Changed,
    /// The new file could not keep the old one's owner.
    #[error("the edited file cannot keep its owner ({0})")]
    Owner(String),
}

/// Replaces the one occurrence of `old` in the regular file `path` with `new`: the file is read
/// whole (at most [`MAX_FILE`]), written beside it and renamed into place, keeping its mode and
/// owner, so a reader sees the old file or the new one, never a mix. Refused, changing nothing,
/// when `old` is empty, missing or not unique, when `path` is a symlink, or when the file changed
/// meanwhile.
pub fn edit(path: &Path, old: &[u8], new: &[u8]) -> Result<Entry, EditError> {
    use std::io::Read;
    use std::io::Write;
    if old.is_empty() {
        return Err(FileError::InvalidPath("`old` is empty: an edit replaces some text".into()).into());
    }
    let before = std::fs::symlink_metadata(path).map_err(FileError::from)?;
    if before.file_type().is_symlink() {
        return Err(FileError::NotRegular("a symlink (edit the file it points to)").into());
    }
    let mut f = open_read(path)?;
    let opened = f.metadata().map_err(FileError::from)?;
    if (opened.dev(), opened.ino()) != (before.dev(), before.ino()) {
        return Err(EditError::Changed);
    }
    let mut text = Vec::with_capacity(opened.len() as usize);
    f.read_to_end(&mut text).map_err(FileError::from)?;
    let mut found = memchr::memmem::find_iter(&text, old);
    let at = found.next().ok_or(EditError::Missing)?;
    if found.next().is_some() {
        return Err(EditError::NotUnique(2 + found.count()));
    }
    let size = text.len() - old.len() + new.len();
    if size as u64 > MAX_FILE {
        return Err(FileError::TooLarge.into());
    }
    let begun = begin_write(path)?;
    let written = (|| {
        let mut out = &begun.file;
        out.write_all(&text[..at])?;
        out.write_all(new)?;
        out.write_all(&text[at + old.len()..])?;
        Ok::<_, io::Error>(())
    })()
    .map_err(|e| EditError::File(e.into()))
    .and_then(|()| {
        let mine = begun.file.metadata().map_err(FileError::from)?;
        if (mine.uid(), mine.gid()) != (before.uid(), before.gid()) {
            std::os::unix::fs::fchown(&begun.file, Some(before.uid()), Some(before.gid()))
                .map_err(|e| EditError::Owner(e.to_string()))?;
        }
        // The file is the one read, unchanged: the same inode, size and modification time.
        let now = std::fs::symlink_metadata(path).map_err(FileError::from)?;
        let same = (now.ino(), now.len(), now.mtime(), now.mtime_nsec())
            == (before.ino(), before.len(), before.mtime(), before.mtime_nsec());
        if same { Ok(()) } else { Err(EditError::Changed) }
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&begun.temp);
        return Err(e);
    }
    match finish_write(&begun.file, begun.mode, &begun.temp, path) {
        (true, entry) => Ok(entry?),
        (false, entry) => {
            let _ = std::fs::remove_file(&begun.temp);
            Err(entry.err().unwrap_or(FileError::Io("the edited file was not put in place".into())).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_components_are_refused() {
        let base = Path::new("/home/u");
        assert_eq!(resolve(base, "a/b").ok(), Some(PathBuf::from("/home/u/a/b")));
        assert_eq!(resolve(base, "/etc/x").ok(), Some(PathBuf::from("/etc/x")));
        assert!(matches!(resolve(base, "../x"), Err(FileError::InvalidPath(_))));
        assert!(matches!(resolve(base, "/a/../b"), Err(FileError::InvalidPath(_))));
        assert!(matches!(resolve(base, ""), Err(FileError::InvalidPath(_))));
    }

    #[test]
    fn fifos_are_refused_and_writes_keep_modes_and_make_parents() {
        let dir = tempfile::tempdir().expect("dir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
        assert!(matches!(open_read(&fifo), Err(FileError::NotRegular("a FIFO"))));
        assert!(matches!(begin_write(&fifo), Err(FileError::NotRegular("a FIFO"))));
        assert!(matches!(open_read(Path::new("/dev/null")), Err(FileError::NotRegular("a device"))));
        let path = dir.path().join("a/b/c.txt");
        let b = begin_write(&path).expect("begin");
        assert_eq!(b.mode, NEW_FILE_MODE);
        let (placed, e) = finish_write(&b.file, b.mode, &b.temp, &path);
        assert!(placed);
        assert_eq!(e.expect("entry").mode, NEW_FILE_MODE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o751)).expect("chmod");
        let b = begin_write(&path).expect("begin");
        let (_, e) = finish_write(&b.file, b.mode, &b.temp, &path);
        assert_eq!(e.expect("entry").mode, 0o751, "an overwrite keeps the mode");
    }

    #[test]
    fn an_edit_replaces_one_occurrence_and_keeps_the_mode() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("main.py");
        std::fs::write(&path, "x = 1\ny = 1\nprint(x)\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        assert!(matches!(edit(&path, b"= 1", b"= 2"), Err(EditError::NotUnique(2))));
        assert!(matches!(edit(&path, b"z = 1", b"z = 2"), Err(EditError::Missing)));
        assert!(matches!(edit(&path, b"", b"a"), Err(EditError::File(FileError::InvalidPath(_)))));
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "x = 1\ny = 1\nprint(x)\n",
            "refusals change nothing"
        );
        let e = edit(&path, b"y = 1", b"y = 20").expect("edit");
        assert_eq!((e.mode, e.size), (0o750, 22));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "x = 1\ny = 20\nprint(x)\n");
        let link = dir.path().join("link.py");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(matches!(edit(&link, b"x", b"z"), Err(EditError::File(FileError::NotRegular(_)))));
        let names: Vec<_> = list(dir.path()).expect("list").into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["link.py", "main.py"], "no temporary file is left");
    }

    #[test]
    fn a_ranged_read_reads_past_the_whole_file_limit() {
        use std::io::Read;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("big.log");
        let f = std::fs::File::create(&path).expect("create");
        f.set_len(MAX_FILE + 10).expect("grow");
        drop(f);
        assert!(matches!(open_read(&path), Err(FileError::TooLarge)));
        let (mut f, size) = open_range(&path, MAX_FILE + 4).expect("range");
        assert_eq!(size, MAX_FILE + 10);
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).expect("read");
        assert_eq!(rest.len(), 6);
        let (mut f, _) = open_range(&path, MAX_FILE + 100).expect("past the end");
        assert_eq!(f.read_to_end(&mut rest).expect("read"), 0);
    }
}
