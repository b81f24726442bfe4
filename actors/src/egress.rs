//! The docker provider's egress rules: what a sandbox on one of the provider's own bridge
//! networks may reach besides the internet.
//!
//! `enable_icc=false` only keeps sandboxes apart. Without more, a sandbox reaches every port of
//! the host (through its gateway or any other host address: the node's gRPC port, a Docker
//! daemon on TCP) and every private and link-local address the host can route to (the cloud
//! metadata address `169.254.169.254`, the operator's LAN). So for each such network the node
//! installs, with `iptables` (and `ip6tables` when the network has IPv6):
//!
//! - `COMPUTERD-I-<bridge>`, jumped to from `INPUT` for packets from the bridge (they are
//!   addressed to the host itself): replies of the host's own connections pass, new TCP
//!   connections to the ports the sandboxes' agents dial pass, everything else is rejected;
//! - `COMPUTERD-F-<bridge>`, jumped to from `DOCKER-USER` (else `FORWARD`) for packets from the
//!   bridge to elsewhere: replies pass, DNS to the host's resolvers passes (Docker's embedded DNS
//!   asks them from inside the sandbox), the agents' server passes when it is on a private
//!   address, the ranges the network's templates name in `allowPrivate` pass, and every
//!   private and link-local range ([`BLOCKED_V4`], [`BLOCKED_V6`]) is rejected. Anything else
//!   (the internet) goes on to Docker's own rules.
//!
//! Installed before each create and on each sandbox-watch pass (so rules flushed behind the
//! node's back, or lost with a reboot, come back within a pass). Idempotent: each chain is
//! refilled whole (one `iptables-restore --noflush`, atomic) and
//! jumped to once, under a file lock shared by every node process on the host, so a restart or a
//! second node on the same engine re-installs them without duplicates. Several providers (other
//! nodes, other `serverUrl`s) may share one network: each keeps the agent ports already in the
//! chain, and on `INPUT` drops those nothing on the host listens on any more.
//!
//! Rejected, not silently dropped: a sandbox's connection fails at once (`EHOSTUNREACH`)
//! instead of hanging.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use std::process::Stdio;

/// The private and link-local IPv4 ranges a sandbox cannot reach unless a template opens them.
pub const BLOCKED_V4: [&str; 5] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"];
/// The same for IPv6: unique local and link-local addresses.
pub const BLOCKED_V6: [&str; 2] = ["fc00::/7", "fe80::/10"];

/// The comment that marks an agent-port rule (kept when another provider refills the chain).
const AGENT_MARK: &str = "computerd-agent";

pub use computerd_proto::egress::Cidr;

/// Every blocked range.
pub fn blocked() -> Vec<Cidr> {
    BLOCKED_V4.iter().chain(BLOCKED_V6.iter()).map(|c| Cidr::parse(c).expect("a constant range")).collect()
}

/// Checks a template's `allowPrivate`: CIDR ranges, each within a blocked range (anything else is
/// reachable anyway). Answers them sorted and without repeats.
pub fn parse_allowed(ranges: &[String]) -> Result<Vec<Cidr>, String> {
    if ranges.len() > 64 {
        return Err("allowPrivate names at most 64 ranges".into());
    }
    let blocked = blocked();
    let mut out = BTreeSet::new();
    for r in ranges {
        let c = Cidr::parse(r.trim())?;
        if !blocked.iter().any(|b| b.covers(&c)) {
            return Err(format!(
                "{r:?} is not inside a private or link-local range ({}, {}); only those are closed",
                BLOCKED_V4.join(", "),
                BLOCKED_V6.join(", ")
            ));
        }
        out.insert(c);
    }
    Ok(out.into_iter().collect())
}

/// What one network's rules let through.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The Linux bridge of the network (`br-<id prefix>`, or its `bridge.name` option).
    pub bridge: String,
    /// Whether the network has IPv6 (then `ip6tables` too).
    pub ipv6: bool,
    /// The TCP port the sandboxes' agents dial (on the host, or on `agent_hosts`).
    pub agent_port: u16,
    /// The addresses of the agents' server (its URL's host, resolved).
    pub agent_hosts: Vec<IpAddr>,
    /// The ranges the network's templates open.
    pub allowed: Vec<Cidr>,
    /// The DNS servers Docker's embedded resolver forwards to.
    pub resolvers: Vec<IpAddr>,
}

/// The chains of a bridge: (INPUT's, FORWARD's).
pub fn chains(bridge: &str) -> (String, String) {
    (format!("COMPUTERD-I-{bridge}"), format!("COMPUTERD-F-{bridge}"))
}

/// Runs a command; its stdout, or an error naming it and its stderr.
fn run(program: &str, args: &[&str], input: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(program);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{program} is not installed (or not on PATH)"),
        _ => format!("cannot run {program}: {e}"),
    })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        stdin.write_all(text.as_bytes()).map_err(|e| format!("writing to {program}: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this node can install egress rules: `iptables` is there and it may change them
/// (root, or CAP_NET_ADMIN). The answer names what is missing.
pub fn check_available() -> Result<(), String> {
    run("iptables", &["-w", "-S", "INPUT"], None).map(|_| ()).map_err(|e| {
        format!(
            "this node cannot install the sandboxes' egress rules ({e}): run it as root with iptables installed, or set \"egress\": \"operator\" in the provider config if the operator enforces egress from the sandbox network"
        )
    })
}

/// The TCP ports something listens on, on the host (`/proc/net/tcp{,6}`).
fn listening_ports() -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 3
                && cols[3] == "0A"
                && let Some(port) = cols[1].rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}

/// The nameservers of `/etc/resolv.conf`, or of systemd-resolved's upstream file when the
/// first names only loopback addresses (what Docker's embedded resolver forwards to).
pub fn host_resolvers() -> Vec<IpAddr> {
    let read = |path: &str| -> Vec<IpAddr> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|a| a.trim().split('%').next().and_then(|a| a.parse().ok()))
            .collect()
    };
    let mut all = read("/etc/resolv.conf");
    if all.iter().all(IpAddr::is_loopback) {
        all.extend(read("/run/systemd/resolve/resolv.conf"));
    }
    all.retain(|a| !a.is_loopback());
    all.sort();
    all.dedup();
    all
}

/// Whether `ip` is one of the host's own addresses (a socket can be bound to it; nothing is
/// sent). Packets to those take `INPUT`, so `FORWARD` needs no rule for them.
pub fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// The agent rules already in a chain (from `iptables -S <chain>`), as (destination, port).
fn kept_agent_rules(listing: &str) -> Vec<(Option<String>, u16)> {
    listing
        .lines()
        .filter(|l| l.starts_with("-A ") && l.contains(AGENT_MARK))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |flag: &str| words.iter().position(|w| *w == flag).and_then(|i| words.get(i + 1)).copied();
            let port = after("--dport")?.parse().ok()?;
            Some((after("-d").map(str::to_string), port))
        })
        .collect()
}

/// The `iptables-restore` input that refills both chains of one family.
fn restore_text(
    plan: &Plan,
    v6: bool,
    kept_in: &[(Option<String>, u16)],
    kept_fwd: &[(Option<String>, u16)],
) -> String {
    let (ci, cf) = chains(&plan.bridge);
    let reject = if v6 { "icmp6-adm-prohibited" } else { "icmp-admin-prohibited" };
    let fam = |a: &IpAddr| a.is_ipv6() == v6;
    let host_len = if v6 { 128 } else { 32 };
    let mut t = format!("*filter\n:{ci} - [0:0]\n:{cf} - [0:0]\n");
    // INPUT: replies, the agents' ports, nothing else.
    t += &format!("-A {ci} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n");
    let mut ports: BTreeSet<u16> = kept_in.iter().map(|(_, p)| *p).collect();
    ports.insert(plan.agent_port);
    for p in ports {
        t += &format!("-A {ci} -p tcp -m tcp --dport {p} -m comment --comment {AGENT_MARK} -j ACCEPT\n");
    }
    t += &format!("-A {ci} -j REJECT --reject-with {reject}\n");
    // FORWARD: replies, DNS, the agents' server, the opened ranges; then no private range.
    t += &format!("-A {cf} -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN\n");
    for r in plan.resolvers.iter().filter(|a| fam(a)) {
        for proto in ["udp", "tcp"] {
            t += &format!("-A {cf} -d {r}/{host_len} -p {proto} -m {proto} --dport 53 -j RETURN\n");
        }
    }
    let mut agents: BTreeSet<(String, u16)> = kept_fwd.iter().filter_map(|(d, p)| Some((d.clone()?, *p))).collect();
    for h in plan.agent_hosts.iter().filter(|a| fam(a)) {
        agents.insert((format!("{h}/{host_len}"), plan.agent_port));
    }
    for (d, p) in agents {
        t += &format!("-A {cf} -d {d} -p tcp -m tcp --dport {p} -m comment --comment {AGENT_MARK} -j RETURN\n");
    }
    for c in plan.allowed.iter().filter(|c| c.is_v4() != v6) {
        t += &format!("-A {cf} -d {c} -j RETURN\n");
    }
    let blocked = if v6 { &BLOCKED_V6[..] } else { &BLOCKED_V4[..] };
    for b in blocked {
        t += &format!("-A {cf} -d {b} -j REJECT --reject-with {reject}\n");
    }
    t += "COMMIT\n";
    t
}

/// Inserts `rule` at the head of `chain` unless it is there.
fn jump_once(tool: &str, chain: &str, rule: &[&str]) -> Result<(), String> {
    let mut check = vec!["-w", "-C", chain];
    check.extend_from_slice(rule);
    if run(tool, &check, None).is_ok() {
        return Ok(());
    }
    let mut insert = vec!["-w", "-I", chain, "1"];
    insert.extend_from_slice(rule);
    run(tool, &insert, None).map(|_| ())
}

/// Installs (or refreshes) the rules of one network. Blocking: run it off the async runtime.
pub fn install(plan: &Plan) -> Result<(), String> {
    if plan.bridge.is_empty() || plan.bridge.len() > 15 || plan.bridge.contains(|c: char| c.is_whitespace()) {
        return Err(format!("cannot install egress rules for the bridge {:?}", plan.bridge));
    }
    // One installer at a time on this host (nodes sharing an engine, parallel creates).
    let lock_path =
        if std::path::Path::new("/run").is_dir() { "/run/computerd-egress.lock" } else { "/tmp/computerd-egress.lock" };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path)
        .map_err(|e| format!("cannot open the egress lock {lock_path}: {e}"))?;
    lock.lock().map_err(|e| format!("cannot take the egress lock {lock_path}: {e}"))?;
    let families: &[bool] = if plan.ipv6 { &[false, true] } else { &[false] };
    let listening = listening_ports();
    for &v6 in families {
        let (tool, restore) = if v6 { ("ip6tables", "ip6tables-restore") } else { ("iptables", "iptables-restore") };
        let (ci, cf) = chains(&plan.bridge);
        let listing = |c: &str| run(tool, &["-w", "-S", c], None).unwrap_or_default();
        let mut kept_in = kept_agent_rules(&listing(&ci));
        kept_in.retain(|(_, p)| listening.contains(p));
        let mut kept_fwd = kept_agent_rules(&listing(&cf));
        kept_fwd.retain(|(d, _)| {
            let ip = d.as_deref().and_then(|d| d.split('/').next()).and_then(|ip| ip.parse().ok());
            ip.is_some_and(|ip| !is_local(ip))
        });
        run(restore, &["-w", "--noflush"], Some(&restore_text(plan, v6, &kept_in, &kept_fwd)))?;
        jump_once(tool, "INPUT", &["-i", &plan.bridge, "-j", &ci])?;
        let forward = if run(tool, &["-w", "-S", "DOCKER-USER"], None).is_ok() { "DOCKER-USER" } else { "FORWARD" };
        jump_once(tool, forward, &["-i", &plan.bridge, "-j", &cf])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        let ok = parse_allowed(&["10.20.0.0/16".into(), "169.254.169.254/32".into(), "fd00::/8".into()]).expect("ok");
        assert_eq!(
            ok.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.20.0.0/16", "169.254.169.254/32", "fd00::/8"]
        );
        let dup = parse_allowed(&["10.20.0.0/16".into(), "10.20.0.0/16".into()]).expect("ok");
        assert_eq!(dup.len(), 1);
        for (bad, says) in [
            ("10.20.0.0", "not a CIDR"),
            ("10.20.0.0/33", "prefix"),
            ("10.20.0.1/16", "host bits"),
            ("ten/8", "not an IP"),
            ("8.8.8.0/24", "not inside"),
            ("0.0.0.0/0", "not inside"),
            ("10.0.0.0/7", "not inside"),
            ("2001:db8::/32", "not inside"),
        ] {
            let e = parse_allowed(&[bad.to_string()]).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_rules_close_the_host_and_private_ranges() {
        let plan = Plan {
            bridge: "br-0123456789ab".into(),
            ipv6: false,
            agent_port: 8443,
            agent_hosts: vec!["172.18.0.1".parse().expect("ip")],
            allowed: parse_allowed(&["10.20.0.0/16".into()]).expect("ok"),
            resolvers: vec!["10.255.255.53".parse().expect("ip")],
        };
        let kept = kept_agent_rules(
            "-N COMPUTERD-I-br-0123456789ab\n-A COMPUTERD-I-br-0123456789ab -p tcp -m tcp --dport 9000 -m comment --comment computerd-agent -j ACCEPT\n",
        );
        assert_eq!(kept, vec![(None, 9000)]);
        let t = restore_text(&plan, false, &kept, &[]);
        let i = "COMPUTERD-I-br-0123456789ab";
        let f = "COMPUTERD-F-br-0123456789ab";
        for line in [
            format!("-A {i} -p tcp -m tcp --dport 8443 -m comment --comment computerd-agent -j ACCEPT"),
            format!("-A {i} -p tcp -m tcp --dport 9000 -m comment --comment computerd-agent -j ACCEPT"),
            format!("-A {i} -j REJECT --reject-with icmp-admin-prohibited"),
            format!("-A {f} -d 10.255.255.53/32 -p udp -m udp --dport 53 -j RETURN"),
            format!(
                "-A {f} -d 172.18.0.1/32 -p tcp -m tcp --dport 8443 -m comment --comment computerd-agent -j RETURN"
            ),
            format!("-A {f} -d 10.20.0.0/16 -j RETURN"),
            format!("-A {f} -d 169.254.0.0/16 -j REJECT --reject-with icmp-admin-prohibited"),
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line} in\n{t}");
        }
        // The opening comes before the rejections.
        let pos = |needle: &str| t.find(needle).expect(needle);
        assert!(pos("-d 10.20.0.0/16 -j RETURN") < pos("-d 10.0.0.0/8 -j REJECT"), "{t}");
        assert!(!restore_text(&plan, true, &[], &[]).contains("10.20.0.0"), "no IPv4 range in the IPv6 rules");
    }
}
