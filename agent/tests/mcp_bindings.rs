//! Bindings through the agent's own request handler ([`Tools::handle`]), as root with real UIDs
//! (CI runs as root; these fail, never skip, without it):
//!
//! - package identity: a package is (bot, id, version, full SHA-256): the same id and version
//!   with other bytes is not "already installed" (not even when the 12 digits of the digest in
//!   its directory's name are the same); a switch moves a binding only to a version its own bot
//!   installed here, whose record and bytes are still what that install published.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;

use computer_agent::mcp::archive::Limits;
use computer_agent::mcp::bindings::McpReply;
use computer_agent::mcp::bindings::McpRequest;
use computer_agent::mcp::bindings::Tools;
use computer_agent::mcp::install;
use computer_agent::mcp::install::Manifest;
use computer_agent::mcp::runner::RunLimits;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

const PACKAGE: &str = "example.mcp.server";

struct Bed {
    root: tempfile::TempDir,
    tools: Tools,
    first_uid: u32,
}

impl Bed {
    /// A runtime and a workspace of their own; binding UIDs from `first_uid` on (distinct per
    /// test: tests run side by side).
    fn new(first_uid: u32) -> Self {
        assert_eq!(nix::unistd::geteuid().as_raw(), 0, "the bindings' tests need root (bindings get their own UIDs)");
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir_all(root.path().join("workspace/uploads")).expect("workspace");
        let tools =
            Tools::new(root.path().join("runtime"), root.path().join("workspace"), RunLimits::default(), first_uid);
        Bed { root, tools, first_uid }
    }

    fn runtime(&self) -> PathBuf {
        self.root.path().join("runtime")
    }

    /// Packs the fixture server (its echo answering `prefix` + text) as `uploads/<name>`;
    /// answers the archive's SHA-256.
    fn pack(&self, name: &str, prefix: &str) -> String {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture_server.py");
        let source = std::fs::read_to_string(src).expect("fixture").replace(
            "return args.get(\"text\", \"\"), False",
            &format!("return {prefix:?} + args.get(\"text\", \"\"), False"),
        );
        let dir = self.root.path().join(format!("src-{name}"));
        std::fs::create_dir_all(&dir).expect("src");
        std::fs::write(dir.join("server.py"), source).expect("server");
        let archive = self.root.path().join("workspace/uploads").join(name);
        let out = Command::new("tar").arg("-C").arg(&dir).arg("-czf").arg(&archive).arg("server.py").output();
        let out = out.expect("tar");
        assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
        hex::encode(sha2::Sha256::digest(std::fs::read(&archive).expect("archive")))
    }

    async fn install(&self, binding: &str, bot: &str, artifact: &str, version: &str, sha: &str) -> McpReply {
        let manifest = json!({"id": PACKAGE, "version": version, "sha256": sha,
                              "entrypoint": ["python3", "./server.py"], "share_immutable_package": true});
        self.tools
            .handle(McpRequest::Install {
                binding_id: binding.into(),
                bot_id: bot.into(),
                artifact_path: format!("uploads/{artifact}"),
                manifest,
            })
            .await
    }

    /// Installs and answers the binding's UID.
    async fn bind(&self, binding: &str, bot: &str, artifact: &str, version: &str, sha: &str) -> u32 {
        let r = self.install(binding, bot, artifact, version, sha).await;
        let uid = ok(&r)["uid"].as_u64().expect("uid") as u32;
        assert!(uid >= self.first_uid, "{r:?}");
        uid
    }

    async fn echo(&self, binding: &str, text: &str) -> McpReply {
        let arguments = json!({"text": text}).as_object().cloned().unwrap_or_default();
        self.tools.handle(McpRequest::Call { binding_id: binding.into(), tool: "echo".into(), arguments }).await
    }

    async fn switch(&self, binding: &str, op: &str, from: &str, to: &str) -> McpReply {
        self.tools
            .handle(McpRequest::Switch {
                binding_id: binding.into(),
                operation_id: op.into(),
                from_version: from.into(),
                version: to.into(),
            })
            .await
    }

    /// The published directory of `version` of the package (there is one per version).
    fn package_dir(&self, version: &str) -> PathBuf {
        let home = self.runtime().join("packages").join(PACKAGE);
        let dirs: Vec<PathBuf> = std::fs::read_dir(&home)
            .expect("packages")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && install::record(p).is_some_and(|r| r.manifest.version == version))
            .collect();
        assert_eq!(dirs.len(), 1, "one directory of {version}: {dirs:?}");
        dirs[0].clone()
    }
}

fn ok(r: &McpReply) -> &Value {
    r.result.as_ref().unwrap_or_else(|| panic!("refused: {r:?}"))
}

fn reason(r: &McpReply) -> &str {
    r.error.as_ref().map(|e| e.reason.as_str()).unwrap_or("<none>")
}

fn echoed(r: &McpReply) -> String {
    ok(r)["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

/// install's "already installed" compares the full digest: the same id and version with other
/// bytes is refused, even where the directory its digest's first 12 digits name is taken.
#[test]
fn the_same_id_and_version_with_other_bytes_is_not_already_installed() {
    assert_eq!(nix::unistd::geteuid().as_raw(), 0, "needs root");
    let bed_root = tempfile::tempdir().expect("tempdir");
    let ws = bed_root.path().join("workspace");
    std::fs::create_dir_all(&ws).expect("ws");
    let runtime = bed_root.path().join("runtime");
    let pack = |name: &str, text: &str| {
        let dir = bed_root.path().join(format!("src-{name}"));
        std::fs::create_dir_all(&dir).expect("src");
        std::fs::write(dir.join("server.py"), text).expect("server");
        let out = Command::new("tar").arg("-C").arg(&dir).arg("-czf").arg(ws.join(name)).arg("server.py").output();
        assert!(out.expect("tar").status.success());
        hex::encode(sha2::Sha256::digest(std::fs::read(ws.join(name)).expect("archive")))
    };
    let manifest = |sha: &str| Manifest {
        id: PACKAGE.into(),
        version: "1.0.0".into(),
        sha256: sha.into(),
        entrypoint: vec!["python3".into(), "./server.py".into()],
        share_immutable_package: true,
    };
    let (a, b) = (pack("a.tar.gz", "print('a')\n"), pack("b.tar.gz", "print('b')\n"));
    let lim = Limits::default();
    let first = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim).expect("a installs");
    assert!(first.new);
    let again = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim).expect("a again");
    assert!(!again.new && again.dir == first.dir && again.tree_digest == first.tree_digest);
    let r = install::install(&ws, "b.tar.gz", &manifest(&b), &runtime, &lim);
    assert_eq!(r.map(|i| i.dir).map_err(|e| e.reason()), Err("version_exists"));

    // A package whose digest has b's first 12 digits (48 bits) but is not b's: stand a's files
    // and record where b would be published.
    let home = runtime.join("packages").join(PACKAGE);
    let squat = home.join(format!("1.0.0-{}", &b[..12]));
    std::fs::rename(&first.dir, &squat).expect("move");
    let mut record = first.dir.as_os_str().to_owned();
    record.push(".json");
    let mut moved = squat.as_os_str().to_owned();
    moved.push(".json");
    std::fs::rename(record, &moved).expect("move the record");
    let r = install::install(&ws, "b.tar.gz", &manifest(&b), &runtime, &lim);
    assert_eq!(r.map(|i| (i.dir, i.new)).map_err(|e| e.reason()), Err("version_exists"), "not b's package");
    // a itself is still found there, by its record.
    let again = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim).expect("a again");
    assert_eq!((again.dir.clone(), again.new), (squat.clone(), false));

    // Its files changed: not "already installed" either.
    std::fs::write(squat.join("server.py"), "print('changed')\n").expect("write");
    let r = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim);
    assert_eq!(r.map(|i| i.dir).map_err(|e| e.reason()), Err("package_changed"));
}

#[tokio::test]
async fn another_bots_install_of_the_same_version_with_other_bytes_is_refused() {
    let bed = Bed::new(62_400);
    let mine = bed.pack("mine.tar.gz", "");
    let theirs = bed.pack("theirs.tar.gz", "theirs:");
    bed.bind("mcb_a", "bot_a", "mine.tar.gz", "1.0.0", &mine).await;
    let r = bed.install("mcb_b", "bot_b", "theirs.tar.gz", "1.0.0", &theirs).await;
    assert_eq!(reason(&r), "version_exists", "{r:?}");
    let r = bed.echo("mcb_b", "hi").await;
    assert_eq!(reason(&r), "no_binding", "{r:?}");
    // The same binding id sent again for another bot or digest is not the binding that is there.
    let r = bed.install("mcb_a", "bot_b", "mine.tar.gz", "1.0.0", &mine).await;
    assert_eq!(reason(&r), "binding_exists", "{r:?}");
    let r = bed.install("mcb_a", "bot_a", "theirs.tar.gz", "1.0.0", &theirs).await;
    assert_eq!(reason(&r), "binding_exists", "{r:?}");
    let r = bed.install("mcb_a", "bot_a", "mine.tar.gz", "1.0.0", &mine).await;
    assert!(ok(&r)["tools"].is_array(), "the install sent again is answered: {r:?}");
}

/// Bot A installs version 1.1.0 with its own code; bot B's binding at 1.0.0 cannot be switched
/// to it. Once B installs 1.1.0 itself (the same bytes, which B then vouches for), it can.
#[tokio::test]
async fn a_switch_to_a_version_another_bot_installed_is_refused() {
    let bed = Bed::new(62_500);
    let v1 = bed.pack("v1.tar.gz", "");
    let evil = bed.pack("evil.tar.gz", "a's code:");
    bed.bind("mcb_b", "bot_b", "v1.tar.gz", "1.0.0", &v1).await;
    bed.bind("mcb_a", "bot_a", "evil.tar.gz", "1.1.0", &evil).await;

    let r = bed.switch("mcb_b", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "version_not_installed", "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_b", "hi").await), "hi", "b still runs its own code");
    // A version name that an installed one (of the same bot) only starts with is no version.
    bed.bind("mcb_b3", "bot_b", "v1.tar.gz", "1.2-rc1", &v1).await;
    let r = bed.switch("mcb_b", "sw-2", "1.0.0", "1.2").await;
    assert_eq!(reason(&r), "version_not_installed", "{r:?}");

    bed.bind("mcb_b2", "bot_b", "evil.tar.gz", "1.1.0", &evil).await;
    let r = bed.switch("mcb_b", "sw-3", "1.0.0", "1.1.0").await;
    assert_eq!((ok(&r)["version"].as_str(), ok(&r)["sha256"].as_str()), (Some("1.1.0"), Some(evil.as_str())));
    assert_eq!(echoed(&bed.echo("mcb_b", "hi").await), "a's code:hi");
}

/// The target's files changed since install: refused, and the binding stays where it was.
#[tokio::test]
async fn a_switch_to_changed_bytes_is_refused() {
    let bed = Bed::new(62_600);
    let v1 = bed.pack("v1.tar.gz", "");
    let v2 = bed.pack("v2.tar.gz", "v2:");
    bed.bind("mcb_a", "bot_a", "v1.tar.gz", "1.0.0", &v1).await;
    bed.bind("mcb_b", "bot_a", "v2.tar.gz", "1.1.0", &v2).await;
    let target = bed.package_dir("1.1.0");
    let server = target.join("server.py");
    let original = std::fs::read(&server).expect("read");
    let mut changed = original.clone();
    changed.extend_from_slice(b"\n# changed\n");
    std::fs::write(&server, &changed).expect("write");

    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "hi", "still at 1.0.0");

    std::fs::write(&server, &original).expect("restore");
    let r = bed.switch("mcb_a", "sw-2", "1.0.0", "1.1.0").await;
    assert_eq!(ok(&r)["version"], "1.1.0", "the same bytes again: {r:?}");
}

/// The target's record rewritten (another digest, or a tree digest matching changed files): not
/// what the bot installed, so refused.
#[tokio::test]
async fn a_switch_to_a_rewritten_record_is_refused() {
    let bed = Bed::new(62_700);
    let v1 = bed.pack("v1.tar.gz", "");
    let v2 = bed.pack("v2.tar.gz", "v2:");
    bed.bind("mcb_a", "bot_a", "v1.tar.gz", "1.0.0", &v1).await;
    bed.bind("mcb_b", "bot_a", "v2.tar.gz", "1.1.0", &v2).await;
    let target = bed.package_dir("1.1.0");
    let mut record_path = target.as_os_str().to_owned();
    record_path.push(".json");
    let record_path = PathBuf::from(record_path);
    let original = std::fs::read(&record_path).expect("record");
    let mut record: Value = serde_json::from_slice(&original).expect("json");

    record["manifest"]["sha256"] = json!(v1);
    std::fs::write(&record_path, record.to_string()).expect("write");
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "another digest recorded: {r:?}");

    // Changed files, and a record whose tree digest says they are right.
    record["manifest"]["sha256"] = json!(v2);
    std::fs::write(target.join("server.py"), "print('replaced')\n").expect("write");
    let digest = computer_agent::mcp::bindings::tree_digest(&target).expect("digest");
    record["treeDigest"] = json!(digest);
    std::fs::write(&record_path, record.to_string()).expect("write");
    let r = bed.switch("mcb_a", "sw-2", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "the tree digest is not the one installed: {r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "hi", "still at 1.0.0");
}
