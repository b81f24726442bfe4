//! Network partitions of test nodes on loopback, with iptables.
//!
//! Every test node listens on, and dials its peers from, its own loopback address
//! (`127.B.C.(10+id)`, see [`crate::cluster`] and `computerd serve --peer-source-ip`). A
//! [`NetFault`] owns one chain (`cdnet-<pid>-<n>`), jumped to from the top of INPUT; isolating a
//! node appends DROP rules for the packets between its address and each peer's, both ways, so
//! node-to-node traffic stops while clients on 127.0.0.1 (HAProxy, the test) still reach every
//! node: the isolated leader stays reachable by clients. Healing flushes the chain. The chain is
//! removed on drop (a panicking test included), and chains left by test processes that no
//! longer run are removed when a new one is made.

use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering;

/// The prefix of every chain made here (the process id and a counter follow).
const PREFIX: &str = "cdnet-";

/// One chain of DROP rules, removed on drop.
pub struct NetFault {
    chain: String,
}

fn iptables(args: &[&str]) -> Result<String, String> {
    let out =
        Command::new("iptables").arg("-w").args(args).output().map_err(|e| format!("cannot run iptables: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("iptables {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Removes `chain`: every jump to it from INPUT, its rules, the chain itself.
fn remove_chain(chain: &str) {
    while iptables(&["-D", "INPUT", "-j", chain]).is_ok() {}
    let _ = iptables(&["-F", chain]);
    let _ = iptables(&["-X", chain]);
}

/// Removes the chains of test processes that no longer run (a SIGKILLed test never drops).
fn remove_stale_chains() {
    let Ok(rules) = iptables(&["-S"]) else { return };
    for chain in rules.lines().filter_map(|l| l.strip_prefix("-N ")).filter(|c| c.starts_with(PREFIX)) {
        let pid = chain[PREFIX.len()..].split('-').next().unwrap_or_default();
        if pid.is_empty() || !std::path::Path::new("/proc").join(pid).exists() {
            remove_chain(chain);
        }
    }
}

impl NetFault {
    /// Makes this process's next chain and jumps to it from INPUT; `Err` says why iptables is
    /// not usable here (not root, not installed, no netfilter), for the caller to skip.
    pub fn new() -> Result<NetFault, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: iptables needs CAP_NET_ADMIN".into());
        }
        iptables(&["-S", "INPUT"])?;
        remove_stale_chains();
        let chain = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        remove_chain(&chain);
        iptables(&["-N", &chain])?;
        let fault = NetFault { chain };
        iptables(&["-I", "INPUT", "1", "-j", &fault.chain])?;
        Ok(fault)
    }

    /// The chain's name.
    pub fn chain(&self) -> &str {
        &self.chain
    }

    /// Drops every packet between `node` and each of `peers`, both ways.
    pub fn isolate(&self, node: IpAddr, peers: &[IpAddr]) -> Result<(), String> {
        let node = node.to_string();
        for p in peers.iter().map(IpAddr::to_string).filter(|p| *p != node) {
            iptables(&["-A", &self.chain, "-s", &node, "-d", &p, "-j", "DROP"])?;
            iptables(&["-A", &self.chain, "-s", &p, "-d", &node, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Drops the TCP connections that `from` opens to `to` (a listener), both ways, while the
    /// connections `to`'s host opens to `from` still pass: e.g. a leader's appends to a
    /// follower stop, while the follower's own calls to the leader go on.
    pub fn cut_connections(&self, from: IpAddr, to: std::net::SocketAddr) -> Result<(), String> {
        let (from, ip, port) = (from.to_string(), to.ip().to_string(), to.port().to_string());
        iptables(&["-A", &self.chain, "-p", "tcp", "-s", &from, "-d", &ip, "--dport", &port, "-j", "DROP"])?;
        iptables(&["-A", &self.chain, "-p", "tcp", "-s", &ip, "--sport", &port, "-d", &from, "-j", "DROP"])?;
        Ok(())
    }

    /// Removes every rule: all nodes reach each other again.
    pub fn heal(&self) -> Result<(), String> {
        iptables(&["-F", &self.chain]).map(drop)
    }

    /// How many DROP rules are in place.
    pub fn rules(&self) -> usize {
        iptables(&["-S", &self.chain]).map(|s| s.lines().filter(|l| l.starts_with("-A ")).count()).unwrap_or(0)
    }
}

impl Drop for NetFault {
    fn drop(&mut self) {
        remove_chain(&self.chain);
    }
}
