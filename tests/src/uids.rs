//! UID ranges for tool bindings of agents that tests run on this machine. Tests run side by
//! side (nextest runs each in its own process), and two agents whose bindings share UIDs would
//! see each other's processes and files; so each test takes a range of its own here, for as
//! long as it holds the [`UidRange`].
//!
//! A range is claimed by creating its lock file with `O_EXCL` under the system's temp
//! directory; the file names its holder's pid, so a range whose holder died (a test killed by
//! a timeout) is taken back. Ranges lie below the Docker provider's sandbox ranges
//! (`UID_RANGE_BASE`, 200,000), so they never meet a sandbox's either.

use std::io::Write;
use std::path::PathBuf;

/// The first UID of the first range.
const FIRST: u32 = 100_000;
/// UIDs per range: more than an agent's 64 bindings need.
const WIDTH: u32 = 1_000;
/// Ranges: up to the sandboxes' base.
const RANGES: u32 = 100;

/// A range held by this test until dropped.
#[derive(Debug)]
pub struct UidRange {
    /// Its first UID, for `--mcp-first-uid`.
    pub first: u32,
    lock: PathBuf,
}

impl UidRange {
    /// Takes a free range.
    pub fn take() -> UidRange {
        let dir = std::env::temp_dir().join("computerd-test-uids");
        std::fs::create_dir_all(&dir).expect("the UID ranges' directory");
        for i in 0..RANGES {
            let first = FIRST + i * WIDTH;
            let lock = dir.join(first.to_string());
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
                Ok(mut f) => {
                    write!(f, "{}", std::process::id()).expect("write the range's holder");
                    return UidRange { first, lock };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // Taken back when its holder is gone (its pid is no process any more).
                    let holder = std::fs::read_to_string(&lock).ok().and_then(|p| p.trim().parse::<i32>().ok());
                    let alive = holder.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
                    if !alive && holder.is_some() {
                        let _ = std::fs::remove_file(&lock);
                    }
                }
                Err(e) => panic!("claim the UID range at {first}: {e}"),
            }
        }
        panic!("all {RANGES} test UID ranges are held");
    }

    /// `--mcp-first-uid`'s value.
    pub fn arg(&self) -> String {
        self.first.to_string()
    }
}

impl Drop for UidRange {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_holders_never_share_a_range() {
        let a = UidRange::take();
        let b = UidRange::take();
        assert_ne!(a.first, b.first);
        assert!(a.first >= FIRST && b.first < FIRST + RANGES * WIDTH);
        let lock = a.lock.clone();
        assert!(lock.exists());
        drop(a);
        assert!(!lock.exists(), "a dropped range is free again");
        let c = UidRange::take();
        assert_ne!(c.first, b.first);
    }
}
