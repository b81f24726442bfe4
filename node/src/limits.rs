//! The edge's rate limiters (governor's GCRA, keyed): unauthenticated calls per source, calls
//! with a token per token; and who a request counts against. The middlewares that apply them are
//! in `http/limits.rs`.

use std::net::IpAddr;
use std::num::NonZeroU32;

use axum::extract::Request;
use governor::DefaultKeyedRateLimiter;
use governor::Quota;

/// The edge's limiters.
pub struct Limits {
    pub(crate) by_source: Option<DefaultKeyedRateLimiter<IpAddr>>,
    pub(crate) by_token: Option<DefaultKeyedRateLimiter<String>>,
    trusted: Vec<IpAddr>,
}

impl Limits {
    /// `per_source_per_min` unauthenticated calls per minute and source, `token_per_sec` calls
    /// per second and token (bursts of twice that); 0 turns a limit off.
    pub fn new(per_source_per_min: u32, token_per_sec: u32, trusted: Vec<IpAddr>) -> Self {
        let by_source =
            NonZeroU32::new(per_source_per_min).map(|n| DefaultKeyedRateLimiter::keyed(Quota::per_minute(n)));
        let by_token = NonZeroU32::new(token_per_sec).map(|n| {
            let burst = NonZeroU32::new(n.get().saturating_mul(2)).unwrap_or(n);
            DefaultKeyedRateLimiter::keyed(Quota::per_second(n).allow_burst(burst))
        });
        Self { by_source, by_token, trusted }
    }

    /// Forgets the keys that are back to a full allowance (bounds the limiters' memory).
    pub fn forget_idle(&self) {
        if let Some(l) = &self.by_source {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.by_token {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    /// The client a request counts against.
    pub fn source_of(&self, req: &Request) -> Option<IpAddr> {
        let peer = crate::edge::peer_of(req)?.ip();
        if !self.trusted.contains(&peer) {
            return Some(peer);
        }
        let forwarded = req.headers().get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
        let hops: Vec<IpAddr> = forwarded.flat_map(|v| v.split(',')).filter_map(|h| h.trim().parse().ok()).collect();
        Some(hops.into_iter().rev().find(|ip| !self.trusted.contains(ip)).unwrap_or(peer))
    }
}
