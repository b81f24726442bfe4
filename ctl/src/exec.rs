//! `computerctl exec`: a command in a Computer, its output streamed as it comes.
//!
//! The command starts as a session (`POST …/sessions`). Its output is read from the session's
//! event stream (`GET …/sessions/:sid/output`, server-sent events whose ids are output offsets),
//! which only looks: nothing is lost when a stream window ends or a connection breaks, the next
//! one resumes from the last offset (`Last-Event-ID`). With `-i`, what is typed goes to the
//! session's input (`POST …/input`), in order, a batch per call; with `-t` the session has a
//! terminal of this terminal's size, this terminal is put in raw mode (Ctrl-C, Ctrl-D and arrows
//! go to the Computer), and a resize here resizes it there.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::Context;
use anyhow::bail;
use computerd_client::Client;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// What to run, and how.
pub struct ExecArgs {
    /// The Computer.
    pub computer: String,
    /// The command line for `bash -lc`.
    pub command: String,
    /// Forward this process's stdin.
    pub interactive: bool,
    /// Give the session a terminal.
    pub tty: bool,
    /// `root` or `user`.
    pub user: Option<String>,
    /// The working directory.
    pub cwd: Option<String>,
    /// `NAME=value` pairs.
    pub env: Vec<(String, String)>,
}

/// Joins argv into one command line for `bash -lc`: a single argument is taken as a command line
/// (so `exec ID 'ls | wc -l'` works), several are quoted one by one (so `exec ID python3 -c
/// 'print(42)'` keeps its arguments).
pub fn command_line(args: &[String]) -> String {
    if args.len() == 1 {
        return args[0].clone();
    }
    args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

fn quote(a: &str) -> String {
    let plain = !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if plain { a.to_string() } else { format!("'{}'", a.replace('\'', r"'\''")) }
}

/// Bytes as the input call's C-escaped `chars`: printable ASCII as is, the rest as `\xHH`.
pub fn escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

/// The exit status a shell would give: the code, or 128 + the signal's number.
fn status(end: &Value) -> i32 {
    if let Some(code) = end["exitCode"].as_i64() {
        return code.clamp(0, 255) as i32;
    }
    let signal = end["signal"].as_str().unwrap_or_default();
    let name = if signal.starts_with("SIG") { signal.to_string() } else { format!("SIG{signal}") };
    name.parse::<nix::sys::signal::Signal>().map(|s| 128 + s as i32).unwrap_or(255)
}

/// This terminal's size, if stdout is one.
fn terminal_size() -> Option<(u16, u16)> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a `winsize` into the pointer, which lives for the call.
    let r = unsafe { libc::ioctl(std::io::stdout().as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// Raw mode on this terminal's stdin until dropped.
struct RawMode(nix::sys::termios::Termios);

impl RawMode {
    fn on() -> Option<RawMode> {
        use nix::sys::termios;
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), termios::SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(std::io::stdin().as_fd(), nix::sys::termios::SetArg::TCSANOW, &self.0);
    }
}

/// Runs the command; answers its exit status.
pub async fn run(client: &Client, a: ExecArgs) -> anyhow::Result<i32> {
    let size = if a.tty { terminal_size().unwrap_or((24, 80)) } else { (24, 80) };
    let mut body = json!({
        "command": a.command,
        "tty": a.tty,
        "rows": size.0,
        "cols": size.1,
        // The start answers at once; the output comes from the stream.
        "yieldTimeMs": 250,
        "maxOutputBytes": 1,
        "env": a.env.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect::<serde_json::Map<String, Value>>(),
    });
    if let Some(u) = &a.user {
        body["user"] = u.clone().into();
    }
    if let Some(c) = &a.cwd {
        body["cwd"] = c.clone().into();
    }
    let base = format!("/v1/computers/{}/sessions", a.computer);
    let started = client.request(Method::POST, &base, Some(&body)).await?;
    let sid = started["sessionId"].as_str().context("the start answered no sessionId")?.to_string();
    let session = format!("{base}/{sid}");

    let raw = if a.tty && a.interactive && nix::unistd::isatty(std::io::stdin().as_fd()).unwrap_or(false) {
        RawMode::on()
    } else {
        None
    };
    if a.interactive {
        tokio::spawn(forward_stdin(client.clone(), session.clone()));
    }
    if a.tty {
        tokio::spawn(follow_resizes(client.clone(), session.clone()));
    }
    if raw.is_none() {
        // Without a raw terminal, Ctrl-C here ends the command there, then this program.
        let (client, session) = (client.clone(), session.clone());
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                let _ = client.request(Method::DELETE, &session, None).await;
                std::process::exit(130);
            }
        });
    }
    let end = stream_output(client, &session).await;
    drop(raw);
    end.map(|e| status(&e))
}

/// Copies the session's output to stdout until it ends; answers the `end` event's data.
async fn stream_output(client: &Client, session: &str) -> anyhow::Result<Value> {
    let mut offset: u64 = 0;
    let mut failures = 0u32;
    let mut out = std::io::stdout();
    loop {
        let resp = client
            .raw(Method::GET, &format!("{session}/output?fromOffset={offset}"))
            .header("Last-Event-ID", offset.to_string())
            .header("Accept", "text/event-stream")
            .send()
            .await;
        let resp = match resp {
            Ok(r) => Client::check(r).await?,
            Err(e) => {
                // Reads are safe to repeat; give a broken connection a few tries.
                failures += 1;
                if failures > 5 {
                    bail!("the output stream broke: {e}");
                }
                tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
                continue;
            }
        };
        let mut events = crate::sse::Reader::new(resp);
        loop {
            match events.next().await {
                Ok(Some(ev)) => {
                    failures = 0;
                    let data: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
                    if let Some(o) = data["offset"].as_u64() {
                        offset = o;
                    }
                    match ev.event.as_str() {
                        "output" => {
                            out.write_all(data["output"].as_str().unwrap_or_default().as_bytes())?;
                            out.flush()?;
                        }
                        "end" => return Ok(data),
                        _ => {}
                    }
                }
                // The window ended: resume from the last offset.
                Ok(None) => break,
                Err(_) => {
                    failures += 1;
                    break;
                }
            }
        }
    }
}

/// Sends what is typed, in order; keys typed while a call is out go in the next one.
async fn forward_stdin(client: Client, session: String) {
    use tokio::io::AsyncReadExt;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 || tx.send(buf[..n].to_vec()).await.is_err() {
                break;
            }
        }
    });
    let input = format!("{session}/input");
    while let Some(mut batch) = rx.recv().await {
        while let Ok(more) = rx.try_recv() {
            batch.extend_from_slice(&more);
        }
        let body = json!({"chars": escape(&batch), "yieldTimeMs": 250, "maxOutputBytes": 1});
        if client.request(Method::POST, &input, Some(&body)).await.is_err() {
            // The session ended (or the link is gone): the output stream says which.
            break;
        }
    }
}

/// Resizes the session's terminal when this one is resized.
async fn follow_resizes(client: Client, session: String) {
    use tokio::signal::unix::SignalKind;
    let Ok(mut winch) = tokio::signal::unix::signal(SignalKind::window_change()) else { return };
    let resize = format!("{session}/resize");
    while winch.recv().await.is_some() {
        if let Some((rows, cols)) = terminal_size() {
            let _ = client.request(Method::POST, &resize, Some(&json!({"rows": rows, "cols": cols}))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_quoted_and_one_argument_is_a_command_line() {
        assert_eq!(command_line(&["ls | wc -l".into()]), "ls | wc -l");
        assert_eq!(
            command_line(&["python3".into(), "-c".into(), "print('hi there')".into()]),
            r"python3 -c 'print('\''hi there'\'')'"
        );
        assert_eq!(command_line(&["echo".into(), "".into()]), "echo ''");
    }

    #[test]
    fn typed_bytes_are_escaped_for_the_input_call() {
        assert_eq!(escape(b"1+1\r"), r"1+1\x0d");
        assert_eq!(escape(b"a\\b\x03"), r"a\\b\x03");
        assert_eq!(escape("é".as_bytes()), r"\xc3\xa9");
    }

    #[test]
    fn exit_status_follows_the_shell() {
        assert_eq!(status(&json!({"exitCode": 3})), 3);
        assert_eq!(status(&json!({"exitCode": null, "signal": "SIGKILL"})), 137);
        assert_eq!(status(&json!({"exitCode": null, "signal": "TERM"})), 143);
        assert_eq!(status(&json!({})), 255);
    }
}
