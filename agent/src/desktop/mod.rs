//! The desktop of a Computer, owned by the agent: it starts the display (or opens a paired
//! machine's, when its owner opts in), takes screenshots through X11 and sends input with XTest,
//! one caller at a time.
//!
//! - [`xserver`]: Xvfb and the window manager, kept running as the desktop's own account, and
//!   the cookie no session can read.
//! - [`screen`]: the agent's X11 connection: capture (MIT-SHM) and input (XTest).
//! - [`keys`]: key names and characters as keysyms.
//! - [`stream`] and [`rfb`]: a person's stream (x11vnc on a socket only the agent reaches),
//!   its input filtered on the server side by the lease.
//!
//! **The input lease.** One writer at a time: a caller's actions take the Computer's input lease
//! for [`LEASE`], renewed by each use. While someone else holds it, actions fail `InputBusy`,
//! naming the holder. `release` ends it. Calls are served one after another on one connection,
//! so no two callers' actions interleave, and a lease changes hands only between two calls. A
//! person in `control` mode (holder `person:…`) takes the lease from a bot or an API caller,
//! between two of its calls; no bot or API caller takes it from a person while it lasts.

pub mod keys;
pub mod rfb;
pub mod screen;
pub mod stream;
pub mod xserver;

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use computerd_proto::ErrorKind;
use computerd_proto::desktop::DesktopOp;
use computerd_proto::desktop::ImageFormat;
use computerd_proto::desktop::ScreenshotRequest;
use image::ImageEncoder;
use serde_json::Value;
use serde_json::json;

use screen::Picture;
use screen::Screen;
use xserver::Display;

/// How long an input lease lasts without use.
pub const LEASE: Duration = Duration::from_secs(30);
/// The default JPEG quality.
const JPEG_QUALITY: u8 = 80;

/// Which calls a desktop takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Screenshots, actions and (later) the stream: the Computer's own display.
    Full,
    /// A paired machine's display its owner opted in to: screenshots and actions, never a
    /// stream.
    ScreenshotsAndActions,
}

/// A failed desktop call: its kind and message.
#[derive(Debug, Clone, PartialEq)]
pub struct DesktopError {
    /// The API's kind.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
}

impl DesktopError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }
    fn x(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ComputerExecutionFailed, message)
    }
}

/// An answer: its JSON and, for a screenshot, the image.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The JSON.
    pub json: Value,
    /// The encoded image (empty without one).
    pub image: Vec<u8>,
}

struct Lease {
    holder: String,
    until: Instant,
}

struct Inner {
    display: Display,
    scope: Scope,
    /// The connection, made on first use and made again after an error.
    screen: Mutex<Option<Screen>>,
    lease: Mutex<Option<Lease>>,
    /// The lease's holder as last published (its changes are reported to the node as events).
    holder: tokio::sync::watch::Sender<Option<String>>,
    /// The screen's size as last seen.
    size: Mutex<Option<(u64, u64)>>,
    /// The account x11vnc runs as (the agent's own display only).
    account: Option<crate::users::Account>,
    vnc: tokio::sync::Mutex<stream::Vnc>,
}

/// Whether a lease holder is a person (a stream in control mode).
pub fn is_person(holder: &str) -> bool {
    holder.starts_with("person:")
}

/// The desktop; clones share it.
#[derive(Clone)]
pub struct Desktop {
    inner: Arc<Inner>,
}

impl Desktop {
    /// A desktop on `display`.
    pub fn new(display: Display, scope: Scope) -> Desktop {
        let account = display.account.clone();
        Desktop {
            inner: Arc::new(Inner {
                display,
                scope,
                screen: Mutex::new(None),
                lease: Mutex::new(None),
                holder: tokio::sync::watch::Sender::new(None),
                size: Mutex::new(None),
                account,
                vnc: tokio::sync::Mutex::new(stream::Vnc::default()),
            }),
        }
    }

    /// The screen's size as started (the agent's own display): reported from the start, before
    /// the first screenshot or action connects to the screen.
    pub fn with_size(self, width: u16, height: u16) -> Desktop {
        *self.inner.size.lock().unwrap_or_else(|p| p.into_inner()) = Some((u64::from(width), u64::from(height)));
        self
    }

    /// What this desktop takes.
    pub fn scope(&self) -> Scope {
        self.inner.scope
    }

    /// The lease's holder, changing when the lease changes hands, is released or expires (not
    /// when it is renewed).
    pub fn lease_changes(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.inner.holder.subscribe()
    }

    /// Publishes the holder of `lease` (called with the lease's lock held, so in order).
    fn publish(&self, lease: &Option<Lease>) {
        let now = lease.as_ref().map(|l| l.holder.clone());
        self.inner.holder.send_if_modified(|h| {
            let changed = *h != now;
            if changed {
                h.clone_from(&now);
            }
            changed
        });
    }

    /// Ends an expired lease (the link's timer calls it every second, so its end is reported).
    pub fn expire_lease(&self) {
        if let Ok(mut lease) = self.inner.lease.lock()
            && lease.as_ref().is_some_and(|l| l.until <= Instant::now())
        {
            *lease = None;
            self.publish(&lease);
        }
    }

    /// Serves one call for `caller` (`bot:<id>` or `member:<id>`).
    pub async fn call(&self, op: DesktopOp, caller: String) -> Result<Answer, DesktopError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.call_blocking(op, &caller))
            .await
            .map_err(|e| DesktopError::x(format!("the desktop call stopped: {e}")))?
    }

    fn call_blocking(&self, op: DesktopOp, caller: &str) -> Result<Answer, DesktopError> {
        if let DesktopOp::Status = op {
            return Ok(Answer { json: self.status(), image: Vec::new() });
        }
        if let DesktopOp::Release = op {
            let mut lease = self.inner.lease.lock().map_err(|_| DesktopError::x("lease lock poisoned"))?;
            let released = match lease.as_ref() {
                Some(l) if l.holder == caller => true,
                Some(l) if l.until > Instant::now() => {
                    return Err(DesktopError::new(
                        ErrorKind::InputBusy,
                        format!("the input lease is held by {}, not by the caller", l.holder),
                    ));
                }
                _ => false,
            };
            *lease = None;
            self.publish(&lease);
            return Ok(Answer { json: json!({"released": released}), image: Vec::new() });
        }
        // One call at a time on the display.
        let mut guard = self.inner.screen.lock().map_err(|_| DesktopError::x("screen lock poisoned"))?;
        if guard.is_none() {
            let d = &self.inner.display;
            let (state, why) = d.state();
            if state != xserver::DisplayState::Running {
                return Err(DesktopError::new(
                    ErrorKind::Unavailable,
                    format!("the desktop is {}{}", state.as_str(), why.map(|w| format!(": {w}")).unwrap_or_default()),
                ));
            }
            *guard = Some(Screen::connect(&d.socket(), &d.cookie, d.server_uid).map_err(DesktopError::x)?);
        }
        let Some(screen) = guard.as_mut() else { return Err(DesktopError::x("no connection to the display")) };
        let result = match op {
            DesktopOp::Screenshot(req) => {
                computerd_proto::desktop::check_screenshot(&req).map_err(DesktopError::invalid)?;
                shoot(screen, &req).map(|(json, image)| Answer { json, image })
            }
            DesktopOp::Actions(req) => {
                computerd_proto::desktop::check_actions(&req).map_err(DesktopError::invalid)?;
                // Everything is checked before anything is sent.
                screen.check_points(&req.actions).map_err(DesktopError::invalid)?;
                Screen::check_keys(&req.actions).map_err(DesktopError::invalid)?;
                if let Some(r) = req.screenshot.request()
                    && let Some(g) = r.region
                {
                    check_region(screen, g)?;
                }
                self.take_lease(caller)?;
                let mut results = Vec::with_capacity(req.actions.len());
                let mut failed = None;
                for (i, a) in req.actions.iter().enumerate() {
                    match screen.act(a) {
                        Ok(()) => results.push(json!({"index": i, "type": a.kind(), "ok": true})),
                        Err(e) => {
                            results.push(json!({"index": i, "type": a.kind(), "ok": false, "error": e}));
                            failed = Some(e);
                            break;
                        }
                    }
                }
                self.take_lease(caller)?;
                match failed {
                    Some(e) => Err(DesktopError::x(format!("an action failed: {e}"))),
                    None => {
                        let mut json = json!({"results": results, "screenshot": null});
                        let mut image = Vec::new();
                        if let Some(r) = req.screenshot.request() {
                            let (shot, bytes) = shoot(screen, &r)?;
                            json["screenshot"] = shot;
                            image = bytes;
                        }
                        Ok(Answer { json, image })
                    }
                }
            }
            DesktopOp::Status | DesktopOp::Release => Err(DesktopError::x("unreachable")),
        };
        // A connection that failed is made again on the next call (the display may have restarted).
        if matches!(&result, Err(e) if e.kind == ErrorKind::ComputerExecutionFailed) {
            *guard = None;
        }
        result
    }

    /// The display and authority file a program shown on this desktop needs (`DISPLAY`,
    /// `XAUTHORITY`); the file is readable by the desktop's account only.
    pub fn display_env(&self) -> (String, std::path::PathBuf) {
        (format!(":{}", self.inner.display.number), self.inner.display.authority.clone())
    }

    /// Takes (or renews) the input lease for `caller`, or says who holds it.
    pub fn take_lease(&self, caller: &str) -> Result<(), DesktopError> {
        let mut lease = self.inner.lease.lock().map_err(|_| DesktopError::x("lease lock poisoned"))?;
        let now = Instant::now();
        if let Some(l) = lease.as_ref()
            && l.holder != caller
            && l.until > now
        {
            let left = l.until.saturating_duration_since(now).as_secs();
            return Err(DesktopError::new(
                ErrorKind::InputBusy,
                format!("{} holds the input lease (for up to {left} s more, or until released)", l.holder),
            ));
        }
        *lease = Some(Lease { holder: caller.to_string(), until: now + LEASE });
        self.publish(&lease);
        Ok(())
    }

    /// Takes or renews the lease for the person `holder` when that needs no wait: from nobody,
    /// from itself or from an expired holder (`Some(true)`), never from another person
    /// (`Some(false)`); `None` when a bot or API caller holds it.
    fn person_lease_at_once(&self, holder: &str) -> Option<bool> {
        let now = Instant::now();
        let Ok(mut lease) = self.inner.lease.lock() else { return Some(false) };
        match lease.as_ref() {
            Some(l) if l.holder != holder && l.until > now && is_person(&l.holder) => Some(false),
            Some(l) if l.holder != holder && l.until > now => None,
            _ => {
                *lease = Some(Lease { holder: holder.to_string(), until: now + LEASE });
                self.publish(&lease);
                Some(true)
            }
        }
    }

    /// Takes the lease for the person `holder` from a bot or API caller, once its running call
    /// on the display (if any) has ended.
    fn take_person_lease(&self, holder: &str) -> bool {
        let Ok(_screen) = self.inner.screen.lock() else { return false };
        let Ok(mut lease) = self.inner.lease.lock() else { return false };
        let now = Instant::now();
        if lease.as_ref().is_some_and(|l| l.holder != holder && l.until > now && is_person(&l.holder)) {
            return false;
        }
        *lease = Some(Lease { holder: holder.to_string(), until: now + LEASE });
        self.publish(&lease);
        true
    }

    /// What the Computer's record shows of the desktop: `{"display", "width", "height", "state"}`.
    /// The size is the last one seen (the connection is busy during a call).
    pub fn brief(&self) -> Value {
        let s = self.status();
        let mut known = self.inner.size.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(w), Some(h)) = (s["width"].as_u64(), s["height"].as_u64()) {
            *known = Some((w, h));
        }
        let (w, h) = known.map_or((Value::Null, Value::Null), |(w, h)| (json!(w), json!(h)));
        json!({"display": s["display"], "width": w, "height": h, "state": s["state"]})
    }

    /// The display's number, size and state, and the lease.
    pub fn status(&self) -> Value {
        let d = &self.inner.display;
        let (state, why) = d.state();
        let screen = self.inner.screen.try_lock().ok();
        let size = screen.as_ref().and_then(|g| g.as_ref().map(|s| (s.width, s.height, s.capture_path())));
        let lease = self.inner.lease.lock().ok().and_then(|l| {
            l.as_ref().filter(|l| l.until > Instant::now()).map(|l| {
                json!({"holder": l.holder, "expiresInMs": l.until.saturating_duration_since(Instant::now()).as_millis() as u64})
            })
        });
        json!({
            "display": format!(":{}", d.number),
            "width": size.map(|s| s.0),
            "height": size.map(|s| s.1),
            "state": state.as_str(),
            "capture": size.map(|s| s.2),
            "problem": why,
            "stream": self.inner.scope == Scope::Full,
            "lease": lease,
        })
    }
}

fn check_region(screen: &Screen, g: computerd_proto::desktop::Region) -> Result<(), DesktopError> {
    if g.x.saturating_add(g.width) > u32::from(screen.width) || g.y.saturating_add(g.height) > u32::from(screen.height)
    {
        return Err(DesktopError::invalid(format!(
            "the region is outside the {}x{} screen",
            screen.width, screen.height
        )));
    }
    Ok(())
}

/// Captures and encodes; answers the JSON (width, height, format, media type) and the bytes.
fn shoot(screen: &mut Screen, req: &ScreenshotRequest) -> Result<(Value, Vec<u8>), DesktopError> {
    if let Some(g) = req.region {
        check_region(screen, g)?;
    }
    let picture = screen.capture(req.region).map_err(DesktopError::x)?;
    let (width, height, bytes) = encode(picture, req)?;
    let json = json!({"width": width, "height": height, "format": req.format, "mimeType": req.format.mime(), "size": bytes.len()});
    Ok((json, bytes))
}

/// Scales (when asked) and encodes a picture.
pub fn encode(picture: Picture, req: &ScreenshotRequest) -> Result<(u32, u32, Vec<u8>), DesktopError> {
    let Picture { width, height, rgb } = picture;
    let mut img = image::RgbImage::from_raw(width, height, rgb).ok_or_else(|| DesktopError::x("a short picture"))?;
    if let Some(s) = req.scale.filter(|s| *s < 1.0) {
        let w = ((f64::from(width) * s).round() as u32).max(1);
        let h = ((f64::from(height) * s).round() as u32).max(1);
        img = image::imageops::resize(&img, w, h, image::imageops::FilterType::Triangle);
    }
    let (w, h) = img.dimensions();
    let mut out = Vec::with_capacity((w * h) as usize / 4);
    let rgb8 = image::ExtendedColorType::Rgb8;
    let done = match req.format {
        ImageFormat::Png => image::codecs::png::PngEncoder::new_with_quality(
            &mut out,
            image::codecs::png::CompressionType::Fast,
            image::codecs::png::FilterType::Adaptive,
        )
        .write_image(img.as_raw(), w, h, rgb8),
        ImageFormat::Webp => {
            image::codecs::webp::WebPEncoder::new_lossless(&mut out).write_image(img.as_raw(), w, h, rgb8)
        }
        ImageFormat::Jpeg => {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, req.quality.unwrap_or(JPEG_QUALITY))
                .write_image(img.as_raw(), w, h, rgb8)
        }
    };
    done.map_err(|e| DesktopError::x(format!("cannot encode the screenshot: {e}")))?;
    Ok((w, h, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_each_format_and_scales() {
        let (w, h) = (40u32, 20u32);
        let mut rgb = Vec::new();
        for y in 0..h {
            for x in 0..w {
                rgb.extend_from_slice(&[(x * 6) as u8, (y * 12) as u8, 200]);
            }
        }
        let pic = || Picture { width: w, height: h, rgb: rgb.clone() };
        for format in [ImageFormat::Png, ImageFormat::Webp] {
            let req = ScreenshotRequest { format, ..Default::default() };
            let (ew, eh, bytes) = encode(pic(), &req).expect("encode");
            assert_eq!((ew, eh), (w, h));
            let back = image::load_from_memory(&bytes).expect("decode").to_rgb8();
            assert_eq!(back.as_raw(), &rgb, "{format:?} is lossless");
        }
        let req = ScreenshotRequest { format: ImageFormat::Jpeg, quality: Some(90), scale: Some(0.5), region: None };
        let (ew, eh, bytes) = encode(pic(), &req).expect("encode");
        assert_eq!((ew, eh), (20, 10));
        assert_eq!(&bytes[..2], &[0xff, 0xd8], "a JPEG");
    }
}
