//! The browser of a Computer, owned by the agent: Chromium from the image, driven over CDP on a
//! pipe ([`cdp`]), one process per browser session.
//!
//! - A session has an id (`b-` and 16 random hex digits, never reused) and a mode: `automation`
//!   (headless) or `takeover` (headed on the Computer's desktop, so a person watching the stream
//!   sees it and can take control). A tool naming a session that is gone fails `NotFound`; a
//!   new, empty browser is never taken for it.
//! - Its profile (`<root>/profiles/<name>`) is a directory in the Computer, the desktop account's,
//!   0700: it survives a pause and the session, and no session as `user` reads its cookies. No
//!   tool returns a cookie.
//! - Chromium runs as the desktop's account with `--no-sandbox`. Its own sandbox needs user
//!   namespaces (or a set-uid helper), which the sandbox container's seccomp profile and dropped
//!   capabilities forbid; granting them to the container would weaken the boundary every session
//!   relies on. So the boundary is the container plus the account: the browser runs as neither
//!   root nor `user`, its profile and uploads are its own, and CDP is a pipe only the agent holds.
//! - In takeover mode the acting tools take the Computer's input lease in the caller's name, so
//!   a person controlling the desktop blocks them (`InputBusy`). A headless browser is not on the
//!   display the lease guards, so its tools do not take it.
//! - Calls on one session are served one at a time.
//! - Its Chromium reaches the network through the session's wire guard ([`wire`]), a proxy that
//!   never sends a request twice: a recorded action's answer lists the requests it sent
//!   (`requests`), and one whose answer was lost makes its outcome `unknown`.
//! - `fill_secret` types a vault secret the node opened into a field, after checking the page's
//!   origin and the field; the session then masks its value in every answer, error and
//!   screenshot ([`secrets`]).

pub mod cdp;
pub mod download;
pub mod page;
pub mod secrets;
pub mod upload;
pub mod wire;
pub mod wire_tls;

use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use computerd_proto::ErrorKind;
use computerd_proto::browser::BrowserOp;
use computerd_proto::browser::Mode;
use computerd_proto::browser::OpenRequest;
use serde_json::Value;
use serde_json::json;

use crate::desktop::Desktop;
use crate::users::Account;
use cdp::Cdp;

/// The browser's directory in the Computer (profiles, staged uploads, its home).
pub const ROOT: &str = "/var/lib/computerd-browser";
/// At most this many sessions at once.
pub const MAX_SESSIONS: usize = 4;
/// Staged uploads of one session take at most this much.
pub const MAX_STAGED: u64 = 256 * 1024 * 1024;
/// How long a CDP command may take (beyond a tool's own waits).
pub const COMMAND: Duration = Duration::from_secs(10);
/// After a recorded action's outcome is settled, how long the requests it sent may take to be
/// answered before its answer lists them as `pending`; a request that may change something (not
/// `GET`, `HEAD` or `OPTIONS`) is waited for until the action's `timeoutMs`, and still pending
/// then makes the outcome `unknown`.
pub const REQUESTS_SETTLE: Duration = Duration::from_secs(1);

/// A failed browser call.
#[derive(Debug, Clone, PartialEq)]
pub struct BrowserError {
    /// The API's kind.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
}

impl BrowserError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
    /// A refused request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }
    /// A stale ref.
    pub fn stale(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::StaleRef, format!("{}; take a new snapshot", message.into()))
    }
}

impl From<cdp::CdpError> for BrowserError {
    fn from(e: cdp::CdpError) -> Self {
        match e {
            cdp::CdpError::Closed => {
                BrowserError::new(ErrorKind::Unavailable, "the browser has stopped; open a new session")
            }
            cdp::CdpError::Timeout => BrowserError::new(ErrorKind::DeadlineExceeded, e.to_string()),
            cdp::CdpError::Protocol(_) => BrowserError::new(ErrorKind::ComputerExecutionFailed, e.to_string()),
        }
    }
}

/// An answer: JSON and, for a screenshot, the image.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The JSON.
    pub json: Value,
    /// The image (empty without one).
    pub image: Vec<u8>,
}

/// One browser process and what the agent knows of its tabs.
pub struct Session {
    /// `b-…`.
    pub id: String,
    /// Headless or on the desktop.
    pub mode: Mode,
    /// Its profile's name.
    pub profile: String,
    /// The connection.
    pub cdp: Cdp,
    child: tokio::sync::Mutex<tokio::process::Child>,
    /// The tabs attached so far, and their refs; held for a whole call (one call at a time).
    pub tabs: tokio::sync::Mutex<page::Tabs>,
    /// Where its uploads are copied.
    pub stage_dir: PathBuf,
    /// That directory, open (uploads are copied into it through this descriptor, never through a
    /// path the browser's account could redirect).
    pub stage_fd: std::os::fd::OwnedFd,
    /// Its wire guard (None only when turned off for a test: [`Browser::set_wire_guard`]).
    pub wire: Option<wire::Wire>,
    /// The JavaScript dialogs open now, by the tab's CDP session: kept by [`page::watch_dialogs`]
    /// from the browser's events (a dialog blocks the page's script, and CDP has no call that
    /// tells one is open).
    pub dialogs: page::Dialogs,
    /// The downloads its pages started ([`download`]).
    pub downloads: download::Downloads,
    /// The vault secrets filled in its tabs, masked in its answers ([`secrets`]).
    pub secrets: secrets::Filled,
}

/// The browser of this Computer; clones share it.
#[derive(Clone)]
pub struct Browser {
    inner: Arc<Inner>,
}

struct Inner {
    chromium: PathBuf,
    account: Account,
    root: PathBuf,
    /// Uploads are taken from under this directory only (the workspace).
    uploads_from: PathBuf,
    desktop: Option<Desktop>,
    sessions: std::sync::Mutex<HashMap<String, Arc<Session>>>,
    /// Opening is one at a time (a profile is used by one session).
    opening: tokio::sync::Mutex<()>,
    /// Whether new sessions go through a wire guard (always, but for a test that shows what
    /// happens without one).
    wire_guard: std::sync::atomic::AtomicBool,
    /// Roots the wire guards trust beside the system's, for the servers they reach over TLS.
    wire_roots: std::sync::Mutex<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// A download is at most this large ([`download::MAX_DOWNLOAD`]; lowered by a test).
    download_cap: Arc<std::sync::atomic::AtomicU64>,
}

impl Browser {
    /// A browser running `chromium` as `account`, keeping its files under `root`, uploading
    /// files from under `uploads_from` (the workspace) only; `desktop` is the display a takeover
    /// session shows on (and whose input lease it takes).
    pub fn new(
        chromium: PathBuf,
        account: Account,
        root: PathBuf,
        uploads_from: PathBuf,
        desktop: Option<Desktop>,
    ) -> Browser {
        Browser {
            inner: Arc::new(Inner {
                chromium,
                account,
                root,
                uploads_from,
                desktop,
                sessions: std::sync::Mutex::new(HashMap::new()),
                opening: tokio::sync::Mutex::new(()),
                wire_guard: std::sync::atomic::AtomicBool::new(true),
                wire_roots: std::sync::Mutex::new(Vec::new()),
                download_cap: Arc::new(std::sync::atomic::AtomicU64::new(download::MAX_DOWNLOAD)),
            }),
        }
    }

    /// A test and debugging switch: whether sessions opened from now on go through a wire guard
    /// (on by default; off, Chromium connects by itself and may send a request twice).
    pub fn set_wire_guard(&self, on: bool) {
        self.inner.wire_guard.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Roots the wire guards of sessions opened from now on trust beside the system's (a test's
    /// private CA; a sandbox adds its own to the system's store instead).
    pub fn add_wire_roots(&self, roots: Vec<rustls::pki_types::CertificateDer<'static>>) {
        self.inner.wire_roots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(roots);
    }

    /// A test switch: the most a download may take, from now on, in every session (default
    /// [`download::MAX_DOWNLOAD`]).
    pub fn set_download_cap(&self, cap: u64) {
        self.inner.download_cap.store(cap, std::sync::atomic::Ordering::SeqCst);
    }

    /// Serves one call for `caller` (`bot:<id>` or `member:<id>`). In a session with filled
    /// secrets, the answer's strings and an error's message are masked ([`secrets`]).
    pub async fn call(&self, op: BrowserOp, caller: &str) -> Result<Answer, BrowserError> {
        op.check().map_err(BrowserError::invalid)?;
        match op {
            BrowserOp::Open(req) => self.open(req).await.map(|json| Answer { json, image: Vec::new() }),
            BrowserOp::List => Ok(Answer { json: self.list().await, image: Vec::new() }),
            BrowserOp::Close(req) => self.close(&req.session).await.map(|json| Answer { json, image: Vec::new() }),
            op => {
                let name = op.session().unwrap_or_default().to_string();
                let session = self.session(&name)?;
                if session.mode == Mode::Takeover && page::acts(&op) {
                    match &self.inner.desktop {
                        Some(d) => d.take_lease(caller).map_err(|e| BrowserError::new(e.kind, e.message))?,
                        None => {
                            return Err(BrowserError::new(
                                ErrorKind::ComputerUnsupported,
                                "this computer has no desktop",
                            ));
                        }
                    }
                }
                let mut tabs = session.tabs.lock().await;
                // A recorded action's window on the wire: the requests sent from here on.
                let window = match (&session.wire, op.action().and_then(|a| a.action_id)) {
                    (Some(w), Some(_)) => Some(w.log().mark()),
                    _ => None,
                };
                // It runs until the answers to the requests the action started, or its wait.
                let wait = Duration::from_millis(op.timeout_ms().unwrap_or(computerd_proto::browser::DEFAULT_WAIT_MS));
                let window_end = tokio::time::Instant::now() + wait;
                // The downloads its input starts: waited for within the same wait.
                let downloads = page::acts(&op).then(|| session.downloads.mark(&session.cdp));
                let mut answer = page::serve(&session, &mut tabs, op, self.owner(), &self.inner.uploads_from).await;
                if let (Ok(a), Some(mark)) = (&mut answer, downloads)
                    && let Some(list) = session.downloads.report(mark, window_end).await
                {
                    a.json["downloads"] = list;
                }
                if let (Ok(a), Some(mark), Some(w)) = (&mut answer, window, &session.wire) {
                    let settle = tokio::time::Instant::now() + REQUESTS_SETTLE;
                    let (sent, dropped) = w.log().settled_since(mark, settle, window_end.max(settle)).await;
                    page::note_requests(&mut a.json, &sent, dropped);
                }
                if session.mode == Mode::Takeover
                    && let Some(d) = &self.inner.desktop
                {
                    // Renewed after the call too, like the desktop's own actions.
                    let _ = d.take_lease(caller);
                }
                // Last, once everything is in the answer (downloads, requests): no filled value
                // leaves in it.
                let masks = session.secrets.masks();
                match &mut answer {
                    Ok(a) => masks.json(&mut a.json),
                    Err(e) => {
                        if let Some(m) = masks.text(&e.message) {
                            e.message = m;
                        }
                    }
                }
                answer
            }
        }
    }

    /// A test and debugging hook, not reachable over the link: evaluates `expression` in the
    /// page of the session's tab (`tab`, or its only one) as the page's own script would, and
    /// answers its value (by value; `awaitPromise`). Nothing is masked: a test reads back what
    /// the page holds with it.
    #[doc(hidden)]
    pub async fn evaluate(&self, session: &str, tab: Option<&str>, expression: &str) -> Result<Value, BrowserError> {
        let session = self.session(session)?;
        let mut tabs = session.tabs.lock().await;
        page::evaluate(&session, &mut tabs, tab, expression).await
    }

    fn owner(&self) -> Option<(u32, u32)> {
        nix::unistd::geteuid().is_root().then_some((self.inner.account.uid, self.inner.account.gid))
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, BrowserError> {
        let s = self.inner.sessions.lock().map_err(|_| BrowserError::invalid("sessions lock poisoned"))?;
        let session = s.get(id).cloned().ok_or_else(|| {
            BrowserError::new(
                ErrorKind::NotFound,
                format!("no browser session {id} (it ended, or the agent restarted); open a new one"),
            )
        })?;
        if !session.cdp.is_open() {
            return Err(BrowserError::new(
                ErrorKind::Unavailable,
                format!("the browser of session {id} has stopped; close it and open a new one"),
            ));
        }
        Ok(session)
    }

    /// The sessions and their tabs.
    async fn list(&self) -> Value {
        let sessions: Vec<Arc<Session>> = match self.inner.sessions.lock() {
            Ok(s) => s.values().cloned().collect(),
            Err(_) => Vec::new(),
        };
        let mut out = Vec::new();
        for s in sessions {
            let tabs = if s.cdp.is_open() { page::tab_list(&s.cdp).await.unwrap_or_default() } else { Vec::new() };
            let mut tabs = Value::Array(tabs);
            s.secrets.masks().json(&mut tabs);
            out.push(json!({"session": s.id, "mode": s.mode, "profile": s.profile, "running": s.cdp.is_open(), "tabs": tabs}));
        }
        json!({"sessions": out})
    }

    async fn close(&self, id: &str) -> Result<Value, BrowserError> {
        let session = {
            let mut s = self.inner.sessions.lock().map_err(|_| BrowserError::invalid("sessions lock poisoned"))?;
            s.remove(id).ok_or_else(|| BrowserError::new(ErrorKind::NotFound, format!("no browser session {id}")))?
        };
        // Its filled values are zeroed now, whoever still holds the session.
        session.secrets.clear();
        if session.cdp.is_open() {
            let _ = session.cdp.call(None, "Browser.close", json!({}), Duration::from_secs(3)).await;
        }
        let mut child = session.child.lock().await;
        if tokio::time::timeout(Duration::from_secs(3), child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
        if let Some(w) = &session.wire {
            w.stop();
        }
        // Removed as the browser's account, whose tree it is: a symlink it planted on the way
        // leads nowhere it could not go itself.
        let (stage, account) = (session.stage_dir.clone(), Arc::new(self.inner.account.clone()));
        let _ = crate::users::run_as(&account, move || std::fs::remove_dir_all(stage)).await;
        Ok(json!({"session": id, "closed": true}))
    }

    async fn open(&self, req: OpenRequest) -> Result<Value, BrowserError> {
        let _one = self.inner.opening.lock().await;
        let profile = req.profile.clone().unwrap_or_else(|| "default".into());
        {
            let s = self.inner.sessions.lock().map_err(|_| BrowserError::invalid("sessions lock poisoned"))?;
            if s.len() >= MAX_SESSIONS {
                return Err(BrowserError::new(
                    ErrorKind::Conflict,
                    format!("{MAX_SESSIONS} browser sessions are open; close one first"),
                ));
            }
            if let Some(other) = s.values().find(|o| o.profile == profile && o.cdp.is_open()) {
                return Err(BrowserError::new(
                    ErrorKind::Conflict,
                    format!("profile {profile} is in use by session {}", other.id),
                ));
            }
        }
        if req.mode == Mode::Takeover && self.inner.desktop.is_none() {
            return Err(BrowserError::new(
                ErrorKind::ComputerUnsupported,
                "takeover needs the Computer's desktop; this one has none",
            ));
        }
        let id = format!("b-{}", hex::encode(rand::random::<[u8; 8]>()));
        let dirs = self.dirs(&profile, &id).map_err(|e| BrowserError::new(ErrorKind::ComputerExecutionFailed, e))?;
        let wire = if self.inner.wire_guard.load(std::sync::atomic::Ordering::SeqCst) {
            let uid = self.owner().map_or_else(|| nix::unistd::geteuid().as_raw(), |(uid, _)| uid);
            let roots = self.inner.wire_roots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let w = wire::Wire::start(uid, &roots).await.map_err(|e| {
                BrowserError::new(ErrorKind::ComputerExecutionFailed, format!("cannot start the browser's proxy: {e}"))
            })?;
            Some(w)
        } else {
            None
        };
        let (cdp, child) = self.launch(req.mode, &dirs, wire.as_ref()).await?;
        // Its downloads, placed in the workspace's Downloads (a failure here ends the browser:
        // the child is killed when dropped).
        let cap = self.inner.download_cap.clone();
        let fail = |e: String| {
            BrowserError::new(ErrorKind::ComputerExecutionFailed, format!("the browser cannot save downloads: {e}"))
        };
        let downloads = download::Downloads::new(&self.inner.uploads_from, &self.inner.root, &id, self.owner(), cap)
            .map_err(|e| fail(e.to_string()))?;
        downloads.start(&cdp).await.map_err(|e| fail(e.to_string()))?;
        let dialogs = page::Dialogs::default();
        tokio::spawn(page::watch_dialogs(cdp.subscribe(), dialogs.clone()));
        let session = Arc::new(Session {
            id: id.clone(),
            mode: req.mode,
            profile: profile.clone(),
            cdp,
            child: tokio::sync::Mutex::new(child),
            tabs: tokio::sync::Mutex::new(page::Tabs::default()),
            stage_dir: dirs.stage,
            stage_fd: dirs.stage_fd,
            wire,
            dialogs,
            downloads,
            secrets: secrets::Filled::default(),
        });
        let first = {
            let mut tabs = session.tabs.lock().await;
            page::first_tab(&session, &mut tabs, req.url.as_deref()).await
        };
        let first = match first {
            Ok(v) => v,
            Err(e) => {
                let mut child = session.child.lock().await;
                let _ = child.kill().await;
                return Err(e);
            }
        };
        self.inner
            .sessions
            .lock()
            .map_err(|_| BrowserError::invalid("sessions lock poisoned"))?
            .insert(id.clone(), session);
        tracing::info!(session = %id, mode = ?req.mode, profile = %profile, "a browser session started");
        Ok(json!({"session": id, "mode": req.mode, "profile": profile, "tabs": [first]}))
    }

    /// Makes (or keeps) the browser's directories: see [`make_dirs`].
    fn dirs(&self, profile: &str, id: &str) -> Result<Dirs, String> {
        make_dirs(&self.inner.root, profile, id, self.owner())
    }

    async fn launch(
        &self,
        mode: Mode,
        dirs: &Dirs,
        wire: Option<&wire::Wire>,
    ) -> Result<(Cdp, tokio::process::Child), BrowserError> {
        let fail = |m: String| BrowserError::new(ErrorKind::ComputerExecutionFailed, m);
        let pipes = cdp::pipes().map_err(|e| fail(format!("cannot make the browser's pipes: {e}")))?;
        let mut c = tokio::process::Command::new(&self.inner.chromium);
        if self.owner().is_some() {
            c.uid(self.inner.account.uid).gid(self.inner.account.gid);
        }
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &dirs.home)
            .env("LANG", "C.UTF-8")
            .current_dir(&dirs.home)
            .args(flags(mode, &dirs.profile))
            .args(wire.map(wire::Wire::flags).into_iter().flatten())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if mode == Mode::Takeover {
            let Some(d) = &self.inner.desktop else {
                return Err(BrowserError::new(ErrorKind::ComputerUnsupported, "takeover needs the Computer's desktop"));
            };
            let (display, authority) = d.display_env();
            c.env("DISPLAY", display).env("XAUTHORITY", authority);
        }
        let (child_in, child_out) = cdp::raw(&pipes);
        // SAFETY: place_child_fds only calls fcntl and dup2, both async-signal-safe.
        unsafe {
            c.pre_exec(move || cdp::place_child_fds(child_in, child_out));
        }
        let mut child = c.spawn().map_err(|e| fail(format!("cannot start {}: {e}", self.inner.chromium.display())))?;
        drop(pipes.child_in);
        drop(pipes.child_out);
        if let Some(err) = child.stderr.take() {
            tokio::spawn(drain(err));
        }
        let cdp = Cdp::serve(pipes.to_browser, pipes.from_browser);
        match cdp.call(None, "Browser.getVersion", json!({}), Duration::from_secs(30)).await {
            Ok(_) => Ok((cdp, child)),
            Err(e) => {
                let _ = child.kill().await;
                Err(fail(format!("the browser did not start: {e}")))
            }
        }
    }
}

struct Dirs {
    home: PathBuf,
    profile: PathBuf,
    stage: PathBuf,
    stage_fd: std::os::fd::OwnedFd,
}

/// Makes (or keeps) the browser's directories under `root`: its home, the profile, this
/// session's staging directory; all `owner`'s (the desktop account's), 0700.
///
/// The tree is that account's, so it may hold symlinks it planted: every step below `root`'s
/// parent is opened with `O_NOFOLLOW` and changed through its descriptor (a symlink is refused,
/// never followed), and the profile's preferences are replaced, never written through
/// ([`no_preconnect`]).
fn make_dirs(root: &Path, profile: &str, id: &str, owner: Option<(u32, u32)>) -> Result<Dirs, String> {
    use std::os::fd::AsFd;
    let fail = |what: &Path, e: std::io::Error| format!("cannot make {} private: {e}", what.display());
    let (Some(parent), Some(name)) = (root.parent(), root.file_name()) else {
        return Err(format!("{} cannot be the browser's directory", root.display()));
    };
    let start = crate::nofollow::open_start(parent).map_err(|e| fail(parent, e))?;
    let top = crate::nofollow::private_dir_at(start.as_fd(), name, owner).map_err(|e| fail(root, e))?;
    let dirs = Dirs {
        home: root.join("home"),
        profile: root.join("profiles").join(profile),
        stage: root.join("uploads").join(id),
        stage_fd: {
            let rel = Path::new("uploads").join(id);
            crate::nofollow::private_dirs(top.as_fd(), &rel, owner).map_err(|e| fail(&root.join(&rel), e))?
        },
    };
    crate::nofollow::private_dirs(top.as_fd(), Path::new("home"), owner).map_err(|e| fail(&dirs.home, e))?;
    let rel = Path::new("profiles").join(profile);
    let profile_fd = crate::nofollow::private_dirs(top.as_fd(), &rel, owner).map_err(|e| fail(&dirs.profile, e))?;
    no_preconnect(profile_fd.as_fd(), owner).map_err(|e| format!("{}/Default: {e}", dirs.profile.display()))?;
    // A lock left by a browser that died with an earlier agent (none of ours uses it now).
    for f in ["SingletonLock", "SingletonSocket", "SingletonCookie"] {
        let _ = nix::unistd::unlinkat(profile_fd.as_fd(), f, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    Ok(dirs)
}

/// Parses a browser call's JSON (as the link carries it). A `fill_secret`'s JSON carries an
/// opened secret, and serde's message may quote a value of the request (one of the wrong type):
/// a message that holds any string or number of its `fill` is withheld.
pub fn parse_op(json: &str) -> Result<BrowserOp, String> {
    // A syntax error's message names a place, never the text.
    let v: Value = serde_json::from_str(json).map_err(|e| format!("bad browser request: {e}"))?;
    serde_json::from_value::<BrowserOp>(v.clone()).map_err(|e| {
        let message = e.to_string();
        let mut leaves = Vec::new();
        let mut stack: Vec<&Value> = v.pointer("/args/fill").into_iter().collect();
        while let Some(x) = stack.pop() {
            match x {
                Value::String(s) => leaves.push(s.clone()),
                Value::Number(n) => leaves.push(n.to_string()),
                Value::Array(a) => stack.extend(a),
                Value::Object(o) => stack.extend(o.values()),
                _ => {}
            }
        }
        if leaves.iter().any(|l| !l.is_empty() && message.contains(l.as_str())) {
            "bad browser request: a field of the fill_secret is invalid (the reason is withheld: it quotes the secret)"
                .to_string()
        } else {
            format!("bad browser request: {message}")
        }
    })
}

/// Chromium's command line (the benchmark's baseline browser uses it too).
pub fn flags(mode: Mode, profile: &Path) -> Vec<String> {
    let mut f: Vec<String> = [
        "--remote-debugging-pipe",
        "--no-sandbox",
        "--no-first-run",
        "--no-default-browser-check",
        "--no-startup-window",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-breakpad",
        "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
        "--password-store=basic",
        "--use-mock-keychain",
        "--mute-audio",
        "--lang=en-US",
        "--window-position=0,0",
        "--window-size=1280,800",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    f.push(format!("--user-data-dir={}", profile.display()));
    if mode == Mode::Automation {
        f.push("--headless=new".into());
        f.push("--disable-gpu".into());
        f.push("--hide-scrollbars".into());
    }
    f
}

/// Turns off Chromium's preconnects in the profile's preferences (`net.network_prediction_options`
/// = 2, "never"). A request sent on a preconnected socket counts as sent on a reused one, and
/// Chromium sends such a request again, a POST included, when the server closes it without an
/// answer: an upload whose answer was lost would be made twice by the browser itself, below any
/// action record. The wire guard ([`wire`]) is what keeps a request to one send on plain HTTP,
/// kept-alive connections included; without preconnects, fewer requests of a TLS tunnel (which
/// the guard does not see into) go out on a reused socket.
///
/// The profile is the browser account's: `Default` is opened without following a symlink, the
/// old preferences are read only when they are a regular file of that account (not a link to
/// another's), and the new ones replace them by a rename, never writing through what was there.
fn no_preconnect(profile: std::os::fd::BorrowedFd<'_>, owner: Option<(u32, u32)>) -> Result<(), String> {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let dir = crate::nofollow::private_dir_at(profile, "Default".as_ref(), owner).map_err(|e| e.to_string())?;
    let old = nix::fcntl::openat(
        dir.as_fd(),
        "Preferences",
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_NONBLOCK
            | nix::fcntl::OFlag::O_NOCTTY
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()
    .map(std::fs::File::from)
    .filter(|f| {
        f.metadata()
            .is_ok_and(|m| m.is_file() && m.len() <= PREFERENCES_MAX && owner.is_none_or(|(uid, _)| m.uid() == uid))
    });
    let mut bytes = Vec::new();
    if let Some(f) = old {
        let _ = f.take(PREFERENCES_MAX).read_to_end(&mut bytes);
    }
    let mut prefs: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({}));
    if !prefs.is_object() {
        prefs = json!({});
    }
    if !prefs["net"].is_object() {
        prefs["net"] = json!({});
    }
    prefs["net"]["network_prediction_options"] = json!(2);
    let bytes = serde_json::to_vec(&prefs).map_err(|e| e.to_string())?;
    crate::nofollow::replace_at(dir.as_fd(), "Preferences".as_ref(), &bytes, 0o600, owner)
        .map_err(|e| format!("Preferences: {e}"))
}

/// Preferences larger than this are not read (they are started afresh).
const PREFERENCES_MAX: u64 = 16 << 20;

/// Logs the browser's last words (its stderr is noisy; only lines that say something failed).
async fn drain(err: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(err).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains("ERROR") || line.contains("FATAL") {
            tracing::debug!(line = %line.chars().take(300).collect::<String>(), "chromium");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A root-owned stand-in for `/etc` or the agent's credential: its owner, mode and bytes.
    fn guarded(dir: &Path) -> (PathBuf, PathBuf) {
        let target = dir.join("etc");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let file = target.join("credential");
        std::fs::write(&file, b"root's secret").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        (target, file)
    }

    fn looks(p: &Path) -> (u32, u32, u32, Vec<u8>) {
        let m = std::fs::symlink_metadata(p).expect("stat");
        let bytes = if m.is_file() { std::fs::read(p).expect("read") } else { Vec::new() };
        (m.uid(), m.gid(), m.mode() & 0o7777, bytes)
    }

    /// Issue 36, item 3: symlinks the browser's account planted where its home, a profile or
    /// the staging directory go are refused, never followed: their targets keep their owner and
    /// mode. (The agent runs as root in the tests, as in a sandbox.)
    #[test]
    fn i36_3_a_planted_directory_symlink_is_refused_and_its_target_untouched() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root");
        }
        let owner = Some((4242, 4242));
        for planted in ["home", "profiles/site-a", "uploads", "profiles"] {
            let t = tempfile::tempdir().expect("tempdir");
            let (target, file) = guarded(t.path());
            let root = t.path().join("computerd-browser");
            // The account's tree as an earlier session left it, with the link planted.
            make_dirs(&root, "other", "s0", owner).expect("a first session");
            let at = root.join(planted);
            let _ = std::fs::remove_dir_all(&at);
            std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
            std::os::unix::fs::symlink(&target, &at).expect("plant");
            let before = (looks(&target), looks(&file));
            let made = make_dirs(&root, "site-a", "s1", owner);
            assert!(made.is_err(), "{planted}: a symlink was followed");
            assert_eq!((looks(&target), looks(&file)), before, "{planted}: the target changed");
            assert!(std::fs::symlink_metadata(&at).expect("lstat").file_type().is_symlink());
        }
    }

    /// Issue 41, item 2: a `fill_secret` whose JSON does not fit is refused without quoting its
    /// secret; other requests keep serde's message.
    #[test]
    fn i41_2_a_bad_fill_secret_is_refused_without_its_value() {
        let bad = r#"{"op": "fill_secret", "args": {"session": "b-1", "ref": "e1", "secret": "s",
            "fill": {"kind": "totp", "origins": ["https://a.test"], "value": 492817}}}"#;
        let e = parse_op(bad).expect_err("a number is not a value");
        assert!(!e.contains("492817"), "{e}");
        assert!(e.contains("withheld"), "{e}");
        let e = parse_op(r#"{"op": "navigate", "args": {"session": "b-1", "url": 7}}"#).expect_err("bad");
        assert!(e.contains("invalid type: integer `7`"), "serde's message: {e}");
        let good = r#"{"op": "fill_secret", "args": {"session": "b-1", "ref": "e1", "secret": "s",
            "fill": {"kind": "totp", "origins": ["https://a.test"], "value": "492817"}}}"#;
        let op = parse_op(good).expect("a fill_secret");
        assert!(!format!("{op:?}").contains("492817"), "its Debug is redacted: {op:?}");
    }

    /// Issue 36, item 3: `Default/Preferences` as a symlink to a root-owned file is replaced
    /// (a new file of the account), never read through or written through: the target keeps
    /// its bytes, owner and mode.
    #[test]
    fn i36_3_a_preferences_symlink_is_replaced_and_its_target_untouched() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root");
        }
        let owner = Some((4242, 4242));
        let t = tempfile::tempdir().expect("tempdir");
        let (_, file) = guarded(t.path());
        let root = t.path().join("computerd-browser");
        make_dirs(&root, "site-a", "s0", owner).expect("a first session");
        let prefs = root.join("profiles/site-a/Default/Preferences");
        std::fs::remove_file(&prefs).expect("rm");
        std::os::unix::fs::symlink(&file, &prefs).expect("plant");
        let before = looks(&file);
        make_dirs(&root, "site-a", "s1", owner).expect("the session's directories");
        assert_eq!(looks(&file), before, "the target changed");
        let (uid, gid, mode, bytes) = looks(&prefs);
        assert_eq!((uid, gid, mode), (4242, 4242, 0o600), "a new file of the account");
        let v: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(v["net"]["network_prediction_options"], 2);
        assert!(!String::from_utf8_lossy(&bytes).contains("secret"), "nothing was read through the link");
    }
}
