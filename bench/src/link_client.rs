//! What `agent-bench` needs to hold many idle links without many agent processes:
//!
//! - [`open_link`]: a minimal agent link, the same handshake and service as `computer-agent`
//!   (`computer_agent::link`): dial `GET /v1/agent/link`, send `{"computerId","credential"}`,
//!   read `{"generation"}`, then serve the link as the agent does ([`computer_agent::link::serve`]:
//!   [`AgentService`] on the HTTP/2 connections the node opens, the session reports, answers to
//!   the node's pings). Only the client's WebSocket buffers are smaller, to keep the bench process
//!   light; the node's side is unchanged.
//! - [`run_echo_server`] and [`open_plain`]: the baseline, a plain WebSocket echo server with
//!   tokio-tungstenite's default settings (the same buffer sizes as the node's axum WebSocket), in
//!   a process of its own, and idle clients of it.
//! - [`rss_kib`] and [`cpu_secs`]: a process's resident memory and CPU time, from `/proc`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context;
use anyhow::Result;
use anyhow::anyhow;
use anyhow::bail;
use computer_agent::pairing::Credential;
use computer_agent::service::AgentService;
use computer_agent::sessions::Sessions;
use futures::SinkExt;
use futures::StreamExt;
use tokio::io::AsyncBufReadExt;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Longest wait for a connection and its first answer (the welcome, or the echo).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that turns the bench binary into the echo server of the baseline.
pub const ECHO_ROLE_ENV: &str = "AGENT_BENCH_ECHO_SERVER";

/// The clients' WebSocket settings: 4 KiB buffers instead of 128 KiB, so that 10 000 clients do
/// not cost the bench process gigabytes. Servers (the node, the echo server) keep the defaults.
fn client_config() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(4 * 1024).write_buffer_size(4 * 1024)
}

/// Opens one link for `cred` to the node at `ws_url` (`ws://…/v1/agent/link`) and serves the
/// agent's gRPC service on it in a task. Answers once the node sent the link generation; the
/// task ends (with the reason) when the link does, and aborting it closes the link.
pub async fn open_link(ws_url: &str, cred: &Credential) -> Result<JoinHandle<String>> {
    let mut ws = connect(ws_url).await?;
    let hello = serde_json::json!({
        "computerId": cred.computer_id,
        "credential": cred.credential,
        "protocol": computerd_proto::LINK_PROTOCOL,
    });
    ws.send(Message::Text(hello.to_string().into())).await.context("send the hello")?;
    let welcome = match tokio::time::timeout(HANDSHAKE_TIMEOUT, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
        Ok(other) => bail!("no welcome from the node: {other:?}"),
        Err(_) => bail!("no welcome from the node within {HANDSHAKE_TIMEOUT:?}"),
    };
    let v: serde_json::Value = serde_json::from_str(&welcome).context("the welcome is not JSON")?;
    let generation = v["generation"].as_u64().ok_or_else(|| anyhow!("refused: {}", v["error"]))?;
    let svc = AgentService {
        browser: None,
        sessions: Sessions::default(),
        tools: None,
        workdir: PathBuf::from("/"),
        generation: Arc::new(AtomicU64::new(generation)),
        users: computer_agent::users::Users::new(None).map_err(|e| anyhow!(e))?,
        desktop: None,
        ports: true,
    };
    let server = computer_agent::link::serve(ws, svc);
    Ok(tokio::spawn(async move {
        match server.await {
            Ok(()) => "the link closed".to_string(),
            Err(e) => format!("the link failed: {e}"),
        }
    }))
}

/// Runs the baseline's echo server until its stdin closes: prints `port <n>` on stdout, then
/// echoes every text and binary message of every WebSocket connection (tokio-tungstenite's
/// default settings). Called by the bench binary when [`ECHO_ROLE_ENV`] is set.
pub fn run_echo_server() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("bind")?;
        let port = listener.local_addr().context("local address")?.port();
        println!("port {port}");
        // The parent holds our stdin; when it goes away (or closes it), so do we.
        tokio::spawn(async {
            let mut sink = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut sink).await;
            std::process::exit(0);
        });
        loop {
            let (stream, _) = listener.accept().await.context("accept")?;
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                while let Some(Ok(m)) = ws.next().await {
                    if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// The echo server of the baseline, a child process (killed on drop).
pub struct EchoServer {
    /// The process.
    pub child: tokio::process::Child,
    /// `ws://127.0.0.1:<port>/`.
    pub url: String,
}

impl EchoServer {
    /// Starts `exe` (this bench binary) as the echo server and waits for its port.
    pub async fn start(exe: &std::path::Path) -> Result<EchoServer> {
        let mut child = tokio::process::Command::new(exe)
            .env(ECHO_ROLE_ENV, "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} as the echo server", exe.display()))?;
        let stdout = child.stdout.take().context("the echo server's stdout")?;
        let mut line = String::new();
        tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio::io::BufReader::new(stdout).read_line(&mut line))
            .await
            .context("the echo server did not print its port")?
            .context("read the echo server's port")?;
        let port: u16 = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("the echo server printed {line:?}, not its port"))?;
        Ok(EchoServer { child, url: format!("ws://127.0.0.1:{port}/") })
    }

    /// Its process id.
    pub fn pid(&self) -> Result<u32> {
        self.child.id().context("the echo server exited")
    }
}

/// Connects a WebSocket client with the clients' settings ([`client_config`]).
async fn connect(url: &str) -> Result<PlainConn> {
    let (ws, _) = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(url, Some(client_config()), false),
    )
    .await
    .context("connecting timed out")?
    .context("connect")?;
    Ok(ws)
}

/// A plain WebSocket client connection, held open and idle.
pub type PlainConn = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Opens one plain connection to the echo server and exchanges one message (so that the server
/// has read and written once, as the node has for a link's hello and welcome).
pub async fn open_plain(url: &str) -> Result<PlainConn> {
    let mut ws = connect(url).await?;
    ws.send(Message::Text("hello".into())).await.context("send")?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) if t.as_str() == "hello" => Ok(ws),
        Ok(other) => bail!("unexpected echo: {other:?}"),
        Err(_) => bail!("no echo within {HANDSHAKE_TIMEOUT:?}"),
    }
}

/// Resident memory of process `pid` (`VmRSS` of `/proc/<pid>/status`), KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:")).with_context(|| format!("no VmRSS in {path}"))?;
    line.trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("{path}: cannot read {line:?}"))
}

/// CPU time (user + system) process `pid` used so far, seconds.
pub fn cpu_secs(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = text.rsplit_once(')').map(|(_, r)| r).with_context(|| format!("{path}: no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime) of proc(5); `rest` starts at field 3.
    let ticks = |i: usize| -> Result<u64> {
        fields.get(i).and_then(|f| f.parse().ok()).with_context(|| format!("{path}: field {} missing", i + 3))
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&hz| hz > 0)
        .context("sysconf(CLK_TCK)")?;
    Ok((ticks(11)? + ticks(12)?) as f64 / hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_rss_and_cpu_are_readable() {
        let me = std::process::id();
        assert!(rss_kib(me).expect("rss") > 0);
        assert!(cpu_secs(me).expect("cpu") >= 0.0);
    }
}
