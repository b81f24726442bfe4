//! Command sessions: `bash -lc <command>` in its own process group, with or without a PTY, its
//! output in a bounded buffer. A session lives in the agent, so it keeps running and keeps its
//! output while the link (or the node) is away. Sessions unused for 30 minutes are ended.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::signal::killpg;
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::output::Chunk;
use crate::output::OutputBuf;
use crate::users::Account;

/// Output kept per session.
const BUFFER_BYTES: usize = 8 << 20;
/// How long, and how many, sessions whose end was answered are kept for repeated reads, looks
/// and lists (each keeps its output, up to `BUFFER_BYTES`).
const ANSWERED_FOR: Duration = Duration::from_secs(600);
const ANSWERED_KEPT: usize = 256;
/// A session unused this long is ended (the default of [`Sessions::start_reaper`]).
pub const IDLE_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Why a session call failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No such session.
    #[error("no such session")]
    NotFound,
    /// The id is taken.
    #[error("session id already in use")]
    Exists,
    /// The process could not start.
    #[error("cannot start the command: {0}")]
    Spawn(String),
    /// Input could not be written (the command closed its input).
    #[error("cannot write input: {0}")]
    Input(String),
}

/// How a session stands after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Still running.
    pub running: bool,
    /// Exit code, once exited normally.
    pub exit_code: Option<i32>,
    /// Signal name, once killed by one.
    pub signal: Option<String>,
    /// New output.
    pub chunk: Chunk,
}

/// What starts a session.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// Who starts it (a bot or member id); only they may use it later.
    pub owner: String,
    /// The command for `bash -lc`.
    pub command: String,
    /// Working directory, absolute (empty: the agent's own).
    pub cwd: String,
    /// The account it runs as (`None`: the agent's own, as it is).
    pub account: Option<Arc<Account>>,
    /// Extra environment.
    pub env: HashMap<String, String>,
    /// Run under a PTY.
    pub tty: bool,
    /// Terminal rows.
    pub rows: u16,
    /// Terminal columns.
    pub cols: u16,
}

enum Input {
    Pipe(tokio::process::ChildStdin),
    Pty(tokio::fs::File),
}

struct Session {
    /// Who started it; only they may use it.
    owner: String,
    /// Its command, for lists.
    command: String,
    /// Under a PTY.
    tty: bool,
    /// When it started, unix ms.
    started_ms: u64,
    pgid: i32,
    input: tokio::sync::Mutex<Option<Input>>,
    pty: Option<OwnedFd>,
    out: Mutex<OutputBuf>,
    /// (exit code, signal) once the process exited.
    exit: Mutex<Option<(Option<i32>, Option<String>)>>,
    /// Output readers still open.
    readers: Mutex<usize>,
    changed: Notify,
    last_used: Mutex<Instant>,
    /// Calls waiting on this session now.
    waiting: std::sync::atomic::AtomicUsize,
}

impl Session {
    fn done(&self) -> bool {
        self.exit.lock().unwrap_or_else(|p| p.into_inner()).is_some()
            && *self.readers.lock().unwrap_or_else(|p| p.into_inner()) == 0
    }

    /// The exit, once the command is done (exited, and its output read to the end).
    fn ended(&self) -> Option<(Option<i32>, Option<String>)> {
        let exit = self.exit.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // (Apart: `done` takes the exit lock too.)
        exit.filter(|_| self.done())
    }

    /// The session's state with the chunk `read` takes from its output (told whether it is done).
    fn answer(&self, read: impl FnOnce(&mut OutputBuf, bool) -> Chunk) -> Reply {
        let exit = self.ended();
        let chunk = read(&mut self.out.lock().unwrap_or_else(|p| p.into_inner()), exit.is_some());
        match exit {
            Some((code, signal)) => Reply { running: false, exit_code: code, signal, chunk },
            None => Reply { running: true, exit_code: None, signal: None, chunk },
        }
    }

    fn reply(&self, from: Option<u64>, max: usize) -> Reply {
        self.answer(|out, done| out.read(from, max, done))
    }

    /// Output from `from` as it stands, without moving the cursor.
    fn peek(&self, from: u64, max: usize) -> Reply {
        self.answer(|out, done| out.peek(from, max, done))
    }

    /// Waits until there is output past `from`, the command is done, or `yield_for` passed.
    async fn wait_output(&self, from: u64, yield_for: Duration) {
        let deadline = Instant::now() + yield_for;
        loop {
            let notified = self.changed.notified();
            let more = self.out.lock().unwrap_or_else(|p| p.into_inner()).end() > from;
            if more || self.done() || Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    fn summary(&self, id: &str) -> Summary {
        let exit = self.ended();
        Summary {
            session_id: id.to_string(),
            command: self.command.clone(),
            tty: self.tty,
            started_ms: self.started_ms,
            running: exit.is_none(),
            exit_code: exit.as_ref().and_then(|e| e.0),
            signal: exit.and_then(|e| e.1),
            offset: self.out.lock().unwrap_or_else(|p| p.into_inner()).end(),
        }
    }

    /// Waits until the command is done or `yield_for` passed.
    async fn wait(&self, yield_for: Duration) {
        self.waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.wait_inner(yield_for).await;
        self.waiting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    async fn wait_inner(&self, yield_for: Duration) {
        let deadline = Instant::now() + yield_for;
        loop {
            let notified = self.changed.notified();
            if self.done() || Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

/// One session, for a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The session.
    pub session_id: String,
    /// Its command.
    pub command: String,
    /// Under a PTY.
    pub tty: bool,
    /// When it started, unix ms.
    pub started_ms: u64,
    /// Still running (or its output still being read).
    pub running: bool,
    /// Exit code, once exited normally.
    pub exit_code: Option<i32>,
    /// Signal name, once killed by one.
    pub signal: Option<String>,
    /// The offset after its output so far.
    pub offset: u64,
}

/// A command that ended while no call waited on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The session.
    pub session_id: String,
    /// Who started it.
    pub owner: String,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Signal name.
    pub signal: Option<String>,
}

/// A session whose end was answered: its id, when, and the session.
type Answered = (String, Instant, Arc<Session>);

/// All sessions of this agent.
#[derive(Default, Clone)]
pub struct Sessions {
    inner: Arc<Mutex<HashMap<String, Arc<Session>>>>,
    /// Sessions whose end was answered, kept for a while so that a read whose answer was lost
    /// can be repeated from its offset (`fromOffset`); oldest first.
    answered: Arc<Mutex<std::collections::VecDeque<Answered>>>,
    /// Ends not yet delivered to a node, oldest first (bounded).
    ended: Arc<Mutex<std::collections::VecDeque<Ended>>>,
    ended_changed: Arc<Notify>,
    /// How many sessions' commands are running now.
    running: Arc<tokio::sync::watch::Sender<u32>>,
    /// The environment every session gets over the agent's own (a pooled sandbox's Computer's,
    /// given with its assignment); a session's own environment wins over it.
    base_env: Arc<BTreeMap<String, String>>,
}

fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("SIG{sig}"))
}

fn spawn_reader<R: tokio::io::AsyncRead + Unpin + Send + 'static>(s: Arc<Session>, mut r: R) {
    *s.readers.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break, // EOF; a PTY answers EIO once the last writer closed
                Ok(n) => {
                    s.out.lock().unwrap_or_else(|p| p.into_inner()).push(&buf[..n]);
                    s.changed.notify_waiters();
                }
            }
        }
        *s.readers.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        s.changed.notify_waiters();
    });
}

impl Sessions {
    /// The same with `env` as the environment of every session started from now on: over the
    /// agent's inherited environment (without its own `COMPUTER_AGENT_*` settings, which this
    /// cannot set either), under the account's identity (`HOME`, `USER`, …) and the session's
    /// own environment.
    pub fn with_base_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.base_env = Arc::new(env);
        self
    }

    /// Starts the reaper: a session no call used for `limit` is ended (its process group killed).
    /// It looks every quarter of the limit (at most every minute).
    pub fn start_reaper(&self, limit: Duration) {
        let this = self.clone();
        let every = (limit / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let idle: Vec<String> = {
                    let map = this.inner.lock().unwrap_or_else(|p| p.into_inner());
                    map.iter()
                        .filter(|(_, s)| s.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed() > limit)
                        .map(|(k, _)| k.clone())
                        .collect()
                };
                for id in idle {
                    tracing::info!(session_id = %id, limit_secs = limit.as_secs_f64(), "session unused; ending it");
                    let owner = this.inner.lock().unwrap_or_else(|p| p.into_inner()).get(&id).map(|s| s.owner.clone());
                    if let Some(owner) = owner {
                        let _ = this.kill(&id, &owner, 0).await;
                    }
                }
            }
        });
    }

    /// The session, if `owner` started it (anyone else is told it does not exist).
    fn get(&self, id: &str, owner: &str) -> Result<Arc<Session>, SessionError> {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned().ok_or(SessionError::NotFound)?;
        if s.owner != owner {
            return Err(SessionError::NotFound);
        }
        Ok(s)
    }

    /// Starts a session and waits up to `yield_for` for it to end.
    pub async fn start(&self, id: &str, spec: Spec, yield_for: Duration, max: usize) -> Result<Reply, SessionError> {
        if self.inner.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id) {
            return Err(SessionError::Exists);
        }
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-lc").arg(&spec.command).kill_on_drop(false);
        // The agent's own settings (COMPUTER_AGENT_*, the pairing code among them) are not the
        // session's; its account's identity is.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("COMPUTER_AGENT_") {
                cmd.env_remove(k);
            }
        }
        // The Computer's environment, as a sandbox started for it has it in its own.
        for (k, v) in self.base_env.iter().filter(|(k, _)| !k.starts_with("COMPUTER_AGENT_")) {
            cmd.env(k, v);
        }
        if let Some(a) = &spec.account {
            cmd.env("HOME", &a.home).env("USER", &a.name).env("LOGNAME", &a.name).env("SHELL", &a.shell);
        }
        cmd.envs(&spec.env);
        // The child takes the account, then enters its directory as the account (so a directory
        // it may not enter is refused, never entered with the agent's rights).
        let cwd = if spec.cwd.is_empty() {
            None
        } else {
            Some(std::ffi::CString::new(spec.cwd.clone()).map_err(|_| SessionError::Spawn("cwd has a NUL".into()))?)
        };
        let account = spec.account.clone();
        let become_account = move || -> std::io::Result<()> {
            if let Some(a) = &account {
                a.drop_privileges()?;
            }
            if let Some(dir) = &cwd {
                // SAFETY: chdir with a valid NUL-terminated path.
                if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        };
        let who = spec.account.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| "the agent".into());
        let where_ = if spec.cwd.is_empty() { String::new() } else { format!(" in {}", spec.cwd) };
        let spawn_error = |e: std::io::Error| SessionError::Spawn(format!("as {who}{where_}: {e}"));
        let (child, input, pty, readers): (
            tokio::process::Child,
            Input,
            Option<OwnedFd>,
            Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
        ) = if spec.tty {
            let ws =
                nix::pty::Winsize { ws_row: spec.rows.max(1), ws_col: spec.cols.max(1), ws_xpixel: 0, ws_ypixel: 0 };
            let pty = nix::pty::openpty(Some(&ws), None).map_err(|e| SessionError::Spawn(e.to_string()))?;
            let slave = pty.slave;
            if let Some(a) = spec.account.as_ref().filter(|a| a.switches) {
                // The terminal is the session's: its account owns it, as a login's would.
                nix::unistd::fchown(&slave, Some(nix::unistd::Uid::from_raw(a.uid)), None)
                    .map_err(|e| SessionError::Spawn(format!("cannot give the terminal to {}: {e}", a.name)))?;
            }
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| SessionError::Spawn(e.to_string()));
            cmd.stdin(Stdio::from(dup(&slave)?)).stdout(Stdio::from(dup(&slave)?)).stderr(Stdio::from(dup(&slave)?));
            cmd.env("TERM", spec.env.get("TERM").cloned().unwrap_or_else(|| "xterm-256color".into()));
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    become_account()
                });
            }
            let child = cmd.spawn().map_err(spawn_error)?;
            drop(slave);
            let master = pty.master;
            let reader = tokio::fs::File::from_std(std::fs::File::from(dup(&master)?));
            let writer = tokio::fs::File::from_std(std::fs::File::from(dup(&master)?));
            (child, Input::Pty(writer), Some(master), vec![Box::new(reader)])
        } else {
            // stdout and stderr share one pipe, as `2>&1` would: the output keeps the order in
            // which the command wrote it.
            let (tx, rx) = tokio::net::unix::pipe::pipe().map_err(|e| SessionError::Spawn(e.to_string()))?;
            let out = tx.into_blocking_fd().map_err(|e| SessionError::Spawn(e.to_string()))?;
            let err = out.try_clone().map_err(|e| SessionError::Spawn(e.to_string()))?;
            cmd.stdin(Stdio::piped()).stdout(Stdio::from(out)).stderr(Stdio::from(err)).process_group(0);
            // SAFETY: only async-signal-safe calls between fork and exec (no allocation).
            unsafe {
                cmd.pre_exec(become_account);
            }
            let mut child = cmd.spawn().map_err(spawn_error)?;
            let stdin = child.stdin.take().ok_or_else(|| SessionError::Spawn("no stdin".into()))?;
            // Our copies of the write end went into `cmd`; drop them so the reader sees the end.
            drop(cmd);
            (child, Input::Pipe(stdin), None, vec![Box::new(rx)])
        };
        let pgid = child.id().map(|p| p as i32).unwrap_or(0);
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let s = Arc::new(Session {
            owner: spec.owner.clone(),
            command: spec.command.clone(),
            tty: spec.tty,
            started_ms,
            pgid,
            input: tokio::sync::Mutex::new(Some(input)),
            pty,
            out: Mutex::new(OutputBuf::new(BUFFER_BYTES)),
            exit: Mutex::new(None),
            readers: Mutex::new(0),
            changed: Notify::new(),
            last_used: Mutex::new(Instant::now()),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        });
        for r in readers {
            spawn_reader(s.clone(), r);
        }
        self.running.send_modify(|n| *n += 1);
        {
            let s = s.clone();
            let running = self.running.clone();
            let mut child = child;
            let (ended, ended_changed, id, owner, all) = (
                self.ended.clone(),
                self.ended_changed.clone(),
                id.to_string(),
                spec.owner.clone(),
                self.inner.clone(),
            );
            tokio::spawn(async move {
                let status = child.wait().await;
                running.send_modify(|n| *n = n.saturating_sub(1));
                let exit = match status {
                    Ok(st) => {
                        use std::os::unix::process::ExitStatusExt;
                        (st.code(), st.signal().map(signal_name))
                    }
                    Err(e) => (None, Some(format!("wait failed: {e}"))),
                };
                *s.exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(exit.clone());
                s.changed.notify_waiters();
                // Children that keep the output open do not hold the answer forever.
                tokio::time::sleep(Duration::from_millis(200)).await;
                *s.readers.lock().unwrap_or_else(|p| p.into_inner()) = 0;
                s.changed.notify_waiters();
                // Nobody waited when it ended: tell the node, which emits `computer_session`.
                let unanswered = all.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&id);
                if unanswered && s.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    let mut q = ended.lock().unwrap_or_else(|p| p.into_inner());
                    q.push_back(Ended { session_id: id, owner, exit_code: exit.0, signal: exit.1 });
                    while q.len() > 10_000 {
                        q.pop_front();
                    }
                    drop(q);
                    ended_changed.notify_waiters();
                }
            });
        }
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), s.clone());
        s.wait(yield_for).await;
        Ok(self.finish_call(id, &s, None, max))
    }

    /// Answers output; forgets a session once its end was answered.
    fn finish_call(&self, id: &str, s: &Session, from: Option<u64>, max: usize) -> Reply {
        s.touch();
        let r = s.reply(from, max);
        if !r.running {
            let gone = self.inner.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
            if let Some(gone) = gone {
                let mut kept = self.answered.lock().unwrap_or_else(|p| p.into_inner());
                kept.push_back((id.to_string(), Instant::now(), gone));
                while kept.len() > ANSWERED_KEPT || kept.front().is_some_and(|k| k.1.elapsed() > ANSWERED_FOR) {
                    kept.pop_front();
                }
            }
        }
        r
    }

    /// A session whose end was already answered, for a repeated read from an offset.
    fn answered(&self, id: &str, owner: &str) -> Option<Arc<Session>> {
        let kept = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .rev()
            .find(|(k, at, s)| k == id && s.owner == owner && at.elapsed() <= ANSWERED_FOR)
            .map(|(_, _, s)| s.clone())
    }

    /// A look at a session's output from `from`, waiting up to `yield_for` for some past it:
    /// no input, and neither the cursor nor the session moves. An ended session is answered for
    /// as long as it is kept.
    pub async fn peek(
        &self,
        id: &str,
        owner: &str,
        from: u64,
        yield_for: Duration,
        max: usize,
    ) -> Result<Reply, SessionError> {
        let s = match self.get(id, owner) {
            Ok(s) => s,
            Err(SessionError::NotFound) => self.answered(id, owner).ok_or(SessionError::NotFound)?,
            Err(e) => return Err(e),
        };
        s.wait_output(from, yield_for).await;
        Ok(s.peek(from, max))
    }

    /// The sessions of `owner`: those that run or whose end was not answered yet, then the
    /// ended ones still kept, newest first; at most `ANSWERED_KEPT` of the latter.
    pub fn list(&self, owner: &str) -> Vec<Summary> {
        let mut out: Vec<Summary> = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, s)| s.owner == owner)
            .map(|(id, s)| s.summary(id))
            .collect();
        out.sort_by(|a, b| b.started_ms.cmp(&a.started_ms).then_with(|| a.session_id.cmp(&b.session_id)));
        let kept = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        for (id, at, s) in kept.iter().rev() {
            if s.owner == owner && at.elapsed() <= ANSWERED_FOR && !out.iter().any(|o| &o.session_id == id) {
                out.push(s.summary(id));
            }
        }
        out
    }

    /// Writes input (may be empty: only read) and waits up to `yield_for`.
    #[allow(clippy::too_many_arguments)] // the fields of one request
    pub async fn input(
        &self,
        id: &str,
        owner: &str,
        data: &[u8],
        from: Option<u64>,
        repeat: bool,
        yield_for: Duration,
        max: usize,
    ) -> Result<Reply, SessionError> {
        let s = match (self.get(id, owner), from) {
            (Ok(s), _) => s,
            // Its end was answered, but that answer may have been lost: a repeated read from an
            // offset the caller named (and only a read) gets the same end again.
            (Err(SessionError::NotFound), Some(from)) if repeat && data.is_empty() => {
                let done = self.answered(id, owner).ok_or(SessionError::NotFound)?;
                return Ok(done.reply(Some(from), max));
            }
            (Err(e), _) => return Err(e),
        };
        s.touch();
        if !data.is_empty() {
            let mut input = s.input.lock().await;
            let res = match input.as_mut() {
                Some(Input::Pipe(w)) => w.write_all(data).await.and(w.flush().await),
                Some(Input::Pty(w)) => w.write_all(data).await.and(w.flush().await),
                None => Err(std::io::Error::other("input closed")),
            };
            if let Err(e) = res {
                *input = None;
                return Err(SessionError::Input(e.to_string()));
            }
        }
        s.wait(yield_for).await;
        Ok(self.finish_call(id, &s, from, max))
    }

    /// Sets the terminal size (the kernel sends SIGWINCH to the foreground group).
    pub fn resize(&self, id: &str, owner: &str, rows: u16, cols: u16) -> Result<(), SessionError> {
        let s = self.get(id, owner)?;
        s.touch();
        if let Some(m) = &s.pty {
            let ws = libc::winsize { ws_row: rows.max(1), ws_col: cols.max(1), ws_xpixel: 0, ws_ypixel: 0 };
            // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer on an open PTY master.
            unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
        }
        Ok(())
    }

    /// Kills the whole process group and answers the last output.
    pub async fn kill(&self, id: &str, owner: &str, max: usize) -> Result<Reply, SessionError> {
        let s = self.get(id, owner)?;
        if s.pgid > 0 {
            let _ = killpg(Pid::from_raw(s.pgid), Signal::SIGKILL);
        }
        s.wait(Duration::from_secs(5)).await;
        Ok(self.finish_call(id, &s, None, max))
    }

    /// Waits for and takes the ends not yet delivered.
    pub async fn next_ended(&self) -> Vec<Ended> {
        loop {
            let notified = self.ended_changed.notified();
            {
                let mut q = self.ended.lock().unwrap_or_else(|p| p.into_inner());
                if !q.is_empty() {
                    return q.drain(..).collect();
                }
            }
            notified.await;
        }
    }

    /// Puts back ends whose delivery failed (at the front, in order).
    pub fn requeue(&self, items: Vec<Ended>) {
        let mut q = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        for e in items.into_iter().rev() {
            q.push_front(e);
        }
        drop(q);
        self.ended_changed.notify_waiters();
    }

    /// The number of sessions whose command runs, as it changes.
    pub fn running(&self) -> tokio::sync::watch::Receiver<u32> {
        self.running.subscribe()
    }

    /// How many sessions live.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when no session lives.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cmd: &str) -> Spec {
        Spec { command: cmd.into(), rows: 24, cols: 80, ..Default::default() }
    }

    #[tokio::test]
    async fn a_quick_command_answers_its_exit_and_output() {
        let s = Sessions::default();
        let r =
            s.start("a", spec("echo hi; echo err >&2; exit 3"), Duration::from_secs(10), 1000).await.expect("start");
        assert!(!r.running);
        assert_eq!(r.exit_code, Some(3));
        assert!(r.chunk.text.contains("hi\n") && r.chunk.text.contains("err\n"), "{:?}", r.chunk.text);
        assert!(s.is_empty(), "a finished session is forgotten once answered");
    }

    #[tokio::test]
    async fn stdout_and_stderr_keep_the_order_they_were_written_in() {
        let s = Sessions::default();
        let script = "for i in $(seq 1 200); do echo o$i; echo e$i >&2; done";
        let r = s.start("o", spec(script), Duration::from_secs(20), 1 << 20).await.expect("start");
        let want: String = (1..=200).map(|i| format!("o{i}\ne{i}\n")).collect();
        assert_eq!(r.chunk.text, want);
    }

    #[tokio::test]
    async fn an_answered_end_can_be_read_again_from_an_offset() {
        let s = Sessions::default();
        let r = s.start("r", spec("echo one; sleep 0.3; echo two"), Duration::from_millis(250), 1000).await;
        let r = r.expect("start");
        assert!(r.running);
        let first = s.input("r", "", b"", None, false, Duration::from_secs(5), 1000).await.expect("read");
        // Under load `one` may come after the start's 0.25 s wait: what matters is that the two
        // answers together are the whole output and this one ends it.
        let rest = first.chunk.text.clone();
        assert_eq!((first.running, format!("{}{rest}", r.chunk.text)), (false, "one\ntwo\n".to_string()));
        // That answer was lost: a plain call is told the session is gone, a repeated read from the
        // offset before it gets the same end again, and only the owner does.
        assert!(matches!(
            s.input("r", "", b"", None, false, Duration::from_millis(250), 1000).await,
            Err(SessionError::NotFound)
        ));
        let from = Some(r.chunk.offset);
        let again = s.input("r", "", b"", from, true, Duration::from_millis(250), 1000).await.expect("again");
        assert_eq!((again.running, again.chunk.text.as_str(), again.exit_code), (false, rest.as_str(), Some(0)));
        assert!(matches!(
            s.input("r", "stranger", b"", from, true, Duration::from_millis(250), 1000).await,
            Err(SessionError::NotFound)
        ));
    }

    #[tokio::test]
    async fn input_reaches_the_command_and_kill_ends_the_group() {
        let s = Sessions::default();
        let r = s.start("c", spec("cat"), Duration::from_millis(250), 1000).await.expect("start");
        assert!(r.running);
        assert!(matches!(
            s.input("c", "someone-else", b"x", None, false, Duration::from_millis(250), 10).await,
            Err(SessionError::NotFound)
        ));
        let r = s.input("c", "", b"ping\n", None, false, Duration::from_millis(500), 1000).await.expect("input");
        assert_eq!(r.chunk.text, "ping\n");
        let r = s
            .start("k", spec("trap '' HUP; sleep 1000 & sleep 1000"), Duration::from_millis(250), 1000)
            .await
            .expect("start");
        assert!(r.running);
        let r = s.kill("k", "", 1000).await.expect("kill");
        assert_eq!((r.running, r.signal.as_deref()), (false, Some("SIGKILL")));
    }

    #[tokio::test]
    async fn the_base_env_reaches_a_session_and_its_own_env_wins() {
        let base = BTreeMap::from([
            ("POOL_GREETING".to_string(), "hello".to_string()),
            ("POOL_SHARED".to_string(), "from-the-computer".to_string()),
            ("COMPUTER_AGENT_SNEAKY".to_string(), "no".to_string()),
        ]);
        let s = Sessions::default().with_base_env(base);
        let mut t = spec(r#"echo "$POOL_GREETING|$POOL_SHARED|${COMPUTER_AGENT_SNEAKY-unset}""#);
        t.env.insert("POOL_SHARED".into(), "from-the-session".into());
        let r = s.start("e", t, Duration::from_secs(10), 1000).await.expect("start");
        assert_eq!(r.chunk.text, "hello|from-the-session|unset\n", "{r:?}");
        // Without a session's own, the base's value stands; a clone shares the base.
        let r = s.clone().start("f", spec("echo $POOL_SHARED"), Duration::from_secs(10), 1000).await.expect("start");
        assert_eq!(r.chunk.text, "from-the-computer\n");
        let plain = Sessions::default();
        let r = plain.start("g", spec("echo ${POOL_GREETING-none}"), Duration::from_secs(10), 1000).await;
        assert_eq!(r.expect("start").chunk.text, "none\n");
    }

    #[tokio::test]
    async fn a_tty_session_has_a_terminal() {
        let s = Sessions::default();
        let mut t = spec("tty >/dev/null && echo is-a-tty; stty size");
        t.tty = true;
        t.rows = 33;
        t.cols = 101;
        let r = s.start("t", t, Duration::from_secs(10), 1000).await.expect("start");
        assert!(r.chunk.text.contains("is-a-tty") && r.chunk.text.contains("33 101"), "{:?}", r.chunk.text);
    }
}
