//! The owners and modes of what the agent keeps: its state dir (the machine credential, and by
//! default the tool runtime) is the agent's alone, entered by nobody else but, to pass through to
//! the runtime, the tool bindings' group; the workspace is made for the default account.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::users::Account;

/// Makes `dir` (when missing) and leaves it to the agent: mode 0700, or with `group` (the tool
/// bindings' group, of a root agent) root-owned, that group's and 0710, so a binding may pass
/// through it but not list it, and a session's account may not enter it at all.
pub fn protect(dir: &Path, group: Option<u32>) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    match group {
        Some(g) => {
            std::os::unix::fs::chown(dir, Some(0), Some(g))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
        }
        None => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)),
    }
}

/// Makes the workspace when it is missing, owned by the default account (mode 0755); an
/// existing one is left as it is.
pub fn workspace(dir: &Path, owner: &Account) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    if owner.switches {
        std::os::unix::fs::chown(dir, Some(owner.uid), Some(owner.gid))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}
