//! Downloads a page starts (a link with `download`, an answer with `Content-Disposition:
//! attachment`): saved under `<workspace>/Downloads/`, named, hashed and reported in the answer
//! of the tool whose action started them.
//!
//! - Each session's Chromium is told `Browser.setDownloadBehavior {behavior: "allowAndName"}`
//!   with a directory of its own, `<browser root>/downloads/<session>` (the browser's account's,
//!   0700): it saves a download there under its GUID (`<guid>.crdownload` while it runs), and
//!   reports it on the browser target (`Browser.downloadWillBegin`, `Browser.downloadProgress`).
//!   [`Downloads::watch`] follows those events. Chromium never writes in the workspace: the
//!   workspace is another account's (`user`), which could put a symlink where a path goes, and
//!   Chromium follows paths.
//! - `<workspace>/Downloads` is made by the agent (the workspace owner's, 0755, so its owner may
//!   tidy it), and opened without following a symlink: a symlink there is refused (the download
//!   is cancelled, or its file removed), never followed.
//! - A download past the cap ([`MAX_DOWNLOAD`]; by the total its answer announced, or by the
//!   bytes received) is cancelled (`Browser.cancelDownload`), its partial file removed, and it
//!   is reported `refused`.
//! - A finished download is opened (`O_NOFOLLOW`, through its directory's descriptor), checked
//!   (a regular file of the browser's account, within the cap), made readable (0644), and put in
//!   `Downloads` under its suggested name, cleaned ([`clean_name`]), never replacing anything
//!   (` (1)`, ` (2)`… when the name is taken): a hard link when both are on one filesystem
//!   (checked to be that file), else a new file of the browser's account (`O_EXCL`) the bytes are
//!   copied into. It is hashed from the descriptor it was read through. A file that fails a
//!   check is removed and reported `refused`.
//! - A tool that acts (`click`, `navigate`, `press`, …) waits, within its timeout, for the
//!   downloads begun during its call, and its answer carries `"downloads"`:
//!   `{"name", "path", "size", "sha256"}`, `{"name", "refused"}`, `{"name", "failed"}` (cancelled
//!   or interrupted by the page, the network or the browser), or `{"name", "state":
//!   "inProgress", "received", "total"}` for one still running when the answer goes. A download
//!   not yet reported as ended (begun between calls, or running at the previous answer) is
//!   listed by the next acting tool's answer.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;
use tokio::sync::broadcast;
use tokio::sync::watch;
use tokio::time::Instant;

use super::COMMAND;
use super::cdp::Cdp;
use super::cdp::CdpError;
use super::cdp::Event;

/// A download is at most this large (by default: see `Browser::set_download_cap`).
pub const MAX_DOWNLOAD: u64 = 256 * 1024 * 1024;
/// The directory, in the workspace, downloads are saved in.
pub const DIR: &str = "Downloads";
/// A saved file's name is at most this many bytes (before a ` (n)`).
const MAX_NAME: usize = 200;
/// How long a download that is not kept waits for the browser's own file work before it ends
/// (its files removed meanwhile), and how often it looks.
const SETTLE_PARTIAL: std::time::Duration = std::time::Duration::from_secs(1);
const SETTLE_STEP: std::time::Duration = std::time::Duration::from_millis(100);
/// The downloads remembered per session (the oldest reported ones are forgotten first).
const KEEP: usize = 256;
/// Tried before a download is refused for want of a free name.
const MAX_NUMBERED: u32 = 1000;

/// Where a tool's call began, for [`Downloads::report`].
pub struct Mark {
    seq: u64,
    events: broadcast::Receiver<Event>,
}

/// A session's downloads; clones share them.
#[derive(Clone)]
pub struct Downloads {
    inner: Arc<Shared>,
}

struct Shared {
    workspace: PathBuf,
    /// Where the browser saves (`<root>/downloads/<session>`), open, and its parent, open.
    stage: OwnedFd,
    stages: OwnedFd,
    stage_name: String,
    stage_path: PathBuf,
    /// The browser's account (uid, gid), when the agent switches accounts (it runs as root).
    owner: Option<(u32, u32)>,
    cap: Arc<AtomicU64>,
    state: Mutex<State>,
    /// Bumped at every change (a tool waiting for its downloads looks again).
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// The sequence number of the next download.
    next: u64,
    items: VecDeque<Item>,
}

/// How a download ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    Saved { name: String, path: String, size: u64, sha256: String },
    Refused(String),
    Failed(String),
}

struct Item {
    seq: u64,
    guid: String,
    /// The suggested name, cleaned.
    name: String,
    received: u64,
    total: u64,
    /// Refused while it ran (cancelled; the browser has not said so yet).
    refusing: Option<String>,
    /// Finished; being checked and named.
    naming: bool,
    end: Option<End>,
    /// Listed so far: not at all, as running, as ended.
    shown: Shown,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Shown {
    No,
    Running,
    Ended,
}

impl Downloads {
    /// The downloads of session `id`, saved by the browser under `root` (its directory,
    /// [`super::ROOT`]), then placed in `workspace`'s Downloads as `owner` (the browser's
    /// account), each at most `cap` bytes (read at each download). Makes the browser's directory
    /// for them (the account's, 0700; a symlink on the way is refused).
    pub fn new(
        workspace: &Path,
        root: &Path,
        id: &str,
        owner: Option<(u32, u32)>,
        cap: Arc<AtomicU64>,
    ) -> std::io::Result<Downloads> {
        let (Some(parent), Some(name)) = (root.parent(), root.file_name()) else {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "no directory for the browser"));
        };
        let start = crate::nofollow::open_start(parent)?;
        let top = crate::nofollow::private_dir_at(start.as_fd(), name, owner)?;
        let stages = crate::nofollow::private_dir_at(top.as_fd(), OsStr::new("downloads"), owner)?;
        let stage = crate::nofollow::private_dir_at(stages.as_fd(), OsStr::new(id), owner)?;
        Ok(Downloads {
            inner: Arc::new(Shared {
                workspace: workspace.to_path_buf(),
                stage,
                stages,
                stage_name: id.to_string(),
                stage_path: root.join("downloads").join(id),
                owner,
                cap,
                state: Mutex::new(State::default()),
                changed: watch::channel(0).0,
            }),
        })
    }

    /// `<workspace>/Downloads`.
    pub fn dir(&self) -> PathBuf {
        self.inner.workspace.join(DIR)
    }

    /// Makes the workspace's directory (a failure is reported at the first download), tells
    /// the browser to save downloads in its own and report them, and follows them until the
    /// browser stops.
    pub async fn start(&self, cdp: &Cdp) -> Result<(), CdpError> {
        if let Err(e) = self.open_dir(true) {
            tracing::warn!(dir = %self.dir().display(), error = %e, "the downloads directory cannot be made");
        }
        let events = cdp.subscribe();
        let path = self.inner.stage_path.display().to_string();
        let params = json!({"behavior": "allowAndName", "downloadPath": path, "eventsEnabled": true});
        cdp.call(None, "Browser.setDownloadBehavior", params, COMMAND).await?;
        tokio::spawn(self.clone().watch(cdp.clone(), events));
        Ok(())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// The mark of a tool's call, taken before its input is sent: downloads begun from now on
    /// are its own.
    pub fn mark(&self, cdp: &Cdp) -> Mark {
        Mark { seq: self.state().next, events: cdp.subscribe() }
    }

    /// Waits until the downloads begun since `mark` have ended, or `until`; answers the list to
    /// put in the answer (`None`: nothing to list): those, and the earlier ones not yet
    /// reported as ended.
    pub async fn report(&self, mut mark: Mark, until: Instant) -> Option<Value> {
        // The downloads begun in the call, by the events it saw (this session's watcher may not
        // have taken them in yet, while the tool's own wait already ended at one).
        let mut begun = Vec::new();
        loop {
            match mark.events.try_recv() {
                Ok(ev) if ev.method == "Browser.downloadWillBegin" && ev.session.is_empty() => {
                    if let Some(g) = ev.params["guid"].as_str().filter(|g| is_guid(g)) {
                        begun.push(g.to_string());
                    }
                }
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        drop(mark.events);
        let mark = mark.seq;
        let mut changed = self.inner.changed.subscribe();
        loop {
            let running = {
                let st = self.state();
                st.items.iter().any(|i| i.seq >= mark && i.end.is_none())
                    || begun.iter().any(|g| !st.items.iter().any(|i| &i.guid == g && i.end.is_some()))
            };
            if !running {
                break;
            }
            match tokio::time::timeout_at(until, changed.changed()).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
        let mut st = self.state();
        let mut out = Vec::new();
        for i in st.items.iter_mut() {
            let listed = i.seq >= mark || i.shown == Shown::No || (i.shown == Shown::Running && i.end.is_some());
            if !listed {
                continue;
            }
            out.push(match &i.end {
                Some(End::Saved { name, path, size, sha256 }) => {
                    json!({"name": name, "path": path, "size": size, "sha256": sha256})
                }
                Some(End::Refused(why)) => json!({"name": i.name, "refused": why}),
                Some(End::Failed(why)) => json!({"name": i.name, "failed": why}),
                None => {
                    let total = (i.total > 0).then_some(i.total);
                    json!({"name": i.name, "state": "inProgress", "received": i.received, "total": total})
                }
            });
            i.shown = if i.end.is_some() { Shown::Ended } else { Shown::Running };
        }
        (!out.is_empty()).then_some(Value::Array(out))
    }

    /// Follows the browser's download events until it stops.
    async fn watch(self, cdp: Cdp, mut events: broadcast::Receiver<Event>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                got = events.recv() => match got {
                    Ok(ev) if ev.session.is_empty() => self.on_event(&cdp, &ev),
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "download events were lost; a download may stay unreported");
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                // The connection's senders outlive the browser (this task holds one): its end
                // is seen here.
                _ = tick.tick() => if !cdp.is_open() { break },
            }
        }
        self.stopped();
    }

    fn on_event(&self, cdp: &Cdp, ev: &Event) {
        let p = &ev.params;
        let Some(guid) = p["guid"].as_str().filter(|g| is_guid(g)) else { return };
        match ev.method.as_str() {
            "Browser.downloadWillBegin" => {
                let name = clean_name(p["suggestedFilename"].as_str().unwrap_or_default());
                {
                    let mut st = self.state();
                    let seq = st.next;
                    st.next += 1;
                    st.items.push_back(Item {
                        seq,
                        guid: guid.to_string(),
                        name,
                        received: 0,
                        total: 0,
                        refusing: None,
                        naming: false,
                        end: None,
                        shown: Shown::No,
                    });
                    while st.items.len() > KEEP {
                        match st.items.iter().position(|i| i.shown == Shown::Ended) {
                            Some(at) => drop(st.items.remove(at)),
                            None => drop(st.items.pop_front()),
                        }
                    }
                }
                // Made again if it was removed; a symlink put there is refused.
                if let Err(e) = self.open_dir(true) {
                    self.refuse(cdp, guid, format!("{} cannot be used: {e}", self.dir().display()));
                }
                self.bump();
            }
            "Browser.downloadProgress" => {
                let cap = self.inner.cap.load(Ordering::SeqCst);
                let (received, total) =
                    (p["receivedBytes"].as_u64().unwrap_or(0), p["totalBytes"].as_u64().unwrap_or(0));
                let (refusing, naming) = {
                    let mut st = self.state();
                    let Some(i) = st.items.iter_mut().find(|i| i.guid == guid) else { return };
                    i.received = received;
                    i.total = total;
                    (i.refusing.clone(), i.naming || i.end.is_some())
                };
                match p["state"].as_str().unwrap_or_default() {
                    "inProgress" if refusing.is_none() && !naming => {
                        if total > cap {
                            self.refuse(
                                cdp,
                                guid,
                                format!("its answer announced {total} bytes, over the {cap}-byte cap for a download"),
                            );
                        } else if received > cap {
                            self.refuse(cdp, guid, format!("it passed the {cap}-byte cap for a download"));
                        }
                    }
                    "completed" if !naming => {
                        match refusing {
                            // Finished before the cancel took: removed all the same.
                            Some(why) => self.end_removed(guid, End::Refused(why)),
                            None => {
                                if let Some(i) = self.state().items.iter_mut().find(|i| i.guid == guid) {
                                    i.naming = true;
                                }
                                let (me, guid) = (self.clone(), guid.to_string());
                                tokio::spawn(async move {
                                    let (m, g) = (me.clone(), guid.clone());
                                    let end = tokio::task::spawn_blocking(move || m.save(&g, cap))
                                        .await
                                        .unwrap_or_else(|e| End::Failed(format!("the agent could not name it: {e}")));
                                    me.end(&guid, end);
                                });
                            }
                        }
                    }
                    "canceled" if !naming => {
                        let end = match refusing {
                            Some(why) => End::Refused(why),
                            None => End::Failed(
                                "it was cancelled or interrupted (by the page, the network or the browser)".into(),
                            ),
                        };
                        self.end_removed(guid, end);
                    }
                    _ => {}
                }
                self.bump();
            }
            _ => {}
        }
    }

    /// Cancels a running download, refused for `why`: it ends when the browser says it was
    /// cancelled (or finished meanwhile), its partial file removed.
    fn refuse(&self, cdp: &Cdp, guid: &str, why: String) {
        tracing::info!(guid, why = %why, "a download is refused");
        if let Some(i) = self.state().items.iter_mut().find(|i| i.guid == guid) {
            i.refusing = Some(why);
        }
        let (cdp, guid, me) = (cdp.clone(), guid.to_string(), self.clone());
        tokio::spawn(async move {
            if let Err(e) = cdp.call(None, "Browser.cancelDownload", json!({"guid": guid}), COMMAND).await {
                tracing::warn!(guid = %guid, error = %e, "a refused download could not be cancelled");
                // Nothing more will come of it: its files go now.
                me.remove_partial(&guid);
                let why = me.state().items.iter().find(|i| i.guid == guid).and_then(|i| i.refusing.clone());
                if let Some(why) = why {
                    me.end(&guid, End::Refused(why));
                }
            }
        });
    }

    fn end(&self, guid: &str, end: End) {
        if let Some(i) = self.state().items.iter_mut().find(|i| i.guid == guid && i.end.is_none()) {
            i.end = Some(end);
            i.naming = false;
        }
        self.bump();
    }

    /// The browser stopped: what still ran is gone (its partial files removed).
    fn stopped(&self) {
        let running: Vec<String> =
            self.state().items.iter().filter(|i| i.end.is_none() && !i.naming).map(|i| i.guid.clone()).collect();
        for g in running {
            self.end(&g, End::Failed("the browser stopped before it finished".into()));
        }
        // Whatever the browser left in its directory (only names in it are removed: a symlink,
        // never what it points to), then the directory.
        remove_all_in(self.inner.stage.as_fd());
        let _ = nix::unistd::unlinkat(
            self.inner.stages.as_fd(),
            self.inner.stage_name.as_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        );
    }

    /// Ends a download that is not kept once its files are gone from the browser's directory.
    /// The browser reports a cancel before its own file work is done (it may still make or
    /// remove the partial file just after), so the files are removed until none is left, for at
    /// most [`SETTLE_PARTIAL`]; the download ends then. Meanwhile no other report of it counts.
    fn end_removed(&self, guid: &str, end: End) {
        if let Some(i) = self.state().items.iter_mut().find(|i| i.guid == guid) {
            i.naming = true;
        }
        let (me, guid) = (self.clone(), guid.to_string());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + SETTLE_PARTIAL;
            loop {
                me.remove_partial(&guid);
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
                // The browser's late file work shows within a step.
                tokio::time::sleep(SETTLE_STEP).await;
                if !me.has_partial(&guid) {
                    break;
                }
            }
            me.end(&guid, end);
        });
    }

    /// Whether a download's files are in the browser's directory.
    fn has_partial(&self, guid: &str) -> bool {
        [guid.to_string(), format!("{guid}.crdownload")].iter().any(|n| {
            nix::sys::stat::fstatat(self.inner.stage.as_fd(), n.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok()
        })
    }

    /// Removes a download's files (`<guid>`, `<guid>.crdownload`) from the browser's directory
    /// (names in it: a symlink is removed, never followed).
    fn remove_partial(&self, guid: &str) {
        for n in [guid.to_string(), format!("{guid}.crdownload")] {
            let _ =
                nix::unistd::unlinkat(self.inner.stage.as_fd(), n.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
    }

    /// Opens `<workspace>/Downloads` without following a symlink (the workspace is another
    /// account's: it may put one there); with `make`, makes it first when missing, and makes it
    /// the workspace owner's, mode 0755, through its descriptor.
    fn open_dir(&self, make: bool) -> std::io::Result<OwnedFd> {
        open_dir(&self.inner.workspace, make)
    }

    /// Checks, hashes and places a finished download (blocking); its file in the browser's
    /// directory is gone after, whatever came of it.
    fn save(&self, guid: &str, cap: u64) -> End {
        let end = match self.open_dir(true) {
            Ok(dir) => {
                let name =
                    self.state().items.iter().find(|i| i.guid == guid).map(|i| i.name.clone()).unwrap_or_default();
                match place(self.inner.stage.as_fd(), guid, dir.as_fd(), &name, self.inner.owner, cap) {
                    Ok((placed, size, sha256)) => {
                        let path = self.dir().join(&placed).display().to_string();
                        End::Saved { name: placed, path, size, sha256 }
                    }
                    Err(why) => End::Refused(why),
                }
            }
            Err(e) => End::Refused(format!("{} cannot be used: {e}", self.dir().display())),
        };
        self.remove_partial(guid);
        end
    }
}

fn io(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// See [`Downloads::open_dir`].
fn open_dir(workspace: &Path, make: bool) -> std::io::Result<OwnedFd> {
    let ws = crate::nofollow::open_start(workspace)?;
    let made = make
        && match nix::sys::stat::mkdirat(ws.as_fd(), DIR, Mode::from_bits_truncate(0o755)) {
            Ok(()) => true,
            Err(nix::Error::EEXIST) => false,
            Err(e) => return Err(io(e)),
        };
    let fd = crate::nofollow::open_dir_at(ws.as_fd(), OsStr::new(DIR)).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
            std::io::Error::new(e.kind(), format!("not a directory (a symlink?): {e}"))
        } else {
            e
        }
    })?;
    // Made here: the workspace owner's (an existing one is left as its owner keeps it).
    if made {
        let w = nix::sys::stat::fstat(&ws).map_err(io)?;
        if nix::unistd::geteuid().is_root() {
            nix::unistd::fchown(&fd, Some(w.st_uid.into()), Some(w.st_gid.into())).map_err(io)?;
        }
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o755)).map_err(io)?;
    }
    Ok(fd)
}

/// Removes every name in `dir` that is not a directory (a symlink is removed, never followed).
/// The directory is listed as opened (`/proc/self/fd`), its names removed through `dir`.
fn remove_all_in(dir: BorrowedFd<'_>) {
    use std::os::fd::AsRawFd;
    let listed = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    for e in listed.into_iter().flatten().flatten() {
        let _ = nix::unistd::unlinkat(dir, e.file_name().as_os_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Opens `<guid>` in `stage` (`O_NOFOLLOW`), checks it is a regular file (of the `owner`'s uid
/// when given) of at most `cap` bytes, makes it 0644, and puts it in `dir` under `name` or the
/// first free ` (n)` of it, never replacing anything: a hard link (checked to be that file), or,
/// across filesystems, a new file of `owner` (`O_EXCL`) its bytes are copied into. Hashes the
/// bytes read through the descriptor. Answers the name, the size and the SHA-256 (hex). The
/// file stays in `stage` (the caller removes it).
fn place(
    stage: BorrowedFd<'_>,
    guid: &str,
    dir: BorrowedFd<'_>,
    name: &str,
    owner: Option<(u32, u32)>,
    cap: u64,
) -> Result<(String, u64, String), String> {
    let fd = nix::fcntl::openat(
        stage,
        guid,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("the browser's file cannot be opened: {e}"))?;
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("the browser's file is not a regular file".into());
    }
    if owner.is_some_and(|(uid, _)| meta.uid() != uid) {
        return Err("the browser's file is not its account's".into());
    }
    if meta.len() > cap {
        return Err(format!("{} bytes, over the {cap}-byte cap for a download", meta.len()));
    }
    nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(0o644)).map_err(|e| e.to_string())?;
    for n in 0..MAX_NUMBERED {
        let candidate = numbered(name, n);
        match nix::unistd::linkat(stage, guid, dir, candidate.as_str(), nix::fcntl::AtFlags::empty()) {
            Ok(()) => {
                // The name is the file that was checked (not one put in the GUID's place).
                let linked = nix::sys::stat::fstatat(dir, candidate.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
                if !linked.is_ok_and(|l| l.st_dev == meta.dev() && l.st_ino == meta.ino()) {
                    let _ = nix::unistd::unlinkat(dir, candidate.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
                    return Err("the browser's file was replaced while it was placed".into());
                }
                let (size, sha256) = copy_hashed(&mut file, None, cap)?;
                return Ok((candidate, size, sha256));
            }
            Err(nix::Error::EEXIST) => continue,
            Err(nix::Error::EXDEV) => {}
            Err(e) => return Err(format!("it cannot be put in the Downloads directory as {candidate}: {e}")),
        }
        // Another filesystem: a new file, its bytes copied.
        let mut out = match crate::nofollow::create_at(dir, candidate.as_ref(), 0o644, owner) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(format!("it cannot be put in the Downloads directory as {candidate}: {e}")),
        };
        return match copy_hashed(&mut file, Some(&mut out), cap) {
            Ok((size, sha256)) => Ok((candidate, size, sha256)),
            Err(e) => {
                drop(out);
                let _ = nix::unistd::unlinkat(dir, candidate.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
                Err(e)
            }
        };
    }
    Err(format!("{name} and its numbered names up to ({}) are all taken", MAX_NUMBERED - 1))
}

/// Reads `file` to its end (at most `cap` bytes), writing each piece to `out` when given;
/// answers the size and the SHA-256 (hex) of what was read.
fn copy_hashed(
    file: &mut std::fs::File,
    mut out: Option<&mut std::fs::File>,
    cap: u64,
) -> Result<(u64, String), String> {
    use std::io::Write;
    let mut hash = sha2::Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|e| format!("the browser's file cannot be read: {e}"))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > cap {
            return Err(format!("it grew past the {cap}-byte cap for a download"));
        }
        hash.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n]).map_err(|e| format!("it cannot be copied: {e}"))?;
        }
    }
    if let Some(o) = out {
        o.sync_all().map_err(|e| format!("it cannot be copied: {e}"))?;
    }
    Ok((size, hex::encode(hash.finalize())))
}

/// Whether `g` looks like a download's GUID (hex digits and dashes): it names a file.
fn is_guid(g: &str) -> bool {
    (8..=64).contains(&g.len()) && g.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// A page's suggested name as a file name in the Downloads directory: one component (`/`,
/// `\`, NUL and control characters become `_`), no leading dots or spaces (no `..`, no hidden
/// file), at most [`MAX_NAME`] bytes (the extension kept), never one the browser uses for a
/// running download (`.crdownload`); `download` when nothing is left.
pub fn clean_name(suggested: &str) -> String {
    let s: String = suggested.chars().map(|c| if c == '/' || c == '\\' || c.is_control() { '_' } else { c }).collect();
    let s = s.trim().trim_start_matches(['.', ' ']).trim_end_matches(['.', ' ']);
    let mut s = if s.is_empty() { "download".to_string() } else { s.to_string() };
    if s.to_ascii_lowercase().ends_with(".crdownload") {
        s.push('_');
    }
    if is_guid(&s) {
        s = format!("download-{s}");
    }
    if s.len() > MAX_NAME {
        let (stem, ext) = split_ext(&s);
        let ext = if ext.len() <= 16 { ext } else { "" };
        let mut cut = MAX_NAME - ext.len();
        while !stem.is_char_boundary(cut.min(stem.len())) {
            cut -= 1;
        }
        s = format!("{}{ext}", &stem[..cut.min(stem.len())]);
    }
    s
}

/// `report.pdf` → (`report`, `.pdf`); no extension: (`name`, ``).
fn split_ext(name: &str) -> (&str, &str) {
    match name.rfind('.') {
        Some(at) if at > 0 => name.split_at(at),
        _ => (name, ""),
    }
}

/// The `n`th name tried for `name`: itself, then `report (1).pdf`, `report (2).pdf`, …
fn numbered(name: &str, n: u32) -> String {
    if n == 0 {
        return name.to_string();
    }
    let (stem, ext) = split_ext(name);
    format!("{stem} ({n}){ext}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_plain_bounded_component() {
        assert_eq!(clean_name("report.pdf"), "report.pdf");
        assert_eq!(clean_name("../../etc/passwd"), "_.._etc_passwd");
        assert_eq!(clean_name(".."), "download");
        assert_eq!(clean_name(".bashrc"), "bashrc");
        assert_eq!(clean_name("  a\u{0}b\nc.txt "), "a_b_c.txt");
        assert_eq!(clean_name(""), "download");
        assert_eq!(clean_name("x.crdownload"), "x.crdownload_");
        assert_eq!(clean_name("a\\b"), "a_b");
        let long = format!("{}.tar.gz", "é".repeat(300));
        let c = clean_name(&long);
        assert!(c.len() <= MAX_NAME && c.ends_with(".gz") && c.starts_with('é'), "{c}");
        assert_eq!(numbered("report.pdf", 0), "report.pdf");
        assert_eq!(numbered("report.pdf", 2), "report (2).pdf");
        assert_eq!(numbered("README", 1), "README (1)");
    }

    /// The file is placed without replacing anything, hashed, and left in the browser's
    /// directory for the caller to remove; a symlink in the GUID's place is refused, never
    /// followed; across filesystems it is copied, a new file of the account.
    #[test]
    fn a_finished_file_is_placed_never_replacing_nor_following() {
        let t = tempfile::tempdir().expect("tmp");
        let ws = t.path().join("workspace");
        std::fs::create_dir(&ws).expect("mkdir");
        let stage = t.path().join("stage");
        std::fs::create_dir(&stage).expect("mkdir");
        let stage_fd = crate::nofollow::open_start(&stage).expect("open");
        let dir_fd = open_dir(&ws, true).expect("Downloads");
        let d = ws.join(DIR);
        let guid = "0a1b2c3d-0000-4000-8000-00000000abcd";
        std::fs::write(d.join("report.pdf"), b"an older one").expect("write");
        std::os::unix::fs::symlink(t.path().join("nowhere"), d.join("report (1).pdf")).expect("symlink");
        std::fs::write(stage.join(guid), b"%PDF new").expect("write");
        let placed = place(stage_fd.as_fd(), guid, dir_fd.as_fd(), "report.pdf", None, 100).expect("placed");
        let want = hex::encode(sha2::Sha256::digest(b"%PDF new"));
        assert_eq!(placed, ("report (2).pdf".to_string(), 8, want.clone()));
        assert_eq!(std::fs::read(d.join("report.pdf")).expect("read"), b"an older one");
        assert!(std::fs::symlink_metadata(d.join("report (1).pdf")).expect("lstat").file_type().is_symlink());
        assert!(!t.path().join("nowhere").exists(), "nothing was written through the link");
        assert_eq!(std::fs::read(d.join("report (2).pdf")).expect("read"), b"%PDF new");
        let m = std::fs::metadata(d.join("report (2).pdf")).expect("stat");
        assert_eq!(m.mode() & 0o777, 0o644);
        // A symlink where the browser's file was: refused.
        std::fs::write(t.path().join("secret"), b"root's").expect("write");
        std::fs::remove_file(stage.join(guid)).expect("rm");
        std::os::unix::fs::symlink(t.path().join("secret"), stage.join(guid)).expect("symlink");
        assert!(place(stage_fd.as_fd(), guid, dir_fd.as_fd(), "s.txt", None, 100).is_err());
        assert!(!d.join("s.txt").exists());
        // Over the cap.
        std::fs::remove_file(stage.join(guid)).expect("rm");
        std::fs::write(stage.join(guid), vec![0u8; 101]).expect("write");
        let why = place(stage_fd.as_fd(), guid, dir_fd.as_fd(), "big.bin", None, 100).expect_err("refused");
        assert!(why.contains("cap"), "{why}");
        // Across filesystems (/dev/shm is a tmpfs): copied.
        if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
            std::fs::write(stage.join(guid), b"%PDF new").expect("write");
            std::fs::create_dir(shm.path().join("ws")).expect("mkdir");
            let other = open_dir(&shm.path().join("ws"), true).expect("Downloads");
            let placed = place(stage_fd.as_fd(), guid, other.as_fd(), "report.pdf", None, 100).expect("copied");
            assert_eq!(placed, ("report.pdf".to_string(), 8, want));
            assert_eq!(std::fs::read(shm.path().join("ws").join(DIR).join("report.pdf")).expect("read"), b"%PDF new");
        }
        // A symlinked Downloads directory is refused.
        let ws2 = t.path().join("ws2");
        std::fs::create_dir(&ws2).expect("mkdir");
        std::os::unix::fs::symlink(t.path(), ws2.join(DIR)).expect("symlink");
        assert!(open_dir(&ws2, true).is_err());
    }
}
