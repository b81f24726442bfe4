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

    /// The source a request counts against: the client's address, or its /64 for IPv6 (one
    /// host is routinely given a whole /64, so counting addresses would give it 2^64 budgets).
    pub fn source_of(&self, req: &Request) -> Option<IpAddr> {
        let peer = crate::edge::peer_of(req)?.ip();
        if !self.trusted.contains(&peer) {
            return Some(source_key(peer));
        }
        let forwarded = req.headers().get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
        let hops: Vec<IpAddr> = forwarded.flat_map(|v| v.split(',')).filter_map(|h| h.trim().parse().ok()).collect();
        Some(source_key(hops.into_iter().rev().find(|ip| !self.trusted.contains(ip)).unwrap_or(peer)))
    }
}

/// The key of a source, as the cluster service's enrolment limit counts it too.
pub use computerd_raft::service::source_key;

#[cfg(test)]
mod tests {
    use super::*;

    fn from(peer: &str) -> Request {
        let mut req = Request::new(axum::body::Body::empty());
        let addr: std::net::SocketAddr = peer.parse().expect("address");
        req.extensions_mut().insert(axum::extract::ConnectInfo(addr));
        req
    }

    /// Issue 36, item 12: the addresses of one IPv6 /64 share one budget of unauthenticated
    /// calls; another /64, and IPv4 addresses, have their own.
    #[test]
    fn i36_12_ipv6_sources_count_per_64() {
        let l = Limits::new(2, 0, Vec::new());
        let by_source = l.by_source.as_ref().expect("a per-source limit");
        let allowed = |peer: &str| l.source_of(&from(peer)).is_some_and(|k| by_source.check_key(&k).is_ok());
        assert!(allowed("[2001:db8:1:2::1]:40000"));
        assert!(allowed("[2001:db8:1:2::2]:40000"));
        // The third call from the same /64, from yet another address, is over the budget.
        assert!(!allowed("[2001:db8:1:2:ffff:1:2:3]:40000"), "one /64 counts as one source");
        assert!(allowed("[2001:db8:1:3::1]:40000"), "another /64 has its own budget");
        assert!(allowed("192.0.2.1:1") && allowed("192.0.2.2:1"), "IPv4 counts per address");
        // An IPv4-mapped address counts as its IPv4 address.
        assert!(allowed("[::ffff:192.0.2.1]:1"));
        assert!(!allowed("192.0.2.1:1"), "a mapped address shares its IPv4 address's budget");
    }

    /// Behind a trusted proxy, the client named in `X-Forwarded-For` counts per /64 too.
    #[test]
    fn i36_12_forwarded_ipv6_sources_count_per_64() {
        let proxy: IpAddr = "10.0.0.1".parse().expect("ip");
        let l = Limits::new(1, 0, vec![proxy]);
        let mut req = from("10.0.0.1:1");
        req.headers_mut().insert("x-forwarded-for", "2001:db8::7, 10.0.0.1".parse().expect("header"));
        assert_eq!(l.source_of(&req), Some("2001:db8::".parse().expect("ip")));
    }
}
