//! The runtime loader (`computer-agent load-runtime`, issue 40 item 2), through the agent's
//! binary, on archives these tests make: a good runtime (owners, modes, setuid, symlinks, hard
//! links, a sparse file, long names, big UIDs) loads and its snapshot matches; each bad archive
//! of the corpus (a hard link out of the root or to a later member, a write through a symlink
//! of the same archive, a duplicate, an undeclared parent, a FIFO, devices, 100,001 entries, a
//! declared or sparse size past 8 GiB) and each bad destination (world- or group-writable, not
//! root's, not empty, moved) is refused with its reason and nothing published. The loader is
//! killed (SIGKILL) at each publish step, after it said on stderr that it paused there, and the
//! next run completes.
//!
//! The loader keeps numeric owners, so these tests run as root and say so when they are not.

use std::io::BufRead;
use std::io::BufReader;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::process::Stdio;

use computer_agent::runtime_load;
use computer_agent::runtime_load::Limits;
use computer_agent::runtime_load::Snapshot;
use serde_json::Value;
use serde_json::json;
use tar::EntryType as T;

const BIN: &str = env!("CARGO_BIN_EXE_computer-agent");
const MTIME: u64 = 1_600_000_000;
const BIG_UID: u64 = 3_000_000; // past 7 octal digits: a base-256 header field

fn assert_root() {
    assert!(nix::unistd::geteuid().is_root(), "the runtime loader keeps numeric owners: run this test as root");
}

/// A protected destination root (root's, mode 0755) in a temporary directory.
struct Dest {
    tmp: tempfile::TempDir,
    root: PathBuf,
}

fn dest() -> Dest {
    assert_root();
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("runtime");
    std::fs::create_dir(&root).expect("mkdir");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Dest { tmp, root }
}

fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn assert_nothing_published(root: &Path, what: &str) {
    assert_eq!(names(root), Vec::<String>::new(), "{what}: something was left in the destination");
}

#[derive(Debug)]
struct Run {
    code: i32,
    json: Value,
    stderr: String,
}

impl Run {
    fn reason(&self) -> &str {
        self.json["error"]["reason"].as_str().unwrap_or("")
    }
    fn member(&self) -> &str {
        self.json["error"]["member"].as_str().unwrap_or("")
    }
    fn snapshot(&self) -> &str {
        self.json["snapshot"].as_str().unwrap_or("")
    }
}

fn finish(out: std::process::Output) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    Run { code: out.status.code().unwrap_or(-1), json, stderr: String::from_utf8_lossy(&out.stderr).into_owned() }
}

fn load_file(archive: &Path, into: &Path, extra: &[&str]) -> Run {
    let out = Command::new(BIN)
        .arg("load-runtime")
        .arg("--archive")
        .arg(archive)
        .arg("--into")
        .arg(into)
        .args(extra)
        .env_remove(runtime_load::PAUSE_ENV)
        .output()
        .expect("run the loader");
    finish(out)
}

fn load_stdin(bytes: &[u8], into: &Path, extra: &[&str]) -> Run {
    let mut child = Command::new(BIN)
        .args(["load-runtime", "--archive", "-", "--into"])
        .arg(into)
        .args(extra)
        .env_remove(runtime_load::PAUSE_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the loader");
    let mut stdin = child.stdin.take().expect("stdin");
    // The loader may refuse before it has read everything: a broken pipe is fine.
    let _ = stdin.write_all(bytes);
    drop(stdin);
    finish(child.wait_with_output().expect("wait"))
}

fn write_archive(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write the archive");
    p
}

/// Archives member by member, with headers written by hand where a builder would refuse them.
struct Ar(tar::Builder<Vec<u8>>);

impl Ar {
    fn new() -> Self {
        Ar(tar::Builder::new(Vec::new()))
    }

    fn header(kind: T, path: &str, size: u64, mode: u32, uid: u64, gid: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(MTIME);
        assert!(path.len() <= 100, "raw names fit the header");
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h
    }

    fn push(&mut self, mut h: tar::Header, data: &[u8]) -> &mut Self {
        h.set_cksum();
        self.0.append(&h, data).expect("append");
        self
    }

    #[allow(clippy::too_many_arguments)]
    fn raw(
        &mut self,
        kind: T,
        path: &str,
        data: &[u8],
        link: Option<&str>,
        mode: u32,
        uid: u64,
        gid: u64,
    ) -> &mut Self {
        let mut h = Self::header(kind, path, data.len() as u64, mode, uid, gid);
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        self.push(h, data)
    }

    fn dir(&mut self, path: &str, mode: u32, uid: u64, gid: u64) -> &mut Self {
        self.raw(T::Directory, path, b"", None, mode, uid, gid)
    }

    fn file(&mut self, path: &str, data: &[u8], mode: u32, uid: u64, gid: u64) -> &mut Self {
        self.raw(T::Regular, path, data, None, mode, uid, gid)
    }

    fn symlink(&mut self, path: &str, target: &str, uid: u64, gid: u64) -> &mut Self {
        self.raw(T::Symlink, path, b"", Some(target), 0o777, uid, gid)
    }

    fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.raw(T::Link, path, b"", Some(target), 0o644, 0, 0)
    }

    /// A member whose name does not fit the header: a GNU long name record before it.
    fn long(&mut self, kind: T, path: &str, data: &[u8], mode: u32) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        self.0.append_data(&mut h, path, data).expect("append a long name");
        self
    }

    /// A GNU sparse member of `real` bytes whose only data is `data` at `at` (512-aligned).
    fn sparse(&mut self, path: &str, real: u64, at: u64, data: &[u8]) -> &mut Self {
        let mut h = Self::header(T::GNUSparse, path, data.len() as u64, 0o644, 0, 0);
        let gnu = h.as_gnu_mut().expect("a GNU header");
        gnu.sparse[0].set_offset(at);
        gnu.sparse[0].set_length(data.len() as u64);
        if at + (data.len() as u64) < real {
            // A hole at the end: a last map entry at the real size, of no length.
            gnu.sparse[1].set_offset(real);
            gnu.sparse[1].set_length(0);
        }
        gnu.set_real_size(real);
        self.push(h, data)
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().expect("finish the archive")
    }
}

/// Bytes that do not compress away.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const SPARSE_REAL: u64 = 1 << 20;
const SPARSE_AT: u64 = 512 << 10;

fn long_dir() -> String {
    format!("registry/{}", "a-long-package-name".repeat(8))
}

fn long_name() -> String {
    format!("{}/manifest.json", long_dir())
}

/// A runtime like a Computer's: a registry, a package cache, private executables, tool state.
fn good_runtime() -> Vec<u8> {
    let mut a = Ar::new();
    a.dir("./", 0o755, 0, 0)
        .dir("./registry/", 0o755, 0, 0)
        .file("./registry/tools.json", b"{\"tools\":2}\n", 0o644, 0, 0)
        .dir("./cache/", 0o2750, 1000, 1000)
        .file("./cache/pkg-a.tgz", &noise(300_000, 1), 0o640, 1000, 1000)
        .file("./cache/pkg-b.tgz", &noise(70_000, 2), 0o640, 1000, 1000)
        .dir("./bin/", 0o755, 0, 0)
        .file("./bin/tool", b"#!/bin/sh\necho tool\n", 0o755, 0, 0)
        .file("./bin/suid", b"\x7fELF", 0o4755, 0, 0)
        .hardlink("./bin/tool-again", "./bin/tool")
        .symlink("./bin/python", "/usr/bin/python3", 0, 0)
        .dir("./state/", 0o711, 0, 0)
        .dir("./state/b1/", 0o700, BIG_UID, BIG_UID + 1)
        .file("./state/b1/data.db", &noise(4096, 3), 0o600, BIG_UID, BIG_UID + 1)
        .file("./state/b1/empty", b"", 0o600, BIG_UID, BIG_UID + 1)
        .symlink("./state/b1/pkg", "../../cache/pkg-a.tgz", BIG_UID, BIG_UID + 1)
        .dir("./state/ro/", 0o500, 0, 0)
        .sparse("./state/ro/sparse.img", SPARSE_REAL, SPARSE_AT, &[b'S'; 512])
        .long(T::Directory, &format!("{}/", long_dir()), b"", 0o755)
        .long(T::Regular, &long_name(), b"{\"long\":true}", 0o644);
    a.bytes()
}

const GOOD_ENTRIES: u64 = 20;

fn meta(root: &Path, rel: &str) -> std::fs::Metadata {
    std::fs::symlink_metadata(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// What [`good_runtime`] must look like once published.
fn assert_good_tree(root: &Path) {
    let owner_mode = |rel: &str, uid: u64, gid: u64, mode: u32| {
        let m = meta(root, rel);
        assert_eq!((u64::from(m.uid()), u64::from(m.gid())), (uid, gid), "{rel}: owner");
        assert_eq!(m.mode() & 0o7777, mode, "{rel}: mode {:o}", m.mode() & 0o7777);
    };
    assert_eq!(names(root), ["bin", "cache", "registry", "state"], "the top of the published runtime");
    owner_mode("registry", 0, 0, 0o755);
    owner_mode("cache", 1000, 1000, 0o2750);
    owner_mode("cache/pkg-a.tgz", 1000, 1000, 0o640);
    owner_mode("bin/tool", 0, 0, 0o755);
    owner_mode("bin/suid", 0, 0, 0o4755);
    owner_mode("state", 0, 0, 0o711);
    owner_mode("state/b1", BIG_UID, BIG_UID + 1, 0o700);
    owner_mode("state/b1/data.db", BIG_UID, BIG_UID + 1, 0o600);
    owner_mode("state/ro", 0, 0, 0o500);
    assert_eq!(std::fs::read(root.join("cache/pkg-a.tgz")).expect("read"), noise(300_000, 1));
    assert_eq!(std::fs::read(root.join("state/b1/data.db")).expect("read"), noise(4096, 3));
    assert_eq!(meta(root, "state/b1/empty").len(), 0);
    assert_eq!(meta(root, "bin/tool").ino(), meta(root, "bin/tool-again").ino(), "the hard link");
    assert_eq!(meta(root, "bin/tool").nlink(), 2);
    assert_eq!(std::fs::read_link(root.join("bin/python")).expect("readlink"), Path::new("/usr/bin/python3"));
    assert_eq!(std::fs::read_link(root.join("state/b1/pkg")).expect("readlink"), Path::new("../../cache/pkg-a.tgz"));
    assert_eq!(meta(root, "state/b1/pkg").uid(), BIG_UID as u32, "a symlink's own owner");
    assert_eq!(meta(root, "bin/tool").mtime(), MTIME as i64, "mtime kept");
    let sparse = std::fs::read(root.join("state/ro/sparse.img")).expect("read");
    assert_eq!(sparse.len() as u64, SPARSE_REAL);
    let at = SPARSE_AT as usize;
    assert!(sparse[..at].iter().all(|b| *b == 0) && sparse[at + 512..].iter().all(|b| *b == 0));
    assert!(sparse[at..at + 512].iter().all(|b| *b == b'S'));
    assert!(meta(root, "state/ro/sparse.img").blocks() * 512 < SPARSE_REAL, "the holes stay holes");
    assert_eq!(std::fs::read(root.join(long_name())).expect("the long name"), b"{\"long\":true}");
}

fn good_snapshot(bytes: &[u8]) -> Snapshot {
    runtime_load::snapshot_archive(bytes, Limits::default()).expect("the good archive's snapshot").0
}

#[test]
fn a_good_runtime_loads_with_owners_modes_links_and_a_matching_snapshot() {
    let d = dest();
    let bytes = good_runtime();
    let expected = good_snapshot(&bytes);
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    let run = load_file(&archive, &d.root, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.snapshot(), expected.to_string(), "the archive's snapshot");
    assert_eq!(run.json["entries"], GOOD_ENTRIES);
    assert_eq!(run.json["resumed"], false);
    assert_good_tree(&d.root);
    assert_eq!(runtime_load::snapshot_tree(&d.root).expect("snapshot the tree"), expected, "the tree's snapshot");

    // gzip, from standard input, bound to the snapshot: the same tree.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes).expect("gzip");
    let gz = gz.finish().expect("gzip");
    let d2 = dest();
    let run = load_stdin(&gz, &d2.root, &["--expect-snapshot", &expected.to_string()]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.snapshot(), expected.to_string());
    assert_good_tree(&d2.root);

    // Loaded again into the same root: refused, the first load kept.
    let again = load_file(&archive, &d.root, &[]);
    assert_eq!((again.code, again.reason()), (1, "destination_not_empty"), "{again:?}");
    assert_good_tree(&d.root);
}

#[test]
fn a_changed_tree_changes_the_snapshot() {
    let d = dest();
    let bytes = good_runtime();
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    assert_eq!(load_file(&archive, &d.root, &[]).code, 0);
    let before = runtime_load::snapshot_tree(&d.root).expect("snapshot");
    type Change = Box<dyn Fn(&Path)>;
    let changes: [(&str, Change); 4] = [
        (
            "a mode",
            Box::new(|p| std::fs::set_permissions(p.join("bin/tool"), std::fs::Permissions::from_mode(0o700)).unwrap()),
        ),
        ("an owner", Box::new(|p| std::os::unix::fs::lchown(p.join("bin/python"), Some(7), None).unwrap())),
        ("a byte", Box::new(|p| std::fs::write(p.join("registry/tools.json"), b"{\"tools\":3}\n").unwrap())),
        ("a name", Box::new(|p| std::fs::rename(p.join("state/b1/empty"), p.join("state/b1/empty2")).unwrap())),
    ];
    let mut seen = vec![before];
    for (what, change) in changes {
        change(&d.root);
        let now = runtime_load::snapshot_tree(&d.root).expect("snapshot");
        assert!(!seen.contains(&now), "changing {what} left the snapshot as it was");
        seen.push(now);
    }
}

/// The corpus: each archive, its reason and the member named.
fn corpus() -> Vec<(&'static str, Vec<u8>, &'static str, String)> {
    let mut out = Vec::new();
    let mut add = |name, a: &mut Ar, reason, member: &str| {
        let bytes = std::mem::replace(a, Ar::new()).bytes();
        out.push((name, bytes, reason, member.to_string()));
    };
    add(
        "hard link outside the root",
        Ar::new().dir("d/", 0o755, 0, 0).hardlink("d/passwd", "../../../etc/passwd"),
        "hardlink_outside_root",
        "d/passwd",
    );
    add(
        "hard link to an absolute path",
        Ar::new().dir("d/", 0o755, 0, 0).hardlink("d/shadow", "/etc/shadow"),
        "hardlink_outside_root",
        "d/shadow",
    );
    add(
        "hard link to a later member",
        Ar::new().dir("d/", 0o755, 0, 0).hardlink("d/early", "d/late").file("d/late", b"x", 0o644, 0, 0),
        "hardlink_not_earlier",
        "d/early",
    );
    add(
        "symlink escape, then a write through it",
        Ar::new().symlink("esc", "/tmp", 0, 0).file("esc/planted", b"pwned", 0o644, 0, 0),
        "escape_through_symlink",
        "esc/planted",
    );
    add(
        "symlink to .., then a directory through it",
        Ar::new().dir("d/", 0o755, 0, 0).symlink("d/up", "../..", 0, 0).dir("d/up/x/", 0o755, 0, 0),
        "escape_through_symlink",
        "d/up/x/",
    );
    add(
        "duplicate member",
        Ar::new().dir("d/", 0o755, 0, 0).file("d/f", b"1", 0o644, 0, 0).file("./d//f", b"2", 0o644, 0, 0),
        "duplicate_member",
        "./d//f",
    );
    add("undeclared parent", Ar::new().file("nowhere/f", b"1", 0o644, 0, 0), "undeclared_parent", "nowhere/f");
    add(
        "FIFO",
        Ar::new().dir("d/", 0o755, 0, 0).raw(T::Fifo, "d/fifo", b"", None, 0o644, 0, 0),
        "special_file",
        "d/fifo",
    );
    add(
        "character device",
        Ar::new().dir("d/", 0o755, 0, 0).raw(T::Char, "d/null", b"", None, 0o666, 0, 0),
        "special_file",
        "d/null",
    );
    add(
        "block device",
        Ar::new().dir("d/", 0o755, 0, 0).raw(T::Block, "d/sda", b"", None, 0o660, 0, 0),
        "special_file",
        "d/sda",
    );
    add("absolute path", Ar::new().file("/etc/cron.d/x", b"1", 0o644, 0, 0), "absolute_path", "/etc/cron.d/x");
    add("dot-dot", Ar::new().dir("d/", 0o755, 0, 0).file("d/../../x", b"1", 0o644, 0, 0), "path_escape", "d/../../x");
    // 9 GiB declared in a sparse header, 512 bytes of data in the archive.
    add(
        "sparse file of 9 GiB",
        Ar::new().dir("d/", 0o755, 0, 0).sparse("d/huge.img", 9 << 30, (9 << 30) - 512, &[1u8; 512]),
        "too_large",
        "d/huge.img",
    );
    out
}

/// A header that declares 8 GiB + 1 byte, with no data after it (an archive cut short).
fn declared_over_8_gib() -> Vec<u8> {
    let mut a = Ar::new();
    a.dir("d/", 0o755, 0, 0);
    let h = Ar::header(T::Regular, "d/big", runtime_load::MAX_BYTES + 1, 0o644, 0, 0);
    let mut h = h;
    h.set_cksum();
    let mut bytes = a.bytes();
    bytes.truncate(bytes.len() - 1024); // the end-of-archive blocks
    bytes.extend_from_slice(h.as_bytes());
    bytes.extend_from_slice(&[0u8; 4096]);
    bytes
}

/// The root's own member and 100,000 files: 100,001 entries.
fn too_many_entries() -> Vec<u8> {
    let mut a = Ar::new();
    a.dir("d/", 0o755, 0, 0);
    for i in 0..runtime_load::MAX_ENTRIES {
        a.file(&format!("d/{i}"), b"", 0o644, 0, 0);
    }
    a.bytes()
}

fn assert_refused(run: &Run, name: &str, reason: &str, member: &str) {
    assert_eq!(run.code, 1, "{name}: {run:?}");
    assert_eq!(run.reason(), reason, "{name}: {run:?}");
    assert_eq!(run.member(), member, "{name}: {run:?}");
    assert!(
        run.stderr.contains(member) && !run.stderr.is_empty(),
        "{name}: the message names the member: {}",
        run.stderr
    );
}

#[test]
fn each_bad_archive_is_refused_with_its_reason_and_nothing_published() {
    let outside = tempfile::tempdir().expect("tempdir");
    let mut corpus = corpus();
    // The escape's symlink points at a directory these tests watch.
    for (name, bytes, _, _) in corpus.iter_mut() {
        if name.starts_with("symlink escape") {
            let target = outside.path().to_str().expect("utf-8 path");
            let mut a = Ar::new();
            a.symlink("esc", target, 0, 0).file("esc/planted", b"pwned", 0o644, 0, 0);
            *bytes = a.bytes();
        }
    }
    corpus.push(("declared size of 8 GiB + 1", declared_over_8_gib(), "too_large", "d/big".into()));
    for (name, bytes, reason, member) in &corpus {
        let d = dest();
        let archive = write_archive(d.tmp.path(), "bad.tar", bytes);
        let run = load_file(&archive, &d.root, &[]);
        assert_refused(&run, name, reason, member);
        assert_nothing_published(&d.root, name);
        // The same archive streamed (standard input): checked member by member as it is read.
        let run = load_stdin(bytes, &d.root, &[]);
        assert_refused(&run, &format!("{name}, streamed"), reason, member);
        assert_nothing_published(&d.root, name);
    }
    assert_eq!(names(outside.path()), Vec::<String>::new(), "nothing was written through the symlink");
}

#[test]
fn an_archive_of_100001_entries_is_refused() {
    let d = dest();
    let bytes = too_many_entries();
    let archive = write_archive(d.tmp.path(), "many.tar", &bytes);
    let run = load_file(&archive, &d.root, &[]);
    assert_refused(&run, "100,001 entries", "too_many_entries", "d/99999");
    assert_nothing_published(&d.root, "100,001 entries");
    // Streamed, the first 100,000 are staged before the last is read; then all go.
    let run = load_stdin(&bytes, &d.root, &[]);
    assert_refused(&run, "100,001 entries, streamed", "too_many_entries", "d/99999");
    assert_nothing_published(&d.root, "100,001 entries, streamed");
}

#[test]
fn an_unprotected_root_is_refused() {
    let bytes = good_runtime();
    let cases: [(&str, u32, u32); 4] = [
        ("world-writable", 0o777, 0),
        ("group-writable", 0o775, 0),
        ("world-writable and sticky", 0o1777, 0),
        ("owned by uid 1000", 0o755, 1000),
    ];
    for (name, mode, uid) in cases {
        let d = dest();
        std::fs::set_permissions(&d.root, std::fs::Permissions::from_mode(mode)).expect("chmod");
        std::os::unix::fs::chown(&d.root, Some(uid), None).expect("chown");
        let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
        let run = load_file(&archive, &d.root, &[]);
        assert_eq!((run.code, run.reason()), (1, "unprotected_root"), "{name}: {run:?}");
        assert!(run.stderr.contains("not protected"), "{name}: {}", run.stderr);
        assert_nothing_published(&d.root, name);
    }
}

#[test]
fn a_non_empty_destination_or_another_snapshot_is_not_overwritten() {
    let bytes = good_runtime();
    let d = dest();
    std::fs::write(d.root.join("keep"), b"mine").expect("write");
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    let run = load_file(&archive, &d.root, &[]);
    assert_eq!((run.code, run.reason()), (1, "destination_not_empty"), "{run:?}");
    assert_eq!(names(&d.root), ["keep"]);
    assert_eq!(std::fs::read(d.root.join("keep")).expect("read"), b"mine");

    let d = dest();
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    let other = "00".repeat(32);
    let run = load_file(&archive, &d.root, &["--expect-snapshot", &other]);
    assert_eq!((run.code, run.reason()), (1, "snapshot_mismatch"), "{run:?}");
    assert!(run.stderr.contains(&other), "{}", run.stderr);
    assert_nothing_published(&d.root, "a snapshot mismatch");
}

/// Starts the loader with a pause at `step` and SIGKILLs it once it says it is there.
fn kill_at(archive: &Path, into: &Path, step: &str) {
    let mut child = Command::new(BIN)
        .args(["load-runtime", "--archive"])
        .arg(archive)
        .arg("--into")
        .arg(into)
        .env(runtime_load::PAUSE_ENV, step)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the loader");
    let marker = format!("{}{step}", runtime_load::PAUSE_MARKER);
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut said = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if line == marker => break,
            Some(Ok(line)) => said.push(line),
            _ => {
                let out = child.wait_with_output().expect("wait");
                panic!("the loader ended before pausing at {step}: {said:?} {out:?}");
            }
        }
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "killed at {step}");
}

#[test]
fn killed_at_each_publish_step_the_next_run_completes() {
    let bytes = good_runtime();
    let expected = good_snapshot(&bytes);
    let published = ["bin", "cache", "registry", "state"];
    for step in runtime_load::STEPS {
        let d = dest();
        let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
        kill_at(&archive, &d.root, step);
        let left = names(&d.root);
        let has = |n: &str| left.iter().any(|l| l == n);
        let journaled = step != "staged";
        assert_eq!(has(runtime_load::JOURNAL), journaled, "{step}: the journal: {left:?}");
        assert_eq!(has(runtime_load::STAGING), step != "cleaned", "{step}: staging: {left:?}");
        let out: Vec<&str> = published.iter().copied().filter(|n| has(n)).collect();
        let want: &[&str] = match step {
            "staged" | "journaled" => &[],
            "moving" => &published[..1],
            _ => &published,
        };
        assert_eq!(out, want, "{step}: what was published when it was killed");

        let run = load_file(&archive, &d.root, &[]);
        assert_eq!(run.code, 0, "{step}: the next run: {run:?}");
        assert_eq!(run.snapshot(), expected.to_string(), "{step}");
        assert_eq!(run.json["resumed"], journaled, "{step}: {run:?}");
        assert_eq!(run.json["entries"], GOOD_ENTRIES, "{step}");
        assert_good_tree(&d.root);
        assert_eq!(runtime_load::snapshot_tree(&d.root).expect("snapshot"), expected, "{step}");
    }
}

#[test]
fn without_a_pause_it_completes_and_a_wrong_step_is_refused() {
    let d = dest();
    let archive = write_archive(d.tmp.path(), "good.tar", &good_runtime());
    let out = Command::new(BIN)
        .args(["load-runtime", "--archive"])
        .arg(&archive)
        .arg("--into")
        .arg(&d.root)
        .env(runtime_load::PAUSE_ENV, "nowhere")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_nothing_published(&d.root, "a wrong step");
    let run = load_file(&archive, &d.root, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_good_tree(&d.root);
}

#[test]
fn a_moved_data_dir_is_not_published_into() {
    let bytes = good_runtime();
    let d = dest();
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    kill_at(&archive, &d.root, "moving");
    // The data dir copied elsewhere (a restore, a move across file systems): a new inode.
    let moved = d.tmp.path().join("moved");
    let cp = Command::new("cp").arg("-a").arg(&d.root).arg(&moved).status().expect("cp");
    assert!(cp.success());
    let before = names(&moved);
    let run = load_file(&archive, &moved, &[]);
    assert_eq!((run.code, run.reason()), (1, "destination_moved"), "{run:?}");
    assert_eq!(names(&moved), before, "nothing moved in the copy");
    assert!(names(&moved).iter().any(|n| n == runtime_load::JOURNAL), "the journal stays");
    // The original resumes.
    let run = load_file(&archive, &d.root, &[]);
    assert_eq!((run.code, run.json["resumed"].clone()), (0, Value::Bool(true)), "{run:?}");
    assert_good_tree(&d.root);
}

#[test]
fn a_second_loader_on_the_same_root_is_refused_while_the_first_holds_it() {
    let bytes = good_runtime();
    let d = dest();
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    let mut first = Command::new(BIN)
        .args(["load-runtime", "--archive"])
        .arg(&archive)
        .arg("--into")
        .arg(&d.root)
        .env(runtime_load::PAUSE_ENV, "journaled")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let mut lines = BufReader::new(first.stderr.take().expect("stderr")).lines();
    let marker = format!("{}journaled", runtime_load::PAUSE_MARKER);
    assert!(lines.any(|l| l.is_ok_and(|l| l == marker)), "the first loader did not pause");
    let run = load_file(&archive, &d.root, &[]);
    assert_eq!((run.code, run.reason()), (1, "busy"), "{run:?}");
    first.kill().expect("kill");
    first.wait().expect("wait");
    let run = load_file(&archive, &d.root, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_good_tree(&d.root);
}

#[test]
fn a_device_in_the_destination_tree_is_not_snapshotted_as_a_file() {
    // The walk refuses what the loader never makes (here a FIFO placed in a tree by hand).
    assert_root();
    let d = dest();
    nix::unistd::mkfifo(&d.root.join("p"), nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
    assert!(meta(&d.root, "p").file_type().is_fifo());
    let err = runtime_load::snapshot_tree(&d.root).expect_err("a FIFO in the tree");
    assert_eq!(err.reason(), "unexpected_in_tree");
}

/// Issue 40, item 3: a migration tried again after its publish (a later step of the recreate
/// failed) loads the same archive into a root that already holds it: with `--or-same` that is
/// done, nothing written; another tree there is still refused, and the layout marker the agent
/// writes at the top is neither content nor part of the snapshot.
#[test]
fn i40_or_same_finds_the_same_tree_done_and_refuses_another() {
    let bytes = good_runtime();
    let d = dest();
    let archive = write_archive(d.tmp.path(), "good.tar", &bytes);
    let first = load_file(&archive, &d.root, &[]);
    assert_eq!(first.code, 0, "{first:?}");
    std::fs::write(d.root.join(runtime_load::LAYOUT_MARKER), "computerd-runtime-layout 1\n").expect("marker");
    let before = runtime_load::snapshot_tree(&d.root).expect("snapshot");
    assert_eq!(before.to_string(), first.snapshot(), "the marker is not part of the snapshot");
    let plain = load_stdin(&bytes, &d.root, &[]);
    assert_eq!((plain.code, plain.reason()), (1, "destination_not_empty"), "{plain:?}");
    let again = load_stdin(&bytes, &d.root, &["--or-same"]);
    assert_eq!(
        (again.code, again.snapshot(), &again.json["resumed"]),
        (0, first.snapshot(), &json!(true)),
        "{again:?}"
    );
    let after = runtime_load::snapshot_tree(&d.root).expect("snapshot");
    assert_eq!(after.to_string(), before.to_string(), "nothing was written");
    std::fs::write(d.root.join("extra"), b"x").expect("write");
    let other = load_file(&archive, &d.root, &["--or-same"]);
    assert_eq!((other.code, other.reason()), (1, "destination_not_empty"), "{other:?}");
    let wrong = load_stdin(&bytes, &d.root, &["--or-same", "--expect-snapshot", &"00".repeat(32)]);
    assert_eq!((wrong.code, wrong.reason()), (1, "snapshot_mismatch"), "{wrong:?}");
}
