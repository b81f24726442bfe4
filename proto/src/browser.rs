//! The shapes of browser calls, shared by the node (which checks a request before it leaves and
//! keeps the action records) and the agent (which owns the browser and acts over CDP). A call
//! travels as JSON in [`crate::agent::DesktopCall`] through the agent's `Browser` RPC; a
//! screenshot's image travels as bytes beside its JSON.
//!
//! Every tool names its browser session (`session`) and, when the session has more than one
//! tab, the tab (`tab`, a CDP target id). Element tools name an element by a `ref` from the
//! tab's latest snapshot (`e12`); the agent checks that it still names the same element before
//! anything reaches the page.

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

/// At most this many characters typed by one `type`.
pub const MAX_TEXT: usize = 16 * 1024;
/// At most this many files in one `upload`.
pub const MAX_FILES: usize = 16;
/// An uploaded file is at most this large.
pub const MAX_UPLOAD_BYTES: u64 = 16 * 1024 * 1024;
/// A snapshot lists at most this many elements (and `maxElements` at most this).
pub const MAX_ELEMENTS: usize = 20_000;
/// How long a tool waits for a page at most (`timeoutMs`).
pub const MAX_WAIT_MS: u64 = 60_000;
/// The default wait for a load.
pub const DEFAULT_WAIT_MS: u64 = 15_000;
/// An `actionId` is at most this long.
pub const MAX_ACTION_ID: usize = 128;

/// The two ways a browser runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Headless: nobody sees it.
    #[default]
    Automation,
    /// Headed on the Computer's desktop, so a person can watch and take control through the
    /// desktop's stream; its tools take the Computer's input lease.
    Takeover,
}

/// `POST …/browser/sessions`: start a browser.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenRequest {
    /// Headless or on the desktop.
    #[serde(default)]
    pub mode: Mode,
    /// The profile (cookies, storage) it uses: a name of `[A-Za-z0-9_-]{1,64}`, `default` when
    /// absent. One live session per profile.
    #[serde(default)]
    pub profile: Option<String>,
    /// A first page to load.
    #[serde(default)]
    pub url: Option<String>,
}

/// Which session and tab a tool acts on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TabRequest {
    /// The browser session.
    pub session: String,
    /// The tab (required when the session has more than one).
    #[serde(default)]
    pub tab: Option<String>,
}

/// What an acting tool may carry for its action record (the node keeps it; the agent ignores it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionMeta {
    /// The caller's id of this action: the same id is never dispatched twice.
    #[serde(default)]
    pub action_id: Option<String>,
    /// The run it belongs to.
    #[serde(default)]
    pub run_id: Option<String>,
    /// The claim of the run's attempt that acts: the action is taken only while this claim
    /// holds the run's lease (`LeaseLost` otherwise). Required with `runId`.
    #[serde(default)]
    pub run_claim: Option<String>,
    /// What the action is meant to do, in words.
    #[serde(default)]
    pub intent: Option<String>,
    /// What the caller knows (a file's SHA-256, the account, the project, the documents seen
    /// before), kept with the record.
    #[serde(default)]
    pub evidence: Option<Value>,
}

macro_rules! tool_request {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        pub struct $name {
            /// The browser session.
            pub session: String,
            /// The tab (required when the session has more than one).
            #[serde(default)]
            pub tab: Option<String>,
            $($(#[$fdoc])* #[serde(default)] pub $field: $ty,)*
        }
    };
}

tool_request!(
    /// `navigate`: load a URL (http, https or about:blank) and wait for its load.
    NavigateRequest {
        /// The URL.
        url: String,
        /// How long to wait for the load (ms).
        timeout_ms: Option<u64>,
    }
);

tool_request!(
    /// `snapshot`: the tab's accessibility tree with refs.
    SnapshotRequest {
        /// At most this many elements.
        max_elements: Option<usize>,
        /// Only the subtree of this ref (from the latest snapshot).
        root: Option<String>,
        /// `text` (default) or `json` (each element as an object too).
        format: Option<String>,
    }
);

tool_request!(
    /// `click`, `hover`: an element by ref.
    RefRequest {
        /// The element.
        r#ref: String,
        /// How long to wait for a page load the click starts (ms).
        timeout_ms: Option<u64>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
    }
);

tool_request!(
    /// `type`: replace an input's text, optionally pressing Enter after.
    TypeRequest {
        /// The element.
        r#ref: String,
        /// The text.
        text: String,
        /// Press Enter after.
        submit: bool,
        /// How long to wait for a page load the submit starts (ms).
        timeout_ms: Option<u64>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
    }
);

tool_request!(
    /// `press`: a key or a combination (`Enter`, `ctrl+l`, `shift+Tab`) on the focused element.
    PressRequest {
        /// The keys.
        keys: String,
        /// How long to wait for a page load the key starts (ms).
        timeout_ms: Option<u64>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
    }
);

tool_request!(
    /// `select`: choose options of a `<select>` by value or label.
    SelectRequest {
        /// The element.
        r#ref: String,
        /// The options.
        values: Vec<String>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
    }
);

tool_request!(
    /// `upload`: set a file input's files from files under `/workspace`.
    UploadRequest {
        /// The file input (or the ref listed for a hidden one).
        r#ref: String,
        /// Absolute paths under `/workspace`.
        paths: Vec<String>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
    }
);

tool_request!(
    /// `screenshot`: the viewport, the whole page or one element.
    ShotRequest {
        /// The whole page (at most 16,384 pixels high).
        full_page: bool,
        /// Only this element.
        r#ref: Option<String>,
        /// `png` (default) or `jpeg`.
        format: Option<String>,
        /// JPEG quality 1..=100.
        quality: Option<u8>,
    }
);

tool_request!(
    /// `dialog`: answer the tab's pending JavaScript dialog (`alert`, `confirm`, `prompt`,
    /// `beforeunload`): accept it (OK; for a prompt, with `text`) or dismiss it (Cancel).
    DialogRequest {
        /// OK (`true`) or Cancel (`false`).
        accept: bool,
        /// A prompt's answer (with `accept`).
        text: Option<String>,
        /// How long to wait for a page load answering it starts (ms).
        timeout_ms: Option<u64>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
    }
);

tool_request!(
    /// `fill_secret`: type a vault secret into a field by its ref. The caller names the secret;
    /// the node that holds the Computer's link opens it and adds `fill` (a caller's `fill` is
    /// refused), so the value reaches the agent only for this call.
    FillSecretRequest {
        /// The field.
        r#ref: String,
        /// The secret's name in the vault.
        secret: String,
        /// Press Enter after.
        submit: bool,
        /// How long to wait for a page load the submit starts (ms).
        timeout_ms: Option<u64>,
        /// The action record.
        action_id: Option<String>,
        /// The run.
        run_id: Option<String>,
        /// The claim of the run's attempt that acts (it must hold the run's lease).
        run_claim: Option<String>,
        /// The intent.
        intent: Option<String>,
        /// The evidence.
        evidence: Option<Value>,
        /// Set by the node only: the opened secret.
        fill: Option<SecretFill>,
    }
);

/// What the node adds to a `fill_secret` for the agent: the opened value and the checks it
/// must make before typing it.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretFill {
    /// `password`, `totp` (the value is then the current one-time code, never the seed) or
    /// `text`.
    pub kind: String,
    /// The origins (`https://host[:port]`) whose pages may receive it.
    pub origins: Vec<String>,
    /// The value to type.
    pub value: SecretText,
}

impl std::fmt::Debug for SecretFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFill").field("kind", &self.kind).field("origins", &self.origins).finish_non_exhaustive()
    }
}

/// A secret's clear text: never printed by `Debug` or `Display`, zeroed when dropped.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(String);

impl SecretText {
    /// Wraps a clear value.
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The clear value, for typing it and masking it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretText(redacted)")
    }
}

impl Drop for SecretText {
    fn drop(&mut self) {
        // SAFETY: zero bytes are valid UTF-8; the string is not read after this.
        for b in unsafe { self.0.as_bytes_mut() } {
            // A volatile write the optimiser keeps.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// The probes of `session_status`: a site has no standard signal of who is signed in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probes {
    /// A page that shows who is signed in (default: the origin's `/`).
    #[serde(default)]
    pub page: Option<String>,
    /// A CSS selector present only when signed in; its text shows the account.
    #[serde(default)]
    pub signed_in_selector: Option<String>,
    /// A text present only when signed in.
    #[serde(default)]
    pub signed_in_text: Option<String>,
    /// The account expected in the selector's text (or in the page's text).
    #[serde(default)]
    pub account: Option<String>,
    /// A project URL whose load must end there with a 2xx (not redirected to a login).
    #[serde(default)]
    pub project_url: Option<String>,
}

tool_request!(
    /// `session_status`: whether the profile is signed in to `origin`, as the probes show it.
    StatusRequest {
        /// `https://host[:port]`.
        origin: String,
        /// The probes.
        probes: Probes,
        /// How long each page may take (ms).
        timeout_ms: Option<u64>,
    }
);

/// One browser call from node to agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", content = "args", rename_all = "snake_case")]
pub enum BrowserOp {
    /// Start a session.
    Open(OpenRequest),
    /// End a session.
    Close(TabRequest),
    /// The sessions and their tabs.
    List,
    /// Load a URL.
    Navigate(NavigateRequest),
    /// The accessibility tree with refs.
    Snapshot(SnapshotRequest),
    /// Click an element.
    Click(RefRequest),
    /// Move the pointer over an element.
    Hover(RefRequest),
    /// Type into an element.
    Type(TypeRequest),
    /// Press keys.
    Press(PressRequest),
    /// Choose options.
    Select(SelectRequest),
    /// Set a file input's files.
    Upload(UploadRequest),
    /// A screenshot.
    Screenshot(ShotRequest),
    /// Signed in, right account, project reachable.
    SessionStatus(StatusRequest),
    /// Answer a pending JavaScript dialog.
    Dialog(DialogRequest),
    /// Type a vault secret into a field.
    FillSecret(FillSecretRequest),
}

impl BrowserOp {
    /// The tool's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Open(_) => "open",
            Self::Close(_) => "close",
            Self::List => "list",
            Self::Navigate(_) => "navigate",
            Self::Snapshot(_) => "snapshot",
            Self::Click(_) => "click",
            Self::Hover(_) => "hover",
            Self::Type(_) => "type",
            Self::Press(_) => "press",
            Self::Select(_) => "select",
            Self::Upload(_) => "upload",
            Self::Screenshot(_) => "screenshot",
            Self::SessionStatus(_) => "session_status",
            Self::Dialog(_) => "dialog",
            Self::FillSecret(_) => "fill_secret",
        }
    }

    /// The action record fields of a tool that may change something outside the Computer.
    pub fn action(&self) -> Option<ActionMeta> {
        macro_rules! meta {
            ($r:expr) => {
                Some(ActionMeta {
                    action_id: $r.action_id.clone(),
                    run_id: $r.run_id.clone(),
                    run_claim: $r.run_claim.clone(),
                    intent: $r.intent.clone(),
                    evidence: $r.evidence.clone(),
                })
            };
        }
        match self {
            Self::Click(r) => meta!(r),
            Self::Type(r) => meta!(r),
            Self::Press(r) => meta!(r),
            Self::Select(r) => meta!(r),
            Self::Upload(r) => meta!(r),
            Self::Dialog(r) => meta!(r),
            Self::FillSecret(r) => meta!(r),
            _ => None,
        }
    }

    /// How long it waits for what it started (`timeoutMs`), where it takes one.
    pub fn timeout_ms(&self) -> Option<u64> {
        match self {
            Self::Navigate(r) => r.timeout_ms,
            Self::Click(r) | Self::Hover(r) => r.timeout_ms,
            Self::Type(r) => r.timeout_ms,
            Self::Press(r) => r.timeout_ms,
            Self::FillSecret(r) => r.timeout_ms,
            _ => None,
        }
    }

    /// The session it names, if any.
    pub fn session(&self) -> Option<&str> {
        Some(match self {
            Self::Open(_) | Self::List => return None,
            Self::Close(r) => &r.session,
            Self::Navigate(r) => &r.session,
            Self::Snapshot(r) => &r.session,
            Self::Click(r) | Self::Hover(r) => &r.session,
            Self::Type(r) => &r.session,
            Self::Press(r) => &r.session,
            Self::Select(r) => &r.session,
            Self::Upload(r) => &r.session,
            Self::Screenshot(r) => &r.session,
            Self::SessionStatus(r) => &r.session,
            Self::Dialog(r) => &r.session,
            Self::FillSecret(r) => &r.session,
        })
    }

    /// What can be checked without the browser: lengths, counts, URLs, waits.
    pub fn check(&self) -> Result<(), String> {
        if let Some(s) = self.session()
            && s.is_empty()
        {
            return Err("name the browser session (`session`)".into());
        }
        if let Some(a) = self.action() {
            check_action_meta(&a)?;
        }
        let wait = |t: Option<u64>| match t {
            Some(t) if t == 0 || t > MAX_WAIT_MS => Err(format!("timeoutMs must be in 1..={MAX_WAIT_MS}")),
            _ => Ok(()),
        };
        match self {
            Self::Open(r) => {
                if let Some(p) = &r.profile {
                    check_profile(p)?;
                }
                if let Some(u) = &r.url {
                    check_url(u)?;
                }
            }
            Self::Navigate(r) => {
                check_url(&r.url)?;
                wait(r.timeout_ms)?;
            }
            Self::Snapshot(r) => {
                if let Some(n) = r.max_elements
                    && (n == 0 || n > MAX_ELEMENTS)
                {
                    return Err(format!("maxElements must be in 1..={MAX_ELEMENTS}"));
                }
                if let Some(f) = &r.format
                    && f != "text"
                    && f != "json"
                {
                    return Err("format is `text` or `json`".into());
                }
                if let Some(root) = &r.root {
                    check_ref(root)?;
                }
            }
            Self::Click(r) | Self::Hover(r) => {
                check_ref(&r.r#ref)?;
                wait(r.timeout_ms)?;
            }
            Self::Type(r) => {
                check_ref(&r.r#ref)?;
                if r.text.chars().count() > MAX_TEXT {
                    return Err(format!("text is over {MAX_TEXT} characters"));
                }
                wait(r.timeout_ms)?;
            }
            Self::Press(r) => {
                if r.keys.trim().is_empty() {
                    return Err("name the keys (`Enter`, `ctrl+l`)".into());
                }
                wait(r.timeout_ms)?;
            }
            Self::Select(r) => {
                check_ref(&r.r#ref)?;
                if r.values.is_empty() || r.values.len() > 64 {
                    return Err("values names 1 to 64 options".into());
                }
            }
            Self::Upload(r) => {
                check_ref(&r.r#ref)?;
                if r.paths.is_empty() || r.paths.len() > MAX_FILES {
                    return Err(format!("paths names 1 to {MAX_FILES} files"));
                }
            }
            Self::Screenshot(r) => {
                if let Some(x) = &r.r#ref {
                    check_ref(x)?;
                }
                match r.format.as_deref() {
                    None | Some("png") => {
                        if r.quality.is_some() {
                            return Err("quality is for jpeg only".into());
                        }
                    }
                    Some("jpeg") => {
                        if r.quality.is_some_and(|q| !(1..=100).contains(&q)) {
                            return Err("quality must be in 1..=100".into());
                        }
                    }
                    Some(_) => return Err("format is `png` or `jpeg`".into()),
                }
                if r.full_page && r.r#ref.is_some() {
                    return Err("fullPage and ref exclude each other".into());
                }
            }
            Self::SessionStatus(r) => {
                let origin = check_url(&r.origin)?;
                if r.origin.trim_end_matches('/').to_ascii_lowercase() != origin {
                    return Err("origin is a scheme, a host and a port only (`https://example.com`)".into());
                }
                for u in [&r.probes.page, &r.probes.project_url].into_iter().flatten() {
                    check_url(u)?;
                    if origin_of(u).as_deref() != Some(origin.as_str()) {
                        return Err(format!("{u} is not on {origin}"));
                    }
                }
                if r.probes.signed_in_selector.is_none() && r.probes.signed_in_text.is_none() {
                    return Err("give a probe: signedInSelector or signedInText".into());
                }
                wait(r.timeout_ms)?;
            }
            Self::Dialog(r) => {
                if r.text.as_ref().is_some_and(|t| t.chars().count() > MAX_TEXT) {
                    return Err(format!("text is over {MAX_TEXT} characters"));
                }
                if r.text.is_some() && !r.accept {
                    return Err("text answers a prompt: it goes with accept: true".into());
                }
                wait(r.timeout_ms)?;
            }
            Self::FillSecret(r) => {
                check_ref(&r.r#ref)?;
                check_secret_name(&r.secret)?;
                wait(r.timeout_ms)?;
            }
            Self::Close(_) | Self::List => {}
        }
        Ok(())
    }
}

/// The most bytes of a secret's name.
pub const MAX_SECRET_NAME: usize = 64;

/// A vault secret's name: 1 to 64 of `[a-z0-9._-]`, starting with a letter or digit.
pub fn check_secret_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SECRET_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!("a secret's name is 1 to {MAX_SECRET_NAME} of [a-z0-9._-], starting with a letter or digit"))
    }
}

fn check_action_meta(a: &ActionMeta) -> Result<(), String> {
    if let Some(id) = &a.action_id
        && (id.is_empty()
            || id.len() > MAX_ACTION_ID
            || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)))
    {
        return Err(format!("actionId is 1 to {MAX_ACTION_ID} of [A-Za-z0-9-_.:]"));
    }
    if a.action_id.is_none() && (a.run_id.is_some() || a.intent.is_some() || a.evidence.is_some()) {
        return Err("runId, intent and evidence go with an actionId".into());
    }
    if a.run_id.is_some() != a.run_claim.is_some() {
        return Err("runId and runClaim go together: an action of a run names the claim that holds it".into());
    }
    if a.intent.as_ref().is_some_and(|i| i.len() > 1024) {
        return Err("intent is at most 1,024 bytes".into());
    }
    if a.evidence.as_ref().is_some_and(|e| e.to_string().len() > 16 * 1024) {
        return Err("evidence is at most 16 KiB of JSON".into());
    }
    Ok(())
}

/// A profile's name.
pub fn check_profile(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > 64 || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err("a profile is named by 1 to 64 of [A-Za-z0-9_-]".into());
    }
    Ok(())
}

/// A ref: `e` and a number.
pub fn check_ref(r: &str) -> Result<(), String> {
    match r.strip_prefix('e').map(|n| n.parse::<u32>()) {
        Some(Ok(_)) => Ok(()),
        _ => Err(format!("{r:?} is not a ref (`e12`, from a snapshot)")),
    }
}

/// A URL the browser may load: `http`, `https` or `about:blank` (never `file:`, `chrome:` or
/// `javascript:`). Answers its origin (empty for about:blank).
pub fn check_url(u: &str) -> Result<String, String> {
    if u == "about:blank" {
        return Ok(String::new());
    }
    if u.len() > 8192 {
        return Err("a URL is at most 8,192 bytes".into());
    }
    origin_of(u).ok_or_else(|| format!("{u:?} is not an http or https URL"))
}

/// `scheme://host[:port]` of an http(s) URL, lowercased.
pub fn origin_of(u: &str) -> Option<String> {
    let (scheme, rest) = u.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') || authority.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return None;
    }
    Some(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_origins() {
        assert_eq!(check_url("https://Example.com:8443/a?b#c").as_deref(), Ok("https://example.com:8443"));
        assert_eq!(check_url("about:blank").as_deref(), Ok(""));
        for bad in
            ["file:///etc/passwd", "javascript:alert(1)", "chrome://settings", "http://", "http://u:p@h/", "ftp://x"]
        {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_are_checked_before_they_leave() {
        let op: BrowserOp = serde_json::from_value(
            serde_json::json!({"op": "click", "args": {"session": "b1", "ref": "e3", "actionId": "a-1"}}),
        )
        .expect("parse");
        assert_eq!(op.check(), Ok(()));
        assert_eq!(op.action().and_then(|a| a.action_id).as_deref(), Some("a-1"));
        let bad = BrowserOp::Click(RefRequest { session: "b1".into(), r#ref: "12".into(), ..Default::default() });
        assert!(bad.check().is_err(), "a ref is e<n>");
        let bad = BrowserOp::Click(RefRequest {
            session: "b1".into(),
            r#ref: "e1".into(),
            action_id: Some("a b".into()),
            ..Default::default()
        });
        assert!(bad.check().is_err(), "an action id has no spaces");
        let bad = BrowserOp::Click(RefRequest {
            session: "b1".into(),
            r#ref: "e1".into(),
            intent: Some("x".into()),
            ..Default::default()
        });
        assert!(bad.check().is_err(), "intent needs an action id");
        let probes = Probes {
            signed_in_selector: Some("#who".into()),
            project_url: Some("http://other/x".into()),
            ..Default::default()
        };
        let bad = BrowserOp::SessionStatus(StatusRequest {
            session: "b1".into(),
            origin: "http://site:8080".into(),
            probes,
            ..Default::default()
        });
        assert!(bad.check().is_err(), "probes stay on the origin");
        let bad = BrowserOp::SessionStatus(StatusRequest {
            session: "b1".into(),
            origin: "http://site:8080/path".into(),
            probes: Probes { signed_in_text: Some("x".into()), ..Default::default() },
            ..Default::default()
        });
        assert!(bad.check().is_err(), "an origin has no path");
        assert!(
            serde_json::from_str::<NavigateRequest>(r#"{"session": "b", "url": "http://x/", "bogus": 1}"#).is_err()
        );
    }
}
