//! Secrets the model never sees (issue 41, item 2), in real Chromium, on the element corpus's
//! sign-in page (`GET /login` of `tests/fixtures/web/elements.py`, `login.html`): `fill_secret`
//! types a vault secret the node opened into a field of the secret's origins and kind; the site
//! gets exactly the values (read back from its log), while no answer of the session (snapshots,
//! the tools' answers, their requests, errors) holds them: they read `[secret "<name>"]`, and a
//! filled field `[filled from secret "<name>"]`. The page after the sign-in echoes the username
//! and shows the password in large type (a bad site): screenshots (PNG and JPEG; the viewport,
//! the full page, an element) are painted black where the values show, read back pixel by pixel
//! against the page's own rectangles. A fill on a page or frame of another origin is refused
//! (`Forbidden`), and one into a field of the wrong kind (`InvalidRequest`), with nothing typed
//! (read back from the page). Needs root, python3 and chromium (installed by `.ci/run`).

use computer_agent::browser::Browser;
use computerd_proto::ErrorKind;
use serde_json::Value;
use serde_json::json;

mod common;
use common::*;

/// The username the vault holds (`site-user`).
const USER: &str = "alice@example.test";
/// The password the vault holds (`site-password`).
const PASSWORD: &str = "Hunter2-correct-horse";
/// The one-time code the node computed (`site-totp`).
const CODE: &str = "492817";

/// A `fill_secret` as the node sends it (with the opened secret in `fill`).
fn fill(sid: &str, r: &str, name: &str, kind: &str, value: &str, origins: &[String]) -> Value {
    json!({"op": "fill_secret", "args": {
        "session": sid, "ref": r, "secret": name,
        "fill": {"kind": kind, "origins": origins, "value": value},
    }})
}

/// The answers a session gave, kept to check that none holds a value.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    async fn call(&mut self, b: &Browser, v: Value) -> Value {
        let got = call(b, v).await;
        self.0.push(got.to_string());
        got
    }

    async fn refused(&mut self, b: &Browser, v: Value) -> (ErrorKind, String) {
        let got = refused(b, v).await;
        self.0.push(got.1.clone());
        got
    }

    /// None holds a value, as typed, upper- or lower-cased, or percent-encoded.
    fn clean(&self, values: &[&str]) {
        for (n, answer) in self.0.iter().enumerate() {
            let low = answer.to_lowercase();
            for v in values {
                let encoded = v.replace('@', "%40").to_lowercase();
                assert!(
                    !low.contains(&v.to_lowercase()) && !low.contains(&encoded),
                    "answer {n} holds the value of a secret: {answer}"
                );
            }
        }
    }
}

/// A rectangle `[x, y, width, height]` of CSS pixels, read from the page.
fn rect(v: &Value) -> [f64; 4] {
    let n: Vec<f64> = v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
    assert_eq!(n.len(), 4, "a rectangle: {v}");
    [n[0], n[1], n[2], n[3]]
}

/// The image's pixels inside `r` (CSS pixels, `scale` image pixels each; rounded inwards).
fn pixels(img: &image::RgbaImage, r: [f64; 4], scale: f64) -> Vec<[u8; 4]> {
    let (w, h) = img.dimensions();
    let x0 = ((r[0] * scale).ceil().max(0.0) as u32).min(w);
    let y0 = ((r[1] * scale).ceil().max(0.0) as u32).min(h);
    let x1 = (((r[0] + r[2]) * scale).floor().max(0.0) as u32).min(w);
    let y1 = (((r[1] + r[3]) * scale).floor().max(0.0) as u32).min(h);
    assert!(x1 > x0 + 4 && y1 > y0 + 4, "the rectangle {r:?} is inside the image ({w}x{h})");
    let mut out = Vec::new();
    for y in y0..y1 {
        for x in x0..x1 {
            out.push(img.get_pixel(x, y).0);
        }
    }
    out
}

/// Every pixel inside `r` is black (each channel at most `tolerance`: a JPEG's edges ring).
fn black(img: &image::RgbaImage, r: [f64; 4], scale: f64, tolerance: u8, what: &str) {
    let px = pixels(img, r, scale);
    let lit = px.iter().filter(|p| p[..3].iter().any(|c| *c > tolerance)).count();
    assert_eq!(lit, 0, "{what}: {lit} of {} pixels inside {r:?} are not black", px.len());
}

/// Some pixels inside `r` are not black (what the mask must leave alone).
fn not_black(img: &image::RgbaImage, r: [f64; 4], scale: f64, what: &str) {
    let px = pixels(img, r, scale);
    let lit = px.iter().filter(|p| p[..3].iter().any(|c| *c > 60)).count();
    assert!(lit > px.len() / 2, "{what}: only {lit} of {} pixels inside {r:?} are not black", px.len());
}

/// A screenshot's image, decoded.
async fn shot(b: &Browser, args: Value) -> (Value, image::RgbaImage) {
    let a = b.call(op(json!({"op": "screenshot", "args": args})), CALLER).await.expect("a screenshot");
    let img = image::load_from_memory(&a.image).expect("the screenshot decodes").into_rgba8();
    (a.json, img)
}

/// Where the welcome page shows the values, and a region it does not (the green banner): the
/// page's own rectangles in client (viewport) coordinates, the iframe's text offset by the
/// iframe's content box; its scroll and device pixel ratio.
const WHERE: &str = "(() => {
  const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.width, b.height]; };
  const f = document.getElementById('echo'), cs = getComputedStyle(f), fb = f.getBoundingClientRect();
  const inner = f.contentDocument.getElementById('inner').getBoundingClientRect();
  const fx = fb.left + f.clientLeft + parseFloat(cs.paddingLeft), fy = fb.top + f.clientTop + parseFloat(cs.paddingTop);
  return {
    leak: r(document.getElementById('leak')),
    inner: [inner.left + fx, inner.top + fy, inner.width, inner.height],
    banner: r(document.getElementById('banner')),
    dpr: devicePixelRatio, sx: scrollX, sy: scrollY,
    viewport: [innerWidth, innerHeight],
  };
})()";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i41_2_a_filled_login_reaches_the_site_and_never_the_answers_nor_the_screenshots() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/elements.py", &t.path().join("site"));
    let mut seen = Seen::default();
    let opened = seen.call(&b, json!({"op": "open", "args": {"url": format!("{}/login", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    assert_eq!(opened["tabs"][0]["title"], "Sign in", "{opened}");
    // The site's origin as a vault may spell it: upper-case, a trailing slash.
    let origins = vec![format!("{}/", s.url.to_uppercase())];

    // The username and the password, each into its field, not submitted yet.
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let (user_field, password_field) = (find(&snap, "textbox", "Email"), find(&snap, "textbox", "Password"));
    let got = seen.call(&b, fill(&sid, &user_field, "site-user", "password", USER, &origins)).await;
    assert_eq!((got["filled"].as_str(), got["outcome"]["state"].as_str()), (Some("site-user"), Some("done")), "{got}");
    assert!(got.get("typed").is_none(), "no echo of what was typed: {got}");
    seen.call(&b, fill(&sid, &password_field, "site-password", "password", PASSWORD, &origins)).await;
    let read = b.evaluate(&sid, None, "[username.value, password.value]").await.expect("the fields");
    assert_eq!(read, json!([USER, PASSWORD]), "the fields hold the values");

    // The snapshot shows which secret filled each field, never its text nor a masked copy.
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let text = snap["text"].as_str().unwrap_or_default();
    for (name, secret) in [("Email", "site-user"), ("Password", "site-password")] {
        let shown = format!("- textbox {name:?}: \"[filled from secret \\\"{secret}\\\"]\"");
        assert!(text.contains(&shown), "{shown} is not in:\n{text}");
        let el = snap["elements"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["role"] == "textbox" && e["name"] == name))
            .expect(name);
        assert_eq!(el["value"], format!("[filled from secret \"{secret}\"]"), "{el}");
    }

    // Filled again with a submit (the text is replaced, not added to): the site gets exactly the
    // values, and the answer's requests (a recorded action) show the redirect's URL masked.
    let password_field = find(&snap, "textbox", "Password");
    let mut again = fill(&sid, &password_field, "site-password", "password", PASSWORD, &origins);
    again["args"]["submit"] = json!(true);
    again["args"]["actionId"] = json!("sign-in-1");
    let got = seen.call(&b, again).await;
    assert_eq!((got["outcome"]["state"].as_str(), got["outcome"]["navigated"].as_bool()), (Some("done"), Some(true)));
    let requests = got["requests"].to_string();
    assert!(requests.contains("/welcome/u/[secret \\\"site-user\\\"]"), "the redirect, masked: {got}");
    s.wait("login", json!({"username": USER, "password": PASSWORD, "otp": "", "note": ""}));

    // The page after it echoes them: its snapshot, text and JSON, masks them.
    for format in ["text", "json"] {
        let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": format}})).await;
        let text = snap["text"].as_str().unwrap_or_default();
        assert_eq!(snap["title"], "Welcome [secret \"site-user\"]", "{snap}");
        assert!(text.contains("Signed in as [secret \\\"site-user\\\"]"), "{text}");
        assert!(text.contains("[secret \\\"site-password\\\"]"), "the leak, masked:\n{text}");
        assert!(text.contains("- textbox \"Display name\": \"[secret \\\"site-user\\\"]\""), "{text}");
    }
    let listed = seen.call(&b, json!({"op": "list"})).await;
    assert_eq!(listed["sessions"][0]["tabs"][0]["title"], "Welcome [secret \"site-user\"]", "{listed}");

    // A click and a type (recorded, so their answers list the requests they sent) mask them too.
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let profile = find(&snap, "link", "Your profile");
    let got =
        seen.call(&b, json!({"op": "click", "args": {"session": sid, "ref": profile, "actionId": "profile-1"}})).await;
    assert_eq!(got["outcome"]["navigated"], true, "{got}");
    assert!(got["requests"].to_string().contains("/welcome/u/[secret \\\"site-user\\\"]"), "{got}");
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let display = find(&snap, "textbox", "Display name");
    let got = seen
        .call(&b, json!({"op": "type", "args": {"session": sid, "ref": display, "text": "Al", "submit": true, "actionId": "display-1"}}))
        .await;
    assert_eq!(got["outcome"]["navigated"], true, "{got}");
    let nav = seen.call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/welcome/u/alice%40example.test", s.url)}})).await;
    assert_eq!(nav["url"], format!("{}/welcome/u/[secret \"site-user\"]", s.url), "{nav}");
    assert_eq!(nav["title"], "Welcome [secret \"site-user\"]", "{nav}");

    // Screenshots: black wherever the values show, in the page and its same-origin iframe; the
    // banner is left alone.
    let at = b.evaluate(&sid, None, WHERE).await.expect("the page's rectangles");
    let (dpr, leak, inner, banner) =
        (at["dpr"].as_f64().unwrap_or(1.0), rect(&at["leak"]), rect(&at["inner"]), rect(&at["banner"]));
    for format in ["png", "jpeg"] {
        let (meta, img) = shot(&b, json!({"session": sid, "format": format})).await;
        seen.0.push(meta.to_string());
        let tolerance = if format == "png" { 0 } else { 48 };
        black(&img, leak, dpr, tolerance, &format!("{format}: the password"));
        black(&img, inner, dpr, tolerance, &format!("{format}: the username in the iframe"));
        not_black(&img, banner, dpr, &format!("{format}: the banner"));
    }
    // An element: the display field (whose value is the username) is black whole.
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let display = find(&snap, "textbox", "Display name");
    let (meta, img) = shot(&b, json!({"session": sid, "ref": display})).await;
    seen.0.push(meta.to_string());
    let (w, h) = img.dimensions();
    black(&img, [0.0, 0.0, f64::from(w) / dpr, f64::from(h) / dpr], dpr, 0, "the display field");
    // The full page, scrolled (so its page coordinates are not the viewport's).
    b.evaluate(&sid, None, "scrollTo(0, 120)").await.expect("scrolled");
    let at = b.evaluate(&sid, None, WHERE).await.expect("the page's rectangles");
    let sy = at["sy"].as_f64().unwrap_or(0.0);
    assert!(sy > 100.0, "the page scrolled: {at}");
    let page = |r: [f64; 4]| [r[0] + at["sx"].as_f64().unwrap_or(0.0), r[1] + sy, r[2], r[3]];
    let (meta, img) = shot(&b, json!({"session": sid, "fullPage": true})).await;
    seen.0.push(meta.to_string());
    let viewport_height = at["viewport"][1].as_f64().unwrap_or(0.0);
    assert!(f64::from(img.height()) > (viewport_height + 500.0) * dpr, "the full page: {meta}");
    black(&img, page(rect(&at["leak"])), dpr, 0, "full page: the password");
    black(&img, page(rect(&at["inner"])), dpr, 0, "full page: the username in the iframe");
    not_black(&img, page(rect(&at["banner"])), dpr, "full page: the banner");

    // A dialog that shows the password: its message is masked in the click's answer, in the
    // error of a tool the dialog blocks, and in the snapshot that shows it.
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let show = find(&snap, "button", "Show my password");
    let got = seen.call(&b, json!({"op": "click", "args": {"session": sid, "ref": show}})).await;
    assert_eq!(got["outcome"]["dialog"]["message"], "Your password is [secret \"site-password\"]", "{got}");
    let (kind, why) = seen.refused(&b, json!({"op": "press", "args": {"session": sid, "keys": "Tab"}})).await;
    assert_eq!(kind, ErrorKind::Conflict, "{why}");
    // (The message is quoted as JSON, the mask put in after.)
    assert!(why.contains("Your password is [secret \"site-password\"]"), "{why}");
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("Your password is [secret \"site-password\"]")), "{snap}");
    seen.call(&b, json!({"op": "dialog", "args": {"session": sid, "accept": true}})).await;

    // A filled tab cannot be sent to a `javascript:` URL (which could show the field's value):
    // refused, as on every tab.
    let (kind, why) = seen
        .refused(
            &b,
            json!({"op": "navigate", "args": {"session": sid, "url": "javascript:document.title=display.value"}}),
        )
        .await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{why}");
    seen.clean(&[USER, PASSWORD]);
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i41_2_a_fill_is_refused_on_another_origin_or_the_wrong_field_and_nothing_is_typed() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/elements.py", &t.path().join("site"));
    let mut seen = Seen::default();
    let opened = seen.call(&b, json!({"op": "open", "args": {"url": format!("{}/login", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let ours = vec![s.url.clone()];
    let port = s.url.rsplit(':').next().expect("a port").to_string();
    let other = format!("http://localhost:{port}");
    let theirs = vec![other.clone()];
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let user_field = find(&snap, "textbox", "Email");
    let password_field = find(&snap, "textbox", "Password");
    let otp_field = find(&snap, "textbox", "One-time code");
    let note = find(&snap, "textbox", "Note");
    let search = find(&snap, "searchbox", "Search the site");
    let value_of = |id: &'static str| {
        let (b, sid) = (&b, sid.clone());
        async move { b.evaluate(&sid, None, &format!("document.getElementById('{id}').value")).await.expect(id) }
    };

    // Without the opened secret: only the node sends a fill_secret.
    let mut bare = fill(&sid, &password_field, "site-password", "password", PASSWORD, &ours);
    bare["args"].as_object_mut().expect("args").remove("fill");
    let (kind, why) = seen.refused(&b, bare).await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{why}");
    assert!(why.contains("sent by the node with the opened secret"), "{why}");

    // A page of another origin: refused, naming the secret, its origins and the page's.
    let (kind, why) =
        seen.refused(&b, fill(&sid, &password_field, "site-password", "password", PASSWORD, &theirs)).await;
    assert_eq!(kind, ErrorKind::Forbidden, "{why}");
    for part in ["\"site-password\"", other.as_str(), &format!("this tab's page is {}", s.url)] {
        assert!(why.contains(part), "{part:?} is not in: {why}");
    }
    assert_eq!(value_of("password").await, json!(""), "nothing was typed");

    // The wrong kind of field: a password into the search box or the note; nothing typed.
    let (kind, why) = seen.refused(&b, fill(&sid, &search, "site-password", "password", PASSWORD, &ours)).await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{why}");
    assert!(
        why.contains(&format!(
            "{search} is a search box (input type=search name=q id=q), not a password or username field"
        )),
        "{why}"
    );
    assert_eq!(value_of("q").await, json!(""), "nothing was typed");
    let (kind, why) = seen.refused(&b, fill(&sid, &note, "site-password", "password", PASSWORD, &ours)).await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{why}");
    assert!(why.contains("is a text area (textarea name=note id=note), not a password or username field"), "{why}");
    assert_eq!(value_of("note").await, json!(""), "nothing was typed");

    // A one-time code: into its field, yes; into the password field, no.
    let got = seen.call(&b, fill(&sid, &otp_field, "site-totp", "totp", CODE, &ours)).await;
    assert_eq!(got["filled"], "site-totp", "{got}");
    assert_eq!(value_of("otp").await, json!(CODE));
    let (kind, why) = seen.refused(&b, fill(&sid, &password_field, "site-totp", "totp", CODE, &ours)).await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{why}");
    assert!(why.contains("is a password field (input type=password name=password id=password autocomplete=current-password), not a one-time code field"), "{why}");
    assert_eq!(value_of("password").await, json!(""), "nothing was typed");
    // Nor is the username field a one-time code's.
    let (kind, _) = seen.refused(&b, fill(&sid, &user_field, "site-totp", "totp", CODE, &ours)).await;
    assert_eq!(kind, ErrorKind::InvalidRequest);
    assert_eq!(value_of("username").await, json!(""), "nothing was typed");

    // A field in a cross-origin frame: the page's origin and the frame's must both be allowed.
    seen.call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/frames", s.url)}})).await;
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let name = find(&snap, "textbox", "Name in cross-origin");
    let note_value = "a note from the vault";
    let (kind, why) = seen.refused(&b, fill(&sid, &name, "site-note", "text", note_value, &ours)).await;
    assert_eq!(kind, ErrorKind::Forbidden, "{why}");
    assert!(why.contains(&format!("the field {name} is in a frame of {other}")), "{why}");
    let (kind, why) = seen.refused(&b, fill(&sid, &name, "site-note", "text", note_value, &theirs)).await;
    assert_eq!(kind, ErrorKind::Forbidden, "{why}");
    assert!(why.contains(&format!("this tab's page is {}", s.url)), "{why}");
    assert!(!s.events().iter().any(|e| e["el"] == "cross-origin-name"), "nothing reached the frame");
    let both = vec![s.url.clone(), format!("{other}/")];
    let got = seen.call(&b, fill(&sid, &name, "site-note", "text", note_value, &both)).await;
    assert_eq!(got["filled"], "site-note", "{got}");
    s.wait("cross-origin-name", json!(note_value));
    let snap = seen.call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let el = snap["elements"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["role"] == "textbox" && e["name"] == "Name in cross-origin"));
    assert_eq!(el.map(|e| e["value"].clone()), Some(json!("[filled from secret \"site-note\"]")), "{snap}");

    seen.clean(&[PASSWORD, CODE, note_value]);
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}
