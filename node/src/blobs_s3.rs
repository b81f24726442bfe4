//! Blob bytes in an S3-compatible store (`--blob-store s3://bucket[/prefix]?endpoint=…&region=…`),
//! through `object_store`: every node reaches the same bytes, so a blob needs no second copy and
//! survives the loss of any node.
//!
//! An upload streams into a temporary file on this node while its SHA-256 and length are checked
//! (as for the local store); only a match goes to the bucket (one request up to 8 MiB, a multipart
//! upload above), and the temporary file goes. The credentials come from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, as `object_store` reads them), never from the
//! URL, and are never logged. The HTTP client is ours (hyper, [`Hyper`]), over TCP for `http://`
//! endpoints and rustls for `https://` ones (AWS's own when no endpoint is named): the system's
//! roots, or only the CA of `ca=/path/ca.pem` for a store with a private CA.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use object_store::PutPayload;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use tokio::io::AsyncReadExt;

use crate::blobs::BlobStore;
use crate::blobs::ByteStream;
use crate::blobs::Keep;
use crate::blobs::PutError;
use crate::blobs::Stored;

/// One request up to this size; a multipart upload of parts this large above it.
const PART: usize = 8 << 20;

/// Blobs in a bucket.
pub struct S3Blobs {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    tmp: PathBuf,
}

impl S3Blobs {
    /// The store a `s3://bucket[/prefix]?endpoint=URL&region=R` URL names, with `tmp` (made
    /// 0700) for uploads being checked.
    pub fn from_url(url: &str, tmp: PathBuf) -> Result<S3Blobs, String> {
        use std::os::unix::fs::PermissionsExt;
        let rest = url
            .strip_prefix("s3://")
            .ok_or("the blob store is `local` or `s3://bucket[/prefix]?endpoint=…&region=…`")?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.contains('@') || bucket.contains(':') {
            return Err("credentials go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, not in the URL".into());
        }
        if bucket.is_empty() {
            return Err("no bucket in the blob store URL".into());
        }
        let prefix = prefix.trim_matches('/').to_string();
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let mut ca = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).ok_or_else(|| format!("a bad `{k}` in the blob store URL"))?;
            b = match k {
                "endpoint" if v.starts_with("http://") => {
                    b.with_endpoint(v.as_str()).with_allow_http(true).with_virtual_hosted_style_request(false)
                }
                "endpoint" if v.starts_with("https://") => {
                    b.with_endpoint(v.as_str()).with_virtual_hosted_style_request(false)
                }
                "endpoint" => return Err("the S3 endpoint is an http:// or https:// URL".into()),
                "region" => b.with_region(v.as_str()),
                "ca" => {
                    ca = Some(PathBuf::from(v));
                    b
                }
                other => return Err(format!("unknown blob store option `{other}` (endpoint, region, ca)")),
            };
        }
        let tls = tls_config(ca.as_deref())?;
        let store = b.with_http_connector(Hyper { tls }).build().map_err(|e| format!("the S3 store: {e}"))?;
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        Ok(S3Blobs { store: Arc::new(store), prefix, tmp })
    }

    fn path(&self, id: &str) -> Option<ObjectPath> {
        if !crate::ids::is_id(id, "blb") {
            return None;
        }
        Some(if self.prefix.is_empty() {
            ObjectPath::from(id)
        } else {
            ObjectPath::from(format!("{}/{id}", self.prefix))
        })
    }

    async fn send(&self, to: &ObjectPath, from: &std::path::Path, size: u64) -> Result<(), String> {
        let mut f = tokio::fs::File::open(from).await.map_err(|e| e.to_string())?;
        if size as usize <= PART {
            let mut all = Vec::with_capacity(size as usize);
            f.read_to_end(&mut all).await.map_err(|e| e.to_string())?;
            self.store.put(to, PutPayload::from(all)).await.map_err(|e| e.to_string())?;
            return Ok(());
        }
        let mut upload = self.store.put_multipart(to).await.map_err(|e| e.to_string())?;
        let sent = async {
            loop {
                let mut part = vec![0u8; PART];
                let mut n = 0;
                while n < PART {
                    let got = f.read(&mut part[n..]).await.map_err(|e| e.to_string())?;
                    if got == 0 {
                        break;
                    }
                    n += got;
                }
                if n == 0 {
                    break;
                }
                part.truncate(n);
                upload.put_part(PutPayload::from(part)).await.map_err(|e| e.to_string())?;
                if n < PART {
                    break;
                }
            }
            upload.complete().await.map_err(|e| e.to_string())?;
            Ok::<(), String>(())
        }
        .await;
        if sent.is_err() {
            let _ = upload.abort().await;
        }
        sent
    }
}

impl BlobStore for S3Blobs {
    fn put<'a>(
        &'a self,
        id: &'a str,
        sha256: Option<&'a str>,
        size: Option<u64>,
        body: std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, String>> + Send + 'a>>,
    ) -> futures::future::BoxFuture<'a, Result<Stored, PutError>> {
        Box::pin(async move {
            let to = self.path(id).ok_or_else(|| PutError::Io("not a blob id".into()))?;
            let tmp = self.tmp.join(format!(".tmp-{id}"));
            let stored = crate::blobs::write_checked(&tmp, sha256, size, body).await;
            let out = match stored {
                Ok(s) => self.send(&to, &tmp, s.size).await.map(|()| s).map_err(|e| {
                    tracing::error!(blob = %id, error = %e, "the S3 store refused a blob");
                    PutError::Io(format!("the S3 store: {e}"))
                }),
                Err(e) => Err(e),
            };
            let _ = tokio::fs::remove_file(&tmp).await;
            out
        })
    }

    fn open<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, std::io::Result<ByteStream>> {
        Box::pin(async move {
            let path =
                self.path(id).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "not a blob id"))?;
            let got = self.store.get(&path).await.map_err(|e| match e {
                object_store::Error::NotFound { .. } => {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no such blob")
                }
                other => std::io::Error::other(other.to_string()),
            })?;
            Ok(Box::pin(got.into_stream().map_err(|e| std::io::Error::other(e.to_string()))) as ByteStream)
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(p) = self.path(id) {
                let _ = self.store.delete(&p).await;
            }
        })
    }

    fn shared(&self) -> bool {
        true
    }

    fn collect(&self, min_age: Duration, keep: Keep) -> futures::future::BoxFuture<'_, usize> {
        Box::pin(async move {
            let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let cutoff = now.saturating_sub(min_age).as_millis() as i64;
            let mut listing = self.store.list(prefix.as_ref());
            let mut removed = 0;
            while let Some(Ok(meta)) = listing.next().await {
                let Some(name) = meta.location.filename() else { continue };
                if meta.last_modified.timestamp_millis() <= cutoff
                    && (!crate::ids::is_id(name, "blb") || !keep(name))
                    && self.store.delete(&meta.location).await.is_ok()
                {
                    removed += 1;
                }
            }
            let local = crate::blobs::LocalBlobs::new(self.tmp.clone());
            removed + local.map(|l| l.collect_files(min_age, |_| true)).unwrap_or(0)
        })
    }
}

/// The TLS of `https://` endpoints: only the CA in `ca` (PEM) when named, else the system's roots.
fn tls_config(ca: Option<&std::path::Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("the S3 CA {}: {e}", path.display()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| format!("the S3 CA {}: not PEM certificates: {e}", path.display()))?;
                roots.add(cert).map_err(|e| format!("the S3 CA {}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("the S3 CA {}: no certificate", path.display()));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A system root rustls cannot use is skipped, as every TLS client does.
                let _ = roots.add(cert);
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The S3 client's HTTP: hyper's pooled HTTP/1.1 client over [`Connector`].
#[derive(Debug, Clone)]
struct Hyper {
    tls: Arc<rustls::ClientConfig>,
}

#[derive(Debug)]
struct HyperService(hyper_util::client::legacy::Client<Connector, object_store::client::HttpRequestBody>);

impl object_store::client::HttpConnector for Hyper {
    fn connect(
        &self,
        _options: &object_store::client::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = Connector { http, tls: tokio_rustls::TlsConnector::from(self.tls.clone()) };
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(object_store::client::HttpClient::new(HyperService(client)))
    }
}

/// TCP, with TLS on top for `https://`.
#[derive(Clone)]
struct Connector {
    http: hyper_util::client::legacy::connect::HttpConnector,
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        tower_service::Service::<http::Uri>::poll_ready(&mut self.http, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let https = match uri.scheme_str() {
                Some("https") => true,
                Some("http") => false,
                _ => return Err("the S3 endpoint is http:// or https://".into()),
            };
            let host = uri.host().ok_or("the S3 endpoint names no host")?.trim_matches(['[', ']']).to_string();
            let tcp = tower_service::Service::<http::Uri>::call(&mut http, uri).await?;
            if !https {
                return Ok(Conn::Plain(tcp));
            }
            let name = rustls::pki_types::ServerName::try_from(host)?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(Conn::Tls(Box::new(hyper_util::rt::TokioIo::new(stream))))
        })
    }
}

/// A connection to the store.
enum Conn {
    Plain(hyper_util::rt::TokioIo<tokio::net::TcpStream>),
    Tls(Box<hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>>),
}

impl hyper_util::client::legacy::connect::Connection for Conn {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        match self {
            Conn::Plain(s) => hyper_util::client::legacy::connect::Connection::connected(s),
            Conn::Tls(_) => hyper_util::client::legacy::connect::Connected::new(),
        }
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => hyper::rt::Read::poll_read(std::pin::Pin::new(s), cx, buf),
            Conn::Tls(s) => hyper::rt::Read::poll_read(std::pin::Pin::new(s.as_mut()), cx, buf),
        }
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => hyper::rt::Write::poll_write(std::pin::Pin::new(s), cx, buf),
            Conn::Tls(s) => hyper::rt::Write::poll_write(std::pin::Pin::new(s.as_mut()), cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => hyper::rt::Write::poll_flush(std::pin::Pin::new(s), cx),
            Conn::Tls(s) => hyper::rt::Write::poll_flush(std::pin::Pin::new(s.as_mut()), cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => hyper::rt::Write::poll_shutdown(std::pin::Pin::new(s), cx),
            Conn::Tls(s) => hyper::rt::Write::poll_shutdown(std::pin::Pin::new(s.as_mut()), cx),
        }
    }
}

#[async_trait::async_trait]
impl object_store::client::HttpService for HyperService {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        use http_body_util::BodyExt;
        use object_store::client::HttpError;
        use object_store::client::HttpErrorKind;
        let resp = tokio::time::timeout(Duration::from_secs(60), self.0.request(req))
            .await
            .map_err(|e| HttpError::new(HttpErrorKind::Timeout, e))?
            .map_err(|e| {
                let kind = if e.is_connect() { HttpErrorKind::Connect } else { HttpErrorKind::Request };
                // The whole chain (hyper's own text hides why: a refused certificate, say).
                let mut why = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    why.push_str(": ");
                    why.push_str(&s.to_string());
                    source = s.source();
                }
                HttpError::new(kind, std::io::Error::other(why))
            })?;
        let (parts, body) = resp.into_parts();
        let body = body.map_err(|e| HttpError::new(HttpErrorKind::Decode, e));
        Ok(http::Response::from_parts(parts, object_store::client::HttpResponseBody::new(body)))
    }
}

/// `%XX` escapes decoded (a URL's query value); `None` for a bad escape or bytes that are not
/// UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_never_credentials() {
        let t = tempfile::tempdir().expect("tmp");
        let tmp = t.path().join("s3-tmp");
        let ok = S3Blobs::from_url(
            "s3://blobs/cluster-a?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=us-east-1",
            tmp.clone(),
        )
        .expect("a store");
        assert_eq!(ok.prefix, "cluster-a");
        assert_eq!(ok.path("blb_x").map(|p| p.to_string()), Some("cluster-a/blb_x".into()));
        assert!(ok.path("../x").is_none());
        // AWS itself (no endpoint), and an https endpoint on the system's roots.
        S3Blobs::from_url("s3://blobs?region=eu-west-1", tmp.clone()).expect("AWS");
        S3Blobs::from_url("s3://blobs?endpoint=https://s3.internal:9000", tmp.clone()).expect("https");
        for bad in [
            "s3://",
            "s3://key:secret@blobs",
            "http://blobs",
            "s3://blobs?colour=red",
            "s3://blobs?endpoint=%zz",
            "s3://blobs?endpoint=ftp://s3.internal",
            "s3://blobs?endpoint=https://s3.internal&ca=/nonexistent/ca.pem",
        ] {
            assert!(S3Blobs::from_url(bad, tmp.clone()).is_err(), "{bad}");
        }
        assert_eq!(percent_decode("a%2Fb"), Some("a/b".into()));
    }
}
