//! The runtime loader: a tar archive (optionally gzip-compressed) of a Computer's runtime
//! directory, loaded into a protected destination root and published durably
//! (`computer-agent load-runtime`). It moves an old Computer's runtime out of its container's
//! writable layer into `DATA_DIR/runtime/{homeKey}` (SPEC §6, issue 40). It reads the archive with
//! the `tar` and `flate2` crates, never runs package content and never calls an external
//! unpacker.
//!
//! # What it keeps, what it refuses
//!
//! It keeps regular files (their bytes, sparse ones as holes), directories, symlinks (their
//! targets verbatim, never followed), hard links to an *earlier* regular member, numeric UID/GID
//! (never names), the mode's low 12 bits (setuid, setgid and sticky included) and mtimes. It
//! refuses, naming the member and the reason ([`LoadError`]):
//!
//! - special files (FIFO, character and block devices) and any other member type;
//! - path escapes: an absolute path, a `..` component, and a member below a symlink of the same
//!   archive (writing through it could land anywhere);
//! - a hard link to a path outside the root, to a member that is not earlier in the archive (a
//!   later or a missing one), or to something other than a regular file;
//! - a duplicate member (`a` and `./a` are the same member), a member whose parent directory was
//!   not itself an earlier member (the root excepted), a name the loader reserves at the top
//!   (`.computerd-load-*`);
//! - more than [`MAX_ENTRIES`] members, or more than [`MAX_BYTES`] of content: a member whose
//!   declared size (a sparse file's real size) would pass the limit is refused before a byte of it
//!   is written;
//! - an unprotected destination root: it must be a directory owned by root and neither group- nor
//!   world-writable;
//! - a non-empty destination (something is already published there), a destination that moved
//!   (the journal's device and inode are not the directory's), and a snapshot that is not the
//!   one expected (`--expect-snapshot`) or not the archive's: nothing is overwritten.
//!
//! Writes never follow a symlink: every file and directory is made with `openat`/`mkdirat`/
//! `symlinkat`/`linkat` relative to a directory opened one component at a time with
//! `O_NOFOLLOW` ([`crate::nofollow`]), files with `O_EXCL`, owners and modes set through the
//! opened descriptor. A plain (uncompressed) archive file is first read header by header (its
//! contents skipped by seeking), so a bad archive is refused before anything is written; a
//! compressed archive or standard input is checked member by member as it streams, with the
//! same checks before each member is written.
//!
//! # Staging and the journaled publish
//!
//! The archive is loaded into `<root>/.computerd-load-staging` (mode 0700). The archive's bytes
//! are hashed on a thread of their own as they are written, and each file, once written, is
//! read back through its descriptor and hashed on other threads, beside the load. Then the
//! staging file system is synced (`syncfs`: every file and directory written back and the
//! disk's cache flushed in one pass, a writeback error of any reported), the staging tree is
//! walked, every directory fsynced, and its snapshot compared with the archive's (a file's
//! read-back digest stands while its size, mtime and ctime are those it was read with, else
//! the walk reads it again). One `syncfs` rather than an fsync per file: on this project's
//! machines (ext4 on a virtual disk) 50,000 fsyncs cost a cache flush each and made the load
//! 0.45x to 0.68x of `tar -x && sync`, the one `syncfs` 0.83x to 1.38x (bench/README.md,
//! loader-bench).
//! Publishing is a journaled sequence; the binary can pause at each named step (the environment
//! variable [`PAUSE_ENV`] set to the step's name, for the tests that kill it there):
//!
//! 1. `staged`: staging is complete, synced and verified. A run that finds a staging but no
//!    journal removes it and loads again.
//! 2. `journaled`: `<root>/.computerd-load-journal` is written (a temporary file, fsynced,
//!    renamed, the root fsynced). It holds the snapshot, the counts, the device and inode of the
//!    root and of the staging directory, and the top-level names to move. From here a run resumes
//!    the publish from the journal, without reading the archive again.
//! 3. `moving` (after the first name is moved), `moved`: each top-level name is renamed from
//!    staging into the root (`renameat2` with `RENAME_NOREPLACE`; a name already moved is
//!    skipped, a name in both places is refused).
//! 4. `synced`: the root and staging are fsynced.
//! 5. `cleaned`: the empty staging is removed and the root fsynced. On a resume, the published
//!    tree's snapshot is then checked against the journal's before the journal goes.
//! 6. The journal is removed and the root fsynced: done.
//!
//! One load at a time holds a root (`flock` on it; a second is refused as busy). A refusal
//! removes the staging tree; nothing is published.
//!
//! # The snapshot
//!
//! SHA-256 over the string `computerd-runtime-snapshot-v1\0` followed by one record per entry
//! below the root (the root itself is the destination's and is not part of it), in ascending
//! byte order of the relative path (`a/b`, no leading `./`, components joined by `/`). Numbers
//! are decimal, modes 4-digit octal (`mode & 0o7777`), every field ends with a NUL byte:
//!
//! - directory: `d`, path, uid, gid, mode;
//! - regular file: `f`, path, uid, gid, mode, size, hex SHA-256 of its content;
//! - a further name of a file already recorded (a hard link; the first name in this order is
//!   the one recorded as `f`): `h`, path, that first path;
//! - symlink: `l`, path, uid, gid, target (its mode is not part of it: Linux has none).
//!
//! It is computed from the archive's members as they are read, and from the loaded tree by a
//! walk (`readdir`, `fstatat` without following, files opened `O_NOFOLLOW`), and the two must
//! match. mtimes are kept but are not part of the snapshot.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::io::BufRead;
use std::io::Read;
use std::io::Seek;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;

use nix::fcntl::AtFlags;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::sys::time::TimeSpec;
use sha2::Digest;
use sha2::Sha256;

use crate::nofollow;

/// At most this many bytes of content (the sum of regular members' declared sizes) per archive.
pub const MAX_BYTES: u64 = 8 << 30;
/// At most this many members per archive (the root's own member, `./`, included).
pub const MAX_ENTRIES: u64 = 100_000;
/// The staging directory, in the destination root.
pub const STAGING: &str = ".computerd-load-staging";
/// The publish journal, in the destination root.
pub const JOURNAL: &str = ".computerd-load-journal";
const JOURNAL_TMP: &str = ".computerd-load-journal.tmp";
/// Top-level names starting with this are the loader's; an archive may not hold one.
pub const RESERVED_PREFIX: &str = ".computerd-load-";
/// The runtime volume's layout marker (written by the agent, see `crate::layout`): reserved at
/// the top of a root like the loader's own names, and never part of a snapshot.
pub const LAYOUT_MARKER: &str = ".computerd-runtime-layout";

/// Whether a top-level name of a root is the loader's or the layout marker.
fn reserved(name: &[u8]) -> bool {
    name.starts_with(RESERVED_PREFIX.as_bytes()) || name == LAYOUT_MARKER.as_bytes()
}
/// Set to a step's name (see [`STEPS`]), the binary pauses there: it prints [`PAUSE_MARKER`]
/// and the step's name on a line of stderr, then waits forever (to be killed).
pub const PAUSE_ENV: &str = "COMPUTERD_LOAD_PAUSE_AT";
/// What a paused loader prints on stderr before the step's name.
pub const PAUSE_MARKER: &str = "computer-agent load-runtime: paused at ";
/// The steps the loader can pause at, in order.
pub const STEPS: [&str; 6] = ["staged", "journaled", "moving", "moved", "synced", "cleaned"];
const SNAPSHOT_TAG: &[u8] = b"computerd-runtime-snapshot-v1\0";
/// Threads hashing files and fsyncing directories in a walk (fsyncs wait on the disk, not the
/// CPU).
const WALK_THREADS: usize = 8;

/// A runtime snapshot: see the module's documentation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Snapshot(pub [u8; 32]);

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Snapshot({self})")
    }
}

impl std::str::FromStr for Snapshot {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| format!("not a snapshot (64 hex digits): {s:?}"))?;
        Ok(Snapshot(out))
    }
}

/// The limits of one archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of content (declared sizes of regular members, sparse ones at their real size).
    pub max_bytes: u64,
    /// Members, the root's own included.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: MAX_BYTES, max_entries: MAX_ENTRIES }
    }
}

/// Why a load was refused or failed. Each names its reason ([`LoadError::reason`]) and, where
/// there is one, the member ([`LoadError::member`]).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The loader keeps numeric owners: only root can.
    #[error("the runtime loader must run as root (it keeps numeric owners)")]
    NotRoot,
    /// The destination root is not a root-owned directory closed to group and others' writes.
    #[error("the destination root {path} is not protected: {why}")]
    UnprotectedRoot {
        /// The destination root.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// Another load holds the destination root.
    #[error("the destination root {path} is busy: another load holds it")]
    Busy {
        /// The destination root.
        path: String,
    },
    /// Something is already in the destination root.
    #[error("the destination root {path} is not empty ({name} is there): refusing to overwrite")]
    DestinationNotEmpty {
        /// The destination root.
        path: String,
        /// A name found there.
        name: String,
    },
    /// The destination root is not the directory the journal (or the load) was made for.
    #[error("the destination root {path} moved: {was} was expected, it is now {now}: refusing to publish")]
    DestinationMoved {
        /// The destination root.
        path: String,
        /// The device and inode expected.
        was: String,
        /// The device and inode found.
        now: String,
    },
    /// `--expect-snapshot` was given and is not the archive's (or the journal's).
    #[error("snapshot mismatch: {expected} was expected, the runtime's is {found}: refusing to overwrite")]
    SnapshotMismatch {
        /// The snapshot asked for.
        expected: Snapshot,
        /// The archive's or the journal's.
        found: Snapshot,
    },
    /// The loaded tree is not what the archive holds.
    #[error("the loaded tree's snapshot {loaded} is not the archive's {archive}: refusing to publish")]
    VerifyMismatch {
        /// The archive's (or the journal's) snapshot.
        archive: Snapshot,
        /// The loaded tree's.
        loaded: Snapshot,
    },
    /// Past [`Limits::max_entries`].
    #[error("{member}: more than {limit} entries in the archive")]
    TooManyEntries {
        /// The first member past the limit.
        member: String,
        /// The limit.
        limit: u64,
    },
    /// Past [`Limits::max_bytes`].
    #[error("{member}: declares {declared} bytes, past the limit of {limit} bytes with the {before} bytes before it")]
    TooLarge {
        /// The member.
        member: String,
        /// Its declared size (a sparse file's real size).
        declared: u64,
        /// The content before it.
        before: u64,
        /// The limit.
        limit: u64,
    },
    /// A FIFO or a device.
    #[error("{member}: a special file ({kind}) is refused")]
    SpecialFile {
        /// The member.
        member: String,
        /// What it is.
        kind: &'static str,
    },
    /// A member type the loader does not load.
    #[error("{member}: member type {kind} is not supported")]
    UnsupportedType {
        /// The member.
        member: String,
        /// Its type.
        kind: String,
    },
    /// An absolute member path.
    #[error("{member}: an absolute path escapes the root")]
    AbsolutePath {
        /// The member.
        member: String,
    },
    /// A `..` component.
    #[error("{member}: a `..` component escapes the root")]
    DotDot {
        /// The member.
        member: String,
    },
    /// Below a symlink of the same archive.
    #[error("{member}: {symlink} is a symlink in the archive; writing through it would escape the root")]
    ThroughSymlink {
        /// The member.
        member: String,
        /// The symlink on its path.
        symlink: String,
    },
    /// Below a member that is not a directory.
    #[error("{member}: its parent {parent} is not a directory")]
    ParentNotDirectory {
        /// The member.
        member: String,
        /// Its parent.
        parent: String,
    },
    /// Its parent directory was not an earlier member.
    #[error("{member}: its parent directory {parent} is not an earlier member of the archive")]
    UndeclaredParent {
        /// The member.
        member: String,
        /// Its parent.
        parent: String,
    },
    /// The same path twice.
    #[error("{member}: a duplicate member (the same path is an earlier member)")]
    Duplicate {
        /// The member.
        member: String,
    },
    /// A hard link out of the root.
    #[error("{member}: a hard link to {target}, outside the root")]
    HardlinkOutside {
        /// The member.
        member: String,
        /// Its target.
        target: String,
    },
    /// A hard link to a later or missing member.
    #[error("{member}: a hard link to {target}, which is not an earlier member (a later or a missing one)")]
    HardlinkNotEarlier {
        /// The member.
        member: String,
        /// Its target.
        target: String,
    },
    /// A hard link to a directory, symlink or the root.
    #[error("{member}: a hard link to {target}, which is not a regular file")]
    HardlinkNotRegular {
        /// The member.
        member: String,
        /// Its target.
        target: String,
    },
    /// A top-level name the loader keeps for itself.
    #[error("{member}: the name is reserved for the loader")]
    ReservedName {
        /// The member.
        member: String,
    },
    /// A header the loader will not take as it is.
    #[error("{member}: {why}")]
    BadMember {
        /// The member.
        member: String,
        /// What is wrong.
        why: String,
    },
    /// The archive cannot be read.
    #[error("the archive cannot be read ({at}): {why}")]
    Malformed {
        /// Where: after which member.
        at: String,
        /// What the reader said.
        why: String,
    },
    /// A file system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// The publish journal is unreadable or disagrees with the tree.
    #[error("the publish journal in {path}: {why}")]
    Journal {
        /// The destination root.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The loaded tree holds something the loader does not make.
    #[error("{member}: the loaded tree holds {what}")]
    UnexpectedInTree {
        /// The path below the walked directory.
        member: String,
        /// What was found.
        what: String,
    },
}

impl LoadError {
    /// The reason, as a stable snake_case word.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadError::NotRoot => "not_root",
            LoadError::UnprotectedRoot { .. } => "unprotected_root",
            LoadError::Busy { .. } => "busy",
            LoadError::DestinationNotEmpty { .. } => "destination_not_empty",
            LoadError::DestinationMoved { .. } => "destination_moved",
            LoadError::SnapshotMismatch { .. } => "snapshot_mismatch",
            LoadError::VerifyMismatch { .. } => "verify_mismatch",
            LoadError::TooManyEntries { .. } => "too_many_entries",
            LoadError::TooLarge { .. } => "too_large",
            LoadError::SpecialFile { .. } => "special_file",
            LoadError::UnsupportedType { .. } => "unsupported_type",
            LoadError::AbsolutePath { .. } => "absolute_path",
            LoadError::DotDot { .. } => "path_escape",
            LoadError::ThroughSymlink { .. } => "escape_through_symlink",
            LoadError::ParentNotDirectory { .. } => "parent_not_directory",
            LoadError::UndeclaredParent { .. } => "undeclared_parent",
            LoadError::Duplicate { .. } => "duplicate_member",
            LoadError::HardlinkOutside { .. } => "hardlink_outside_root",
            LoadError::HardlinkNotEarlier { .. } => "hardlink_not_earlier",
            LoadError::HardlinkNotRegular { .. } => "hardlink_not_regular",
            LoadError::ReservedName { .. } => "reserved_name",
            LoadError::BadMember { .. } => "bad_member",
            LoadError::Malformed { .. } => "malformed_archive",
            LoadError::Io { .. } => "io",
            LoadError::Journal { .. } => "journal",
            LoadError::UnexpectedInTree { .. } => "unexpected_in_tree",
        }
    }

    /// The member the refusal is about, if it is about one.
    pub fn member(&self) -> Option<&str> {
        match self {
            LoadError::TooManyEntries { member, .. }
            | LoadError::TooLarge { member, .. }
            | LoadError::SpecialFile { member, .. }
            | LoadError::UnsupportedType { member, .. }
            | LoadError::AbsolutePath { member }
            | LoadError::DotDot { member }
            | LoadError::ThroughSymlink { member, .. }
            | LoadError::ParentNotDirectory { member, .. }
            | LoadError::UndeclaredParent { member, .. }
            | LoadError::Duplicate { member }
            | LoadError::HardlinkOutside { member, .. }
            | LoadError::HardlinkNotEarlier { member, .. }
            | LoadError::HardlinkNotRegular { member, .. }
            | LoadError::ReservedName { member }
            | LoadError::BadMember { member, .. }
            | LoadError::UnexpectedInTree { member, .. } => Some(member),
            _ => None,
        }
    }
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn nix_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> LoadError {
    let what = what.into();
    move |source| LoadError::Io { what, source }
}

fn nix_err(what: impl Into<String>) -> impl FnOnce(nix::Error) -> LoadError {
    let what = what.into();
    move |e| LoadError::Io { what, source: nix_io(e) }
}

// ---------------------------------------------------------------------------------------------
// Members and their checks

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Special(&'static str),
    Unsupported(u8),
}

/// One archive member, as its header (and PAX records) describe it.
#[derive(Debug)]
struct Member {
    /// The path as the archive spells it, for messages.
    raw: Vec<u8>,
    /// Normalized (set by [`Checker::check`]): plain names joined by `/`; empty for the root.
    path: Vec<u8>,
    kind: Kind,
    size: u64,
    sparse: bool,
    /// A symlink's target as it is; a hard link's target as the archive spells it.
    link: Option<Vec<u8>>,
    /// A hard link's target, normalized (set by [`Checker::check`]).
    link_path: Vec<u8>,
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: (i64, i64),
}

impl Member {
    fn name(&self) -> String {
        show(&self.raw)
    }
}

fn member_of<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Member, LoadError> {
    use tar::EntryType as T;
    let raw = entry.path_bytes().into_owned();
    let bad = |why: String| LoadError::BadMember { member: show(&raw), why };
    let header = entry.header();
    let et = header.entry_type();
    let (kind, sparse) = match et {
        T::Regular | T::Continuous => (Kind::File, false),
        T::GNUSparse => (Kind::File, true),
        T::Directory => (Kind::Dir, false),
        T::Symlink => (Kind::Symlink, false),
        T::Link => (Kind::Hardlink, false),
        T::Fifo => (Kind::Special("FIFO"), false),
        T::Char => (Kind::Special("character device"), false),
        T::Block => (Kind::Special("block device"), false),
        other => (Kind::Unsupported(other.as_byte()), false),
    };
    let owner = |what: &str, v: io::Result<u64>| -> Result<u32, LoadError> {
        match v {
            Ok(n) if n < u64::from(u32::MAX) => Ok(n as u32),
            Ok(n) => Err(bad(format!("{what} {n} is out of range"))),
            Err(e) => Err(bad(format!("unreadable {what}: {e}"))),
        }
    };
    let uid = owner("uid", header.uid())?;
    let gid = owner("gid", header.gid())?;
    let mode = header.mode().map_err(|e| bad(format!("unreadable mode: {e}")))? & 0o7777;
    let mut mtime = (header.mtime().map(|t| i64::try_from(t).unwrap_or(i64::MAX)).unwrap_or(0), 0i64);
    let link = entry.link_name_bytes().map(|l| l.into_owned());
    let size = entry.size();
    if let Some(pax) = entry.pax_extensions().map_err(|e| bad(format!("unreadable PAX records: {e}")))? {
        for ext in pax {
            let ext = ext.map_err(|e| bad(format!("unreadable PAX record: {e}")))?;
            let key = ext.key_bytes();
            if key.starts_with(b"GNU.sparse.") {
                return Err(bad("PAX sparse files (GNU.sparse.*) are not supported".into()));
            }
            if key == b"mtime" {
                mtime = pax_time(ext.value_bytes()).unwrap_or(mtime);
            }
        }
    }
    Ok(Member { raw, path: Vec::new(), kind, size, sparse, link, link_path: Vec::new(), uid, gid, mode, mtime })
}

/// A PAX time (`1700000000.25`) as seconds and nanoseconds.
fn pax_time(v: &[u8]) -> Option<(i64, i64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let nanos = if digits.is_empty() { 0 } else { digits.parse::<i64>().ok()? * 10i64.pow(9 - digits.len() as u32) };
    Some((secs, nanos))
}

enum PathProblem {
    Absolute,
    DotDot,
}

/// The plain names of an archive path joined by `/` (`.` and empty components dropped);
/// empty for the root.
fn normalize(raw: &[u8]) -> Result<Vec<u8>, PathProblem> {
    if raw.first() == Some(&b'/') {
        return Err(PathProblem::Absolute);
    }
    let mut out = Vec::with_capacity(raw.len());
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(PathProblem::DotDot),
            name => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(name);
            }
        }
    }
    Ok(out)
}

/// The parent of a normalized path (empty for the root) and its last name.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// The checks of the archive's members in order: the same for the header-only pass and the
/// loading pass.
struct Checker {
    limits: Limits,
    entries: u64,
    bytes: u64,
    seen: HashMap<Vec<u8>, Kind>,
    root_seen: bool,
}

impl Checker {
    fn new(limits: Limits) -> Self {
        Checker { limits, entries: 0, bytes: 0, seen: HashMap::new(), root_seen: false }
    }

    fn check(&mut self, m: &mut Member) -> Result<(), LoadError> {
        let member = m.name();
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(LoadError::TooManyEntries { member, limit: self.limits.max_entries });
        }
        m.path = match normalize(&m.raw) {
            Ok(p) => p,
            Err(PathProblem::Absolute) => return Err(LoadError::AbsolutePath { member }),
            Err(PathProblem::DotDot) => return Err(LoadError::DotDot { member }),
        };
        match m.kind {
            Kind::Special(kind) => return Err(LoadError::SpecialFile { member, kind }),
            Kind::Unsupported(b) => {
                let kind = format!("{:?} ({})", b as char, tar::EntryType::new(b).as_byte());
                return Err(LoadError::UnsupportedType { member, kind });
            }
            _ => {}
        }
        if m.path.is_empty() {
            if m.kind != Kind::Dir {
                return Err(LoadError::BadMember { member, why: "the root must be a directory".into() });
            }
            if std::mem::replace(&mut self.root_seen, true) {
                return Err(LoadError::Duplicate { member });
            }
            return Ok(());
        }
        let top = m.path.split(|b| *b == b'/').next().unwrap_or_default();
        if reserved(top) {
            return Err(LoadError::ReservedName { member });
        }
        if self.seen.contains_key(&m.path) {
            return Err(LoadError::Duplicate { member });
        }
        let (parent, _) = split(&m.path);
        if !parent.is_empty() {
            match self.seen.get(parent) {
                Some(Kind::Dir) => {}
                Some(Kind::Symlink) => return Err(LoadError::ThroughSymlink { member, symlink: show(parent) }),
                Some(_) => return Err(LoadError::ParentNotDirectory { member, parent: show(parent) }),
                None => {
                    // A symlink further up makes it an escape, not only a missing parent.
                    let mut up = parent;
                    while !up.is_empty() {
                        up = split(up).0;
                        if self.seen.get(up) == Some(&Kind::Symlink) {
                            return Err(LoadError::ThroughSymlink { member, symlink: show(up) });
                        }
                    }
                    return Err(LoadError::UndeclaredParent { member, parent: show(parent) });
                }
            }
        }
        if m.kind != Kind::File && m.size != 0 {
            let why = format!("a {} member carries {} bytes of data", kind_name(m.kind), m.size);
            return Err(LoadError::BadMember { member, why });
        }
        match m.kind {
            Kind::File => {
                if m.size > self.limits.max_bytes - self.bytes {
                    return Err(LoadError::TooLarge {
                        member,
                        declared: m.size,
                        before: self.bytes,
                        limit: self.limits.max_bytes,
                    });
                }
                self.bytes += m.size;
            }
            Kind::Symlink if m.link.as_deref().is_none_or(|l| l.is_empty()) => {
                return Err(LoadError::BadMember { member, why: "a symlink without a target".into() });
            }
            Kind::Hardlink => {
                let raw = m.link.clone().unwrap_or_default();
                let target = show(&raw);
                m.link_path = match normalize(&raw) {
                    Ok(p) => p,
                    Err(_) => return Err(LoadError::HardlinkOutside { member, target }),
                };
                if m.link_path.is_empty() {
                    return Err(LoadError::HardlinkNotRegular { member, target });
                }
                match self.seen.get(&m.link_path) {
                    Some(Kind::File | Kind::Hardlink) => {}
                    Some(_) => return Err(LoadError::HardlinkNotRegular { member, target }),
                    None => return Err(LoadError::HardlinkNotEarlier { member, target }),
                }
            }
            _ => {}
        }
        self.seen.insert(m.path.clone(), m.kind);
        Ok(())
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "regular file",
        Kind::Dir => "directory",
        Kind::Symlink => "symlink",
        Kind::Hardlink => "hard link",
        Kind::Special(s) => s,
        Kind::Unsupported(_) => "unsupported",
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots

#[derive(Clone, Debug)]
enum Node {
    Dir { uid: u32, gid: u32, mode: u32 },
    File { uid: u32, gid: u32, mode: u32, size: u64, digest: [u8; 32], inode: (u64, u64) },
    Symlink { uid: u32, gid: u32, target: Vec<u8> },
}

#[derive(Clone, Debug)]
struct Record {
    path: Vec<u8>,
    node: Node,
}

fn snapshot_of(mut records: Vec<Record>) -> Snapshot {
    records.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    let mut h = Sha256::new();
    h.update(SNAPSHOT_TAG);
    let mut first: HashMap<(u64, u64), &[u8]> = HashMap::new();
    let field = |h: &mut Sha256, bytes: &[u8]| {
        h.update(bytes);
        h.update([0u8]);
    };
    for r in &records {
        match &r.node {
            Node::Dir { uid, gid, mode } => {
                field(&mut h, b"d");
                field(&mut h, &r.path);
                field(&mut h, uid.to_string().as_bytes());
                field(&mut h, gid.to_string().as_bytes());
                field(&mut h, format!("{mode:04o}").as_bytes());
            }
            Node::File { uid, gid, mode, size, digest, inode } => {
                if let Some(p) = first.get(inode) {
                    field(&mut h, b"h");
                    field(&mut h, &r.path);
                    field(&mut h, p);
                } else {
                    first.insert(*inode, &r.path);
                    field(&mut h, b"f");
                    field(&mut h, &r.path);
                    field(&mut h, uid.to_string().as_bytes());
                    field(&mut h, gid.to_string().as_bytes());
                    field(&mut h, format!("{mode:04o}").as_bytes());
                    field(&mut h, size.to_string().as_bytes());
                    field(&mut h, hex::encode(digest).as_bytes());
                }
            }
            Node::Symlink { uid, gid, target } => {
                field(&mut h, b"l");
                field(&mut h, &r.path);
                field(&mut h, uid.to_string().as_bytes());
                field(&mut h, gid.to_string().as_bytes());
                field(&mut h, target);
            }
        }
    }
    Snapshot(h.finalize().into())
}

/// The snapshot of the tree below `dir` (the loader's reserved names at its top skipped), read
/// without following any symlink.
pub fn snapshot_tree(dir: &Path) -> Result<Snapshot, LoadError> {
    let fd = nofollow::open_start(dir).map_err(io_err(format!("cannot open {}", dir.display())))?;
    Ok(snapshot_of(walk(fd.as_fd(), true, false, &ReadBack::new())?.records))
}

/// The snapshot of an archive's members, computed from the archive alone (nothing is written):
/// the same checks as a load, the same limits.
pub fn snapshot_archive(archive: impl Read, limits: Limits) -> Result<(Snapshot, u64, u64), LoadError> {
    let mut ar = tar::Archive::new(gunzip(archive)?);
    let mut checker = Checker::new(limits);
    let mut src = Source::default();
    let mut digests = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let entries = ar.entries().map_err(|e| LoadError::Malformed { at: "its start".into(), why: e.to_string() })?;
    let mut last: Option<String> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| malformed(&last, e))?;
        let mut m = member_of(&mut entry)?;
        checker.check(&mut m)?;
        if m.kind == Kind::File {
            let mut h = Sha256::new();
            let mut left = m.size;
            while left > 0 {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = entry.read(&mut buf[..want]).map_err(|e| malformed(&Some(m.name()), e))?;
                if n == 0 {
                    return Err(malformed(&Some(m.name()), io::ErrorKind::UnexpectedEof.into()));
                }
                h.update(&buf[..n]);
                left -= n as u64;
            }
            digests.push(h.finalize().into());
        }
        src.add(&m);
        last = Some(m.name());
    }
    src.set_digests(&digests);
    Ok((snapshot_of(src.records), checker.entries, checker.bytes))
}

/// The archive side of a snapshot: a record per member, hard links sharing their target's node
/// (its inode key is the regular member's number among the archive's regular members, the
/// order of their digests).
#[derive(Default)]
struct Source {
    records: Vec<Record>,
    files: HashMap<Vec<u8>, usize>,
    regular: u64,
}

impl Source {
    fn add(&mut self, m: &Member) {
        if m.path.is_empty() {
            return;
        }
        let node = match m.kind {
            Kind::Dir => Node::Dir { uid: m.uid, gid: m.gid, mode: m.mode },
            Kind::File => {
                let i = self.records.len();
                self.files.insert(m.path.clone(), i);
                let inode = (0, self.regular);
                self.regular += 1;
                Node::File { uid: m.uid, gid: m.gid, mode: m.mode, size: m.size, digest: [0; 32], inode }
            }
            Kind::Symlink => Node::Symlink { uid: m.uid, gid: m.gid, target: m.link.clone().unwrap_or_default() },
            Kind::Hardlink => {
                // The checker made sure the target is an earlier file (or link to one).
                let Some(&i) = self.files.get(&m.link_path) else { return };
                let node = self.records[i].node.clone();
                self.files.insert(m.path.clone(), i);
                node
            }
            Kind::Special(_) | Kind::Unsupported(_) => return,
        };
        self.records.push(Record { path: m.path.clone(), node });
    }

    /// The digests of the regular members, in their order.
    fn set_digests(&mut self, digests: &[[u8; 32]]) {
        for r in &mut self.records {
            if let Node::File { digest, inode: (_, n), .. } = &mut r.node
                && let Some(d) = usize::try_from(*n).ok().and_then(|n| digests.get(n))
            {
                *digest = *d;
            }
        }
    }
}

fn malformed(last: &Option<String>, e: io::Error) -> LoadError {
    let at = match last {
        Some(m) => format!("after {m}"),
        None => "at its start".into(),
    };
    LoadError::Malformed { at, why: e.to_string() }
}

/// The archive, decompressed when it starts with gzip's magic.
fn gunzip<'a>(archive: impl Read + 'a) -> Result<Box<dyn Read + 'a>, LoadError> {
    let mut r = io::BufReader::with_capacity(1 << 20, archive);
    let head = r.fill_buf().map_err(io_err("cannot read the archive"))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(r)))
    } else {
        Ok(Box::new(r))
    }
}

// ---------------------------------------------------------------------------------------------
// The walk of a loaded tree

struct Walked {
    records: Vec<Record>,
}

enum Job {
    File { dir: Arc<OwnedFd>, name: OsString, path: Vec<u8> },
    SyncDir { dir: Arc<OwnedFd>, path: Vec<u8> },
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        p.extend_from_slice(parent);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// What was read back from a file once written: its digest holds while the file's
/// size, mtime and ctime are still these (any change of content or metadata moves the ctime).
#[derive(Clone, Copy, Debug)]
struct Known {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    digest: [u8; 32],
}

/// Files read back, by device and inode.
type ReadBack = HashMap<(u64, u64), Known>;

fn known_of(st: &libc::stat, digest: [u8; 32]) -> Known {
    Known {
        size: st.st_size as u64,
        mtime: (st.st_mtime, st.st_mtime_nsec),
        ctime: (st.st_ctime, st.st_ctime_nsec),
        digest,
    }
}

/// Walks the tree below `base` without following symlinks: a record per entry (the loader's
/// reserved names at the top skipped when `skip_reserved`). A file's content digest is the one
/// in `known` when its size, mtime and ctime are those it was read back with, else the file is
/// read and hashed (on several threads). With `sync`, every directory (`base` included) is
/// fsynced too (the loader syncs the files' file system before).
fn walk(base: BorrowedFd<'_>, skip_reserved: bool, sync: bool, known: &ReadBack) -> Result<Walked, LoadError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(256);
    let rx = Mutex::new(rx);
    let failed: Mutex<Option<LoadError>> = Mutex::new(None);
    let fail = |e: LoadError| {
        let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
    };
    let mut records = Vec::new();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..WALK_THREADS)
            .map(|_| {
                let rx = &rx;
                let fail = &fail;
                let failed = &failed;
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut buf = vec![0u8; 256 << 10];
                    loop {
                        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                            Ok(j) => j,
                            Err(_) => return out,
                        };
                        if failed.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                            continue;
                        }
                        match job {
                            Job::File { dir, name, path } => match hash_file(dir.as_fd(), &name, &path, &mut buf) {
                                Ok(r) => out.push(r),
                                Err(e) => fail(e),
                            },
                            Job::SyncDir { dir, path } => {
                                if let Err(e) = nix::unistd::fsync(dir.as_fd()) {
                                    fail(nix_err(format!("cannot fsync the directory {}", show(&path)))(e));
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        if let Err(e) = walk_dirs(base, skip_reserved, sync, known, &tx, &mut records) {
            fail(e);
        }
        drop(tx);
        for w in workers {
            match w.join() {
                Ok(mut out) => records.append(&mut out),
                Err(_) => {
                    fail(LoadError::Io { what: "a walk thread panicked".into(), source: io::Error::other("panic") })
                }
            }
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(Walked { records })
}

fn walk_dirs(
    base: BorrowedFd<'_>,
    skip_reserved: bool,
    sync: bool,
    known: &ReadBack,
    tx: &std::sync::mpsc::SyncSender<Job>,
    records: &mut Vec<Record>,
) -> Result<(), LoadError> {
    let mut queue: std::collections::VecDeque<Vec<u8>> = [Vec::new()].into();
    while let Some(rel) = queue.pop_front() {
        let what = || format!("cannot open the directory {}", if rel.is_empty() { ".".into() } else { show(&rel) });
        let dir = nofollow::walk_dirs(base, Path::new(OsStr::from_bytes(&rel))).map_err(io_err(what()))?;
        let dir = Arc::new(dir);
        let mut listing = open_listing(dir.as_fd()).map_err(nix_err(what()))?;
        for entry in listing.iter() {
            let entry = entry.map_err(nix_err(format!("cannot list {}", show(&rel))))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if rel.is_empty() && skip_reserved && reserved(name) {
                continue;
            }
            let path = join(&rel, name);
            let name = OsStr::from_bytes(name);
            let st = nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(nix_err(format!("cannot stat {}", show(&path))))?;
            let (uid, gid, mode) = (st.st_uid, st.st_gid, st.st_mode & 0o7777);
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => {
                    records.push(Record { path: path.clone(), node: Node::Dir { uid, gid, mode } });
                    queue.push_back(path);
                }
                libc::S_IFLNK => {
                    let target = nix::fcntl::readlinkat(dir.as_fd(), name)
                        .map_err(nix_err(format!("cannot read the symlink {}", show(&path))))?;
                    records.push(Record { path, node: Node::Symlink { uid, gid, target: target.into_vec_bytes() } });
                }
                libc::S_IFREG => {
                    if let Some(k) = known.get(&(st.st_dev, st.st_ino)) {
                        let now = known_of(&st, k.digest);
                        if (now.size, now.mtime, now.ctime) == (k.size, k.mtime, k.ctime) {
                            let inode = (st.st_dev, st.st_ino);
                            let node = Node::File { uid, gid, mode, size: k.size, digest: k.digest, inode };
                            records.push(Record { path, node });
                            continue;
                        }
                    }
                    let job = Job::File { dir: dir.clone(), name: name.to_owned(), path };
                    if tx.send(job).is_err() {
                        return Ok(());
                    }
                }
                other => {
                    return Err(LoadError::UnexpectedInTree {
                        member: show(&path),
                        what: format!("a special file (type {:o})", other),
                    });
                }
            }
        }
        if sync {
            let _ = tx.send(Job::SyncDir { dir, path: rel });
        }
    }
    Ok(())
}

trait IntoBytes {
    fn into_vec_bytes(self) -> Vec<u8>;
}

impl IntoBytes for OsString {
    fn into_vec_bytes(self) -> Vec<u8> {
        std::os::unix::ffi::OsStringExt::into_vec(self)
    }
}

fn hash_file(dir: BorrowedFd<'_>, name: &OsStr, path: &[u8], buf: &mut [u8]) -> Result<Record, LoadError> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(nix_err(format!("cannot open {}", show(path))))?;
    let st = nix::sys::stat::fstat(&fd).map_err(nix_err(format!("cannot stat {}", show(path))))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(LoadError::UnexpectedInTree { member: show(path), what: "a file that changed type".into() });
    }
    let mut file = std::fs::File::from(fd);
    let mut h = Sha256::new();
    let mut size = 0u64;
    loop {
        let n = file.read(buf).map_err(io_err(format!("cannot read {}", show(path))))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(Record {
        path: path.to_vec(),
        node: Node::File {
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode & 0o7777,
            size,
            digest: h.finalize().into(),
            inode: (st.st_dev, st.st_ino),
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Loading into staging

/// A directory's path, uid, gid, mode and mtime, set once its members are in.
type DirMeta = (Vec<u8>, u32, u32, u32, (i64, i64));

/// The staging tree being written: the last parent directory stays open (archives list a
/// directory's members together), directories' owners, modes and mtimes are set at the end.
struct Tree<'a> {
    staging: BorrowedFd<'a>,
    cached: Option<(Vec<u8>, OwnedFd)>,
    dirs: Vec<DirMeta>,
}

impl<'a> Tree<'a> {
    fn parent(&mut self, parent: &[u8]) -> io::Result<BorrowedFd<'_>> {
        if parent.is_empty() {
            return Ok(self.staging);
        }
        if self.cached.as_ref().is_none_or(|(p, _)| p.as_slice() != parent) {
            let fd = nofollow::walk_dirs(self.staging, Path::new(OsStr::from_bytes(parent)))?;
            self.cached = Some((parent.to_vec(), fd));
        }
        match &self.cached {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Err(io::Error::other("no parent")),
        }
    }
}

fn times(mtime: (i64, i64)) -> TimeSpec {
    TimeSpec::new(mtime.0, mtime.1)
}

/// Loads the archive's members into the empty directory `staging`: the checks before each
/// member, then its write. Answers the archive's records, entries and bytes, and the files read
/// back once written.
fn load_into<R: Read>(
    archive: R,
    staging: BorrowedFd<'_>,
    limits: Limits,
) -> Result<(Vec<Record>, u64, u64, ReadBack), LoadError> {
    let mut ar = tar::Archive::new(archive);
    let mut checker = Checker::new(limits);
    let mut src = Source::default();
    let mut tree = Tree { staging, cached: None, dirs: Vec::new() };
    let mut last: Option<String> = None;
    let reader = ReadBackPool::start(READ_BACK_THREADS);
    let hasher = Hasher::start();
    let entries = ar.entries().map_err(|e| malformed(&None, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| malformed(&last, e))?;
        let mut m = member_of(&mut entry)?;
        checker.check(&mut m)?;
        if m.path.is_empty() {
            last = Some(m.name());
            continue;
        }
        let (parent, name) = split(&m.path);
        let name = OsStr::from_bytes(name);
        let member = m.name();
        let dir = tree.parent(parent).map_err(io_err(format!("{member}: cannot open its parent")))?;
        match m.kind {
            Kind::Dir => {
                nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(0o700))
                    .map_err(nix_err(format!("{member}: cannot make the directory")))?;
                tree.dirs.push((m.path.clone(), m.uid, m.gid, m.mode, m.mtime));
            }
            Kind::File => {
                let file = write_file(dir, name, &m, &mut entry, &hasher)?;
                reader.send(file, member.clone())?;
            }
            Kind::Symlink => {
                let target = OsStr::from_bytes(m.link.as_deref().unwrap_or_default());
                nix::unistd::symlinkat(target, dir, name)
                    .map_err(nix_err(format!("{member}: cannot make the symlink")))?;
                nix::unistd::fchownat(dir, name, Some(m.uid.into()), Some(m.gid.into()), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(nix_err(format!("{member}: cannot set the symlink's owner")))?;
                let t = times(m.mtime);
                nix::sys::stat::utimensat(dir, name, &t, &t, nix::sys::stat::UtimensatFlags::NoFollowSymlink)
                    .map_err(nix_err(format!("{member}: cannot set the symlink's mtime")))?;
            }
            Kind::Hardlink => {
                let (tparent, tname) = split(&m.link_path);
                let tdir = nofollow::walk_dirs(staging, Path::new(OsStr::from_bytes(tparent)))
                    .map_err(io_err(format!("{member}: cannot open its target's directory")))?;
                let dir = tree.parent(parent).map_err(io_err(format!("{member}: cannot open its parent")))?;
                nix::unistd::linkat(&tdir, OsStr::from_bytes(tname), dir, name, AtFlags::empty())
                    .map_err(nix_err(format!("{member}: cannot make the hard link")))?;
            }
            Kind::Special(_) | Kind::Unsupported(_) => {}
        }
        src.add(&m);
        last = Some(member);
    }
    drop(tree.cached.take());
    let read_back = reader.finish()?;
    src.set_digests(&hasher.finish()?);
    for (path, uid, gid, mode, mtime) in tree.dirs.iter().rev() {
        let what = || format!("{}: cannot set the directory's owner, mode and mtime", show(path));
        let fd = nofollow::walk_dirs(staging, Path::new(OsStr::from_bytes(path))).map_err(io_err(what()))?;
        nix::unistd::fchown(&fd, Some((*uid).into()), Some((*gid).into())).map_err(nix_err(what()))?;
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(*mode)).map_err(nix_err(what()))?;
        let t = times(*mtime);
        nix::sys::stat::futimens(&fd, &t, &t).map_err(nix_err(what()))?;
    }
    Ok((src.records, checker.entries, checker.bytes, read_back))
}

/// Creates the new file `name` in `dir` for reading and writing (`O_EXCL`, never through a
/// symlink), mode 0600 until its own is set.
fn create_rw(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::fs::File> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(nix_io)?;
    Ok(std::fs::File::from(fd))
}

/// Writes one regular member: a new file (never through a symlink), its bytes handed to the
/// archive's hasher as they pass (a sparse member's zero runs left as holes), then its owner,
/// mode and mtime set through its descriptor. Answers the file, open, to be read back.
fn write_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    m: &Member,
    data: &mut impl Read,
    hasher: &Hasher,
) -> Result<std::fs::File, LoadError> {
    let member = m.name();
    let mut file = create_rw(dir, name).map_err(io_err(format!("{member}: cannot create the file")))?;
    let mut left = m.size;
    let mut hole = 0u64;
    while left > 0 {
        let mut buf = hasher.buffer()?;
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match data.read(&mut buf[..want]) {
            Ok(0) => {
                let why = "the archive ends inside this member".to_string();
                return Err(LoadError::Malformed { at: member, why });
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                hasher.give_back(buf);
                continue;
            }
            Err(e) => return Err(LoadError::Malformed { at: member, why: e.to_string() }),
        };
        left -= n as u64;
        let chunk = &buf[..n];
        if m.sparse && chunk.iter().all(|b| *b == 0) {
            hole += n as u64;
        } else {
            if hole > 0 {
                file.seek(io::SeekFrom::Current(hole as i64)).map_err(io_err(format!("{member}: cannot seek")))?;
                hole = 0;
            }
            file.write_all(chunk).map_err(io_err(format!("{member}: cannot write")))?;
        }
        hasher.data(buf, n)?;
    }
    hasher.end_file()?;
    if hole > 0 {
        file.set_len(m.size).map_err(io_err(format!("{member}: cannot set its size")))?;
    }
    let what = || format!("{member}: cannot set the file's owner, mode and mtime");
    nix::unistd::fchown(&file, Some(m.uid.into()), Some(m.gid.into())).map_err(nix_err(what()))?;
    nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(m.mode)).map_err(nix_err(what()))?;
    let t = times(m.mtime);
    nix::sys::stat::futimens(&file, &t, &t).map_err(nix_err(what()))?;
    Ok(file)
}

/// The SHA-256 of each regular member's bytes as the archive gives them, on a thread of its own
/// beside the writes: buffers go to it filled and come back empty.
struct Hasher {
    tx: Option<std::sync::mpsc::SyncSender<HashMsg>>,
    free_tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    free: std::sync::mpsc::Receiver<Vec<u8>>,
    worker: Option<std::thread::JoinHandle<Vec<[u8; 32]>>>,
}

/// A filled buffer and its length, or (`None`) the end of the current file.
type HashMsg = Option<(Vec<u8>, usize)>;

const HASH_BUFFERS: usize = 16;
const HASH_BUFFER: usize = 256 << 10;

impl Hasher {
    fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<HashMsg>(HASH_BUFFERS + 1);
        let (free_tx, free) = std::sync::mpsc::sync_channel::<Vec<u8>>(HASH_BUFFERS);
        for _ in 0..HASH_BUFFERS {
            let _ = free_tx.send(vec![0u8; HASH_BUFFER]);
        }
        let back = free_tx.clone();
        let worker = std::thread::spawn(move || {
            let mut digests = Vec::new();
            let mut h = Sha256::new();
            // `Some` is a buffer of the current file, `None` its end.
            while let Ok(msg) = rx.recv() {
                match msg {
                    Some((buf, n)) => {
                        h.update(&buf[..n]);
                        let _ = back.send(buf);
                    }
                    None => digests.push(std::mem::take(&mut h).finalize().into()),
                }
            }
            digests
        });
        Hasher { tx: Some(tx), free_tx, free, worker: Some(worker) }
    }

    fn gone() -> LoadError {
        LoadError::Io { what: "the hashing thread ended".into(), source: io::Error::other("gone") }
    }

    fn buffer(&self) -> Result<Vec<u8>, LoadError> {
        self.free.recv().map_err(|_| Self::gone())
    }

    fn give_back(&self, buf: Vec<u8>) {
        let _ = self.free_tx.send(buf);
    }

    fn data(&self, buf: Vec<u8>, n: usize) -> Result<(), LoadError> {
        self.tx.as_ref().and_then(|tx| tx.send(Some((buf, n))).ok()).ok_or_else(Self::gone)
    }

    fn end_file(&self) -> Result<(), LoadError> {
        self.tx.as_ref().and_then(|tx| tx.send(None).ok()).ok_or_else(Self::gone)
    }

    /// The digests of the files, in their order in the archive.
    fn finish(mut self) -> Result<Vec<[u8; 32]>, LoadError> {
        drop(self.tx.take());
        self.worker.take().and_then(|w| w.join().ok()).ok_or_else(Self::gone)
    }
}

impl Drop for Hasher {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Threads reading the written files back.
const READ_BACK_THREADS: usize = 4;

/// Reads each file handed to it back through its descriptor, once written, and hashes it, on
/// threads of their own beside the load: the loaded tree's content digests, taken on another
/// core while the next members are written.
struct ReadBackPool {
    tx: Option<std::sync::mpsc::SyncSender<(std::fs::File, String)>>,
    workers: Vec<std::thread::JoinHandle<Option<LoadError>>>,
    read_back: Arc<Mutex<ReadBack>>,
}

impl ReadBackPool {
    fn start(threads: usize) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(std::fs::File, String)>(256);
        let rx = Arc::new(Mutex::new(rx));
        let read_back = Arc::new(Mutex::new(ReadBack::new()));
        let workers = (0..threads)
            .map(|_| {
                let rx = rx.clone();
                let read_back = read_back.clone();
                std::thread::spawn(move || {
                    let mut failed = None;
                    let mut buf = vec![0u8; 256 << 10];
                    loop {
                        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok((file, member)) = next else { return failed };
                        if failed.is_some() {
                            continue;
                        }
                        match read_file_back(&file, &member, &mut buf) {
                            Ok((key, known)) => {
                                read_back.lock().unwrap_or_else(|p| p.into_inner()).insert(key, known);
                            }
                            Err(e) => failed = Some(e),
                        }
                    }
                })
            })
            .collect();
        ReadBackPool { tx: Some(tx), workers, read_back }
    }

    fn send(&self, file: std::fs::File, member: String) -> Result<(), LoadError> {
        match &self.tx {
            Some(tx) if tx.send((file, member)).is_ok() => Ok(()),
            _ => Err(LoadError::Io { what: "the read-back threads ended".into(), source: io::Error::other("gone") }),
        }
    }

    /// Waits for every file; the files read back, or the first failure.
    fn finish(mut self) -> Result<ReadBack, LoadError> {
        if let Some(e) = self.join() {
            return Err(e);
        }
        Ok(std::mem::take(&mut *self.read_back.lock().unwrap_or_else(|p| p.into_inner())))
    }

    fn join(&mut self) -> Option<LoadError> {
        drop(self.tx.take());
        let mut first = None;
        for w in self.workers.drain(..) {
            let e = match w.join() {
                Ok(e) => e,
                Err(_) => Some(LoadError::Io {
                    what: "a read-back thread panicked".into(),
                    source: io::Error::other("panic"),
                }),
            };
            first = first.or(e);
        }
        first
    }
}

impl Drop for ReadBackPool {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// Reads a file just written back through its descriptor and hashes it.
fn read_file_back(file: &std::fs::File, member: &str, buf: &mut [u8]) -> Result<((u64, u64), Known), LoadError> {
    use std::os::unix::fs::FileExt;
    let st = nix::sys::stat::fstat(file).map_err(nix_err(format!("{member}: cannot stat")))?;
    let mut h = Sha256::new();
    let mut at = 0u64;
    loop {
        let n = match file.read_at(buf, at) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(format!("{member}: cannot read it back"))(e)),
        };
        h.update(&buf[..n]);
        at += n as u64;
    }
    let mut known = known_of(&st, h.finalize().into());
    // What was read, not what fstat said: a size that differs is caught by the walk.
    known.size = at;
    Ok(((st.st_dev, st.st_ino), known))
}

/// Checks the members' headers without writing anything (contents skipped by seeking).
fn check_headers(file: &mut std::fs::File, limits: Limits) -> Result<(), LoadError> {
    // Unbuffered: a buffer would be refilled after each seek past a member's contents.
    let mut ar = tar::Archive::new(&mut *file);
    let mut checker = Checker::new(limits);
    let mut last: Option<String> = None;
    for entry in ar.entries_with_seek().map_err(|e| malformed(&None, e))? {
        let mut entry = entry.map_err(|e| malformed(&last, e))?;
        let mut m = member_of(&mut entry)?;
        checker.check(&mut m)?;
        last = Some(m.name());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Publishing

/// The publish journal: what a resumed publish needs, and nothing from the archive.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Journal {
    version: u32,
    snapshot: String,
    entries: u64,
    bytes: u64,
    root_dev: u64,
    root_ino: u64,
    staging_dev: u64,
    staging_ino: u64,
    /// The top-level names to move, hex-encoded (names are bytes).
    names: Vec<String>,
}

/// Where an archive comes from.
pub enum Archive {
    /// A file: when it is a plain tar, its headers are checked before anything is written.
    File(PathBuf),
    /// A stream (standard input), checked member by member.
    Reader(Box<dyn Read + Send>),
}

/// What one load is asked to do.
pub struct Options {
    /// The destination root: a directory owned by root, neither group- nor world-writable.
    pub into: PathBuf,
    /// Refuse unless the runtime's snapshot is this one.
    pub expect_snapshot: Option<Snapshot>,
    /// The archive's limits.
    pub limits: Limits,
    /// Pause at this step (see [`STEPS`]): for the tests that kill the loader there.
    pub pause_at: Option<String>,
    /// A destination that already holds exactly the archive's tree (the same snapshot, read from
    /// the archive without writing) is no refusal: the load was done before.
    pub or_same: bool,
}

impl Options {
    /// Loading into `into` with the default limits.
    pub fn new(into: impl Into<PathBuf>) -> Self {
        Options { into: into.into(), expect_snapshot: None, limits: Limits::default(), pause_at: None, or_same: false }
    }

    fn pause(&self, step: &str) {
        if self.pause_at.as_deref() == Some(step) {
            eprintln!("{PAUSE_MARKER}{step}");
            let _ = io::stderr().flush();
            loop {
                std::thread::park();
            }
        }
    }
}

/// A published runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// Its snapshot (the archive's, and the tree's).
    pub snapshot: Snapshot,
    /// The archive's members (its root's own included).
    pub entries: u64,
    /// Bytes of content.
    pub bytes: u64,
    /// Whether this run finished a publish an earlier run had journaled.
    pub resumed: bool,
}

fn dev_ino(fd: BorrowedFd<'_>, what: &str) -> Result<(u64, u64), LoadError> {
    let st = nix::sys::stat::fstat(fd).map_err(nix_err(format!("cannot stat {what}")))?;
    Ok((st.st_dev, st.st_ino))
}

/// Loads the archive into `opts.into` and publishes it (or finishes a journaled publish): see
/// the module's documentation.
pub fn load(opts: &Options, archive: Archive) -> Result<Loaded, LoadError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(LoadError::NotRoot);
    }
    let shown = opts.into.display().to_string();
    let root = nofollow::open_start(&opts.into).map_err(io_err(format!("cannot open the destination root {shown}")))?;
    let st = nix::sys::stat::fstat(&root).map_err(nix_err(format!("cannot stat {shown}")))?;
    if st.st_uid != 0 {
        return Err(LoadError::UnprotectedRoot {
            path: shown,
            why: format!("it is owned by uid {}, not root", st.st_uid),
        });
    }
    if st.st_mode & 0o022 != 0 {
        let why = format!("its mode {:04o} lets group or others write", st.st_mode & 0o7777);
        return Err(LoadError::UnprotectedRoot { path: shown, why });
    }
    // SAFETY: an open descriptor; the lock goes with it.
    if unsafe { libc::flock(root.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(LoadError::Busy { path: shown });
    }
    let root_id = (st.st_dev, st.st_ino);
    let root = root.as_fd();
    match nix::fcntl::openat(root, JOURNAL, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => return resume(opts, root, root_id, std::fs::File::from(fd)),
        Err(nix::Error::ENOENT) => {}
        Err(e) => return Err(nix_err(format!("cannot open the journal in {shown}"))(e)),
    }
    // No journal: a staging left behind never reached publishing.
    remove_tree(root, OsStr::new(STAGING)).map_err(io_err(format!("cannot remove an old staging in {shown}")))?;
    remove_file(root, OsStr::new(JOURNAL_TMP)).map_err(io_err(format!("cannot remove {JOURNAL_TMP} in {shown}")))?;
    if let Err(e) = refuse_non_empty(root, &shown) {
        return match (opts.or_same, e) {
            (true, LoadError::DestinationNotEmpty { .. }) => already_loaded(opts, root, archive),
            (_, e) => Err(e),
        };
    }
    nix::sys::stat::mkdirat(root, STAGING, Mode::from_bits_truncate(0o700))
        .map_err(nix_err(format!("cannot make the staging directory in {shown}")))?;
    let staged = stage(opts, root, root_id, archive);
    let (snapshot, entries, bytes, staging_id) = match staged {
        Ok(s) => s,
        Err(e) => {
            let _ = remove_tree(root, OsStr::new(STAGING));
            return Err(e);
        }
    };
    opts.pause("staged");
    let staging =
        nofollow::open_dir_at(root, OsStr::new(STAGING)).map_err(io_err("cannot open the staging directory"))?;
    let names = top_names(staging.as_fd())?;
    let journal = Journal {
        version: 1,
        snapshot: snapshot.to_string(),
        entries,
        bytes,
        root_dev: root_id.0,
        root_ino: root_id.1,
        staging_dev: staging_id.0,
        staging_ino: staging_id.1,
        names: names.iter().map(|n| hex::encode(n.as_bytes())).collect(),
    };
    write_journal(root, &journal, &shown)?;
    opts.pause("journaled");
    publish(opts, root, &journal, &shown, None)?;
    Ok(Loaded { snapshot, entries, bytes, resumed: false })
}

/// Loads and verifies into the staging directory; answers the snapshot, counts and staging's
/// identity. The caller removes staging on an error.
fn stage(
    opts: &Options,
    root: BorrowedFd<'_>,
    root_id: (u64, u64),
    archive: Archive,
) -> Result<(Snapshot, u64, u64, (u64, u64)), LoadError> {
    let staging =
        nofollow::open_dir_at(root, OsStr::new(STAGING)).map_err(io_err("cannot open the staging directory"))?;
    let staging_id = dev_ino(staging.as_fd(), "the staging directory")?;
    let (records, entries, bytes, read_back) = match archive {
        Archive::File(path) => {
            let shown = path.display();
            let mut file = std::fs::File::open(&path).map_err(io_err(format!("cannot open the archive {shown}")))?;
            let mut magic = [0u8; 2];
            let n = file.read(&mut magic).map_err(io_err(format!("cannot read the archive {shown}")))?;
            file.rewind().map_err(io_err(format!("cannot read the archive {shown}")))?;
            if !(n == 2 && magic == [0x1f, 0x8b]) {
                check_headers(&mut file, opts.limits)?;
                file.rewind().map_err(io_err(format!("cannot read the archive {shown}")))?;
            }
            load_into(gunzip(file)?, staging.as_fd(), opts.limits)?
        }
        Archive::Reader(r) => load_into(gunzip(r)?, staging.as_fd(), opts.limits)?,
    };
    let archive_snapshot = snapshot_of(records);
    if let Some(expected) = opts.expect_snapshot
        && expected != archive_snapshot
    {
        return Err(LoadError::SnapshotMismatch { expected, found: archive_snapshot });
    }
    // Every file and directory written back and the disk's cache flushed, in one pass for the
    // whole tree (a writeback error of any is reported here); the walk then fsyncs each
    // directory on its own.
    nix::unistd::syncfs(staging.as_fd()).map_err(nix_err("cannot sync the staging file system"))?;
    let loaded = snapshot_of(walk(staging.as_fd(), false, true, &read_back)?.records);
    if loaded != archive_snapshot {
        return Err(LoadError::VerifyMismatch { archive: archive_snapshot, loaded });
    }
    // The root is still the directory named by `into`.
    let shown = opts.into.display().to_string();
    let again =
        nofollow::open_start(&opts.into).map_err(io_err(format!("cannot open the destination root {shown}")))?;
    let now = dev_ino(again.as_fd(), &shown)?;
    if now != root_id {
        return Err(LoadError::DestinationMoved {
            path: shown,
            was: format!("device {} inode {}", root_id.0, root_id.1),
            now: format!("device {} inode {}", now.0, now.1),
        });
    }
    refuse_non_empty(root, &shown)?;
    Ok((archive_snapshot, entries, bytes, staging_id))
}

/// `--or-same` on a destination that holds something: done when it is the archive's tree
/// (nothing is written), else refused as not empty.
fn already_loaded(opts: &Options, root: BorrowedFd<'_>, archive: Archive) -> Result<Loaded, LoadError> {
    let reader: Box<dyn Read> = match archive {
        Archive::File(p) => {
            Box::new(std::fs::File::open(&p).map_err(io_err(format!("cannot open the archive {}", p.display())))?)
        }
        Archive::Reader(r) => r,
    };
    let (snapshot, entries, bytes) = snapshot_archive(reader, opts.limits)?;
    let found = snapshot_of(walk(root, true, false, &ReadBack::new())?.records);
    if let Some(want) = &opts.expect_snapshot
        && *want != snapshot
    {
        return Err(LoadError::SnapshotMismatch { expected: *want, found: snapshot });
    }
    if found != snapshot {
        let shown = opts.into.display().to_string();
        return Err(LoadError::DestinationNotEmpty { path: shown, name: format!("(a tree of snapshot {found})") });
    }
    Ok(Loaded { snapshot, entries, bytes, resumed: true })
}

/// Refuses a root that holds anything but the loader's own names.
fn refuse_non_empty(root: BorrowedFd<'_>, shown: &str) -> Result<(), LoadError> {
    for name in list(root).map_err(io_err(format!("cannot list {shown}")))? {
        if !reserved(name.as_bytes()) {
            return Err(LoadError::DestinationNotEmpty { path: shown.into(), name: show(name.as_bytes()) });
        }
    }
    Ok(())
}

/// The names in a directory (`.` and `..` left out).
fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut d = open_listing(dir).map_err(nix_io)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(nix_io)?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_owned());
        }
    }
    Ok(out)
}

/// A listing of `dir` with an offset of its own (a `dup` would share the descriptor's).
fn open_listing(dir: BorrowedFd<'_>) -> nix::Result<nix::dir::Dir> {
    nix::dir::Dir::openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
}

fn top_names(staging: BorrowedFd<'_>) -> Result<Vec<OsString>, LoadError> {
    let mut names = list(staging).map_err(io_err("cannot list the staging directory"))?;
    names.sort();
    Ok(names)
}

fn write_journal(root: BorrowedFd<'_>, journal: &Journal, shown: &str) -> Result<(), LoadError> {
    let what = || format!("cannot write the journal in {shown}");
    let bytes = serde_json::to_vec(journal).map_err(|e| LoadError::Io { what: what(), source: io::Error::other(e) })?;
    remove_file(root, OsStr::new(JOURNAL_TMP)).map_err(io_err(what()))?;
    let mut f = nofollow::create_at(root, OsStr::new(JOURNAL_TMP), 0o600, None).map_err(io_err(what()))?;
    f.write_all(&bytes).map_err(io_err(what()))?;
    f.sync_all().map_err(io_err(what()))?;
    drop(f);
    nix::fcntl::renameat(root, JOURNAL_TMP, root, JOURNAL).map_err(nix_err(what()))?;
    nix::unistd::fsync(root).map_err(nix_err(what()))?;
    Ok(())
}

fn resume(
    opts: &Options,
    root: BorrowedFd<'_>,
    root_id: (u64, u64),
    mut file: std::fs::File,
) -> Result<Loaded, LoadError> {
    let shown = opts.into.display().to_string();
    let bad = |why: String| LoadError::Journal { path: shown.clone(), why };
    let mut text = Vec::new();
    (&mut file).take(64 << 20).read_to_end(&mut text).map_err(io_err(format!("cannot read the journal in {shown}")))?;
    let journal: Journal = serde_json::from_slice(&text).map_err(|e| bad(format!("unreadable: {e}")))?;
    if journal.version != 1 {
        return Err(bad(format!("unknown version {}", journal.version)));
    }
    let snapshot: Snapshot = journal.snapshot.parse().map_err(bad)?;
    if (journal.root_dev, journal.root_ino) != root_id {
        return Err(LoadError::DestinationMoved {
            path: shown,
            was: format!("device {} inode {}", journal.root_dev, journal.root_ino),
            now: format!("device {} inode {}", root_id.0, root_id.1),
        });
    }
    if let Some(expected) = opts.expect_snapshot
        && expected != snapshot
    {
        return Err(LoadError::SnapshotMismatch { expected, found: snapshot });
    }
    opts.pause("journaled");
    publish(opts, root, &journal, &shown, Some(snapshot))?;
    Ok(Loaded { snapshot, entries: journal.entries, bytes: journal.bytes, resumed: true })
}

/// The journaled steps from the journal on; each may find itself already done. With `verify`
/// (a resume), the published tree's snapshot is checked before the journal is removed.
fn publish(
    opts: &Options,
    root: BorrowedFd<'_>,
    journal: &Journal,
    shown: &str,
    verify: Option<Snapshot>,
) -> Result<(), LoadError> {
    let bad = |why: String| LoadError::Journal { path: shown.into(), why };
    let staging = match nofollow::open_dir_at(root, OsStr::new(STAGING)) {
        Ok(fd) => {
            let id = dev_ino(fd.as_fd(), "the staging directory")?;
            if id != (journal.staging_dev, journal.staging_ino) {
                return Err(bad(format!(
                    "the staging directory is device {} inode {}, the journal's is device {} inode {}",
                    id.0, id.1, journal.staging_dev, journal.staging_ino
                )));
            }
            Some(fd)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) => return Err(io_err(format!("cannot open the staging directory in {shown}"))(e)),
    };
    let mut names = Vec::with_capacity(journal.names.len());
    for n in &journal.names {
        let bytes = hex::decode(n).map_err(|_| bad(format!("a name is not hex: {n:?}")))?;
        names.push(<OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes));
    }
    for (i, name) in names.iter().enumerate() {
        let moved = match &staging {
            Some(s) => nix::fcntl::renameat2(
                s,
                name.as_os_str(),
                root,
                name.as_os_str(),
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            ),
            None => Err(nix::Error::ENOENT),
        };
        match moved {
            Ok(()) => {}
            Err(nix::Error::ENOENT) => {
                // Moved by an earlier run: it must be in the root now.
                nix::sys::stat::fstatat(root, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|_| bad(format!("{} is neither in staging nor published", show(name.as_bytes()))))?;
            }
            Err(nix::Error::EEXIST) => {
                return Err(LoadError::DestinationNotEmpty { path: shown.into(), name: show(name.as_bytes()) });
            }
            Err(e) => return Err(nix_err(format!("cannot publish {}", show(name.as_bytes())))(e)),
        }
        if i == 0 {
            opts.pause("moving");
        }
    }
    opts.pause("moved");
    nix::unistd::fsync(root).map_err(nix_err(format!("cannot fsync {shown}")))?;
    if let Some(s) = &staging {
        nix::unistd::fsync(s).map_err(nix_err("cannot fsync the staging directory"))?;
    }
    opts.pause("synced");
    if staging.is_some() {
        match nix::unistd::unlinkat(root, STAGING, nix::unistd::UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(nix::Error::ENOENT) => {}
            Err(nix::Error::ENOTEMPTY) => {
                return Err(bad("the staging directory holds names the journal does not".into()));
            }
            Err(e) => return Err(nix_err("cannot remove the staging directory")(e)),
        }
        nix::unistd::fsync(root).map_err(nix_err(format!("cannot fsync {shown}")))?;
    }
    opts.pause("cleaned");
    if let Some(expected) = verify {
        let found = snapshot_of(walk(root, true, false, &ReadBack::new())?.records);
        if found != expected {
            return Err(LoadError::VerifyMismatch { archive: expected, loaded: found });
        }
    }
    nix::unistd::unlinkat(root, JOURNAL, nix::unistd::UnlinkatFlags::NoRemoveDir)
        .map_err(nix_err(format!("cannot remove the journal in {shown}")))?;
    nix::unistd::fsync(root).map_err(nix_err(format!("cannot fsync {shown}")))?;
    Ok(())
}

fn remove_file(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(nix_io(e)),
    }
}

/// Removes the tree `name` in `parent`, never following a symlink (a symlink is removed, not
/// what it points at), with a bounded number of open descriptors.
fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let top = match nofollow::open_dir_at(parent, name) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
            return remove_file(parent, name);
        }
        Err(e) => return Err(e),
    };
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let dir = nofollow::walk_dirs(top.as_fd(), Path::new(OsStr::from_bytes(&rel)))?;
        let mut subdirs = Vec::new();
        for n in list(dir.as_fd())? {
            let st =
                nix::sys::stat::fstatat(dir.as_fd(), n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(nix_io)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                subdirs.push(join(&rel, n.as_bytes()));
            } else {
                remove_file(dir.as_fd(), &n)?;
            }
        }
        drop(dir);
        if subdirs.is_empty() {
            if rel.is_empty() {
                break;
            }
            let (p, n) = split(&rel);
            let pfd = nofollow::walk_dirs(top.as_fd(), Path::new(OsStr::from_bytes(p)))?;
            nix::unistd::unlinkat(&pfd, OsStr::from_bytes(n), nix::unistd::UnlinkatFlags::RemoveDir).map_err(nix_io)?;
        } else {
            stack.push(rel);
            stack.extend(subdirs);
        }
    }
    drop(top);
    match nix::unistd::unlinkat(parent, name, nix::unistd::UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(nix_io(e)),
    }
}

// ---------------------------------------------------------------------------------------------
// The command

/// `computer-agent load-runtime`: loads a runtime archive into a protected root.
#[derive(Debug, clap::Parser)]
#[command(
    name = "computer-agent load-runtime",
    about = "Load a runtime archive (tar, optionally gzip) into a protected root and publish it durably; \
             prints a JSON result"
)]
struct Command {
    /// The archive: a tar file, optionally gzip-compressed; `-` reads standard input.
    #[arg(long)]
    archive: PathBuf,
    /// The destination root: a directory owned by root, not group- or world-writable, empty.
    #[arg(long)]
    into: PathBuf,
    /// Refuse unless the runtime's snapshot is this one (64 hex digits).
    #[arg(long)]
    expect_snapshot: Option<Snapshot>,
    /// A destination that already holds exactly this archive's tree is done, not refused.
    #[arg(long)]
    or_same: bool,
}

/// Runs `computer-agent load-runtime ARGS` (`args` starts with `load-runtime`). Prints
/// `{"snapshot","entries","bytes","resumed"}` on success (exit 0), or
/// `{"error":{"reason","member","message"}}` on stdout and the message on stderr (exit 1); a
/// usage error exits 2.
pub fn command(args: impl IntoIterator<Item = OsString>) -> std::process::ExitCode {
    use clap::Parser;
    let cmd = match Command::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let pause_at = std::env::var(PAUSE_ENV).ok().filter(|s| !s.is_empty());
    if let Some(step) = &pause_at
        && !STEPS.contains(&step.as_str())
    {
        eprintln!("computer-agent load-runtime: {PAUSE_ENV}={step} is not a step (one of {})", STEPS.join(", "));
        return std::process::ExitCode::from(2);
    }
    let opts = Options {
        into: cmd.into,
        expect_snapshot: cmd.expect_snapshot,
        limits: Limits::default(),
        pause_at,
        or_same: cmd.or_same,
    };
    let archive = if cmd.archive.as_os_str() == "-" {
        Archive::Reader(Box::new(io::stdin()))
    } else {
        Archive::File(cmd.archive)
    };
    match load(&opts, archive) {
        Ok(l) => {
            let out = serde_json::json!({
                "snapshot": l.snapshot.to_string(),
                "entries": l.entries,
                "bytes": l.bytes,
                "resumed": l.resumed,
            });
            println!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            let out = serde_json::json!({
                "error": { "reason": e.reason(), "member": e.member(), "message": e.to_string() }
            });
            println!("{out}");
            eprintln!("computer-agent load-runtime: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(kind: Kind, raw: &str, size: u64, link: Option<&str>) -> Member {
        Member {
            raw: raw.as_bytes().to_vec(),
            path: Vec::new(),
            kind,
            size,
            sparse: false,
            link: link.map(|l| l.as_bytes().to_vec()),
            link_path: Vec::new(),
            uid: 0,
            gid: 0,
            mode: 0o644,
            mtime: (0, 0),
        }
    }

    fn check_all(limits: Limits, members: &[(Kind, &str, u64, Option<&str>)]) -> Result<(), LoadError> {
        let mut c = Checker::new(limits);
        for (kind, raw, size, link) in members {
            c.check(&mut member(*kind, raw, *size, *link))?;
        }
        Ok(())
    }

    fn reason(limits: Limits, members: &[(Kind, &str, u64, Option<&str>)]) -> &'static str {
        match check_all(limits, members) {
            Ok(()) => "ok",
            Err(e) => e.reason(),
        }
    }

    const D: Kind = Kind::Dir;
    const F: Kind = Kind::File;
    const L: Kind = Kind::Symlink;
    const H: Kind = Kind::Hardlink;

    #[test]
    fn paths_are_normalized_and_escapes_refused() {
        let ok = |raw: &str| normalize(raw.as_bytes()).ok().map(|p| String::from_utf8(p).unwrap_or_default());
        assert_eq!(ok("./a//b/./c/"), Some("a/b/c".into()));
        assert_eq!(ok("./"), Some(String::new()));
        assert_eq!(ok("."), Some(String::new()));
        assert!(matches!(normalize(b"/etc/passwd"), Err(PathProblem::Absolute)));
        assert!(matches!(normalize(b"a/../../b"), Err(PathProblem::DotDot)));
        assert!(matches!(normalize(b".."), Err(PathProblem::DotDot)));
        assert_eq!(ok("a..b/..c"), Some("a..b/..c".into()));
    }

    #[test]
    fn each_structural_refusal_has_its_reason() {
        let l = Limits::default();
        assert_eq!(
            reason(l, &[(D, "./", 0, None), (D, "a/", 0, None), (F, "a/f", 3, None), (H, "a/g", 0, Some("a/f"))]),
            "ok"
        );
        assert_eq!(reason(l, &[(F, "/abs", 0, None)]), "absolute_path");
        assert_eq!(reason(l, &[(F, "../x", 0, None)]), "path_escape");
        assert_eq!(reason(l, &[(F, "f", 0, None), (F, "./f", 0, None)]), "duplicate_member");
        assert_eq!(reason(l, &[(D, "./", 0, None), (D, ".", 0, None)]), "duplicate_member");
        assert_eq!(reason(l, &[(F, "x/y", 0, None)]), "undeclared_parent");
        assert_eq!(reason(l, &[(L, "a", 0, Some("/etc")), (F, "a/passwd", 0, None)]), "escape_through_symlink");
        // Further down, below a parent that was never declared: still the symlink's escape.
        assert_eq!(reason(l, &[(L, "a", 0, Some("/")), (F, "a/etc/passwd", 0, None)]), "escape_through_symlink");
        assert_eq!(reason(l, &[(F, "a", 0, None), (F, "a/b", 0, None)]), "parent_not_directory");
        assert_eq!(reason(l, &[(H, "g", 0, Some("/etc/shadow"))]), "hardlink_outside_root");
        assert_eq!(reason(l, &[(H, "g", 0, Some("../../etc/shadow"))]), "hardlink_outside_root");
        assert_eq!(reason(l, &[(H, "g", 0, Some("f")), (F, "f", 0, None)]), "hardlink_not_earlier");
        assert_eq!(reason(l, &[(D, "d", 0, None), (H, "g", 0, Some("d"))]), "hardlink_not_regular");
        assert_eq!(reason(l, &[(L, "s", 0, Some("f")), (H, "g", 0, Some("s"))]), "hardlink_not_regular");
        assert_eq!(reason(l, &[(F, "f", 0, None), (H, "g", 0, Some("f")), (H, "h", 0, Some("g"))]), "ok");
        assert_eq!(reason(l, &[(Kind::Special("FIFO"), "p", 0, None)]), "special_file");
        assert_eq!(reason(l, &[(Kind::Unsupported(b'D'), "d", 0, None)]), "unsupported_type");
        assert_eq!(reason(l, &[(D, ".computerd-load-staging", 0, None)]), "reserved_name");
        assert_eq!(reason(l, &[(D, "d", 5, None)]), "bad_member");
        assert_eq!(reason(l, &[(L, "s", 0, Some(""))]), "bad_member");
        assert_eq!(reason(l, &[(F, "./", 0, None)]), "bad_member");
    }

    #[test]
    fn the_limits_hold_at_their_edge() {
        let small = Limits { max_bytes: 100, max_entries: 3 };
        assert_eq!(reason(small, &[(D, "./", 0, None), (F, "a", 60, None), (F, "b", 40, None)]), "ok");
        assert_eq!(
            reason(small, &[(D, "./", 0, None), (F, "a", 0, None), (F, "b", 0, None), (F, "c", 0, None)]),
            "too_many_entries"
        );
        assert_eq!(reason(small, &[(F, "a", 60, None), (F, "b", 41, None)]), "too_large");
        assert_eq!(reason(small, &[(F, "a", u64::MAX, None)]), "too_large");
        let Err(LoadError::TooLarge { member, declared, before, limit }) =
            check_all(small, &[(F, "a", 60, None), (F, "b", 41, None)])
        else {
            panic!("not too large");
        };
        assert_eq!((member.as_str(), declared, before, limit), ("b", 41, 60, 100));
        let msg = LoadError::TooManyEntries { member: "x".into(), limit: 3 }.to_string();
        assert!(msg.contains("x") && msg.contains("more than 3 entries"), "{msg}");
    }

    /// The snapshot's definition, written out by hand for one small tree.
    #[test]
    fn the_snapshot_is_the_documented_encoding() {
        let content = b"hello";
        let digest: [u8; 32] = Sha256::digest(content).into();
        let file = |path: &str, inode| Record {
            path: path.as_bytes().to_vec(),
            node: Node::File { uid: 1000, gid: 1001, mode: 0o4755, size: 5, digest, inode },
        };
        let records = vec![
            file("d/z", (7, 1)),
            Record { path: b"d".to_vec(), node: Node::Dir { uid: 0, gid: 0, mode: 0o755 } },
            Record { path: b"d/l".to_vec(), node: Node::Symlink { uid: 5, gid: 6, target: b"../x".to_vec() } },
            file("d/a", (7, 1)),
        ];
        let mut want = Vec::new();
        want.extend_from_slice(b"computerd-runtime-snapshot-v1\0");
        want.extend_from_slice(b"d\0d\x000\x000\x000755\0");
        want.extend_from_slice(format!("f\0d/a\x001000\x001001\x004755\x005\0{}\0", hex::encode(digest)).as_bytes());
        want.extend_from_slice(b"l\0d/l\x005\x006\0../x\0");
        want.extend_from_slice(b"h\0d/z\0d/a\0");
        assert_eq!(snapshot_of(records).0, <[u8; 32]>::from(Sha256::digest(&want)));
    }

    /// A hard link that sorts before its target gives the same snapshot from the archive as
    /// from a tree where the first name in order is the inode's.
    #[test]
    fn hard_links_snapshot_alike_whichever_name_came_first() {
        let mut src = Source::default();
        let mut c = Checker::new(Limits::default());
        let mut add = |kind, raw: &str, size, link: Option<&str>| {
            let mut m = member(kind, raw, size, link);
            c.check(&mut m).map_err(|e| e.to_string())?;
            src.add(&m);
            Ok::<(), String>(())
        };
        add(F, "z", 1, None).unwrap();
        add(H, "a", 0, Some("z")).unwrap();
        let digest: [u8; 32] = Sha256::digest(b"x").into();
        src.set_digests(&[digest]);
        let node = |inode| Node::File { uid: 0, gid: 0, mode: 0o644, size: 1, digest, inode };
        let tree = vec![
            Record { path: b"a".to_vec(), node: node((1, 9)) },
            Record { path: b"z".to_vec(), node: node((1, 9)) },
        ];
        assert_eq!(snapshot_of(src.records), snapshot_of(tree));
    }

    fn tar_of(members: &[(tar::EntryType, &str, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (kind, path, data, link) in members {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_mode(if *kind == tar::EntryType::Directory { 0o755 } else { 0o644 });
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            if let Some(l) = link {
                h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A member past the byte limit is refused before its file is made (the streaming path, as
    /// standard input takes); the members before it are in staging until the caller removes it.
    #[test]
    fn a_member_over_the_limit_is_refused_before_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let staging = nofollow::open_start(dir.path()).unwrap();
        use tar::EntryType as T;
        let ar = tar_of(&[(T::Regular, "small", b"0123456789", None), (T::Regular, "big", &[7u8; 600], None)]);
        let err = load_into(&ar[..], staging.as_fd(), Limits { max_bytes: 512, max_entries: 10 }).unwrap_err();
        assert_eq!(err.reason(), "too_large");
        assert_eq!(err.member(), Some("big"));
        assert!(dir.path().join("small").exists());
        assert!(!dir.path().join("big").exists(), "the refused member was written");
    }

    /// The read-back digests stand in for reading a file again only while the file is as it was
    /// read: a file changed after that is read and hashed again by the walk.
    #[test]
    fn a_file_changed_after_its_read_back_is_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let staging = nofollow::open_start(dir.path()).unwrap();
        use tar::EntryType as T;
        let ar = tar_of(&[(T::Directory, "d/", b"", None), (T::Regular, "d/f", b"abc", None)]);
        let (records, _, _, read_back) = load_into(&ar[..], staging.as_fd(), Limits::default()).unwrap();
        assert_eq!(read_back.len(), 1);
        let archive = snapshot_of(records);
        assert_eq!(snapshot_of(walk(staging.as_fd(), false, false, &read_back).unwrap().records), archive);
        // Same size, same mtime, other bytes: only the ctime tells.
        let f = dir.path().join("d/f");
        let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::fs::write(&f, b"abd").unwrap();
        std::fs::File::options().write(true).open(&f).unwrap().set_modified(mtime).unwrap();
        let loaded = snapshot_of(walk(staging.as_fd(), false, false, &read_back).unwrap().records);
        assert_ne!(loaded, archive, "the walk trusted a stale read-back");
        assert_eq!(loaded, snapshot_of(walk(staging.as_fd(), false, false, &ReadBack::new()).unwrap().records));
    }

    #[test]
    fn the_archive_snapshot_needs_no_disk_and_sees_gzip() {
        use tar::EntryType as T;
        let ar = tar_of(&[
            (T::Directory, "d/", b"", None),
            (T::Regular, "d/f", b"abc", None),
            (T::Link, "d/g", b"", Some("d/f")),
        ]);
        let (plain, entries, bytes) = snapshot_archive(&ar[..], Limits::default()).unwrap();
        assert_eq!((entries, bytes), (3, 3));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&ar).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(snapshot_archive(&gz[..], Limits::default()).unwrap().0, plain);
    }

    #[test]
    fn remove_tree_never_follows_a_symlink() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let root = tempfile::tempdir().unwrap();
        let t = root.path().join("t");
        std::fs::create_dir_all(t.join("a/b/c")).unwrap();
        std::fs::write(t.join("a/b/c/f"), b"y").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.join("a/link")).unwrap();
        let fd = nofollow::open_start(root.path()).unwrap();
        remove_tree(fd.as_fd(), OsStr::new("t")).unwrap();
        assert!(!t.exists());
        assert!(outside.path().join("keep").exists());
    }
}
