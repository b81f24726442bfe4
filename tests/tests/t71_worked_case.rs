//! The worked case end to end: "with my account on site A, upload report.pdf to project B's
//! documents and return the link", through a 3-node cluster behind HAProxy, a Docker sandbox
//! with the desktop and its browser, the test site (tests/fixtures/browser_site.py) and the
//! example runtime (examples/runtime/runtime.py), every call through the load balancer.
//!
//! 1. A member uploads a real PDF as a blob (with its SHA-256) and starts a turn; it follows
//!    the run's events, drops the stream midway and resumes with `Last-Event-ID`.
//! 2. A runtime claims the run and is killed (SIGKILL) just before the upload, and so is the
//!    node serving the member's stream: the stream resumes through HAProxy on a live node; the
//!    run is claimed again and a second runtime finishes it with one upload, checked through
//!    the site's API against the blob's SHA-256, a screenshot saved as evidence, the result
//!    `{documentId, url, screenshotBlobId}`. Every event reaches the member exactly once.
//! 3. The site loses the upload's answer: the action is `unknown`, nothing is uploaded twice,
//!    and the run says what is known.
//! 4. A runtime is killed while its upload is in flight (its action record `dispatching`): the
//!    run becomes `needs_decision`, nobody can claim it, no second upload happens, and the
//!    member decides.

use std::io::BufRead;
use std::sync::mpsc;
use std::time::Duration;
use std::time::Instant;

use computerd_tests::TestCluster;
use computerd_tests::docker::Containers;
use computerd_tests::docker::DESKTOP_IMAGE;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::ensure_desktop_image;
use computerd_tests::lb::Haproxy;
use computerd_tests::sse::Sse;
use computerd_tests::sse::follow;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

/// Calls through the load balancer.
struct Lb {
    base: String,
    http: reqwest::Client,
}

impl Lb {
    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    fn base_url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(Method::GET, path, token, None).await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, path, token, Some(body)).await
    }
}

/// A real PDF of about 120 KB: a page with a title and a drawing, with a correct xref table.
fn report_pdf() -> Vec<u8> {
    let text = b"BT /F1 24 Tf 72 720 Td (Quarterly report, project B) Tj ET\n".to_vec();
    let mut drawing = Vec::new();
    let mut i = 0u32;
    while drawing.len() < 116_000 {
        let (x, y) = (72 + (i * 37) % 460, 80 + (i * 53) % 600);
        drawing.extend_from_slice(format!("{x} {y} m {} {} l S\n", x + 12, y + (i % 7)).as_bytes());
        i += 1;
    }
    let stream = |body: &[u8]| {
        let mut o = format!("<< /Length {} >>\nstream\n", body.len()).into_bytes();
        o.extend_from_slice(body);
        o.extend_from_slice(b"endstream");
        o
    };
    let objects: Vec<Vec<u8>> = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents [4 0 R 5 0 R] /Resources << /Font << /F1 6 0 R >> >> >>".to_vec(),
        stream(&text),
        stream(&drawing),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_vec(),
    ];
    let mut pdf = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n".to_vec();
    let mut offsets = Vec::new();
    for (n, o) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n", n + 1).as_bytes());
        pdf.extend_from_slice(o);
        pdf.extend_from_slice(b"\nendobj\n");
    }
    let xref = pdf.len();
    pdf.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
    for o in offsets {
        pdf.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    pdf.extend_from_slice(
        format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).as_bytes(),
    );
    pdf
}

/// A process whose standard output lines arrive on a channel.
struct Proc {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(mut cmd: std::process::Command) -> Proc {
        let mut child =
            cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().expect("python3 runs");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Proc { child, lines }
    }

    /// Waits for a line starting with `prefix`; answers it and the lines before.
    fn expect(&self, prefix: &str, within: Duration) -> (String, Vec<String>) {
        let end = Instant::now() + within;
        let mut before = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return (l, before),
                Ok(l) => before.push(l),
                Err(_) => panic!("no line {prefix:?} within {within:?}; it said {before:?}"),
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Site {
    url: String,
    dir: std::path::PathBuf,
    _proc: Proc,
}

impl Site {
    fn start(dir: &std::path::Path) -> Site {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/browser_site.py");
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(script).arg("0").arg(dir);
        let proc = Proc::spawn(cmd);
        let (line, _) = proc.expect("listening on ", Duration::from_secs(20));
        let port: u16 = line.trim_start_matches("listening on ").trim().parse().expect("a port");
        Site { url: format!("http://127.0.0.1:{port}"), dir: dir.to_path_buf(), _proc: proc }
    }

    fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("state.json")).expect("state.json")).expect("json")
    }

    /// Project B's uploads as the site counted them, and its documents.
    fn project_b(&self) -> (u64, Vec<Value>) {
        let s = self.state();
        (s["uploads"]["b"].as_u64().unwrap_or(0), s["documents"]["b"].as_array().cloned().unwrap_or_default())
    }

    fn control(&self, v: Value) {
        std::fs::write(self.dir.join("control.json"), v.to_string()).expect("control.json");
    }
}

struct Runtime<'a> {
    lb: &'a str,
    token_file: std::path::PathBuf,
    password_file: std::path::PathBuf,
    computer: String,
    site: String,
}

impl Runtime<'_> {
    fn spawn(&self, extra: &[&str]) -> Proc {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runtime/runtime.py");
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(script)
            .args(["--url", self.lb, "--computer", &self.computer, "--once", "--site", &self.site])
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--site-password-file")
            .arg(&self.password_file)
            .args(["--site-secret", "site-a"])
            .args(extra);
        Proc::spawn(cmd)
    }
}

async fn start_turn(lb: &Lb, token: &str, bot: &str, key: &str, blob: &Value) -> String {
    let turn = json!({
        "text": "With my account on site A, upload report.pdf to project B's documents and give me the link",
        "clientTurnId": key,
        "botId": bot,
        "attachments": [{"name": "report.pdf", "mimeType": "application/pdf", "size": blob["size"], "blobId": blob["blobId"]}],
    });
    let (s, run) = lb.post("/api/turn", token, turn).await;
    assert_eq!((s, run["state"].as_str()), (201, Some("queued")), "{run}");
    run["runId"].as_str().expect("runId").to_string()
}

async fn wait_run(lb: &Lb, token: &str, run: &str, state: &str) -> Value {
    let path = format!("/api/runs/{run}");
    wait_for(&format!("{run} to be {state}"), Duration::from_secs(60), || async {
        let (_, v) = lb.get(&path, token).await;
        (v["state"] == state).then_some(v)
    })
    .await
}

// Two worker threads: the runtimes' output is awaited with blocking receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_a_report_goes_to_project_b_once_and_checked_through_faults() {
    let started = Instant::now();
    ensure_desktop_image();
    let mut c = TestCluster::start(3).await;
    let haproxy = Haproxy::start(c.dir.path(), &c.nodes.values().map(|n| n.http.clone()).collect::<Vec<_>>()).await;
    let base = haproxy.url("");
    let lb = Lb { base: base.clone(), http: reqwest::Client::new() };
    let token = c.token.clone();

    // A desktop sandbox whose agent dials the cluster through HAProxy.
    let templates = json!({
        "serverUrl": base,
        "templates": {
            "default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256},
            "desktop": {"image": DESKTOP_IMAGE, "cpus": 1.0, "memoryMb": 1536, "pids": 1024},
        },
    });
    let provider = docker_provider(&c, templates).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "worked", "name": "worked", "desktop": true, "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = lb.post("/v1/computers", &token, body).await;
    assert_eq!(s, 202, "{v}");
    let computer = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&computer);
    wait_for("the Computer to run", Duration::from_secs(60), || async {
        let (_, v) = lb.get(&format!("/v1/computers/{computer}"), &token).await;
        (v["state"] == "running").then_some(())
    })
    .await;

    // Site A, outside the Computer (its browser reaches it: the test sandbox shares the host's
    // network); the account's password is the runtime's, in a file.
    let site = Site::start(&c.dir.path().join("site"));
    let password_file = c.dir.path().join("site.password");
    std::fs::write(&password_file, "wonderland").expect("password file");

    // The bot, its grant on the Computer, its token for the runtime.
    let (s, bot) = lb.post("/v1/bots", &token, json!({"name": "reporter"})).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    // Issue 41: the browser signs in with the vault's password (fill_secret), named in the grant.
    let secret = json!({"value": "wonderland", "origins": [site.url.trim_end_matches('/')], "kind": "password"});
    let (s, v) = lb.call(Method::PUT, "/v1/secrets/site-a", &token, Some(secret)).await;
    assert_eq!(s, 200, "{v}");
    let grant = json!({"secrets": ["site-a"]});
    let (s, v) = lb.call(Method::PUT, &format!("/v1/computers/{computer}/bots/{bot}"), &token, Some(grant)).await;
    assert!(s == 200 || s == 201, "{v}");
    let token_file = c.dir.path().join("bot.token");
    std::fs::write(&token_file, c.mint(json!({"botId": bot})).await).expect("token file");
    let runtime = Runtime { lb: &base, token_file, password_file, computer: computer.clone(), site: site.url.clone() };

    // 1. The member's report.pdf as a blob, checked as it streamed.
    let pdf = report_pdf();
    assert!((110_000..130_000).contains(&pdf.len()) && pdf.starts_with(b"%PDF-1.4"));
    let sha = hex::encode(sha2::Sha256::digest(&pdf));
    let r = lb
        .http
        .post(format!("{base}/api/blobs?sha={sha}&name=report.pdf&mimeType=application/pdf"))
        .bearer_auth(&token)
        .body(pdf.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status().as_u16(), 200);
    let blob: Value = r.json().await.expect("blob");
    assert_eq!(blob["nodes"].as_array().map(Vec::len), Some(2), "on two nodes: {blob}");
    let run = start_turn(&lb, &token, &bot, "report-1", &blob).await;
    let events = format!("/api/runs/{run}/events");

    // 2. The member follows; a runtime claims and stops just before the upload.
    let mut sse = Sse::open(&lb.base_url(&events), &token, None).await;
    let mut first = runtime.spawn(&["--hold-at", "upload", "--lease-ms", "3000"]);
    first.expect(&format!("claimed {run} attempt 1"), Duration::from_secs(30));
    first.expect("holding before upload", Duration::from_secs(120));
    let mut seen = Vec::new();
    while let Some(ev) = sse.next().await {
        let on_page = ev.1 == "partial" && ev.2["partial"].as_str().is_some_and(|p| p.starts_with("On "));
        seen.push(ev);
        if on_page {
            break;
        }
    }
    drop(sse); // the member goes away midway
    let last = seen.last().map(|e| e.0);

    // Back through HAProxy on a follower, which is then killed with the runtime.
    let leader = c.leader().await;
    let victim = c.nodes.keys().copied().find(|n| *n != leader).expect("a follower");
    let url = lb.base_url(&events);
    let mut resumed = None;
    for _ in 0..6 {
        let s = Sse::open(&url, &token, last).await;
        if s.node == Some(victim) {
            resumed = Some(s);
            break;
        }
    }
    let resumed = resumed.expect("round robin reaches every node");
    let reader = tokio::spawn(follow(resumed, last, url.clone(), token.clone()));
    c.kill(victim);
    first.kill();
    let (_, before) = site.project_b();
    assert!(before.is_empty(), "nothing uploaded yet: {before:?}");

    // The lease lapses; a second runtime claims the run again and finishes it.
    let second = runtime.spawn(&[]);
    second.expect(&format!("claimed {run} attempt 2"), Duration::from_secs(60));
    let (_, said) = second.expect(&format!("finished {run}"), Duration::from_secs(240));
    let (rest, reconnects) = reader.await.expect("reader");
    assert!(reconnects >= 1, "the stream on node {victim} broke and was resumed");
    let mut seqs: Vec<u64> = seen.iter().map(|e| e.0).collect();
    seqs.extend(rest.iter().map(|e| e.0));
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "every event exactly once, in order ({said:?})");
    let v = wait_run(&lb, &token, &run, "succeeded").await;
    assert_eq!(v["attempts"], 2, "{v}");
    let result = &v["result"];
    let (uploads, docs) = site.project_b();
    assert_eq!((uploads, docs.len()), (1, 1), "one upload: {docs:?}");
    assert_eq!(docs[0]["sha256"], sha.as_str(), "the site holds the blob's bytes");
    assert_eq!(docs[0]["name"], "report.pdf");
    assert_eq!(result["documentId"], "0", "{result}");
    let link = format!("{}/projects/b/documents/0", site.url);
    assert_eq!(result["url"], link.as_str(), "{result}");
    assert_eq!((result["sha256"].as_str(), result["upload"]["state"].as_str()), (Some(sha.as_str()), Some("done")));
    let last_partial = rest.iter().rev().find(|e| e.1 == "partial").expect("a partial");
    assert!(last_partial.2["partial"].as_str().is_some_and(|p| p.contains(&link)), "{last_partial:?}");
    let fin = rest.last().expect("final");
    assert_eq!((fin.1.as_str(), &fin.2["final"]["result"]), ("final", result));
    // The evidence: a PNG blob the member reads, linked from the upload's action record, whose
    // record kept what the runtime knew before it clicked.
    let shot = result["screenshotBlobId"].as_str().expect("screenshotBlobId");
    let r = lb.http.get(format!("{base}/api/blobs/{shot}")).bearer_auth(&token).send().await.expect("shot");
    assert_eq!(r.status().as_u16(), 200);
    let png = r.bytes().await.expect("bytes");
    assert!(png.starts_with(b"\x89PNG"));
    if let Ok(dir) = std::env::var("COMPUTERD_DOCS_SHOT") {
        std::fs::write(std::path::Path::new(&dir).join("worked-case-evidence.png"), &png).expect("write the shot");
    }
    let (s, action) = lb.get(&format!("/v1/computers/{computer}/browser/actions/upload-{run}?bot={bot}"), &token).await;
    assert_eq!(
        (s, action["state"].as_str(), action["runId"].as_str()),
        (200, Some("done"), Some(run.as_str())),
        "{action}"
    );
    assert_eq!(action["evidence"]["previousDocumentIds"], json!([]), "{action}");
    assert_eq!(action["evidence"]["fileSha"], sha.as_str());
    assert_eq!(action["evidenceBlobs"], json!([shot]), "{action}");
    eprintln!("run 1 (a runtime and a node killed) done at {:?}", started.elapsed());

    // 3. The site loses the upload's answer: unknown, never repeated, and said so.
    site.control(json!({"mode": "lose"}));
    let run2 = start_turn(&lb, &token, &bot, "report-2", &blob).await;
    let third = runtime.spawn(&[]);
    third.expect(&format!("finished {run2}"), Duration::from_secs(240));
    let v = wait_run(&lb, &token, &run2, "succeeded").await;
    assert_eq!(v["result"]["upload"]["state"], "unknown", "{v}");
    assert_eq!(v["result"]["documentId"], "1", "{v}");
    let (uploads, docs) = site.project_b();
    assert_eq!((uploads, docs.len()), (2, 2), "one more upload, not two");
    let (s, action) =
        lb.get(&format!("/v1/computers/{computer}/browser/actions/upload-{run2}?bot={bot}"), &token).await;
    assert_eq!((s, action["state"].as_str()), (200, Some("unknown")), "left for a person: {action}");
    assert_eq!(action["evidence"]["previousDocumentIds"], json!(["0"]), "{action}");
    let (_, ev) = lb.get(&format!("/api/runs/{run2}/events"), &token).await;
    let told = ev["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "partial")
        .filter_map(|e| e["data"].as_str())
        .any(|p| p.contains("answer to the upload was lost"));
    assert!(told, "the run says what is known: {ev}");
    eprintln!("run 2 (a lost answer) done at {:?}", started.elapsed());

    // 4. A runtime killed while its upload is in flight: needs_decision, no second upload.
    site.control(json!({"mode": "slow", "seconds": 30}));
    let run3 = start_turn(&lb, &token, &bot, "report-3", &blob).await;
    let mut fourth = runtime.spawn(&["--lease-ms", "3000"]);
    let action_path = format!("/v1/computers/{computer}/browser/actions/upload-{run3}?bot={bot}");
    wait_for("the upload to be dispatched", Duration::from_secs(120), || async {
        let (_, a) = lb.get(&action_path, &token).await;
        (a["state"] == "dispatching").then_some(())
    })
    .await;
    fourth.kill();
    let v = wait_run(&lb, &token, &run3, "needs_decision").await;
    assert_eq!(v["undecidedActions"].as_array().map(Vec::len), Some(1), "{v}");
    site.control(json!({"mode": "normal"}));
    let (s, _) = lb.post("/api/runs/claim", &token, json!({"botId": bot, "waitMs": 1000})).await;
    assert_eq!(s, 204, "a run that needs a decision is claimed by nobody");
    let (uploads, _) = site.project_b();
    assert_eq!(uploads, 3, "the one upload in flight, and no other");
    let (s, v) = lb.post(&format!("/api/runs/{run3}/decision"), &token, json!({"decision": "fail"})).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("failed")), "{v}");
    assert_eq!(site.project_b().0, 3);
    let took = started.elapsed();
    eprintln!("the worked case took {took:?}");
    assert!(took < Duration::from_secs(600), "the worked case is kept within 10 minutes: {took:?}");
}
