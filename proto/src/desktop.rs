//! The shapes of desktop calls, shared by the node (which checks a request before it leaves) and
//! the agent (which checks it again against the live screen, then acts): a screenshot, a list of
//! input actions, a lease release and a status read. They travel as JSON in
//! [`crate::agent::DesktopCall`]; the image of an answer travels as bytes beside its JSON.

use serde::Deserialize;
use serde::Serialize;

/// At most this many actions in one call.
pub const MAX_ACTIONS: usize = 64;
/// At most this many characters typed by one `type` action.
pub const MAX_TEXT: usize = 4096;
/// A `wait` lasts at most this long, and all the waits of a call together too.
pub const MAX_WAIT_MS: u32 = 10_000;
/// A click repeats at most this many times (a triple click).
pub const MAX_CLICKS: u8 = 3;
/// A scroll moves at most this many notches per axis.
pub const MAX_SCROLL: i32 = 50;

/// One desktop call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum DesktopOp {
    /// Take a screenshot.
    Screenshot(ScreenshotRequest),
    /// Send input actions in order, then (by default) take a screenshot.
    Actions(ActionsRequest),
    /// Give up the input lease the caller holds.
    Release,
    /// The display, its size and state, and who holds the input lease.
    Status,
}

/// An image format of a screenshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// PNG (lossless).
    #[default]
    Png,
    /// WebP, lossless.
    Webp,
    /// JPEG, with a quality.
    Jpeg,
}

impl ImageFormat {
    /// Its media type.
    pub fn mime(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Webp => "image/webp",
            Self::Jpeg => "image/jpeg",
        }
    }
}

/// A rectangle of the screen, in screen pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width (at least 1).
    pub width: u32,
    /// Height (at least 1).
    pub height: u32,
}

/// `POST …/desktop/screenshot`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScreenshotRequest {
    /// `png` (default), `webp` (lossless) or `jpeg`.
    #[serde(default)]
    pub format: ImageFormat,
    /// Scale the image by this factor, in (0, 1] (default 1).
    #[serde(default)]
    pub scale: Option<f64>,
    /// Only this part of the screen (default: all of it).
    #[serde(default)]
    pub region: Option<Region>,
    /// JPEG quality, 1..=100 (default 80); only with `jpeg`.
    #[serde(default)]
    pub quality: Option<u8>,
}

/// A mouse button.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Button {
    /// Button 1.
    #[default]
    Left,
    /// Button 2.
    Middle,
    /// Button 3.
    Right,
}

impl Button {
    /// The X button number.
    pub fn number(self) -> u8 {
        match self {
            Self::Left => 1,
            Self::Middle => 2,
            Self::Right => 3,
        }
    }
}

/// A point on the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// From the left edge.
    pub x: u32,
    /// From the top edge.
    pub y: u32,
}

fn one() -> u8 {
    1
}

/// One input action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Action {
    /// Move the pointer.
    Move {
        /// To this column.
        x: u32,
        /// To this row.
        y: u32,
    },
    /// Click (`count` times: 2 is a double click), where the pointer is or at `x`, `y`.
    Click {
        /// Move here first (with `y`).
        #[serde(default)]
        x: Option<u32>,
        /// Move here first (with `x`).
        #[serde(default)]
        y: Option<u32>,
        /// Default `left`.
        #[serde(default)]
        button: Button,
        /// Default 1, at most 3.
        #[serde(default = "one")]
        count: u8,
    },
    /// Press at `from`, move to `to`, release.
    Drag {
        /// Where the button goes down.
        from: Point,
        /// Where it comes up.
        to: Point,
        /// Default `left`.
        #[serde(default)]
        button: Button,
    },
    /// Scroll by notches: `dy` > 0 down, `dx` > 0 right; where the pointer is or at `x`, `y`.
    Scroll {
        /// Move here first (with `y`).
        #[serde(default)]
        x: Option<u32>,
        /// Move here first (with `x`).
        #[serde(default)]
        y: Option<u32>,
        /// Notches to the right (negative: left).
        #[serde(default)]
        dx: i32,
        /// Notches down (negative: up).
        #[serde(default)]
        dy: i32,
    },
    /// Type text (any Unicode; `\n` is Enter, `\t` is Tab).
    Type {
        /// What to type.
        text: String,
    },
    /// Press a key or a combination such as `ctrl+l`, `shift+Tab`, `Return`, `alt+F4`.
    Key {
        /// The combination.
        keys: String,
    },
    /// Wait this many milliseconds.
    Wait {
        /// At most [`MAX_WAIT_MS`].
        ms: u32,
    },
}

impl Action {
    /// Its `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Move { .. } => "move",
            Self::Click { .. } => "click",
            Self::Drag { .. } => "drag",
            Self::Scroll { .. } => "scroll",
            Self::Type { .. } => "type",
            Self::Key { .. } => "key",
            Self::Wait { .. } => "wait",
        }
    }

    /// The points it moves the pointer to.
    pub fn points(&self) -> Vec<Point> {
        let at = |x: &Option<u32>, y: &Option<u32>| match (x, y) {
            (Some(x), Some(y)) => vec![Point { x: *x, y: *y }],
            _ => vec![],
        };
        match self {
            Self::Move { x, y } => vec![Point { x: *x, y: *y }],
            Self::Click { x, y, .. } | Self::Scroll { x, y, .. } => at(x, y),
            Self::Drag { from, to, .. } => vec![*from, *to],
            _ => vec![],
        }
    }
}

/// What a screenshot in an actions call is: `true` (PNG of the whole screen), `false`, or the
/// options of a screenshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ScreenshotChoice {
    /// `true` or `false`.
    Flag(bool),
    /// A screenshot with these options.
    With(ScreenshotRequest),
}

impl Default for ScreenshotChoice {
    fn default() -> Self {
        Self::Flag(true)
    }
}

impl ScreenshotChoice {
    /// The screenshot to take after the actions, if any.
    pub fn request(&self) -> Option<ScreenshotRequest> {
        match self {
            Self::Flag(true) => Some(ScreenshotRequest::default()),
            Self::Flag(false) => None,
            Self::With(r) => Some(r.clone()),
        }
    }
}

/// `POST …/desktop/actions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionsRequest {
    /// Sent in order.
    pub actions: Vec<Action>,
    /// After the actions (default `true`).
    #[serde(default)]
    pub screenshot: ScreenshotChoice,
}

/// A request that is wrong whatever the screen.
pub fn check_screenshot(r: &ScreenshotRequest) -> Result<(), String> {
    if let Some(s) = r.scale
        && !(s > 0.0 && s <= 1.0)
    {
        return Err("scale must be in (0, 1]".into());
    }
    if let Some(q) = r.quality {
        if r.format != ImageFormat::Jpeg {
            return Err("quality is for jpeg only".into());
        }
        if !(1..=100).contains(&q) {
            return Err("quality must be in 1..=100".into());
        }
    }
    if let Some(g) = r.region
        && (g.width == 0 || g.height == 0)
    {
        return Err("a region is at least 1x1".into());
    }
    Ok(())
}

/// Checks what can be checked without the screen: counts, lengths, waits (the agent checks the
/// coordinates against the screen before it sends anything).
pub fn check_actions(r: &ActionsRequest) -> Result<(), String> {
    if r.actions.is_empty() {
        return Err("actions is empty".into());
    }
    if r.actions.len() > MAX_ACTIONS {
        return Err(format!("at most {MAX_ACTIONS} actions in one call"));
    }
    let mut waited: u64 = 0;
    for (i, a) in r.actions.iter().enumerate() {
        let bad = |why: String| Err(format!("action {i} ({}): {why}", a.kind()));
        match a {
            Action::Click { x, y, count, .. } => {
                if x.is_some() != y.is_some() {
                    return bad("give both x and y, or neither".into());
                }
                if !(1..=MAX_CLICKS).contains(count) {
                    return bad(format!("count must be in 1..={MAX_CLICKS}"));
                }
            }
            Action::Scroll { x, y, dx, dy } => {
                if x.is_some() != y.is_some() {
                    return bad("give both x and y, or neither".into());
                }
                if *dx == 0 && *dy == 0 {
                    return bad("dx or dy must not be 0".into());
                }
                if dx.abs() > MAX_SCROLL || dy.abs() > MAX_SCROLL {
                    return bad(format!("at most {MAX_SCROLL} notches per axis"));
                }
            }
            Action::Type { text } => {
                if text.is_empty() {
                    return bad("text is empty".into());
                }
                if text.chars().count() > MAX_TEXT {
                    return bad(format!("at most {MAX_TEXT} characters"));
                }
                if let Some(c) = text.chars().find(|c| c.is_control() && !matches!(c, '\n' | '\t')) {
                    return bad(format!("cannot type the control character U+{:04X}", c as u32));
                }
            }
            Action::Key { keys } => {
                if keys.trim().is_empty() || keys.len() > 64 {
                    return bad("keys must name a key, such as ctrl+l".into());
                }
            }
            Action::Wait { ms } => {
                waited += u64::from(*ms);
                if waited > u64::from(MAX_WAIT_MS) {
                    return bad(format!("the waits of a call add up to at most {MAX_WAIT_MS} ms"));
                }
            }
            Action::Move { .. } | Action::Drag { .. } => {}
        }
    }
    if let Some(s) = r.screenshot.request() {
        check_screenshot(&s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Result<ActionsRequest, String> {
        let r: ActionsRequest = serde_json::from_value(v).map_err(|e| e.to_string())?;
        check_actions(&r).map(|_| r)
    }

    #[test]
    fn actions_parse_with_defaults_and_bad_ones_are_refused() {
        let r = parse(serde_json::json!({"actions": [
            {"type": "click", "x": 3, "y": 4},
            {"type": "type", "text": "héllo wörld €\n"},
            {"type": "key", "keys": "ctrl+l"},
        ]}))
        .expect("valid");
        assert_eq!(r.actions[0], Action::Click { x: Some(3), y: Some(4), button: Button::Left, count: 1 });
        assert_eq!(r.screenshot.request(), Some(ScreenshotRequest::default()));
        let off = parse(serde_json::json!({"actions": [{"type": "wait", "ms": 1}], "screenshot": false})).expect("ok");
        assert_eq!(off.screenshot.request(), None);
        let jpeg = parse(serde_json::json!({"actions": [{"type": "wait", "ms": 1}],
            "screenshot": {"format": "jpeg", "quality": 50}}))
        .expect("ok");
        assert_eq!(jpeg.screenshot.request().map(|s| s.format), Some(ImageFormat::Jpeg));
        for bad in [
            serde_json::json!({"actions": []}),
            serde_json::json!({"actions": [{"type": "click", "x": 1}]}),
            serde_json::json!({"actions": [{"type": "click", "count": 4}]}),
            serde_json::json!({"actions": [{"type": "fly"}]}),
            serde_json::json!({"actions": [{"type": "move", "x": 1, "y": 2, "z": 3}]}),
            serde_json::json!({"actions": [{"type": "move", "x": -1, "y": 2}]}),
            serde_json::json!({"actions": [{"type": "type", "text": ""}]}),
            serde_json::json!({"actions": [{"type": "type", "text": "a\u{7}"}]}),
            serde_json::json!({"actions": [{"type": "wait", "ms": 6000}, {"type": "wait", "ms": 6000}]}),
            serde_json::json!({"actions": [{"type": "scroll"}]}),
            serde_json::json!({"actions": [{"type": "wait", "ms": 1}], "screenshot": {"scale": 2.0}}),
            serde_json::json!({"actions": [{"type": "wait", "ms": 1}], "extra": 1}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn screenshot_requests_are_checked() {
        let ok: ScreenshotRequest =
            serde_json::from_value(serde_json::json!({"format": "webp", "scale": 0.5})).expect("parse");
        assert_eq!(check_screenshot(&ok), Ok(()));
        let q: ScreenshotRequest =
            serde_json::from_value(serde_json::json!({"format": "png", "quality": 10})).expect("parse");
        assert!(check_screenshot(&q).is_err());
        let g: ScreenshotRequest =
            serde_json::from_value(serde_json::json!({"region": {"x": 0, "y": 0, "width": 0, "height": 3}}))
                .expect("parse");
        assert!(check_screenshot(&g).is_err());
        let op: DesktopOp = serde_json::from_str(r#""status""#).expect("status");
        assert_eq!(op, DesktopOp::Status);
    }
}
