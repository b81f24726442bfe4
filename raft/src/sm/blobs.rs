//! Blobs: the metadata of files people and bots hand to runs (name, media type, size, SHA-256,
//! owner, where the bytes are). The bytes are never here: the node that took the upload checked
//! its digest while it streamed and stored it in its blob store; the record names the nodes
//! holding it.
//!
//! Bounded: each member's blobs (theirs and their bots') together are at most their quota
//! ([`BlobLimits::quota_bytes`], 10 GiB by default); a blob is kept [`BlobLimits::retention_ms`]
//! (30 days by default) after it was last referenced (its upload, until runs reference it), then
//! compacted a few per applied entry through a time-ordered index (`exec_index`, rebuilt when a
//! snapshot loads). Nodes delete the bytes of blobs the store no longer names.

use super::model::Artifact;
use super::model::Blob;
use super::model::BlobLimits;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

impl State {
    /// Records a checked copy into a Computer (idempotent by id); the blob counts as referenced
    /// now.
    pub(crate) fn artifact_put(&mut self, by: &str, a: &Artifact) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.check_operate(&caller, &a.computer_id)?;
        if let Some(seen) = self.artifacts.get(&a.id) {
            return if seen == a {
                Ok(())
            } else {
                Err(Reject::new(RejectKind::Conflict, "that artifact id is taken"))
            };
        }
        // An artifact without a blob is a file the Computer holds (a browser upload's), known
        // by the length and SHA-256 its agent counted.
        if !a.blob_id.is_empty() {
            let blob =
                self.blobs.get(&a.blob_id).cloned().ok_or_else(|| Reject::new(RejectKind::NotFound, "no such blob"))?;
            if blob.sha256 != a.sha256 || blob.size != a.size {
                return Err(Reject::new(RejectKind::Conflict, "the copy is not the blob"));
            }
            self.touch_blob(&blob.id, a.created_at);
        }
        if a.sha256.len() != 64 || !a.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Reject::new(RejectKind::Invalid, "an artifact's sha256 is 64 hex digits"));
        }
        if a.path.is_empty() || a.path.len() > 4096 {
            return Err(Reject::new(RejectKind::Invalid, "an artifact's path is 1 to 4,096 bytes"));
        }
        self.exec_index.artifact_expiry.insert((a.created_at, a.id.clone()));
        self.artifacts.insert(a.id.clone(), a.clone());
        Ok(())
    }

    /// A blob's retention counts from its latest reference (a copy, a turn): `at` refreshes it.
    pub(crate) fn touch_blob(&mut self, id: &str, at: u64) {
        let Some(b) = self.blobs.get_mut(id) else { return };
        if at > b.last_ref_at {
            self.exec_index.blob_expiry.remove(&(b.last_ref_at, b.id.clone()));
            self.exec_index.blob_expiry.insert((at, b.id.clone()));
            b.last_ref_at = at;
        }
    }

    /// Forgets an artifact past the blob retention.
    pub(crate) fn compact_artifact(&mut self, at: u64, id: &str) {
        self.exec_index.artifact_expiry.remove(&(at, id.to_string()));
        self.artifacts.remove(id);
    }

    /// Records an uploaded blob (idempotent by id, with the same record).
    pub(crate) fn blob_put(&mut self, by: &str, blob: &Blob) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_writable()?;
        if caller.member.id != blob.member_id || caller.bot.as_ref().map(|b| &b.id) != blob.bot_id.as_ref() {
            return Err(Reject::new(RejectKind::Forbidden, "a blob is recorded in its uploader's name"));
        }
        if let Some(seen) = self.blobs.get(&blob.id) {
            return if seen == blob { Ok(()) } else { Err(Reject::new(RejectKind::Conflict, "that blob id is taken")) };
        }
        if blob.sha256.len() != 64 || !blob.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Reject::new(RejectKind::Invalid, "sha256 is 64 hex digits"));
        }
        let used = self.exec_index.blob_bytes.get(&blob.member_id).copied().unwrap_or(0);
        let quota = self.blob_limits.quota();
        if used.saturating_add(blob.size) > quota {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("over the blob quota: {used} of {quota} bytes are used, and this blob is {} bytes", blob.size),
            ));
        }
        self.index_blob(blob);
        self.blobs.insert(blob.id.clone(), blob.clone());
        Ok(())
    }

    /// Sets the blob limits (owner or admin).
    pub(crate) fn set_blob_limits(&mut self, by: &str, limits: &BlobLimits) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if limits.retention_ms.is_some_and(|ms| !(3600 * 1000..=400 * 24 * 3600 * 1000).contains(&ms)) {
            return Err(Reject::new(RejectKind::Invalid, "the blob retention must be between 1 hour and 400 days"));
        }
        if limits.quota_bytes == Some(0) {
            return Err(Reject::new(RejectKind::Invalid, "a quota of 0 bytes would refuse every blob"));
        }
        self.blob_limits = *limits;
        Ok(())
    }

    pub(crate) fn index_blob(&mut self, b: &Blob) {
        *self.exec_index.blob_bytes.entry(b.member_id.clone()).or_default() += b.size;
        self.exec_index.blob_expiry.insert((b.last_ref_at, b.id.clone()));
    }

    /// Forgets a blob past its retention (its bytes are deleted by the nodes holding them).
    pub(crate) fn compact_blob(&mut self, at: u64, id: &str) {
        self.exec_index.blob_expiry.remove(&(at, id.to_string()));
        if let Some(b) = self.blobs.remove(id)
            && let Some(n) = self.exec_index.blob_bytes.get_mut(&b.member_id)
        {
            *n = n.saturating_sub(b.size);
            if *n == 0 {
                self.exec_index.blob_bytes.remove(&b.member_id);
            }
        }
    }

    /// May `caller` read blob `b`: its uploader, the member behind the bot that uploaded it, or
    /// a bot working a run the blob is attached to.
    pub fn may_read_blob(&self, caller: &super::state::Caller, b: &Blob) -> bool {
        match &caller.bot {
            Some(bot) => {
                b.bot_id.as_deref() == Some(bot.id.as_str())
                    || self.runs.index.attached.get(&b.id).is_some_and(|runs| {
                        runs.range((bot.id.clone(), String::new())..).next().is_some_and(|(by, _)| *by == bot.id)
                    })
            }
            None => caller.member.id == b.member_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Response;
    use crate::sm::testing::OWNER;
    use crate::sm::testing::world;

    fn blob(id: &str, size: u64) -> Blob {
        Blob {
            id: id.into(),
            member_id: "mem_o".into(),
            bot_id: None,
            name: "report.pdf".into(),
            mime_type: "application/pdf".into(),
            size,
            sha256: "a".repeat(64),
            created_at: 5,
            last_ref_at: 5,
            nodes: vec![1],
        }
    }

    #[test]
    fn blobs_count_against_the_quota_and_go_after_their_retention() {
        let mut s = world();
        let limits = BlobLimits { retention_ms: None, quota_bytes: Some(100) };
        assert_eq!(s.apply(&Command::SetBlobLimits { by: OWNER.into(), limits }), Response::Ok);
        assert_eq!(s.apply(&Command::BlobPut { by: OWNER.into(), blob: blob("blb_1", 60) }), Response::Ok);
        assert_eq!(s.apply(&Command::BlobPut { by: OWNER.into(), blob: blob("blb_1", 60) }), Response::Ok, "a replay");
        let over = s.apply(&Command::BlobPut { by: OWNER.into(), blob: blob("blb_2", 41) });
        assert!(matches!(over, Response::Rejected(r) if r.message.contains("quota")));
        assert_eq!(s.apply(&Command::BlobPut { by: OWNER.into(), blob: blob("blb_2", 40) }), Response::Ok);
        let mut bad = blob("blb_3", 1);
        bad.sha256 = "xyz".into();
        assert!(matches!(s.apply(&Command::BlobPut { by: OWNER.into(), blob: bad }), Response::Rejected(_)));
        s.compact_blob(5, "blb_1");
        assert!(!s.blobs.contains_key("blb_1"));
        assert_eq!(s.exec_index.blob_bytes.get("mem_o"), Some(&40), "the quota is freed");
        // A bot's blob is recorded in the bot's name only.
        let mut forged = blob("blb_4", 1);
        forged.bot_id = Some("bot_1".into());
        assert!(
            matches!(s.apply(&Command::BlobPut { by: OWNER.into(), blob: forged }), Response::Rejected(r) if r.kind == RejectKind::Forbidden)
        );
    }
}
