//! The agent's gRPC service, served over the link. Every call must carry the current link
//! generation; calls of an older (replaced) link are refused.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use computerd_proto::ErrorKind;
use computerd_proto::LINK_GENERATION;
use computerd_proto::agent::DirListing;
use computerd_proto::agent::FileChunk;
use computerd_proto::agent::FileEdit;
use computerd_proto::agent::FileInfo;
use computerd_proto::agent::FilePath;
use computerd_proto::agent::Nothing;
use computerd_proto::agent::Resize;
use computerd_proto::agent::SessionInput;
use computerd_proto::agent::SessionRef;
use computerd_proto::agent::SessionReply;
use computerd_proto::agent::StartSession;
use computerd_proto::agent::agent_server::Agent;
use futures::Stream;
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic::Streaming;

use crate::files;
use crate::files::FileError;
use crate::sessions::Reply;
use crate::sessions::SessionError;
use crate::sessions::Sessions;
use crate::sessions::Spec;
use crate::users;
use crate::users::Account;
use crate::users::UserError;
use crate::users::Users;

/// The service; clones share the sessions.
#[derive(Clone)]
pub struct AgentService {
    /// Processes.
    pub sessions: Sessions,
    /// Where relative paths resolve.
    pub workdir: PathBuf,
    /// The generation of the current link (0: none yet).
    pub generation: Arc<AtomicU64>,
    /// MCP tool packages (`None`: this agent does not host them).
    pub tools: Option<crate::mcp::bindings::Tools>,
    /// Who calls run as.
    pub users: Users,
    /// The desktop (`None`: this Computer has none, or its owner did not opt in).
    pub desktop: Option<crate::desktop::Desktop>,
    /// Tunnels to this machine's ports may be opened (its public port addresses: `--ports`).
    pub ports: bool,
    /// The browser (`None`: this Computer has none: `--browser`).
    pub browser: Option<crate::browser::Browser>,
}

fn check<T>(g: &AtomicU64, req: &Request<T>) -> Result<(), Status> {
    let want = g.load(Ordering::SeqCst);
    let got = req.metadata().get(LINK_GENERATION).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if got == Some(want) && want > 0 {
        Ok(())
    } else {
        Err(ErrorKind::StaleLink.status(format!("stale link generation {got:?}; current is {want}")))
    }
}

fn session_status(e: SessionError) -> Status {
    match e {
        SessionError::NotFound => ErrorKind::NotFound.status("no such session"),
        SessionError::Exists => ErrorKind::Conflict.status("session id in use"),
        SessionError::Spawn(m) => ErrorKind::InvalidRequest.status(m),
        SessionError::Input(m) => ErrorKind::InvalidRequest.status(m),
    }
}

fn file_status(e: FileError) -> Status {
    match e {
        FileError::InvalidPath(m) => ErrorKind::InvalidRequest.status(m),
        FileError::NotFound => ErrorKind::NotFound.status("no such file or directory"),
        FileError::IsDirectory => ErrorKind::InvalidRequest.status("is a directory"),
        FileError::NotDirectory => ErrorKind::InvalidRequest.status("not a directory"),
        FileError::PermissionDenied => ErrorKind::Forbidden.status("permission denied"),
        FileError::TooLarge => ErrorKind::TooLarge.status(format!("larger than {} bytes", files::MAX_FILE)),
        e @ FileError::NotRegular(_) => ErrorKind::InvalidRequest.status(e.to_string()),
        FileError::Io(m) => ErrorKind::Internal.status(m),
    }
}

fn edit_status(e: files::EditError) -> Status {
    match e {
        files::EditError::File(e) => file_status(e),
        e @ (files::EditError::Missing | files::EditError::NotUnique(_)) => {
            ErrorKind::InvalidRequest.status(e.to_string())
        }
        e @ files::EditError::Changed => ErrorKind::Conflict.status(e.to_string()),
        e @ files::EditError::Owner(_) => ErrorKind::Forbidden.status(e.to_string()),
    }
}

fn user_status(e: UserError) -> Status {
    match e {
        UserError::Unknown(_) => ErrorKind::InvalidRequest.status(e.to_string()),
        UserError::NoRoot(..) => ErrorKind::ComputerUnsupported.status(e.to_string()),
        UserError::RootForbidden => ErrorKind::Forbidden.status(e.to_string()),
    }
}

/// A call's thread could not be made or stopped.
fn thread_status(e: std::io::Error) -> Status {
    ErrorKind::Internal.status(format!("cannot run the call as its account: {e}"))
}

fn reply(id: &str, r: Reply) -> SessionReply {
    SessionReply {
        session_id: id.to_string(),
        running: r.running,
        exit_code: r.exit_code,
        signal: r.signal,
        output: r.chunk.text,
        truncated: r.chunk.truncated,
        offset: r.chunk.offset,
    }
}

fn info(e: files::Entry) -> FileInfo {
    FileInfo { name: e.name, kind: e.kind.into(), size: e.size, mode: e.mode, mtime: e.mtime, sha256: String::new() }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<FileChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for AgentService {
    async fn start(&self, req: Request<StartSession>) -> Result<Response<SessionReply>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        let account = self.users.for_call(&r.user, r.root_allowed).map_err(user_status)?;
        // Relative to the workspace, like a file call's path.
        let cwd = if r.cwd.is_empty() {
            self.workdir.clone()
        } else {
            files::resolve(&self.workdir, &r.cwd).map_err(file_status)?
        };
        let spec = Spec {
            owner: r.owner,
            command: r.command,
            cwd: cwd.to_string_lossy().into_owned(),
            account: Some(account),
            env: r.env.into_iter().collect(),
            tty: r.tty,
            rows: r.rows.min(u16::MAX as u32) as u16,
            cols: r.cols.min(u16::MAX as u32) as u16,
        };
        let out = self
            .sessions
            .start(&r.session_id, spec, Duration::from_millis(r.yield_ms as u64), r.max_output_bytes as usize)
            .await
            .map_err(session_status)?;
        Ok(Response::new(reply(&r.session_id, out)))
    }

    async fn input(&self, req: Request<SessionInput>) -> Result<Response<SessionReply>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        if r.peek {
            if !r.data.is_empty() {
                return Err(ErrorKind::InvalidRequest.status("a look sends no input"));
            }
            let yield_for = Duration::from_millis(r.yield_ms as u64);
            let from = r.from_offset.unwrap_or(0);
            let out = self
                .sessions
                .peek(&r.session_id, &r.owner, from, yield_for, r.max_output_bytes as usize)
                .await
                .map_err(session_status)?;
            return Ok(Response::new(reply(&r.session_id, out)));
        }
        let out = self
            .sessions
            .input(
                &r.session_id,
                &r.owner,
                &r.data,
                r.from_offset,
                r.repeat,
                Duration::from_millis(r.yield_ms as u64),
                r.max_output_bytes as usize,
            )
            .await
            .map_err(session_status)?;
        Ok(Response::new(reply(&r.session_id, out)))
    }

    async fn resize_terminal(&self, req: Request<Resize>) -> Result<Response<Nothing>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        self.sessions
            .resize(&r.session_id, &r.owner, r.rows.min(u16::MAX as u32) as u16, r.cols.min(u16::MAX as u32) as u16)
            .map_err(session_status)?;
        Ok(Response::new(Nothing {}))
    }

    async fn kill(&self, req: Request<SessionRef>) -> Result<Response<SessionReply>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        let out =
            self.sessions.kill(&r.session_id, &r.owner, r.max_output_bytes as usize).await.map_err(session_status)?;
        Ok(Response::new(reply(&r.session_id, out)))
    }

    async fn list_sessions(
        &self,
        req: Request<SessionRef>,
    ) -> Result<Response<computerd_proto::agent::SessionList>, Status> {
        check(&self.generation, &req)?;
        let owner = req.into_inner().owner;
        let sessions = self
            .sessions
            .list(&owner)
            .into_iter()
            .map(|s| computerd_proto::agent::SessionSummary {
                session_id: s.session_id,
                command: s.command,
                tty: s.tty,
                started_ms: s.started_ms,
                running: s.running,
                exit_code: s.exit_code,
                signal: s.signal,
                offset: s.offset,
            })
            .collect();
        Ok(Response::new(computerd_proto::agent::SessionList { sessions }))
    }

    type ReadFileStream = ChunkStream;

    async fn read_file(&self, req: Request<FilePath>) -> Result<Response<ChunkStream>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        let (account, path) = self.file_call(&r.user, r.root_allowed, &r.path)?;
        if r.length.is_some_and(|n| n > files::MAX_FILE) {
            return Err(file_status(FileError::TooLarge));
        }
        let range = r.offset.or(r.length.map(|_| 0));
        let (f, total) = match range {
            Some(offset) => {
                let (f, size) = users::run_as(&account, move || files::open_range(&path, offset))
                    .await
                    .map_err(thread_status)?
                    .map_err(file_status)?;
                (f, Some(size))
            }
            None => {
                let f = users::run_as(&account, move || files::open_read(&path)).await.map_err(thread_status)?;
                (f.map_err(file_status)?, None)
            }
        };
        if !r.within.is_empty() && !files::opened_within(&f, &r.within) {
            return Err(ErrorKind::Forbidden.status("the file is outside the paths this bot's grant names"));
        }
        let limit = r.length.unwrap_or(files::MAX_FILE);
        Ok(Response::new(stream_file(tokio::fs::File::from_std(f), limit, total)))
    }

    async fn edit_file(&self, req: Request<FileEdit>) -> Result<Response<FileInfo>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        let (account, path) = self.file_call(&r.user, r.root_allowed, &r.path)?;
        let (old, new) = (r.old.into_bytes(), r.new.into_bytes());
        let entry = users::run_as(&account, move || files::edit(&path, &old, &new)).await.map_err(thread_status)?;
        Ok(Response::new(info(entry.map_err(edit_status)?)))
    }

    async fn write_file(&self, req: Request<Streaming<FileChunk>>) -> Result<Response<FileInfo>, Status> {
        check(&self.generation, &req)?;
        let mut stream = req.into_inner();
        let first = stream.next().await.ok_or_else(|| ErrorKind::InvalidRequest.status("empty write"))??;
        let head = WriteHead {
            path: first.path,
            user: first.user,
            root_allowed: first.root_allowed,
            expect_size: first.expect_size,
            expect_sha256: first.expect_sha256,
        };
        let rest = stream.map(|c| c.map(|c| c.data));
        Ok(Response::new(self.write(head, futures::stream::iter([Ok(first.data)]).chain(rest)).await?))
    }

    async fn remove_file(&self, req: Request<FilePath>) -> Result<Response<Nothing>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        let (account, path) = self.file_call(&r.user, r.root_allowed, &r.path)?;
        users::run_as(&account, move || files::remove(&path)).await.map_err(thread_status)?.map_err(file_status)?;
        Ok(Response::new(Nothing {}))
    }

    async fn list_directory(&self, req: Request<FilePath>) -> Result<Response<DirListing>, Status> {
        check(&self.generation, &req)?;
        let r = req.into_inner();
        let (account, path) = self.file_call(&r.user, r.root_allowed, &r.path)?;
        let within = r.within;
        let entries = if within.is_empty() {
            users::run_as(&account, move || files::list(&path)).await.map_err(thread_status)?.map_err(file_status)?
        } else {
            users::run_as(&account, move || files::list_within(&path, &within))
                .await
                .map_err(thread_status)?
                .map_err(file_status)?
                .ok_or_else(|| {
                    ErrorKind::Forbidden.status("the directory is outside the paths this bot's grant names")
                })?
        };
        Ok(Response::new(DirListing { entries: entries.into_iter().map(info).collect() }))
    }

    async fn mcp(
        &self,
        req: Request<computerd_proto::agent::McpJson>,
    ) -> Result<Response<computerd_proto::agent::McpJson>, Status> {
        check(&self.generation, &req)?;
        let Some(tools) = &self.tools else {
            return Err(ErrorKind::ComputerUnsupported.status("this agent does not host tool packages"));
        };
        let request: crate::mcp::bindings::McpRequest = serde_json::from_str(&req.get_ref().json)
            .map_err(|e| ErrorKind::InvalidRequest.status(format!("bad MCP request: {e}")))?;
        let reply = tools.handle(request).await;
        let json = serde_json::to_string(&reply).map_err(|e| ErrorKind::Internal.status(e.to_string()))?;
        Ok(Response::new(computerd_proto::agent::McpJson { json }))
    }

    async fn desktop(
        &self,
        req: Request<computerd_proto::agent::DesktopCall>,
    ) -> Result<Response<computerd_proto::agent::DesktopReply>, Status> {
        check(&self.generation, &req)?;
        let Some(desktop) = &self.desktop else {
            return Err(ErrorKind::ComputerUnsupported.status("this computer has no desktop"));
        };
        let call = req.into_inner();
        let op: computerd_proto::desktop::DesktopOp = serde_json::from_str(&call.json)
            .map_err(|e| ErrorKind::InvalidRequest.status(format!("bad desktop request: {e}")))?;
        if call.caller.is_empty() {
            return Err(ErrorKind::InvalidRequest.status("a desktop call names its caller"));
        }
        let answer = desktop.call(op, call.caller).await.map_err(|e| e.kind.status(e.message))?;
        let json = serde_json::to_string(&answer.json).map_err(|e| ErrorKind::Internal.status(e.to_string()))?;
        Ok(Response::new(computerd_proto::agent::DesktopReply { json, image: answer.image }))
    }

    async fn browser(
        &self,
        req: Request<computerd_proto::agent::DesktopCall>,
    ) -> Result<Response<computerd_proto::agent::DesktopReply>, Status> {
        check(&self.generation, &req)?;
        let Some(browser) = &self.browser else {
            return Err(ErrorKind::ComputerUnsupported
                .status("this computer has no browser (create it with \"desktop\": true)"));
        };
        let call = req.into_inner();
        // Not serde's message as it is: a `fill_secret` carries an opened secret (`parse_op`).
        let op = crate::browser::parse_op(&call.json).map_err(|e| ErrorKind::InvalidRequest.status(e))?;
        if call.caller.is_empty() {
            return Err(ErrorKind::InvalidRequest.status("a browser call names its caller"));
        }
        let answer = browser.call(op, &call.caller).await.map_err(|e| e.kind.status(e.message))?;
        let json = serde_json::to_string(&answer.json).map_err(|e| ErrorKind::Internal.status(e.to_string()))?;
        Ok(Response::new(computerd_proto::agent::DesktopReply { json, image: answer.image }))
    }

    async fn ping(&self, req: Request<Nothing>) -> Result<Response<Nothing>, Status> {
        check(&self.generation, &req)?;
        Ok(Response::new(Nothing {}))
    }
}

/// What a write names: the first chunk of `WriteFile`, or a write tunnel's opening.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WriteHead {
    path: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    root_allowed: bool,
    /// The write is refused unless exactly this many bytes arrive.
    #[serde(default)]
    expect_size: Option<u64>,
    /// The write is refused unless what arrives hashes to this (hex SHA-256).
    #[serde(default)]
    expect_sha256: String,
}

impl AgentService {
    /// Writes a file from `data` as [`WriteHead`] says: into a temporary file of the account,
    /// hashed and synced, then checked and put in place (nothing is put in place on any error,
    /// and a stream that ends with an error or is dropped leaves nothing behind).
    async fn write<S>(&self, head: WriteHead, mut data: S) -> Result<FileInfo, Status>
    where
        S: Stream<Item = Result<bytes::Bytes, Status>> + Unpin,
    {
        let (account, path) = self.file_call(&head.user, head.root_allowed, &head.path)?;
        let target = path.clone();
        let begun = users::run_as(&account, move || files::begin_write(&target))
            .await
            .map_err(thread_status)?
            .map_err(file_status)?;
        // The guard removes the temporary file on any early return, and also when the call is
        // cancelled (the node resets the stream and this future is dropped mid-write).
        let tmp = files::TempFile::new(begun.temp.clone(), account.clone());
        let mode = begun.mode;
        // The disk is written, and what is written hashed, on two threads of their own while
        // this task receives the next chunk; the file is synced before it is checked and put in
        // place.
        let mut f = computerd_proto::durable::DurableWriter::start_hashed(begun.file);
        let mut total = 0u64;
        while let Some(chunk) = data.next().await {
            let chunk = chunk?;
            total += chunk.len() as u64;
            if total > files::MAX_FILE {
                return Err(file_status(FileError::TooLarge));
            }
            f.write(chunk).await.map_err(|e| file_status(e.into()))?;
        }
        let (f, digest) = f.finish_hashed().await.map_err(|e| file_status(e.into()))?;
        let sha256 = hex::encode(digest);
        // A copy that must arrive exactly: checked before it is put in place (the guard removes
        // the temporary file).
        if let Some(want) = head.expect_size.filter(|n| *n != total) {
            return Err(ErrorKind::DigestMismatch.status(format!("{total} bytes arrived, not {want}")));
        }
        if !head.expect_sha256.is_empty() && !head.expect_sha256.eq_ignore_ascii_case(&sha256) {
            return Err(ErrorKind::DigestMismatch
                .status(format!("what arrived hashes to {sha256}, not {}", head.expect_sha256)));
        }
        let temp = tmp.path().to_path_buf();
        let (placed, entry) = users::run_as(&account, move || files::finish_write(&f, mode, &temp, &path))
            .await
            .map_err(thread_status)?;
        if placed {
            tmp.placed();
        }
        let mut answer = info(entry.map_err(file_status)?);
        answer.sha256 = sha256;
        Ok(answer)
    }

    /// A write tunnel (a copy into this machine): the node's bytes until its end, then the answer
    /// as JSON, `{"size", "sha256"}` or `{"error": {"kind", "message"}}`, and this side's end. A
    /// tunnel reset before its end writes nothing.
    async fn serve_write(&self, head: WriteHead, io: computerd_proto::mux::TunnelIo) {
        use futures::SinkExt;
        let (mut from, mut to) = io.split();
        let chunks = futures::stream::poll_fn(|cx| match std::task::ready!(from.poll_next_unpin(cx)) {
            Some(b) => std::task::Poll::Ready(Some(Ok(b))),
            None if from.ended_cleanly() => std::task::Poll::Ready(None),
            None => std::task::Poll::Ready(Some(Err(Status::cancelled("the copy was cut off")))),
        });
        let answer = match self.write(head, chunks).await {
            Ok(info) => serde_json::json!({"size": info.size, "sha256": info.sha256}),
            Err(s) => {
                let kind = ErrorKind::of(&s).unwrap_or(ErrorKind::Internal);
                serde_json::json!({"error": {"kind": kind.as_str(), "message": s.message()}})
            }
        };
        if to.send(bytes::Bytes::from(answer.to_string())).await.is_ok() {
            let _ = to.close().await;
        }
    }

    /// A tunnel the node opened on the link: to a port of this machine (when its owner allowed
    /// ports), to the desktop's VNC server (a person's stream, filtered by its mode), or into a
    /// file (a copy). What it
    /// opens is connected before the tunnel is accepted, so a refusal says why.
    pub async fn serve_tunnel(&self, incoming: computerd_proto::mux::Incoming) {
        let refuse = |incoming: computerd_proto::mux::Incoming, kind: ErrorKind, message: &str| {
            incoming.refuse(kind.as_str(), message);
        };
        let target: serde_json::Value = match serde_json::from_slice(&incoming.open) {
            Ok(v) => v,
            Err(e) => return refuse(incoming, ErrorKind::InvalidRequest, &format!("bad tunnel: {e}")),
        };
        if target["target"] == "write" {
            return match serde_json::from_value::<WriteHead>(target) {
                Ok(head) => self.serve_write(head, incoming.accept()).await,
                Err(e) => refuse(incoming, ErrorKind::InvalidRequest, &format!("bad write: {e}")),
            };
        }
        if target["target"] == "port" {
            if !self.ports {
                let why = "this computer's ports are not reachable from outside";
                return refuse(incoming, ErrorKind::ComputerUnsupported, why);
            }
            let port = target["port"].as_u64().and_then(|p| u16::try_from(p).ok()).unwrap_or(0);
            match crate::ports::connect(port).await {
                Ok(sock) => crate::ports::pump(sock, incoming.accept()).await,
                Err((kind, m)) => refuse(incoming, kind, &m),
            }
            return;
        }
        let Some(desktop) = self.desktop.clone() else {
            return refuse(incoming, ErrorKind::ComputerUnsupported, "this computer has no desktop");
        };
        let open: crate::desktop::stream::Open = match serde_json::from_value(target) {
            Ok(o) => o,
            Err(e) => return refuse(incoming, ErrorKind::InvalidRequest, &format!("bad tunnel: {e}")),
        };
        let sock = match desktop.open_vnc(&open).await {
            Ok(sock) => sock,
            Err((kind, m)) => return refuse(incoming, kind, &m),
        };
        let (from_viewer, to_viewer) = incoming.accept().split();
        if let Err(e) = desktop.pump(open, sock, from_viewer, to_viewer).await {
            tracing::info!(error = %e, "a desktop stream ended");
        }
    }

    /// The account and the resolved path of a file call.
    fn file_call(
        &self,
        user: &str,
        root_allowed: bool,
        path: &str,
    ) -> Result<(std::sync::Arc<Account>, PathBuf), Status> {
        let account = self.users.for_call(user, root_allowed).map_err(user_status)?;
        let path = files::resolve(&self.workdir, path).map_err(file_status)?;
        Ok((account, path))
    }
}

/// A stream of the chunks of a file, read until EOF, at most [`files::MAX_FILE`] bytes: a file
/// that grows past the limit while it is read ends the stream with `too_large`.
/// Streams a file from where it stands. A whole read (`size` `None`) is refused past 16 MiB; a
/// ranged one stops after `limit` bytes, and its first chunk (sent even when nothing is read)
/// carries the file's size.
fn stream_file(mut f: tokio::fs::File, limit: u64, size: Option<u64>) -> ChunkStream {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<FileChunk, Status>>(4);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        let ranged = size.is_some();
        let mut size = size;
        loop {
            let want = if ranged { (limit - total).min(buf.len() as u64) as usize } else { buf.len() };
            let read = if want == 0 { Ok(0) } else { f.read(&mut buf[..want]).await };
            match read {
                Ok(0) => {
                    if let Some(total_size) = size.take() {
                        let _ = tx.send(Ok(FileChunk { total_size: Some(total_size), ..Default::default() })).await;
                    }
                    break;
                }
                Ok(n) => {
                    total += n as u64;
                    if !ranged && total > limit {
                        let _ = tx.send(Err(file_status(FileError::TooLarge))).await;
                        break;
                    }
                    let chunk = FileChunk {
                        data: bytes::Bytes::copy_from_slice(&buf[..n]),
                        total_size: size.take(),
                        ..Default::default()
                    };
                    if tx.send(Ok(chunk)).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(file_status(e.into()))).await;
                    break;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
