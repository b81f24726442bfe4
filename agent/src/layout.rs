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

/// The layout version of a runtime volume this agent knows.
pub const RUNTIME_LAYOUT: u32 = 1;

/// Checks the layout marker of a runtime volume (`dir`, which is the runtime itself) and answers
/// the runtime's path. A marker of another version is refused: the agent never guesses at a layout
/// it does not know. A volume without a marker gets one (a new volume, or one a migration just
/// loaded); one that holds an unfinished load (the loader's journal) is refused.
pub fn runtime_volume(dir: &Path) -> Result<std::path::PathBuf, String> {
    use std::io::Write;
    let marker = dir.join(crate::runtime_load::LAYOUT_MARKER);
    let shown = dir.display();
    match std::fs::read_to_string(&marker) {
        Ok(text) => {
            let version = text.trim().strip_prefix("computerd-runtime-layout ").and_then(|v| v.parse::<u32>().ok());
            match version {
                Some(RUNTIME_LAYOUT) => Ok(dir.to_path_buf()),
                Some(v) => Err(format!(
                    "the runtime volume {shown} has layout version {v}; this agent knows version {RUNTIME_LAYOUT} only and does not guess (run an agent that knows it)"
                )),
                None => Err(format!("the runtime volume {shown} has an unreadable layout marker: {:?}", text.trim())),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let journal = crate::runtime_load::JOURNAL;
            if dir.join(journal).exists() {
                return Err(format!(
                    "the runtime volume {shown} holds an unfinished runtime load ({journal}): finish it with computer-agent load-runtime first"
                ));
            }
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot make the runtime volume {shown}: {e}"))?;
            let tmp = dir.join(format!("{}layout.tmp", crate::runtime_load::RESERVED_PREFIX));
            let write = || -> io::Result<()> {
                let mut f = std::fs::File::create(&tmp)?;
                writeln!(f, "computerd-runtime-layout {RUNTIME_LAYOUT}")?;
                f.sync_all()?;
                std::fs::rename(&tmp, &marker)?;
                std::fs::File::open(dir)?.sync_all()
            };
            write().map_err(|e| format!("cannot write the layout marker of the runtime volume {shown}: {e}"))?;
            Ok(dir.to_path_buf())
        }
        Err(e) => Err(format!("cannot read the layout marker of the runtime volume {shown}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40, item 5: a new volume gets the marker; version 1 is the runtime; another version,
    /// an unreadable marker, or an unfinished load is refused with the reason, and nothing is
    /// written.
    #[test]
    fn i40_the_runtime_volume_carries_its_layout_version_and_an_unknown_one_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let volume = tmp.path().join("volume");
        let marker = volume.join(crate::runtime_load::LAYOUT_MARKER);
        assert_eq!(runtime_volume(&volume).expect("a new volume"), volume);
        assert_eq!(std::fs::read_to_string(&marker).expect("marker"), "computerd-runtime-layout 1\n");
        assert_eq!(runtime_volume(&volume).expect("version 1"), volume);
        std::fs::write(&marker, "computerd-runtime-layout 2\n").expect("write");
        let why = runtime_volume(&volume).expect_err("version 2");
        assert!(why.contains("layout version 2") && why.contains("does not guess"), "{why}");
        assert_eq!(std::fs::read_to_string(&marker).expect("marker"), "computerd-runtime-layout 2\n", "kept");
        std::fs::write(&marker, "something else").expect("write");
        assert!(runtime_volume(&volume).expect_err("garbled").contains("unreadable layout marker"));
        std::fs::remove_file(&marker).expect("rm");
        std::fs::write(volume.join(crate::runtime_load::JOURNAL), "{}").expect("journal");
        assert!(runtime_volume(&volume).expect_err("unfinished").contains("unfinished runtime load"));
        assert!(!marker.exists(), "no marker over an unfinished load");
    }
}
