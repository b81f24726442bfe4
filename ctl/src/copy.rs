//! `computerctl cp`: files to and from a Computer, checked by SHA-256 end to end.
//!
//! A copy goes through the blob store, the checked path of SPEC §7:
//! - up: the file is hashed here, sent as a blob (`POST /api/blobs?sha=`; the node refuses
//!   bytes that do not match), then put in place by the agent (`POST …/copy-to-box`), which
//!   hashes what it wrote and answers the digest: it must be this file's;
//! - down: the agent reads the file into a blob (`POST …/copy-from-box`, answering its digest),
//!   then the blob is streamed here into a temporary file beside the target, hashed on the way,
//!   and renamed into place only when the digests agree.
//!
//! Files up to 1 GiB. Progress bars on stderr when it is a terminal.

use std::io::Read;
use std::path::Path;
use std::path::PathBuf;

use anyhow::Context;
use anyhow::bail;
use computerd_client::Client;
use futures::StreamExt;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;
use tokio::io::AsyncWriteExt;

/// One end of a copy: a local path or `COMPUTER:PATH`.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Here.
    Local(PathBuf),
    /// In a Computer.
    Remote {
        /// The Computer: its id (`cmp_…`) or its name, as given.
        computer: String,
        /// The path there (relative paths start at the workspace).
        path: String,
    },
}

impl End {
    /// `COMPUTER:PATH` is remote (COMPUTER an id or a name), as with scp: a colon before any
    /// slash, with something on both sides of it; anything else is a local path (`./a:b`).
    pub fn parse(s: &str) -> End {
        match s.split_once(':') {
            Some((c, p)) if !c.is_empty() && !c.contains('/') && !p.is_empty() => {
                End::Remote { computer: c.to_string(), path: p.to_string() }
            }
            _ => End::Local(PathBuf::from(s)),
        }
    }
}

fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

fn sha256_of(path: &Path) -> anyhow::Result<(String, u64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hex::encode(h.finalize()), len))
}

fn query_value(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Copies `from` to `to`; answers what the far side reported (`path`, `size`, `sha256`).
pub async fn copy(client: &Client, from: End, to: End, user: Option<&str>) -> anyhow::Result<Value> {
    match (from, to) {
        (End::Local(src), End::Remote { computer, path }) => up(client, &src, &computer, &path, user).await,
        (End::Remote { computer, path }, End::Local(dst)) => down(client, &computer, &path, &dst, user).await,
        _ => bail!(
            "one end must be COMPUTER:PATH (an id `cmp_…` or a name, then `:/path`) and the other a local path (`./a:b` for a local name with a colon)"
        ),
    }
}

async fn up(client: &Client, src: &Path, computer: &str, path: &str, user: Option<&str>) -> anyhow::Result<Value> {
    let (sha, len) = sha256_of(src)?;
    let name = src.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "file".into());
    let file = tokio::fs::File::open(src).await.with_context(|| format!("cannot read {}", src.display()))?;
    let progress = bar(len, &format!("up {name}"));
    let counted = progress.clone();
    let body = tokio_util_stream(file).map(move |chunk| {
        if let Ok(c) = &chunk {
            counted.inc(c.len() as u64);
        }
        chunk
    });
    let resp = client
        .raw(Method::POST, &format!("/api/blobs?sha={sha}&name={}", query_value(&name)))
        .header("Content-Type", "application/octet-stream")
        .header("Content-Length", len.to_string())
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await?;
    let blob: Value = Client::check(resp).await?.json().await?;
    progress.finish_and_clear();
    let blob_id = blob["blobId"].as_str().context("the blob store answered no blobId")?;
    // A directory as the target takes the file's name, as `cp` does: one that ends in `/`
    // at once; another once the Computer says it is one (nothing was written then).
    let into = |dir: &str| format!("{}/{name}", dir.trim_end_matches('/'));
    let path = if path.ends_with('/') { into(path) } else { path.to_string() };
    let place = |path: String| {
        let mut req = json!({"blobId": blob_id, "path": path});
        if let Some(u) = user {
            req["user"] = u.into();
        }
        async move { client.request(Method::POST, &format!("/v1/computers/{computer}/copy-to-box"), Some(&req)).await }
    };
    let placed = match place(path.clone()).await {
        Err(e) if format!("{e:#}").contains("is a directory") => place(into(&path)).await?,
        other => other?,
    };
    if placed["sha256"].as_str() != Some(sha.as_str()) || placed["size"].as_u64() != Some(len) {
        bail!(
            "the Computer reports {} ({} bytes), not this file's {sha} ({len} bytes)",
            placed["sha256"],
            placed["size"]
        );
    }
    Ok(placed)
}

/// A file as a stream of chunks, read as the body is sent.
fn tokio_util_stream(file: tokio::fs::File) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> {
    futures::stream::unfold((file, false), |(mut file, done)| async move {
        use tokio::io::AsyncReadExt;
        if done {
            return None;
        }
        let mut buf = vec![0u8; 256 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), (file, false)))
            }
            Err(e) => Some((Err(e), (file, true))),
        }
    })
}

async fn down(client: &Client, computer: &str, path: &str, dst: &Path, user: Option<&str>) -> anyhow::Result<Value> {
    let mut req = json!({"path": path});
    if let Some(u) = user {
        req["user"] = u.into();
    }
    let blob = client.request(Method::POST, &format!("/v1/computers/{computer}/copy-from-box"), Some(&req)).await?;
    let blob_id = blob["blobId"].as_str().context("the copy answered no blobId")?;
    let want = blob["sha256"].as_str().context("the copy answered no sha256")?.to_string();
    let len = blob["size"].as_u64().unwrap_or(0);
    // A directory as the target takes the file's name.
    let dst = if dst.is_dir() {
        dst.join(path.rsplit('/').find(|n| !n.is_empty()).unwrap_or("file"))
    } else {
        dst.to_path_buf()
    };
    let resp = client.raw(Method::GET, &format!("/api/blobs/{blob_id}")).send().await?;
    let mut resp = Client::check(resp).await?;
    let dir = dst.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.computerctl-part",
        dst.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default()
    ));
    let mut out = tokio::fs::File::create(&tmp).await.with_context(|| format!("cannot write {}", tmp.display()))?;
    let progress = bar(len, &format!("down {}", dst.display()));
    let mut h = sha2::Sha256::new();
    let mut got = 0u64;
    let fetched = async {
        while let Some(chunk) = resp.chunk().await? {
            h.update(&chunk);
            out.write_all(&chunk).await?;
            got += chunk.len() as u64;
            progress.inc(chunk.len() as u64);
        }
        out.sync_all().await?;
        anyhow::Ok(())
    }
    .await;
    progress.finish_and_clear();
    let sha = hex::encode(h.finalize());
    if let Err(e) = fetched {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e.context("the download broke"));
    }
    if sha != want || got != len {
        let _ = tokio::fs::remove_file(&tmp).await;
        bail!(
            "what arrived ({sha}, {got} bytes) is not the Computer's file ({want}, {len} bytes); nothing was written"
        );
    }
    tokio::fs::rename(&tmp, &dst).await.with_context(|| format!("cannot write {}", dst.display()))?;
    Ok(json!({"path": dst.display().to_string(), "size": got, "sha256": sha}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_local_unless_they_name_a_computer() {
        assert_eq!(
            End::parse("cmp_ab:/workspace/x"),
            End::Remote { computer: "cmp_ab".into(), path: "/workspace/x".into() }
        );
        assert_eq!(End::parse("cmp_ab:rel"), End::Remote { computer: "cmp_ab".into(), path: "rel".into() });
        assert_eq!(End::parse("./cmp_ab:x"), End::Local("./cmp_ab:x".into()));
        assert_eq!(End::parse("/tmp/a:b"), End::Local("/tmp/a:b".into()));
        assert_eq!(End::parse("cmp_ab:"), End::Local("cmp_ab:".into()));
        assert_eq!(End::parse(":x"), End::Local(":x".into()));
        // A Computer's name, as scp takes a host's.
        assert_eq!(
            End::parse("my box:/workspace/"),
            End::Remote { computer: "my box".into(), path: "/workspace/".into() }
        );
        assert_eq!(End::parse("c:/x"), End::Remote { computer: "c".into(), path: "/x".into() });
    }

    #[test]
    fn names_are_escaped_in_queries() {
        assert_eq!(query_value("a b&c=é.pdf"), "a%20b%26c%3D%C3%A9.pdf");
    }
}
