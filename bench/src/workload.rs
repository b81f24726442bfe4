//! The closed-loop write workload: `W` writer tasks, each sending one request at a time for a
//! warm-up plus a measured window, against a list of endpoints taken round robin. Every request
//! carries a fresh name or key (see [`Op`]), so no two writes are the same.
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
use serde::Serialize;
use serde_json::json;

use crate::base64;
use crate::report::ERROR_SAMPLES;

/// Pause after a failed request, so a down endpoint does not turn a writer into a busy loop.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What one write is.
pub enum Op {
    /// `POST /v1/bots` on computerd with the owner token (answers 201).
    CreateBot {
        /// Bearer token.
        token: String,
    },
    /// `POST /v3/kv/put` of a fresh key on etcd's JSON gateway (answers 200).
    EtcdPut,
    /// `POST /v1/computers` on computerd with a fresh `commandKey`, creating a Computer of
    /// `provider` (answers 202 with the execution receipt once the execution is stored).
    CreateComputer {
        /// Bearer token.
        token: String,
        /// The `cpp_…` provider id.
        provider: String,
    },
}

/// Where and what to write.
pub struct Target {
    /// Full request URLs; writer `w` sends its `i`-th request to `urls[(w + i) % len]`.
    pub urls: Vec<String>,
    /// The write.
    pub op: Op,
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
    /// Successful writes completed in the measured window.
    pub ops: u64,
    /// Length of the measured window, seconds.
    pub secs: f64,
    /// `ops / secs`.
    pub ops_per_sec: f64,
    /// Median latency of the counted writes, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency of the counted writes, milliseconds.
    pub p99_ms: f64,
    /// Largest latency of the counted writes, milliseconds.
    pub max_ms: f64,
    /// Failed writes completed in the measured window.
    pub errors: u64,
    /// Failed writes during the warm-up (not in `errors`).
    pub warmup_errors: u64,
    /// A few distinct error messages.
    pub error_samples: Vec<String>,
}

#[derive(Default)]
struct WriterResult {
    latencies_us: Vec<u64>,
    errors: u64,
    warmup_errors: u64,
    samples: Vec<String>,
}

/// Runs `writers` concurrent writers against `target` for `timing`; `tag` makes keys and names
/// unique across cells.
pub async fn run(client: &reqwest::Client, target: Arc<Target>, writers: usize, timing: Timing, tag: &str) -> Stats {
    let start = Instant::now();
    let warm_end = start + timing.warmup;
    let end = warm_end + timing.measure;
    let mut tasks = Vec::with_capacity(writers);
    for w in 0..writers {
        let client = client.clone();
        let target = target.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move { writer(&client, &target, w, &tag, warm_end, end).await }));
    }
    let mut merged = WriterResult::default();
    for t in tasks {
        match t.await {
            Ok(r) => {
                merged.latencies_us.extend(r.latencies_us);
                merged.errors += r.errors;
                merged.warmup_errors += r.warmup_errors;
                for s in r.samples {
                    if merged.samples.len() < ERROR_SAMPLES && !merged.samples.contains(&s) {
                        merged.samples.push(s);
                    }
                }
            }
            Err(e) => {
                merged.errors += 1;
                merged.samples.push(format!("writer task failed: {e}"));
            }
        }
    }
    let mut lat = merged.latencies_us;
    lat.sort_unstable();
    let secs = timing.measure.as_secs_f64();
    Stats {
        ops: lat.len() as u64,
        secs,
        ops_per_sec: lat.len() as f64 / secs,
        p50_ms: percentile_ms(&lat, 0.50),
        p99_ms: percentile_ms(&lat, 0.99),
        max_ms: lat.last().map_or(f64::NAN, |&us| us as f64 / 1000.0),
        errors: merged.errors,
        warmup_errors: merged.warmup_errors,
        error_samples: merged.samples,
    }
}

async fn writer(
    client: &reqwest::Client,
    target: &Target,
    w: usize,
    tag: &str,
    warm_end: Instant,
    end: Instant,
) -> WriterResult {
    let mut r = WriterResult::default();
    let mut seq: usize = 0;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            return r;
        }
        let url = &target.urls[(w + seq) % target.urls.len()];
        let res = write_once(client, &target.op, url, &format!("{tag}-{w}-{seq}")).await;
        let t1 = Instant::now();
        let counted = t1 >= warm_end && t1 <= end;
        match res {
            Ok(()) if counted => r.latencies_us.push((t1 - t0).as_micros() as u64),
            Ok(()) => {}
            Err(e) => {
                if counted {
                    r.errors += 1;
                } else if t1 < warm_end {
                    r.warmup_errors += 1;
                }
                let msg = format!("{e:#}");
                if r.samples.len() < ERROR_SAMPLES && !r.samples.contains(&msg) {
                    r.samples.push(msg);
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
        seq += 1;
    }
}

/// One write; `Ok` only for the expected success status. The body is always read to the end so
/// the connection goes back to the pool.
async fn write_once(client: &reqwest::Client, op: &Op, url: &str, unique: &str) -> Result<()> {
    let (req, expected) = match op {
        Op::CreateBot { token } => (
            client.post(url).bearer_auth(token).json(&json!({ "name": format!("bench-{unique}") })),
            StatusCode::CREATED,
        ),
        Op::EtcdPut => {
            let key = format!("bench/{unique}");
            let body =
                json!({ "key": base64::encode(key.as_bytes()), "value": base64::encode(b"bench-value-0123456789") });
            (client.post(url).json(&body), StatusCode::OK)
        }
        Op::CreateComputer { token, provider } => {
            let body = json!({
                "commandKey": format!("bench-{unique}"),
                "name": "bench",
                "source": { "_tag": "Provider", "provider": provider },
            });
            (client.post(url).bearer_auth(token).json(&body), StatusCode::ACCEPTED)
        }
    };
    let resp = req.send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    if status != expected {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(anyhow!("HTTP {status} from {url}: {text}"));
    }
    Ok(())
}

/// Nearest-rank percentile of sorted microsecond samples, in milliseconds (NaN when empty).
pub fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted_us.len() as f64).ceil() as usize;
    sorted_us[rank.clamp(1, sorted_us.len()) - 1] as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::percentile_ms;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile_ms(&v, 0.50), 50.0);
        assert_eq!(percentile_ms(&v, 0.99), 99.0);
        assert_eq!(percentile_ms(&[7000], 0.99), 7.0);
        assert!(percentile_ms(&[], 0.5).is_nan());
    }
}
