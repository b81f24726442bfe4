//! Small pieces the benchmark binaries share: JSON calls, error excerpts, what a report says
//! about the machine and the nodes, and a paired `computer-agent` process; and the one way every
//! bench records latencies ([`Recorder`], [`Window`]), takes their percentiles ([`percentile_ms`],
//! [`nearest_rank`]), summarizes them ([`Summary`]), compares two ([`Pair`]) and writes its
//! JSON ([`write_json`]).

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_tests::TestCluster;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;

/// How many distinct error messages a report keeps per cell.
pub const ERROR_SAMPLES: usize = 3;

/// Sends `req` and answers its JSON body when the status is `expected`.
pub async fn call_json(req: reqwest::RequestBuilder, expected: StatusCode) -> Result<Value> {
    let resp = req.send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    if status != expected {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        bail!("HTTP {status}: {text}");
    }
    serde_json::from_slice(&body).context("the answer is not JSON")
}

/// A JSON value for an error message, cut to 200 characters.
pub fn excerpt(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// Keeps `msg` among `samples` when it is new and there are fewer than [`ERROR_SAMPLES`].
pub fn keep_sample(samples: &mut Vec<String>, msg: String) {
    if samples.len() < ERROR_SAMPLES && !samples.contains(&msg) {
        samples.push(msg);
    }
}

/// The machine's cores, as a report states them (0 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
}

/// `/proc/loadavg`'s three load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// The first few panics in the nodes' logs, each with the line after it (the message).
pub fn panics(c: &TestCluster) -> Vec<String> {
    let mut out = Vec::new();
    for node in c.nodes.values() {
        let text = std::fs::read_to_string(&node.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.extend(
            lines
                .iter()
                .enumerate()
                .filter(|(_, l)| l.contains("panicked at"))
                .take(ERROR_SAMPLES)
                .map(|(i, l)| format!("node {}: {} {}", node.id, l.trim(), lines.get(i + 1).map_or("", |m| m.trim()))),
        );
    }
    out
}

/// The last lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts `computer-agent` at `bin`, paired with `code` against `server`, its state in
/// `dir/agent-state` and its warnings in `agent_log`; killed when the handle drops.
pub fn spawn_agent(
    bin: &std::path::Path,
    server: &str,
    code: &str,
    dir: &std::path::Path,
    agent_log: &std::path::Path,
) -> Result<tokio::process::Child> {
    let log = std::fs::File::create(agent_log).context("the agent's log")?;
    tokio::process::Command::new(bin)
        .args(["--server", server, "--pair", code, "--state"])
        .arg(dir.join("agent-state"))
        .env("COMPUTER_AGENT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))
}

/// Writes a bench's results to `path` as pretty JSON, and says so on stderr.
pub fn write_json(path: &Path, doc: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(doc).context("encode JSON")?;
    std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Percentiles.

/// The nearest-rank `p` percentile (0 < p ≤ 1) of `sorted`; `None` when it is empty. `p = 1` is
/// the largest.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Nearest-rank percentile of sorted microsecond samples, in milliseconds (NaN when empty).
pub fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    nearest_rank(sorted_us, p).map_or(f64::NAN, |us| us as f64 / 1000.0)
}

// ---------------------------------------------------------------------------------------------
// Recording.

/// When operations count: those that complete between `warm_end` and `end`.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    warm_end: Instant,
    end: Instant,
}

impl Window {
    /// A warm-up and then a measured window, from now.
    pub fn start(t: Timing) -> Self {
        let warm_end = Instant::now() + t.warmup;
        Window { warm_end, end: warm_end + t.measure }
    }

    /// Every operation counts (for a fixed number of samples).
    pub fn unbounded() -> Self {
        let now = Instant::now();
        Window { warm_end: now, end: now + Duration::from_secs(24 * 3600) }
    }

    /// Whether the measured window is over.
    pub fn done(&self) -> bool {
        Instant::now() >= self.end
    }
}

/// The outcomes of one kind of operation: the latencies of the successes that count, the
/// failures, and a few distinct error messages.
///
/// `Recorder::default()` counts every outcome (a fixed number of samples, no warm-up);
/// [`Recorder::in_window`] only those that complete inside a [`Window`]'s measured part, and
/// counts the failures of its warm-up apart.
#[derive(Default)]
pub struct Recorder {
    window: Option<Window>,
    us: Vec<u64>,
    errors: u64,
    warmup_errors: u64,
    samples: Vec<String>,
}

impl Recorder {
    /// Counts the outcomes that complete inside `w`'s measured part.
    pub fn in_window(w: Window) -> Self {
        Recorder { window: Some(w), ..Recorder::default() }
    }

    /// Records one outcome, completed now; answers whether it failed.
    pub fn add(&mut self, r: Result<Duration>) -> bool {
        let now = Instant::now();
        let counted = self.window.is_none_or(|w| now >= w.warm_end && now <= w.end);
        match r {
            Ok(d) => {
                if counted {
                    self.us.push(d.as_micros() as u64);
                }
                false
            }
            Err(e) => {
                if counted {
                    self.errors += 1;
                } else if self.window.is_some_and(|w| now < w.warm_end) {
                    self.warmup_errors += 1;
                }
                keep_sample(&mut self.samples, format!("{e:#}"));
                true
            }
        }
    }

    /// Records one outcome and pauses for `pause` after a failure, so a broken part does not
    /// spin.
    pub async fn record(&mut self, r: Result<Duration>, pause: Duration) {
        if self.add(r) {
            tokio::time::sleep(pause).await;
        }
    }

    /// Records one success.
    pub fn ok(&mut self, d: Duration) {
        self.add(Ok(d));
    }

    /// Counts a failure that happened outside any operation (a task that failed), with `msg`.
    pub fn failed(&mut self, msg: String) {
        self.errors += 1;
        self.samples.push(msg);
    }

    /// Adds `other`'s outcomes to these (the samples as far as there is room).
    pub fn merge(&mut self, other: Recorder) {
        self.us.extend(other.us);
        self.errors += other.errors;
        self.warmup_errors += other.warmup_errors;
        for s in other.samples {
            keep_sample(&mut self.samples, s);
        }
    }

    /// The sorted latencies, µs.
    fn sorted(&self) -> Vec<u64> {
        let mut us = self.us.clone();
        us.sort_unstable();
        us
    }

    /// The latencies and errors, as one row of a report.
    pub fn summary(&self, op: impl Into<String>) -> Summary {
        let us = self.sorted();
        Summary {
            op: op.into(),
            n: us.len(),
            p50_ms: percentile_ms(&us, 0.50),
            p99_ms: percentile_ms(&us, 0.99),
            max_ms: percentile_ms(&us, 1.0),
            errors: self.errors,
            warmup_errors: self.window.map(|_| self.warmup_errors),
            error_samples: self.samples.clone(),
        }
    }

    /// The latencies, errors and throughput of a closed-loop cell measured for `secs`.
    pub fn stats(&self, secs: f64) -> Stats {
        let us = self.sorted();
        Stats {
            ops: us.len() as u64,
            secs,
            ops_per_sec: us.len() as f64 / secs,
            p50_ms: percentile_ms(&us, 0.50),
            p99_ms: percentile_ms(&us, 0.99),
            max_ms: percentile_ms(&us, 1.0),
            errors: self.errors,
            warmup_errors: self.warmup_errors,
            error_samples: self.samples.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Summaries and ratios.

/// Latencies of one kind of operation (nearest rank).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub op: String,
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub errors: u64,
    /// Failures in the warm-up (not in `errors`); `None` when there was no warm-up (every
    /// operation counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_errors: Option<u64>,
    pub error_samples: Vec<String>,
}

impl Summary {
    /// `self` ÷ `base` at p50.
    pub fn p50_ratio(&self, base: &Summary) -> f64 {
        self.p50_ms / base.p50_ms
    }

    /// `self` ÷ `base` at p99.
    pub fn p99_ratio(&self, base: &Summary) -> f64 {
        self.p99_ms / base.p99_ms
    }

    /// `self` − `base` at p50, ms.
    pub fn p50_diff_ms(&self, base: &Summary) -> f64 {
        self.p50_ms - base.p50_ms
    }

    /// Prints the error samples under the heading `errors in {what} {op} (…), e.g.:`, when there
    /// are any.
    pub fn print_errors(&self, what: &str) {
        print_errors(&format!("{what} {}", self.op), self.errors, self.warmup_errors, &self.error_samples);
    }
}

/// Prints `samples` under `errors in {what} ({errors} measured, {warmup} in warm-up), e.g.:`
/// (`({errors})` when there was no warm-up), when there are any.
pub fn print_errors(what: &str, errors: u64, warmup_errors: Option<u64>, samples: &[String]) {
    if samples.is_empty() {
        return;
    }
    match warmup_errors {
        Some(w) => println!("errors in {what} ({errors} measured, {w} in warm-up), e.g.:"),
        None => println!("errors in {what} ({errors}), e.g.:"),
    }
    for s in samples {
        println!("    {s}");
    }
}

/// The column widths of a table of [`Summary`] rows: `part`, `op` and `n`, then p50, p99 and max
/// with `decimals`, then the errors.
#[derive(Clone, Copy)]
pub struct SummaryTable {
    pub op_width: usize,
    pub n_width: usize,
    pub decimals: usize,
}

impl SummaryTable {
    pub fn header(&self) -> String {
        let (op, n) = (self.op_width, self.n_width);
        format!(
            "{:<4} {:<op$} {:>n$} {:>9} {:>9} {:>9} {:>6}",
            "part", "op", "n", "p50 ms", "p99 ms", "max ms", "errors"
        )
    }

    pub fn row(&self, part: &str, s: &Summary) -> String {
        let (op, n, d) = (self.op_width, self.n_width, self.decimals);
        format!(
            "{:<4} {:<op$} {:>n$} {:>9.d$} {:>9.d$} {:>9.d$} {:>6}",
            part, s.op, s.n, s.p50_ms, s.p99_ms, s.max_ms, s.errors
        )
    }
}

/// One part measured both ways: through computerd (`api`) and its baseline (`raw`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pair {
    pub part: &'static str,
    pub api: Summary,
    pub raw: Summary,
}

impl Pair {
    /// API ÷ baseline at p50.
    pub fn p50_ratio(&self) -> f64 {
        self.api.p50_ratio(&self.raw)
    }

    /// API ÷ baseline at p99.
    pub fn p99_ratio(&self) -> f64 {
        self.api.p99_ratio(&self.raw)
    }

    /// API − baseline at p50, ms.
    pub fn p50_diff_ms(&self) -> f64 {
        self.api.p50_diff_ms(&self.raw)
    }
}

/// The widths of a line comparing the two sides of a [`Pair`]: its part, a label, then the p50
/// ratio, the p50 difference in ms (with `diff_width` and `diff_decimals`) and the p99 ratio.
#[derive(Clone, Copy)]
pub struct PairRatios {
    pub label_width: usize,
    pub ratio_width: usize,
    pub diff_width: usize,
    pub diff_decimals: usize,
}

impl PairRatios {
    pub fn line(&self, p: &Pair, label: &str) -> String {
        let (lw, rw, dw, dd) = (self.label_width, self.ratio_width, self.diff_width, self.diff_decimals);
        format!(
            "  {:<3} {label:<lw$} p50 {:>rw$.2}x ({:+dw$.dd$} ms)  p99 {:>rw$.2}x",
            p.part,
            p.p50_ratio(),
            p.p50_diff_ms(),
            p.p99_ratio()
        )
    }
}

/// How long a cell runs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Not measured; fills connection pools and lets the servers settle.
    pub warmup: Duration,
    /// Measured.
    pub measure: Duration,
}

/// The outcome of one cell.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Successful requests completed in the measured window.
    pub ops: u64,
    /// Length of the measured window, seconds.
    pub secs: f64,
    /// `ops / secs`.
    pub ops_per_sec: f64,
    /// Median latency of the counted requests, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency of the counted requests, milliseconds.
    pub p99_ms: f64,
    /// Largest latency of the counted requests, milliseconds.
    pub max_ms: f64,
    /// Failed requests completed in the measured window.
    pub errors: u64,
    /// Failed requests during the warm-up (not in `errors`).
    pub warmup_errors: u64,
    /// A few distinct error messages.
    pub error_samples: Vec<String>,
}

impl Stats {
    /// The throughput and latency columns of a table row: ops/s, p50, p99, max and errors.
    pub fn columns(&self) -> String {
        format!(
            "{:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>7}",
            self.ops_per_sec, self.p50_ms, self.p99_ms, self.max_ms, self.errors
        )
    }

    /// The headings of [`Stats::columns`].
    pub fn headings() -> String {
        format!("{:>10} {:>9} {:>9} {:>9} {:>7}", "ops/s", "p50 ms", "p99 ms", "max ms", "errors")
    }

    /// Prints the error samples under `errors in {what} (… measured, … in warm-up), e.g.:`, when
    /// there are any.
    pub fn print_errors(&self, what: &str) {
        crate::report::print_errors(what, self.errors, Some(self.warmup_errors), &self.error_samples);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile_ms(&v, 0.50), 50.0);
        assert_eq!(percentile_ms(&v, 0.99), 99.0);
        assert_eq!(percentile_ms(&v, 1.0), 100.0);
        assert_eq!(percentile_ms(&[7000], 0.99), 7.0);
        assert!(percentile_ms(&[], 0.5).is_nan());
        assert_eq!(nearest_rank(&[1.5, 2.5, 3.5], 0.5), Some(2.5));
        assert_eq!(nearest_rank::<u8>(&[], 0.5), None);
    }

    #[test]
    fn tables_print_as_the_benches_did() {
        let s = Summary {
            op: "API  session `true`, start to exit".into(),
            n: 42,
            p50_ms: 1.23456,
            p99_ms: 12.5,
            max_ms: f64::NAN,
            errors: 1,
            warmup_errors: None,
            error_samples: Vec::new(),
        };
        let t = SummaryTable { op_width: 50, n_width: 6, decimals: 3 };
        assert_eq!(
            t.header(),
            format!(
                "{:<4} {:<50} {:>6} {:>9} {:>9} {:>9} {:>6}",
                "part", "op", "n", "p50 ms", "p99 ms", "max ms", "errors"
            )
        );
        assert_eq!(
            t.row("2b", &s),
            format!(
                "{:<4} {:<50} {:>6} {:>9.3} {:>9.3} {:>9.3} {:>6}",
                "2b", s.op, s.n, s.p50_ms, s.p99_ms, s.max_ms, s.errors
            )
        );
        let t = SummaryTable { op_width: 52, n_width: 4, decimals: 2 };
        assert_eq!(
            t.row("3p", &s),
            format!(
                "{:<4} {:<52} {:>4} {:>9.2} {:>9.2} {:>9.2} {:>6}",
                "3p", s.op, s.n, s.p50_ms, s.p99_ms, s.max_ms, s.errors
            )
        );
        let p = Pair { part: "2a", api: s, raw: Recorder::default().summary("raw") };
        let r = PairRatios { label_width: 32, ratio_width: 8, diff_width: 0, diff_decimals: 2 };
        assert_eq!(
            r.line(&p, "input round trip (head -n 1)"),
            format!(
                "  {:<3} {:<32} p50 {:>8.2}x ({:+.2} ms)  p99 {:>8.2}x",
                p.part,
                "input round trip (head -n 1)",
                p.p50_ratio(),
                p.p50_diff_ms(),
                p.p99_ratio()
            )
        );
        let p = Pair {
            part: "3p",
            api: Summary { p50_ms: 21.5, p99_ms: 30.0, ..p.api },
            raw: Summary { p50_ms: 20.25, ..p.raw },
        };
        let r = PairRatios { label_width: 24, ratio_width: 6, diff_width: 8, diff_decimals: 1 };
        assert_eq!(
            r.line(&p, "  pause"),
            format!(
                "  {:<3} {:<24} p50 {:>6.2}x ({:+8.1} ms)  p99 {:>6.2}x",
                p.part,
                "  pause",
                p.p50_ratio(),
                p.p50_diff_ms(),
                p.p99_ratio()
            )
        );
        let st = Recorder::default().stats(2.0);
        assert_eq!(
            st.columns(),
            format!(
                "{:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>7}",
                st.ops_per_sec, st.p50_ms, st.p99_ms, st.max_ms, st.errors
            )
        );
        assert_eq!(
            Stats::headings(),
            format!("{:>10} {:>9} {:>9} {:>9} {:>7}", "ops/s", "p50 ms", "p99 ms", "max ms", "errors")
        );
    }

    #[test]
    fn summaries_name_warmup_errors_only_with_a_warmup() {
        let all = serde_json::to_value(Recorder::default().summary("op")).unwrap();
        assert!(all.get("warmupErrors").is_none());
        let windowed = serde_json::to_value(Recorder::in_window(Window::unbounded()).summary("op")).unwrap();
        assert_eq!(windowed["warmupErrors"], 0);
    }

    #[test]
    fn recorder_counts_inside_its_window() {
        let mut all = Recorder::default();
        all.ok(Duration::from_millis(2));
        assert!(all.add(Err(anyhow::anyhow!("boom"))));
        let s = all.summary("op");
        assert_eq!((s.n, s.errors, s.warmup_errors), (1, 1, None));
        assert_eq!(s.error_samples, ["boom"]);

        let warming = Window::start(Timing { warmup: Duration::from_secs(60), measure: Duration::from_secs(1) });
        let mut w = Recorder::in_window(warming);
        w.ok(Duration::from_millis(2));
        w.add(Err(anyhow::anyhow!("early")));
        let s = w.summary(String::from("op"));
        assert_eq!((s.n, s.errors, s.warmup_errors), (0, 0, Some(1)));

        let mut merged = Recorder::in_window(Window::unbounded());
        merged.merge(all);
        merged.merge(w);
        let st = merged.stats(2.0);
        assert_eq!((st.ops, st.errors, st.warmup_errors, st.ops_per_sec), (1, 1, 1, 0.5));
        assert_eq!(st.error_samples, ["boom", "early"]);
    }
}
