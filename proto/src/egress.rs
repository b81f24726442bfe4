//! A Computer's egress policy: where its sandbox may connect, by name (matched on TLS SNI and
//! HTTP `Host`) and by IP range.
//!
//! `{"default": "allow" | "deny", "allow": [...], "deny": [...]}`. An entry is a host name
//! (`pypi.org`), a wildcard (`*.example.com`: every name under `example.com`, not the name
//! itself), an IP address (`203.0.113.7`) or a range (`203.0.113.0/24`). Names are compared
//! without case and without a trailing dot.
//!
//! A connection is decided in this order ([`Compiled::decide`]): a `deny` range holding the
//! address it was sent to, or a `deny` name matching the name it carries, refuses it; then an
//! `allow` range or an `allow` name lets it through; else the default. A connection that
//! carries no name (another protocol than TLS or HTTP) is decided by its address alone.

use std::net::IpAddr;

use serde::Deserialize;
use serde::Serialize;

/// The most entries each of `allow` and `deny` may hold.
pub const MAX_ENTRIES: usize = 128;

/// An IP range (an address alone is a range of one: `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// The range's first address.
    pub addr: IpAddr,
    /// Its prefix length.
    pub prefix: u8,
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    /// Parses `address/prefix` (the address must be the range's first, no host bits set).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = s.split_once('/').ok_or_else(|| format!("{s:?} is not a CIDR range (address/prefix)"))?;
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?}: {a:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{s:?}: the prefix must be a number from 0 to {max}"))?;
        let c = Cidr { addr, prefix };
        if c.first() != addr {
            return Err(format!("{s:?} has host bits set: did you mean {}?", Cidr { addr: c.first(), prefix }));
        }
        Ok(c)
    }

    fn bits(addr: IpAddr) -> (u128, u8) {
        match addr {
            IpAddr::V4(a) => (u32::from(a) as u128, 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    fn mask(&self) -> u128 {
        let (_, width) = Cidr::bits(self.addr);
        let all = if width == 32 { u32::MAX as u128 } else { u128::MAX };
        if self.prefix == 0 { 0 } else { all & !(all >> self.prefix) }
    }

    fn first(&self) -> IpAddr {
        let (v, _) = Cidr::bits(self.addr);
        match self.addr {
            IpAddr::V4(_) => IpAddr::V4(((v & self.mask()) as u32).into()),
            IpAddr::V6(_) => IpAddr::V6((v & self.mask()).into()),
        }
    }

    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && (Cidr::bits(ip).0 & self.mask()) == Cidr::bits(self.addr).0
    }

    /// Whether the whole of `other` is in this range.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// Whether it is an IPv4 range.
    pub fn is_v4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

/// What a connection that no entry names gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DefaultAction {
    /// It goes through.
    #[default]
    Allow,
    /// It is refused.
    Deny,
}

/// A Computer's egress policy as a member sets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// What a connection that no entry names gets.
    pub default: DefaultAction,
    /// Names, wildcards, addresses and ranges let through.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Names, wildcards, addresses and ranges refused (before `allow`).
    #[serde(default)]
    pub deny: Vec<String>,
}

/// One entry of a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Every name ending in this suffix (`.example.com`), from `*.example.com`.
    Suffix(String),
    /// An address range (an address alone is a range of one).
    Range(Cidr),
}

impl Target {
    /// Parses an entry (user input: every problem is named).
    pub fn parse(s: &str) -> Result<Target, String> {
        let t = s.trim();
        if t.contains('/') {
            return Cidr::parse(t).map(Target::Range);
        }
        if let Ok(ip) = t.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            return Ok(Target::Range(Cidr { addr: ip, prefix: if ip.is_ipv4() { 32 } else { 128 } }));
        }
        let lower = t.trim_end_matches('.').to_ascii_lowercase();
        let (wild, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        check_name(name)
            .map_err(|why| format!("{s:?} is not a host name, *.wildcard, IP address or CIDR range: {why}"))?;
        Ok(if wild { Target::Suffix(format!(".{name}")) } else { Target::Name(name.to_string()) })
    }

    fn matches_name(&self, name: &str) -> bool {
        match self {
            Target::Name(n) => n == name,
            Target::Suffix(s) => name.len() > s.len() && name.ends_with(s.as_str()),
            Target::Range(_) => false,
        }
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        matches!(self, Target::Range(c) if c.contains(ip))
    }
}

/// Checks a host name: dot-separated labels of ASCII letters, digits and hyphens, each 1 to
/// 63 long and not starting or ending with a hyphen, 253 at most in all.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("a name has 1 to 253 characters".into());
    }
    for label in name.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!("the label {label:?} is not 1 to 63 letters, digits or inner hyphens"));
        }
    }
    if name.rsplit('.').next().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit())) {
        return Err("a name's last label is not all digits (an address has no wildcard)".into());
    }
    Ok(())
}

/// A policy checked and ready to decide connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The default.
    pub default: DefaultAction,
    /// Let through.
    pub allow: Vec<Target>,
    /// Refused.
    pub deny: Vec<Target>,
}

/// What a connection gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Through, to the address it was sent to.
    Address,
    /// Through, to the name it carries, resolved by the gateway (never to the address the
    /// sandbox chose: a sandbox cannot send an allowed name to a host of its own choosing).
    Name,
    /// Refused.
    Deny,
}

impl EgressPolicy {
    /// Checks the policy (user input: every problem is named).
    pub fn compile(&self) -> Result<Compiled, String> {
        let list = |what: &str, v: &[String]| -> Result<Vec<Target>, String> {
            if v.len() > MAX_ENTRIES {
                return Err(format!("{what} names at most {MAX_ENTRIES} entries, not {}", v.len()));
            }
            v.iter().map(|s| Target::parse(s).map_err(|e| format!("{what}: {e}"))).collect()
        };
        Ok(Compiled { default: self.default, allow: list("allow", &self.allow)?, deny: list("deny", &self.deny)? })
    }

    /// Whether any entry is a name or wildcard (a provider that filters by address only refuses it).
    pub fn has_names(&self) -> bool {
        self.allow.iter().chain(&self.deny).any(|s| !matches!(Target::parse(s), Ok(Target::Range(_))))
    }
}

impl Compiled {
    /// Whether any entry is a name or wildcard.
    pub fn has_names(&self) -> bool {
        self.allow.iter().chain(&self.deny).any(|t| !matches!(t, Target::Range(_)))
    }

    /// The decision on a connection to `ip` from the address alone, when the name cannot change
    /// it (`None`: the name it carries decides, so the gateway reads it first).
    pub fn decide_address(&self, ip: IpAddr) -> Option<Decision> {
        if self.deny.iter().any(|t| t.matches_ip(ip)) {
            return Some(Decision::Deny);
        }
        let name_denies = self.deny.iter().any(|t| !matches!(t, Target::Range(_)));
        if name_denies {
            return None;
        }
        if self.allow.iter().any(|t| t.matches_ip(ip)) {
            return Some(Decision::Address);
        }
        if self.default == DefaultAction::Allow {
            return Some(Decision::Address);
        }
        if self.has_names() { None } else { Some(Decision::Deny) }
    }

    /// The decision on a connection to `ip` that carries `name` (SNI or `Host`, if any).
    pub fn decide(&self, ip: IpAddr, name: Option<&str>) -> Decision {
        let name = name.map(|n| n.trim_end_matches('.').to_ascii_lowercase());
        // A name that is an address literal is that address.
        let named_ip =
            name.as_deref().and_then(|n| n.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok());
        let name = name.filter(|_| named_ip.is_none());
        let ips = [Some(ip), named_ip];
        let ips = ips.iter().flatten();
        if ips.clone().any(|ip| self.deny.iter().any(|t| t.matches_ip(*ip))) {
            return Decision::Deny;
        }
        if let Some(n) = &name
            && self.deny.iter().any(|t| t.matches_name(n))
        {
            return Decision::Deny;
        }
        if self.allow.iter().any(|t| t.matches_ip(ip)) && named_ip.is_none_or(|n| n == ip) {
            return Decision::Address;
        }
        if let Some(n) = &name
            && self.allow.iter().any(|t| t.matches_name(n))
        {
            return Decision::Name;
        }
        match self.default {
            DefaultAction::Allow => Decision::Address,
            DefaultAction::Deny => Decision::Deny,
        }
    }
}

/// A connection the gateway refused. The gateway prints each as one line on its standard
/// output ([`Denied::line`]); the provider reads them back ([`Denied::from_line`]) for the
/// Computer's `EgressDenied` events.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Denied {
    /// The name it carried, else its destination address (at most [`MAX_HOST`] bytes: the
    /// name comes from the sandbox).
    pub host: String,
    /// Its destination port.
    pub port: u16,
    /// When (Unix milliseconds, the gateway's clock).
    pub at: u64,
}

/// The longest host a [`Denied`] carries (a DNS name's limit); longer ones are cut.
pub const MAX_HOST: usize = 253;

/// The `event` field of a denial's line.
const DENIED_EVENT: &str = "egress.denied";

impl Denied {
    /// A denial with its host cut to [`MAX_HOST`] bytes (on a character boundary).
    pub fn new(host: &str, port: u16, at: u64) -> Denied {
        let mut end = host.len().min(MAX_HOST);
        while !host.is_char_boundary(end) {
            end -= 1;
        }
        Denied { host: host[..end].to_string(), port, at }
    }

    /// The gateway's output line: `{"event":"egress.denied","host":…,"port":…,"at":…}`.
    pub fn line(&self) -> String {
        serde_json::json!({"event": DENIED_EVENT, "host": self.host, "port": self.port, "at": self.at}).to_string()
    }

    /// A denial read back from one output line (`None`: another line, or not one).
    pub fn from_line(line: &str) -> Option<Denied> {
        #[derive(Deserialize)]
        struct Line {
            event: String,
            host: String,
            port: u16,
            at: u64,
        }
        let l: Line = serde_json::from_str(line.trim()).ok()?;
        (l.event == DENIED_EVENT).then(|| Denied::new(&l.host, l.port, l.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(default: DefaultAction, allow: &[&str], deny: &[&str]) -> Compiled {
        EgressPolicy {
            default,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
        .compile()
        .expect("a good policy")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn entries_parse_or_are_named() {
        assert_eq!(Target::parse("PyPI.org.").expect("a name"), Target::Name("pypi.org".into()));
        assert_eq!(Target::parse("*.example.com").expect("a wildcard"), Target::Suffix(".example.com".into()));
        assert_eq!(
            Target::parse("10.1.0.0/16").expect("a range").to_owned(),
            Target::Range(Cidr::parse("10.1.0.0/16").expect("r"))
        );
        assert_eq!(
            Target::parse("203.0.113.7").expect("an ip"),
            Target::Range(Cidr::parse("203.0.113.7/32").expect("r"))
        );
        for bad in
            ["", "*", "*.", "a..b", "-a.com", "a_b.com", "10.0.0.1/40", "10.0.0.1/8", "*.10.0.0.1", "é.com", "1.2.3"]
        {
            assert!(Target::parse(bad).is_err(), "{bad:?} should be refused");
        }
        let long =
            EgressPolicy { default: DefaultAction::Deny, allow: vec!["a.com".into(); MAX_ENTRIES + 1], deny: vec![] };
        assert!(long.compile().expect_err("too many").contains("at most"));
    }

    #[test]
    fn deny_wins_then_allow_then_default() {
        let p = policy(
            DefaultAction::Deny,
            &["allowed.test", "*.example.com", "203.0.113.0/24"],
            &["bad.example.com", "203.0.113.9"],
        );
        let any = ip("198.51.100.1");
        assert_eq!(p.decide(any, Some("Allowed.Test.")), Decision::Name);
        assert_eq!(p.decide(any, Some("a.example.com")), Decision::Name);
        assert_eq!(p.decide(any, Some("example.com")), Decision::Deny, "a wildcard is not its apex");
        assert_eq!(p.decide(any, Some("bad.example.com")), Decision::Deny);
        assert_eq!(p.decide(any, Some("other.test")), Decision::Deny);
        assert_eq!(p.decide(any, None), Decision::Deny);
        assert_eq!(p.decide(ip("203.0.113.5"), None), Decision::Address);
        assert_eq!(
            p.decide(ip("203.0.113.9"), Some("allowed.test")),
            Decision::Deny,
            "a denied address whatever the name"
        );
        assert_eq!(p.decide(any, Some("203.0.113.5")), Decision::Deny, "an allowed literal sent elsewhere");
        assert_eq!(p.decide(ip("203.0.113.5"), Some("203.0.113.5")), Decision::Address);
        let open = policy(DefaultAction::Allow, &[], &["*.tracker.test"]);
        assert_eq!(open.decide(any, Some("x.tracker.test")), Decision::Deny);
        assert_eq!(open.decide(any, Some("pypi.org")), Decision::Address);
    }

    #[test]
    fn the_address_alone_decides_only_when_no_name_can_change_it() {
        let names = policy(DefaultAction::Deny, &["allowed.test", "192.0.2.0/24"], &[]);
        assert_eq!(names.decide_address(ip("192.0.2.1")), Some(Decision::Address));
        assert_eq!(names.decide_address(ip("198.51.100.1")), None);
        let ranges = policy(DefaultAction::Deny, &["192.0.2.0/24"], &[]);
        assert_eq!(ranges.decide_address(ip("198.51.100.1")), Some(Decision::Deny));
        let open = policy(DefaultAction::Allow, &[], &["198.51.100.0/24"]);
        assert_eq!(open.decide_address(ip("198.51.100.1")), Some(Decision::Deny));
        assert_eq!(open.decide_address(ip("192.0.2.1")), Some(Decision::Address));
        let open_names = policy(DefaultAction::Allow, &[], &["ads.test"]);
        assert_eq!(open_names.decide_address(ip("192.0.2.1")), None);
    }

    #[test]
    fn a_denial_goes_out_as_a_line_and_comes_back_with_its_host_bounded() {
        let d = Denied::new("other.test", 8080, 1_700_000_000_123);
        assert_eq!(Denied::from_line(&d.line()), Some(d));
        let long = format!("{}é", "a".repeat(MAX_HOST - 1));
        let cut = Denied::new(&long, 1, 2);
        assert_eq!(cut.host.len(), MAX_HOST - 1, "cut before the character that would cross the limit");
        let line =
            serde_json::json!({"event": "egress.denied", "host": "x".repeat(4000), "port": 443, "at": 1}).to_string();
        assert_eq!(Denied::from_line(&line).map(|d| d.host.len()), Some(MAX_HOST));
        for other in [
            "",
            "not json",
            r#"{"event":"egress.allowed","host":"a","port":1,"at":1}"#,
            r#"{"event":"egress.denied","host":"a","port":70000,"at":1}"#,
        ] {
            assert_eq!(Denied::from_line(other), None, "{other}");
        }
    }
}
