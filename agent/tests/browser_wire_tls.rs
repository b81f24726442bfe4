//! Exactly once on the wire over TLS (issue 38, item 1): HTTPS with HTTP/1.1 keep-alive, and
//! HTTP/2, through the session's wire guard, which ends the browser's TLS under a key only that
//! session's Chromium accepts and forwards each request once.
//!
//! - HTTPS/1.1: `tests/fixtures/wire_site.py` over TLS; a recorded click on its form whose answer
//!   the site loses (it counts the POST, then closes the kept-alive connection) is counted once and
//!   `unknown`; answered, it is counted once and `done`.
//! - HTTP/2: a server written here on the `h2` crate (hyper hides a GOAWAY or RST_STREAM after a
//!   handler ran), with a fault switch per request: act and then close the connection; act and
//!   then GOAWAY; act and then RST_STREAM(REFUSED_STREAM) (which tells a client it may retry); a
//!   slow answer. For each: a recorded click on a form POST, a `fetch()` POST made by the page's
//!   script after a click, and a recorded `upload` then a click on the upload form. The server
//!   counts its effects: exactly 1 each time; `unknown` where the answer was lost, `done` where it
//!   came.
//!
//! Both servers use certificates of a private CA made here, which the guard is told to trust
//! (`Browser::add_wire_roots`); Chromium only ever sees the guard's own certificates. Needs root,
//! python3 and chromium (installed by `.ci/run`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use computer_agent::browser::Browser;
use h2::Reason;
use serde_json::Value;
use serde_json::json;

mod common;
use common::*;

/// A private CA and a certificate for 127.0.0.1 and localhost signed by it.
struct Pki {
    ca: rustls::pki_types::CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
    cert: rustls::pki_types::CertificateDer<'static>,
    key_der: Vec<u8>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "wire test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("params");
    let cert = params.signed_by(&key, &issuer).expect("cert");
    Pki {
        ca: ca.der().clone(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert: cert.der().clone(),
        key_der: key.serialize_der(),
    }
}

/// What the HTTP/2 server did to a request, by its `fault` query.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// Act, then close the connection without an answer.
    Close,
    /// Act, then GOAWAY and close.
    GoAway,
    /// Act, then RST_STREAM(REFUSED_STREAM): "not processed, retry", a lie.
    Reset,
    /// Act, then answer after 1.5 s.
    Slow,
}

impl Fault {
    fn of(query: &str) -> Fault {
        match query.split('&').find_map(|kv| kv.strip_prefix("fault=")) {
            Some("close") => Fault::Close,
            Some("goaway") => Fault::GoAway,
            Some("rst") => Fault::Reset,
            Some("slow") => Fault::Slow,
            _ => Fault::None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Close => "close",
            Fault::GoAway => "goaway",
            Fault::Reset => "rst",
            Fault::Slow => "slow",
        }
    }
}

/// The HTTP/2 site: its counted effects (`"<path>?fault=<f>"` → count), connections and
/// requests (every request, with the connection it came on).
#[derive(Default)]
struct H2State {
    effects: HashMap<String, u64>,
    connections: u64,
    requests: Vec<(u64, String, String)>,
}

type Shared = Arc<Mutex<H2State>>;

fn page(title: &str, body: &str) -> Bytes {
    Bytes::from(format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>\
         <link rel=stylesheet href=/style.css></head><body><h1>{title}</h1>{body}</body></html>"
    ))
}

/// The page for a path and query, and whether the request is an effect to count.
fn route(method: &str, path: &str, query: &str) -> (u16, &'static str, Bytes, Option<&'static str>) {
    let f = Fault::of(query).name();
    let html = "text/html; charset=utf-8";
    match (method, path) {
        ("GET", "/form") => (
            200,
            html,
            page(
                "Form",
                &format!(
                    "<form method=post action=\"/submit?fault={f}\"><label>Note <input name=note value=hello></label> \
             <button type=submit>Send</button></form>"
                ),
            ),
            None,
        ),
        ("POST", "/submit") => (303, html, Bytes::new(), Some("submit")),
        ("GET", "/done") => (200, html, page("Sent", "<p>sent</p>"), None),
        ("GET", "/script") => (
            200,
            html,
            page(
                "Script",
                &format!(
                    "<button id=go>Send by script</button><p id=out>idle</p><script>\
             document.getElementById('go').addEventListener('click', () => {{\
               fetch('/api?fault={f}', {{method: 'POST', body: 'x'}})\
                 .then(r => {{ document.getElementById('out').textContent = 'status ' + r.status; }})\
                 .catch(e => {{ document.getElementById('out').textContent = 'failed ' + e; }});\
             }});</script>"
                ),
            ),
            None,
        ),
        ("POST", "/api") => (200, "text/plain", Bytes::from_static(b"ok"), Some("api")),
        ("GET", "/upload") => (
            200,
            html,
            page(
                "Upload",
                &format!(
                    "<form method=post enctype=multipart/form-data action=\"/store?fault={f}\">\
             <label>Document <input type=file name=doc></label> <button type=submit>Upload</button></form>"
                ),
            ),
            None,
        ),
        ("POST", "/store") => (303, html, Bytes::new(), Some("store")),
        ("GET", "/style.css") => (200, "text/css", Bytes::from_static(b"body{font-family:sans-serif}"), None),
        _ => (404, html, page("Not found", ""), None),
    }
}

/// Serves HTTP/2 over TLS on 127.0.0.1; answers its port.
async fn h2_site(p: &Pki, state: Shared) -> u16 {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![p.cert.clone()], rustls::pki_types::PrivateKeyDer::Pkcs8(p.key_der.clone().into()))
        .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, state) = (acceptor.clone(), state.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let conn_no = {
                    let mut s = state.lock().expect("lock");
                    s.connections += 1;
                    s.connections
                };
                let _ = connection(tls, conn_no, state).await;
            });
        }
    });
    port
}

/// One HTTP/2 connection: each request in a task of its own; a fault that ends the connection
/// is carried out here.
async fn connection<T>(io: T, conn_no: u64, state: Shared) -> Result<(), h2::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut conn = h2::server::handshake(io).await?;
    let (end_tx, mut end_rx) = tokio::sync::mpsc::unbounded_channel::<Fault>();
    loop {
        tokio::select! {
            next = conn.accept() => {
                let Some(next) = next else { return Ok(()) };
                let (req, respond) = next?;
                tokio::spawn(request(req, respond, conn_no, state.clone(), end_tx.clone()));
            }
            Some(fault) = end_rx.recv() => {
                if fault == Fault::GoAway {
                    conn.abrupt_shutdown(Reason::NO_ERROR);
                    // Sends the GOAWAY, then the connection ends.
                    let _ = tokio::time::timeout(Duration::from_secs(2), std::future::poll_fn(|cx| conn.poll_closed(cx))).await;
                }
                return Ok(());
            }
        }
    }
}

async fn request(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    conn_no: u64,
    state: Shared,
    end: tokio::sync::mpsc::UnboundedSender<Fault>,
) {
    let (parts, mut body) = req.into_parts();
    // The whole body first: the effect happens with all of it.
    let mut size = 0usize;
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return };
        size += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let (path, query) = (parts.uri.path().to_string(), parts.uri.query().unwrap_or_default().to_string());
    let (status, ctype, page, effect) = route(parts.method.as_str(), &path, &query);
    let fault = Fault::of(&query);
    {
        let mut s = state.lock().expect("lock");
        s.requests.push((conn_no, parts.method.to_string(), format!("{path}?{query}")));
        if let Some(e) = effect {
            *s.effects.entry(format!("{e}?fault={}", fault.name())).or_default() += 1;
            // An upload's file must have come with it.
            if e == "store" && size < 64 {
                *s.effects.entry("store without its file".into()).or_default() += 1;
            }
        }
    }
    if effect.is_some() {
        match fault {
            Fault::Close | Fault::GoAway => {
                let _ = end.send(fault);
                return;
            }
            Fault::Reset => {
                respond.send_reset(Reason::REFUSED_STREAM);
                return;
            }
            Fault::Slow => tokio::time::sleep(Duration::from_millis(1500)).await,
            Fault::None => {}
        }
    }
    let mut resp =
        http::Response::builder().status(status).header("content-type", ctype).header("cache-control", "no-store");
    if status == 303 {
        resp = resp.header("location", "/done");
    }
    let Ok(resp) = resp.body(()) else { return };
    let Ok(mut stream) = respond.send_response(resp, page.is_empty()) else { return };
    if !page.is_empty() {
        let _ = stream.send_data(page, true);
    }
}

fn effects(state: &Shared, key: &str) -> u64 {
    state.lock().expect("lock").effects.get(key).copied().unwrap_or(0)
}

async fn open(b: &Browser, profile: &str) -> String {
    let opened = call(b, json!({"op": "open", "args": {"profile": profile}})).await;
    opened["session"].as_str().expect("session").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_faults_never_bring_a_second_send() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let p = pki();
    b.add_wire_roots(vec![p.ca.clone()]);
    let state = Shared::default();
    let port = h2_site(&p, state.clone()).await;
    let base = format!("https://127.0.0.1:{port}");
    let sid = open(&b, "h2").await;
    const DOC: &[u8] = b"%PDF-1.4\n% a document uploaded over HTTP/2, long enough to tell it came whole\n";
    let doc = t.path().join("workspace").join("doc.pdf");
    std::fs::write(&doc, DOC).expect("doc");

    for fault in [Fault::Close, Fault::GoAway, Fault::Reset, Fault::Slow] {
        let f = fault.name();
        let lost = fault != Fault::Slow;
        let want = if lost { "unknown" } else { "done" };

        // A form POST by a recorded click.
        let snap = load(&b, &sid, format!("{base}/form?fault={f}"), "Form").await;
        let send = find(&snap, "button", "Send");
        let got =
            call(&b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": format!("h2-form-{f}")}}))
                .await;
        eprintln!("{f}: the form's click answered {got}");
        assert_eq!(effects(&state, &format!("submit?fault={f}")), 1, "{f}: the site took the POST once: {got}");
        assert_eq!(got["outcome"]["state"], want, "{f}: {got}");
        let field = if lost { ("result", &json!("no answer")) } else { ("status", &json!(303)) };
        assert!(lists(&got, "POST", &format!("{base}/submit"), field.0, field.1), "{f}: {got}");

        // A fetch() POST the page's script makes after a click.
        let snap = load(&b, &sid, format!("{base}/script?fault={f}"), "Script").await;
        let go = find(&snap, "button", "Send by script");
        let got =
            call(&b, json!({"op": "click", "args": {"session": sid, "ref": go, "actionId": format!("h2-fetch-{f}")}}))
                .await;
        eprintln!("{f}: the script's click answered {got}");
        assert_eq!(effects(&state, &format!("api?fault={f}")), 1, "{f}: the site took the fetch once: {got}");
        assert_eq!(got["outcome"]["state"], want, "{f}: {got}");
        let field = if lost { ("result", json!("no answer")) } else { ("status", json!(200)) };
        assert!(lists(&got, "POST", &format!("{base}/api"), field.0, &field.1), "{f}: {got}");

        // A recorded upload, then the click that sends it.
        let snap = load(&b, &sid, format!("{base}/upload?fault={f}"), "Upload").await;
        let input = find(&snap, "button", "Document");
        let up = call(&b, json!({"op": "upload", "args": {"session": sid, "ref": input, "paths": [doc.display().to_string()], "actionId": format!("h2-upload-{f}")}})).await;
        assert_eq!(up["accepted"], true, "{f}: {up}");
        let send = find(&snap, "button", "Upload");
        let got = call(
            &b,
            json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": format!("h2-store-{f}")}}),
        )
        .await;
        eprintln!("{f}: the upload's click answered {got}");
        assert_eq!(effects(&state, &format!("store?fault={f}")), 1, "{f}: the site stored the upload once: {got}");
        assert_eq!(got["outcome"]["state"], want, "{f}: {got}");
    }
    // Loaded again afterwards: a re-sent request would have come by now.
    load(&b, &sid, format!("{base}/form"), "Form").await;
    {
        let s = state.lock().expect("lock");
        assert!(s.effects.values().all(|n| *n == 1), "every effect once: {:?}", s.effects);
        assert_eq!(s.effects.get("store without its file"), None, "each upload came with its file: {:?}", s.effects);
        assert_eq!(s.effects.len(), 12, "{:?}", s.effects);
    }
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_keep_alive_loses_an_answer_once() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let p = pki();
    b.add_wire_roots(vec![p.ca.clone()]);
    let (cert, key) = (t.path().join("cert.pem"), t.path().join("key.pem"));
    std::fs::write(&cert, &p.cert_pem).expect("cert");
    std::fs::write(&key, &p.key_pem).expect("key");
    let s = site_with("wire_site.py", &t.path().join("site"), &[cert.as_os_str(), key.as_os_str()], "https");
    let posts = || -> u64 {
        let text = std::fs::read_to_string(s.state.join("state.json")).unwrap_or_default();
        serde_json::from_str::<Value>(&text).ok().and_then(|v| v["posts"].as_u64()).unwrap_or(u64::MAX)
    };
    let sid = open(&b, "tls").await;
    let snap = load(&b, &sid, format!("{}/", s.url), "Form").await;
    let send = find(&snap, "button", "Send");
    std::fs::write(s.state.join("control.json"), r#"{"lose": 1}"#).expect("control");
    let lost = call(&b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": "tls-lost-1"}})).await;
    eprintln!("the click whose answer was lost answered: {lost}");
    assert_eq!(posts(), 1, "{lost}");
    assert_eq!(lost["outcome"]["state"], "unknown", "{lost}");
    assert!(lists(&lost, "POST", &format!("{}/submit", s.url), "result", &json!("no answer")), "{lost}");
    load(&b, &sid, format!("{}/other", s.url), "Other").await;
    assert_eq!(posts(), 1, "no POST was sent again");

    let snap = load(&b, &sid, format!("{}/", s.url), "Form").await;
    let send = find(&snap, "button", "Send");
    let sent = call(&b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": "tls-sent-1"}})).await;
    assert_eq!(posts(), 2, "{sent}");
    assert_eq!(sent["outcome"]["state"], "done", "{sent}");
    assert!(lists(&sent, "POST", &format!("{}/submit", s.url), "status", &json!(303)), "{sent}");

    // The per-request fault switches: a form, a script's fetch() and an upload, each once.
    let doc = t.path().join("workspace").join("doc.pdf");
    std::fs::write(&doc, b"%PDF-1.4\n% a document uploaded over HTTPS, kept alive\n").expect("doc");
    h1_faults_once(&b, &sid, &s.url, &s, &doc).await;

    // A server whose certificate the guard cannot verify: a failed load naming the net error,
    // as Chromium's own would be (the guard never lowers what is checked).
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
    std::fs::create_dir_all(t.path().join("second")).expect("second");
    let b2 = browser(&t.path().join("second"));
    let sid = open(&b2, "untrusted").await;
    let (kind, why) =
        refused(&b2, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/", s.url)}})).await;
    assert_eq!(kind, computerd_proto::ErrorKind::NavigationFailed, "{why}");
    assert!(why.contains("ERR_CERT_AUTHORITY_INVALID"), "{why}");
    call(&b2, json!({"op": "close", "args": {"session": sid}})).await;
}
