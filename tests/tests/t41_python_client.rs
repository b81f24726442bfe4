//! A Python client generated from the API's own OpenAPI document by `openapi-python-client`
//! (PyPI, installed by `.ci/run`; pure Python, no Java) against a real node and a real
//! `computer-agent`: the script `tests/fixtures/python_client_roundtrip.py` uses only the generated
//! package to run a shell session that reads input, to write and read back a file (UTF-8 text and
//! arbitrary bytes), to list its directory and to remove a file.

use std::path::Path;
use std::process::Output;

use base64::Engine;
use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use serde_json::Value;
use serde_json::json;

/// What a process said, for a failure's message.
fn said(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The generator turns `/v1/openapi.json` into a package whose session and file operations carry
/// the document's models, and that package alone runs a session (output before and after its
/// input, its exit code) and a file round trip against the node. The client raises on a status the
/// document does not name, so these operations answer only what the document says.
#[tokio::test]
async fn t10_a_generated_python_client_runs_a_session_and_a_file_round_trip() {
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "python").await;
    let state = c.dir.path().join("agent");
    let log = c.dir.path().join("agent.log");
    let _agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &[]);
    wait_state(&c, &id, "running").await;

    let r = c.http.get(c.url(1, "/v1/openapi.json")).send().await.expect("GET /v1/openapi.json");
    assert_eq!(r.status(), 200);
    let doc = r.text().await.expect("the document");
    let file = c.dir.path().join("openapi.json");
    std::fs::write(&file, &doc).expect("write the document");

    // `--meta none`: the package itself, named after the document's title, in `gen/`.
    let generated = c.dir.path().join("gen");
    std::fs::create_dir_all(&generated).expect("gen/");
    let package = generated.join("computerd_client");
    let out = tokio::process::Command::new("python3")
        .args(["-m", "openapi_python_client", "generate", "--meta", "none", "--path"])
        .arg(&file)
        .arg("--output-path")
        .arg(&package)
        .output()
        .await
        .expect("python3 runs (.ci/run installs openapi-python-client with pip)");
    let generator = said(&out);
    eprintln!("openapi-python-client:\n{generator}");
    assert!(out.status.success(), "openapi-python-client failed:\n{generator}");
    for module in ["sessions/sessions_start.py", "sessions/sessions_input.py", "sessions/sessions_get.py"]
        .into_iter()
        .chain(["files/files_write.py", "files/files_read.py", "files/files_directory.py"])
    {
        assert!(package.join("api").join(module).is_file(), "api/{module} was not generated:\n{generator}");
    }

    let files = c.dir.path().join("python-files");
    std::fs::create_dir_all(&files).expect("a directory for the files");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/python_client_roundtrip.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(c.url(1, ""))
        .arg(&id)
        .arg(&files)
        .env("PYTHONPATH", &generated)
        .env("COMPUTERD_TOKEN", &c.token)
        .output()
        .await
        .expect("python3 runs");
    let run = said(&out);
    eprintln!("the generated client's run:\n{run}");
    assert!(out.status.success(), "the script failed:\n{run}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let seen: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("its last line is not JSON ({e}):\n{run}"));

    let session = &seen["session"];
    assert!(session["id"].as_str().is_some_and(|s| s.starts_with("cse_")), "{seen}");
    assert_eq!(session["startStatus"], 200, "{seen}");
    assert_eq!(session["inputStatus"], 200, "{seen}");
    let output = session["output"].as_str().expect("the session's output");
    assert!(output.contains("hi-from-python\n"), "{seen}");
    assert!(output.contains("got:ñandú-42\n"), "the input came back: {seen}");
    assert!(output.find("hi-from-python") < output.find("got:"), "{seen}");
    assert_eq!((&session["running"], &session["exitCode"]), (&json!(false), &json!(3)), "{seen}");
    assert_eq!(session["lookedFromZero"], session["output"], "a look from offset 0 reads it all again: {seen}");

    let text = "grüße, 世界 ✓\nsecond line\n";
    let f = &seen["files"];
    assert_eq!(f["writeStatus"], 200, "{seen}");
    assert_eq!(f["writtenSize"], text.len(), "{seen}");
    assert_eq!(f["readStatus"], 200, "{seen}");
    assert_eq!(f["text"], text, "{seen}");
    assert_eq!(f["readSize"], text.len(), "{seen}");
    assert_eq!(std::fs::read_to_string(files.join("grüße.txt")).ok().as_deref(), Some(text), "on the disk");
    let bytes: Vec<u8> = (0..=255u8).rev().collect();
    assert_eq!(f["bytesEncoding"], "base64", "{seen}");
    let back = f["bytesBack"].as_str().map(|b| base64::engine::general_purpose::STANDARD.decode(b));
    assert!(matches!(back, Some(Ok(ref b)) if *b == bytes), "all 256 byte values read back as written: {seen}");
    assert_eq!(f["bytesSize"], 256, "{seen}");
    assert_eq!(f["directoryStatus"], 200, "{seen}");
    assert_eq!(
        f["entries"],
        json!([{"name": "all-bytes.bin", "type": "file", "size": 256},
               {"name": "grüße.txt", "type": "file", "size": text.len()}]),
        "{seen}"
    );
    assert_eq!(f["missingStatus"], 404, "{seen}");
    assert_eq!(f["missingKind"], "not_found", "the error body's model: {seen}");
    assert_eq!(f["removeStatus"], 204, "{seen}");
    assert_eq!(f["entriesAfterRemove"], json!([{"name": "grüße.txt", "type": "file", "size": text.len()}]), "{seen}");
    assert!(!files.join("all-bytes.bin").exists(), "removed on the disk");
}
