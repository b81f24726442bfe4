//! Parts 1 and 2b: a session's start to exit against a raw `bash -lc` of the same command.

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

/// Parts 1 and 2b, interleaved: sessions `true` and `echo x` against raw `bash -lc`.
pub async fn part_start_to_exit(api: &Api, computer: &str, timing: Timing) -> (Pair, Pair) {
    let w = Window::start(timing);
    let [mut raw_true, mut api_true, mut raw_echo, mut api_echo] = [(); 4].map(|()| Recorder::in_window(w));
    while !w.done() {
        raw_true.record(raw_command("true", b"").await, ERROR_PAUSE).await;
        api_true.record(api.session_exit(computer, "true", "").await, ERROR_PAUSE).await;
        raw_echo.record(raw_command("echo x", b"x\n").await, ERROR_PAUSE).await;
        api_echo.record(api.session_exit(computer, "echo x", "x\n").await, ERROR_PAUSE).await;
    }
    (
        Pair {
            part: "1",
            api: api_true.summary("API  session `true`, start to exit"),
            raw: raw_true.summary("raw  bash -lc true: spawn, read, wait"),
        },
        Pair {
            part: "2b",
            api: api_echo.summary("API  session `echo x`, start to exit"),
            raw: raw_echo.summary("raw  bash -lc 'echo x': spawn, read, wait"),
        },
    )
}

/// `bash -lc <command>` as the agent spawns it: pipes, its own process group.
pub fn bash(command: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-lc")
        .arg(command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Spawns `bash -lc <command>`, reads its output to EOF and waits; its stdout must be `want`.
async fn raw_command(command: &str, want: &[u8]) -> Result<Duration> {
    let t0 = Instant::now();
    let out = bash(command).spawn().context("spawn bash")?.wait_with_output().await.context("wait for bash")?;
    let d = t0.elapsed();
    if !out.status.success() || out.stdout != want {
        bail!("raw `{command}`: {} with stdout {:?}", out.status, String::from_utf8_lossy(&out.stdout));
    }
    Ok(d)
}
