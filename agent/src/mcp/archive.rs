//! A strict reader of tool-package archives (tar, or tar inside gzip), written for hostile input:
//! it extracts regular files and directories into a staging directory and refuses everything
//! else, naming why. It never follows or creates links, never writes outside the staging
//! directory, drops setuid/setgid/sticky bits and extended attributes, and ignores owners.
//!
//! Accepted: ustar and GNU headers (with a verified checksum), PAX extended headers (see below),
//! GNU long names, and what `tar -C dir -czf pkg.tar.gz .` writes: a `./` (or `.`) directory entry
//! is the package's root and is skipped, `./sub/` and `./sub` directory entries are directories,
//! `./file` names `file`. Refused: links, devices, FIFOs, sparse files, unknown entry types,
//! absolute paths, any `..`, names that collide (also by case, and a file under a file), a file
//! that names the root, paths deeper than [`MAX_DEPTH`] components, a PAX size that disagrees
//! with the header's, global headers that set anything but a comment, malformed numbers, names or
//! records, truncation, anything after the end-of-archive marker, and the size limits. The member
//! limit counts every distinct path, the parents a path implies included (`a/b/f` is three).
//!
//! PAX keys are allowed by name, never by default, because an unknown key may change what a
//! writer meant to be extracted (POSIX lets readers ignore unknown keys; a reader of hostile
//! input cannot know which ones are harmless):
//! - applied: `path` (the member's name, UTF-8), `size` (must equal the header's size);
//! - ignored, any value: `atime`, `mtime`, `ctime`, `uid`, `gid`, `uname`, `gname`, `comment`,
//!   `charset`, `hdrcharset` (times and owners are not applied; names must be UTF-8 anyway), and
//!   the bookkeeping of star and libarchive: `SCHILY.dev`, `SCHILY.ino`, `SCHILY.nlink`,
//!   `SCHILY.devmajor`, `SCHILY.devminor` (links and devices are refused by their type),
//!   `LIBARCHIVE.creationtime`;
//! - dropped, any value, binary included: extended attributes (`SCHILY.xattr.*`,
//!   `LIBARCHIVE.xattr.*`, GNU tar's `RHT.security.selinux`), ACLs (`SCHILY.acl.access`,
//!   `SCHILY.acl.default`, `SCHILY.acl.ace`) and file flags (`SCHILY.fflags`): the files get the
//!   reader's own modes and nothing else;
//! - refused, naming the key: `GNU.sparse.*` (as a sparse file), `linkpath` (links are refused
//!   by their type; on a file or a directory it would turn it into a link), and every other key,
//!   such as `SCHILY.filetype`, `SCHILY.realsize`, `GNU.dumpdir`, `GNU.volume.*`, `realtime.*`,
//!   `security.*`.
//!
//! A refused archive leaves nothing behind: [`extract`] writes only into the staging directory it
//! is given, and its caller removes that directory on any error (the installer does it with a
//! guard, before anything is published), so a refusal after some members were written publishes
//! none of them.

use std::collections::HashMap;
use std::collections::HashSet;
use std::io::Read;
use std::io::Write;
use std::path::Path;

/// The deepest member path accepted, in components (`a/b/f` is 3).
pub const MAX_DEPTH: usize = 32;

/// The size limits of one archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The archive as stored (compressed or not).
    pub archive_bytes: u64,
    /// The sum of the files' sizes once unpacked.
    pub unpacked_bytes: u64,
    /// Files and directories, the parents a path implies included (`a/b/f` is three).
    pub members: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { archive_bytes: 8 << 20, unpacked_bytes: 32 << 20, members: 512 }
    }
}

/// Why an archive was refused. [`Rejection::reason`] is a stable code for APIs and tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The archive is larger than allowed.
    #[error("the archive is larger than {0} bytes")]
    ArchiveTooLarge(u64),
    /// The unpacked files would be larger than allowed.
    #[error("the unpacked files are larger than {0} bytes")]
    UnpackedTooLarge(u64),
    /// More members than allowed.
    #[error("the archive has more than {0} members")]
    TooManyMembers(usize),
    /// A symbolic link.
    #[error("{0}: symbolic links are not allowed")]
    Symlink(String),
    /// A hard link.
    #[error("{0}: hard links are not allowed")]
    Hardlink(String),
    /// A device, FIFO or contiguous file.
    #[error("{0}: special files (devices, FIFOs) are not allowed")]
    SpecialFile(String),
    /// A sparse file.
    #[error("{0}: sparse files are not allowed")]
    Sparse(String),
    /// An entry type this reader does not know.
    #[error("entry type {0:?} is not allowed")]
    UnknownType(char),
    /// An absolute path.
    #[error("{0}: absolute paths are not allowed")]
    AbsolutePath(String),
    /// A path with `..` (or another way out).
    #[error("{0}: paths may not leave the package")]
    PathEscape(String),
    /// An empty, non-UTF-8 or otherwise unusable name.
    #[error("a member name is not usable: {0}")]
    BadName(String),
    /// A path deeper than [`MAX_DEPTH`] components.
    #[error("{0}: the path is deeper than {MAX_DEPTH} components")]
    TooDeep(String),
    /// A PAX key this reader does not apply and cannot ignore: it could change what is extracted.
    #[error("{path}: the PAX key {key:?} is not allowed (it could change what is extracted)")]
    PaxKey {
        /// The member's name.
        path: String,
        /// The key.
        key: String,
    },
    /// Two members with the same path, or a member under a file.
    #[error("{0}: the name is used twice")]
    Collision(String),
    /// Two members whose paths differ only by case.
    #[error("{0}: the name collides with another by case")]
    CaseCollision(String),
    /// A PAX size that disagrees with the header's size.
    #[error("{0}: the PAX size and the header size disagree")]
    SizeConflict(String),
    /// A header that cannot be read (checksum, numbers, magic, records).
    #[error("malformed header: {0}")]
    MalformedHeader(String),
    /// A global header that sets something for every member.
    #[error("global headers may only carry a comment")]
    GlobalHeader,
    /// The archive ends inside a header or a file, or without its end marker.
    #[error("the archive is truncated")]
    Truncated,
    /// Bytes after the end-of-archive marker (or after the gzip stream).
    #[error("the archive has data after its end")]
    TrailingData,
    /// Not gzip-compressed tar and not tar.
    #[error("the gzip stream is damaged: {0}")]
    BadCompression(String),
    /// Writing into the staging directory failed.
    #[error("staging: {0}")]
    Staging(String),
}

impl Rejection {
    /// A stable code naming the reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::ArchiveTooLarge(_) => "archive_too_large",
            Rejection::UnpackedTooLarge(_) => "unpacked_too_large",
            Rejection::TooManyMembers(_) => "too_many_members",
            Rejection::Symlink(_) => "symlink",
            Rejection::Hardlink(_) => "hardlink",
            Rejection::SpecialFile(_) => "special_file",
            Rejection::Sparse(_) => "sparse_file",
            Rejection::UnknownType(_) => "unknown_entry_type",
            Rejection::AbsolutePath(_) => "absolute_path",
            Rejection::PathEscape(_) => "path_escape",
            Rejection::BadName(_) => "bad_name",
            Rejection::TooDeep(_) => "path_too_deep",
            Rejection::PaxKey { .. } => "unsupported_pax_key",
            Rejection::Collision(_) => "name_collision",
            Rejection::CaseCollision(_) => "case_collision",
            Rejection::SizeConflict(_) => "pax_size_conflict",
            Rejection::MalformedHeader(_) => "malformed_header",
            Rejection::GlobalHeader => "global_header",
            Rejection::Truncated => "truncated",
            Rejection::TrailingData => "trailing_data",
            Rejection::BadCompression(_) => "bad_compression",
            Rejection::Staging(_) => "staging_failed",
        }
    }
}

/// What an extraction produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extracted {
    /// Regular files, by path.
    pub files: Vec<String>,
    /// Directories, by path.
    pub dirs: Vec<String>,
    /// The sum of the files' sizes.
    pub bytes: u64,
}

const BLOCK: usize = 512;

/// A reader that says how many bytes it gave, and refuses to give more than `cap`.
struct Counted<R> {
    inner: R,
    read: u64,
    cap: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.read >= self.cap {
            return Err(std::io::Error::other("cap"));
        }
        let room = (self.cap - self.read).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room])?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` at a clean end before the first byte.
fn read_block<R: Read>(r: &mut R, buf: &mut [u8], limits: &Limits) -> Result<bool, Rejection> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(Rejection::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.to_string() == "cap" => return Err(Rejection::UnpackedTooLarge(limits.unpacked_bytes)),
            Err(e) => return Err(Rejection::BadCompression(e.to_string())),
        }
    }
    Ok(true)
}

fn octal(field: &[u8], what: &str) -> Result<u64, Rejection> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return Err(Rejection::MalformedHeader(format!("{what} uses the base-256 form")));
    }
    let text: Vec<u8> = field.iter().copied().take_while(|b| *b != 0).collect();
    let text = std::str::from_utf8(&text).map_err(|_| Rejection::MalformedHeader(format!("{what} is not text")))?;
    let text = text.trim_matches(' ');
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| Rejection::MalformedHeader(format!("{what} is not an octal number")))
}

fn field_str(field: &[u8]) -> Result<String, Rejection> {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8(field[..end].to_vec()).map_err(|_| Rejection::BadName("a name is not UTF-8".into()))
}

fn checksum_ok(h: &[u8; BLOCK]) -> Result<bool, Rejection> {
    let stored = octal(&h[148..156], "the checksum")?;
    let sum: u64 = h.iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u64::from(*b) }).sum();
    Ok(stored == sum)
}

/// PAX records: `"<len> <key>=<value>\n"`, each length counting the whole record. Keys are UTF-8
/// (an extended attribute's name may be anything: it is dropped); values are bytes, which only the
/// keys that are applied need to be text.
fn pax_records(data: &[u8]) -> Result<HashMap<String, Vec<u8>>, Rejection> {
    let bad = |why: &str| Rejection::MalformedHeader(format!("PAX record: {why}"));
    let mut out = HashMap::new();
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest.iter().position(|b| *b == b' ').ok_or_else(|| bad("no length"))?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("a length is not a number"))?;
        if len <= space + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err(bad("a length does not match its record"));
        }
        let record = &rest[space + 1..len - 1];
        let eq = record.iter().position(|b| *b == b'=').ok_or_else(|| bad("no '='"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        let key = match std::str::from_utf8(key) {
            Ok(k) => k.to_string(),
            Err(_) if XATTR_PREFIXES.iter().any(|p| key.starts_with(p.as_bytes())) => {
                String::from_utf8_lossy(key).into_owned()
            }
            Err(_) => return Err(bad("a key is not UTF-8")),
        };
        if key.is_empty() {
            return Err(bad("an empty key"));
        }
        if out.insert(key.clone(), value.to_vec()).is_some() {
            return Err(bad(&format!("{key} is given twice")));
        }
        rest = &rest[len..];
    }
    Ok(out)
}

/// The prefixes of the PAX keys that carry extended attributes (dropped).
const XATTR_PREFIXES: [&str; 2] = ["SCHILY.xattr.", "LIBARCHIVE.xattr."];

/// PAX keys that are ignored (times, owners, bookkeeping) or dropped (attributes, ACLs, flags)
/// whatever their value. The module doc says why each is harmless.
const PAX_IGNORED: [&str; 21] = [
    "atime",
    "mtime",
    "ctime",
    "uid",
    "gid",
    "uname",
    "gname",
    "comment",
    "charset",
    "hdrcharset",
    "SCHILY.dev",
    "SCHILY.ino",
    "SCHILY.nlink",
    "SCHILY.devmajor",
    "SCHILY.devminor",
    "SCHILY.fflags",
    "SCHILY.acl.access",
    "SCHILY.acl.default",
    "SCHILY.acl.ace",
    "LIBARCHIVE.creationtime",
    "RHT.security.selinux",
];

/// What the reader does with one PAX key of a member's extended header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PaxUse {
    /// `path` or `size`: read by the member.
    Applied,
    /// Harmless whatever its value: ignored or dropped.
    Ignored,
    /// A sparse file's map or name.
    Sparse,
    /// Could change what is extracted (or is unknown): the member is refused.
    Refused,
}

fn pax_use(key: &str) -> PaxUse {
    match key {
        "path" | "size" => PaxUse::Applied,
        k if PAX_IGNORED.contains(&k) || XATTR_PREFIXES.iter().any(|p| k.starts_with(p)) => PaxUse::Ignored,
        k if k.starts_with("GNU.sparse.") => PaxUse::Sparse,
        _ => PaxUse::Refused,
    }
}

/// A member's path, checked: relative, no `..`, no empty or odd components, at most
/// [`MAX_DEPTH`] components. Answers the normalized path (no leading `./`, no trailing `/`), or
/// `None` for the root itself (`.`, `./`).
fn clean_path(raw: &str) -> Result<Option<String>, Rejection> {
    if raw.is_empty() {
        return Err(Rejection::BadName("an empty name".into()));
    }
    if raw.starts_with('/') {
        return Err(Rejection::AbsolutePath(raw.into()));
    }
    if raw.contains('\\') || raw.chars().any(char::is_control) {
        return Err(Rejection::BadName(format!("{raw:?} has a backslash or a control character")));
    }
    let mut parts = Vec::new();
    for (i, part) in raw.trim_end_matches('/').split('/').enumerate() {
        match part {
            ".." => return Err(Rejection::PathEscape(raw.into())),
            "." if i == 0 => {}
            "" | "." => return Err(Rejection::BadName(format!("{raw:?} has an empty or '.' component"))),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    if parts.len() > MAX_DEPTH {
        return Err(Rejection::TooDeep(raw.into()));
    }
    let joined = parts.join("/");
    if joined.len() > 1024 || parts.iter().any(|p| p.len() > 255) {
        return Err(Rejection::BadName(format!("{raw:?} is too long")));
    }
    Ok(Some(joined))
}

/// The names seen so far, to refuse collisions (exact, by case, and a member under a file).
#[derive(Default)]
struct Names {
    exact: HashMap<String, bool>, // path -> is a directory
    folded: HashSet<String>,
}

impl Names {
    /// How many distinct paths: members and the parents they imply.
    fn len(&self) -> usize {
        self.exact.len()
    }

    fn add(&mut self, path: &str, dir: bool) -> Result<(), Rejection> {
        // Every parent must be (or become) a directory, never a file.
        let mut parent = String::new();
        for part in path.split('/').collect::<Vec<_>>().split_last().map(|(_, p)| p.to_vec()).unwrap_or_default() {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            match self.exact.get(&parent) {
                Some(false) => return Err(Rejection::Collision(path.into())),
                Some(true) => {}
                None => {
                    if !self.folded.insert(parent.to_lowercase()) {
                        return Err(Rejection::CaseCollision(path.into()));
                    }
                    self.exact.insert(parent.clone(), true);
                }
            }
        }
        if let Some(was_dir) = self.exact.get(path) {
            // A directory named twice is harmless; anything else is a collision.
            return if *was_dir && dir { Ok(()) } else { Err(Rejection::Collision(path.into())) };
        }
        if !self.folded.insert(path.to_lowercase()) {
            return Err(Rejection::CaseCollision(path.into()));
        }
        self.exact.insert(path.into(), dir);
        Ok(())
    }
}

/// Extracts `archive` (tar, or gzip of tar) into `staging`, which must exist and be empty.
/// Nothing is written outside `staging`; on an error the caller removes `staging`.
pub fn extract(archive: &[u8], staging: &Path, limits: &Limits) -> Result<Extracted, Rejection> {
    if archive.len() as u64 > limits.archive_bytes {
        return Err(Rejection::ArchiveTooLarge(limits.archive_bytes));
    }
    // Headers, padding and the end marker come on top of the files' bytes.
    let cap = limits.unpacked_bytes + (limits.members as u64 + 8) * 3 * BLOCK as u64 + 10240;
    let gz = archive.starts_with(&[0x1f, 0x8b]);
    if gz {
        // Over the slice itself (not a buffered reader), so what is left after the gzip stream is
        // exactly what the archive has after it.
        let mut decoder = flate2::bufread::GzDecoder::new(archive);
        let out = {
            let mut counted = Counted { inner: &mut decoder, read: 0, cap };
            extract_tar(&mut counted, staging, limits)?
        };
        // The gzip stream must end where the archive ends (no second member, no garbage).
        let mut rest = Vec::new();
        decoder.read_to_end(&mut rest).map_err(|e| Rejection::BadCompression(e.to_string()))?;
        if rest.iter().any(|b| *b != 0) {
            return Err(Rejection::TrailingData);
        }
        if !decoder.into_inner().is_empty() {
            return Err(Rejection::TrailingData);
        }
        Ok(out)
    } else {
        let mut counted = Counted { inner: std::io::Cursor::new(archive), read: 0, cap };
        extract_tar(&mut counted, staging, limits)
    }
}

fn extract_tar<R: Read>(r: &mut R, staging: &Path, limits: &Limits) -> Result<Extracted, Rejection> {
    let mut out = Extracted::default();
    let mut names = Names::default();
    let mut pax: Option<HashMap<String, Vec<u8>>> = None;
    let mut long_name: Option<String> = None;
    let mut header = [0u8; BLOCK];
    loop {
        if !read_block(r, &mut header, limits)? {
            return Err(Rejection::Truncated); // no end marker
        }
        if header.iter().all(|b| *b == 0) {
            // The end marker is two zero blocks; after it only zero padding may follow.
            if !read_block(r, &mut header, limits)? || header.iter().any(|b| *b != 0) {
                return Err(if header.iter().any(|b| *b != 0) {
                    Rejection::TrailingData
                } else {
                    Rejection::Truncated
                });
            }
            let mut rest = [0u8; BLOCK];
            loop {
                match r.read(&mut rest) {
                    Ok(0) => break,
                    Ok(n) if rest[..n].iter().all(|b| *b == 0) => {}
                    Ok(_) => return Err(Rejection::TrailingData),
                    Err(e) if e.to_string() == "cap" => return Err(Rejection::TrailingData),
                    Err(e) => return Err(Rejection::BadCompression(e.to_string())),
                }
            }
            if pax.is_some() || long_name.is_some() {
                return Err(Rejection::MalformedHeader("an extended header with no member after it".into()));
            }
            return Ok(out);
        }
        if !checksum_ok(&header)? {
            return Err(Rejection::MalformedHeader("the checksum does not match".into()));
        }
        let magic = &header[257..263];
        let ustar = magic == b"ustar\0";
        let gnu = magic == b"ustar ";
        if !ustar && !gnu {
            return Err(Rejection::MalformedHeader("not a ustar or GNU header".into()));
        }
        let kind = header[156];
        let size = octal(&header[124..136], "the size")?;
        let mode = octal(&header[100..108], "the mode")?;
        // Extended headers: read their data, apply them to the next member.
        if matches!(kind, b'x' | b'g' | b'L' | b'K') {
            if size > 1 << 20 {
                return Err(Rejection::MalformedHeader("an extended header larger than 1 MiB".into()));
            }
            let data = read_data(r, size, limits)?;
            match kind {
                b'x' => {
                    if pax.is_some() {
                        return Err(Rejection::MalformedHeader("two PAX headers for one member".into()));
                    }
                    pax = Some(pax_records(&data)?);
                }
                b'g' => {
                    if pax_records(&data)?.keys().any(|k| k != "comment") {
                        return Err(Rejection::GlobalHeader);
                    }
                }
                b'L' => {
                    if long_name.is_some() {
                        return Err(Rejection::MalformedHeader("two long names for one member".into()));
                    }
                    long_name = Some(field_str(&data)?);
                }
                _ => return Err(Rejection::Hardlink("a GNU long link name".into())),
            }
            continue;
        }
        let ext = pax.take();
        let long = long_name.take();
        let raw_name = match (ext.as_ref().and_then(|p| p.get("path")), long) {
            (Some(p), _) => {
                String::from_utf8(p.clone()).map_err(|_| Rejection::BadName("a PAX path is not UTF-8".into()))?
            }
            (None, Some(l)) => l,
            (None, None) => {
                let name = field_str(&header[0..100])?;
                let prefix = if ustar { field_str(&header[345..500])? } else { String::new() };
                if prefix.is_empty() { name } else { format!("{prefix}/{name}") }
            }
        };
        // The type first: a link's `linkpath` is refused as the link it is.
        match kind {
            b'0' | 0 | b'5' => {}
            b'2' => return Err(Rejection::Symlink(raw_name)),
            b'1' => return Err(Rejection::Hardlink(raw_name)),
            b'3' | b'4' | b'6' | b'7' => return Err(Rejection::SpecialFile(raw_name)),
            b'S' => return Err(Rejection::Sparse(raw_name)),
            other => return Err(Rejection::UnknownType(other as char)),
        }
        if let Some(ext) = &ext {
            // Sorted, so that the key named is the same on every run.
            let mut keys: Vec<&String> = ext.keys().collect();
            keys.sort();
            for key in keys {
                match pax_use(key) {
                    PaxUse::Applied | PaxUse::Ignored => {}
                    PaxUse::Sparse => return Err(Rejection::Sparse(format!("{raw_name} (PAX key {key})"))),
                    PaxUse::Refused => return Err(Rejection::PaxKey { path: raw_name, key: key.clone() }),
                }
            }
        }
        if let Some(pax_size) = ext.as_ref().and_then(|p| p.get("size")) {
            let pax_size: u64 = std::str::from_utf8(pax_size)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Rejection::MalformedHeader(format!("{raw_name}: the PAX size is not a number")))?;
            if pax_size != size {
                return Err(Rejection::SizeConflict(raw_name));
            }
        }
        let dir = kind == b'5' || (raw_name.ends_with('/') && size == 0);
        if dir && size != 0 {
            return Err(Rejection::MalformedHeader(format!("{raw_name}: a directory with contents")));
        }
        let Some(path) = clean_path(&raw_name)? else {
            // `.` or `./`: the package's root, which is the staging directory itself.
            if !dir {
                return Err(Rejection::BadName(format!("{raw_name:?} names no file")));
            }
            continue;
        };
        names.add(&path, dir)?;
        // Every distinct path counts, the parents it implies included.
        if names.len() > limits.members {
            return Err(Rejection::TooManyMembers(limits.members));
        }
        let target = staging.join(&path);
        let io = |e: std::io::Error| Rejection::Staging(format!("{path}: {e}"));
        if dir {
            std::fs::create_dir_all(&target).map_err(io)?;
            out.dirs.push(path);
            continue;
        }
        out.bytes += size;
        if out.bytes > limits.unpacked_bytes {
            return Err(Rejection::UnpackedTooLarge(limits.unpacked_bytes));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        // create_new: never through an existing file or link (there are none: the names are checked).
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&target).map_err(io)?;
        copy_data(r, &mut f, size, limits)?;
        f.sync_all().map_err(io)?;
        // Owners are ignored; setuid, setgid, sticky and group/other write bits are dropped.
        let safe = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(safe)).map_err(io)?;
        out.files.push(path);
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn read_data<R: Read>(r: &mut R, size: u64, limits: &Limits) -> Result<Vec<u8>, Rejection> {
    let mut data = Vec::new();
    copy_data(r, &mut data, size, limits)?;
    Ok(data)
}

fn copy_data<R: Read, W: Write>(r: &mut R, w: &mut W, size: u64, limits: &Limits) -> Result<(), Rejection> {
    let mut left = size + padding(size);
    let mut written = 0u64;
    let mut buf = [0u8; 64 * 1024];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        if !read_block(r, &mut buf[..want], limits)? {
            return Err(Rejection::Truncated);
        }
        let keep = (size - written).min(want as u64) as usize;
        w.write_all(&buf[..keep]).map_err(|e| Rejection::Staging(e.to_string()))?;
        written += keep as u64;
        left -= want as u64;
    }
    Ok(())
}
