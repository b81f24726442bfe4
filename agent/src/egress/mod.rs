//! The egress gateway (`computer-agent egress-gateway`): the program of the small container
//! whose network namespace a sandbox shares (`NetworkMode: container:<gateway>`), which holds
//! the sandbox to its Computer's egress policy ([`computerd_proto::egress`]).
//!
//! # Why a gateway
//!
//! The sandbox's root could rewrite any filter it has the rights to change. Here it has none:
//! the rules live in a network namespace the sandbox only joins, without `CAP_NET_ADMIN`,
//! while the gateway container has `CAP_NET_ADMIN` and `CAP_NET_RAW` and runs as root. The
//! gateway installs the rules ([`rules`]), then runs a transparent proxy ([`proxy`]) that every
//! TCP connection of the sandbox is redirected to, and a control socket ([`control`]) in its own
//! file system (the sandbox shares the network, not the files) through which the provider sets
//! the policy and reads what was refused.
//!
//! # What is enforced, and how
//!
//! - TCP: every connection but loopback and the cluster's link addresses (the agent's own
//!   connection, given at start) reaches the proxy. It is decided from its address when no name
//!   could change the outcome, else from the name it carries ([`sniff`]: the TLS SNI, the HTTP
//!   `Host`). A connection let through by its name goes where the gateway resolves the name
//!   ([`dns`]), never where the sandbox sent it, so an allowed name cannot carry a connection to
//!   a host of the sandbox's choice. A refused HTTP request is answered `403`, any other refused
//!   connection is reset. The proxy's own upstream sockets carry a mark ([`MARK`]) that the
//!   rules let out and that only a process with `CAP_NET_ADMIN` can set.
//! - Other IPv4 traffic (UDP, ICMP, and so QUIC): by the policy's ranges and default only. A
//!   datagram carries no name the gateway could read, so name entries cannot apply to it: with
//!   a `deny` default, QUIC to an allowed name is refused and clients fall back to TCP, where the
//!   name is checked.
//! - IPv6: not proxied; only loopback, the proxy's marked connections and the link's IPv6
//!   addresses go out (a policy's IPv6 ranges open nothing; a name may still resolve to an
//!   IPv6 address, which the proxy then connects to).
//! - Until a policy is set, everything but loopback and the link is refused: the gateway fails
//!   closed. If the rules cannot be installed at start it exits (code 2), so the provider never
//!   starts the sandbox unfiltered; a later change whose rules fail is refused and the rules in
//!   place stay.
//! - A change ([`control`]'s `set`) returns once the rules are in place, the proxy decides new
//!   connections by the new policy, and the open connections it refuses are cut.
//!
//! # Caveats
//!
//! - DNS: the sandbox's queries to Docker's embedded resolver (127.0.0.11) are loopback and pass
//!   whatever the policy: a sandbox can carry data out in the names it asks (a DNS tunnel), and
//!   can learn any name's addresses (which only lets it connect where the policy allows).
//! - Names are what the client says: SNI and `Host` are checked, not what the server serves
//!   behind them, so a shared front (a CDN) that routes by another name inside the TLS session
//!   (domain fronting) is not stopped; with ECH the outer, public name is the one decided.
//! - Only the start of a connection is read: later requests on a kept-alive HTTP connection are
//!   not, and go where the first one was let through to (for a name, the host it resolves to).
//! - A connection that must be named but whose client waits for the server to speak first (SSH,
//!   SMTP) has no name: it is decided after [`proxy::SNIFF_DEADLINE`] by its address alone.
//! - A `deny` name in a policy whose default is `allow` stops connections that carry the name; a
//!   connection to the same address that names nothing (TLS without SNI, another protocol) is
//!   decided by its address: `deny` ranges are what keep addresses out.
//! - The gateway reads `/etc/resolv.conf` once, at start: the sandbox shares that file and its
//!   root can rewrite it, so it is never read again (nor `/etc/hosts`: names the gateway must
//!   resolve itself come in its configuration).

pub mod control;
pub mod dns;
pub mod proxy;
pub mod rules;
pub mod sniff;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use serde::Deserialize;

/// The mark of the proxy's upstream sockets (and its DNS queries): the rules let it out.
pub const MARK: u32 = 0x4547;

/// The port of the transparent proxy, on 127.0.0.1.
pub const PROXY_PORT: u16 = 15001;

/// The control socket, in the gateway container's own file system.
pub const SOCKET: &str = "/run/computerd-egress.sock";

/// The environment variable of the gateway's configuration ([`Config`], JSON).
pub const CONFIG_ENV: &str = "COMPUTERD_EGRESS_CONFIG";

/// The gateway's configuration: `{"link": ["172.18.0.1:8443"], "hosts": {"allowed.test":
/// "172.18.0.1"}}`, both optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The cluster's addresses the sandbox's agent dials: exempt from all filtering.
    #[serde(default)]
    pub link: Vec<SocketAddr>,
    /// Names the gateway resolves itself, before DNS (a test's local names).
    #[serde(default)]
    pub hosts: HashMap<String, IpAddr>,
}

impl Config {
    /// Parses the configuration (an empty text is the default one); host names are kept without
    /// case and trailing dot.
    pub fn parse(text: &str) -> Result<Config, String> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        let mut c: Config = serde_json::from_str(text).map_err(|e| format!("{CONFIG_ENV}: {e}"))?;
        c.hosts = c.hosts.into_iter().map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), v)).collect();
        Ok(c)
    }
}

/// `computer-agent egress-gateway`.
#[derive(Debug, clap::Parser)]
#[command(name = "computer-agent egress-gateway", about = "The egress gateway of a sandbox's network namespace")]
struct Command {
    /// The control socket.
    #[arg(long, global = true, default_value = SOCKET, hide = true)]
    socket: PathBuf,
    #[command(subcommand)]
    op: Op,
}

#[derive(Debug, clap::Subcommand)]
enum Op {
    /// Install the rules and run the proxy and the control socket (the gateway container's
    /// command; configured by COMPUTERD_EGRESS_CONFIG).
    Serve,
    /// Set the policy (`{"default":"allow"|"deny","allow":[..],"deny":[..]}`); returns once the
    /// rules are installed, the proxy uses it and the connections it refuses are cut.
    Set {
        /// The policy, JSON.
        policy: String,
        /// Its revision: a policy of a later one in force stays (the answer is `{"stale":true}`).
        #[arg(default_value_t = 0)]
        revision: u64,
    },
    /// Print the policy and the counts of allowed, denied and cut connections, with the last
    /// denied ones (JSON).
    Stats,
}

/// Runs `computer-agent egress-gateway ARGS` (`args` starts with `egress-gateway`). A usage
/// error exits 2; `serve` exits 2 when it cannot start (its rules or listeners), else runs until
/// SIGTERM; `set` and `stats` print the answer's JSON (exit 0) or the error on stderr (exit 1).
pub async fn command(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    use clap::Parser;
    let cmd = match Command::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cmd.op {
        Op::Serve => serve(&cmd.socket).await,
        Op::Set { policy, revision } => {
            let parsed = serde_json::from_str::<computerd_proto::egress::EgressPolicy>(&policy)
                .map_err(|e| format!("the policy is not valid JSON of a policy: {e}"))
                .and_then(|p| p.compile().map(|_| p));
            match parsed {
                Ok(p) => answer(control::request(&cmd.socket, &control::Request::Set { policy: p, revision }).await),
                Err(e) => answer(Err(e)),
            }
        }
        Op::Stats => answer(control::request(&cmd.socket, &control::Request::Stats).await),
    }
}

/// Prints an answer: its JSON on stdout (exit 0), or its error on stderr (exit 1).
fn answer(a: Result<String, String>) -> ExitCode {
    match a {
        Ok(v) => {
            say_out(&v);
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(&format!("computer-agent egress-gateway: {e}"));
            ExitCode::from(1)
        }
    }
}

/// `serve`: the rules (no policy: all refused), the proxy, the control socket, then forever.
async fn serve(socket: &Path) -> ExitCode {
    let fail = |what: String| {
        say(&format!("egress gateway: {what}"));
        ExitCode::from(2)
    };
    let config = match Config::parse(&std::env::var(CONFIG_ENV).unwrap_or_default()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    raise_open_files();
    // Read once: the sandbox shares this file and may rewrite it later.
    let nameservers = dns::nameservers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    if nameservers.is_empty() {
        say("egress gateway: warning: no nameserver in /etc/resolv.conf; names resolve only from the configured hosts");
    }
    if let Err(e) = rules::install_v4(None, &config.link).await {
        return fail(format!("cannot install the IPv4 rules, refusing to run: {e}"));
    }
    if let Err(e) = rules::install_v6(&config.link).await {
        if rules::ipv6_in_use() {
            return fail(format!("cannot install the IPv6 rules and the namespace has IPv6 addresses: {e}"));
        }
        say(&format!("egress gateway: warning: no IPv6 rules (the namespace has no IPv6): {e}"));
    }
    let proxy = match tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, PROXY_PORT)).await {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on 127.0.0.1:{PROXY_PORT}: {e}")),
    };
    let control = match control::bind(socket) {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", socket.display())),
    };
    let gateway = Arc::new(proxy::Gateway::new(config, nameservers));
    tokio::spawn(control::serve(gateway.clone(), control));
    tokio::spawn(proxy::serve(gateway, proxy));
    say("egress gateway ready");
    let (mut term, mut int) = match (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()),
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            // Without signal handlers, run until killed.
            std::future::pending::<()>().await;
            return ExitCode::SUCCESS;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    // The rules stay: the namespace stays closed without the gateway.
    ExitCode::SUCCESS
}

/// A line on stderr (a failed write is ignored: the gateway never stops for its logs).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A line on stdout (the same).
fn say_out(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Raises the soft limit of open descriptors to the hard one: each proxied connection holds two,
/// and a sandbox that opens many should not starve the gateway early.
fn raise_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit of this process, with a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Marks a socket's packets ([`MARK`]); needs `CAP_NET_ADMIN`.
fn set_mark(fd: RawFd, mark: u32) -> std::io::Result<()> {
    // SAFETY: setsockopt on a descriptor the caller owns, with a u32 option value.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&mark as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Makes closing a socket a reset (`SO_LINGER` 0), not an orderly end.
fn set_reset_on_close(fd: RawFd) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a descriptor the caller owns, with a linger value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_parses_and_refuses_unknown_fields() {
        let c = Config::parse(r#"{"link":["172.18.0.1:8443","[fd00::1]:443"],"hosts":{"Allowed.Test.":"172.18.0.1"}}"#)
            .expect("a configuration");
        assert_eq!(c.link.len(), 2);
        assert_eq!(c.hosts.get("allowed.test"), Some(&"172.18.0.1".parse().expect("ip")));
        assert!(Config::parse("").expect("empty").link.is_empty());
        assert!(Config::parse(r#"{"links":[]}"#).is_err());
        assert!(Config::parse(r#"{"link":["172.18.0.1"]}"#).is_err(), "a link address has a port");
    }
}
