//! The tickets and cookies of people's desktop streams, kept in memory on the node holding the
//! Computer's link (the node that minted them, and to which every later request of the stream
//! is routed). Only their SHA-256 is kept.
//!
//! - A **ticket** is single-use and valid [`TICKET_TTL`], bound to the Computer and to the
//!   caller who asked (by token id, re-checked at the stream's open) and the mode.
//! - Redeemed, it becomes a **cookie** for that one stream: it loads noVNC's page and assets for
//!   [`COOKIE_TTL`], and opens the WebSocket once; after that, it opens nothing more.
//!
//! Both are bearer capabilities: never logged (the node logs paths, not queries or headers).
//! At most [`MAX_ENTRIES`] of each are held; expired ones are dropped as new ones come.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use sha2::Digest;

/// How long a ticket can be redeemed.
pub const TICKET_TTL: Duration = Duration::from_secs(60);
/// How long a cookie loads the page and may open its stream.
pub const COOKIE_TTL: Duration = Duration::from_secs(600);
/// At most this many tickets, and as many cookies, on a node.
pub const MAX_ENTRIES: usize = 4096;

/// A stream's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Watch only: no input passes.
    View,
    /// Watch and use, holding the input lease.
    Control,
}

/// What a ticket or cookie grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The Computer.
    pub computer: String,
    /// The mode.
    pub mode: Mode,
    /// The token of the caller who asked (re-checked at the open).
    pub token_id: String,
    /// The person, as the input lease names them.
    pub holder: String,
}

struct Entry {
    grant: Grant,
    until: Instant,
}

#[derive(Default)]
struct Inner {
    tickets: HashMap<[u8; 32], Entry>,
    cookies: HashMap<[u8; 32], Entry>,
}

/// The tickets and cookies of this node.
#[derive(Default)]
pub struct Streams {
    inner: Mutex<Inner>,
}

fn digest(secret: &str) -> [u8; 32] {
    sha2::Sha256::digest(secret.as_bytes()).into()
}

fn secret() -> String {
    let mut b = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
    hex::encode(b)
}

fn room(map: &mut HashMap<[u8; 32], Entry>, now: Instant) -> bool {
    if map.len() >= MAX_ENTRIES {
        map.retain(|_, e| e.until > now);
    }
    map.len() < MAX_ENTRIES
}

impl Streams {
    /// A new ticket for `grant` (`None`: too many are outstanding).
    pub fn mint(&self, grant: Grant) -> Option<String> {
        let now = Instant::now();
        let mut g = self.inner.lock().ok()?;
        if !room(&mut g.tickets, now) {
            return None;
        }
        let t = secret();
        g.tickets.insert(digest(&t), Entry { grant, until: now + TICKET_TTL });
        Some(t)
    }

    /// Redeems a ticket of `computer` once: answers the stream's cookie.
    pub fn redeem(&self, computer: &str, ticket: &str) -> Option<String> {
        let now = Instant::now();
        let mut g = self.inner.lock().ok()?;
        let e = g.tickets.remove(&digest(ticket))?;
        if e.until <= now || e.grant.computer != computer || !room(&mut g.cookies, now) {
            return None;
        }
        let c = secret();
        g.cookies.insert(digest(&c), Entry { grant: e.grant, until: now + COOKIE_TTL });
        Some(c)
    }

    /// Whether `cookie` may still load the page of `computer`'s stream.
    pub fn valid(&self, computer: &str, cookie: &str) -> bool {
        let now = Instant::now();
        self.inner.lock().is_ok_and(|g| {
            g.cookies.get(&digest(cookie)).is_some_and(|e| e.until > now && e.grant.computer == computer)
        })
    }

    /// Opens the cookie's one stream: answers its grant, once.
    pub fn open(&self, computer: &str, cookie: &str) -> Option<Grant> {
        let now = Instant::now();
        let mut g = self.inner.lock().ok()?;
        let e = g.cookies.remove(&digest(cookie))?;
        (e.until > now && e.grant.computer == computer).then_some(e.grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(c: &str) -> Grant {
        Grant { computer: c.into(), mode: Mode::View, token_id: "tok_1".into(), holder: "person:member:m".into() }
    }

    #[test]
    fn a_ticket_is_redeemed_once_for_its_computer_and_a_cookie_opens_one_stream() {
        let s = Streams::default();
        let t = s.mint(grant("cmp_a")).expect("ticket");
        assert_eq!(s.redeem("cmp_b", &t), None, "another computer's ticket");
        let t = s.mint(grant("cmp_a")).expect("ticket");
        let c = s.redeem("cmp_a", &t).expect("cookie");
        assert_eq!(s.redeem("cmp_a", &t), None, "a second use fails");
        assert!(s.valid("cmp_a", &c));
        assert!(!s.valid("cmp_b", &c));
        assert!(!s.valid("cmp_a", "guess"));
        assert_eq!(s.open("cmp_a", &c), Some(grant("cmp_a")));
        assert_eq!(s.open("cmp_a", &c), None, "one stream");
        assert!(!s.valid("cmp_a", &c));
    }
}
