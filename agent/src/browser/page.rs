//! The tools on a tab: navigate, snapshot, the element tools, screenshots, session status.
//!
//! **Refs.** A snapshot numbers the elements it lists (`e41`, `e42`, …) from a counter of the
//! session that never goes back, so a ref is never reused for another element. A ref is bound to
//! its snapshot (the tab's latest), the document (the main frame's loader id) and the element
//! (its backend node id, role and accessible name). Before anything is sent for a ref, it is
//! checked: still in the tab's latest snapshot, the same document, the node still attached, and
//! the same role and name. Otherwise the tool fails `StaleRef`, and nothing reaches the page.
//! Elements inside iframes, same-origin or out-of-process, are listed and acted on too: see
//! `frames.rs`.
//!
//! **Outcomes.** A click, a submit or a key may start a navigation. After sending it the tool
//! watches for one (briefly); if one starts, it waits for its load. A load that fails (the
//! answer was lost: `net::ERR_EMPTY_RESPONSE`, a reset) or does not end in time leaves the
//! outcome `unknown`: the request may have had its effect. The node turns that into the action
//! record's state.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use computerd_proto::ErrorKind;
use computerd_proto::browser;
use computerd_proto::browser::BrowserOp;
use serde_json::Value;
use serde_json::json;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::Answer;
use super::BrowserError;
use super::COMMAND;
use super::Session;
use super::cdp::Cdp;
use super::cdp::Event;

/// Elements inside iframes (same-origin and out-of-process): see its comment.
#[path = "frames.rs"]
mod frames;

/// How long after an action a navigation it started must have begun to be waited for.
const NAVIGATION_START: Duration = Duration::from_millis(500);
/// A screenshot is at most this many bytes.
const MAX_IMAGE: usize = 16 * 1024 * 1024;
/// A full-page screenshot is at most this many CSS pixels high.
const MAX_PAGE_HEIGHT: f64 = 16_384.0;
/// An element's name is cut to this many characters in a snapshot.
const MAX_NAME: usize = 200;

/// What the agent knows of a session's tabs.
#[derive(Default)]
pub struct Tabs {
    attached: HashMap<String, Tab>,
    /// The session's ref counter.
    next_ref: u32,
}

struct Tab {
    /// The flat CDP session of the tab.
    cdp_session: String,
    /// The main frame's id.
    frame: String,
    /// The latest snapshot's refs.
    refs: HashMap<u32, RefInfo>,
    /// The flat CDP sessions of its out-of-process frames, by target (frame) id.
    oopifs: HashMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
struct RefInfo {
    backend: i64,
    loader: String,
    role: String,
    name: String,
    /// A file input listed although the accessibility tree hides it.
    file_input: bool,
    /// The frame it is in (`None`: the page's main frame); `loader` is then the frame's.
    frame: Option<frames::FrameAt>,
}

/// Whether a tool acts on the page (and, in takeover mode, takes the input lease).
pub fn acts(op: &BrowserOp) -> bool {
    matches!(
        op,
        BrowserOp::Navigate(_)
            | BrowserOp::Click(_)
            | BrowserOp::Hover(_)
            | BrowserOp::Type(_)
            | BrowserOp::Press(_)
            | BrowserOp::Select(_)
            | BrowserOp::Upload(_)
            | BrowserOp::Dialog(_)
            | BrowserOp::FillSecret(_)
    )
}

fn failed(m: impl Into<String>) -> BrowserError {
    BrowserError::new(ErrorKind::ComputerExecutionFailed, m)
}

async fn call(cdp: &Cdp, session: &str, method: &str, params: Value) -> Result<Value, BrowserError> {
    Ok(cdp.call(Some(session), method, params, COMMAND).await?)
}

/// The page tabs of the browser: `[{"tab", "url", "title", "opener"}]` (`opener`: the tab a
/// popup or a link's new tab was opened from, else null).
pub async fn tab_list(cdp: &Cdp) -> Result<Vec<Value>, BrowserError> {
    let t = cdp.call(None, "Target.getTargets", json!({}), COMMAND).await?;
    Ok(t["targetInfos"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|i| i["type"] == "page")
                .map(|i| {
                    let opener = i["openerId"].as_str().filter(|o| !o.is_empty());
                    json!({"tab": i["targetId"], "url": i["url"], "title": i["title"], "opener": opener})
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The session's first tab (made when the browser opened none), loading `url` when given.
pub async fn first_tab(session: &Session, tabs: &mut Tabs, url: Option<&str>) -> Result<Value, BrowserError> {
    let pages = tab_list(&session.cdp).await?;
    let target = match pages.first().and_then(|p| p["tab"].as_str()) {
        Some(t) => t.to_string(),
        None => {
            let made = session.cdp.call(None, "Target.createTarget", json!({"url": "about:blank"}), COMMAND).await?;
            made["targetId"].as_str().ok_or_else(|| failed("the browser made no tab"))?.to_string()
        }
    };
    attach(&session.cdp, tabs, &target).await?;
    match url {
        // A first page that reached no server leaves the session open, the error in its answer.
        Some(u) => match navigate(session, tabs, &target, u, browser::DEFAULT_WAIT_MS).await {
            Err(e) if e.kind == ErrorKind::NavigationFailed => {
                Ok(json!({"tab": target, "url": u, "loaded": false, "error": e.message, "errorKind": e.kind.as_str()}))
            }
            other => other,
        },
        None => Ok(json!({"tab": target, "url": "about:blank", "title": ""})),
    }
}

async fn attach<'a>(cdp: &Cdp, tabs: &'a mut Tabs, target: &str) -> Result<&'a mut Tab, BrowserError> {
    if !tabs.attached.contains_key(target) {
        let a = cdp.call(None, "Target.attachToTarget", json!({"targetId": target, "flatten": true}), COMMAND).await?;
        let s = a["sessionId"].as_str().ok_or_else(|| failed("the browser gave no session for the tab"))?.to_string();
        for m in ["Page.enable", "Network.enable", "DOM.enable", "Accessibility.enable"] {
            call(cdp, &s, m, json!({})).await?;
        }
        call(cdp, &s, "Page.setLifecycleEventsEnabled", json!({"enabled": true})).await?;
        let tree = call(cdp, &s, "Page.getFrameTree", json!({})).await?;
        let frame = tree["frameTree"]["frame"]["id"].as_str().unwrap_or(target).to_string();
        let tab = Tab { cdp_session: s, frame, refs: HashMap::new(), oopifs: HashMap::new() };
        tabs.attached.insert(target.to_string(), tab);
    }
    tabs.attached.get_mut(target).ok_or_else(|| failed("the tab vanished"))
}

/// The tab a tool names, or the only one.
async fn pick_tab(cdp: &Cdp, tab: Option<&str>) -> Result<String, BrowserError> {
    let pages = tab_list(cdp).await?;
    let ids: Vec<&str> = pages.iter().filter_map(|p| p["tab"].as_str()).collect();
    match tab {
        Some(t) if ids.contains(&t) => Ok(t.to_string()),
        Some(t) => {
            Err(BrowserError::new(ErrorKind::NotFound, format!("no tab {t} in this session (its tabs: {ids:?})")))
        }
        None if ids.len() == 1 => Ok(ids[0].to_string()),
        None if ids.is_empty() => Err(BrowserError::new(ErrorKind::NotFound, "this session has no tab open")),
        None => Err(BrowserError::invalid(format!("this session has {} tabs: name one (`tab`): {ids:?}", ids.len()))),
    }
}

/// Serves a tool on its tab.
pub async fn serve(
    session: &Session,
    tabs: &mut Tabs,
    op: BrowserOp,
    owner: Option<(u32, u32)>,
    uploads_from: &std::path::Path,
) -> Result<Answer, BrowserError> {
    let cdp = &session.cdp;
    let tab_name = match &op {
        BrowserOp::Navigate(r) => r.tab.clone(),
        BrowserOp::Snapshot(r) => r.tab.clone(),
        BrowserOp::Click(r) | BrowserOp::Hover(r) => r.tab.clone(),
        BrowserOp::Type(r) => r.tab.clone(),
        BrowserOp::Press(r) => r.tab.clone(),
        BrowserOp::Select(r) => r.tab.clone(),
        BrowserOp::Upload(r) => r.tab.clone(),
        BrowserOp::Screenshot(r) => r.tab.clone(),
        BrowserOp::SessionStatus(r) => r.tab.clone(),
        BrowserOp::Dialog(r) => r.tab.clone(),
        BrowserOp::FillSecret(r) => r.tab.clone(),
        BrowserOp::Open(_) | BrowserOp::Close(_) | BrowserOp::List => return Err(failed("not a tab tool")),
    };
    // A click or hover on the tab it is most likely on (the one named, or the only one attached,
    // with no dialog open) resolves its ref (a read) while the tab list is read; the result is
    // used only when the list says that tab.
    let guess = match (&op, &tab_name) {
        (BrowserOp::Click(r) | BrowserOp::Hover(r), Some(t)) => tabs.attached.get_key_value(t.as_str()).map(|g| (g, r)),
        (BrowserOp::Click(r) | BrowserOp::Hover(r), None) if tabs.attached.len() == 1 => {
            tabs.attached.iter().next().map(|g| (g, r))
        }
        _ => None,
    }
    .filter(|((_, tab), _)| pending_dialog(&session.dialogs, &tab.cdp_session).is_none());
    let (target, early) = match guess {
        Some(((id, tab), r)) => {
            let (target, resolved) = tokio::join!(pick_tab(cdp, tab_name.as_deref()), resolve_ref(cdp, tab, &r.r#ref));
            let target = target?;
            let early = (*id == target).then_some(resolved);
            (target, early)
        }
        None => (pick_tab(cdp, tab_name.as_deref()).await?, None),
    };
    let tab_session = attach(cdp, tabs, &target).await?.cdp_session.clone();
    // A dialog blocks the page's script, and every call that waits on it: only the snapshot
    // (which shows it) and the dialog tool reach a tab that has one open.
    let open_dialog = pending_dialog(&session.dialogs, &tab_session);
    if let Some(d) = &open_dialog
        && !matches!(op, BrowserOp::Snapshot(_) | BrowserOp::Dialog(_) | BrowserOp::SessionStatus(_))
    {
        return Err(BrowserError::new(
            ErrorKind::Conflict,
            format!(
                "a {} dialog is open on this tab ({}): answer it with the dialog tool first",
                d["type"].as_str().unwrap_or("JavaScript"),
                d["message"]
            ),
        ));
    }
    let plain = |json: Value| Answer { json, image: Vec::new() };
    let result = match op {
        BrowserOp::Navigate(r) => {
            navigate(session, tabs, &target, &r.url, r.timeout_ms.unwrap_or(browser::DEFAULT_WAIT_MS)).await.map(plain)
        }
        BrowserOp::Snapshot(r) => match open_dialog {
            Some(d) => dialog_snapshot(cdp, &target, d).await.map(plain),
            None => snapshot(cdp, tabs, &target, &r, &session.secrets).await.map(plain),
        },
        BrowserOp::Dialog(r) => {
            let (tab, _) = tab_of(tabs, &target)?;
            let s = tab.cdp_session.clone();
            let frame = tab.frame.clone();
            let Some(open) = open_dialog else {
                return Err(BrowserError::new(ErrorKind::NotFound, "no dialog is open on this tab"));
            };
            let mut events = cdp.subscribe();
            let mut params = json!({"accept": r.accept});
            if let Some(t) = &r.text {
                params["promptText"] = json!(t);
            }
            if let Err(e) = call(cdp, &s, "Page.handleJavaScriptDialog", params).await {
                // It closed meanwhile (a person answered it, the page went away).
                forget_dialog(&session.dialogs, &s);
                return Err(BrowserError::new(
                    ErrorKind::NotFound,
                    format!("no dialog is open on this tab: {}", e.message),
                ));
            }
            forget_dialog(&session.dialogs, &s);
            let outcome = settle(&mut events, &s, &frame, r.timeout_ms).await;
            Ok(plain(json!({"tab": target, "answered": open, "accepted": r.accept, "outcome": outcome})))
        }
        BrowserOp::Click(r) => {
            let (tab, next) = tab_of(tabs, &target)?;
            let _ = next;
            let (_, _, (x, y)) = checked_point(cdp, tab, &r.r#ref, early).await?;
            let s = tab.cdp_session.clone();
            let frame = tab.frame.clone();
            let mut events = cdp.subscribe();
            let (_, outcome) = acted(cdp, &mut events, &s, &frame, r.timeout_ms, mouse(cdp, &s, x, y, true)).await?;
            Ok(plain(json!({"tab": target, "ref": r.r#ref, "point": {"x": x, "y": y}, "outcome": outcome})))
        }
        BrowserOp::Hover(r) => {
            let (tab, _) = tab_of(tabs, &target)?;
            let (_, _, (x, y)) = checked_point(cdp, tab, &r.r#ref, early).await?;
            mouse(cdp, &tab.cdp_session, x, y, false).await?;
            Ok(plain(json!({"tab": target, "ref": r.r#ref, "point": {"x": x, "y": y}})))
        }
        BrowserOp::Type(r) => {
            let (tab, _) = tab_of(tabs, &target)?;
            let (info, obj) = check_ref(cdp, tab, &r.r#ref).await?;
            let outcome = replace_text(cdp, tab, &info, &obj, &r.r#ref, &r.text, r.submit, r.timeout_ms).await?;
            Ok(plain(json!({"tab": target, "ref": r.r#ref, "typed": r.text.chars().count(), "outcome": outcome})))
        }
        BrowserOp::FillSecret(r) => fill_secret(session, tabs, &target, &r).await.map(plain),
        BrowserOp::Press(r) => {
            let keys = parse_keys(&r.keys).map_err(BrowserError::invalid)?;
            let (tab, _) = tab_of(tabs, &target)?;
            let s = tab.cdp_session.clone();
            let frame = tab.frame.clone();
            let mut events = cdp.subscribe();
            let (_, outcome) = acted(cdp, &mut events, &s, &frame, r.timeout_ms, key(cdp, &s, &keys)).await?;
            Ok(plain(json!({"tab": target, "keys": r.keys, "outcome": outcome})))
        }
        BrowserOp::Select(r) => {
            let (tab, _) = tab_of(tabs, &target)?;
            let (info, obj) = check_ref(cdp, tab, &r.r#ref).await?;
            let s = tab.cdp_session.clone();
            let chosen = function(cdp, frames::session_of(tab, &info), &obj, SELECT, json!([{"value": r.values}]));
            let (got, dialog) = unblocked(cdp.subscribe(), &s, chosen).await?;
            if let Some(d) = dialog {
                let outcome = json!({"state": "done", "dialog": d});
                return Ok(plain(json!({"tab": target, "ref": r.r#ref, "selected": null, "outcome": outcome})))
                    .map(|a| with_dialog(&session.dialogs, &tab_session, a));
            }
            let got = got.unwrap_or_default();
            if let Some(e) = got["error"].as_str() {
                return Err(BrowserError::invalid(format!("{}: {e}", r.r#ref)));
            }
            Ok(plain(json!({"tab": target, "ref": r.r#ref, "selected": got["selected"], "outcome": {"state": "done"}})))
        }
        BrowserOp::Upload(r) => upload(session, tabs, &target, &r, owner, uploads_from).await.map(plain),
        BrowserOp::Screenshot(r) => screenshot(cdp, tabs, &target, &r, &session.secrets).await,
        BrowserOp::SessionStatus(r) => session_status(session, &r).await.map(plain),
        BrowserOp::Open(_) | BrowserOp::Close(_) | BrowserOp::List => Err(failed("not a tab tool")),
    };
    result.map(|a| with_dialog(&session.dialogs, &tab_session, a))
}

/// The JavaScript dialogs open now, by the tab's CDP session: `{"type", "message",
/// "defaultPrompt"?}`.
pub type Dialogs = std::sync::Arc<std::sync::Mutex<HashMap<String, Value>>>;

/// A dialog as the tools show it, from `Page.javascriptDialogOpening`.
fn dialog_of(p: &Value) -> Value {
    let mut d = json!({"type": p["type"], "message": p["message"]});
    if p["type"] == "prompt" {
        d["defaultPrompt"] = json!(p["defaultPrompt"].as_str().unwrap_or_default());
    }
    d
}

fn dialogs_of(dialogs: &Dialogs) -> std::sync::MutexGuard<'_, HashMap<String, Value>> {
    dialogs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pending_dialog(dialogs: &Dialogs, s: &str) -> Option<Value> {
    dialogs_of(dialogs).get(s).cloned()
}

fn forget_dialog(dialogs: &Dialogs, s: &str) {
    dialogs_of(dialogs).remove(s);
}

/// Keeps `dialogs` from the browser's events, until the browser stops.
pub async fn watch_dialogs(mut events: broadcast::Receiver<Event>, dialogs: Dialogs) {
    loop {
        match events.recv().await {
            Ok(ev) => match ev.method.as_str() {
                "Page.javascriptDialogOpening" => {
                    dialogs_of(&dialogs).insert(ev.session.clone(), dialog_of(&ev.params));
                }
                "Page.javascriptDialogClosed" => forget_dialog(&dialogs, &ev.session),
                "Target.detachedFromTarget" => {
                    forget_dialog(&dialogs, ev.params["sessionId"].as_str().unwrap_or_default())
                }
                _ => {}
            },
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// A tool's answer with the tab's pending dialog (`"dialog"`): the one its outcome saw open
/// (noted at once: the dialog watcher may not have had its event yet), else the one noted.
fn with_dialog(dialogs: &Dialogs, s: &str, mut a: Answer) -> Answer {
    let seen = a.json.get("dialog").or_else(|| a.json.get("outcome").and_then(|o| o.get("dialog"))).cloned();
    match seen.filter(|d| d.is_object()) {
        Some(d) => {
            dialogs_of(dialogs).insert(s.to_string(), d.clone());
            a.json["dialog"] = d;
        }
        None => {
            if let Some(d) = pending_dialog(dialogs, s) {
                a.json["dialog"] = d;
            }
        }
    }
    a
}

/// Runs `input` (a call the page's script handles) unless the page opens a dialog first (then
/// the script waits on the dialog, and so would the call): answers the call's value, or the
/// dialog. `events` is subscribed before `input` is sent.
async fn unblocked<T>(
    mut events: broadcast::Receiver<Event>,
    s: &str,
    input: impl std::future::Future<Output = Result<T, BrowserError>>,
) -> Result<(Option<T>, Option<Value>), BrowserError> {
    let opened = async {
        loop {
            match events.recv().await {
                Ok(ev) if ev.session == s && ev.method == "Page.javascriptDialogOpening" => {
                    return dialog_of(&ev.params);
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    tokio::select! {
        got = input => got.map(|v| (Some(v), None)),
        d = opened => Ok((None, Some(d))),
    }
}

/// Sends an input and settles its outcome; a dialog it opens ends the wait at once, in the
/// outcome (`"dialog"`).
async fn acted<T>(
    cdp: &Cdp,
    events: &mut broadcast::Receiver<Event>,
    s: &str,
    frame: &str,
    timeout_ms: Option<u64>,
    input: impl std::future::Future<Output = Result<T, BrowserError>>,
) -> Result<(Option<T>, Value), BrowserError> {
    let (got, dialog) = unblocked(cdp.subscribe(), s, input).await?;
    if let Some(d) = dialog {
        return Ok((None, json!({"state": "done", "navigated": false, "dialog": d})));
    }
    Ok((got, settle(events, s, frame, timeout_ms).await))
}

/// A snapshot of a tab whose page waits on a dialog: the dialog only (the page's tree cannot be
/// read until it is answered; the tab's refs stay as they were).
async fn dialog_snapshot(cdp: &Cdp, target: &str, d: Value) -> Result<Value, BrowserError> {
    let info = cdp.call(None, "Target.getTargetInfo", json!({"targetId": target}), COMMAND).await?;
    let mut text = format!("- dialog ({}) {}", d["type"].as_str().unwrap_or("alert"), d["message"]);
    if let Some(p) = d.get("defaultPrompt") {
        text.push_str(&format!(" [default={p}]"));
    }
    text.push('\n');
    Ok(json!({
        "tab": target,
        "url": info["targetInfo"]["url"],
        "title": info["targetInfo"]["title"],
        "refs": 0,
        "truncated": false,
        "text": text,
        "dialog": d,
    }))
}

/// Adds to a recorded action's answer the requests sent in its window (its wire guard's log
/// from just before the input was sent until its outcome settled): `"requests": [{"method",
/// "url", "status"} | {"method", "url", "result": "no answer" | "not sent" | "cut" | "tunnel" |
/// "pending"}]`, at most [`super::wire::WINDOW_MAX`] (those whose answer was lost first), and
/// `"requestsTruncated"`. A request whose answer was lost (`no answer`, `cut`), or that may change
/// something and is still `pending` at the end of the action's wait, makes the outcome
/// `unknown`, even when the page then showed the proxy's `502` as a load: the server may have
/// acted on it. The log does not tell tabs apart: a request of another tab sent in the window is
/// listed too.
pub fn note_requests(answer: &mut Value, sent: &[super::wire::Entry], dropped: bool) {
    use super::wire::Fate;
    use super::wire::WINDOW_MAX;
    // Lost, or still unanswered at the end of the action's wait and able to change something.
    let unsure = |e: &super::wire::Entry| e.fate.lost() || (e.fate == Fate::Pending && e.changes());
    let lost: Vec<&super::wire::Entry> = sent.iter().filter(|e| unsure(e)).collect();
    let room = WINDOW_MAX.saturating_sub(lost.len().min(WINDOW_MAX));
    let mut shown: Vec<&super::wire::Entry> = lost.iter().take(WINDOW_MAX).copied().collect();
    shown.extend(sent.iter().filter(|e| !unsure(e)).take(room));
    shown.sort_by_key(|e| e.seq);
    answer["requests"] = Value::Array(shown.iter().map(|e| e.to_json()).collect());
    answer["requestsTruncated"] = json!(dropped || shown.len() < sent.len());
    if let Some(first) = lost.first()
        && let Some(outcome) = answer.get_mut("outcome").filter(|o| o.is_object())
        && outcome["state"] != "unknown"
    {
        outcome["state"] = json!("unknown");
        let what = match first.fate {
            Fate::Cut => "was cut midway",
            Fate::Pending => "had not come by the end of the action's wait",
            _ => "was lost",
        };
        outcome["error"] = json!(format!(
            "the server may have taken {} {}: its answer {what} (it was not sent again)",
            first.method, first.url
        ));
    }
}

fn tab_of<'a>(tabs: &'a mut Tabs, target: &str) -> Result<(&'a mut Tab, &'a mut u32), BrowserError> {
    let Tabs { attached, next_ref } = tabs;
    let tab = attached.get_mut(target).ok_or_else(|| failed("the tab is not attached"))?;
    Ok((tab, next_ref))
}

/// The main frame's current loader (document) id.
async fn loader_of(cdp: &Cdp, session: &str) -> Result<String, BrowserError> {
    let tree = call(cdp, session, "Page.getFrameTree", json!({})).await?;
    Ok(tree["frameTree"]["frame"]["loaderId"].as_str().unwrap_or_default().to_string())
}

/// Runs `f` (a function declaration) on the object, with `args`; answers its value.
async fn function(cdp: &Cdp, session: &str, object: &str, f: &str, args: Value) -> Result<Value, BrowserError> {
    let r = call(
        cdp,
        session,
        "Runtime.callFunctionOn",
        json!({"objectId": object, "functionDeclaration": f, "arguments": args, "returnByValue": true, "awaitPromise": false}),
    )
    .await?;
    if let Some(e) = r.get("exceptionDetails") {
        return Err(failed(format!("the page's script failed: {}", e["text"].as_str().unwrap_or("an exception"))));
    }
    Ok(r["result"]["value"].clone())
}

const CONNECTED: &str = "function() { return this.isConnected; }";
const EDITABLE: &str = "function() { const t = this.tagName; const ok = this.isContentEditable || ((t === 'INPUT' && !['file','checkbox','radio','submit','button','image','reset','hidden','range','color'].includes(this.type)) || t === 'TEXTAREA') && !this.readOnly && !this.disabled; if (!ok) return false; this.focus(); if (typeof this.select === 'function') { this.select(); } else { const r = document.createRange(); r.selectNodeContents(this); const s = getSelection(); s.removeAllRanges(); s.addRange(r); } return true; }";
const SELECT: &str = "function(values) { if (this.tagName !== 'SELECT') return {error: 'not a select'}; if (this.disabled) return {error: 'disabled'}; const opts = Array.from(this.options); const missing = values.filter(v => !opts.some(o => o.value === v || o.label === v)); if (missing.length) return {error: 'no option ' + JSON.stringify(missing)}; if (!this.multiple && values.length > 1) return {error: 'a single select takes one value'}; for (const o of opts) o.selected = values.some(v => o.value === v || o.label === v); this.dispatchEvent(new Event('input', {bubbles: true})); this.dispatchEvent(new Event('change', {bubbles: true})); return {selected: opts.filter(o => o.selected).map(o => o.value)}; }";
const FILE_INPUT: &str = "function() { return (this.tagName === 'INPUT' && this.type === 'file') ? {multiple: this.multiple, disabled: this.disabled} : null; }";
/// Notes the input's files at its next `change`, before the page's own handlers run (a capture
/// listener at the target runs first): a page may take the files and clear the input at once.
const WATCH_FILES: &str = "function() { this.__computerdFiles = undefined; this.addEventListener('change', () => { this.__computerdFiles = Array.from(this.files || []).map(f => ({name: f.name, size: f.size})); }, {capture: true, once: true}); }";
/// The files [`WATCH_FILES`] noted, else those the input holds now.
const FILES: &str = "function() { const seen = this.__computerdFiles; delete this.__computerdFiles; return seen !== undefined ? seen : Array.from(this.files || []).map(f => ({name: f.name, size: f.size})); }";
/// Hit-tests the point `(x, y)` of the viewport in the element's document, as a pointer would:
/// the topmost element there (into open shadow roots), and whether it is the element, inside it
/// (a text field's inner editor is in its user-agent shadow root, which answers the field) or
/// inside one of its labels. Answers `{ok: true}`, `{none: true}` (nothing there: off the
/// screen) or `{cover: "<role> \"<name>\""}` (what a person would see on top).
const HIT: &str = "function(x, y) { let h = this.ownerDocument.elementFromPoint(x, y); while (h && h.shadowRoot) { const inner = h.shadowRoot.elementFromPoint(x, y); if (!inner || inner === h) break; h = inner; } if (!h) return {none: true}; const labels = this.labels ? Array.from(this.labels) : []; for (let n = h; n; n = n.parentNode || n.host || null) { if (n === this || labels.includes(n)) return {ok: true}; } const role = h.getAttribute('role') || h.tagName.toLowerCase(); const name = (h.getAttribute('aria-label') || h.innerText || h.getAttribute('alt') || h.id || '').trim().replace(/\\s+/g, ' ').slice(0, 60); return {cover: name ? role + ' \"' + name + '\"' : role}; }";
const LABEL: &str = "function() { const l = this.labels && this.labels[0]; return ((l && l.innerText) || this.getAttribute('aria-label') || this.name || '').trim(); }";

/// Checks a ref against the live page; answers what it names and the element's object id.
async fn check_ref(cdp: &Cdp, tab: &Tab, r: &str) -> Result<(RefInfo, String), BrowserError> {
    let (info, obj) = resolve_ref(cdp, tab, r).await?;
    verify_ref(cdp, tab, &info, &obj, r).await?;
    Ok((info, obj))
}

/// [`check_ref`]'s first half: the ref's record, and its element as an object of the page (a
/// node gone since the snapshot, or of a document that has navigated, is stale).
async fn resolve_ref(cdp: &Cdp, tab: &Tab, r: &str) -> Result<(RefInfo, String), BrowserError> {
    let n: u32 = r
        .strip_prefix('e')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| BrowserError::invalid(format!("{r:?} is not a ref")))?;
    let info = tab
        .refs
        .get(&n)
        .cloned()
        .ok_or_else(|| BrowserError::stale(format!("{r} is not in this tab's latest snapshot")))?;
    let s = frames::session_of(tab, &info);
    let resolved = cdp.call(Some(s), "DOM.resolveNode", json!({"backendNodeId": info.backend}), COMMAND).await;
    match resolved.as_ref().ok().and_then(|v| v["object"]["objectId"].as_str()) {
        Some(o) => Ok((info, o.to_string())),
        None if !same_document(cdp, tab, &info).await? => Err(navigated(&info, r)),
        None => Err(BrowserError::stale(format!("the element of {r} is gone"))),
    }
}

/// Whether the ref's document is still its page's (or its frame's).
async fn same_document(cdp: &Cdp, tab: &Tab, info: &RefInfo) -> Result<bool, BrowserError> {
    match &info.frame {
        None => Ok(loader_of(cdp, frames::session_of(tab, info)).await? == info.loader),
        Some(f) => Ok(frames::loader_of(cdp, f).await.as_ref() == Some(&info.loader)),
    }
}

fn navigated(info: &RefInfo, r: &str) -> BrowserError {
    BrowserError::stale(match &info.frame {
        None => format!("the page has navigated since the snapshot that gave {r}"),
        Some(_) => format!("the frame of {r} has navigated or is gone"),
    })
}

/// [`check_ref`]'s second half, reads only, at once: the same document, the node still
/// attached, and the same role and name. Nothing reaches the page before all of them passed.
async fn verify_ref(cdp: &Cdp, tab: &Tab, info: &RefInfo, obj: &str, r: &str) -> Result<(), BrowserError> {
    let s = frames::session_of(tab, info);
    let document = same_document(cdp, tab, info);
    let connected = function(cdp, s, obj, CONNECTED, json!([]));
    let ax = async {
        if info.file_input {
            return Ok(None);
        }
        let params = json!({"backendNodeId": info.backend, "fetchRelatives": false});
        call(cdp, s, "Accessibility.getPartialAXTree", params).await.map(Some)
    };
    let (document, connected, ax) = tokio::join!(document, connected, ax);
    if !document? {
        return Err(navigated(info, r));
    }
    if connected? != Value::Bool(true) {
        return Err(BrowserError::stale(format!("the element of {r} was removed or replaced")));
    }
    if let Some(now) = ax? {
        let node = now["nodes"].as_array().and_then(|a| a.iter().find(|n| n["backendDOMNodeId"] == info.backend));
        let (role, name) = node.map(|n| (text_of(&n["role"]), cut(&text_of(&n["name"])))).unwrap_or_default();
        if role != info.role || name != info.name {
            return Err(BrowserError::stale(format!(
                "the element of {r} changed (it was {} {:?}, it is {role} {name:?})",
                info.role, info.name
            )));
        }
    }
    Ok(())
}

/// A ref checked ([`check_ref`]) and the point to act on ([`point_of`]), for `click` and
/// `hover`: the checks and the page's one-call point ([`POINT`]) go out together once the node
/// is resolved (the point only scrolls and reads), and the point is used only when every check
/// passed. `resolved`: the ref already resolved on this tab ([`resolve_ref`]), if it was.
async fn checked_point(
    cdp: &Cdp,
    tab: &Tab,
    r: &str,
    resolved: Option<Result<(RefInfo, String), BrowserError>>,
) -> Result<(RefInfo, String, (f64, f64)), BrowserError> {
    let (info, obj) = match resolved {
        Some(done) => done?,
        None => resolve_ref(cdp, tab, r).await?,
    };
    let (checked, quick) = tokio::join!(verify_ref(cdp, tab, &info, &obj, r), quick_point(cdp, tab, &info, &obj));
    checked?;
    let point = match quick? {
        Some(p) => p,
        None => long_point(cdp, tab, &info, &obj).await?,
    };
    Ok((info, obj, point))
}

/// [`point_of`]'s one round trip: scrolls the element into view if it is not, takes the centre
/// of its first box (viewport CSS pixels, as `DOM.getContentQuads` would) and runs [`HIT`] there:
/// `{x, y, ok}` or, with no box, `{nobox}`.
static POINT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "function() {{ if (typeof this.scrollIntoViewIfNeeded === 'function') this.scrollIntoViewIfNeeded(false); \
         const r = this.getClientRects()[0]; if (!r || (r.width === 0 && r.height === 0)) return {{nobox: true}}; \
         const x = Math.round(r.left + r.width / 2), y = Math.round(r.top + r.height / 2); \
         return Object.assign(({HIT}).call(this, x, y), {{x, y}}); }}"
    )
});

/// Scrolls the element to the middle of its scrolling boxes and the viewport (a second try, when
/// the first point was under a sticky header, say, or outside the viewport).
const CENTRE: &str = "function() { this.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'}); }";

/// The point to click: the element's centre once scrolled into view, checked to be the
/// element (or inside it, or its label) and not something covering it. When the first point is
/// covered (a sticky header over an element that counted as visible) or not on the screen, the
/// element is scrolled to the middle and checked once more; a cover still there is refused,
/// named.
///
/// In the page's own document the usual case is one round trip ([`POINT`]: scroll if needed,
/// the centre of its first box, the hit test); anything else (no box, a cover, off the screen)
/// goes the long way below, which names the reason.
async fn point_of(cdp: &Cdp, tab: &Tab, info: &RefInfo, obj: &str) -> Result<(f64, f64), BrowserError> {
    match quick_point(cdp, tab, info, obj).await? {
        Some(p) => Ok(p),
        None => long_point(cdp, tab, info, obj).await,
    }
}

/// [`POINT`] in the page's own document: the point when it is the element's, else `None`.
async fn quick_point(cdp: &Cdp, tab: &Tab, info: &RefInfo, obj: &str) -> Result<Option<(f64, f64)>, BrowserError> {
    if info.frame.is_some() {
        return Ok(None);
    }
    let h = function(cdp, &tab.cdp_session, obj, &POINT, json!([])).await?;
    Ok(match (h["ok"] == true, h["x"].as_f64(), h["y"].as_f64()) {
        (true, Some(x), Some(y)) => Some((x, y)),
        _ => None,
    })
}

/// [`point_of`]'s long way: scroll, quads, hit test; then the middle and once more.
async fn long_point(cdp: &Cdp, tab: &Tab, info: &RefInfo, obj: &str) -> Result<(f64, f64), BrowserError> {
    // In a frame, scrolling the element into view scrolls the frames holding it too.
    let s = frames::session_of(tab, info);
    let _ = cdp.call(Some(s), "DOM.scrollIntoViewIfNeeded", json!({"backendNodeId": info.backend}), COMMAND).await;
    match hit(cdp, s, info, obj).await? {
        Ok(point) => Ok(point),
        Err(_) => {
            function(cdp, s, obj, CENTRE, json!([])).await?;
            hit(cdp, s, info, obj).await?.map_err(BrowserError::invalid)
        }
    }
}

/// The element's centre (a page point) and whether that point is the element: `Ok(Err(why))`
/// when it is not (covered, or off the screen). `s` serves the element's document. In a frame,
/// the point is tested in the frame's document, then on each `<iframe>` holding it.
async fn hit(cdp: &Cdp, s: &str, info: &RefInfo, obj: &str) -> Result<Result<(f64, f64), String>, BrowserError> {
    let quads = cdp
        .call(Some(s), "DOM.getContentQuads", json!({"backendNodeId": info.backend}), COMMAND)
        .await
        .map_err(|_| BrowserError::invalid("the element is not visible (it has no box)"))?;
    let q = quads["quads"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(|q| q.as_array())
        .filter(|q| q.len() == 8)
        .ok_or_else(|| BrowserError::invalid("the element is not visible (it has no box)"))?;
    let v: Vec<f64> = q.iter().map(|n| n.as_f64().unwrap_or(0.0)).collect();
    let geometry = match &info.frame {
        Some(f) => Some(frames::geometry(cdp, f).await?),
        None => None,
    };
    let (dx, dy) = geometry.as_ref().map_or((0.0, 0.0), |g| g.offset);
    let x = ((v[0] + v[2] + v[4] + v[6]) / 4.0 + dx).round();
    let y = ((v[1] + v[3] + v[5] + v[7]) / 4.0 + dy).round();
    let (ox, oy) = geometry.as_ref().and_then(|g| g.corners.first().copied()).unwrap_or((0.0, 0.0));
    let mut h = function(cdp, s, obj, HIT, json!([{"value": x - ox}, {"value": y - oy}])).await?;
    if let (Some(f), Some(g)) = (&info.frame, &geometry)
        && h["ok"] == true
    {
        h = frames::hit_owners(cdp, f, g, x, y).await?;
    }
    if h["ok"] == true {
        return Ok(Ok((x, y)));
    }
    if let Some(cover) = h["cover"].as_str() {
        return Ok(Err(format!("{cover} covers the element at ({x}, {y})")));
    }
    Ok(Err(format!("the element's centre ({x}, {y}) is not on the screen")))
}

/// The pointer to (x, y), and a click there: the move and the press go out together (the pipe
/// keeps their order); the release only once the press was handled, so a press whose handler
/// opens a dialog is never followed by a release the page did not wait for.
async fn mouse(cdp: &Cdp, s: &str, x: f64, y: f64, click: bool) -> Result<(), BrowserError> {
    let event = |t: &str, buttons: u8| json!({"type": t, "x": x, "y": y, "button": "left", "buttons": buttons, "clickCount": 1});
    let moved = call(cdp, s, "Input.dispatchMouseEvent", json!({"type": "mouseMoved", "x": x, "y": y}));
    if !click {
        return moved.await.map(drop);
    }
    let pressed = call(cdp, s, "Input.dispatchMouseEvent", event("mousePressed", 1));
    let (moved, pressed) = tokio::join!(biased; moved, pressed);
    moved?;
    pressed?;
    call(cdp, s, "Input.dispatchMouseEvent", event("mouseReleased", 0)).await.map(drop)
}

/// Types `text` into the checked field `info` (its object `obj`; `r` its ref), replacing what it
/// holds, as `type` does: the field is focused in its own frame and its text selected
/// ([`EDITABLE`]; refused, nothing typed, when it is not an editable text field), the text is
/// inserted (it goes to the focused frame), then Enter is pressed when `submit` and the outcome
/// settled. Answers the outcome.
#[allow(clippy::too_many_arguments)]
async fn replace_text(
    cdp: &Cdp,
    tab: &Tab,
    info: &RefInfo,
    obj: &str,
    r: &str,
    text: &str,
    submit: bool,
    timeout_ms: Option<u64>,
) -> Result<Value, BrowserError> {
    let s = tab.cdp_session.as_str();
    let editable = function(cdp, frames::session_of(tab, info), obj, EDITABLE, json!([])).await?;
    if editable != Value::Bool(true) {
        return Err(BrowserError::invalid(format!("{r} is not a text field")));
    }
    let mut events = cdp.subscribe();
    call(cdp, s, "Input.insertText", json!({"text": text})).await?;
    Ok(if submit {
        let enter = parse_keys("Enter").map_err(BrowserError::invalid)?;
        acted(cdp, &mut events, s, &tab.frame, timeout_ms, key(cdp, s, &enter)).await?.1
    } else {
        json!({"state": "done", "navigated": false})
    })
}

/// `scheme://host[:port]` of an http(s) URL or serialized origin: lower-case, without the
/// default port (80 for http, 443 for https); `None` for anything else (an opaque origin
/// `null`, `about:blank`, `data:`, a `chrome-error:` page).
pub fn origin(u: &str) -> Option<String> {
    let o = browser::origin_of(u.trim())?;
    let (scheme, authority) = o.split_once("://")?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, p),
        _ => (authority, ""),
    };
    if host.is_empty() {
        return None;
    }
    let port: Option<u16> = if port.is_empty() { None } else { Some(port.parse().ok()?) };
    let default = if scheme == "https" { 443 } else { 80 };
    Some(match port {
        Some(p) if p != default => format!("{scheme}://{host}:{p}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// A frame's document as the browser has it (`Page.getFrameTree` on the session serving it),
/// never as the page's script tells it.
struct FrameDoc {
    /// Its origin ([`origin`] of its security origin, else of its URL).
    origin: Option<String>,
    /// What to call it in a message: its origin, else what it is instead.
    shown: String,
    /// Its loader (document) id.
    loader: String,
}

/// The frame `id` in the tree `session` serves; `None` when it is not there (gone).
async fn frame_doc(cdp: &Cdp, session: &str, id: &str) -> Result<Option<FrameDoc>, BrowserError> {
    let tree = call(cdp, session, "Page.getFrameTree", json!({})).await?;
    let mut stack = vec![&tree["frameTree"]];
    while let Some(t) = stack.pop() {
        let f = &t["frame"];
        if f["id"] != id {
            stack.extend(t["childFrames"].as_array().into_iter().flatten());
            continue;
        }
        let security = f["securityOrigin"].as_str().filter(|s| !s.is_empty() && *s != "://");
        let url = f["url"].as_str().unwrap_or_default();
        let origin = origin(security.unwrap_or(url));
        let shown = origin.clone().unwrap_or_else(|| {
            let what = security.map(String::from).unwrap_or_else(|| {
                url.split(['?', '#']).next().unwrap_or_default().chars().take(80).collect::<String>()
            });
            format!("{what:?} (no http or https origin)")
        });
        let loader = f["loaderId"].as_str().unwrap_or_default().to_string();
        return Ok(Some(FrameDoc { origin, shown, loader }));
    }
    Ok(None)
}

/// Checks, in the page, that an element may take a secret of `kind` (`password`, `totp`,
/// `text`): answers `{ok: true}` or `{ok: false, what, why?}` (`what`: what it is, e.g. `a search
/// box (input type=search name=q)`; `why`: `disabled` or `read-only` for a field of the right
/// kind). A guard against a wrong ref, not against the page (the origin check is that).
const SECRET_FIELD: &str = r#"function(kind) {
  const el = this, tag = el.tagName, input = tag === 'INPUT';
  const at = n => String(el.getAttribute(n) || '');
  const type = input ? String(el.type || 'text').toLowerCase() : '';
  const labels = [];
  if (el.labels) for (const l of el.labels) labels.push(l.innerText || l.textContent || '');
  for (const i of at('aria-labelledby').split(/\s+/).filter(Boolean)) {
    const n = el.ownerDocument.getElementById(i);
    if (n) labels.push(n.innerText || n.textContent || '');
  }
  const hint = [at('name'), at('id'), at('aria-label'), at('placeholder')].concat(labels).join(' ');
  const auto = at('autocomplete').toLowerCase().split(/\s+/);
  const cut = s => s.length > 40 ? s.slice(0, 40) + '…' : s;
  const parts = [tag.toLowerCase()];
  if (input) parts.push('type=' + type);
  for (const n of ['name', 'id', 'autocomplete']) if (at(n)) parts.push(n + '=' + cut(at(n)));
  const named = {password: 'a password field', search: 'a search box', email: 'an email field',
    tel: 'a telephone field', number: 'a number field', text: 'a text field', url: 'a URL field',
    hidden: 'a hidden input', file: 'a file input', checkbox: 'a checkbox', radio: 'a radio button',
    submit: 'a submit button', button: 'a button', reset: 'a reset button', image: 'an image button'};
  const kindOf = input ? (named[type] || 'an input of type ' + type)
    : tag === 'TEXTAREA' ? 'a text area' : tag === 'SELECT' ? 'a drop-down' : tag === 'BUTTON' ? 'a button'
    : el.isContentEditable ? 'an editable region' : 'a <' + tag.toLowerCase() + '> element';
  const what = kindOf + ' (' + parts.join(' ') + ')';
  let ok = false;
  if (kind === 'password') {
    ok = input && (type === 'password' || (['text', 'email', 'tel'].includes(type)
      && (auto.includes('username') || auto.includes('email') || /user|login|e-?mail|account|identifier/i.test(hint))));
  } else if (kind === 'totp') {
    ok = input && ['text', 'tel', 'number'].includes(type)
      && (auto.includes('one-time-code') || /otp|totp|one[- ]?time|2fa|mfa|verification|security code|auth.*code/i.test(hint));
  } else {
    ok = tag === 'TEXTAREA' || (input
      && !['hidden', 'file', 'checkbox', 'radio', 'button', 'submit', 'image', 'reset', 'range', 'color'].includes(type));
  }
  if (!ok) return {ok: false, what};
  if (el.disabled) return {ok: false, what, why: 'disabled'};
  if (el.readOnly) return {ok: false, what, why: 'read-only'};
  return {ok: true, what};
}"#;

/// `fill_secret`: types the vault secret the node opened (`fill`) into the field `r.ref`, as
/// `type` does ([`replace_text`]), once the checks pass, none of which lets anything reach the
/// page: the ref still names its element ([`check_ref`]); the origin of the tab's page and of the
/// field's own document (it may be in an iframe) are each among the secret's origins, as the
/// browser has them ([`frame_doc`], not the page's script), else `Forbidden`; the element is a
/// field of the secret's kind ([`SECRET_FIELD`]), else `InvalidRequest`. The fill is remembered
/// by the session ([`super::secrets`]) before the value is typed, so every later answer masks
/// it. The answer names the secret, never its value.
///
/// A filled tab cannot be sent to a `javascript:` URL (which could read the field and show the
/// value in the page): `navigate` refuses every URL but http, https and `about:blank` on every
/// tab (`computerd_proto::browser::check_url`).
async fn fill_secret(
    session: &Session,
    tabs: &mut Tabs,
    target: &str,
    r: &browser::FillSecretRequest,
) -> Result<Value, BrowserError> {
    let Some(fill) = r.fill.as_ref() else {
        return Err(BrowserError::invalid("fill_secret is sent by the node with the opened secret"));
    };
    let wanted = match fill.kind.as_str() {
        "password" => "a password or username field",
        "totp" => "a one-time code field",
        "text" => "a text field",
        other => {
            return Err(BrowserError::invalid(format!("a secret's kind is password, totp or text, not {other:?}")));
        }
    };
    if fill.value.expose().is_empty() {
        return Err(BrowserError::invalid(format!("the secret {:?} is empty: there is nothing to fill", r.secret)));
    }
    let cdp = &session.cdp;
    let (tab, _) = tab_of(tabs, target)?;
    let (info, obj) = check_ref(cdp, tab, &r.r#ref).await?;
    let allowed: Vec<String> = fill.origins.iter().filter_map(|o| origin(o)).collect();
    let refuse = |where_: String| {
        BrowserError::new(
            ErrorKind::Forbidden,
            format!(
                "the secret {:?} may be filled only on pages of {}; {where_}: nothing was typed",
                r.secret,
                if fill.origins.is_empty() { "no origin".to_string() } else { fill.origins.join(", ") }
            ),
        )
    };
    let page = frame_doc(cdp, &tab.cdp_session, &tab.frame)
        .await?
        .ok_or_else(|| BrowserError::stale(format!("the page of {} is gone", r.r#ref)))?;
    if !page.origin.as_ref().is_some_and(|o| allowed.contains(o)) {
        return Err(refuse(format!("this tab's page is {}", page.shown)));
    }
    let field = match &info.frame {
        None => page,
        Some(f) => frame_doc(cdp, &f.session, &f.id).await?.ok_or_else(|| navigated(&info, &r.r#ref))?,
    };
    // The document whose origin was read is the ref's.
    if field.loader != info.loader {
        return Err(navigated(&info, &r.r#ref));
    }
    if !field.origin.as_ref().is_some_and(|o| allowed.contains(o)) {
        return Err(refuse(format!("the field {} is in a frame of {}", r.r#ref, field.shown)));
    }
    let checked =
        function(cdp, frames::session_of(tab, &info), &obj, SECRET_FIELD, json!([{"value": fill.kind}])).await?;
    if checked["ok"] != true {
        let what = checked["what"].as_str().unwrap_or("not a field");
        return Err(BrowserError::invalid(match checked["why"].as_str() {
            Some(why) => format!("{} is {what}, {why}: nothing was typed", r.r#ref),
            None => format!("{} is {what}, not {wanted}", r.r#ref),
        }));
    }
    session.secrets.remember(super::secrets::FilledSecret {
        name: r.secret.clone(),
        value: fill.value.clone(),
        frame: info.frame.as_ref().map_or_else(|| tab.frame.clone(), |f| f.id.clone()),
        loader: info.loader.clone(),
        backend: info.backend,
    });
    let outcome = replace_text(cdp, tab, &info, &obj, &r.r#ref, fill.value.expose(), r.submit, r.timeout_ms).await?;
    Ok(json!({"tab": target, "ref": r.r#ref, "filled": r.secret, "kind": fill.kind, "outcome": outcome}))
}

/// One key with its modifiers, as CDP takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyPress {
    key: String,
    code: String,
    vk: u32,
    text: String,
    modifiers: u32,
}

/// Parses `Enter`, `ctrl+l`, `shift+Tab`, `a`.
pub fn parse_keys(keys: &str) -> Result<KeyPress, String> {
    let parts: Vec<&str> = keys.split('+').map(str::trim).collect();
    let (last, mods) = parts.split_last().ok_or("no key")?;
    let mut modifiers = 0;
    for m in mods {
        modifiers |= match m.to_ascii_lowercase().as_str() {
            "alt" | "option" => 1,
            "ctrl" | "control" => 2,
            "meta" | "cmd" | "command" | "super" => 4,
            "shift" => 8,
            other => return Err(format!("{other:?} is not a modifier (ctrl, shift, alt, meta)")),
        };
    }
    let named = |key: &str, code: &str, vk: u32, text: &str| (key.to_string(), code.to_string(), vk, text.to_string());
    let (key, code, vk, mut text) = match last.to_ascii_lowercase().as_str() {
        "enter" | "return" => named("Enter", "Enter", 13, "\r"),
        "tab" => named("Tab", "Tab", 9, ""),
        "escape" | "esc" => named("Escape", "Escape", 27, ""),
        "backspace" => named("Backspace", "Backspace", 8, ""),
        "delete" => named("Delete", "Delete", 46, ""),
        "space" => named(" ", "Space", 32, " "),
        "arrowup" | "up" => named("ArrowUp", "ArrowUp", 38, ""),
        "arrowdown" | "down" => named("ArrowDown", "ArrowDown", 40, ""),
        "arrowleft" | "left" => named("ArrowLeft", "ArrowLeft", 37, ""),
        "arrowright" | "right" => named("ArrowRight", "ArrowRight", 39, ""),
        "home" => named("Home", "Home", 36, ""),
        "end" => named("End", "End", 35, ""),
        "pageup" => named("PageUp", "PageUp", 33, ""),
        "pagedown" => named("PageDown", "PageDown", 34, ""),
        f if f.len() >= 2 && f.starts_with('f') && f[1..].parse::<u32>().is_ok_and(|n| (1..=12).contains(&n)) => {
            let n: u32 = f[1..].parse().unwrap_or(1);
            named(&format!("F{n}"), &format!("F{n}"), 111 + n, "")
        }
        _ => {
            let mut chars = last.chars();
            let (Some(c), None) = (chars.next(), chars.next()) else {
                return Err(format!("{last:?} is not a key (Enter, Tab, ArrowUp, a, …)"));
            };
            let c = if modifiers & 8 != 0 { c.to_ascii_uppercase() } else { c };
            let up = c.to_ascii_uppercase();
            let (code, vk) = if c.is_ascii_alphabetic() {
                (format!("Key{up}"), up as u32)
            } else if c.is_ascii_digit() {
                (format!("Digit{c}"), c as u32)
            } else {
                (String::new(), 0)
            };
            (c.to_string(), code, vk, c.to_string())
        }
    };
    if modifiers & (1 | 2 | 4) != 0 {
        text.clear();
    }
    Ok(KeyPress { key, code, vk, text, modifiers })
}

async fn key(cdp: &Cdp, s: &str, k: &KeyPress) -> Result<(), BrowserError> {
    let down = if k.text.is_empty() { "rawKeyDown" } else { "keyDown" };
    let mut ev =
        json!({"type": down, "key": k.key, "code": k.code, "windowsVirtualKeyCode": k.vk, "modifiers": k.modifiers});
    if !k.text.is_empty() {
        ev["text"] = json!(k.text);
    }
    call(cdp, s, "Input.dispatchKeyEvent", ev).await?;
    call(
        cdp,
        s,
        "Input.dispatchKeyEvent",
        json!({"type": "keyUp", "key": k.key, "code": k.code, "windowsVirtualKeyCode": k.vk, "modifiers": k.modifiers}),
    )
    .await?;
    Ok(())
}

/// What became of a navigation: loaded (with its status), failed, or not seen to end.
#[derive(Debug, Default)]
struct Load {
    loaded: bool,
    status: Option<u64>,
    failed: Option<String>,
    /// The document request was redirected.
    redirected: bool,
    /// No server was reached (the wire guard's `502 not-sent`): the net error it stands for.
    unreached: Option<String>,
    /// The load failed with a net error before any answer came (`net::ERR_…`).
    net_error: Option<String>,
    /// The frame's answer (or a link's `download`) became a download: the page stays.
    download: bool,
}

/// The wire guard's mark on a response (`x-computerd-wire`), from CDP's headers object.
fn wire_mark(headers: &Value) -> Option<&str> {
    headers.as_object()?.iter().find(|(k, _)| k.eq_ignore_ascii_case(super::wire::HEADER)).and_then(|(_, v)| v.as_str())
}

/// Follows the main frame's navigation through the tab's events.
struct Watch<'a> {
    s: &'a str,
    frame: &'a str,
    /// The document followed (the next one when `None`).
    loader: Option<String>,
    /// Its document requests (a redirect makes several).
    documents: Vec<String>,
    /// A navigation has begun.
    started: bool,
    load: Load,
    /// A dialog opened on the tab (the page waits on it).
    dialog: Option<Value>,
}

impl<'a> Watch<'a> {
    fn new(s: &'a str, frame: &'a str, loader: Option<String>) -> Self {
        Watch { s, frame, loader, documents: Vec::new(), started: false, load: Load::default(), dialog: None }
    }

    /// Takes in one event; answers whether the load has ended (loaded or failed).
    fn feed(&mut self, ev: &Event) -> bool {
        // On the browser's target (see `download`).
        if ev.method == "Browser.downloadWillBegin" && ev.params["frameId"] == self.frame {
            self.load.download = true;
            return true;
        }
        if ev.session != self.s {
            return false;
        }
        let p = &ev.params;
        let ours = p["frameId"] == self.frame;
        match ev.method.as_str() {
            "Page.javascriptDialogOpening" => {
                self.dialog = Some(dialog_of(p));
                return true;
            }
            "Page.frameRequestedNavigation" | "Page.frameStartedLoading" | "Page.frameStartedNavigating" if ours => {
                self.started = true;
            }
            "Network.requestWillBeSent" if ours && p["type"] == "Document" => {
                self.started = true;
                if p.get("redirectResponse").is_some_and(|r| r.is_object())
                    && (self.loader.is_none() || self.loader.as_deref() == p["loaderId"].as_str())
                {
                    self.load.redirected = true;
                }
                if self.loader.is_none() {
                    self.loader = p["loaderId"].as_str().map(String::from);
                }
                if let Some(id) = p["requestId"].as_str() {
                    self.documents.push(id.to_string());
                }
            }
            "Network.responseReceived"
                if p["type"] == "Document" && self.loader.as_deref() == p["loaderId"].as_str() =>
            {
                self.load.status = p["response"]["status"].as_u64();
                // The wire guard's `502 not-sent`: no server was reached (the name did not
                // resolve, the connection was refused); its error header says which net error.
                if wire_mark(&p["response"]["headers"]) == Some("not-sent") {
                    let headers = p["response"]["headers"].as_object();
                    let why = headers
                        .and_then(|h| h.iter().find(|(k, _)| k.eq_ignore_ascii_case(super::wire::ERROR_HEADER)))
                        .and_then(|(_, v)| v.as_str());
                    self.load.unreached =
                        Some(why.unwrap_or("net::ERR_CONNECTION_FAILED (the server could not be reached)").to_string());
                }
                // The wire guard's own 502 for a request whose answer was lost (it is not sent
                // again): as if the load had failed, whatever the browser shows.
                if let Some(mark) = wire_mark(&p["response"]["headers"])
                    && mark != "not-sent"
                {
                    self.load.failed = Some(format!(
                        "{}: {mark} (the server may have taken the request; it was not sent again)",
                        super::wire::HEADER
                    ));
                    return true;
                }
            }
            "Network.loadingFailed"
                if p["requestId"].as_str().is_some_and(|r| self.documents.iter().any(|d| d == r))
                    && p["canceled"] != Value::Bool(true) =>
            {
                let e = p["errorText"].as_str().unwrap_or("the load failed").to_string();
                if self.load.status.is_none() && e.starts_with("net::") {
                    self.load.net_error = Some(e.clone());
                }
                self.load.failed = Some(e);
                return true;
            }
            "Page.frameNavigated" if p["frame"]["id"] == self.frame && self.loader.is_none() => {
                self.loader = p["frame"]["loaderId"].as_str().map(String::from);
            }
            "Page.lifecycleEvent"
                if ours
                    && p["name"] == "load"
                    && self.loader.is_some()
                    && self.loader.as_deref() == p["loaderId"].as_str() =>
            {
                self.load.loaded = true;
                return true;
            }
            _ => {}
        }
        false
    }
}

/// The next event, or why there is none (`Err(None)`: the time is up).
async fn next_event(events: &mut broadcast::Receiver<Event>, until: Instant) -> Result<Event, Option<String>> {
    match tokio::time::timeout_at(until, events.recv()).await {
        Ok(Ok(ev)) => Ok(ev),
        Ok(Err(broadcast::error::RecvError::Lagged(_))) => Err(Some("too many page events to follow".into())),
        Ok(Err(broadcast::error::RecvError::Closed)) => Err(Some("the browser stopped".into())),
        Err(_) => Err(None),
    }
}

/// Feeds `watch` until the load ends or `until`.
async fn wait_load(events: &mut broadcast::Receiver<Event>, watch: &mut Watch<'_>, until: Instant) {
    loop {
        match next_event(events, until).await {
            Ok(ev) => {
                if watch.feed(&ev) {
                    return;
                }
            }
            Err(Some(why)) => {
                watch.load.failed = Some(why);
                return;
            }
            Err(None) => return,
        }
    }
}

/// After an action: whether it started a navigation, and how that ended. `unknown` when the
/// load failed or did not end in time (the request may have had its effect).
async fn settle(events: &mut broadcast::Receiver<Event>, s: &str, frame: &str, timeout_ms: Option<u64>) -> Value {
    let mut watch = Watch::new(s, frame, None);
    let start = Instant::now() + NAVIGATION_START;
    while !watch.started {
        match next_event(events, start).await {
            Ok(ev) => {
                if watch.feed(&ev) {
                    break;
                }
            }
            Err(Some(why)) => return json!({"state": "unknown", "navigated": null, "error": why}),
            Err(None) => return json!({"state": "done", "navigated": false}),
        }
    }
    if watch.load.download {
        return json!({"state": "done", "navigated": false});
    }
    if !watch.load.loaded && watch.load.failed.is_none() && watch.dialog.is_none() {
        let until = Instant::now() + Duration::from_millis(timeout_ms.unwrap_or(browser::DEFAULT_WAIT_MS));
        wait_load(events, &mut watch, until).await;
    }
    if watch.load.download {
        return json!({"state": "done", "navigated": false});
    }
    if let Some(d) = watch.dialog {
        let navigated = if watch.load.loaded { json!(true) } else { json!(watch.started) };
        return json!({"state": "done", "navigated": navigated, "dialog": d});
    }
    match (watch.load.loaded, watch.load.failed) {
        (_, Some(e)) => {
            json!({"state": "unknown", "navigated": true, "error": format!("the page's answer was lost: {e}")})
        }
        (true, None) => json!({"state": "done", "navigated": true, "status": watch.load.status}),
        (false, None) => {
            json!({"state": "unknown", "navigated": true, "error": "the page did not finish loading in time"})
        }
    }
}

/// Loads `url` in the tab and waits for its load.
async fn navigate(
    session: &Session,
    tabs: &mut Tabs,
    target: &str,
    url: &str,
    timeout_ms: u64,
) -> Result<Value, BrowserError> {
    browser::check_url(url).map_err(BrowserError::invalid)?;
    let cdp = &session.cdp;
    let tab = attach(cdp, tabs, target).await?;
    let s = tab.cdp_session.clone();
    let frame = tab.frame.clone();
    let mut events = cdp.subscribe();
    let until = Instant::now() + Duration::from_millis(timeout_ms);
    // The browser answers `Page.navigate` once the document's answer begins: a server that
    // never answers holds it until the deadline.
    let within = Duration::from_millis(timeout_ms).max(Duration::from_millis(1));
    let sent = async {
        match cdp.call(Some(&s), "Page.navigate", json!({"url": url}), within).await {
            Err(super::cdp::CdpError::Timeout) => Ok(Value::Null),
            other => Ok(other?),
        }
    };
    // The page may ask first (`beforeunload`).
    let (nav, dialog) = unblocked(cdp.subscribe(), &s, sent).await?;
    let nav = nav.unwrap_or_default();
    let mut answer = json!({"tab": target, "redirected": false, "timedOut": false});
    if let Some(d) = dialog {
        answer["loaded"] = json!(false);
        answer["status"] = Value::Null;
        answer["dialog"] = d;
    } else if nav.is_null() {
        answer["loaded"] = json!(false);
        answer["status"] = Value::Null;
        answer["timedOut"] = json!(true);
        answer["error"] = json!(format!("the page did not answer within {timeout_ms} ms"));
    } else if let Some(e) = nav["errorText"].as_str().filter(|e| !e.is_empty()) {
        // A net error before any answer (`ERR_ABORTED` aside: the load was replaced, or it
        // was a download).
        if e != "net::ERR_ABORTED" {
            return Err(unreached(url, e));
        }
        answer["loaded"] = json!(false);
        // A download is no error (the page stays; the answer lists it: see `download`).
        let (mut watch, began) = (Watch::new(&s, &frame, None), Instant::now() + NAVIGATION_START);
        while let Ok(ev) = next_event(&mut events, began).await {
            if watch.feed(&ev) && watch.load.download {
                break;
            }
        }
        if !watch.load.download {
            answer["error"] = json!(e);
        }
    } else if let Some(loader) = nav["loaderId"].as_str() {
        let mut watch = Watch::new(&s, &frame, Some(loader.to_string()));
        wait_load(&mut events, &mut watch, until).await;
        if let Some(d) = watch.dialog.take() {
            answer["dialog"] = d;
        }
        let load = watch.load;
        if let Some(e) = load.unreached.as_deref().or(load.net_error.as_deref()) {
            return Err(unreached(url, e));
        }
        answer["loaded"] = json!(load.loaded);
        answer["status"] = json!(load.status);
        answer["redirected"] = json!(load.redirected);
        match load.failed {
            Some(e) => answer["error"] = json!(e),
            None if !load.loaded && (answer.get("dialog").is_some() || load.download) => {}
            None if !load.loaded => {
                answer["timedOut"] = json!(true);
                answer["error"] = json!(format!("the page did not finish loading within {timeout_ms} ms"));
            }
            None => {}
        }
    } else {
        // The same document (a fragment): nothing loads.
        answer["loaded"] = json!(true);
    }
    let info = cdp.call(None, "Target.getTargetInfo", json!({"targetId": target}), COMMAND).await?;
    answer["url"] = info["targetInfo"]["url"].clone();
    answer["title"] = info["targetInfo"]["title"].clone();
    Ok(answer)
}

/// A navigation that reached no server: `NavigationFailed`, naming the net error and the host.
fn unreached(url: &str, net_error: &str) -> BrowserError {
    let host = url.split_once("://").map_or(url, |(_, r)| r).split(['/', '?', '#']).next().unwrap_or_default();
    BrowserError::new(
        ErrorKind::NavigationFailed,
        format!("{url} could not be loaded: {net_error} (host {host}); no server answered"),
    )
}

fn text_of(v: &Value) -> String {
    match &v["value"] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn cut(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= MAX_NAME {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(MAX_NAME).collect::<String>())
    }
}

/// One listed element, before its ref is bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// Its depth in the listing.
    pub depth: usize,
    /// Role.
    pub role: String,
    /// Accessible name.
    pub name: String,
    /// Value, when it has one.
    pub value: String,
    /// States (`focused`, `checked`, `level=2`, …).
    pub states: Vec<String>,
    /// Its backend node (None: text, no ref).
    pub backend: Option<i64>,
}

/// The elements of an accessibility tree (CDP's `getFullAXTree` nodes) worth listing, in
/// document order: ignored and structural nodes are skipped (their children kept), text is kept
/// where its parent does not already say it. At most `max`; answers whether it stopped early.
pub fn listing(nodes: &[Value], root_backend: Option<i64>, max: usize) -> (Vec<Listed>, bool) {
    let by_id: HashMap<&str, &Value> = nodes.iter().filter_map(|n| n["nodeId"].as_str().map(|id| (id, n))).collect();
    let root = match root_backend {
        Some(b) => nodes.iter().find(|n| n["backendDOMNodeId"] == b),
        None => nodes.iter().find(|n| n.get("parentId").is_none()).or(nodes.first()),
    };
    let mut out = Vec::new();
    let mut truncated = false;
    // Depth-first, with an explicit stack: (node, depth, the nearest listed ancestor's name).
    let mut stack: Vec<(&Value, usize, String)> = root.map(|r| vec![(r, 0, String::new())]).unwrap_or_default();
    while let Some((n, depth, parent_name)) = stack.pop() {
        if out.len() >= max {
            truncated = true;
            break;
        }
        let role = text_of(&n["role"]);
        let name = cut(&text_of(&n["name"]));
        let ignored = n["ignored"] == Value::Bool(true);
        let structural = matches!(
            role.as_str(),
            "none" | "presentation" | "InlineTextBox" | "LineBreak" | "RootWebArea" | "WebArea"
        ) || (role == "generic" && name.is_empty());
        let (child_depth, child_parent) = if ignored || structural {
            (depth, parent_name.clone())
        } else if role == "StaticText" {
            if !name.is_empty() && !parent_name.contains(&name) {
                out.push(Listed {
                    depth,
                    role: "text".into(),
                    name: name.clone(),
                    value: String::new(),
                    states: Vec::new(),
                    backend: None,
                });
            }
            (depth, parent_name.clone())
        } else {
            let mut states = Vec::new();
            for p in n["properties"].as_array().into_iter().flatten() {
                let pn = p["name"].as_str().unwrap_or_default();
                let pv = &p["value"]["value"];
                match pn {
                    "focused" | "disabled" | "selected" | "expanded" | "required" | "pressed" | "readonly"
                    | "multiselectable"
                        if pv == &Value::Bool(true) =>
                    {
                        states.push(pn.to_string())
                    }
                    "checked" if pv == "true" || pv == &Value::Bool(true) => states.push("checked".into()),
                    "checked" if pv == "mixed" => states.push("checked=mixed".into()),
                    "level" if pv.is_number() => states.push(format!("level={pv}")),
                    _ => {}
                }
            }
            out.push(Listed {
                depth,
                role: role.clone(),
                name: name.clone(),
                value: cut(&text_of(&n["value"])),
                states,
                backend: n["backendDOMNodeId"].as_i64(),
            });
            (depth + 1, name)
        };
        if let Some(children) = n["childIds"].as_array() {
            for c in children.iter().rev() {
                if let Some(child) = c.as_str().and_then(|c| by_id.get(c)) {
                    stack.push((child, child_depth, child_parent.clone()));
                }
            }
        }
    }
    (out, truncated)
}

/// A listed element as a line: `- button "Sign in" [focused] [ref=e12]`.
fn line(l: &Listed, r: Option<u32>) -> String {
    let mut s = format!("{}- {}", "  ".repeat(l.depth), l.role);
    if !l.name.is_empty() {
        s.push_str(&format!(" {:?}", l.name));
    }
    if !l.value.is_empty() {
        s.push_str(&format!(": {:?}", l.value));
    }
    for st in &l.states {
        s.push_str(&format!(" [{st}]"));
    }
    if let Some(r) = r {
        s.push_str(&format!(" [ref=e{r}]"));
    }
    s
}

/// The tab's snapshot. In a session with filled secrets, the accessibility tree's names and
/// values are masked before they are cut ([`super::secrets`]), and a filled element's value
/// reads `[filled from secret "<name>"]`.
async fn snapshot(
    cdp: &Cdp,
    tabs: &mut Tabs,
    target: &str,
    r: &browser::SnapshotRequest,
    secrets: &super::secrets::Filled,
) -> Result<Value, BrowserError> {
    let (tab, next_ref) = tab_of(tabs, target)?;
    let s = tab.cdp_session.clone();
    let root = match &r.root {
        Some(root) => Some(check_ref(cdp, tab, root).await?.0),
        None => None,
    };
    // The page's frames, each listed under its `<iframe>` (see `frames`).
    let all_frames = frames::frames(cdp, tab, target).await?;
    let start = match root.as_ref().and_then(|i| i.frame.as_ref()) {
        None => 0,
        Some(f) => all_frames
            .iter()
            .position(|x| x.at.as_ref().is_some_and(|a| a.id == f.id))
            .ok_or_else(|| BrowserError::stale(format!("the frame of {} is gone", r.root.as_deref().unwrap_or(""))))?,
    };
    let root_backend = root.as_ref().filter(|i| i.frame.is_none()).map(|i| i.backend);
    let loader = all_frames.first().map(|f| f.loader.clone()).unwrap_or_default();
    let max = r.max_elements.unwrap_or(browser::MAX_ELEMENTS);
    let masks = secrets.masks();
    let (mut listed, mut truncated) =
        frames::list(cdp, &all_frames, start, root.as_ref().map(|i| i.backend), max, &masks).await?;
    if !secrets.is_empty() {
        // A filled field that still shows the value (masked already, or a password field's
        // bullets) names its secret instead, and the text inside it (its editor's) is left out.
        // A field the page emptied, or that holds other text now, shows what it holds.
        let shows_secret =
            |v: &str| v.contains("[secret \"") || (!v.is_empty() && v.chars().all(|c| "•●*".contains(c)));
        let mut filled_at: Option<usize> = None;
        listed.retain_mut(|(l, f)| {
            if let Some(d) = filled_at {
                if l.depth > d && l.role == "text" {
                    return false;
                }
                if l.depth <= d {
                    filled_at = None;
                }
            }
            if let Some(b) = l.backend
                && shows_secret(&l.value)
                && let Some(name) = secrets.filled_at(&all_frames[*f].id, &all_frames[*f].loader, b)
            {
                l.value = format!("[filled from secret {name:?}]");
                filled_at = Some(l.depth);
            }
            true
        });
    }
    let mut refs = HashMap::new();
    let mut text = String::new();
    let mut elements = Vec::new();
    let json_too = r.format.as_deref() == Some("json");
    let mut listed_backends = std::collections::HashSet::new();
    for (l, f) in &listed {
        let in_frame = &all_frames[*f];
        let rn = l.backend.map(|b| {
            *next_ref += 1;
            refs.insert(
                *next_ref,
                RefInfo {
                    backend: b,
                    loader: in_frame.loader.clone(),
                    role: l.role.clone(),
                    name: l.name.clone(),
                    file_input: false,
                    frame: in_frame.at.clone(),
                },
            );
            // Backend ids are per process: only those of the tab's session are the page's.
            if in_frame.session == s {
                listed_backends.insert(b);
            }
            *next_ref
        });
        text.push_str(&line(l, rn));
        text.push('\n');
        if json_too {
            elements.push(json!({"ref": rn.map(|n| format!("e{n}")), "role": l.role, "name": l.name, "value": l.value, "states": l.states, "depth": l.depth}));
        }
    }
    // File inputs the tree hides (`display: none` behind a label) are listed by their label:
    // those of the page, or of the subtree (the inputs inside its root's node). They count
    // towards `maxElements` like the rest.
    let mut shown = listed.len();
    if start == 0 {
        let doc = call(cdp, &s, "DOM.getDocument", json!({"depth": 0})).await?;
        let root_id = match root_backend {
            None => doc["root"]["nodeId"].as_i64().unwrap_or(0),
            Some(b) => {
                let pushed =
                    call(cdp, &s, "DOM.pushNodesByBackendIdsToFrontend", json!({"backendNodeIds": [b]})).await?;
                pushed["nodeIds"][0].as_i64().unwrap_or(0)
            }
        };
        let found = if root_id == 0 {
            Value::Null
        } else {
            call(cdp, &s, "DOM.querySelectorAll", json!({"nodeId": root_id, "selector": "input[type=file]"})).await?
        };
        for id in found["nodeIds"].as_array().into_iter().flatten().take(32) {
            let d = call(cdp, &s, "DOM.describeNode", json!({"nodeId": id})).await?;
            let Some(b) = d["node"]["backendNodeId"].as_i64() else { continue };
            if listed_backends.contains(&b) {
                continue;
            }
            if shown >= max {
                truncated = true;
                break;
            }
            let obj = call(cdp, &s, "DOM.resolveNode", json!({"backendNodeId": b})).await?;
            let Some(obj) = obj["object"]["objectId"].as_str() else { continue };
            shown += 1;
            let label = function(cdp, &s, obj, LABEL, json!([])).await?.as_str().map(cut).unwrap_or_default();
            *next_ref += 1;
            let n = *next_ref;
            refs.insert(
                n,
                RefInfo {
                    backend: b,
                    loader: loader.clone(),
                    role: "file input".into(),
                    name: label.clone(),
                    file_input: true,
                    frame: None,
                },
            );
            let l = Listed {
                depth: 0,
                role: "file input".into(),
                name: label.clone(),
                value: String::new(),
                states: vec!["hidden".into()],
                backend: Some(b),
            };
            text.push_str(&line(&l, Some(n)));
            text.push('\n');
            if json_too {
                elements.push(json!({"ref": format!("e{n}"), "role": "file input", "name": label, "value": "", "states": ["hidden"], "depth": 0}));
            }
        }
    }
    let count = refs.len();
    tab.refs = refs;
    let info = cdp.call(None, "Target.getTargetInfo", json!({"targetId": target}), COMMAND).await?;
    let mut answer = json!({
        "tab": target,
        "url": info["targetInfo"]["url"],
        "title": info["targetInfo"]["title"],
        "refs": count,
        "truncated": truncated,
        "text": text,
    });
    if json_too {
        answer["elements"] = Value::Array(elements);
    }
    Ok(answer)
}

async fn upload(
    session: &Session,
    tabs: &mut Tabs,
    target: &str,
    r: &browser::UploadRequest,
    owner: Option<(u32, u32)>,
    uploads_from: &std::path::Path,
) -> Result<Value, BrowserError> {
    let cdp = &session.cdp;
    let (tab, _) = tab_of(tabs, target)?;
    let s = tab.cdp_session.clone();
    let (info, obj) = check_ref(cdp, tab, &r.r#ref).await?;
    if info.frame.as_ref().is_some_and(|f| f.session != s) {
        return Err(BrowserError::invalid(format!(
            "{} is in an out-of-process frame: upload there is not supported",
            r.r#ref
        )));
    }
    let kind = function(cdp, &s, &obj, FILE_INPUT, json!([])).await?;
    // Not a file input (nor the label of one): a button whose click opens a file chooser, as
    // most sites do (seed 004's second mode). The chooser is intercepted, never shown.
    let chooser = kind.is_null();
    if !chooser && kind["disabled"] == Value::Bool(true) {
        return Err(BrowserError::invalid(format!("{} is disabled", r.r#ref)));
    }
    if !chooser && r.paths.len() > 1 && kind["multiple"] != Value::Bool(true) {
        return Err(BrowserError::invalid(format!("{} takes one file", r.r#ref)));
    }
    use std::os::fd::AsFd;
    use std::os::fd::AsRawFd;
    // The staging directory as opened (the browser's account could move its path elsewhere).
    let used: u64 = dir_size(std::path::Path::new(&format!("/proc/self/fd/{}", session.stage_fd.as_raw_fd())));
    let (paths, stage, from) = (r.paths.clone(), session.stage_dir.clone(), uploads_from.to_path_buf());
    let stage_fd = session.stage_fd.try_clone().map_err(|e| failed(e.to_string()))?;
    let staged = tokio::task::spawn_blocking(move || {
        super::upload::stage(&paths, &from, &stage, stage_fd.as_fd(), owner, browser::MAX_UPLOAD_BYTES)
    })
    .await
    .map_err(|e| failed(e.to_string()))?
    .map_err(BrowserError::invalid)?;
    if used + staged.iter().map(|f| f.size).sum::<u64>() > super::MAX_STAGED {
        for f in &staged {
            let _ = f.copy.parent().map(std::fs::remove_dir_all);
        }
        return Err(BrowserError::new(
            ErrorKind::TooLarge,
            "this session's uploads are over 256 MiB; close it and open a new one",
        ));
    }
    let files: Vec<String> = staged.iter().map(|f| f.copy.display().to_string()).collect();
    let (input_backend, input_obj) = if chooser {
        let found = chooser_input(cdp, tab, &info, &obj, r.paths.len()).await;
        if !matches!(found, Ok(Some(_))) {
            for f in &staged {
                let _ = f.copy.parent().map(std::fs::remove_dir_all);
            }
        }
        match found? {
            Some(input) => input,
            // The click went out and opened nothing: what it did is the page's, not known here.
            None => {
                return Ok(json!({
                    "tab": target,
                    "ref": r.r#ref,
                    "accepted": false,
                    "readBack": [],
                    "files": [],
                    "outcome": {"state": "unknown", "error": format!("{} is not a file input, and clicking it opened no file chooser within {} s (the click was sent; what it did is unknown)", r.r#ref, CHOOSER_WAIT.as_secs())},
                }));
            }
        }
    } else {
        (info.backend, obj.clone())
    };
    function(cdp, &s, &input_obj, WATCH_FILES, json!([])).await?;
    call(cdp, &s, "DOM.setFileInputFiles", json!({"files": files, "backendNodeId": input_backend})).await?;
    let back = function(cdp, &s, &input_obj, FILES, json!([])).await?;
    let want: Vec<Value> = staged.iter().map(|f| json!({"name": f.name, "size": f.size})).collect();
    let accepted = back.as_array() == Some(&want);
    Ok(json!({
        "tab": target,
        "ref": r.r#ref,
        "accepted": accepted,
        "readBack": back,
        "files": staged.iter().map(|f| json!({"path": f.source, "name": f.name, "size": f.size, "sha256": f.sha256, "artifact": null})).collect::<Vec<_>>(),
        "outcome": {"state": if accepted { "done" } else { "failed" }},
    }))
}

/// How long a click may take to open a file chooser.
const CHOOSER_WAIT: Duration = Duration::from_secs(5);

/// Clicks the element with file choosers intercepted (`Page.setInterceptFileChooserDialog`), and
/// answers the file input whose chooser the click opened (its backend id and object), checked to
/// take `count` files; `None` when the click opened no chooser within [`CHOOSER_WAIT`] (the
/// click was sent).
async fn chooser_input(
    cdp: &Cdp,
    tab: &Tab,
    info: &RefInfo,
    obj: &str,
    count: usize,
) -> Result<Option<(i64, String)>, BrowserError> {
    let s = tab.cdp_session.as_str();
    let (x, y) = point_of(cdp, tab, info, obj).await?;
    let mut events = cdp.subscribe();
    call(cdp, s, "Page.setInterceptFileChooserDialog", json!({"enabled": true})).await?;
    let clicked = mouse(cdp, s, x, y, true).await;
    let until = Instant::now() + CHOOSER_WAIT;
    let opened = loop {
        if clicked.is_err() {
            break None;
        }
        match next_event(&mut events, until).await {
            Ok(ev) if ev.session == s && ev.method == "Page.fileChooserOpened" => break Some(ev.params),
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    let _ = call(cdp, s, "Page.setInterceptFileChooserDialog", json!({"enabled": false})).await;
    clicked?;
    let Some(opened) = opened else { return Ok(None) };
    if count > 1 && opened["mode"] != "selectMultiple" {
        return Err(BrowserError::invalid("the file chooser it opened takes one file"));
    }
    let backend = opened["backendNodeId"].as_i64().ok_or_else(|| failed("the file chooser names no input"))?;
    let resolved = call(cdp, s, "DOM.resolveNode", json!({"backendNodeId": backend})).await?;
    let input = resolved["object"]["objectId"].as_str().ok_or_else(|| failed("the chooser's input is gone"))?;
    Ok(Some((backend, input.to_string())))
}

fn dir_size(d: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![d.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// The tab's screenshot (the viewport, the full page, or an element). In a session with filled
/// secrets, where a filled value shows is painted over ([`secret_rects`]).
async fn screenshot(
    cdp: &Cdp,
    tabs: &mut Tabs,
    target: &str,
    r: &browser::ShotRequest,
    secrets: &super::secrets::Filled,
) -> Result<Answer, BrowserError> {
    let (tab, _) = tab_of(tabs, target)?;
    let s = tab.cdp_session.clone();
    // Where the image's top left corner is, in page coordinates (`None`: the viewport's).
    let mut corner: Option<(f64, f64)> = None;
    let format = r.format.clone().unwrap_or_else(|| "png".into());
    let mut params = json!({"format": format, "fromSurface": true});
    if let Some(q) = r.quality {
        params["quality"] = json!(q);
    }
    let metrics = call(cdp, &s, "Page.getLayoutMetrics", json!({})).await?;
    let vp = &metrics["cssVisualViewport"];
    let (mut w, mut h) = (vp["clientWidth"].as_f64().unwrap_or(0.0), vp["clientHeight"].as_f64().unwrap_or(0.0));
    if r.full_page {
        let c = &metrics["cssContentSize"];
        w = c["width"].as_f64().unwrap_or(w).ceil();
        h = c["height"].as_f64().unwrap_or(h).ceil().min(MAX_PAGE_HEIGHT);
        params["clip"] = json!({"x": 0, "y": 0, "width": w, "height": h, "scale": 1});
        params["captureBeyondViewport"] = json!(true);
        corner = Some((0.0, 0.0));
    } else if let Some(re) = &r.r#ref {
        let (info, _) = check_ref(cdp, tab, re).await?;
        let es = frames::session_of(tab, &info).to_string();
        let _ =
            cdp.call(Some(&es), "DOM.scrollIntoViewIfNeeded", json!({"backendNodeId": info.backend}), COMMAND).await;
        let m = call(cdp, &s, "Page.getLayoutMetrics", json!({})).await?;
        let box_ = call(cdp, &es, "DOM.getBoxModel", json!({"backendNodeId": info.backend}))
            .await
            .map_err(|_| BrowserError::invalid("the element is not visible (it has no box)"))?;
        let q: Vec<f64> = box_["model"]["border"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
        if q.len() != 8 {
            return Err(BrowserError::invalid("the element is not visible (it has no box)"));
        }
        let xs = [q[0], q[2], q[4], q[6]];
        let ys = [q[1], q[3], q[5], q[7]];
        let (x0, x1) = (xs.iter().cloned().fold(f64::MAX, f64::min), xs.iter().cloned().fold(f64::MIN, f64::max));
        let (y0, y1) = (ys.iter().cloned().fold(f64::MAX, f64::min), ys.iter().cloned().fold(f64::MIN, f64::max));
        w = (x1 - x0).ceil().max(1.0);
        h = (y1 - y0).ceil().clamp(1.0, MAX_PAGE_HEIGHT);
        let (px, py) = (
            m["cssVisualViewport"]["pageX"].as_f64().unwrap_or(0.0),
            m["cssVisualViewport"]["pageY"].as_f64().unwrap_or(0.0),
        );
        // An out-of-process frame's boxes are in its own viewport.
        let (dx, dy) = match &info.frame {
            Some(f) => frames::geometry(cdp, f).await?.offset,
            None => (0.0, 0.0),
        };
        params["clip"] = json!({"x": x0 + dx + px, "y": y0 + dy + py, "width": w, "height": h, "scale": 1});
        corner = Some((x0 + dx + px, y0 + dy + py));
    }
    // Read where filled values show just before the capture (after any scrolling above).
    let cover = if secrets.is_empty() {
        None
    } else {
        Some(secret_rects(cdp, &s, &tab.frame, &secrets.masks(), corner).await?)
    };
    let shot = call(cdp, &s, "Page.captureScreenshot", params).await?;
    let data = shot["data"].as_str().ok_or_else(|| failed("the browser sent no image"))?;
    if data.len() / 4 * 3 > MAX_IMAGE {
        return Err(BrowserError::new(
            ErrorKind::TooLarge,
            "the screenshot is over 16 MiB; take a part of the page (ref) or a JPEG",
        ));
    }
    let mut image = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| failed(format!("the browser's image is not base64: {e}")))?;
    if let Some(cover) = cover {
        let (jpeg, quality) = (format == "jpeg", r.quality);
        image = tokio::task::spawn_blocking(move || paint_over(&image, jpeg, quality, &cover))
            .await
            .map_err(|e| failed(format!("the screenshot could not be masked: {e}")))?
            .map_err(|e| failed(format!("the screenshot could not be masked: {e}")))?;
        if image.len() > MAX_IMAGE {
            return Err(BrowserError::new(
                ErrorKind::TooLarge,
                "the screenshot is over 16 MiB; take a part of the page (ref) or a JPEG",
            ));
        }
    }
    let mime = if format == "jpeg" { "image/jpeg" } else { "image/png" };
    Ok(Answer {
        json: json!({"tab": target, "width": w.round() as u64, "height": h.round() as u64, "format": format, "mimeType": mime, "size": image.len()}),
        image,
    })
}

/// Finds where the session's filled values (each in its forms: [`super::secrets::Masks`]) show
/// in the tab's page ([`COVER`], one call in an
/// isolated world of the page's main frame: the values never reach the page's own script, and
/// its script cannot change what the search sees of the DOM's methods). The rectangles are in
/// the image's CSS pixels: `corner` is where the image's top left corner is in page coordinates
/// (a full page: `(0, 0)`; an element: its clip), `None` for the viewport. A failure fails the
/// screenshot: an image is never sent unmasked.
async fn secret_rects(
    cdp: &Cdp,
    s: &str,
    frame: &str,
    masks: &super::secrets::Masks,
    corner: Option<(f64, f64)>,
) -> Result<Cover, BrowserError> {
    let params = json!({"frameId": frame, "worldName": "computerd-secrets", "grantUniveralAccess": false});
    let world = call(cdp, s, "Page.createIsolatedWorld", params).await?;
    let context = world["executionContextId"]
        .as_i64()
        .ok_or_else(|| failed("the screenshot could not be masked: the page gave no isolated world"))?;
    let values = masks.needles();
    let got = call(
        cdp,
        s,
        "Runtime.callFunctionOn",
        json!({"functionDeclaration": COVER, "executionContextId": context, "arguments": [{"value": values}], "returnByValue": true}),
    )
    .await?;
    if got.get("exceptionDetails").is_some() {
        return Err(failed("the screenshot could not be masked: the page's search for filled values failed"));
    }
    let v = &got["result"]["value"];
    let dpr = v["dpr"].as_f64().filter(|d| d.is_finite() && *d > 0.0).unwrap_or(1.0);
    let (sx, sy) = (v["sx"].as_f64().unwrap_or(0.0), v["sy"].as_f64().unwrap_or(0.0));
    // Client (viewport) coordinates to the image's: the page's, less the image's corner.
    let (ox, oy) = match corner {
        None => (0.0, 0.0),
        Some((cx, cy)) => (sx - cx, sy - cy),
    };
    let rects = v["rects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let n: Vec<f64> = r.as_array()?.iter().filter_map(Value::as_f64).collect();
            (n.len() == 4 && n.iter().all(|x| x.is_finite())).then(|| [n[0] + ox, n[1] + oy, n[2], n[3]])
        })
        .collect();
    Ok(Cover { rects, everything: v["many"] == true, scale: dpr })
}

/// Where to paint over a screenshot.
struct Cover {
    /// `[x, y, width, height]` in the image's CSS pixels.
    rects: Vec<[f64; 4]>,
    /// Too many places to list: the whole image is painted over.
    everything: bool,
    /// Image pixels per CSS pixel (the page's `devicePixelRatio`).
    scale: f64,
}

/// How far beyond a value's box the paint reaches (CSS pixels): glyphs may overhang their box.
const COVER_MARGIN: f64 = 2.0;

/// Paints `cover`'s rectangles opaque black on the encoded image (PNG, or JPEG with `jpeg`) and
/// encodes it again in the same format (a JPEG at `quality`, else 80).
fn paint_over(image: &[u8], jpeg: bool, quality: Option<u8>, cover: &Cover) -> Result<Vec<u8>, String> {
    let format = if jpeg { image::ImageFormat::Jpeg } else { image::ImageFormat::Png };
    let mut img = image::load_from_memory_with_format(image, format)
        .map_err(|e| format!("the browser's image cannot be read: {e}"))?
        .into_rgba8();
    let (w, h) = img.dimensions();
    let all = [[
        -COVER_MARGIN,
        -COVER_MARGIN,
        f64::from(w) / cover.scale + 2.0 * COVER_MARGIN,
        f64::from(h) / cover.scale + 2.0 * COVER_MARGIN,
    ]];
    let rects: &[[f64; 4]] = if cover.everything { &all } else { &cover.rects };
    for [x, y, rw, rh] in rects {
        let px = |v: f64, up: bool| {
            let v = v * cover.scale;
            let v = if up { v.ceil() } else { v.floor() };
            v.clamp(0.0, f64::from(u32::MAX)) as u32
        };
        let (x0, y0) = (px(x - COVER_MARGIN, false).min(w), px(y - COVER_MARGIN, false).min(h));
        let (x1, y1) = (px(x + rw + COVER_MARGIN, true).min(w), px(y + rh + COVER_MARGIN, true).min(h));
        for yy in y0..y1 {
            for xx in x0..x1 {
                img.put_pixel(xx, yy, image::Rgba([0, 0, 0, 255]));
            }
        }
    }
    let mut out = Vec::new();
    let encoded = if jpeg {
        let rgb = image::DynamicImage::ImageRgba8(img).into_rgb8();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality.unwrap_or(80).clamp(1, 100))
            .encode_image(&rgb)
    } else {
        use image::ImageEncoder;
        image::codecs::png::PngEncoder::new_with_quality(
            &mut out,
            image::codecs::png::CompressionType::Fast,
            image::codecs::png::FilterType::Adaptive,
        )
        .write_image(img.as_raw(), w, h, image::ExtendedColorType::Rgba8)
    };
    encoded.map_err(|e| format!("the image cannot be encoded: {e}"))?;
    Ok(out)
}

/// Finds where filled values show (run in an isolated world of the page's main frame, with the
/// values): `{dpr, sx, sy, rects: [[x, y, width, height]], many}`, in the main frame's client
/// (viewport) coordinates, `sx`/`sy` its scroll. It lists (a) each `<input>` or `<textarea>`
/// whose `.value` holds a value (but `type=password`, which Chromium draws as bullets), whole,
/// and (b) each occurrence of a value in a text node (`TreeWalker`, `Range.getClientRects`);
/// ASCII case aside; in the document, its open shadow roots, and same-origin iframes (their
/// rectangles offset by the iframe's content box and clipped to it), up to 8 deep. Past 100,000
/// rectangles it answers `many` (the whole image is painted over).
///
/// Not covered: cross-origin (and out-of-process) iframes, whose documents this world cannot
/// read; text drawn on a canvas, in an image or by CSS (`content:`, a placeholder); a value split
/// across elements or text nodes (`<b>ali</b>ce`) or changed by the page (reversed, masked in
/// part); closed shadow roots; what changes between this search and the capture (an animation).
const COVER: &str = r#"function(values) {
  const low = s => String(s).replace(/[A-Z]+/g, c => c.toLowerCase());
  const needles = values.map(low).filter(v => v.length > 0);
  const rects = [];
  let many = false;
  const add = (r, ox, oy, clip) => {
    if (rects.length >= 100000) { many = true; return; }
    if (!r || !(r.width > 0) || !(r.height > 0)) return;
    let x0 = r.left + ox, y0 = r.top + oy, x1 = r.right + ox, y1 = r.bottom + oy;
    if (clip) { x0 = Math.max(x0, clip[0]); y0 = Math.max(y0, clip[1]); x1 = Math.min(x1, clip[2]); y1 = Math.min(y1, clip[3]); }
    if (x1 > x0 && y1 > y0) rects.push([x0, y0, x1 - x0, y1 - y0]);
  };
  const holds = s => { const l = low(s); return needles.some(n => l.includes(n)); };
  const walk = (doc, ox, oy, clip, depth) => {
    const roots = [doc];
    for (let i = 0; i < roots.length; i++) {
      for (const el of roots[i].querySelectorAll('*')) if (el.shadowRoot) roots.push(el.shadowRoot);
    }
    for (const root of roots) {
      for (const el of root.querySelectorAll('input, textarea')) {
        if (el.tagName === 'INPUT' && String(el.type).toLowerCase() === 'password') continue;
        if (typeof el.value === 'string' && el.value && holds(el.value)) for (const r of el.getClientRects()) add(r, ox, oy, clip);
      }
      const tw = doc.createTreeWalker(root, NodeFilter.SHOW_TEXT);
      for (let n = tw.nextNode(); n; n = tw.nextNode()) {
        const l = low(n.data);
        for (const nd of needles) {
          for (let i = l.indexOf(nd); i >= 0; i = l.indexOf(nd, i + nd.length)) {
            const range = doc.createRange();
            range.setStart(n, i);
            range.setEnd(n, i + nd.length);
            for (const r of range.getClientRects()) add(r, ox, oy, clip);
          }
        }
      }
      if (depth >= 8) continue;
      for (const f of root.querySelectorAll('iframe, frame')) {
        let d = null;
        try { d = f.contentDocument; } catch (e) { d = null; }
        if (!d) continue;
        const b = f.getBoundingClientRect(), cs = doc.defaultView.getComputedStyle(f);
        const pl = parseFloat(cs.paddingLeft) || 0, pt = parseFloat(cs.paddingTop) || 0;
        const pr = parseFloat(cs.paddingRight) || 0, pb = parseFloat(cs.paddingBottom) || 0;
        const fx = b.left + f.clientLeft + pl + ox, fy = b.top + f.clientTop + pt + oy;
        let c = [fx, fy, fx + Math.max(0, f.clientWidth - pl - pr), fy + Math.max(0, f.clientHeight - pt - pb)];
        if (clip) c = [Math.max(c[0], clip[0]), Math.max(c[1], clip[1]), Math.min(c[2], clip[2]), Math.min(c[3], clip[3])];
        walk(d, fx, fy, c, depth + 1);
      }
    }
  };
  walk(document, 0, 0, null, 0);
  return {dpr: window.devicePixelRatio, sx: window.scrollX, sy: window.scrollY, rects, many};
}"#;

/// [`super::Browser::evaluate`]: `expression` in the page of the tab (named, or the only one),
/// in the page's own world; its value.
pub async fn evaluate(
    session: &Session,
    tabs: &mut Tabs,
    tab: Option<&str>,
    expression: &str,
) -> Result<Value, BrowserError> {
    let cdp = &session.cdp;
    let target = pick_tab(cdp, tab).await?;
    let s = attach(cdp, tabs, &target).await?.cdp_session.clone();
    let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": true});
    let got = call(cdp, &s, "Runtime.evaluate", params).await?;
    if let Some(e) = got.get("exceptionDetails") {
        let why = e["exception"]["description"].as_str().or(e["text"].as_str()).unwrap_or("an exception");
        return Err(failed(format!("the expression failed: {why}")));
    }
    Ok(got["result"]["value"].clone())
}

/// Signed in, as the probes show it, on a scratch tab of the same profile (the session's tabs
/// and their refs are left alone). Cookie values are never read out: only how many exist.
async fn session_status(session: &Session, r: &browser::StatusRequest) -> Result<Value, BrowserError> {
    let cdp = &session.cdp;
    let timeout = r.timeout_ms.unwrap_or(browser::DEFAULT_WAIT_MS);
    let made =
        cdp.call(None, "Target.createTarget", json!({"url": "about:blank", "background": true}), COMMAND).await?;
    let target = made["targetId"].as_str().ok_or_else(|| failed("the browser made no tab"))?.to_string();
    let mut scratch = Tabs::default();
    let result = async {
        attach(cdp, &mut scratch, &target).await?;
        let s = scratch.attached.get(&target).map(|t| t.cdp_session.clone()).unwrap_or_default();
        let cookies = call(cdp, &s, "Network.getCookies", json!({"urls": [format!("{}/", r.origin)]})).await?;
        let cookie_count = cookies["cookies"].as_array().map_or(0, Vec::len);
        let page = r.probes.page.clone().unwrap_or_else(|| format!("{}/", r.origin));
        let at_page = navigate(session, &mut scratch, &target, &page, timeout).await?;
        let probe = json!({"selector": r.probes.signed_in_selector, "text": r.probes.signed_in_text});
        let expr = format!(
            "(p => {{ const el = p.selector ? document.querySelector(p.selector) : null; const body = (document.body && document.body.innerText) || ''; const found = p.selector ? !!el : body.includes(p.text); const shown = el ? el.innerText : body; return {{found, shown: shown.slice(0, 4096)}}; }})({probe})"
        );
        let got = call(cdp, &s, "Runtime.evaluate", json!({"expression": expr, "returnByValue": true})).await?;
        let found = got["result"]["value"]["found"] == Value::Bool(true);
        let shown = got["result"]["value"]["shown"].as_str().unwrap_or_default().to_string();
        let signed_in = found && cookie_count > 0;
        let account_matches = r.probes.account.as_ref().map(|a| signed_in && shown.contains(a.as_str()));
        let project = match &r.probes.project_url {
            Some(u) => {
                let at = navigate(session, &mut scratch, &target, u, timeout).await?;
                let ok = at["loaded"] == Value::Bool(true)
                    && at["status"].as_u64().is_some_and(|c| (200..300).contains(&c))
                    && same_page(at["url"].as_str().unwrap_or_default(), u);
                Some((ok, at))
            }
            None => None,
        };
        Ok::<Value, BrowserError>(json!({
            "signedIn": signed_in,
            "accountMatches": account_matches,
            "projectAccessible": project.as_ref().map(|p| p.0),
            "cookies": cookie_count,
            "page": {"url": at_page["url"], "status": at_page["status"]},
            "project": project.map(|p| json!({"url": p.1["url"], "status": p.1["status"]})),
        }))
    }
    .await;
    let _ = cdp.call(None, "Target.closeTarget", json!({"targetId": target}), COMMAND).await;
    // The browser answers the close before its target list drops the tab: wait (briefly) until
    // it has, so the next tool does not find a second tab in the session.
    for _ in 0..100 {
        match tab_list(cdp).await {
            Ok(pages) if pages.iter().any(|p| p["tab"].as_str() == Some(target.as_str())) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            _ => break,
        }
    }
    result
}

/// Whether a load ended on the page asked for (the fragment aside), not redirected elsewhere.
fn same_page(got: &str, want: &str) -> bool {
    let strip = |u: &str| u.split('#').next().unwrap_or("").trim_end_matches('/').to_string();
    strip(got) == strip(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, parent: Option<&str>, role: &str, name: &str, backend: i64, children: &[&str]) -> Value {
        let mut n = json!({"nodeId": id, "role": {"value": role}, "name": {"value": name}, "backendDOMNodeId": backend, "childIds": children, "ignored": false});
        if let Some(p) = parent {
            n["parentId"] = json!(p);
        }
        n
    }

    #[test]
    fn a_listing_skips_structure_and_repeated_text() {
        let mut heading = node("3", Some("2"), "heading", "Projects", 12, &["4"]);
        heading["properties"] = json!([{"name": "level", "value": {"type": "integer", "value": 1}}]);
        let nodes = vec![
            node("1", None, "RootWebArea", "Projects", 10, &["2"]),
            node("2", Some("1"), "generic", "", 11, &["3", "5", "7"]),
            heading,
            node("4", Some("3"), "StaticText", "Projects", 13, &[]),
            node("5", Some("2"), "link", "Project A", 14, &["6"]),
            node("6", Some("5"), "StaticText", "Project A", 15, &[]),
            node("7", Some("2"), "StaticText", "Pick one", 16, &[]),
        ];
        let (l, truncated) = listing(&nodes, None, 100);
        assert!(!truncated);
        let lines: Vec<String> = l.iter().map(|x| line(x, x.backend.map(|b| b as u32))).collect();
        assert_eq!(
            lines,
            vec![
                "- heading \"Projects\" [level=1] [ref=e12]".to_string(),
                "- link \"Project A\" [ref=e14]".to_string(),
                "- text \"Pick one\"".to_string(),
            ]
        );
        let (l, truncated) = listing(&nodes, None, 1);
        assert_eq!((l.len(), truncated), (1, true));
        let (l, _) = listing(&nodes, Some(14), 100);
        assert_eq!(l.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(), vec!["Project A"], "a subtree");
    }

    #[test]
    fn keys_parse() {
        let k = parse_keys("ctrl+l").expect("ctrl+l");
        assert_eq!((k.key.as_str(), k.code.as_str(), k.vk, k.modifiers, k.text.as_str()), ("l", "KeyL", 76, 2, ""));
        let k = parse_keys("Enter").expect("Enter");
        assert_eq!((k.key.as_str(), k.text.as_str()), ("Enter", "\r"));
        assert_eq!(parse_keys("shift+a").expect("A").text, "A");
        assert!(parse_keys("hyper+a").is_err());
        assert!(parse_keys("ab").is_err());
        assert_eq!(parse_keys("F5").expect("F5").vk, 116);
    }

    #[test]
    fn a_lost_request_in_the_window_makes_the_outcome_unknown() {
        use super::super::wire::Entry;
        use super::super::wire::Fate;
        let e = |seq: u64, fate: Fate| Entry { seq, method: "GET".into(), url: format!("http://s/{seq}"), fate };
        let mut answer = json!({"outcome": {"state": "done", "navigated": true, "status": 502}});
        let mut sent: Vec<Entry> = (1..=40).map(|i| e(i, Fate::Status(200))).collect();
        sent.push(Entry { seq: 41, method: "POST".into(), url: "http://s/submit".into(), fate: Fate::NoAnswer });
        note_requests(&mut answer, &sent, false);
        assert_eq!(answer["outcome"]["state"], "unknown", "{answer}");
        assert!(answer["outcome"]["error"].as_str().is_some_and(|m| m.contains("POST http://s/submit")), "{answer}");
        let listed = answer["requests"].as_array().expect("requests");
        assert_eq!(listed.len(), super::super::wire::WINDOW_MAX);
        assert_eq!(listed.last(), Some(&json!({"method": "POST", "url": "http://s/submit", "result": "no answer"})));
        assert_eq!(answer["requestsTruncated"], true);
        let mut answer = json!({"outcome": {"state": "done", "navigated": false}});
        note_requests(&mut answer, &[e(1, Fate::Status(303)), e(2, Fate::Tunnel)], false);
        assert_eq!(answer["outcome"]["state"], "done");
        assert_eq!(answer["requestsTruncated"], false);
        assert_eq!(answer["requests"][1], json!({"method": "GET", "url": "http://s/2", "result": "tunnel"}));
        // Still unanswered at the end of the wait: a GET changes nothing; a POST may have.
        let mut answer = json!({"outcome": {"state": "done", "navigated": false}});
        note_requests(&mut answer, &[e(1, Fate::Pending)], false);
        assert_eq!(answer["outcome"]["state"], "done", "{answer}");
        let pending_post = Entry { seq: 2, method: "POST".into(), url: "http://s/api".into(), fate: Fate::Pending };
        note_requests(&mut answer, &[e(1, Fate::Pending), pending_post], false);
        assert_eq!(answer["outcome"]["state"], "unknown", "{answer}");
        assert!(answer["outcome"]["error"].as_str().is_some_and(|m| m.contains("had not come")), "{answer}");
    }

    #[test]
    fn origins_are_normalised() {
        for (u, want) in [
            ("HTTPS://Example.COM:443/login?x#y", Some("https://example.com")),
            ("http://example.com:80", Some("http://example.com")),
            ("http://example.com:443/", Some("http://example.com:443")),
            ("https://example.com:8443", Some("https://example.com:8443")),
            ("http://127.0.0.1:0080/", Some("http://127.0.0.1")),
            ("http://[::1]:8080/a", Some("http://[::1]:8080")),
            ("http://[::1]/", Some("http://[::1]")),
            ("null", None),
            ("about:blank", None),
            ("data:text/html,x", None),
            ("javascript:alert(1)", None),
            ("http://example.com:99999/", None),
            ("http://u:p@example.com/", None),
        ] {
            assert_eq!(origin(u).as_deref(), want, "{u}");
        }
    }

    #[test]
    fn a_painted_screenshot_is_black_where_told_and_keeps_its_format() {
        let mut img = image::RgbImage::from_pixel(40, 20, image::Rgb([255, 255, 255]));
        img.put_pixel(39, 19, image::Rgb([10, 200, 30]));
        let mut png = Vec::new();
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .expect("png");
        // Scale 2: CSS (5, 2) 4x3 is pixels (6, 0)..(22, 14) with the margin.
        let cover = Cover { rects: vec![[5.0, 2.0, 4.0, 3.0]], everything: false, scale: 2.0 };
        let out = paint_over(&png, false, None, &cover).expect("painted");
        assert_eq!(image::guess_format(&out).expect("a format"), image::ImageFormat::Png);
        let back = image::load_from_memory(&out).expect("decodes").into_rgba8();
        assert_eq!(back.dimensions(), (40, 20));
        assert_eq!(back.get_pixel(6, 0).0, [0, 0, 0, 255]);
        assert_eq!(back.get_pixel(21, 13).0, [0, 0, 0, 255]);
        assert_eq!(back.get_pixel(22, 14).0, [255, 255, 255, 255]);
        assert_eq!(back.get_pixel(5, 5).0, [255, 255, 255, 255]);
        assert_eq!(back.get_pixel(39, 19).0, [10, 200, 30, 255]);
        let mut jpeg = Vec::new();
        image::DynamicImage::ImageRgba8(back)
            .into_rgb8()
            .write_to(&mut std::io::Cursor::new(&mut jpeg), image::ImageFormat::Jpeg)
            .expect("jpeg");
        let out = paint_over(&jpeg, true, Some(90), &Cover { rects: Vec::new(), everything: true, scale: 1.0 })
            .expect("painted");
        assert_eq!(image::guess_format(&out).expect("a format"), image::ImageFormat::Jpeg);
        let back = image::load_from_memory(&out).expect("decodes").into_rgb8();
        assert!(back.pixels().all(|p| p.0.iter().all(|c| *c < 16)), "all black");
        assert!(paint_over(b"not an image", false, None, &cover).is_err());
    }

    #[test]
    fn a_redirect_is_not_the_page() {
        assert!(same_page("http://s/projects/b/documents", "http://s/projects/b/documents#x"));
        assert!(!same_page("http://s/login?next=/projects/b/documents", "http://s/projects/b/documents"));
    }
}
