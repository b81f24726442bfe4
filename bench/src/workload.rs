//! The closed-loop workload: `W` worker tasks, each sending one request at a time for a warm-up
//! plus a measured window, against a list of endpoints taken round robin. Every write carries a
//! fresh name or key (see [`Op`]), so no two writes are the same.
//!
//! A request counts when it *completes* inside the measured window: successes give the
//! throughput and the latency samples, failures (transport errors or an unexpected status) are
//! counted as errors and never as operations.

use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use anyhow::Result;
use anyhow::anyhow;
use reqwest::StatusCode;
use serde_json::json;

use crate::base64;
use crate::https;
use crate::report::Recorder;
pub use crate::report::Stats;
pub use crate::report::Timing;
use crate::report::Window;
use crate::report::call_json;

/// Pause after a failed request, so a down endpoint does not turn a writer into a busy loop.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What one request is.
pub enum Op {
    /// `POST /v1/bots` on computerd with the owner token (answers 201).
    CreateBot {
        /// Bearer token.
        token: String,
    },
    /// `POST /v3/kv/put` of a fresh key on etcd's JSON gateway (answers 200), over HTTPS with
    /// `client` (the cluster's CA and a client certificate) rather than the plain HTTP client
    /// [`run`] is given.
    EtcdPut {
        /// The etcd cluster's client ([`crate::etcd::EtcdCluster::client`]).
        client: https::Client,
    },
    /// `POST /v1/computers` on computerd with a fresh `commandKey`, creating a Computer of
    /// `provider` (answers 202 with the execution receipt once the execution is stored).
    CreateComputer {
        /// Bearer token.
        token: String,
        /// The `cpp_…` provider id.
        provider: String,
    },
    /// `GET` with the owner token (answers 200 with a JSON body, which is parsed). Not a write:
    /// every request is the same.
    Read {
        /// Bearer token.
        token: String,
    },
}

impl Op {
    /// What a task of this workload is called in an error message.
    fn worker(&self) -> &'static str {
        if matches!(self, Op::Read { .. }) { "reader" } else { "writer" }
    }
}

/// Where and what to send.
pub struct Target {
    /// Full request URLs; worker `w` sends its `i`-th request to `urls[(w + i) % len]`.
    pub urls: Vec<String>,
    /// The request.
    pub op: Op,
}

/// Runs `workers` concurrent closed-loop workers against `target` for `timing`; `tag` makes keys
/// and names unique across cells.
pub async fn run(client: &reqwest::Client, target: Arc<Target>, workers: usize, timing: Timing, tag: &str) -> Stats {
    let window = Window::start(timing);
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let client = client.clone();
        let target = target.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move { worker(&client, &target, w, &tag, window).await }));
    }
    let mut merged = Recorder::in_window(window);
    for t in tasks {
        match t.await {
            Ok(r) => merged.merge(r),
            Err(e) => merged.failed(format!("{} task failed: {e}", target.op.worker())),
        }
    }
    merged.stats(timing.measure.as_secs_f64())
}

async fn worker(client: &reqwest::Client, target: &Target, w: usize, tag: &str, window: Window) -> Recorder {
    let mut rec = Recorder::in_window(window);
    let mut seq: usize = 0;
    while !window.done() {
        let t0 = Instant::now();
        let url = &target.urls[(w + seq) % target.urls.len()];
        let res = send_once(client, &target.op, url, &format!("{tag}-{w}-{seq}")).await;
        rec.record(res.map(|()| t0.elapsed()), ERROR_PAUSE).await;
        seq += 1;
    }
    rec
}

/// One request; `Ok` only for the expected success status. The body is always read to the end so
/// the connection goes back to the pool.
async fn send_once(client: &reqwest::Client, op: &Op, url: &str, unique: &str) -> Result<()> {
    let (req, expected) = match op {
        Op::CreateBot { token } => (
            client.post(url).bearer_auth(token).json(&json!({ "name": format!("bench-{unique}") })),
            StatusCode::CREATED,
        ),
        Op::EtcdPut { client } => {
            let key = format!("bench/{unique}");
            let body =
                json!({ "key": base64::encode(key.as_bytes()), "value": base64::encode(b"bench-value-0123456789") });
            let (status, body) = client.post_json(url, &body, None).await?;
            return expect(status, StatusCode::OK, &body, url);
        }
        Op::CreateComputer { token, provider } => {
            let body = json!({
                "commandKey": format!("bench-{unique}"),
                "name": "bench",
                "source": { "_tag": "Provider", "provider": provider },
            });
            (client.post(url).bearer_auth(token).json(&body), StatusCode::ACCEPTED)
        }
        Op::Read { token } => return call_json(client.get(url).bearer_auth(token), StatusCode::OK).await.map(drop),
    };
    let resp = req.send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    expect(status, expected, &body, url)
}

/// `Ok` when `status` is `expected`, else an error with the start of `body`.
fn expect(status: StatusCode, expected: StatusCode, body: &[u8], url: &str) -> Result<()> {
    if status != expected {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(anyhow!("HTTP {status} from {url}: {text}"));
    }
    Ok(())
}
