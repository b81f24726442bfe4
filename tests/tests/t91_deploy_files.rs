//! `deploy/` where it cannot run here: the Kubernetes manifests are validated against the API's
//! schemas (PyPI `kubernetes-validate --strict`, installed by `.ci/run`), and the systemd unit
//! with `systemd-analyze verify` (its `ExecStart` pointed at the freshly built `computerd`, the
//! one path this machine does not have). Each check is shown to fail on a broken copy. The
//! compose file runs for real in `t90_compose`.

use std::path::Path;
use std::path::PathBuf;
use std::process::Command;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(file)
}

/// `kubernetes-validate --strict` of `file`: (passed, what it said).
fn k8s(file: &Path) -> (bool, String) {
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "-k", "1.31.0"])
        .arg(file)
        .output()
        .expect("kubernetes-validate runs (.ci/run installs it from PyPI)");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// `systemd-analyze verify` of `unit`: (exit status, what it said). It warns about unknown keys
/// and bad values, and still exits 0, so a clean unit is one it says nothing about.
fn systemd(unit: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()
        .expect("systemd-analyze runs (.ci/run installs systemd)");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn t10_the_k8s_manifests_pass_strict_validation() {
    let file = deploy("k8s/computerd.yaml");
    let (ok, said) = k8s(&file);
    assert!(ok, "{said}");
    for resource in ["service/computerd-peers", "service/computerd", "statefulset/computerd"] {
        assert!(said.contains(&format!("passed for resource {resource}")), "{resource}: {said}");
    }
    // A field the API does not have is caught.
    let dir = tempfile::tempdir().expect("dir");
    let text = std::fs::read_to_string(&file).expect("manifest");
    assert!(text.contains("replicas: 3"), "the manifest runs three nodes");
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, text.replacen("replicas: 3", "replicaz: 3", 1)).expect("write");
    let (ok, said) = k8s(&broken);
    assert!(!ok, "an unknown field fails strict validation: {said}");
}

#[test]
fn t20_the_systemd_unit_verifies_clean() {
    let dir = tempfile::tempdir().expect("dir");
    let text = std::fs::read_to_string(deploy("computerd.service")).expect("unit");
    assert!(text.contains("ExecStart=/usr/local/bin/computerd serve"), "{text}");
    let bin = computerd_tests::computerd_bin();
    let unit = dir.path().join("computerd.service");
    std::fs::write(&unit, text.replace("/usr/local/bin/computerd", &bin.to_string_lossy())).expect("write");
    let (ok, said) = systemd(&unit);
    assert!(ok && said.trim().is_empty(), "systemd-analyze verify: {said}");
    // A directive systemd does not know is reported.
    let broken = dir.path().join("broken.service");
    std::fs::write(
        &broken,
        std::fs::read_to_string(&unit).expect("unit").replace("Restart=on-failure", "Restart=sometimes"),
    )
    .expect("write");
    let (_, said) = systemd(&broken);
    assert!(said.contains("Restart") || said.contains("restart"), "a bad value is reported: {said}");
}
