//! The packet filter rules of the gateway's network namespace (which the sandbox shares), as
//! `iptables-restore --noflush` input: the chains are the gateway's own (`COMPUTERD-EGRESS` in
//! the `nat` and `filter` tables, jumped to from `OUTPUT`), refilled whole at each change in one
//! restore, so other rules of the namespace (Docker's embedded DNS in `nat`'s `DOCKER_OUTPUT`)
//! stay as they are and a change is never half applied.
//!
//! - `nat`: every TCP connection the sandbox opens goes to the proxy (`REDIRECT` to
//!   127.0.0.1:[`PROXY_PORT`]), except loopback, the proxy's own upstream connections (their
//!   sockets carry [`MARK`], which only a process with `CAP_NET_ADMIN` can set, so the sandbox
//!   cannot) and the cluster's link addresses (the agent's own connection).
//! - `filter`: loopback, marked packets, the redirected connections and the link addresses go
//!   out; other TCP is reset (none should be left: all of it was redirected); other traffic
//!   (UDP, ICMP...) goes by the policy's ranges: a `deny` range refuses, an `allow` range lets
//!   through, then the default. Names cannot be matched here (a datagram carries no SNI). With no
//!   policy yet, everything but loopback, the mark and the link is refused.
//!
//! Packets are judged one by one, not by their connection's first packet: only replies
//! (`--ctdir REPLY`, to connections made to the sandbox) pass by their connection's state, so a
//! new policy that refuses a range stops a UDP flow already under way at its next datagram. A
//! redirected connection's later packets pass because `filter` sees them after the `REDIRECT`
//! (to 127.0.0.1:[`PROXY_PORT`]) but still with the interface of their original destination,
//! so `-o lo` does not hold them: they have a rule of their own. Packets conntrack finds
//! invalid are dropped, not answered (a reset with the original destination's address could
//! end a good connection).
//!
//! IPv6 is not proxied: the `ip6tables` rules let out loopback, the mark (the proxy's upstream
//! connections to an `AAAA` address), neighbour discovery, replies and the link's IPv6 addresses,
//! and refuse the rest.

use std::net::SocketAddr;

use computerd_proto::egress::Compiled;
use computerd_proto::egress::DefaultAction;
use computerd_proto::egress::Target;

use super::MARK;
use super::PROXY_PORT;

/// The gateway's chain, in each table it uses.
pub const CHAIN: &str = "COMPUTERD-EGRESS";

/// Which `OUTPUT` jumps to the chain the restore adds (those not there yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jumps {
    /// Add `nat`'s.
    pub nat: bool,
    /// Add `filter`'s.
    pub filter: bool,
}

/// The IPv4 rules (`iptables-restore --noflush` input) for `policy` (`None`: refuse all).
pub fn v4(policy: Option<&Compiled>, link: &[SocketAddr], jumps: Jumps) -> String {
    let mark = format!("-m mark --mark {MARK:#x}");
    let link4: Vec<&SocketAddr> = link.iter().filter(|a| a.is_ipv4()).collect();
    let link_rule = |a: &SocketAddr, target: &str| {
        format!("-A {CHAIN} -d {}/32 -p tcp -m tcp --dport {} -j {target}\n", a.ip(), a.port())
    };
    let mut t = String::new();
    t.push_str("*nat\n");
    t.push_str(&format!(":{CHAIN} - [0:0]\n"));
    if jumps.nat {
        t.push_str(&format!("-I OUTPUT 1 -j {CHAIN}\n"));
    }
    t.push_str(&format!("-A {CHAIN} -o lo -j RETURN\n"));
    t.push_str(&format!("-A {CHAIN} -d 127.0.0.0/8 -j RETURN\n"));
    t.push_str(&format!("-A {CHAIN} {mark} -j RETURN\n"));
    for a in &link4 {
        t.push_str(&link_rule(a, "RETURN"));
    }
    t.push_str(&format!("-A {CHAIN} -p tcp -j REDIRECT --to-ports {PROXY_PORT}\n"));
    t.push_str("COMMIT\n");

    t.push_str("*filter\n");
    t.push_str(&format!(":{CHAIN} - [0:0]\n"));
    if jumps.filter {
        t.push_str(&format!("-I OUTPUT 1 -j {CHAIN}\n"));
    }
    t.push_str(&format!("-A {CHAIN} -o lo -j ACCEPT\n"));
    t.push_str(&format!("-A {CHAIN} {mark} -j ACCEPT\n"));
    t.push_str(&format!("-A {CHAIN} -m conntrack --ctstate INVALID -j DROP\n"));
    t.push_str(&format!("-A {CHAIN} -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT\n"));
    t.push_str(&format!("-A {CHAIN} -d 127.0.0.1/32 -p tcp -m tcp --dport {PROXY_PORT} -j ACCEPT\n"));
    for a in &link4 {
        t.push_str(&link_rule(a, "ACCEPT"));
    }
    t.push_str(&format!("-A {CHAIN} -p tcp -j REJECT --reject-with tcp-reset\n"));
    if let Some(p) = policy {
        let ranges = |list: &[Target]| -> Vec<String> {
            list.iter()
                .filter_map(|t| match t {
                    Target::Range(c) if c.is_v4() => Some(c.to_string()),
                    _ => None,
                })
                .collect()
        };
        for r in ranges(&p.deny) {
            t.push_str(&format!("-A {CHAIN} -d {r} -j REJECT --reject-with icmp-port-unreachable\n"));
        }
        for r in ranges(&p.allow) {
            t.push_str(&format!("-A {CHAIN} -d {r} -j ACCEPT\n"));
        }
        if p.default == DefaultAction::Allow {
            t.push_str(&format!("-A {CHAIN} -j ACCEPT\n"));
        }
    }
    t.push_str(&format!("-A {CHAIN} -j REJECT --reject-with icmp-port-unreachable\n"));
    t.push_str("COMMIT\n");
    t
}

/// The IPv6 rules (`ip6tables-restore --noflush` input): the same for every policy.
pub fn v6(link: &[SocketAddr], jump: bool) -> String {
    let mut t = String::new();
    t.push_str("*filter\n");
    t.push_str(&format!(":{CHAIN} - [0:0]\n"));
    if jump {
        t.push_str(&format!("-I OUTPUT 1 -j {CHAIN}\n"));
    }
    t.push_str(&format!("-A {CHAIN} -o lo -j ACCEPT\n"));
    t.push_str(&format!("-A {CHAIN} -m mark --mark {MARK:#x} -j ACCEPT\n"));
    // Router solicitation, neighbour solicitation and advertisement: without them no IPv6
    // packet (the proxy's included) reaches the next hop.
    for kind in [133, 135, 136] {
        t.push_str(&format!("-A {CHAIN} -p ipv6-icmp -m icmp6 --icmpv6-type {kind} -j ACCEPT\n"));
    }
    t.push_str(&format!("-A {CHAIN} -m conntrack --ctstate INVALID -j DROP\n"));
    t.push_str(&format!("-A {CHAIN} -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT\n"));
    for a in link.iter().filter(|a| a.is_ipv6()) {
        t.push_str(&format!("-A {CHAIN} -d {}/128 -p tcp -m tcp --dport {} -j ACCEPT\n", a.ip(), a.port()));
    }
    t.push_str(&format!("-A {CHAIN} -p tcp -j REJECT --reject-with tcp-reset\n"));
    t.push_str(&format!("-A {CHAIN} -j REJECT --reject-with icmp6-port-unreachable\n"));
    t.push_str("COMMIT\n");
    t
}

/// Whether `OUTPUT` of `table` already jumps to the chain (`iptables -C`; a missing chain is
/// no jump).
async fn has_jump(tool: &str, table: &str) -> bool {
    tokio::process::Command::new(tool)
        .args(["-t", table, "-C", "OUTPUT", "-j", CHAIN])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Feeds `text` to `tool` (`iptables-restore`, `ip6tables-restore`) with `--noflush`.
async fn restore(tool: &str, text: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(tool)
        .arg("--noflush")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).await.map_err(|e| format!("{tool}: writing the rules: {e}"))?;
    }
    let out = child.wait_with_output().await.map_err(|e| format!("{tool}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!("{tool} refused the rules ({}): {}", out.status, err.trim()))
    }
}

/// Installs the IPv4 rules for `policy` (the jumps from `OUTPUT` added when missing).
pub async fn install_v4(policy: Option<&Compiled>, link: &[SocketAddr]) -> Result<(), String> {
    let jumps = Jumps { nat: !has_jump("iptables", "nat").await, filter: !has_jump("iptables", "filter").await };
    restore("iptables-restore", &v4(policy, link, jumps)).await
}

/// Installs the IPv6 rules.
pub async fn install_v6(link: &[SocketAddr]) -> Result<(), String> {
    let jump = !has_jump("ip6tables", "filter").await;
    restore("ip6tables-restore", &v6(link, jump)).await
}

/// Whether an interface other than loopback has an IPv6 address in this network namespace
/// (`/proc/net/if_inet6`, absent when the kernel has no IPv6): if so, IPv6 rules that cannot be
/// installed are an error, not a warning.
pub fn ipv6_in_use() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6")
        .map(|t| t.lines().any(|l| l.split_whitespace().last().is_some_and(|dev| dev != "lo")))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use computerd_proto::egress::EgressPolicy;

    use super::*;

    fn compiled(json: &str) -> Compiled {
        serde_json::from_str::<EgressPolicy>(json).expect("a policy").compile().expect("compiles")
    }

    fn link() -> Vec<SocketAddr> {
        vec!["172.18.0.1:8443".parse().expect("a"), "[fd00::1]:8443".parse().expect("b")]
    }

    fn pos(text: &str, line: &str) -> usize {
        text.lines().position(|l| l == line).unwrap_or_else(|| panic!("no line {line:?} in\n{text}"))
    }

    const BOTH: Jumps = Jumps { nat: true, filter: true };

    #[test]
    fn the_nat_table_exempts_loopback_the_mark_and_the_link_before_redirecting() {
        let t = v4(None, &link(), BOTH);
        let nat = &t[..t.find("*filter").expect("filter")];
        let redirect = pos(nat, "-A COMPUTERD-EGRESS -p tcp -j REDIRECT --to-ports 15001");
        let lo = pos(nat, "-A COMPUTERD-EGRESS -o lo -j RETURN");
        let local = pos(nat, "-A COMPUTERD-EGRESS -d 127.0.0.0/8 -j RETURN");
        let mark = pos(nat, "-A COMPUTERD-EGRESS -m mark --mark 0x4547 -j RETURN");
        let link = pos(nat, "-A COMPUTERD-EGRESS -d 172.18.0.1/32 -p tcp -m tcp --dport 8443 -j RETURN");
        assert!(lo < redirect && local < redirect && mark < redirect && link < redirect);
        assert!(pos(nat, ":COMPUTERD-EGRESS - [0:0]") < pos(nat, "-I OUTPUT 1 -j COMPUTERD-EGRESS"));
        assert!(!nat.contains("fd00::1"), "no IPv6 address in the IPv4 rules");
        assert!(!nat.contains("DOCKER"), "Docker's chains are left alone");
        assert!(!nat.contains("-F") && !nat.contains(":OUTPUT"), "OUTPUT itself is never flushed");
        assert_eq!(t.matches("COMMIT").count(), 2);
    }

    #[test]
    fn with_no_policy_everything_but_loopback_the_mark_and_the_link_is_refused() {
        let t = v4(None, &link(), BOTH);
        let filter = &t[t.find("*filter").expect("filter")..];
        let accepts: Vec<&str> = filter.lines().filter(|l| l.ends_with("-j ACCEPT")).collect();
        assert_eq!(
            accepts,
            [
                "-A COMPUTERD-EGRESS -o lo -j ACCEPT",
                "-A COMPUTERD-EGRESS -m mark --mark 0x4547 -j ACCEPT",
                "-A COMPUTERD-EGRESS -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT",
                "-A COMPUTERD-EGRESS -d 127.0.0.1/32 -p tcp -m tcp --dport 15001 -j ACCEPT",
                "-A COMPUTERD-EGRESS -d 172.18.0.1/32 -p tcp -m tcp --dport 8443 -j ACCEPT",
            ]
        );
        let last = filter.lines().rev().nth(1).expect("a last rule");
        assert_eq!(last, "-A COMPUTERD-EGRESS -j REJECT --reject-with icmp-port-unreachable");
        assert_eq!(filter.lines().last(), Some("COMMIT"));
    }

    #[test]
    fn the_policy_ranges_come_deny_then_allow_then_default_after_the_exemptions() {
        let p = compiled(
            r#"{"default":"allow","allow":["10.1.0.0/16","pypi.org","2001:db8::/32"],"deny":["10.1.2.0/24","203.0.113.7","ads.test"]}"#,
        );
        let t = v4(Some(&p), &link(), Jumps { nat: false, filter: false });
        assert!(!t.contains("-I OUTPUT"), "a jump already there is not added again");
        let tcp = pos(&t, "-A COMPUTERD-EGRESS -p tcp -j REJECT --reject-with tcp-reset");
        let link = pos(&t, "-A COMPUTERD-EGRESS -d 172.18.0.1/32 -p tcp -m tcp --dport 8443 -j ACCEPT");
        let deny1 = pos(&t, "-A COMPUTERD-EGRESS -d 10.1.2.0/24 -j REJECT --reject-with icmp-port-unreachable");
        let deny2 = pos(&t, "-A COMPUTERD-EGRESS -d 203.0.113.7/32 -j REJECT --reject-with icmp-port-unreachable");
        let allow = pos(&t, "-A COMPUTERD-EGRESS -d 10.1.0.0/16 -j ACCEPT");
        let default = pos(&t, "-A COMPUTERD-EGRESS -j ACCEPT");
        let last = pos(&t, "-A COMPUTERD-EGRESS -j REJECT --reject-with icmp-port-unreachable");
        assert!(link < tcp && tcp < deny1 && deny1 < deny2 && deny2 < allow && allow < default && default < last);
        assert!(
            !t.contains("pypi") && !t.contains("ads.test") && !t.contains("2001:db8"),
            "names and IPv6 ranges are not IPv4 rules"
        );

        let closed = compiled(r#"{"default":"deny","allow":["192.0.2.0/24"]}"#);
        let t = v4(Some(&closed), &[], BOTH);
        assert!(!t.contains("-A COMPUTERD-EGRESS -j ACCEPT"), "a deny default accepts nothing at the end");
        assert!(
            pos(&t, "-A COMPUTERD-EGRESS -d 192.0.2.0/24 -j ACCEPT")
                < pos(&t, "-A COMPUTERD-EGRESS -j REJECT --reject-with icmp-port-unreachable")
        );
    }

    #[test]
    fn ipv6_lets_out_only_loopback_the_mark_neighbour_discovery_and_the_link() {
        let t = v6(&link(), true);
        assert!(t.starts_with("*filter\n:COMPUTERD-EGRESS - [0:0]\n-I OUTPUT 1 -j COMPUTERD-EGRESS\n"));
        assert!(t.contains("-A COMPUTERD-EGRESS -d fd00::1/128 -p tcp -m tcp --dport 8443 -j ACCEPT\n"));
        assert!(!t.contains("172.18.0.1") && !t.contains("*nat"));
        assert!(t.ends_with("-A COMPUTERD-EGRESS -j REJECT --reject-with icmp6-port-unreachable\nCOMMIT\n"));
        assert!(!v6(&[], false).contains("-I OUTPUT"));
    }
}
