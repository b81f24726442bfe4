//! A real load balancer in front of a test cluster: Debian's HAProxy, started as a child process
//! with a generated config (HTTP mode, WebSocket upgrades tunnelled, health checks on
//! `/v1/health`, a dead backend's sessions shut down so clients reconnect elsewhere), and the
//! rules of `deploy/haproxy.cfg` that send a public port address to the node holding its link.

use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use crate::free_port;
use crate::wait_for;

/// One HAProxy process.
pub struct Haproxy {
    /// `127.0.0.1:port` it listens on.
    pub addr: String,
    child: Child,
}

impl Haproxy {
    /// Starts HAProxy on a free port in front of `backends` (`host:port` HTTP addresses), with its
    /// config and log in `dir`; answers once it accepts connections. Backend `i` is server
    /// `n{i+1}`: a cluster's nodes in id order (`c.nodes.values()`) are named by their ids, as
    /// the nodes' `X-Computerd-Link-Node` answers name them.
    pub async fn start(dir: &std::path::Path, backends: &[String]) -> Haproxy {
        let port = free_port();
        let mut cfg = format!(
            "global\n  maxconn 4000\n\
             defaults\n  mode http\n  timeout connect 200ms\n  timeout client 1h\n  timeout server 1h\n  \
             timeout tunnel 1h\n  timeout http-request 30s\n  retries 3\n  option redispatch 1\n\
             frontend api\n  bind 127.0.0.1:{port}\n  default_backend nodes\n\
             backend nodes\n  balance roundrobin\n  option httpchk GET /v1/health\n  \
             default-server inter 250ms fall 2 rise 1 on-marked-down shutdown-sessions\n{}",
            steer()
        );
        for (i, b) in backends.iter().enumerate() {
            cfg.push_str(&format!("  server n{} {b} check\n", i + 1));
        }
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, cfg).expect("write haproxy.cfg");
        let log = std::fs::File::create(dir.join("haproxy.log")).expect("haproxy log");
        let child = Command::new("haproxy")
            .arg("-f")
            .arg(&path)
            .arg("-db")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start haproxy (apt-get install haproxy)");
        let addr = format!("127.0.0.1:{port}");
        let probe = addr.clone();
        wait_for("haproxy to accept connections", Duration::from_secs(10), || {
            let probe = probe.clone();
            async move { tokio::net::TcpStream::connect(&probe).await.ok().map(|_| ()) }
        })
        .await;
        Haproxy { addr, child }
    }

    /// `http://addr` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// The header this test balancer adds to every answer: the name of the server that gave it.
pub const SERVED_BY: &str = "x-lb-server";

/// The rules of `deploy/haproxy.cfg` (read from it, its servers named `n<id>` here): a request
/// goes to the node its `Host`'s last answer named in `X-Computerd-Link-Node` (a public port
/// address, to the node holding its link), if that node is up; the table keeps the `Host`'s
/// SHA-256, not the address. Then this balancer's own [`SERVED_BY`].
fn steer() -> String {
    let cfg = include_str!("../../deploy/haproxy.cfg");
    let rules: String = cfg
        .lines()
        .skip_while(|l| !l.contains("which read them from here"))
        .skip(1)
        .take_while(|l| !l.contains("end of the shared lines"))
        .map(|l| format!("{}\n", l.replace("use-server node%[", "use-server n%[")))
        .collect();
    assert!(rules.contains("use-server n%["), "deploy/haproxy.cfg lost its port address rules");
    format!("{rules}  http-after-response set-header {SERVED_BY} %s\n")
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rules_of_the_deployed_balancer_are_used() {
        let rules = super::steer();
        assert_eq!(rules.lines().count(), 6, "{rules}");
        assert!(rules.starts_with("  stick-table ") && rules.contains("del-header x-computerd-link-node"), "{rules}");
    }
}
