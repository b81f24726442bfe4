//! Backups: the whole store as of one applied index, in a checksummed file, and a new cluster
//! started from one.
//!
//! A backup file is one header line, `CDBACKUP1 sha256=<64 hex digits> len=<payload bytes>\n`,
//! then the payload: the JSON of [`Backup`]. The checksum covers the payload. It holds every
//! record (with what secrets the store keeps: token hashes, and providers' write-only
//! credentials, so the file is as sensitive as a node's data dir) and the list of blobs (id,
//! size, SHA-256, where their bytes are), not the blobs' bytes, which live in each node's blob
//! store or a shared one.
//!
//! A restore ([`super::Command::Restore`]) applies only to a store that was never bootstrapped:
//! the records come back as they were, except what belongs to the old cluster (its id, its join
//! secrets and removed nodes, which nodes were live, which node held each agent's link).

use serde::Deserialize;
use serde::Serialize;
use sha2::Digest;

use super::Reject;
use super::RejectKind;
use super::State;

/// The first word of a backup file's header line.
pub const MAGIC: &str = "CDBACKUP1";
/// The payload's format; bump when [`Backup`] changes shape.
pub const FORMAT: u32 = 1;

/// A blob as a backup lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobRow {
    /// `blb_…`.
    pub id: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
    /// The nodes of the old cluster whose blob stores held its bytes (empty: a shared store).
    pub nodes: Vec<u64>,
}

/// A backup's payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    /// [`FORMAT`].
    pub format: u32,
    /// The cluster it was taken from.
    pub cluster_id: Option<String>,
    /// The last applied log index it reflects.
    pub applied_index: u64,
    /// Unix ms, by the cluster's clock.
    pub taken_at: u64,
    /// Every blob's record, for copying and checking their bytes.
    pub blobs: Vec<BlobRow>,
    /// The records.
    pub state: State,
}

/// [`Backup`] as written: the same fields, borrowing the state.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BackupOf<'a> {
    format: u32,
    cluster_id: Option<&'a str>,
    applied_index: u64,
    taken_at: u64,
    blobs: Vec<BlobRow>,
    state: &'a State,
}

/// The backup file of `state` as applied at `applied_index`.
pub fn encode(state: &State, applied_index: u64) -> Result<Vec<u8>, String> {
    let blobs = state
        .blobs
        .values()
        .map(|b| BlobRow { id: b.id.clone(), size: b.size, sha256: b.sha256.clone(), nodes: b.nodes.clone() })
        .collect();
    // The records are written as they are (no copy of the whole state under the read lock).
    let backup = BackupOf {
        format: FORMAT,
        cluster_id: state.cluster_id.as_deref(),
        applied_index,
        taken_at: state.clock,
        blobs,
        state,
    };
    let payload = serde_json::to_vec(&backup).map_err(|e| e.to_string())?;
    let mut out =
        format!("{MAGIC} sha256={} len={}\n", hex::encode(sha2::Sha256::digest(&payload)), payload.len()).into_bytes();
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Reads a backup file: its header, checksum and payload; the records' derived indexes are
/// rebuilt. Every problem is named.
pub fn decode(bytes: &[u8]) -> Result<Backup, String> {
    let end = bytes.iter().take(160).position(|b| *b == b'\n').ok_or("not a computerd backup (no header line)")?;
    let header = std::str::from_utf8(&bytes[..end]).map_err(|_| "not a computerd backup (header)")?;
    let mut words = header.split(' ');
    if words.next() != Some(MAGIC) {
        return Err(format!("not a computerd backup (it does not start with {MAGIC})"));
    }
    let sha = words.next().and_then(|w| w.strip_prefix("sha256=")).ok_or("the backup's header has no sha256")?;
    let len: usize = words
        .next()
        .and_then(|w| w.strip_prefix("len="))
        .and_then(|l| l.parse().ok())
        .ok_or("the backup's header has no len")?;
    let payload = &bytes[end + 1..];
    if payload.len() != len {
        return Err(format!("the backup is {} bytes long, its header says {len}: it is cut or padded", payload.len()));
    }
    if hex::encode(sha2::Sha256::digest(payload)) != sha {
        return Err("the backup's checksum does not match: the file is damaged".into());
    }
    let mut backup: Backup = serde_json::from_slice(payload).map_err(|e| format!("the backup's records: {e}"))?;
    if backup.format != FORMAT {
        return Err(format!("backup format {} is not one this build reads ({FORMAT})", backup.format));
    }
    backup.state.reindex_all();
    Ok(backup)
}

impl State {
    /// Rebuilds every derived index from the records.
    pub fn reindex_all(&mut self) {
        self.reindex_tools();
        self.reindex_executions();
        self.reindex_computers();
        self.ports.reindex();
    }

    /// A new cluster (`cluster_id`, its join secret `join_secret_hash`) takes the records of a
    /// backup: only a store that was never bootstrapped.
    pub(crate) fn restore(&mut self, cluster_id: &str, state_json: &str, join_secret_hash: &str) -> Result<(), Reject> {
        if self.cluster_id.is_some() || self.org.is_some() {
            return Err(Reject::new(RejectKind::Conflict, "only a store that was never bootstrapped takes a backup"));
        }
        let mut restored: State = serde_json::from_str(state_json)
            .map_err(|e| Reject::new(RejectKind::Invalid, format!("the backup's records: {e}")))?;
        if restored.org.is_none() {
            return Err(Reject::new(RejectKind::Invalid, "the backup holds no organization"));
        }
        restored.cluster_id = Some(cluster_id.to_string());
        restored.join =
            super::join::JoinState { secret_hash: Some(join_secret_hash.to_string()), ..Default::default() };
        restored.live_nodes.clear();
        for c in restored.computers.values_mut() {
            // No agent is linked to this cluster yet; each links again with its credential.
            c.link_node = None;
        }
        // The clock never goes back.
        restored.clock = restored.clock.max(self.clock);
        restored.reindex_all();
        *self = restored;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_reads_back_and_a_damaged_one_is_named() {
        let mut s = State { cluster_id: Some("c1".into()), clock: 7, ..Default::default() };
        s.org = Some(super::super::identity::Organization { id: "org".into(), name: "o".into(), created_at: 1 });
        // A Computer with a create's env, resources and metadata (issue 39, item 5), and one
        // without.
        let mut c = super::super::testing::computer(
            "cmp_1",
            "mem_o",
            super::super::model::Source::Provider { provider: "cpp_1".into(), template: None },
        );
        c.env.insert("GREETING".into(), "hello".into());
        c.resources = Some(super::super::model::Resources { cpus: Some(0.5), memory_mb: Some(512) });
        c.metadata.insert("team".into(), "a".into());
        s.insert_computer(c.clone());
        s.insert_computer(super::super::testing::computer("cmp_2", "mem_o", super::super::model::Source::Paired));
        let bytes = encode(&s, 42).expect("encode");
        let b = decode(&bytes).expect("decode");
        assert_eq!((b.applied_index, b.taken_at, b.cluster_id.as_deref()), (42, 7, Some("c1")));
        assert_eq!(serde_json::to_value(&b.state).ok(), serde_json::to_value(&s).ok());
        assert_eq!(b.state.computers.get("cmp_1"), Some(&c), "the create's options read back");
        assert!(b.state.computers["cmp_2"].env.is_empty() && b.state.computers["cmp_2"].resources.is_none());
        let mut cut = bytes.clone();
        cut.pop();
        assert!(decode(&cut).expect_err("cut").contains("cut"));
        let mut flipped = bytes.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 1;
        assert!(decode(&flipped).expect_err("flipped").contains("checksum"));
        assert!(decode(b"{}").is_err());

        let mut fresh = State::default();
        let json = serde_json::to_string(&b.state).expect("json");
        fresh.restore("c2", &json, "hash").expect("restore");
        assert_eq!((fresh.cluster_id.as_deref(), fresh.join.secret_hash.as_deref()), (Some("c2"), Some("hash")));
        assert_eq!(
            fresh.restore("c3", &json, "hash").expect_err("twice").kind,
            RejectKind::Conflict,
            "a bootstrapped store takes no backup"
        );
    }
}
