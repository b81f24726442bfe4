//! A server-sent event stream read by hand (`id`, `event`, `data` blocks), as a client of the
//! run events API would: resumable with `Last-Event-ID`, and naming the node that served it.

use std::time::Duration;

use serde_json::Value;

/// One open stream.
pub struct Sse {
    resp: reqwest::Response,
    buf: String,
    /// The node that serves it (`x-computerd-served-by`).
    pub node: Option<u64>,
}

impl Sse {
    /// Opens `url` with `token`, after event `last` when given.
    pub async fn open(url: &str, token: &str, last: Option<u64>) -> Sse {
        let mut req = reqwest::Client::new().get(url).bearer_auth(token).header("accept", "text/event-stream");
        if let Some(id) = last {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = req.send().await.expect("sse");
        assert_eq!(resp.status().as_u16(), 200);
        let node =
            resp.headers().get("x-computerd-served-by").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        Sse { resp, buf: String::new(), node }
    }

    /// The next event (`seq`, kind, data), or `None` when the stream ended or broke.
    pub async fn next(&mut self) -> Option<(u64, String, Value)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut kind, mut data) = (None, String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().parse::<u64>().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        kind = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if let Some(id) = id {
                    return Some((id, kind, serde_json::from_str(&data).expect("data is JSON")));
                }
                continue; // a keep-alive comment
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.resp.chunk()).await.expect("an event");
            let chunk = chunk.ok()??;
            self.buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }
}

/// Follows a stream (opened after event `last`) through `url` to its `final` event,
/// reconnecting with `Last-Event-ID` when it breaks; answers the events seen, in order, and how
/// many times it reconnected.
pub async fn follow(
    mut sse: Sse,
    mut last: Option<u64>,
    url: String,
    token: String,
) -> (Vec<(u64, String, Value)>, usize) {
    let (mut seen, mut reconnects): (Vec<(u64, String, Value)>, usize) = (Vec::new(), 0);
    loop {
        while let Some(ev) = sse.next().await {
            last = Some(ev.0);
            let end = ev.1 == "final";
            seen.push(ev);
            if end {
                return (seen, reconnects);
            }
        }
        reconnects += 1;
        assert!(reconnects < 20, "the stream keeps breaking after {last:?}");
        sse = Sse::open(&url, &token, last).await;
    }
}
