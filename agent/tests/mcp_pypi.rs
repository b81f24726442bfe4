//! A real MCP server from PyPI (`mcp`, the official Python SDK, with its dependencies vendored:
//! 28 wheels unpacked beside a FastMCP server) is refused by the installer with the limit it
//! breaks named: the archive is over 8 MiB; allowed a larger archive, it is over 512 members.
//! Downloads from PyPI (reachable here; pip's cache keeps it after the first run).

use std::process::Command;

use computer_agent::mcp::archive::Limits;
use computer_agent::mcp::install::Manifest;
use computer_agent::mcp::install::install;
use sha2::Digest;

#[test]
fn a_vendored_pypi_server_is_over_the_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wheels = dir.path().join("wheels");
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "mcp", "--only-binary=:all:", "--python-version", "3.11"])
        .args(["--platform", "manylinux2014_x86_64", "-q", "-d"])
        .arg(&wheels)
        .output()
        .expect("run pip");
    assert!(out.status.success(), "pip download mcp: {}", String::from_utf8_lossy(&out.stderr));
    let pkg = dir.path().join("pkg");
    let vendor = pkg.join("vendor");
    std::fs::create_dir_all(&vendor).expect("vendor");
    for w in std::fs::read_dir(&wheels).expect("wheels").flatten() {
        let out =
            Command::new("python3").args(["-m", "zipfile", "-e"]).arg(w.path()).arg(&vendor).output().expect("unzip");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let server = "import sys; sys.path.insert(0, 'vendor')\nfrom mcp.server.fastmcp import FastMCP\n\
                  mcp = FastMCP('demo')\n@mcp.tool()\ndef add(a: int, b: int) -> int:\n    return a + b\n\
                  mcp.run()\n";
    std::fs::write(pkg.join("server.py"), server).expect("server");
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let archive = workspace.join("mcp-server.tar.gz");
    let out = Command::new("tar").arg("-C").arg(&pkg).arg("-czf").arg(&archive).args(["server.py", "vendor"]).output();
    assert!(out.expect("tar").status.success());
    let bytes = std::fs::read(&archive).expect("archive");
    let manifest = Manifest {
        id: "mcp.fastmcp.demo".into(),
        version: "1.0.0".into(),
        sha256: hex::encode(sha2::Sha256::digest(&bytes)),
        entrypoint: vec!["python3".into(), "./server.py".into()],
        share_immutable_package: true,
    };
    let runtime = dir.path().join("runtime");
    let r = install(&workspace, "mcp-server.tar.gz", &manifest, &runtime, &Limits::default());
    let e = r.map(|_| ()).expect_err("over the limits");
    assert_eq!(e.reason(), "archive_too_large", "{e} ({} bytes)", bytes.len());
    assert!(e.to_string().contains("8388608"), "the limit is named: {e}");

    let roomy = Limits { archive_bytes: 64 << 20, ..Limits::default() };
    let e = install(&workspace, "mcp-server.tar.gz", &manifest, &runtime, &roomy).map(|_| ()).expect_err("members");
    assert!(matches!(e.reason(), "too_many_members" | "unpacked_too_large"), "{e}");
    assert!(e.to_string().contains("512") || e.to_string().contains("33554432"), "the limit is named: {e}");
    assert!(!runtime.join("packages").exists(), "nothing published");
}
