//! A person's stream of the desktop: x11vnc, started by the agent on first use as the desktop
//! account, listening only on a Unix socket in the desktop's 0700 directory (no TCP port, so
//! no session reaches it), and one tunnel per viewer through the agent's link, its client half
//! filtered by [`super::rfb`]: in `view` mode no input passes; in `control` mode input passes
//! while the viewer holds the input lease (taken at open, renewed by use, ended when the
//! stream closes).
//!
//! Two walls keep a `view` stream from typing: the filter drops its input, and its x11vnc is
//! not the one `control` streams use: a second x11vnc, started with `-viewonly`, on a socket
//! of its own, which ignores every key, pointer and clipboard message it is sent.
//!
//! The tunnel's first message is `{"target": "vnc", "mode": "view"|"control", "holder":
//! "person:…"}`.

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use computerd_proto::ErrorKind;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use super::Desktop;
use super::rfb::Class;
use super::rfb::ClientStream;

/// What a tunnel opens.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Open {
    /// `vnc`.
    pub target: String,
    /// `view` or `control`.
    pub mode: Mode,
    /// The person, as the lease names them (`person:member:mem_…`).
    pub holder: String,
}

/// A stream's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Watch only.
    View,
    /// Watch and use, holding the input lease.
    Control,
}

/// The x11vnc servers the agent keeps: one for `view` streams (`-viewonly`), one for
/// `control` streams.
#[derive(Default)]
pub struct Vnc {
    view: Option<tokio::process::Child>,
    control: Option<tokio::process::Child>,
}

/// The socket the x11vnc of `mode` listens on.
pub fn socket_of(run_dir: &Path, mode: Mode) -> PathBuf {
    run_dir.join(match mode {
        Mode::View => "vnc-view.sock",
        Mode::Control => "vnc.sock",
    })
}

impl Desktop {
    /// Connects to the x11vnc of `mode`, starting it first when it is not running.
    pub async fn vnc(&self, mode: Mode) -> Result<tokio::net::UnixStream, String> {
        let d = &self.inner.display;
        let run_dir = d.authority.parent().ok_or("the desktop has no directory")?.to_path_buf();
        let socket = socket_of(&run_dir, mode);
        let mut vnc = self.inner.vnc.lock().await;
        let child = match mode {
            Mode::View => &mut vnc.view,
            Mode::Control => &mut vnc.control,
        };
        let running = match child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        };
        if !running {
            let account = self.inner.account.clone().ok_or("this desktop has no stream")?;
            let _ = std::fs::remove_file(&socket);
            let mut cmd = tokio::process::Command::new("x11vnc");
            cmd.uid(account.uid)
                .gid(account.gid)
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", &run_dir)
                .args(["-display", &format!(":{}", d.number), "-auth"])
                .arg(&d.authority)
                .arg("-unixsock")
                .arg(&socket)
                // No TCP listener at all (IPv4 or IPv6): the socket file is the only way in.
                .args(["-rfbport", "0", "-rfbportv6", "-1", "-shared", "-forever", "-nopw", "-quiet"])
                .args(["-noxdamage", "-nolookup"])
                // A view stream's server takes no input at all, whatever reaches it.
                .args(if mode == Mode::View { &["-viewonly"][..] } else { &[][..] })
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true);
            *child = Some(cmd.spawn().map_err(|e| format!("cannot start x11vnc: {e}"))?);
        }
        let until = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(s) => return Ok(s),
                Err(e) if tokio::time::Instant::now() >= until => {
                    return Err(format!("x11vnc did not answer on {}: {e}", socket.display()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Whether a person's input may pass now: in control mode, the lease is theirs (taken now,
    /// from a bot between two of its calls if need be, never from another person; renewed).
    pub async fn person_input(&self, holder: &str) -> bool {
        // Every pointer move passes here: only taking the lease from a bot, which waits for its
        // running call, goes to a blocking thread.
        if let Some(allowed) = self.person_lease_at_once(holder) {
            return allowed;
        }
        let me = self.clone();
        let holder = holder.to_string();
        tokio::task::spawn_blocking(move || me.take_person_lease(&holder)).await.unwrap_or(false)
    }

    /// Ends `holder`'s lease (its stream closed).
    pub fn end_person(&self, holder: &str) {
        if let Ok(mut lease) = self.inner.lease.lock()
            && lease.as_ref().is_some_and(|l| l.holder == holder)
        {
            *lease = None;
            self.publish(&lease);
        }
    }

    /// Opens what `open` names: x11vnc, after the lease is taken for a control stream. Answers
    /// the error's kind and message when it cannot.
    pub async fn open_vnc(&self, open: &Open) -> Result<tokio::net::UnixStream, (ErrorKind, String)> {
        if open.target != "vnc" {
            return Err((ErrorKind::InvalidRequest, format!("no such tunnel target {:?}", open.target)));
        }
        if !super::is_person(&open.holder) {
            return Err((ErrorKind::InvalidRequest, "a stream's holder is a person".into()));
        }
        if self.scope() != super::Scope::Full {
            return Err((ErrorKind::ComputerUnsupported, "this computer's desktop has no stream".into()));
        }
        if open.mode == Mode::Control && !self.person_input(&open.holder).await {
            return Err((ErrorKind::InputBusy, "another person holds the input lease".into()));
        }
        self.vnc(open.mode).await.map_err(|e| (ErrorKind::ComputerExecutionFailed, e))
    }

    /// Carries a viewer's bytes to x11vnc (filtered) and x11vnc's back, until either side ends;
    /// then the viewer's lease ends.
    pub async fn pump<I, O>(
        &self,
        open: Open,
        sock: tokio::net::UnixStream,
        mut from_viewer: I,
        mut to_viewer: O,
    ) -> Result<(), String>
    where
        I: futures::Stream<Item = bytes::Bytes> + Unpin + Send,
        O: tokio::io::AsyncWrite + Unpin + Send,
    {
        use futures::StreamExt;
        let (mut rd, mut wr) = sock.into_split();
        let holder = open.holder.clone();
        let me = self.clone();
        let upstream = async move {
            let mut filter = ClientStream::default();
            while let Some(data) = from_viewer.next().await {
                for piece in filter.push(&data)? {
                    let pass = match piece.class {
                        Class::Neutral => true,
                        Class::Input => open.mode == Mode::Control && me.person_input(&holder).await,
                    };
                    if pass {
                        wr.write_all(&piece.bytes).await.map_err(|e| format!("x11vnc: {e}"))?;
                    }
                }
            }
            Ok::<(), String>(())
        };
        let downstream = async move {
            // 64 KiB at a time: each read is one frame of the link's WebSocket, and a WebSocket
            // writer's cost per message grows faster than its size once the socket is full.
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = rd.read(&mut buf).await.map_err(|e| format!("x11vnc: {e}"))?;
                if n == 0 {
                    return Ok::<(), String>(());
                }
                if to_viewer.write_all(&buf[..n]).await.is_err() {
                    return Ok(());
                }
            }
        };
        let result = tokio::select! {
            r = upstream => r,
            r = downstream => r,
        };
        // A viewer never held the lease (the same person may hold it in another stream).
        if open.mode == Mode::Control {
            self.end_person(&open.holder);
        }
        result
    }
}
