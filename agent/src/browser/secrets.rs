//! Vault secrets typed by `fill_secret` (issue 41, item 2): what a session remembers of them,
//! and the masking that keeps their values out of every answer the caller (a model) reads.
//!
//! - **The fill.** The node opens the secret and sends its value in the op's `fill`; the agent
//!   types it only into a field of a page whose origin, and whose field's own document's origin,
//!   are among the secret's origins, and only into a field of the secret's kind (see
//!   `page::fill_secret`). The answer names the secret, never its value.
//! - **Remembered.** Each session keeps the secrets filled in it (all its tabs): name, value (a
//!   [`SecretText`], zeroed when dropped) and the element filled (its frame, document and backend
//!   node); at most [`MAX_FILLED`], the oldest dropped first; all dropped when the session closes.
//! - **Masked.** Every answer of such a session (and every error message) has each occurrence of
//!   a filled value in any of its strings replaced by `[secret "<name>"]` ([`Masks`]): snapshots,
//!   URLs and titles, dialog messages, downloads, the requests of an action's evidence. The value
//!   is looked for as typed, percent-encoded (as a URL or a form's query carries it) and ASCII
//!   case aside (a page may show it upper-cased). In a snapshot, a filled element's value reads
//!   `[filled from secret "<name>"]`.
//! - **Screenshots** are painted over where a filled value shows: see `page::secret_rects`.
//!
//! Not covered: a value the page transformed otherwise (split across elements, reversed, partly
//! shown, encoded in another way), and a value cut by a length limit of an answer before it was
//! masked (a snapshot masks names and values before cutting them; other cut strings, such as the
//! 60 characters of a cover's name in a click's error, may end with the value's first
//! characters). A takeover session's window on the desktop (its stream, the desktop's own
//! screenshots) shows the page as it is: only the browser tools' answers are masked.

use std::collections::VecDeque;

use computerd_proto::browser::SecretText;
use serde_json::Value;

/// A session keeps at most this many filled secrets (the oldest is dropped first).
pub const MAX_FILLED: usize = 32;

/// One secret filled into an element.
pub struct FilledSecret {
    /// The secret's name in the vault.
    pub name: String,
    /// Its value as typed.
    pub value: SecretText,
    /// The frame of the element (the main frame's id for the page's own elements).
    pub frame: String,
    /// That frame's document (loader id) when it was filled.
    pub loader: String,
    /// The element (its backend node id, in that frame's process).
    pub backend: i64,
}

/// The secrets filled in one browser session.
#[derive(Default)]
pub struct Filled {
    kept: std::sync::Mutex<VecDeque<FilledSecret>>,
}

impl Filled {
    fn kept(&self) -> std::sync::MutexGuard<'_, VecDeque<FilledSecret>> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers a fill (before its value is typed: a fill that fails midway may have left the
    /// value in the page). The same secret filled again into the same element replaces its
    /// record; past [`MAX_FILLED`] the oldest is dropped.
    pub fn remember(&self, f: FilledSecret) {
        let mut kept = self.kept();
        kept.retain(|k| !(k.name == f.name && k.frame == f.frame && k.loader == f.loader && k.backend == f.backend));
        kept.push_back(f);
        while kept.len() > MAX_FILLED {
            kept.pop_front();
        }
    }

    /// Whether nothing was filled in the session (or all was forgotten).
    pub fn is_empty(&self) -> bool {
        self.kept().is_empty()
    }

    /// How many fills are kept.
    pub fn len(&self) -> usize {
        self.kept().len()
    }

    /// Forgets every fill (the session closes): their values are zeroed.
    pub fn clear(&self) {
        self.kept().clear();
    }

    /// The secret filled into the element `backend` of `frame`'s document `loader`, if one was
    /// (the latest).
    pub fn filled_at(&self, frame: &str, loader: &str, backend: i64) -> Option<String> {
        self.kept()
            .iter()
            .rev()
            .find(|k| k.backend == backend && k.frame == frame && k.loader == loader)
            .map(|k| k.name.clone())
    }

    /// The masks of the values filled so far.
    pub fn masks(&self) -> Masks {
        let kept = self.kept();
        let mut needles: Vec<(SecretText, String)> = Vec::new();
        // The latest fill of a value names it.
        for k in kept.iter().rev() {
            let shown = format!("[secret \"{}\"]", k.name);
            for form in forms(k.value.expose()) {
                let low = SecretText::new(form.expose().to_ascii_lowercase());
                if !low.expose().is_empty() && !needles.iter().any(|(n, _)| n.expose() == low.expose()) {
                    needles.push((low, shown.clone()));
                }
            }
        }
        // The longest first: a value that holds another is masked whole.
        needles.sort_by_key(|(n, _)| std::cmp::Reverse(n.expose().len()));
        Masks { needles }
    }
}

/// The forms a value is looked for in: as typed, percent-encoded as a URL's component
/// (`encodeURIComponent`) and as a form's query (`application/x-www-form-urlencoded`, a space as
/// `+`).
fn forms(value: &str) -> Vec<SecretText> {
    let mut out = vec![SecretText::new(value.to_string())];
    for form in [percent(value, false), percent(value, true)] {
        if !out.iter().any(|o| o.expose() == form.expose()) {
            out.push(form);
        }
    }
    out
}

/// `value` percent-encoded: UTF-8 bytes, unreserved ones kept (`encodeURIComponent`'s set, or
/// with `form` the URL standard's form set, a space as `+`).
fn percent(value: &str, form: bool) -> SecretText {
    let mut s = String::with_capacity(value.len() * 3);
    for &b in value.as_bytes() {
        let keep = b.is_ascii_alphanumeric() || if form { b"*-._".contains(&b) } else { b"-_.!~*'()".contains(&b) };
        if keep {
            s.push(b as char);
        } else if form && b == b' ' {
            s.push('+');
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    SecretText::new(s)
}

/// What replaces filled values in an answer: each needle (a value's form, ASCII lower-case) and
/// its replacement, the longest needle first.
pub struct Masks {
    needles: Vec<(SecretText, String)>,
}

impl Masks {
    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// What is looked for: each filled value in each of its forms, ASCII lower-cased (for
    /// painting them over in a screenshot).
    pub fn needles(&self) -> Vec<&str> {
        self.needles.iter().map(|(n, _)| n.expose()).collect()
    }

    /// `s` with each filled value replaced (one pass, left to right, the longest value first at
    /// each place: a replacement is never masked again); `None` when it holds none.
    pub fn text(&self, s: &str) -> Option<String> {
        if self.needles.is_empty() || s.is_empty() {
            return None;
        }
        let low = s.to_ascii_lowercase();
        if !self.needles.iter().any(|(n, _)| low.contains(n.expose())) {
            return None;
        }
        // ASCII lower-casing keeps every byte's place, and a needle (valid UTF-8) starts and ends
        // on character boundaries of `s` wherever its bytes match.
        let (hay, src) = (low.as_bytes(), s.as_bytes());
        let mut out = Vec::with_capacity(s.len());
        let mut i = 0;
        while i < hay.len() {
            match self.needles.iter().find(|(n, _)| hay[i..].starts_with(n.expose().as_bytes())) {
                Some((n, shown)) => {
                    out.extend_from_slice(shown.as_bytes());
                    i += n.expose().len();
                }
                None => {
                    out.push(src[i]);
                    i += 1;
                }
            }
        }
        Some(String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Masks every string of `v` (object keys too), in place.
    pub fn json(&self, v: &mut Value) {
        if self.needles.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Some(m) = self.text(s) {
                    *s = m;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.json(x)),
            Value::Object(o) => {
                if o.keys().any(|k| self.text(k).is_some()) {
                    let old = std::mem::take(o);
                    for (k, x) in old {
                        o.insert(self.text(&k).unwrap_or(k), x);
                    }
                }
                o.values_mut().for_each(|x| self.json(x));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fill(name: &str, value: &str, backend: i64) -> FilledSecret {
        FilledSecret {
            name: name.into(),
            value: SecretText::new(value.into()),
            frame: "F".into(),
            loader: "L".into(),
            backend,
        }
    }

    #[test]
    fn every_string_of_an_answer_is_masked() {
        let f = Filled::default();
        assert!(f.masks().is_empty());
        f.remember(fill("site-user", "alice@example.test", 7));
        f.remember(fill("site-password", "hunter2 pass", 8));
        let m = f.masks();
        let mut answer = json!({
            "title": "Welcome ALICE@EXAMPLE.TEST",
            "url": "http://s/welcome?user=alice%40example.test&p=hunter2+pass",
            "other": "http://s/x?p=hunter2%20pass",
            "text": "- textbox \"Account\": \"alice@example.test\"\n- text \"hunter2 pass\"",
            "requests": [{"url": "http://s/alice@example.test", "n": 3}],
            "alice@example.test": true,
        });
        m.json(&mut answer);
        let s = answer.to_string();
        for leak in ["alice", "ALICE", "hunter2", "%40example"] {
            assert!(!s.contains(leak), "{leak} in {s}");
        }
        assert_eq!(answer["title"], "Welcome [secret \"site-user\"]");
        assert_eq!(answer["url"], "http://s/welcome?user=[secret \"site-user\"]&p=[secret \"site-password\"]");
        assert_eq!(answer["other"], "http://s/x?p=[secret \"site-password\"]");
        assert_eq!(answer["requests"][0]["n"], 3);
        assert_eq!(answer["[secret \"site-user\"]"], true);
        assert_eq!(m.text("nothing here"), None);
        // Multi-byte text around a value keeps its characters.
        assert_eq!(m.text("é alice@example.test ü").as_deref(), Some("é [secret \"site-user\"] ü"));
    }

    #[test]
    fn a_replacement_is_not_masked_again_and_the_longest_value_wins() {
        let f = Filled::default();
        f.remember(fill("a", "secret", 1));
        f.remember(fill("b", "secret-longer", 2));
        let m = f.masks();
        assert_eq!(m.text("x secret-longer y secret").as_deref(), Some("x [secret \"b\"] y [secret \"a\"]"));
    }

    #[test]
    fn at_most_32_are_kept_and_a_refill_replaces_its_record() {
        let f = Filled::default();
        for n in 0..40 {
            f.remember(fill(&format!("s{n}"), &format!("value-{n}"), n));
        }
        assert_eq!(f.len(), MAX_FILLED);
        assert_eq!(f.filled_at("F", "L", 0), None, "the oldest went first");
        assert_eq!(f.filled_at("F", "L", 39).as_deref(), Some("s39"));
        assert_eq!(f.filled_at("other", "L", 39), None);
        f.remember(fill("s39", "value-39", 39));
        assert_eq!(f.len(), MAX_FILLED);
        assert!(f.masks().text("value-7").is_none(), "dropped values are no longer masked");
        assert!(f.masks().text("value-8").is_some(), "kept values are");
        f.clear();
        assert!(f.is_empty());
    }

    #[test]
    fn encodings() {
        assert_eq!(percent("a b@c+", false).expose(), "a%20b%40c%2B");
        assert_eq!(percent("a b@c+", true).expose(), "a+b%40c%2B");
        assert_eq!(forms("plain").len(), 1);
    }
}
