//! browser-bench: the agent's browser snapshot of a 1,000-element page against the raw CDP call
//! it is built on (`Accessibility.getFullAXTree`), in the same run; the snapshot's size in bytes
//! and in approximate tokens; and the screenshot against the raw `Page.captureScreenshot`.
//! The goal: snapshot at most 1.5x the raw call at p50. Part 3 (issue 38): a click by ref, from the
//! call to the page's handler running, against the raw `Input.dispatchMouseEvent` pair on the same
//! button of the element corpus (`tests/fixtures/web/elements.py`), each to the server's
//! CLOCK_MONOTONIC stamp of the page's report; goal: at most 1.5x at p50 without an `actionId`.
//! With one, the node's action record and its fsynced commits come first, so part 4 runs the same
//! click through a one-node test cluster and this machine paired with the release agent
//! (`--browser`), with a new `actionId` each time against without one, in turn; goal: at most
//! 20 ms added at p50. `BENCH_NODE=0` skips it (it needs `COMPUTERD_BIN`/`AGENT_BIN` or the release
//! builds, as the other benches).
//!
//! - **ours**: `Browser::call` as the agent serves it (automation mode, headless Chromium run as
//!   the desktop account over a CDP pipe): `snapshot` (text format) and `screenshot` (PNG, the
//!   viewport), on a session opened on the test site's `/big?n=1000`;
//! - **raw**: a second Chromium started by the bench with the agent's own pipe code
//!   (`computer_agent::browser::cdp`), the same flags, the same account and the same CDP domains
//!   enabled on its tab (Page, Network, DOM, Accessibility), on the same URL: the bare
//!   `Accessibility.getFullAXTree {}` (the answer parsed by the same reader, then dropped) and the
//!   bare `Page.captureScreenshot {format: png}`.
//!
//! The raw side is timed from the request to the parsed answer (its drop after the timing). The
//! two sides alternate (and which goes first alternates too), after warm-ups not counted. For where
//! the difference goes, a third step takes turns with the snapshot's two: the snapshot's own steps
//! replayed on the raw browser (its CDP calls, the clone and the listing of the tree, the drops),
//! each timed; and, after, what the tree's JSON costs in-process (parse, clone, drop).
//!
//! Needs root (the browser runs as the desktop account, as in the agent), python3 (the test site,
//! `tests/fixtures/browser_site.py`) and Chromium (`/usr/bin/chromium`; `CHROMIUM` overrides it).
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd -p computer-agent --bin computer-agent \
//!   -p computerd-bench --bin browser-bench && target/release/browser-bench
//! ```
//!
//! Environment: `BENCH_SAMPLES` (default 50; 10 with `BENCH_QUICK=1`), `BENCH_ELEMENTS` (default
//! 1000: the page's elements), `BENCH_ONLY=click` (parts 3 and 4 only), `BENCH_NODE=0` (no part 4),
//! `BENCH_JSON`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::anyhow;
use anyhow::bail;
use computer_agent::browser::Browser;
use computer_agent::browser::cdp;
use computer_agent::browser::cdp::Cdp;
use computer_agent::users::Account;
use computerd_bench::report::Pair;
use computerd_bench::report::PairRatios;
use computerd_bench::report::Recorder;
use computerd_bench::report::SummaryTable;
use computerd_bench::settings;
use computerd_proto::browser::BrowserOp;
use serde_json::Value;
use serde_json::json;

/// The p50 goal of snapshot ÷ raw `getFullAXTree`.
const GOAL: f64 = 1.5;
const CALLER: &str = "bot:browser-bench";
/// The p50 goal of what an `actionId` adds to a click (ms).
const ACTION_GOAL_MS: f64 = 20.0;
/// Not counted, per side.
const WARMUP: usize = 5;
/// How long a raw CDP call may take.
const WITHIN: Duration = Duration::from_secs(30);

/// The test site; killed when dropped.
struct Site {
    child: std::process::Child,
    url: String,
    /// Its state directory (the corpus's `events.jsonl`).
    state: PathBuf,
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tests/fixtures/{script}` (`browser_site.py`, `web/elements.py`) on a free port with its
/// state in `state`.
fn site(script: &str, state: &Path) -> Result<Site> {
    use std::io::BufRead;
    std::fs::create_dir_all(state).with_context(|| format!("make {}", state.display()))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(script);
    let mut child = std::process::Command::new("python3")
        .arg(&script)
        .arg("0")
        .arg(state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("python3 (the test site needs it)")?;
    let out = child.stdout.take().context("the site's stdout")?;
    let mut site = Site { child, url: String::new(), state: state.to_path_buf() };
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).context("the site's first line")?;
    let port: u16 = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("the site said {line:?}, not `listening on PORT`"))?;
    site.url = format!("http://127.0.0.1:{port}");
    Ok(site)
}

fn chromium() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("CHROMIUM={} is not a file", p.display());
        }
        return Ok(p);
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().map(PathBuf::from).find(|p| p.is_file()).context(
        "no Chromium at /usr/bin/chromium or /usr/bin/chromium-browser (apt-get install chromium, or set CHROMIUM)",
    )
}

/// The baseline: a Chromium of the bench's own, one tab attached, flat.
struct Raw {
    cdp: Cdp,
    child: tokio::process::Child,
    /// The tab's flat CDP session.
    session: String,
}

impl Raw {
    async fn call(&self, method: &str, params: Value) -> Result<Value> {
        self.cdp.call(Some(&self.session), method, params, WITHIN).await.map_err(|e| anyhow!("raw {method}: {e}"))
    }

    async fn browser_call(&self, method: &str, params: Value) -> Result<Value> {
        self.cdp.call(None, method, params, WITHIN).await.map_err(|e| anyhow!("raw {method}: {e}"))
    }

    async fn close(mut self) {
        let _ = self.cdp.call(None, "Browser.close", json!({}), Duration::from_secs(3)).await;
        if tokio::time::timeout(Duration::from_secs(3), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

/// A directory of `account`'s, 0700.
fn own_dir(d: &Path, account: &Account) -> Result<()> {
    std::fs::create_dir_all(d).with_context(|| format!("make {}", d.display()))?;
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
    std::os::unix::fs::chown(d, Some(account.uid), Some(account.gid))
        .with_context(|| format!("chown {}", d.display()))?;
    Ok(())
}

/// Starts the baseline Chromium as `account` (with its home and profile under `dir`), opens a
/// tab, enables the domains the agent enables on its tabs, loads `url` and waits for its load.
async fn raw_browser(chromium: &Path, account: &Account, dir: &Path, url: &str) -> Result<Raw> {
    let (home, profile) = (dir.join("home"), dir.join("profile"));
    for d in [dir, &home, &profile] {
        own_dir(d, account)?;
    }
    let pipes = cdp::pipes().context("the baseline's pipes")?;
    let mut c = tokio::process::Command::new(chromium);
    c.uid(account.uid)
        .gid(account.gid)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .current_dir(&home)
        // The agent's own command line in automation mode, so both browsers run alike.
        .args(computer_agent::browser::flags(computerd_proto::browser::Mode::Automation, &profile))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let (child_in, child_out) = cdp::raw(&pipes);
    // SAFETY: place_child_fds only calls fcntl and dup2, both async-signal-safe.
    unsafe {
        c.pre_exec(move || cdp::place_child_fds(child_in, child_out));
    }
    let child = c.spawn().with_context(|| format!("start {}", chromium.display()))?;
    drop(pipes.child_in);
    drop(pipes.child_out);
    let cdp = Cdp::serve(pipes.to_browser, pipes.from_browser);
    let mut raw = Raw { cdp, child, session: String::new() };
    raw.browser_call("Browser.getVersion", json!({})).await.context("the baseline Chromium did not start")?;
    let made = raw.browser_call("Target.createTarget", json!({"url": "about:blank"})).await?;
    let target = made["targetId"].as_str().context("no targetId")?.to_string();
    let attached = raw.browser_call("Target.attachToTarget", json!({"targetId": target, "flatten": true})).await?;
    raw.session = attached["sessionId"].as_str().context("no sessionId")?.to_string();
    for m in ["Page.enable", "Network.enable", "DOM.enable", "Accessibility.enable"] {
        raw.call(m, json!({})).await?;
    }
    raw.navigate(url).await?;
    Ok(raw)
}

impl Raw {
    /// Loads `url` in the tab and waits for its load event.
    async fn navigate(&self, url: &str) -> Result<()> {
        let mut events = self.cdp.subscribe();
        self.call("Page.navigate", json!({"url": url})).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(until, events.recv()).await {
                Ok(Ok(ev)) if ev.session == self.session && ev.method == "Page.loadEventFired" => return Ok(()),
                Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(e)) => bail!("the baseline browser: {e}"),
                Err(_) => bail!("the baseline browser did not load {url} in 30 s"),
            }
        }
    }
}

fn op(v: Value) -> Result<BrowserOp> {
    serde_json::from_value(v).context("a browser op")
}

/// One `Browser::call`, timed; its answer's JSON and image.
async fn ours(b: &Browser, v: Value) -> Result<(Duration, Value, Vec<u8>)> {
    let what = v["op"].as_str().unwrap_or_default().to_string();
    let op = op(v)?;
    let t = Instant::now();
    let a = b.call(op, CALLER).await.map_err(|e| anyhow!("{what}: {:?}: {}", e.kind, e.message))?;
    Ok((t.elapsed(), a.json, a.image))
}

/// One raw call on the baseline's tab, timed; its answer.
async fn raw_timed(raw: &Raw, method: &str, params: Value) -> Result<(Duration, Value)> {
    let t = Instant::now();
    let v = raw.call(method, params).await?;
    Ok((t.elapsed(), v))
}

/// `samples` alternating pairs (and `WARMUP` first, not counted): `a` and `b`, the one or the
/// other first in turn.
async fn alternate<A, B, FA, FB>(samples: usize, mut a: FA, mut b: FB) -> Result<(Recorder, Recorder)>
where
    FA: FnMut() -> A,
    FB: FnMut() -> B,
    A: std::future::Future<Output = Result<Duration>>,
    B: std::future::Future<Output = Result<Duration>>,
{
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    for i in 0..WARMUP + samples {
        let (da, db) = if i % 2 == 0 {
            let da = a().await?;
            (da, b().await?)
        } else {
            let db = b().await?;
            (a().await?, db)
        };
        if i >= WARMUP {
            ra.ok(da);
            rb.ok(db);
        }
    }
    Ok((ra, rb))
}

/// The steps of a snapshot (`agent/src/browser/page.rs`, `serve` and `snapshot`) replayed on the
/// raw browser: the same CDP calls in the same order, the same clone and listing of the tree (not
/// the text lines and refs, which are small): in all, `getFullAXTree`, the 5 other calls
/// (`Target.getTargets`, `Page.getFrameTree`, `DOM.getDocument`, `DOM.querySelectorAll`,
/// `Target.getTargetInfo`), the clone, the walk, the drop.
async fn replay(raw: &Raw, target: &str) -> Result<[Duration; 6]> {
    let t0 = Instant::now();
    raw.browser_call("Target.getTargets", json!({})).await?;
    raw.call("Page.getFrameTree", json!({})).await?;
    let mut other = t0.elapsed();
    let t = Instant::now();
    let tree = raw.call("Accessibility.getFullAXTree", json!({})).await?;
    let axtree = t.elapsed();
    let t = Instant::now();
    let nodes = tree["nodes"].as_array().cloned().unwrap_or_default();
    let clone = t.elapsed();
    let t = Instant::now();
    let (listed, _) = computer_agent::browser::page::listing(&nodes, None, computerd_proto::browser::MAX_ELEMENTS);
    std::hint::black_box(&listed);
    let walk = t.elapsed();
    let t = Instant::now();
    drop((tree, nodes, listed));
    let dropped = t.elapsed();
    let t = Instant::now();
    let doc = raw.call("DOM.getDocument", json!({"depth": 0})).await?;
    let root = doc["root"]["nodeId"].as_i64().unwrap_or(0);
    raw.call("DOM.querySelectorAll", json!({"nodeId": root, "selector": "input[type=file]"})).await?;
    raw.browser_call("Target.getTargetInfo", json!({"targetId": target})).await?;
    other += t.elapsed();
    Ok([t0.elapsed(), axtree, other, clone, walk, dropped])
}

/// How many bytes a padded base64 string decodes to.
fn base64_bytes(s: &str) -> usize {
    let pad = s.bytes().rev().take_while(|&c| c == b'=').count();
    s.len() / 4 * 3 - pad.min(2)
}

fn main() -> Result<()> {
    // Part 4 runs a node and a paired agent: their release binaries, as in the other benches.
    let node = !std::env::var("BENCH_NODE").is_ok_and(|v| v == "0");
    let bins = if node { Some((settings::computerd_bin()?, settings::agent_bin()?)) } else { None };
    let rt = match &bins {
        // SAFETY: first thing in `main`: no other thread exists yet.
        Some((computerd, _)) => unsafe { settings::runtime_for(computerd)? },
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
    };
    rt.block_on(bench(bins.map(|b| b.1)))
}

async fn bench(agent: Option<PathBuf>) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("browser-bench needs root: the browser runs as the desktop account, as in the agent");
    }
    let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if settings::quick() { 10 } else { 50 });
    let elements = settings::env_count("BENCH_ELEMENTS")?.unwrap_or(1000);
    let chromium = chromium()?;
    let account = computer_agent::desktop::xserver::desktop_account().map_err(anyhow::Error::msg)?;
    let t = tempfile::tempdir()?;
    // The browser's account must traverse it to its own directories.
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755))?;
    let workspace = t.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let corpus = site("web/elements.py", &t.path().join("corpus"))?;
    let site = site("browser_site.py", &t.path().join("site"))?;
    let url = format!("{}/big?n={elements}", site.url);
    eprintln!("browser-bench: {} as {} (uid {}); the page {url}", chromium.display(), account.name, account.uid);
    let only_click = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "click");

    let b = Browser::new(chromium.clone(), account.clone(), t.path().join("browser"), workspace, None);
    let opened = ours(&b, json!({"op": "open", "args": {"profile": "bench", "url": url}})).await?.1;
    let sid = opened["session"].as_str().context("no session")?.to_string();
    if opened["tabs"][0]["status"] != 200 {
        bail!("the session did not load {url}: {opened}");
    }
    let raw = raw_browser(&chromium, &account, &t.path().join("raw"), &url).await?;

    let mut doc = json!({});
    let mut result = if only_click { Ok(()) } else { run(&b, &sid, &raw, samples, elements).await.map(|d| doc = d) };
    if result.is_ok() {
        result = clicks(&b, &raw, &corpus, samples).await.map(|d| doc["click"] = d);
    }
    if result.is_ok()
        && let Some(agent) = &agent
    {
        result = node_clicks(agent, &chromium, &corpus, samples).await.map(|d| doc["clickThroughNode"] = d);
    }
    if result.is_ok()
        && let Some(path) = settings::json_out()
    {
        result = computerd_bench::report::write_json(&path, &doc);
    }

    // Clean up, whatever happened.
    let _ = b.call(op(json!({"op": "close", "args": {"session": sid}}))?, CALLER).await;
    raw.close().await;
    drop(site);
    drop(corpus);
    result
}

async fn run(b: &Browser, sid: &str, raw: &Raw, samples: usize, elements: usize) -> Result<Value> {
    let snap = json!({"op": "snapshot", "args": {"session": sid, "format": "text"}});
    let shot = json!({"op": "screenshot", "args": {"session": sid, "format": "png"}});

    // What one of each answers: sizes, and that the page is the one asked for.
    let (_, first, _) = ours(b, snap.clone()).await?;
    let text = first["text"].as_str().unwrap_or_default();
    let refs = first["refs"].as_u64().unwrap_or(0);
    if first["truncated"] != false || refs < elements as u64 {
        bail!("the snapshot has {refs} refs (truncated: {}), fewer than the page's {elements}", first["truncated"]);
    }
    let (_, tree) = raw_timed(raw, "Accessibility.getFullAXTree", json!({})).await?;
    let tree_nodes = tree["nodes"].as_array().map_or(0, Vec::len);
    let tree_bytes = serde_json::to_vec(&tree)?.len();
    let (_, shot_json, shot_image) = ours(b, shot.clone()).await?;
    let (_, raw_shot) = raw_timed(raw, "Page.captureScreenshot", json!({"format": "png"})).await?;
    let raw_png = base64_bytes(raw_shot["data"].as_str().unwrap_or_default());

    let target = raw.browser_call("Target.getTargets", json!({})).await?["targetInfos"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["type"] == "page"))
        .and_then(|i| i["targetId"].as_str())
        .context("the baseline's tab")?
        .to_string();
    // 1. Snapshot against the raw tree, and the snapshot's steps replayed on the raw browser (for
    //    where the difference goes), in turn, the order rotating.
    eprintln!("snapshot: {samples} samples per side after {WARMUP}…");
    let (mut sa, mut sb) = (Recorder::default(), Recorder::default());
    let mut steps: [Recorder; 6] = Default::default();
    for i in 0..WARMUP + samples {
        let (mut d_ours, mut d_raw, mut rep) = (Duration::ZERO, Duration::ZERO, None);
        for k in 0..3 {
            match (i + k) % 3 {
                0 => d_ours = ours(b, snap.clone()).await?.0,
                1 => d_raw = raw_timed(raw, "Accessibility.getFullAXTree", json!({})).await?.0,
                _ => rep = Some(replay(raw, &target).await?),
            }
        }
        if i >= WARMUP {
            sa.ok(d_ours);
            sb.ok(d_raw);
            for (r, d) in steps.iter_mut().zip(rep.unwrap_or_default()) {
                r.ok(d);
            }
        }
    }
    // For reference, what the tree's JSON costs in-process (CPU only): what the CDP reader does
    // with every answer (parse, then clone the result and drop the message), on both sides.
    let bytes = serde_json::to_vec(&tree)?;
    let mut json_costs: [Recorder; 3] = Default::default();
    for i in 0..WARMUP + samples {
        let t = Instant::now();
        let v: Value = serde_json::from_slice(&bytes)?;
        let parse = t.elapsed();
        let t = Instant::now();
        let c = v.clone();
        let clone = t.elapsed();
        let t = Instant::now();
        drop(v);
        let dropped = t.elapsed();
        std::hint::black_box(c);
        if i >= WARMUP {
            for (r, d) in json_costs.iter_mut().zip([parse, clone, dropped]) {
                r.ok(d);
            }
        }
    }
    // 2. Screenshot against the raw capture, alternating.
    eprintln!("screenshot: {samples} samples per side after {WARMUP}…");
    let (ca, cb) = alternate(
        samples,
        || {
            let v = shot.clone();
            async move { ours(b, v).await.map(|r| r.0) }
        },
        || async move { raw_timed(raw, "Page.captureScreenshot", json!({"format": "png"})).await.map(|r| r.0) },
    )
    .await?;

    let pairs = [
        Pair {
            part: "1",
            api: sa.summary("ours: snapshot (text) through Browser::call"),
            raw: sb.summary("raw: Accessibility.getFullAXTree {}"),
        },
        Pair {
            part: "2",
            api: ca.summary("ours: screenshot (png, viewport) through Browser::call"),
            raw: cb.summary("raw: Page.captureScreenshot {format: png}"),
        },
    ];
    let [total, axtree, other, clone, walk, dropped] = steps;
    let parts = [
        total.summary("replay: the snapshot's steps on the raw browser, in all"),
        axtree.summary("  of which Accessibility.getFullAXTree"),
        other.summary("  of which its 5 other CDP calls"),
        clone.summary("  of which the clone of the tree's nodes"),
        walk.summary("  of which listing() (the walk)"),
        dropped.summary("  of which dropping the tree and its clone"),
    ];
    let [j_parse, j_clone, j_drop] = json_costs;
    let json_rows = [
        j_parse.summary("in-process: parse the tree's JSON into a Value"),
        j_clone.summary("in-process: clone that Value"),
        j_drop.summary("in-process: drop that Value"),
    ];

    println!(
        "browser-bench: a page of {elements} elements (test site /big), headless Chromium as the desktop account, \
         {samples} samples per side after {WARMUP} warm-ups, in turn; {} cores, load {}",
        computerd_bench::report::cores(),
        computerd_bench::report::loadavg()
    );
    let table = SummaryTable { op_width: 58, n_width: 4, decimals: 2 };
    println!("{}", table.header());
    for p in &pairs {
        println!("{}", table.row(p.part, &p.api));
        println!("{}", table.row(p.part, &p.raw));
    }
    for s in &parts {
        println!("{}", table.row("1r", s));
    }
    for s in &json_rows {
        println!("{}", table.row("1j", s));
    }
    println!("ratios ours ÷ raw:");
    let r = PairRatios { label_width: 12, ratio_width: 6, diff_width: 0, diff_decimals: 2 };
    println!("{}", r.line(&pairs[0], "snapshot"));
    println!("{}", r.line(&pairs[1], "screenshot"));
    let ratio = pairs[0].p50_ratio();
    println!(
        "{}: snapshot p50 {ratio:.2}x the raw getFullAXTree (goal: at most {GOAL}x)",
        if ratio <= GOAL { "PASS" } else { "MISS" }
    );
    println!(
        "snapshot size: {} bytes of text, {refs} refs, about {} tokens (bytes ÷ 4, a rough rule for English \
         and markup); the raw getFullAXTree result: {tree_nodes} nodes, {tree_bytes} bytes of JSON (re-encoded \
         compactly), about {} tokens",
        text.len(),
        text.len() / 4,
        tree_bytes / 4
    );
    println!(
        "screenshot: {}x{} PNG, {} bytes ours, {raw_png} bytes raw",
        shot_json["width"],
        shot_json["height"],
        shot_image.len()
    );
    Ok(json!({
            "elements": elements,
            "samples": samples,
            "pairs": pairs,
            "parts": parts,
            "json": json_rows,
            "snapshot": {"textBytes": text.len(), "refs": refs, "approxTokens": text.len() / 4},
            "rawTree": {"nodes": tree_nodes, "jsonBytes": tree_bytes},
            "screenshot": {"width": shot_json["width"], "height": shot_json["height"], "bytes": shot_image.len(), "rawBytes": raw_png},
            "goal": GOAL,
            "met": ratio <= GOAL,
    }))
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of Python's `time.monotonic_ns()` on Linux, which
/// the corpus server stamps each event with (`t`).
fn monotonic_ns() -> u64 {
    let mut ts = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits until the corpus server logged the plain button's click at or after `start` (monotonic
/// ns); the time from `start` to the server's stamp.
async fn plain_click_since(log: &Path, start: u64) -> Result<Duration> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let t = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["el"] == "plain" && e["ev"] == "click")
            .filter_map(|e| e["t"].as_u64())
            .find(|&t| t >= start);
        if let Some(t) = t {
            return Ok(Duration::from_nanos(t - start));
        }
        if Instant::now() > until {
            bail!("the page never reported the plain button's click in 10 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Part 3: a click by ref against the raw `Input.dispatchMouseEvent` pair on the same button of the
/// element corpus (`tests/fixtures/web/elements.{py,html}`), each from the call to the server's
/// log of the page's report of the click (the handler runs, then `fetch('/event')`; the server
/// stamps the event with its monotonic clock).
async fn clicks(b: &Browser, raw: &Raw, corpus: &Site, samples: usize) -> Result<Value> {
    let mut doc = clicks_in_a_session(b, raw, corpus, samples).await?;
    // The same without the wire guard (a test switch; the agent always runs it): what the
    // guard's new upstream connection per request adds to the page's own report of the click.
    eprintln!("click again, the session without its wire guard…");
    b.set_wire_guard(false);
    let unguarded = clicks_in_a_session(b, raw, corpus, samples).await;
    b.set_wire_guard(true);
    let unguarded = unguarded?;
    println!(
        "without the wire guard: click by ref p50 {:.2} ms, {:.2}x the floor in that run (with it: {:.2} ms, {:.2}x)",
        unguarded["pair"]["api"]["p50Ms"].as_f64().unwrap_or(f64::NAN),
        unguarded["overFloor"].as_f64().unwrap_or(f64::NAN),
        doc["pair"]["api"]["p50Ms"].as_f64().unwrap_or(f64::NAN),
        doc["overFloor"].as_f64().unwrap_or(f64::NAN),
    );
    doc["withoutWireGuard"] = unguarded;
    Ok(doc)
}

async fn clicks_in_a_session(b: &Browser, raw: &Raw, corpus: &Site, samples: usize) -> Result<Value> {
    let url = format!("{}/", corpus.url);
    let log = corpus.state.join("events.jsonl");
    let opened = ours(b, json!({"op": "open", "args": {"url": url}})).await?.1;
    let sid = opened["session"].as_str().context("no session")?.to_string();
    let result = if opened["tabs"][0]["title"] != "Elements" {
        Err(anyhow!("the session did not load the element corpus at {url}: {opened}"))
    } else {
        clicks_on(b, &sid, raw, &url, &log, samples).await
    };
    let _ = b.call(op(json!({"op": "close", "args": {"session": sid}}))?, CALLER).await;
    result
}

async fn clicks_on(b: &Browser, sid: &str, raw: &Raw, url: &str, log: &Path, samples: usize) -> Result<Value> {
    let snap = ours(b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await?.1;
    let r = snap["elements"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["role"] == "button" && e["name"] == "Plain button"))
        .and_then(|e| e["ref"].as_str())
        .context("no button \"Plain button\" in the snapshot")?
        .to_string();
    let click = json!({"op": "click", "args": {"session": sid, "ref": r}});

    // The raw tab on the same page; the button scrolled to the viewport's middle and its centre
    // read once, untimed.
    raw.navigate(url).await?;
    let at = raw
        .call(
            "Runtime.evaluate",
            json!({"returnByValue": true, "expression": "(() => { \
                const b = [...document.querySelectorAll('button')].find(b => b.textContent === 'Plain button'); \
                b.scrollIntoView({block: 'center'}); const r = b.getBoundingClientRect(); \
                return [r.x + r.width / 2, r.y + r.height / 2]; })()"}),
        )
        .await?;
    let (x, y) = (
        at["result"]["value"][0].as_f64().context("the button's centre")?,
        at["result"]["value"][1].as_f64().context("the button's centre")?,
    );

    // The floor's button: its backend node id, read once, untimed (a ref holds the same).
    let found = raw
        .call(
            "Runtime.evaluate",
            json!({"expression": "[...document.querySelectorAll('button')].find(b => b.textContent === 'Plain button')"}),
        )
        .await?;
    let object = found["result"]["objectId"].as_str().context("the button's object")?.to_string();
    let described = raw.call("DOM.describeNode", json!({"objectId": object})).await?;
    let backend = described["node"]["backendNodeId"].as_i64().context("the button's backendNodeId")?;
    let floor_rec = std::cell::RefCell::new(Recorder::default());
    let floor_n = std::cell::Cell::new(0usize);

    eprintln!("click: {samples} samples per side after {WARMUP}…");
    let (ka, kb) = alternate(
        samples,
        || {
            let v = click.clone();
            async move {
                let start = monotonic_ns();
                ours(b, v).await?;
                // The call has returned (after its wait for a navigation): the server's stamp
                // is what counts.
                plain_click_since(log, start).await
            }
        },
        || {
            let (floor_rec, floor_n) = (&floor_rec, &floor_n);
            async move {
                let start = monotonic_ns();
                for kind in ["mousePressed", "mouseReleased"] {
                    raw.call(
                        "Input.dispatchMouseEvent",
                        json!({"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1}),
                    )
                    .await?;
                }
                let bare = plain_click_since(log, start).await?;
                let start = monotonic_ns();
                checked_raw_click(raw, backend).await?;
                let floor = plain_click_since(log, start).await?;
                floor_n.set(floor_n.get() + 1);
                if floor_n.get() > WARMUP {
                    floor_rec.borrow_mut().ok(floor);
                }
                Ok(bare)
            }
        },
    )
    .await?;
    let floor = floor_rec.into_inner().summary("floor: the same CDP calls from the bench (checks, hit test, input)");
    let pair = Pair {
        part: "3",
        api: ka.summary("ours: click by ref (no actionId), to the server's log"),
        raw: kb.summary("raw: Input.dispatchMouseEvent pressed+released, same"),
    };
    println!(
        "browser-bench, click: the element corpus's \"Plain button\", from the call to the page's report \
         logged by its server (the handler ran, then fetch POST /event; the server's CLOCK_MONOTONIC stamp), \
         {samples} samples per side after {WARMUP} warm-ups, in turn; {} cores, load {}",
        computerd_bench::report::cores(),
        computerd_bench::report::loadavg()
    );
    let table = SummaryTable { op_width: 58, n_width: 4, decimals: 2 };
    println!("{}", table.header());
    println!("{}", table.row(pair.part, &pair.api));
    println!("{}", table.row(pair.part, &pair.raw));
    let r = PairRatios { label_width: 12, ratio_width: 6, diff_width: 0, diff_decimals: 2 };
    println!("{}", r.line(&pair, "click"));
    println!("{}", table.row(pair.part, &floor));
    let over_floor = pair.api.p50_ratio(&floor);
    println!(
        "click by ref p50 {over_floor:.2}x the floor ({:.2} ms against {:.2} ms); the floor is {:.2}x the bare pair",
        pair.api.p50_ms,
        floor.p50_ms,
        floor.p50_ratio(&pair.raw)
    );
    let ratio = pair.p50_ratio();
    println!(
        "{}: click by ref p50 {ratio:.2}x the raw dispatchMouseEvent pair (goal: at most {GOAL}x)",
        if ratio <= GOAL { "PASS" } else { "MISS" }
    );
    println!("click with an actionId: the record is the node's; see part 4 (through a node), unless BENCH_NODE=0");
    Ok(
        json!({"pair": pair, "floor": floor, "overFloor": over_floor, "goal": GOAL, "met": ratio <= GOAL, "withActionId": null}),
    )
}

/// The floor of part 3: the CDP calls a click by ref makes, in the same shape, straight from the
/// bench with nothing of ours on the path: the tab list beside the element's resolution from its
/// backend node id (what a ref holds); then, together, the document check (`Page.getFrameTree`),
/// the element still attached, its role and name (`Accessibility.getPartialAXTree`) and one page
/// call for its centre and the hit test there; then the move and the press together, and the
/// release after the press. What ours adds over it is its own code: parsing, locks, checks.
async fn checked_raw_click(raw: &Raw, backend: i64) -> Result<()> {
    let (targets, resolved) = tokio::join!(
        raw.browser_call("Target.getTargets", json!({})),
        raw.call("DOM.resolveNode", json!({"backendNodeId": backend}))
    );
    targets?;
    let resolved = resolved?;
    let object = resolved["object"]["objectId"].as_str().context("DOM.resolveNode: no objectId")?;
    let on = |f: &str| json!({"objectId": object, "returnByValue": true, "functionDeclaration": f});
    let (tree, connected, ax, point) = tokio::join!(
        raw.call("Page.getFrameTree", json!({})),
        raw.call("Runtime.callFunctionOn", on("function() { return this.isConnected; }")),
        raw.call("Accessibility.getPartialAXTree", json!({"backendNodeId": backend, "fetchRelatives": false})),
        raw.call(
            "Runtime.callFunctionOn",
            on("function() { const r = this.getBoundingClientRect(); const x = r.x + r.width / 2, y = r.y + r.height / 2; \
                const h = document.elementFromPoint(x, y); return h && (h === this || this.contains(h)) ? [x, y] : null; }")
        )
    );
    tree?;
    if connected?["result"]["value"] != true || ax?["nodes"].as_array().is_none_or(Vec::is_empty) {
        bail!("the floor's checks failed");
    }
    let point = point?;
    let at = &point["result"]["value"];
    let (x, y) = (
        at[0].as_f64().context("the floor's hit test missed")?,
        at[1].as_f64().context("the floor's hit test missed")?,
    );
    let event = |kind: &str| json!({"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1});
    let (moved, pressed) = tokio::join!(
        raw.call("Input.dispatchMouseEvent", json!({"type": "mouseMoved", "x": x, "y": y, "button": "none"})),
        raw.call("Input.dispatchMouseEvent", event("mousePressed"))
    );
    moved?;
    pressed?;
    raw.call("Input.dispatchMouseEvent", event("mouseReleased")).await?;
    let _ = raw.call("Runtime.releaseObject", json!({"objectId": object})).await;
    Ok(())
}

/// A call on node 1 with the owner token; anything but 2xx is an error.
async fn api(c: &computerd_tests::TestCluster, path: &str, body: Value) -> Result<Value> {
    let (s, v) = c.call(reqwest::Method::POST, 1, path, &c.token, Some(body)).await;
    if !(200..300).contains(&s) {
        bail!("{path}: HTTP {s}: {v}");
    }
    Ok(v)
}

/// Part 4: the same click through a node (a one-node test cluster and this machine paired with
/// the release agent, `--browser`), with an `actionId` (a new one each time: the record is
/// prepared and committed before the click is sent) against without, in turn, each from the
/// request to the server's stamp of the page's report, as in part 3.
async fn node_clicks(agent: &Path, chromium: &Path, corpus: &Site, samples: usize) -> Result<Value> {
    let c = computerd_tests::TestCluster::start(1).await;
    let dir = c.dir.path();
    let body = json!({"commandKey": "browser-bench", "name": "bench", "source": {"_tag": "Paired"}});
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
    let _agent = tokio::process::Command::new(agent)
        .args(["--server", &c.url(1, ""), "--pair", &code, "--state"])
        .arg(dir.join("agent-state"))
        .arg("--workdir")
        .arg(&workspace)
        .arg("--browser")
        .arg(chromium)
        .env("HOME", dir.join("agent-home"))
        .env("COMPUTER_AGENT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("start the agent")?;
    computerd_tests::agent::wait_state(&c, &id, "running").await;

    let url = format!("{}/", corpus.url);
    let events = corpus.state.join("events.jsonl");
    let base = format!("/v1/computers/{id}/browser");
    let opened = api(&c, &format!("{base}/sessions"), json!({"url": url})).await?;
    let sid = opened["session"].as_str().context("no session")?.to_string();
    if opened["tabs"][0]["title"] != "Elements" {
        bail!("the node's session did not load the element corpus at {url}: {opened}");
    }
    let snap = api(&c, &format!("{base}/snapshot"), json!({"session": sid, "format": "json"})).await?;
    let r = snap["elements"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["role"] == "button" && e["name"] == "Plain button"))
        .and_then(|e| e["ref"].as_str())
        .context("no button \"Plain button\" in the node's snapshot")?
        .to_string();
    let click = format!("{base}/click");
    let n = std::cell::Cell::new(0u64);
    let (c, click, sid, r, events, n) = (&c, &click, &sid, &r, &events, &n);

    eprintln!("click through a node: {samples} samples per side after {WARMUP}…");
    let (wa, wb) = alternate(
        samples,
        || async move {
            n.set(n.get() + 1);
            let body = json!({"session": sid, "ref": r, "actionId": format!("bench-click-{}", n.get())});
            let start = monotonic_ns();
            let v = api(c, click, body).await?;
            if v["action"].is_null() {
                bail!("the click with an actionId answered no action record: {v}");
            }
            plain_click_since(events, start).await
        },
        || async move {
            let start = monotonic_ns();
            api(c, click, json!({"session": sid, "ref": r})).await?;
            plain_click_since(events, start).await
        },
    )
    .await?;
    let _ = c.call(reqwest::Method::DELETE, 1, &format!("{base}/sessions/{sid}"), &c.token, None).await;
    let pair = Pair {
        part: "4",
        api: wa.summary("node: click by ref with an actionId, to the server's log"),
        raw: wb.summary("node: the same click without an actionId"),
    };
    println!(
        "browser-bench, click through a node: the same button, through a one-node cluster's \
         POST …/browser/click and a paired release agent on this machine, {samples} samples per side \
         after {WARMUP} warm-ups, in turn; load {}",
        computerd_bench::report::loadavg()
    );
    let table = SummaryTable { op_width: 58, n_width: 4, decimals: 2 };
    println!("{}", table.header());
    println!("{}", table.row(pair.part, &pair.api));
    println!("{}", table.row(pair.part, &pair.raw));
    let added = pair.api.p50_ms - pair.raw.p50_ms;
    println!(
        "{}: an actionId adds {added:.2} ms at p50 ({:.2} ms at p99) to the click (goal: at most {ACTION_GOAL_MS} ms)",
        if added <= ACTION_GOAL_MS { "PASS" } else { "MISS" },
        pair.api.p99_ms - pair.raw.p99_ms
    );
    Ok(json!({"pair": pair, "addedP50Ms": added, "goalMs": ACTION_GOAL_MS, "met": added <= ACTION_GOAL_MS}))
}
