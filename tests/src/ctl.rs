//! `computerctl` run the way a person runs it: in a real pseudo-terminal (its stdin, stdout and
//! stderr are the terminal, which is its controlling terminal), with what it draws read back.

use std::io::Read;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::process::ExitStatus;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Duration;
use std::time::Instant;

/// The `computerctl` binary, built once per test process.
pub fn ctl_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::cluster::build_bin("computerctl", "computerctl")).clone()
}

/// What the terminal has shown so far.
#[derive(Default)]
struct Screen {
    bytes: Vec<u8>,
    closed: bool,
}

/// A program in a pseudo-terminal.
pub struct Pty {
    master: std::fs::File,
    screen: Arc<(Mutex<Screen>, Condvar)>,
    exited: std::sync::mpsc::Receiver<ExitStatus>,
    /// How much of the screen earlier `expect`s consumed.
    seen: usize,
}

impl Pty {
    /// Starts `cmd` on a new 24x80 terminal, in a session of its own with the terminal as its
    /// controlling terminal.
    pub fn spawn(mut cmd: Command) -> Pty {
        let ws = nix::pty::Winsize { ws_row: 24, ws_col: 80, ws_xpixel: 0, ws_ypixel: 0 };
        let pty = nix::pty::openpty(Some(&ws), None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        cmd.stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls (setsid, ioctl) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if libc_ioctl_sctty() != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn in a pty");
        // The parent's copies of the terminal's slave side go with `cmd`, so the reader sees
        // the end when the program exits.
        drop(cmd);
        let master = std::fs::File::from(pty.master);
        let screen = Arc::new((Mutex::new(Screen::default()), Condvar::new()));
        let mut reader = master.try_clone().expect("dup master");
        let s = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = reader.read(&mut buf).unwrap_or(0);
                let (lock, cv) = &*s;
                let mut sc = lock.lock().expect("screen");
                if n == 0 {
                    sc.closed = true;
                    cv.notify_all();
                    return;
                }
                sc.bytes.extend_from_slice(&buf[..n]);
                cv.notify_all();
            }
        });
        let (tx, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(st) = child.wait() {
                let _ = tx.send(st);
            }
        });
        Pty { master, screen, exited, seen: 0 }
    }

    /// Waits until the terminal shows `text` (after what earlier calls consumed); answers the
    /// screen up to and including it. Panics with the screen if it does not come in `timeout`.
    pub fn expect(&mut self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.screen;
        let mut sc = lock.lock().expect("screen");
        loop {
            let shown = &sc.bytes[self.seen..];
            if let Some(at) = shown.windows(text.len()).position(|w| w == text.as_bytes()) {
                let upto = String::from_utf8_lossy(&shown[..at + text.len()]).to_string();
                self.seen += at + text.len();
                return upto;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && !sc.closed,
                "the terminal did not show {text:?}; it shows:\n{}",
                String::from_utf8_lossy(&sc.bytes)
            );
            sc = cv.wait_timeout(sc, left).expect("screen").0;
        }
    }

    /// Everything shown so far.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.0.lock().expect("screen").bytes).to_string()
    }

    /// Types `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).expect("type into the pty");
    }

    /// Waits for the program's exit; answers its code (panics with the screen after `timeout`).
    pub fn wait(&mut self, timeout: Duration) -> i32 {
        match self.exited.recv_timeout(timeout) {
            Ok(st) => st.code().unwrap_or(-1),
            Err(_) => panic!("the program did not exit; the terminal shows:\n{}", self.screen()),
        }
    }
}

/// `ioctl(0, TIOCSCTTY, 0)`: the terminal on stdin becomes the controlling terminal.
fn libc_ioctl_sctty() -> i32 {
    // SAFETY: a plain ioctl on fd 0 with an integer argument.
    unsafe { nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) }
}
