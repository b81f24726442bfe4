//! File and directory calls. Relative paths resolve against the agent's working directory;
//! paths with `..` are refused.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Component;
use std::path::Path;
use std::path::PathBuf;

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

/// Opens a file for reading, refusing directories and files over the limit.
pub async fn open_read(path: &Path) -> Result<tokio::fs::File, FileError> {
    let meta = tokio::fs::metadata(path).await?;
    if meta.is_dir() {
        return Err(FileError::IsDirectory);
    }
    if meta.len() > MAX_FILE {
        return Err(FileError::TooLarge);
    }
    Ok(tokio::fs::File::open(path).await?)
}

/// Lists a directory, sorted by name.
pub async fn list(path: &Path) -> Result<Vec<Entry>, FileError> {
    let meta = tokio::fs::metadata(path).await?;
    if !meta.is_dir() {
        return Err(FileError::NotDirectory);
    }
    let mut rd = tokio::fs::read_dir(path).await?;
    let mut out = Vec::new();
    while let Some(e) = rd.next_entry().await? {
        let m = tokio::fs::symlink_metadata(e.path()).await?;
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
pub async fn remove(path: &Path) -> Result<(), FileError> {
    let meta = tokio::fs::symlink_metadata(path).await?;
    if meta.is_dir() {
        return Err(FileError::IsDirectory);
    }
    Ok(tokio::fs::remove_file(path).await?)
}

/// The temporary file a write goes to before it is renamed into place.
pub fn temp_for(path: &Path) -> Result<PathBuf, FileError> {
    let name = path.file_name().ok_or_else(|| FileError::InvalidPath("no file name".into()))?;
    let tmp = format!(".{}.computer-agent-{}", name.to_string_lossy(), hex::encode(rand::random::<[u8; 6]>()));
    Ok(path.with_file_name(tmp))
}

/// A temporary file that is removed when dropped, unless it was renamed into place.
pub struct TempFile(Option<PathBuf>);

impl TempFile {
    /// Takes charge of `path` (which need not exist yet).
    pub fn new(path: PathBuf) -> Self {
        Self(Some(path))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    /// Renames the file to `to`; it is no longer removed.
    pub async fn persist(mut self, to: &Path) -> std::io::Result<()> {
        let Some(from) = self.0.take() else { return Ok(()) };
        match tokio::fs::rename(&from, to).await {
            Ok(()) => Ok(()),
            Err(e) => {
                self.0 = Some(from);
                Err(e)
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Metadata of one path, as an entry.
pub async fn stat(path: &Path) -> Result<Entry, FileError> {
    let m = tokio::fs::symlink_metadata(path).await?;
    Ok(Entry {
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        kind: kind_of(m.file_type()),
        size: m.len(),
        mode: m.mode() & 0o7777,
        mtime: m.mtime(),
    })
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
}
