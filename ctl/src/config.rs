//! Where computerctl keeps what it knows between runs: the cluster's URL and token (from
//! `login`), and the lifecycle commands whose answers are still outstanding (`pending/`).
//!
//! The directory is `$COMPUTERCTL_HOME`, else `$XDG_CONFIG_HOME/computerctl`, else
//! `~/.config/computerctl`. It is made 0700 and the files in it 0600: the token is a secret.
//! `COMPUTERD_URL` and `COMPUTERD_TOKEN` override the file, for scripts.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::path::PathBuf;

use anyhow::Context;
use anyhow::bail;
use serde_json::Value;
use serde_json::json;

/// The URL and token of the cluster.
pub struct Login {
    /// `http(s)://host:port`, no trailing slash.
    pub url: String,
    /// A member's or a bot's token.
    pub token: String,
}

/// computerctl's directory (made if missing).
pub fn home() -> anyhow::Result<PathBuf> {
    let dir = if let Some(d) = std::env::var_os("COMPUTERCTL_HOME") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_CONFIG_HOME") {
        PathBuf::from(d).join("computerctl")
    } else if let Some(h) = std::env::var_os("HOME") {
        PathBuf::from(h).join(".config").join("computerctl")
    } else {
        bail!("no HOME: set COMPUTERCTL_HOME to a directory for computerctl's settings");
    };
    private_dir(&dir)?;
    Ok(dir)
}

/// Makes `dir` (0700) if it does not exist.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot make {}", dir.display()))
}

/// Writes `bytes` to `path` as a new 0600 file, by rename, so a reader sees the old or the new.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn config_file() -> anyhow::Result<PathBuf> {
    Ok(home()?.join("config.json"))
}

/// Saves the login (0600).
pub fn save(login: &Login) -> anyhow::Result<PathBuf> {
    let path = config_file()?;
    let body = json!({"url": login.url, "token": login.token});
    write_private(&path, format!("{body:#}\n").as_bytes())?;
    Ok(path)
}

/// The login: the environment's, else the saved one.
pub fn load() -> anyhow::Result<Login> {
    let env_url = std::env::var("COMPUTERD_URL").ok().filter(|s| !s.is_empty());
    let env_token = std::env::var("COMPUTERD_TOKEN").ok().filter(|s| !s.is_empty());
    let saved = match config_file().map(|p| std::fs::read(&p).ok().map(|b| (p, b))) {
        Ok(Some((path, bytes))) => {
            let v: Value = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not JSON: run `computerctl login` again", path.display()))?;
            Some((
                v["url"].as_str().unwrap_or_default().to_string(),
                v["token"].as_str().unwrap_or_default().to_string(),
            ))
        }
        _ => None,
    };
    let (saved_url, saved_token) = saved.unwrap_or_default();
    let url = env_url.unwrap_or(saved_url);
    let token = env_token.unwrap_or(saved_token);
    if url.is_empty() || token.is_empty() {
        bail!("not logged in: run `computerctl login --url URL` (or set COMPUTERD_URL and COMPUTERD_TOKEN)");
    }
    Ok(Login { url: url.trim_end_matches('/').to_string(), token })
}
