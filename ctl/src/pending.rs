//! Lifecycle commands whose answer has not arrived yet, kept on disk with their command key.
//!
//! A create, pause, resume or delete is written here (`pending/<fingerprint>.json`) before it is
//! sent, and removed when the API answers, success or refusal. If the answer is lost (the
//! connection broke, the node was unavailable), the file stays, and running the same command
//! again sends it again with the same key: the API answers the same execution instead of
//! starting a second one (SPEC §1). A new key is made only once the previous command with the
//! same method, path and body has been answered.

use std::path::PathBuf;

use anyhow::Context;
use computerd_client::Client;
use computerd_client::PreparedCommand;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

/// A command kept until its answer arrives.
pub struct Pending {
    file: PathBuf,
    /// The command (restored from disk when an earlier answer was lost).
    pub command: PreparedCommand,
    /// Whether this is a resend of a command whose answer was lost.
    pub resent: bool,
}

/// What identifies "the same command": its method, path and body without the key.
fn fingerprint(command: &PreparedCommand) -> String {
    let (method, path, body) = command.parts();
    let mut body = body.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("commandKey");
    }
    let mut h = sha2::Sha256::new();
    h.update(method.as_str().as_bytes());
    h.update([0]);
    h.update(path.as_bytes());
    h.update([0]);
    h.update(body.to_string().as_bytes());
    hex::encode(&h.finalize()[..16])
}

impl Pending {
    /// Takes `fresh` (with a new key), unless the same command is already pending: then the kept
    /// one, with its key. The command is on disk when this returns.
    pub fn keep(client: &Client, fresh: PreparedCommand) -> anyhow::Result<Pending> {
        let dir = crate::config::home()?.join("pending");
        crate::config::private_dir(&dir)?;
        let file = dir.join(format!("{}.json", fingerprint(&fresh)));
        if let Ok(bytes) = std::fs::read(&file) {
            let v: Value = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is damaged: remove it to send a new command", file.display()))?;
            let method =
                v["method"].as_str().and_then(|m| m.parse().ok()).context("a pending command without method")?;
            let path = v["path"].as_str().context("a pending command without path")?;
            let command = PreparedCommand::restore(client, method, path, v["body"].clone());
            return Ok(Pending { file, command, resent: true });
        }
        let (method, path, body) = fresh.parts();
        let kept = json!({"method": method.as_str(), "path": path, "body": body});
        crate::config::write_private(&file, format!("{kept:#}\n").as_bytes())?;
        Ok(Pending { file, command: fresh, resent: false })
    }

    /// Sends the command. An answer (success or refusal) settles it; a lost one keeps it.
    pub async fn send(self) -> Result<computerd_client::Receipt, Lost> {
        match self.command.send().await {
            Err(e) if e.is_retryable() => Err(Lost { key: self.command.command_key().to_string(), error: e }),
            answered => {
                let _ = std::fs::remove_file(&self.file);
                answered.map_err(|e| Lost { key: String::new(), error: e })
            }
        }
    }
}

/// A command's answer that did not arrive (`key` set) or a refusal (`key` empty).
#[derive(Debug)]
pub struct Lost {
    /// The command key kept on disk, when the answer was lost.
    pub key: String,
    /// What happened.
    pub error: computerd_client::Error,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.error)
        } else {
            write!(
                f,
                "the answer was lost ({}): the command may or may not have been taken. Run the same \
                 command again to send it again with the same key ({}); it will not start a second one",
                self.error, self.key
            )
        }
    }
}

impl std::error::Error for Lost {}
