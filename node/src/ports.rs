//! Public port addresses: `<port>-<label>.<public domain>`, where the label (128 random bits,
//! hex) is the bearer capability that lets anyone with the address reach the port. The store
//! keeps only its SHA-256; the label is shown once, in the answer to `PUT …/ports/:port`, and is
//! never logged (nothing logs a request's `Host`).
//!
//! In production the public domain is a wildcard name served by the load balancer (which holds
//! its certificate), so addresses are `https://`. A domain that is `localhost` (or under it) is
//! plain `http://` and may carry the port of the node or balancer (`localhost:8080`): browsers
//! and curl resolve `*.localhost` to this machine.

use rand::RngCore;

/// Where public port addresses live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicDomain {
    /// The domain, lowercase, without a port.
    host: String,
    /// The port in addresses, if not the scheme's.
    port: Option<u16>,
    /// `https`, or `http` for `localhost`.
    scheme: &'static str,
}

impl PublicDomain {
    /// Parses `example.com`, `computers.example.com:8443` or `localhost:8080`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("--public-domain {s:?} is not a domain name with an optional port");
        let (host, port) = match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p.parse::<u16>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let label_ok =
            |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if host.is_empty() || host.len() > 200 || !host.split('.').all(label_ok) {
            return Err(bad());
        }
        let scheme = if host == "localhost" || host.ends_with(".localhost") { "http" } else { "https" };
        Ok(Self { host, port, scheme })
    }

    /// `https`, or `http` under `localhost`.
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The address of `port` with `label`.
    pub fn url(&self, port: u16, label: &str) -> String {
        match self.port {
            Some(p) => format!("{}://{port}-{label}.{}:{p}/", self.scheme, self.host),
            None => format!("{}://{port}-{label}.{}/", self.scheme, self.host),
        }
    }

    /// The port and label a request's `Host` names, when it is a public port address here
    /// (any port in the header is ignored: the balancer's may differ from ours).
    pub fn match_host(&self, host: &str) -> Option<(u16, String)> {
        let name = match host.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let first = name.strip_suffix(&self.host)?.strip_suffix('.')?;
        let (port, label) = first.split_once('-')?;
        if !is_label(label) || port.starts_with('0') {
            return None;
        }
        let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
        Some((port, label.to_string()))
    }
}

/// Length of a label (hex of 16 random bytes).
pub const LABEL_LEN: usize = 32;

/// A new label.
pub fn new_label() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

fn is_label(s: &str) -> bool {
    s.len() == LABEL_LEN && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_made_and_matched() {
        let label = new_label();
        assert_eq!(label.len(), LABEL_LEN);
        assert_ne!(label, new_label());
        let d = PublicDomain::parse("Computers.Example.com").expect("domain");
        assert_eq!(d.url(8000, &label), format!("https://8000-{label}.computers.example.com/"));
        assert_eq!(d.match_host(&format!("8000-{label}.computers.example.com")), Some((8000, label.clone())));
        assert_eq!(d.match_host(&format!("8000-{label}.COMPUTERS.example.com:443")), Some((8000, label.clone())));
        let dev = PublicDomain::parse("localhost:18080").expect("dev");
        assert_eq!(dev.url(3000, &label), format!("http://3000-{label}.localhost:18080/"));
        assert_eq!(dev.match_host(&format!("3000-{label}.localhost:9999")), Some((3000, label.clone())));
        for bad in [
            "computers.example.com".to_string(),
            "example.com".into(),
            format!("8000-{label}.other.com"),
            format!("8000-{label}.xcomputers.example.com"),
            format!("0-{label}.computers.example.com"),
            format!("08000-{label}.computers.example.com"),
            format!("70000-{label}.computers.example.com"),
            format!("8000-{}.computers.example.com", &label[1..]),
            format!("8000-{}.computers.example.com", label.to_uppercase().replace(|c: char| c.is_ascii_digit(), "G")),
            format!("a.8000-{label}.computers.example.com"),
        ] {
            assert_eq!(d.match_host(&bad), None, "{bad}");
        }
        for bad in ["", "bad domain", "x:port", "a..b", ":80"] {
            assert!(PublicDomain::parse(bad).is_err(), "{bad}");
        }
    }
}

/// Idle HTTP/1.1 connections to exposed ports (each over its own tunnel), kept by the node that
/// made them for the next request to the same address: a request then costs no new tunnel.
/// Every request on a kept connection is still checked first (the address and the exposer's
/// rights) at a current read (a read barrier), as the link's node checks a new connection's, so
/// a node whose replica lags does not serve an address that ended; an address that ends leaves
/// its connections to expire unused.
#[derive(Default)]
pub struct PortPool {
    idle: std::sync::Mutex<Idle>,
}

#[derive(Default)]
struct Idle {
    by_address: std::collections::HashMap<String, Vec<(Sender, std::time::Instant)>>,
    /// How many connections `by_address` holds in all.
    total: usize,
}

/// A connection's sending half.
pub type Sender = hyper::client::conn::http1::SendRequest<axum::body::Body>;

/// How long a connection may wait unused.
const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
/// Idle connections kept per address, and in all.
const POOL_PER_ADDRESS: usize = 8;
const POOL_TOTAL: usize = 1024;

impl PortPool {
    /// An idle, open connection to the address with this label hash, if one is ready.
    pub fn take(&self, label_hash: &str) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let idle = &mut *idle;
        let list = idle.by_address.get_mut(label_hash)?;
        let (before, now) = (list.len(), std::time::Instant::now());
        list.retain(|(s, at)| !s.is_closed() && now.duration_since(*at) < POOL_IDLE);
        let found = list.iter().position(|(s, _)| s.is_ready()).map(|i| list.swap_remove(i).0);
        idle.total -= before - list.len();
        if list.is_empty() {
            idle.by_address.remove(label_hash);
        }
        found
    }

    /// Keeps a connection whose answer is under way: it is taken again once that answer was
    /// read to its end (it is ready then).
    pub fn put(&self, label_hash: &str, sender: Sender) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.total >= POOL_TOTAL {
            return;
        }
        let list = idle.by_address.entry(label_hash.to_string()).or_default();
        if list.len() < POOL_PER_ADDRESS {
            list.push((sender, std::time::Instant::now()));
            idle.total += 1;
        }
    }
}
