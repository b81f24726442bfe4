//! The operators' view: `GET /metrics` in Prometheus's text format.
//!
//! Counters and histograms are recorded where things happen, through the `metrics` facade: HTTP
//! requests by route and status here ([`count_requests`]), provider calls by kind in
//! `computerd-actors`. Gauges are set at scrape time from what the node already holds (Raft's
//! own metrics, its registries' sizes, the store's indexes), so a scrape never walks the state.
//!
//! Who may scrape: a caller with the metrics token (`--metrics-token-file`; only its SHA-256 is
//! kept) or an owner's or admin's token, checked on the node that answers: from its own replica
//! first (so a node cut off from its quorum still reports), then, for a token it has not seen
//! yet, after a read barrier.

use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::MatchedPath;
use axum::extract::Request;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::sm::ExecutionState;
use metrics_exporter_prometheus::Matcher;
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_exporter_prometheus::PrometheusHandle;

use super::ApiError;
use super::AppState;
use super::Auth;

/// Histogram buckets for durations in seconds (HTTP calls, provider calls).
const SECONDS: [f64; 14] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0];

/// The most due idle-plan entries a scrape counts (the gauge says "at least" past it).
const DUE_COUNTED: usize = 10_000;

/// The process's recorder, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new();
        let builder = match builder.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "metrics buckets refused; durations are summaries");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if ::metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics shows only the gauges set here");
        }
        describe();
        handle
    })
}

/// The hash of the metrics token in `path` (its first line, trimmed), as tokens are kept.
pub fn token_hash_from(path: &std::path::Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the metrics token {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < 16 {
        return Err(format!("the metrics token in {} must be at least 16 characters", path.display()));
    }
    Ok(computerd_raft::sm::hash_secret(token))
}

/// Counts every API request by its route (the pattern, never the ids in it), method and status,
/// and times it to its answer's head.
pub async fn count_requests(req: Request, next: Next) -> Response {
    let route =
        req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = req.method().as_str().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    ::metrics::histogram!("computerd_http_request_duration_seconds", "route" => route.clone(), "method" => method.clone())
        .record(started.elapsed().as_secs_f64());
    ::metrics::counter!("computerd_http_requests_total", "route" => route, "method" => method, "status" => status)
        .increment(1);
    resp
}

/// `GET /metrics`: Prometheus's text format, for the metrics token or an owner or admin.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics_scrape", tag = "cluster", responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain"), (status = 401, description = "No token, or an unknown one", body = super::schemas::ErrorBody), (status = 403, description = "Neither the metrics token nor an owner or admin", body = super::schemas::ErrorBody)), security(("bearer" = [])))]
pub async fn scrape(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let auth = Auth::from_headers(&headers)
        .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "a bearer token is required"))?;
    // Compared as hashes of the secrets: equal time whatever the secret.
    let metrics_token = state.metrics_token.as_deref().is_some_and(|h| h == auth.hash());
    if !metrics_token {
        // This node's replica first, so a node cut off from its quorum still reports; a token it
        // has not seen yet (minted a moment ago elsewhere) is asked again after a read barrier.
        let local = state.cluster.state().read(|s| s.caller_by_hash(auth.hash()).and_then(|c| c.check_admin_read()));
        if local.is_err() {
            auth.current(&state).await?.check_admin_read()?;
        }
    }
    set_gauges(&state);
    let h = handle();
    h.run_upkeep();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], h.render()).into_response())
}

/// The HELP line of every metric.
fn describe() {
    use ::metrics::describe_counter as c;
    use ::metrics::describe_gauge as g;
    use ::metrics::describe_histogram as h;
    c!("computerd_http_requests_total", "API requests by route pattern, method and status");
    h!("computerd_http_request_duration_seconds", "Time to an API answer's head, by route pattern and method");
    h!(
        "computerd_provider_call_seconds",
        "Provider calls by provider, call and result (ok, not_sent, rejected, lost, timeout)"
    );
    g!("computerd_raft_term", "This node's Raft term");
    g!("computerd_raft_leader_id", "The leader this node knows (0: none)");
    g!("computerd_raft_is_leader", "1 when this node leads");
    g!("computerd_raft_quorum_contact", "1 while this node is in touch with a quorum");
    g!("computerd_raft_voters", "Voters in the membership this node holds");
    g!("computerd_raft_last_log_index", "The last index in this node's log");
    g!("computerd_raft_committed_index", "The last index this node knows committed");
    g!("computerd_raft_last_applied_index", "The last index applied to this node's state");
    g!("computerd_raft_commit_lag", "Entries in this node's log not yet known committed");
    g!("computerd_raft_apply_lag", "Committed entries not yet applied here");
    g!("computerd_raft_snapshot_index", "The index of this node's latest snapshot");
    g!("computerd_raft_entries_since_snapshot", "Entries applied since the latest snapshot");
    g!(
        "computerd_raft_snapshot_age_seconds",
        "Seconds since this node last saw its snapshot index move (since its start at most)"
    );
    g!("computerd_agent_links", "Agent links held by this node");
    g!("computerd_agent_links_connected", "Agent links holding an HTTP/2 connection now");
    g!("computerd_sessions", "Command sessions with actors on this node");
    c!("computerd_routed_calls_total", "Calls this node sent to the node holding a Computer's link");
    c!("computerd_rerouted_calls_total", "Routed calls a stale view sent on once more");
    c!("computerd_routing_timeouts_total", "Routed calls whose owner did not take them in time");
    g!("computerd_executions_open", "Lifecycle executions in flight, by state");
    g!("computerd_executions_finished_kept", "Finished executions kept for their retention");
    g!("computerd_idle_plan_entries", "Computers in the idle-pause plan");
    g!("computerd_idle_plan_due", "Idle-plan entries past their deadline (counted up to 10,000)");
}

/// Where this node last saw the snapshot index move, for the snapshot's age.
static SNAPSHOT_SEEN: Mutex<Option<(u64, Instant)>> = Mutex::new(None);

fn set_gauges(state: &AppState) {
    use ::metrics::gauge;
    use std::sync::atomic::Ordering::Relaxed;
    let v = state.cluster.view();
    let idx = |i: Option<u64>| i.unwrap_or(0) as f64;
    gauge!("computerd_raft_term").set(v.term as f64);
    gauge!("computerd_raft_leader_id").set(v.leader_id.unwrap_or(0) as f64);
    gauge!("computerd_raft_is_leader").set(f64::from(u8::from(v.leader_id == Some(v.node_id))));
    gauge!("computerd_raft_quorum_contact").set(f64::from(u8::from(state.cluster.quorum_contact())));
    gauge!("computerd_raft_voters").set(v.members.iter().filter(|m| m.voter).count() as f64);
    gauge!("computerd_raft_last_log_index").set(idx(v.last_log));
    gauge!("computerd_raft_committed_index").set(idx(v.committed));
    gauge!("computerd_raft_last_applied_index").set(idx(v.last_applied));
    gauge!("computerd_raft_commit_lag").set(v.last_log.unwrap_or(0).saturating_sub(v.committed.unwrap_or(0)) as f64);
    gauge!("computerd_raft_apply_lag").set(v.committed.unwrap_or(0).saturating_sub(v.last_applied.unwrap_or(0)) as f64);
    gauge!("computerd_raft_snapshot_index").set(idx(v.snapshot));
    gauge!("computerd_raft_entries_since_snapshot")
        .set(v.last_applied.unwrap_or(0).saturating_sub(v.snapshot.unwrap_or(0)) as f64);
    let age = {
        let mut seen = SNAPSHOT_SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let snap = v.snapshot.unwrap_or(0);
        match *seen {
            Some((i, at)) if i == snap => at.elapsed().as_secs_f64(),
            _ => {
                *seen = Some((snap, Instant::now()));
                0.0
            }
        }
    };
    gauge!("computerd_raft_snapshot_age_seconds").set(age);

    gauge!("computerd_agent_links").set(state.links.len() as f64);
    gauge!("computerd_agent_links_connected").set(state.links.connected() as f64);
    gauge!("computerd_sessions").set(state.sessions.len() as f64);
    let counts = state.owners.counts();
    ::metrics::counter!("computerd_routed_calls_total").absolute(counts.routed.load(Relaxed));
    ::metrics::counter!("computerd_rerouted_calls_total").absolute(counts.rerouted.load(Relaxed));
    ::metrics::counter!("computerd_routing_timeouts_total").absolute(counts.timed_out.load(Relaxed));

    // Open executions by state (the open set is the work in flight, not the history), the
    // finished ones kept for their retention, and the idle plan.
    let (open, finished, plan, due) = state.cluster.state().read(|s| {
        let mut open = [0usize; 5];
        for e in s.open_executions() {
            let i = match e.state {
                ExecutionState::Pending => 0,
                ExecutionState::Running => 1,
                ExecutionState::Succeeded => 2,
                ExecutionState::Failed => 3,
                ExecutionState::OutcomeUnknown => 4,
            };
            open[i] += 1;
        }
        (open, s.exec_index.finished.len(), s.plan.len(), s.plan_due(s.clock, DUE_COUNTED).len())
    });
    for (i, name) in ["pending", "running", "succeeded", "failed", "outcome_unknown"].iter().enumerate() {
        gauge!("computerd_executions_open", "state" => *name).set(open[i] as f64);
    }
    gauge!("computerd_executions_finished_kept").set(finished as f64);
    gauge!("computerd_idle_plan_entries").set(plan as f64);
    gauge!("computerd_idle_plan_due").set(due as f64);
}
