//! Who a session or file call runs as. The agent has a default account (`--user`: `user` in a
//! sandbox; the agent's own account on a paired machine) and, when it runs as root, root. A call
//! names one of them (empty: the default, or `root`), and says whether its caller may act as root
//! (a member, or a bot whose grant allows it); the agent refuses a call that would run as uid 0
//! without that, so a default account that is root does not slip past the rule either.
//!
//! A session's process drops to the account between fork and exec ([`Account::drop_privileges`]).
//! A file call runs on a thread of its own that takes the account's rights over files with raw
//! per-thread syscalls and exits when the call is done ([`run_as`]): Linux credentials are per
//! thread, and glibc's `setgroups`/`setresuid` wrappers would change every thread of the agent,
//! so they are not used. The thread takes the account's groups and GIDs and its filesystem UID,
//! and gives up every capability, so it can open, create, rename and remove exactly what the
//! account could (and nothing through `CAP_SYS_PTRACE`, such as another process's
//! `/proc/<pid>/environ`). Its real, effective and saved UIDs stay root's: the account cannot
//! signal the thread (a `SIGSTOP` would stop the whole agent) nor change its limits with
//! `prlimit`. Descriptors it opened stay usable by the agent afterwards.

use std::ffi::CString;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// An account calls run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// UID.
    pub uid: u32,
    /// Primary GID.
    pub gid: u32,
    /// Supplementary groups (the primary one included).
    pub groups: Vec<u32>,
    /// Home directory.
    pub home: PathBuf,
    /// Login shell.
    pub shell: PathBuf,
    /// The agent must change credentials to act as it (the agent is root and this is not).
    pub switches: bool,
}

/// Why a call cannot run as the account it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    /// Not `user` or `root`.
    #[error("user must be \"user\" or \"root\", not {0:?}")]
    Unknown(String),
    /// Root was asked of an agent that is not root.
    #[error("this computer's agent runs as {0} (uid {1}), not root, so nothing runs as root here")]
    NoRoot(String, u32),
    /// The call would run as root and its caller may not.
    #[error(
        "this call would run as root, which needs a member or a bot whose grant allows root ({{\"allowRoot\": true}})"
    )]
    RootForbidden,
}

impl Account {
    /// The account of `uid`, from the user database.
    pub fn by_uid(uid: u32) -> Result<Account, String> {
        let u = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .map_err(|e| format!("cannot read the account of uid {uid}: {e}"))?;
        match u {
            Some(u) => Ok(Self::from_user(u)),
            // A paired machine's agent may run under a uid without a passwd entry (a container).
            None => Ok(Account {
                name: uid.to_string(),
                uid,
                gid: nix::unistd::getegid().as_raw(),
                groups: nix::unistd::getgroups().map(|g| g.iter().map(|g| g.as_raw()).collect()).unwrap_or_default(),
                home: std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/")),
                shell: PathBuf::from("/bin/sh"),
                switches: false,
            }),
        }
    }

    /// The account named `name`, from the user database.
    pub fn by_name(name: &str) -> Result<Account, String> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(Self::from_user(u)),
            Ok(None) => Err(format!("there is no account {name:?} on this machine")),
            Err(e) => Err(format!("cannot read the account {name:?}: {e}")),
        }
    }

    fn from_user(u: nix::unistd::User) -> Account {
        let mut groups: Vec<u32> = CString::new(u.name.clone())
            .ok()
            .and_then(|n| nix::unistd::getgrouplist(&n, u.gid).ok())
            .map(|g| g.iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        if !groups.contains(&u.gid.as_raw()) {
            groups.push(u.gid.as_raw());
        }
        let uid = u.uid.as_raw();
        Account {
            name: u.name,
            uid,
            gid: u.gid.as_raw(),
            groups,
            home: u.dir,
            shell: u.shell,
            switches: nix::unistd::geteuid().is_root() && uid != 0,
        }
    }

    /// Takes this account's groups, GIDs and UIDs (real, effective, saved, filesystem) for the
    /// calling thread only, with raw syscalls; a no-op when the agent need not switch. Safe to
    /// call between fork and exec (no allocation).
    pub fn drop_privileges(&self) -> io::Result<()> {
        if !self.switches {
            return Ok(());
        }
        drop_thread_to(self.uid, self.gid, &self.groups)
    }
}

/// Takes `uid`, `gid` and `groups` for the calling thread (raw syscalls: glibc's wrappers would
/// change every thread), then checks that they took. Safe between fork and exec.
pub fn become_ids(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    drop_thread_to(uid, gid, groups)
}

fn drop_thread_to(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    let err = io::Error::last_os_error;
    // SAFETY: plain syscalls on integers and a valid array of `groups.len()` gids.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, groups.len() as libc::c_long, groups.as_ptr()) != 0 {
            return Err(err());
        }
        let g = gid as libc::c_long;
        if libc::syscall(libc::SYS_setresgid, g, g, g) != 0 {
            return Err(err());
        }
        let u = uid as libc::c_long;
        if libc::syscall(libc::SYS_setresuid, u, u, u) != 0 {
            return Err(err());
        }
        let (mut r, mut e, mut s) = (0 as libc::uid_t, 0 as libc::uid_t, 0 as libc::uid_t);
        let (rp, ep, sp): (*mut libc::uid_t, *mut libc::uid_t, *mut libc::uid_t) = (&mut r, &mut e, &mut s);
        if libc::syscall(libc::SYS_getresuid, rp, ep, sp) != 0 || (r, e, s) != (uid, uid, uid) {
            return Err(io::Error::other("the thread did not take the account's uid"));
        }
        // The filesystem uid follows the effective one; check it (setfsuid answers the current).
        if libc::syscall(libc::SYS_setfsuid, u) as u32 != uid {
            return Err(io::Error::other("the thread did not take the account's filesystem uid"));
        }
    }
    Ok(())
}

/// Gives the calling thread `account`'s rights over files and no capability, its UIDs staying
/// root's (see the module doc): its groups and GIDs, then its filesystem UID (which clears the
/// file capabilities), then every capability set emptied. The thread must end with its call.
fn files_as(account: &Account) -> io::Result<()> {
    let err = io::Error::last_os_error;
    let g = account.gid as libc::c_long;
    let u = account.uid as libc::c_long;
    // SAFETY: plain syscalls on integers, a valid array of `groups.len()` gids, and valid
    // capability header and data structures of version 3 (two data elements).
    unsafe {
        let groups = &account.groups;
        if libc::syscall(libc::SYS_setgroups, groups.len() as libc::c_long, groups.as_ptr()) != 0 {
            return Err(err());
        }
        if libc::syscall(libc::SYS_setresgid, g, g, g) != 0 {
            return Err(err());
        }
        libc::syscall(libc::SYS_setfsuid, u);
        // setfsuid answers the previous value: a second call tells whether the first took.
        if libc::syscall(libc::SYS_setfsuid, u) as u32 != account.uid {
            return Err(io::Error::other("the thread did not take the account's filesystem uid"));
        }
        let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let data = [CapData::default(); 2];
        if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) != 0 {
            return Err(err());
        }
        let mut now = [CapData { effective: u32::MAX, permitted: u32::MAX, inheritable: u32::MAX }; 2];
        if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, now.as_mut_ptr()) != 0
            || now.iter().any(|d| d.effective | d.permitted | d.inheritable != 0)
        {
            return Err(io::Error::other("the thread kept capabilities"));
        }
    }
    Ok(())
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Runs `f` on a thread of its own holding only `account`'s rights (see the module doc); the
/// thread ends with `f`. Without a switch (the account is the agent's own), on a blocking thread.
pub async fn run_as<T, F>(account: &Arc<Account>, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if !account.switches {
        return tokio::task::spawn_blocking(f).await.map_err(|e| io::Error::other(e.to_string()));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let a = account.clone();
    std::thread::Builder::new().name("as-user".into()).spawn(move || {
        let out = files_as(&a).map(|()| f());
        let _ = tx.send(out);
    })?;
    rx.await.map_err(|_| io::Error::other("the call's thread stopped"))?
}

/// Runs `f` as `account` on a thread of its own and does not wait for it (a clean-up from a
/// `Drop`).
pub fn run_as_detached<F: FnOnce() + Send + 'static>(account: &Arc<Account>, f: F) {
    let a = account.clone();
    let _ = std::thread::Builder::new().name("as-user".into()).spawn(move || {
        if files_as(&a).is_ok() {
            f();
        }
    });
}

/// The accounts of this agent.
#[derive(Debug, Clone)]
pub struct Users {
    /// The default account.
    default: Arc<Account>,
    /// Root, when the agent runs as root.
    root: Option<Arc<Account>>,
}

impl Users {
    /// The agent's accounts: `default` names the default account (only a root agent may name
    /// another than its own); `None` is the agent's own account.
    pub fn new(default: Option<&str>) -> Result<Users, String> {
        let me = nix::unistd::geteuid().as_raw();
        let own = Account::by_uid(me)?;
        let default = match default {
            None => own.clone(),
            Some(name) if name == own.name => own.clone(),
            Some(name) => {
                let a = Account::by_name(name)?;
                if me != 0 && a.uid != me {
                    return Err(format!(
                        "--user {name}: this agent runs as {} (uid {me}); only an agent started as root runs calls as another account",
                        own.name
                    ));
                }
                a
            }
        };
        let root = (me == 0).then(|| Arc::new(own));
        Ok(Users { default: Arc::new(default), root })
    }

    /// The agent runs as root.
    pub fn agent_is_root(&self) -> bool {
        self.root.is_some()
    }

    /// The default account.
    pub fn default_account(&self) -> &Arc<Account> {
        &self.default
    }

    /// The account a call runs as: `user` is what it named (empty or `user`: the default;
    /// `root`), `root_allowed` whether its caller may act as root.
    pub fn for_call(&self, user: &str, root_allowed: bool) -> Result<Arc<Account>, UserError> {
        let a = match user {
            "" | "user" => self.default.clone(),
            "root" => match &self.root {
                Some(r) => r.clone(),
                None => return Err(UserError::NoRoot(self.default.name.clone(), self.default.uid)),
            },
            other => return Err(UserError::Unknown(other.chars().take(64).collect())),
        };
        if a.uid == 0 && !root_allowed {
            return Err(UserError::RootForbidden);
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_needs_a_caller_allowed_to_be_root() {
        let users = Users::new(None).expect("users");
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(users.for_call("bogus", true), Err(UserError::Unknown("bogus".into())));
        if me == 0 {
            assert_eq!(users.for_call("root", false), Err(UserError::RootForbidden));
            assert_eq!(users.for_call("root", true).map(|a| a.uid), Ok(0));
            // The default account is root here too: it needs the same right.
            assert_eq!(users.for_call("", false), Err(UserError::RootForbidden));
        } else {
            assert!(matches!(users.for_call("root", true), Err(UserError::NoRoot(_, _))));
            assert_eq!(users.for_call("", false).map(|a| a.uid), Ok(me));
        }
    }

    /// uid and gid 65534, as a root agent would switch to.
    fn nobody() -> Arc<Account> {
        Arc::new(Account {
            name: "nobody-test".into(),
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            home: "/".into(),
            shell: "/bin/sh".into(),
            switches: true,
        })
    }

    #[tokio::test]
    async fn a_call_thread_holds_only_the_accounts_rights() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root");
        }
        let a = nobody();
        let (uid, gid, groups, caps) = run_as(&a, || {
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
            let line = |k: &str| status.lines().find(|l| l.starts_with(k)).unwrap_or_default().to_string();
            (line("Uid:"), line("Gid:"), line("Groups:"), line("CapEff:"))
        })
        .await
        .expect("run");
        // Real, effective and saved stay root's; the filesystem UID is the account's.
        assert_eq!(uid.split_whitespace().skip(1).collect::<Vec<_>>(), ["0", "0", "0", "65534"], "{uid}");
        assert_eq!(gid.split_whitespace().skip(1).collect::<Vec<_>>(), ["65534"; 4], "{gid}");
        assert_eq!(groups.split_whitespace().skip(1).collect::<Vec<_>>(), ["65534"], "{groups}");
        assert_eq!(caps.split_whitespace().nth(1), Some("0000000000000000"), "{caps}");
        // What the account may not do, the thread may not either: root's files stay closed.
        let shadow = run_as(&a, || std::fs::read("/etc/shadow").map(|_| ())).await.expect("run");
        assert_eq!(shadow.map_err(|e| e.kind()), Err(io::ErrorKind::PermissionDenied));
        let made = tempfile::tempdir().expect("tempdir");
        let root_dir = made.path().to_path_buf();
        let create = run_as(&a, move || std::fs::write(root_dir.join("f"), b"x")).await.expect("run");
        assert_eq!(create.map_err(|e| e.kind()), Err(io::ErrorKind::PermissionDenied));
        // The rest of the agent is still root.
        assert!(nix::unistd::geteuid().is_root());
        let denied = run_as(&a, || std::fs::read("/proc/1/environ").map(|_| ())).await.expect("run");
        assert_eq!(denied.map_err(|e| e.kind()), Err(io::ErrorKind::PermissionDenied));
    }

    #[tokio::test]
    async fn i36_6_the_account_cannot_signal_or_limit_a_file_calls_thread() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root");
        }
        let a = nobody();
        // A call that holds its thread until told to end, as a slow read would.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let call = tokio::spawn(async move {
            run_as(&a, move || {
                // SAFETY: gettid has no arguments and cannot fail.
                let tid = unsafe { libc::syscall(libc::SYS_gettid) };
                let _ = tid_tx.send(tid);
                let _ = end_rx.recv();
            })
            .await
        });
        let tid = tokio::task::spawn_blocking(move || tid_rx.recv().expect("the thread's id")).await.expect("tid");
        // The account, from a process of its own as a session is, tries to signal the thread (0
        // asks only whether it may; STOP would stop the whole agent) and to lower its limits.
        let as_account = |script: String| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(script)
                .uid(65534)
                .gid(65534)
                .output()
                .expect("run sh as the account")
        };
        for sig in ["0", "STOP"] {
            let out = as_account(format!("kill -{sig} {tid}"));
            assert!(!out.status.success(), "kill -{sig} of the call's thread worked");
            let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
            assert!(said.contains("not permitted"), "kill -{sig}: {said}");
        }
        let out = as_account(format!("prlimit --pid {tid} --nofile=1:1"));
        assert!(!out.status.success(), "prlimit of the call's thread worked");
        let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(said.contains("not permitted"), "prlimit: {said}");
        end_tx.send(()).expect("end the call");
        call.await.expect("join").expect("the call ran to its end");
    }
}
