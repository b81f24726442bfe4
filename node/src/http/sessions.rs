//! Command sessions on a Computer: start, input, resize, stop. The process lives in the agent,
//! which also keeps who started it (a call by anyone else is told the session does not exist).
//! Each session has a `SessionActor` on the node holding the link (`computerd_actors::session`):
//! it runs the session's calls in order and keeps the output offset delivered. A node that never
//! saw the session (the link moved here) starts a fresh actor, which reads from the agent's own
//! cursor.

use std::collections::HashMap;

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_actors::session::SessionHandle;
use computerd_actors::session::SessionMessage;
use computerd_proto::ErrorKind;
use computerd_proto::agent::Resize;
use computerd_proto::agent::SessionInput;
use computerd_proto::agent::SessionRef;
use computerd_proto::agent::SessionReply;
use computerd_proto::agent::StartSession;
use computerd_raft::sm::Caller;
use ractor::RpcReplyPort;
use ractor::rpc::CallResult;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::admit;
use super::calls::agent_for;
use super::calls::parse_user;
use super::calls::run_as;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use crate::ids::new_id;
use crate::owner::CallError;

/// Default and bounds of `yieldTimeMs`.
const YIELD_DEFAULT: u32 = 10_000;
const YIELD_RANGE: std::ops::RangeInclusive<u32> = 250..=30_000;
/// Default and upper bound of `maxOutputBytes`.
const MAX_OUTPUT_DEFAULT: u32 = 65_536;
const MAX_OUTPUT_LIMIT: u32 = 1 << 20;

fn owner_of(c: &Caller) -> String {
    c.bot.as_ref().map(|b| b.id.clone()).unwrap_or_else(|| c.member.id.clone())
}

/// Turns a C-escaped string into bytes: `\n \r \t \\ \0 \a \b \e \xHH`.
pub fn unescape(s: &str) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            let mut b = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            continue;
        }
        match it.next() {
            Some('n') => out.push(b'\n'),
            Some('r') => out.push(b'\r'),
            Some('t') => out.push(b'\t'),
            Some('\\') => out.push(b'\\'),
            Some('0') => out.push(0),
            Some('a') => out.push(7),
            Some('b') => out.push(8),
            Some('e') => out.push(0x1b),
            Some('x') => {
                let hex: String = it.by_ref().take(2).collect();
                let v = u8::from_str_radix(&hex, 16).map_err(|_| ApiError::invalid("\\x needs two hex digits"))?;
                out.push(v);
            }
            Some(other) => return Err(ApiError::invalid(format!("unknown escape \\{other}"))),
            None => return Err(ApiError::invalid("a trailing backslash")),
        }
    }
    Ok(out)
}

fn answer(r: SessionReply) -> Json<Value> {
    Json(json!({
        // The id always, to read the session later (`GET …/sessions/:sid`, kept 10 minutes after
        // it ended); `session` only while it runs, to send it input.
        "sessionId": r.session_id,
        "session": if r.running { Some(r.session_id.clone()) } else { None },
        "running": r.running,
        "exitCode": r.exit_code,
        "signal": r.signal,
        "output": r.output,
        "truncated": r.truncated,
        "offset": r.offset,
    }))
}

fn limits(yield_ms: Option<u32>, max: Option<u32>) -> Result<(u32, u32), ApiError> {
    let y = yield_ms.unwrap_or(YIELD_DEFAULT);
    if !YIELD_RANGE.contains(&y) {
        return Err(ApiError::invalid("yieldTimeMs must be 250..=30000"));
    }
    let m = max.unwrap_or(MAX_OUTPUT_DEFAULT);
    if m == 0 || m > MAX_OUTPUT_LIMIT {
        return Err(ApiError::invalid("maxOutputBytes must be 1..=1048576"));
    }
    Ok((y, m))
}

/// `POST /v1/computers/:id/sessions` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StartIn {
    command: String,
    cwd: Option<String>,
    #[serde(default)]
    env: HashMap<String, String>,
    #[serde(default)]
    tty: bool,
    rows: Option<u16>,
    cols: Option<u16>,
    yield_time_ms: Option<u32>,
    max_output_bytes: Option<u32>,
    /// `"user"` (the default) or `"root"`.
    user: Option<String>,
}

/// A session id has our form, or names no session.
fn check_sid(sid: &str) -> Result<(), ApiError> {
    if !sid.starts_with("cse_") || sid.len() > 100 {
        return Err(ApiError::not_found("no such session"));
    }
    Ok(())
}

/// The session's actor, if the caller may have started it (others get 404; the agent checks the
/// owner again).
async fn session_of(state: &AppState, caller: &Caller, computer: &str, sid: &str) -> Result<SessionHandle, ApiError> {
    check_sid(sid)?;
    let h = state
        .sessions
        .get_or_start(sid, computer, &owner_of(caller))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("cannot start a session actor: {e}")))?;
    if h.computer_id == computer && h.owner == owner_of(caller) {
        Ok(h)
    } else {
        Err(ApiError::not_found("no such session"))
    }
}

/// Whether a Computer's provider offers no terminals (Daytona, SPEC §2), so `tty` fails.
fn without_terminals(state: &AppState, computer_id: &str) -> bool {
    state.cluster.state().read(|s| {
        let Some(computerd_raft::sm::Source::Provider { provider, .. }) =
            s.computers.get(computer_id).map(|c| &c.source)
        else {
            return false;
        };
        s.providers.get(provider).is_some_and(|p| p.kind == computerd_raft::sm::ProviderKind::Daytona)
    })
}

/// Asks a session actor; its mailbox orders the calls of one session.
async fn ask<T: Send + 'static>(
    h: &SessionHandle,
    msg: impl FnOnce(RpcReplyPort<Result<T, tonic::Status>>) -> SessionMessage,
) -> Result<T, ApiError> {
    match h.actor.call(msg, None).await {
        Ok(CallResult::Success(r)) => r.map_err(|s| CallError::from_status(s).into()),
        _ => Err(ApiError::new(ErrorKind::ComputerExecutionFailed, "the session's actor stopped; try again")),
    }
}

/// `POST /v1/computers/:id/sessions`: runs `bash -lc <command>`.
#[utoipa::path(post, path = "/v1/computers/{id}/sessions", operation_id = "sessions_start", tag = "sessions", params(("id" = String, Path)), request_body = StartIn, responses((status = 200, description = "`{\"session\", \"output\", \"offset\", \"exitCode\"|null, ...}`: the output up to `yieldTimeMs`", body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn start(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<StartIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(b) = body?;
    if b.command.is_empty() || b.command.len() > 1 << 20 {
        return Err(ApiError::invalid("command must be 1 byte to 1 MiB"));
    }
    if b.env.keys().any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        || b.env.values().any(|v| v.contains('\0'))
    {
        return Err(ApiError::invalid("env names must be non-empty without '=' or NUL"));
    }
    let (yield_ms, max) = limits(b.yield_time_ms, b.max_output_bytes)?;
    let user = parse_user(b.user.as_deref())?;
    let who = run_as(&state, &caller, &id, user)?;
    if b.tty && without_terminals(&state, &id) {
        return Err(ApiError::new(
            ErrorKind::ComputerUnsupported,
            "this Computer's provider (Daytona) has no terminals: start the session without tty",
        ));
    }
    admit(&state, &caller, &id, true).await?;
    let sid = new_id("cse");
    let h = session_of(&state, &caller, &id, &sid).await?;
    let req = StartSession {
        session_id: sid,
        command: b.command,
        cwd: b.cwd.unwrap_or_default(),
        env: b.env,
        tty: b.tty,
        rows: b.rows.unwrap_or(24) as u32,
        cols: b.cols.unwrap_or(80) as u32,
        yield_ms,
        max_output_bytes: max,
        owner: owner_of(&caller),
        user: who.user,
        root_allowed: who.root_allowed,
    };
    let r = ask(&h, |reply| SessionMessage::Start(req, reply)).await?;
    Ok(answer(r))
}

/// `POST …/sessions/:sid/input` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InputIn {
    #[serde(default)]
    chars: String,
    yield_time_ms: Option<u32>,
    max_output_bytes: Option<u32>,
    /// Read output from this offset (an earlier answer's `offset`) instead of from what was last
    /// delivered: a read whose answer was lost can be repeated without losing output.
    from_offset: Option<u64>,
}

/// `POST /v1/computers/:id/sessions/:sid/input`: sends `chars` (C escapes), answers new output.
#[utoipa::path(post, path = "/v1/computers/{id}/sessions/{sid}/input", operation_id = "sessions_input", tag = "sessions", params(("id" = String, Path), ("sid" = String, Path)), request_body = InputIn, responses((status = 200, description = "The new output", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn input(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, sid)): Path<(String, String)>,
    body: Body<InputIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(b) = body?;
    let data = unescape(&b.chars)?;
    let (yield_ms, max) = limits(b.yield_time_ms, b.max_output_bytes)?;
    admit(&state, &caller, &id, true).await?;
    let h = session_of(&state, &caller, &id, &sid).await?;
    let req = SessionInput {
        session_id: sid,
        data,
        yield_ms,
        max_output_bytes: max,
        from_offset: b.from_offset,
        repeat: b.from_offset.is_some(),
        owner: owner_of(&caller),
        peek: false,
    };
    let r = ask(&h, |reply| SessionMessage::Input(req, reply)).await?;
    Ok(answer(r))
}

/// `POST …/sessions/:sid/resize` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeIn {
    rows: u16,
    cols: u16,
}

/// `POST /v1/computers/:id/sessions/:sid/resize`
#[utoipa::path(post, path = "/v1/computers/{id}/sessions/{sid}/resize", operation_id = "sessions_resize", tag = "sessions", params(("id" = String, Path), ("sid" = String, Path)), request_body = ResizeIn, responses((status = 204, description = "Resized"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn resize(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, sid)): Path<(String, String)>,
    body: Body<ResizeIn>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(b) = body?;
    if b.rows == 0 || b.cols == 0 {
        return Err(ApiError::invalid("rows and cols must be at least 1"));
    }
    admit(&state, &caller, &id, true).await?;
    let h = session_of(&state, &caller, &id, &sid).await?;
    let req = Resize { session_id: sid, rows: b.rows as u32, cols: b.cols as u32, owner: owner_of(&caller) };
    ask(&h, |reply| SessionMessage::Resize(req, reply)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/computers/:id/sessions/:sid`: kills the process group; answers the last output.
#[utoipa::path(delete, path = "/v1/computers/{id}/sessions/{sid}", operation_id = "sessions_stop", tag = "sessions", params(("id" = String, Path), ("sid" = String, Path)), responses((status = 200, description = "The last output", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn stop(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, sid)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    admit(&state, &caller, &id, true).await?;
    let h = session_of(&state, &caller, &id, &sid).await?;
    let req = SessionRef { session_id: sid, max_output_bytes: MAX_OUTPUT_DEFAULT, owner: owner_of(&caller) };
    let r = ask(&h, |reply| SessionMessage::Kill(req, reply)).await?;
    Ok(answer(r))
}

/// `GET …/sessions/:sid?fromOffset=&maxOutputBytes=&yieldTimeMs=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LookQuery {
    from_offset: Option<u64>,
    max_output_bytes: Option<u32>,
    yield_time_ms: Option<u32>,
}

/// `GET /v1/computers/:id/sessions/:sid`: a look at a session, running or ended (its agent keeps
/// an ended one 10 minutes): its state and its output from `fromOffset` (default 0), waiting up
/// to `yieldTimeMs` (default 0) for some past it. Only a look: the offset that input calls
/// answer from does not move.
#[utoipa::path(get, path = "/v1/computers/{id}/sessions/{sid}", operation_id = "sessions_get", tag = "sessions", params(("id" = String, Path), ("sid" = String, Path), ("fromOffset" = Option<u64>, Query), ("maxOutputBytes" = Option<u32>, Query), ("yieldTimeMs" = Option<u32>, Query, description = "0..=30000, default 0")), responses((status = 200, description = "`{\"session\", \"running\", \"exitCode\", \"signal\", \"output\", \"truncated\", \"fromOffset\", \"offset\"}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, sid)): Path<(String, String)>,
    q: Result<axum::extract::Query<LookQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let axum::extract::Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let yield_ms = q.yield_time_ms.unwrap_or(0);
    if yield_ms > *YIELD_RANGE.end() {
        return Err(ApiError::invalid("yieldTimeMs must be 0..=30000"));
    }
    let (_, max) = limits(None, q.max_output_bytes)?;
    check_sid(&sid)?;
    let from = q.from_offset.unwrap_or(0);
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let req = SessionInput {
        session_id: sid.clone(),
        yield_ms,
        max_output_bytes: max,
        from_offset: Some(from),
        owner: owner_of(&caller),
        peek: true,
        ..Default::default()
    };
    let r = agent.input(req).await.map_err(|s| ApiError::from(CallError::from_status(s)))?.into_inner();
    Ok(Json(json!({
        "session": sid,
        "running": r.running,
        "exitCode": r.exit_code,
        "signal": r.signal,
        "output": r.output,
        "truncated": r.truncated,
        "fromOffset": from,
        "offset": r.offset,
    })))
}

/// `GET /v1/computers/:id/sessions`: the caller's sessions on the Computer, the running ones
/// first (newest first), then the ended ones its agent still keeps (10 minutes).
#[utoipa::path(get, path = "/v1/computers/{id}/sessions", operation_id = "sessions_list", tag = "sessions", params(("id" = String, Path)), responses((status = 200, description = "`{\"sessions\": [{\"session\", \"command\", \"tty\", \"startedAt\", \"running\", \"exitCode\", \"signal\", \"offset\"}]}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let req = SessionRef { owner: owner_of(&caller), ..Default::default() };
    let l = agent.list_sessions(req).await.map_err(|s| ApiError::from(CallError::from_status(s)))?.into_inner();
    let sessions: Vec<Value> = l
        .sessions
        .into_iter()
        .map(|s| {
            json!({
                "session": s.session_id,
                "command": s.command,
                "tty": s.tty,
                "startedAt": s.started_ms,
                "running": s.running,
                "exitCode": s.exit_code,
                "signal": s.signal,
                "offset": s.offset,
            })
        })
        .collect();
    Ok(Json(json!({ "sessions": sessions })))
}

/// `GET …/sessions/:sid/output?fromOffset=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutputQuery {
    from_offset: Option<u64>,
}

/// How long one response of an output stream lasts: it ends before a session call's deadline
/// (40 s, here and on a forwarding node), and the client goes on from its last id.
const STREAM_WINDOW: std::time::Duration = std::time::Duration::from_secs(25);
/// An output stream's rights are checked again at least this often (and at every change the
/// store applies, so a revocation ends it at once).
const STREAM_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/computers/:id/sessions/:sid/output`: the session's output as server-sent events,
/// from `fromOffset` or the `Last-Event-ID` (an offset; default 0): `output` events
/// (`{"output", "truncated", "offset"}`, id = the offset after it), then one `end` event
/// (`{"exitCode", "signal", "offset"}`) when the command has ended, and the stream closes. It only
/// reads: the offset that input calls answer from does not move. Rights are checked again before
/// each look (a look waits at most 2 s), before each event, and at every change the store
/// applies: a revoked token or grant ends the stream at once. One response lasts at most 25 s (a session call's bounds hold for it, here and when
/// forwarded to the link's node): the client reconnects with `Last-Event-ID`, as `EventSource`
/// does by itself, through any node; ids are offsets, so nothing is lost or repeated.
#[utoipa::path(get, path = "/v1/computers/{id}/sessions/{sid}/output", operation_id = "sessions_output", tag = "sessions", params(("id" = String, Path), ("sid" = String, Path), ("fromOffset" = Option<u64>, Query), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this offset")), responses((status = 200, description = "`text/event-stream`: `output` events, then `end`", content_type = "text/event-stream"), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn output(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, sid)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    q: Result<axum::extract::Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    use axum::response::sse::Event;
    use axum::response::sse::KeepAlive;
    use axum::response::sse::Sse;
    let caller = auth.current(&state).await?;
    let axum::extract::Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let last = super::util::last_event_id(&headers, "an output offset")?;
    check_sid(&sid)?;
    let owner = owner_of(&caller);
    // The first look answers now, so an unknown session is a 404 rather than an empty stream.
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let from = last.or(q.from_offset).unwrap_or(0);
    let look = move |from: u64, yield_ms: u32| SessionInput {
        session_id: sid.clone(),
        yield_ms,
        max_output_bytes: MAX_OUTPUT_DEFAULT,
        from_offset: Some(from),
        owner: owner.clone(),
        peek: true,
        ..Default::default()
    };
    agent.input(look(from, 0)).await.map_err(|s| ApiError::from(CallError::from_status(s)))?;
    let until = tokio::time::Instant::now() + STREAM_WINDOW;
    let applied = state.cluster.state().subscribe();
    let stream = futures::stream::unfold(
        (state, auth, id, agent, from, false, look, applied),
        move |(state, auth, id, mut agent, cursor, ended, look, mut applied)| async move {
            if ended {
                return None;
            }
            // The caller may still see the Computer: a revoked token, or a grant gone, ends it.
            let allowed = |state: &AppState| {
                state
                    .cluster
                    .state()
                    .read(|s| s.caller_by_hash(auth.hash()).and_then(|c| s.visible_computer(&c, &id).map(|_| ())))
                    .is_ok()
            };
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() || !allowed(&state) {
                    return None;
                }
                let wait = left.min(STREAM_RECHECK);
                let r = {
                    let looked = agent.input(look(cursor, wait.as_millis() as u32));
                    tokio::pin!(looked);
                    loop {
                        tokio::select! {
                            r = &mut looked => break r,
                            changed = applied.changed() => {
                                if changed.is_err() || !allowed(&state) {
                                    return None;
                                }
                            }
                        }
                    }
                };
                let r = r.ok()?.into_inner();
                // And before the event: nothing read after a revocation is sent.
                if !allowed(&state) {
                    return None;
                }
                if !r.output.is_empty() || r.truncated {
                    let data = json!({"output": r.output, "truncated": r.truncated, "offset": r.offset});
                    let ev = Event::default().id(r.offset.to_string()).event("output").data(data.to_string());
                    return Some((
                        Ok::<_, std::convert::Infallible>(ev),
                        (state, auth, id, agent, r.offset, false, look, applied),
                    ));
                }
                if !r.running {
                    let data = json!({"exitCode": r.exit_code, "signal": r.signal, "offset": r.offset});
                    let ev = Event::default().id(r.offset.to_string()).event("end").data(data.to_string());
                    return Some((Ok(ev), (state, auth, id, agent, r.offset, true, look, applied)));
                }
            }
        },
    );
    // `retry`: reconnect at once when a window ends.
    let stream = futures::StreamExt::chain(
        futures::stream::once(async { Ok(Event::default().retry(std::time::Duration::from_millis(100))) }),
        stream,
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(10))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_escapes() {
        assert_eq!(unescape(r"a\nb\x03\x04\\").ok(), Some(b"a\nb\x03\x04\\".to_vec()));
        assert_eq!(unescape("é").ok(), Some("é".as_bytes().to_vec()));
        assert!(unescape(r"\xZZ").is_err());
        assert!(unescape(r"\q").is_err());
        assert!(unescape("\\").is_err());
    }
}
