//! blob-bench: what checked bytes cost. Two measures, each against `cat` through a pipe
//! (`cat SRC | cat > DST`, the same bytes on the same disk) in the same run, alternating:
//!
//! - **upload**: `POST /api/blobs?sha=…` of a 256 MiB body to a release node (the digest and
//!   length checked as it streams, the bytes written to the node's blob store, the record
//!   replicated), from a client holding the bytes in memory;
//! - **copy-to-box**: `POST …/copy-to-box` of a 16 MiB blob (a copy's cap) into a paired
//!   Computer (this machine, its release agent): the node reads the blob, streams it over the
//!   agent link, the agent checks length and SHA-256 and puts the file in place; the artifact is
//!   recorded.
//!
//! Each side is reported in MiB/s (median of the samples); the goal: each of ours at least 0.5x
//! its baseline. For context the upload is also set against `cat | cat > DST && sync DST` (a
//! blob is fsynced before it is acknowledged; the goal's baseline is not).
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd && cargo build --release -p computer-agent &&
//!   cargo build --release -p computerd-bench --bin blob-bench && target/release/blob-bench
//! ```
//!
//! `BENCH_SAMPLES` (default 5 uploads and 4x as many copies; 2 with `BENCH_QUICK=1`);
//! `COMPUTERD_BIN` and `AGENT_BIN` as in the other benches.

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::settings;
use computerd_tests::TestCluster;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

const UPLOAD: usize = 256 << 20;
const COPY: usize = 16 << 20;
const GOAL: f64 = 0.5;

fn main() -> Result<()> {
    computerd_bench::sandbox::main(run)
}

/// `cat src | cat > dst` (then, with `durable`, `sync dst`: the copy on disk, as a blob is
/// before it is acknowledged), timed.
fn cat_pipe(src: &Path, dst: &Path, durable: bool) -> Result<Duration> {
    let t = Instant::now();
    let script = if durable { "cat \"$1\" | cat > \"$2\" && sync \"$2\"" } else { "cat \"$1\" | cat > \"$2\"" };
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .args(["sh", &src.to_string_lossy(), &dst.to_string_lossy()])
        .output()
        .context("sh")?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("cat through a pipe failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::remove_file(dst).ok();
    Ok(took)
}

fn mib_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn upload(client: &reqwest::Client, c: &TestCluster, body: bytes::Bytes, sha: &str) -> Result<(Duration, Value)> {
    let t = Instant::now();
    let r = client
        .post(c.url(1, &format!("/api/blobs?sha={sha}&name=bench.bin")))
        .bearer_auth(&c.token)
        .body(body)
        .send()
        .await
        .context("upload")?;
    let status = r.status();
    let v: Value = r.json().await.context("upload answer")?;
    let took = t.elapsed();
    if status != 200 {
        bail!("upload answered {status}: {v}");
    }
    Ok((took, v))
}

async fn run(agent: std::path::PathBuf) -> Result<()> {
    let quick = settings::quick();
    let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if quick { 2 } else { 5 });
    // `BENCH_ONLY=copy` measures only the copies (to profile them alone).
    let copies_only = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "copy");
    let c = TestCluster::start(1).await;
    let dir = c.dir.path();
    let client = reqwest::Client::new();

    // A paired Computer: this machine, with the release agent, its workspace in `dir`.
    let body = json!({"commandKey": "blob-bench", "name": "bench", "source": {"_tag": "Paired"}});
    let (s, r) = c.call(reqwest::Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    if s != 202 {
        bail!("create answered {s}: {r}");
    }
    let id = r["resource"]["id"].as_str().context("id")?.to_string();
    let done = c.settle(1, r["executionId"].as_str().context("execution")?, &c.token).await;
    let code = done["pairingCode"].as_str().context("pairing code")?.to_string();
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let log = std::fs::File::create(dir.join("agent.log"))?;
    let _agent = tokio::process::Command::new(&agent)
        .args(["--server", &c.url(1, ""), "--pair", &code, "--state"])
        .arg(dir.join("agent-state"))
        .arg("--workdir")
        .arg(&workspace)
        .env("HOME", dir.join("agent-home"))
        .env("COMPUTER_AGENT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("start the agent")?;
    computerd_tests::agent::wait_state(&c, &id, "running").await;

    let data: Vec<u8> = (0..UPLOAD).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let src = dir.join("src.bin");
    std::fs::write(&src, &data)?;
    let small = data[..COPY].to_vec();
    let small = small.as_slice();
    let small_src = dir.join("small.bin");
    std::fs::write(&small_src, small)?;
    let dst = dir.join("dst.bin");
    let sha = hex::encode(sha2::Sha256::digest(&data));
    let small_sha = hex::encode(sha2::Sha256::digest(small));
    let body = bytes::Bytes::from(data);

    // Warm-ups, not counted.
    cat_pipe(&src, &dst, false)?;
    if !copies_only {
        upload(&client, &c, body.clone(), &sha).await?;
    }
    let (_, blob) = upload(&client, &c, bytes::Bytes::copy_from_slice(small), &small_sha).await?;
    let blob_id = blob["blobId"].as_str().context("blobId")?.to_string();

    let (mut ours_up, mut cat_up, mut synced_up) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..if copies_only { 0 } else { samples } {
        let (a, b) = if i % 2 == 0 {
            let a = upload(&client, &c, body.clone(), &sha).await?.0;
            (a, cat_pipe(&src, &dst, false)?)
        } else {
            let b = cat_pipe(&src, &dst, false)?;
            (upload(&client, &c, body.clone(), &sha).await?.0, b)
        };
        ours_up.push(mib_s(UPLOAD, a));
        cat_up.push(mib_s(UPLOAD, b));
        synced_up.push(mib_s(UPLOAD, cat_pipe(&src, &dst, true)?));
    }
    let (mut ours_copy, mut cat_copy) = (Vec::new(), Vec::new());
    for i in 0..samples * 4 {
        let path = format!("copies/{i}.bin");
        let copy = || async {
            let t = Instant::now();
            let (s, v) = c
                .call(
                    reqwest::Method::POST,
                    1,
                    &format!("/v1/computers/{id}/copy-to-box"),
                    &c.token,
                    Some(json!({"blobId": blob_id, "path": path})),
                )
                .await;
            if s != 200 || v["sha256"] != small_sha.as_str() {
                bail!("copy-to-box answered {s}: {v}");
            }
            Ok(t.elapsed())
        };
        let (a, b) = if i % 2 == 0 {
            let a = copy().await?;
            (a, cat_pipe(&small_src, &dst, false)?)
        } else {
            let b = cat_pipe(&small_src, &dst, false)?;
            (copy().await?, b)
        };
        std::fs::remove_file(workspace.join(&path)).ok();
        ours_copy.push(mib_s(COPY, a));
        cat_copy.push(mib_s(COPY, b));
    }
    if copies_only {
        let (ours, base) = (median(ours_copy), median(cat_copy));
        println!("copy-to-box 16 MiB: ours {ours:.1} MiB/s, cat | cat {base:.1} MiB/s, {:.2}x", ours / base);
        return Ok(());
    }
    let rows = [
        ("upload 256 MiB", median(ours_up), median(cat_up)),
        ("copy-to-box 16 MiB", median(ours_copy), median(cat_copy)),
    ];
    println!("blob-bench: {samples} uploads, {} copies, medians (MiB/s)", samples * 4);
    println!("{:<22} {:>10} {:>14} {:>8}  goal >= {GOAL}x", "", "ours", "cat | cat", "ratio");
    let mut met = true;
    for (name, ours, base) in rows {
        let ratio = ours / base;
        met &= ratio >= GOAL;
        println!("{name:<22} {ours:>10.1} {base:>14.1} {ratio:>7.2}x");
    }
    let (ours, synced) = (rows[0].1, median(synced_up));
    println!(
        "(context: an upload is on disk, fsynced, before it is acknowledged; against `cat | cat > DST && sync DST`: {synced:.1} MiB/s, {:.2}x)",
        ours / synced
    );
    println!("goal {}", if met { "met" } else { "NOT met" });
    Ok(())
}
