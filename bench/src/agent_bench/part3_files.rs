//! Part 3: a 16 MiB file read through the API against `cat` of the file through a pipe.

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;
use computerd_bench::report::Window;
use computerd_bench::workload::Timing;

use crate::ERROR_PAUSE;

/// The file of part 3: the API's largest.
pub const FILE_BYTES: usize = 16 << 20;

/// Part 3: a 16 MiB file read through the API against `cat` through a pipe.
pub async fn part_file_read(api: &Api, computer: &str, dir: &Path, timing: Timing) -> Result<Pair> {
    let path = dir.join("bench-16MiB.bin");
    let data: Vec<u8> = (0..FILE_BYTES as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &data).with_context(|| format!("write {}", path.display()))?;
    let w = Window::start(timing);
    let (mut raw, mut via_api) = (Recorder::in_window(w), Recorder::in_window(w));
    while !w.done() {
        raw.record(raw_cat(&path, &data).await, ERROR_PAUSE).await;
        via_api.record(api.read_file(computer, &path, &data).await, ERROR_PAUSE).await;
    }
    Ok(Pair {
        part: "3",
        api: via_api.summary("API  GET files 16 MiB raw body, to last byte"),
        raw: raw.summary("raw  cat 16 MiB file | pipe: spawn, read, wait"),
    })
}

/// `cat <path>` through a pipe: spawn, read to EOF, wait; the bytes must be `want`.
async fn raw_cat(path: &Path, want: &[u8]) -> Result<Duration> {
    let t0 = Instant::now();
    let out = tokio::process::Command::new("cat")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("spawn cat")?
        .wait_with_output()
        .await
        .context("wait for cat")?;
    let d = t0.elapsed();
    if !out.status.success() || out.stdout != want {
        bail!("raw cat: {} with {} bytes", out.status, out.stdout.len());
    }
    Ok(d)
}
