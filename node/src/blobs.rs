//! A node's blob store: the bytes of blobs, behind one interface ([`BlobStore`]); their records
//! are in the replicated store (`computerd_raft::sm::Blob`), never their bytes.
//!
//! [`LocalBlobs`] keeps them on this node's disk (`DIR/blobs/<id>`): an upload streams into a
//! temporary file while its SHA-256 and length are computed, and only a match is fsynced and
//! renamed into place; a mismatch removes the file and stores nothing. A blob whose record the
//! store no longer has (past its retention) is deleted by [`LocalBlobs::collect`], which leaves
//! files younger than an hour alone (an upload in progress, a blob not yet recorded).
//!
//! In a cluster, the node that took an upload pushes a checked second copy to a peer before it
//! answers, and the record names both nodes; a node without the bytes streams them from one
//! that has them ([`crate::owner::blobs`]). Not yet: an S3-compatible store (`object_store`).

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use futures::Stream;
use futures::StreamExt;

/// A blob is at most this large.
pub const MAX_BLOB: u64 = 1 << 30;

/// A blob's bytes as a stream.
pub type ByteStream = std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send>>;

/// Decides which blob ids the store still records.
pub type Keep = std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Why an upload was not stored.
#[derive(Debug)]
pub enum PutError {
    /// The bytes are not what was declared.
    Mismatch(String),
    /// Over [`MAX_BLOB`].
    TooLarge,
    /// The body stopped (the client went away).
    Body(String),
    /// The disk failed.
    Io(String),
}

/// What an upload stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// Where blob bytes are kept.
pub trait BlobStore: Send + Sync {
    /// Streams `body` in as blob `id`, checking it hashes to `sha256` (when given: an upload
    /// declares it; a copy out of a Computer learns it) and is `size` bytes long (when given) as
    /// it arrives; stores nothing unless it does.
    fn put<'a>(
        &'a self,
        id: &'a str,
        sha256: Option<&'a str>,
        size: Option<u64>,
        body: std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, String>> + Send + 'a>>,
    ) -> futures::future::BoxFuture<'a, Result<Stored, PutError>>;
    /// The bytes of blob `id`, streamed.
    fn open<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, std::io::Result<ByteStream>>;
    /// Removes blob `id` (after a failed record).
    fn remove<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, ()>;
    /// Whether every node reaches the same bytes (S3): a blob then needs no second copy, and its
    /// record names no node.
    fn shared(&self) -> bool {
        false
    }
    /// Deletes what is older than `min_age` and is temporary or a blob `keep` does not name
    /// (past its retention, or never recorded); answers how many.
    fn collect(&self, min_age: Duration, keep: Keep) -> futures::future::BoxFuture<'_, usize>;
}

/// How much of a blob one read takes.
const READ_CHUNK: u64 = 1 << 20;

/// A file's bytes as a stream, 1 MiB at a time, each read on a blocking thread straight into
/// the chunk it becomes (no zeroed buffer, no second copy).
pub fn file_stream(file: std::fs::File) -> ByteStream {
    Box::pin(futures::stream::unfold(Some(file), |f| async move {
        let mut f = f?;
        let read = tokio::task::spawn_blocking(move || {
            let mut chunk = Vec::with_capacity(READ_CHUNK as usize);
            let n = std::io::Read::read_to_end(&mut std::io::Read::take(&mut f, READ_CHUNK), &mut chunk);
            (f, n.map(|_| chunk))
        })
        .await;
        match read {
            Ok((_, Ok(chunk))) if chunk.is_empty() => None,
            Ok((f, Ok(chunk))) => Some((Ok(bytes::Bytes::from(chunk)), Some(f))),
            Ok((_, Err(e))) => Some((Err(e), None)),
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    }))
}

/// Blobs on this node's disk.
pub struct LocalBlobs {
    dir: PathBuf,
}

impl LocalBlobs {
    /// Blobs under `dir` (made 0700 when missing).
    pub fn new(dir: PathBuf) -> std::io::Result<LocalBlobs> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(LocalBlobs { dir })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        crate::ids::is_id(id, "blb").then(|| self.dir.join(id))
    }

    /// Deletes the files older than `min_age` that are temporary or a blob `keep` does not
    /// name (a blob just stored is not recorded yet: the age spares it).
    pub fn collect_files(&self, min_age: Duration, keep: impl Fn(&str) -> bool) -> usize {
        let mut removed = 0;
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let age = e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).unwrap_or_default();
            let drop = age >= min_age && (name.starts_with(".tmp-") || !keep(&name));
            if drop && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// Streams `body` into a new file `tmp`, checking it against `sha256` and `size` as it comes;
/// fsynced once it matches (the caller removes `tmp` on an error).
pub async fn write_checked(
    tmp: &Path,
    sha256: Option<&str>,
    size: Option<u64>,
    mut body: std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, String>> + Send + '_>>,
) -> Result<Stored, PutError> {
    use std::os::unix::fs::OpenOptionsExt;
    let std_file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(|e| PutError::Io(e.to_string()))?;
    // The disk is written and hashed on its own thread (1 MiB writes, writeback started as it
    // grows) while this task receives the next bytes.
    let mut f = computerd_proto::durable::DurableWriter::start_hashed(std_file);
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(PutError::Body)?;
        n += chunk.len() as u64;
        if n > MAX_BLOB {
            return Err(PutError::TooLarge);
        }
        if size.is_some_and(|s| n > s) {
            return Err(PutError::Mismatch(format!(
                "the body is longer than the declared {} bytes",
                size.unwrap_or(0)
            )));
        }
        f.write(chunk).await.map_err(|e| PutError::Io(e.to_string()))?;
    }
    if let Some(s) = size
        && s != n
    {
        return Err(PutError::Mismatch(format!("the body is {n} bytes, not the declared {s}")));
    }
    let (_, digest) = f.finish_hashed().await.map_err(|e| PutError::Io(e.to_string()))?;
    let got = hex::encode(digest);
    if let Some(want) = sha256
        && !got.eq_ignore_ascii_case(want)
    {
        return Err(PutError::Mismatch(format!("the body's SHA-256 is {got}, not {want}")));
    }
    Ok(Stored { size: n, sha256: got })
}

impl BlobStore for LocalBlobs {
    fn put<'a>(
        &'a self,
        id: &'a str,
        sha256: Option<&'a str>,
        size: Option<u64>,
        body: std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, String>> + Send + 'a>>,
    ) -> futures::future::BoxFuture<'a, Result<Stored, PutError>> {
        Box::pin(async move {
            let path = self.path(id).ok_or_else(|| PutError::Io("not a blob id".into()))?;
            let tmp = self.dir.join(format!(".tmp-{id}"));
            let stored = write_checked(&tmp, sha256, size, body).await;
            match stored {
                Ok(s) => {
                    tokio::fs::rename(&tmp, &path).await.map_err(|e| PutError::Io(e.to_string()))?;
                    if let Ok(d) = tokio::fs::File::open(&self.dir).await {
                        let _ = d.sync_all().await;
                    }
                    Ok(s)
                }
                Err(e) => {
                    let _ = tokio::fs::remove_file(&tmp).await;
                    Err(e)
                }
            }
        })
    }

    fn open<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, std::io::Result<ByteStream>> {
        Box::pin(async move {
            let path =
                self.path(id).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "not a blob id"))?;
            Ok(file_stream(tokio::fs::File::open(path).await?.into_std().await))
        })
    }

    fn collect(&self, min_age: Duration, keep: Keep) -> futures::future::BoxFuture<'_, usize> {
        let dir = self.dir.clone();
        Box::pin(async move {
            let files = LocalBlobs { dir };
            tokio::task::spawn_blocking(move || files.collect_files(min_age, |id| keep(id))).await.unwrap_or(0)
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(p) = self.path(id) {
                let _ = tokio::fs::remove_file(p).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    fn body(
        parts: Vec<&'static [u8]>,
    ) -> std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, String>> + Send + 'static>> {
        Box::pin(futures::stream::iter(parts.into_iter().map(|p| Ok(bytes::Bytes::from_static(p)))))
    }

    #[tokio::test]
    async fn only_the_declared_bytes_are_stored() {
        let t = tempfile::tempdir().expect("tmp");
        let store = LocalBlobs::new(t.path().join("blobs")).expect("store");
        let sha = hex::encode(sha2::Sha256::digest(b"hello world"));
        let ok = store.put("blb_a", Some(&sha), Some(11), body(vec![b"hello ", b"world"])).await.expect("stored");
        assert_eq!(ok, Stored { size: 11, sha256: sha.clone() });
        let back: Vec<u8> = store.open("blb_a").await.expect("open").map(|c| c.expect("read").to_vec()).concat().await;
        assert_eq!(back, b"hello world");
        for (bad, size) in
            [(vec![b"hello" as &[u8]], None), (vec![b"hello world!"], None), (vec![b"hello world"], Some(12))]
        {
            let r = store.put("blb_b", Some(&sha), size, body(bad)).await;
            assert!(matches!(r, Err(PutError::Mismatch(_))), "{r:?}");
        }
        assert!(store.open("blb_b").await.is_err(), "a mismatch stores nothing");
        assert_eq!(std::fs::read_dir(t.path().join("blobs")).expect("dir").count(), 1, "no temporary file is left");
        assert_eq!(store.collect_files(Duration::from_secs(3600), |id| id != "blb_a"), 0, "too young");
        assert_eq!(store.collect(Duration::ZERO, std::sync::Arc::new(|id: &str| id != "blb_a")).await, 1);
        assert!(store.open("blb_a").await.is_err());
        assert!(store.open("../etc").await.is_err(), "not an id");
    }
}
