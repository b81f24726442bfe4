//! The display the agent owns in a sandbox: Xvfb with a cookie only the agent (and the desktop's
//! own account) can read, a small window manager, both kept running. And the other way to get a
//! display: an existing one (a paired machine whose owner opts in), reached with its own
//! authority file.
//!
//! The X server and the window manager run as the desktop account (`computerd-desktop` in the
//! desktop image, else `nobody`), never as root and never as the sessions' `user`: a session
//! cannot read the cookie (the authority file is 0600 in a 0700 directory of that account), so
//! it cannot reach the display and drive it around the input lease.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use super::screen::Cookie;
use crate::users::Account;

/// The authorization protocol of the cookie.
pub const MIT_COOKIE: &[u8] = b"MIT-MAGIC-COOKIE-1";
/// Where the X servers' sockets are.
pub const SOCKET_DIR: &str = "/tmp/.X11-unix";
/// The desktop's own directory (the authority file), by default.
pub const RUN_DIR: &str = "/run/computerd-desktop";

/// A display size: `1280x800x24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Pixels.
    pub width: u16,
    /// Pixels.
    pub height: u16,
    /// Bits a pixel (24).
    pub depth: u8,
}

impl std::str::FromStr for Geometry {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a display size such as 1280x800x24");
        let mut it = s.split('x');
        let w: u16 = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let h: u16 = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let d: u8 = match it.next() {
            Some(v) => v.parse().map_err(|_| bad())?,
            None => 24,
        };
        if it.next().is_some() || !(64..=7680).contains(&w) || !(64..=4320).contains(&h) || d != 24 {
            return Err(format!("{}; width 64..=7680, height 64..=4320, depth 24", bad()));
        }
        Ok(Geometry { width: w, height: h, depth: d })
    }
}

/// An `.Xauthority` file's entry for `display` (FamilyWild: any host).
fn authority_entry(display: u32, cookie: &Cookie) -> Vec<u8> {
    let mut out = Vec::new();
    let mut field = |b: &[u8]| {
        out.extend_from_slice(&(b.len() as u16).to_be_bytes());
        out.extend_from_slice(b);
    };
    let mut family = Vec::new();
    family.extend_from_slice(&0xffffu16.to_be_bytes());
    field(b"");
    field(display.to_string().as_bytes());
    field(&cookie.name);
    field(&cookie.data);
    family.extend_from_slice(&out);
    family
}

/// Reads the MIT cookie for `display` from an `.Xauthority` file (any host's entry).
pub fn read_authority(path: &Path, display: u32) -> Result<Cookie, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
        let s = bytes.get(*at..*at + n)?;
        *at += n;
        Some(s)
    }
    let mut at = 0usize;
    let want = display.to_string();
    while take(&bytes, &mut at, 2).is_some() {
        let mut fields: Vec<&[u8]> = Vec::with_capacity(4);
        for _ in 0..4 {
            let len = take(&bytes, &mut at, 2).map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])));
            let Some(v) = len.and_then(|n| take(&bytes, &mut at, n)) else {
                return Err(format!("{} is cut short", path.display()));
            };
            fields.push(v);
        }
        if fields[1] == want.as_bytes() && fields[2] == MIT_COOKIE {
            return Ok(Cookie { name: fields[2].to_vec(), data: fields[3].to_vec() });
        }
    }
    Err(format!("{} has no MIT-MAGIC-COOKIE-1 for display :{display}", path.display()))
}

/// What the display is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisplayState {
    /// Xvfb is starting (or restarting).
    Starting,
    /// Up.
    Running,
    /// It could not be started; the agent keeps trying.
    Failed,
}

impl DisplayState {
    /// Its name in answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Failed => "failed",
        }
    }
}

/// A display: its number, socket and cookie, and (for one the agent started) its state.
#[derive(Clone)]
pub struct Display {
    /// `:N`.
    pub number: u32,
    /// The cookie.
    pub cookie: Cookie,
    /// The account the X server runs as (the owner the MIT-SHM segments get), when not root.
    pub server_uid: Option<u32>,
    /// The authority file (for programs the agent starts on the display).
    pub authority: PathBuf,
    /// The account the desktop's programs run as (the agent's own display only).
    pub account: Option<Account>,
    /// Shared with the keeper.
    pub state: Arc<Mutex<(DisplayState, Option<String>)>>,
}

impl Display {
    /// The display's Unix socket.
    pub fn socket(&self) -> PathBuf {
        Path::new(SOCKET_DIR).join(format!("X{}", self.number))
    }

    /// Its state and the last problem.
    pub fn state(&self) -> (DisplayState, Option<String>) {
        self.state.lock().map(|s| s.clone()).unwrap_or((DisplayState::Failed, Some("state lock poisoned".into())))
    }

    fn set(&self, s: DisplayState, why: Option<String>) {
        if let Ok(mut g) = self.state.lock() {
            *g = (s, why);
        }
    }
}

/// An existing display (a paired machine's), reached with `authority`.
pub fn existing(number: u32, authority: &Path) -> Result<Display, String> {
    let cookie = read_authority(authority, number)?;
    Ok(Display {
        number,
        cookie,
        server_uid: None,
        authority: authority.to_path_buf(),
        account: None,
        state: Arc::new(Mutex::new((DisplayState::Running, None))),
    })
}

/// The account the desktop runs as.
pub fn desktop_account() -> Result<Account, String> {
    Account::by_name("computerd-desktop")
        .or_else(|_| Account::by_name("nobody"))
        .map_err(|e| format!("no account for the desktop (computerd-desktop or nobody): {e}"))
}

/// Starts Xvfb (and a window manager when one is installed) as `account` on the first free
/// display number from 1, with its authority file in `run_dir` (made anew, the account's, 0700),
/// and keeps them running: each is started again when it exits. Returns
/// once the display answers, or with why it could not start.
pub async fn start(geometry: Geometry, account: Account, run_dir: &Path) -> Result<Display, String> {
    let mut sockets = std::fs::DirBuilder::new();
    sockets.mode(0o1777);
    if !Path::new(SOCKET_DIR).exists() {
        sockets.create(SOCKET_DIR).map_err(|e| format!("cannot make {SOCKET_DIR}: {e}"))?;
        std::fs::set_permissions(SOCKET_DIR, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .map_err(|e| format!("cannot open {SOCKET_DIR} to all: {e}"))?;
    }
    let number = (1..64)
        .find(|n| {
            !Path::new(SOCKET_DIR).join(format!("X{n}")).exists() && !Path::new(&format!("/tmp/.X{n}-lock")).exists()
        })
        .ok_or("no free display number")?;
    let mut data = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut data);
    let cookie = Cookie { name: MIT_COOKIE.to_vec(), data: data.to_vec() };
    let dir = run_dir;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::DirBuilder::new().mode(0o700).create(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let authority = dir.join("Xauthority");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&authority)
        .map_err(|e| format!("cannot write {}: {e}", authority.display()))?;
    f.write_all(&authority_entry(number, &cookie)).map_err(|e| format!("cannot write the authority: {e}"))?;
    drop(f);
    let own = |p: &Path| {
        nix::unistd::chown(
            p,
            Some(nix::unistd::Uid::from_raw(account.uid)),
            Some(nix::unistd::Gid::from_raw(account.gid)),
        )
    };
    own(dir)
        .and_then(|_| own(&authority))
        .map_err(|e| format!("cannot give {} to the desktop account: {e}", dir.display()))?;
    let display = Display {
        number,
        cookie,
        server_uid: (account.uid != 0).then_some(account.uid),
        authority,
        account: Some(account.clone()),
        state: Arc::new(Mutex::new((DisplayState::Starting, None))),
    };
    let account = Arc::new(account);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(keep(display.clone(), geometry, account, ready_tx));
    match tokio::time::timeout(Duration::from_secs(20), ready_rx).await {
        Ok(Ok(Ok(()))) => Ok(display),
        Ok(Ok(Err(why))) => Err(why),
        _ => Err("the display did not come up within 20 s".into()),
    }
}

fn command(program: &str, account: &Account, display: &Display) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(program);
    c.uid(account.uid)
        .gid(account.gid)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", display.authority.parent().unwrap_or(Path::new("/")))
        .env("DISPLAY", format!(":{}", display.number))
        .env("XAUTHORITY", &display.authority)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    c
}

/// The colour of a desktop's background (RGB): a screenshot of a new desktop shows it.
pub const WALLPAPER: [u8; 3] = [0x2b, 0x4a, 0x6f];

/// Waits until the display takes a connection with its cookie, and paints its background.
async fn answers(display: &Display, within: Duration) -> Result<(), String> {
    let until = tokio::time::Instant::now() + within;
    let mut last = String::new();
    while tokio::time::Instant::now() < until {
        let d = display.clone();
        let up = move || {
            let screen = super::screen::Screen::connect(&d.socket(), &d.cookie, d.server_uid)?;
            // A new desktop shows it is up: its wallpaper, not a black screen.
            if let Err(why) = screen.paint_background(WALLPAPER) {
                tracing::warn!(%why, "the desktop's background could not be painted");
            }
            Ok::<_, String>(())
        };
        match tokio::task::spawn_blocking(up).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = e,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("the display did not answer: {last}"))
}

/// Runs Xvfb and the window manager, starting them again when they exit (with a growing pause).
async fn keep(
    display: Display,
    g: Geometry,
    account: Arc<Account>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let mut ready = Some(ready);
    let mut pause = Duration::from_millis(500);
    loop {
        display.set(DisplayState::Starting, None);
        let _ = std::fs::remove_file(display.socket());
        let _ = std::fs::remove_file(format!("/tmp/.X{}-lock", display.number));
        let mut xvfb = command("Xvfb", &account, &display);
        xvfb.env_remove("DISPLAY").args([
            format!(":{}", display.number),
            "-screen".into(),
            "0".into(),
            format!("{}x{}x{}", g.width, g.height, g.depth),
            // Only the socket file: no TCP, and no abstract socket (which a sandbox sharing a
            // network namespace would share).
            "-nolisten".into(),
            "tcp".into(),
            "-nolisten".into(),
            "local".into(),
            "-noreset".into(),
            "-auth".into(),
            display.authority.display().to_string(),
        ]);
        let outcome: Result<(), String> = match xvfb.spawn() {
            Err(e) => Err(format!("cannot start Xvfb: {e}")),
            Ok(mut x) => {
                match answers(&display, Duration::from_secs(15)).await.map_err(|e| (e, drain(x.stderr.take()))) {
                    Err((why, said)) => {
                        let _ = x.start_kill();
                        let _ = x.wait().await;
                        Err(format!("{why}; Xvfb said: {}", said.last()))
                    }
                    Ok(()) => {
                        // Its stderr is read all the time (xkbcomp's warnings, at every keymap
                        // change): a full pipe would stop the X server.
                        let said = drain(x.stderr.take());
                        display.set(DisplayState::Running, None);
                        if let Some(r) = ready.take() {
                            let _ = r.send(Ok(()));
                        }
                        pause = Duration::from_millis(500);
                        let mut wm = start_wm(&account, &display);
                        loop {
                            tokio::select! {
                                status = x.wait() => break Err(format!("Xvfb exited ({status:?}): {}", said.last())),
                                status = async { match wm.as_mut() { Some(w) => w.wait().await, None => std::future::pending().await } } => {
                                    tracing::warn!(?status, "the window manager exited; starting it again");
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                    wm = start_wm(&account, &display);
                                }
                            }
                        }
                    }
                }
            }
        };
        if let Err(why) = outcome {
            tracing::warn!(%why, "the display is down; starting it again");
            display.set(DisplayState::Failed, Some(why.clone()));
            if let Some(r) = ready.take() {
                let _ = r.send(Err(why));
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// The window manager (openbox), when the image has one.
fn start_wm(account: &Account, display: &Display) -> Option<tokio::process::Child> {
    let path = ["/usr/bin/openbox", "/usr/local/bin/openbox"].into_iter().find(|p| Path::new(p).exists())?;
    match command(path, account, display).stderr(std::process::Stdio::null()).spawn() {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the window manager");
            None
        }
    }
}

/// The last lines a program wrote to its stderr, read as it writes them.
#[derive(Clone, Default)]
struct Said(Arc<Mutex<std::collections::VecDeque<String>>>);

impl Said {
    fn last(&self) -> String {
        self.0.lock().map(|l| l.iter().cloned().collect::<Vec<_>>().join(" | ")).unwrap_or_default()
    }
}

/// Reads `stderr` to its end in a task of its own, keeping its last 5 lines.
fn drain(stderr: Option<tokio::process::ChildStderr>) -> Said {
    use tokio::io::AsyncBufReadExt;
    let said = Said::default();
    if let Some(s) = stderr {
        let keep = said.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(s).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(mut l) = keep.0.lock() {
                    if l.len() == 5 {
                        l.pop_front();
                    }
                    l.push_back(line.chars().take(300).collect());
                }
            }
        });
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_and_authority_files() {
        assert_eq!("1280x800x24".parse::<Geometry>(), Ok(Geometry { width: 1280, height: 800, depth: 24 }));
        assert_eq!("1024x768".parse::<Geometry>().map(|g| g.depth), Ok(24));
        assert!("1280x800x16".parse::<Geometry>().is_err());
        assert!("10x800".parse::<Geometry>().is_err());
        assert!("big".parse::<Geometry>().is_err());
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("auth");
        let cookie = Cookie { name: MIT_COOKIE.to_vec(), data: vec![7; 16] };
        let mut bytes = authority_entry(3, &Cookie { name: MIT_COOKIE.to_vec(), data: vec![1; 16] });
        bytes.extend(authority_entry(5, &cookie));
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(read_authority(&path, 5).map(|c| c.data), Ok(vec![7; 16]));
        assert!(read_authority(&path, 4).is_err());
        std::fs::write(&path, &bytes[..bytes.len() - 3]).expect("write");
        assert!(read_authority(&path, 5).is_err(), "a cut file is refused");
    }
}
