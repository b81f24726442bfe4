//! loader-bench: the runtime loader's throughput (issue 40: `computer-agent load-runtime`,
//! `computer_agent::runtime_load`) against GNU `tar -x` followed by `sync`, in the same run on
//! the same disk, alternating.
//!
//! The runtime: 1 GiB in 50,000 regular files (sizes spread evenly from 1 to 41 KiB, bytes that do not
//! compress) under 500 directories of 100 files (`pkg-NNN/sub-N/`), half owned by root and half
//! by 1000:1000, modes 0644 and 0755, written once as an uncompressed tar in the bench's
//! directory and read before the first sample (both sides read it from the page cache).
//!
//! - **ours**: `runtime_load::load` into an empty protected root: checks, writes into staging,
//!   `syncfs` then an fsync of every file and directory while the tree is walked and hashed
//!   (SHA-256 of the archive's members and of the loaded tree, compared), then the journaled
//!   publish (its fsyncs of the journal and the root);
//! - **baseline**: `tar -xf ARCHIVE -C DIR && sync` (GNU tar as root keeps owners and modes).
//!
//! Before each sample the previous trees are removed and `sync` runs (not timed). Each side is
//! reported in MiB/s of content (median of the samples); the ratio is ours ÷ baseline; the goal
//! is at least 0.7x.
//!
//! ```text
//! cargo build --release -p computerd-bench --bin loader-bench && target/release/loader-bench
//! ```
//!
//! Run as root (the loader keeps numeric owners). `BENCH_SAMPLES` (default 3; 1 with
//! `BENCH_QUICK=1`), `BENCH_DIR` (where the archive and the trees go; default the temporary
//! directory, which must have about 3 GiB free), `BENCH_JSON`.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computer_agent::runtime_load;
use computerd_bench::report;
use computerd_bench::settings;
use serde_json::json;

const FILES: usize = 50_000;
const PER_DIR: usize = 100;
const TOTAL: u64 = 1 << 30;
const GOAL: f64 = 0.7;

fn main() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("loader-bench keeps numeric owners, as the loader does: run it as root");
    }
    let quick = settings::quick();
    let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let base = std::env::var_os("BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new().prefix("loader-bench").tempdir_in(&base).context("bench dir")?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let archive = dir.path().join("runtime.tar");
    eprintln!("loader-bench: writing {} files, {} MiB, to {}", FILES, TOTAL >> 20, archive.display());
    let (files, bytes) = generate(&archive)?;
    // Into the page cache for both sides.
    std::io::copy(&mut std::fs::File::open(&archive)?, &mut std::io::sink())?;

    let mut ours = Vec::new();
    let mut base_times = Vec::new();
    let mut snapshot = String::new();
    for i in 0..samples {
        let into = dir.path().join(format!("tar-{i}"));
        std::fs::create_dir(&into)?;
        settle(dir.path())?;
        let t = Instant::now();
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg("tar -xf \"$1\" -C \"$2\" && sync")
            .args(["sh", &archive.to_string_lossy(), &into.to_string_lossy()])
            .status()
            .context("tar")?;
        let took = t.elapsed();
        if !st.success() {
            bail!("tar -x failed: {st}");
        }
        eprintln!("loader-bench: sample {i}: tar -x + sync {:.2} s", took.as_secs_f64());
        base_times.push(took);
        std::fs::remove_dir_all(&into)?;

        let into = dir.path().join(format!("ours-{i}"));
        std::fs::create_dir(&into)?;
        std::fs::set_permissions(&into, std::fs::Permissions::from_mode(0o755))?;
        settle(dir.path())?;
        let t = Instant::now();
        let loaded =
            runtime_load::load(&runtime_load::Options::new(&into), runtime_load::Archive::File(archive.clone()))
                .map_err(|e| anyhow::anyhow!("the loader refused: {e}"))?;
        let took = t.elapsed();
        eprintln!("loader-bench: sample {i}: the loader {:.2} s ({} entries)", took.as_secs_f64(), loaded.entries);
        snapshot = loaded.snapshot.to_string();
        ours.push(took);
        std::fs::remove_dir_all(&into)?;
    }
    let mib = |d: Duration| bytes as f64 / (1 << 20) as f64 / d.as_secs_f64();
    let ours_mib = mib(median(&mut ours));
    let base_mib = mib(median(&mut base_times));
    let ratio = ours_mib / base_mib;
    let met = if ratio >= GOAL { "met" } else { "not met" };
    println!(
        "loader-bench: {files} files, {} MiB, {samples} samples, {} cores, load {}",
        bytes >> 20,
        report::cores(),
        report::loadavg()
    );
    println!("  the loader (checks, staging, fsyncs, verify, publish): {ours_mib:.1} MiB/s (median)");
    println!("  tar -x + sync:                                          {base_mib:.1} MiB/s (median)");
    println!("  ratio {ratio:.2}x (goal >= {GOAL}x: {met})");
    if let Some(path) = settings::json_out() {
        let doc = json!({
            "bench": "loader-bench",
            "files": files,
            "bytes": bytes,
            "samples": samples,
            "ours_mib_s": ours_mib,
            "tar_sync_mib_s": base_mib,
            "ratio": ratio,
            "goal": GOAL,
            "ours_secs": ours.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>(),
            "tar_sync_secs": base_times.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>(),
            "snapshot": snapshot,
        });
        report::write_json(&path, &doc)?;
    }
    Ok(())
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Nothing left to write back from earlier samples.
fn settle(dir: &Path) -> Result<()> {
    let f = std::fs::File::open(dir)?;
    nix::unistd::syncfs(&f).context("syncfs")?;
    Ok(())
}

/// Writes the runtime's archive; answers its files and content bytes.
fn generate(path: &Path) -> Result<(usize, u64)> {
    let out = std::io::BufWriter::with_capacity(4 << 20, std::fs::File::create(path)?);
    let mut b = tar::Builder::new(out);
    let header = |kind: tar::EntryType, size: u64, mode: u32, owner: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(owner);
        h.set_gid(owner);
        h.set_mtime(1_700_000_000);
        h
    };
    let mean = TOTAL / FILES as u64;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut data = vec![0u8; (2 * mean) as usize + 4096];
    let mut bytes = 0u64;
    for i in 0..FILES {
        if i % PER_DIR == 0 {
            let (pkg, sub) = (i / PER_DIR / 5, i / PER_DIR % 5);
            if sub == 0 {
                let mut h = header(tar::EntryType::Directory, 0, 0o755, 0);
                b.append_data(&mut h, format!("pkg-{pkg:03}/"), std::io::empty())?;
            }
            let mut h = header(tar::EntryType::Directory, 0, 0o755, if pkg % 2 == 0 { 0 } else { 1000 });
            b.append_data(&mut h, format!("pkg-{pkg:03}/sub-{sub}/"), std::io::empty())?;
        }
        // From 1 KiB to 2x the mean less 1 KiB, each size once in a shuffled order (7919 is
        // prime to FILES): the mean is TOTAL / FILES.
        let k = (i as u64 * 7919) % FILES as u64;
        let size = (1024 + k * (2 * mean - 2048) / (FILES as u64 - 1)) as usize;
        for chunk in data[..size].chunks_mut(8) {
            let x = next().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
        let (mode, owner) = if i % 2 == 0 { (0o644, 0) } else { (0o755, 1000) };
        let mut h = header(tar::EntryType::Regular, size as u64, mode, owner);
        let (pkg, sub) = (i / PER_DIR / 5, i / PER_DIR % 5);
        b.append_data(&mut h, format!("pkg-{pkg:03}/sub-{sub}/f{i:05}.bin"), &data[..size])?;
        bytes += size as u64;
    }
    let mut out = b.into_inner()?;
    out.flush()?;
    Ok((FILES, bytes))
}
