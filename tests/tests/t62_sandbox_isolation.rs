//! Sandbox hardening with the real Docker engine, through `computerd dev`'s docker provider (its
//! sandboxes are on the provider's own network, `computerd-sandboxes`): two sandboxes on one host
//! get binding-UID ranges of their own, so processes under the first's binding UID cannot use up
//! the second's process limit (RLIMIT_NPROC counts per UID across the whole kernel); the first
//! cannot open a TCP connection to a port the second listens on; no process in a sandbox holds
//! NET_RAW (a raw socket is refused to root, where a container with Docker's defaults gets one);
//! NoNewPrivs is set; and a deleted Computer's range goes to the next one.

use std::process::Command;
use std::time::Duration;

use computerd_tests::dev::Dev;
use computerd_tests::docker::Containers;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::inspect;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::json;

/// The capabilities a sandbox keeps, as bits: CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL
/// 5, SETGID 6, SETUID 7, NET_BIND_SERVICE 10.
const KEPT: u64 = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 10);
const NET_RAW: u64 = 1 << 13;

/// `docker exec` (as `user` when given): exit success, stdout, stderr.
fn exec(container: &str, user: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new("docker");
    cmd.arg("exec");
    if let Some(u) = user {
        cmd.args(["-u", u]);
    }
    let out = cmd.arg(container).args(args).output().expect("docker exec");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn python(container: &str, user: Option<&str>, code: &str) -> String {
    let (ok, out, err) = exec(container, user, &["python3", "-c", code]);
    assert!(ok, "python in {container}: {out}{err}");
    out.trim().to_string()
}

/// A field of a `/proc/<pid>/status` text.
fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
        .to_string()
}

fn hex(v: &str) -> u64 {
    u64::from_str_radix(v, 16).unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// The first binding UID its agent was given.
fn first_uid(container: &str) -> u32 {
    let env = inspect(container, "{{json .Config.Env}}");
    let env: Vec<String> = serde_json::from_str(&env).expect("env");
    env.iter()
        .find_map(|e| e.strip_prefix("COMPUTER_AGENT_MCP_FIRST_UID="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no first UID in {env:?}"))
}

async fn create(dev: &Dev, provider: &str, key: &str, cleanup: &mut Containers) -> (String, String) {
    let body = json!({"commandKey": key, "name": key, "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = dev.call(Method::POST, "/v1/computers", Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_for("the sandbox's agent to link", Duration::from_secs(90), || async {
        let (_, c) = dev.call(Method::GET, &format!("/v1/computers/{id}"), None).await;
        (c["state"] == "running").then_some(())
    })
    .await;
    let container = containers_of(&id).pop().expect("the container");
    (id, container)
}

/// Forks once under RLIMIT_NPROC = `limit`: `forked`, or the errno name.
fn fork_under(limit: u32) -> String {
    format!(
        "import errno, os, resource\n\
         resource.setrlimit(resource.RLIMIT_NPROC, ({limit}, {limit}))\n\
         try:\n    pid = os.fork()\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n\
         else:\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n    print('forked')\n"
    )
}

#[tokio::test]
async fn t10_two_sandboxes_share_no_uid_no_network_and_hold_no_net_raw() {
    let dev = Dev::start().await;
    assert!(!dev.docker_line.contains("off"), "Docker is here: {}", dev.docker_line);
    let provider = dev.docker_provider().await["id"].as_str().expect("id").to_string();
    let mut cleanup = Containers::default();
    let (a_id, a) = create(&dev, &provider, "iso-a", &mut cleanup).await;
    let (_b_id, b) = create(&dev, &provider, "iso-b", &mut cleanup).await;

    // Ranges of their own, above the agent's default range (which paired machines keep).
    let (ua, ub) = (first_uid(&a), first_uid(&b));
    assert!(ua >= 200_000 + 65_536 && ub >= 200_000 + 65_536, "{ua} {ub}");
    assert!(ua.abs_diff(ub) >= 65_536, "disjoint ranges: {ua} {ub}");

    // Hardening, seen by the agent itself and by any root process in the sandbox.
    let (ok, pid, err) = exec(&a, None, &["pgrep", "-x", "computer-agent"]);
    assert!(ok, "the agent runs: {err}");
    let (_, status, _) = exec(&a, None, &["cat", &format!("/proc/{}/status", pid.trim())]);
    assert_eq!(hex(&status_field(&status, "CapEff")), KEPT, "the agent's capabilities: {status}");
    assert_eq!(hex(&status_field(&status, "CapBnd")), KEPT, "its bounding set: {status}");
    assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
    let (_, status, _) = exec(&b, None, &["cat", "/proc/self/status"]);
    assert_eq!(hex(&status_field(&status, "CapEff")) & NET_RAW, 0, "{status}");
    assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
    let raw = "import socket\n\
               try:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n    print('raw')\n\
               except PermissionError:\n    print('refused')\n";
    assert_eq!(python(&a, None, raw), "refused", "root in a sandbox gets no raw socket");
    // The same image with Docker's default capabilities does: the refusal is the hardening's.
    let out = Command::new("docker")
        .args(["run", "--rm", "--network", "none", IMAGE, "python3", "-c", raw])
        .output()
        .expect("docker run");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "raw", "{}", String::from_utf8_lossy(&out.stderr));
    // And the agent's own work still runs: a command through the API.
    let body = json!({"command": "grep NoNewPrivs /proc/self/status", "yieldTimeMs": 10_000});
    let (s, v) = dev.call(Method::POST, &format!("/v1/computers/{a_id}/sessions"), Some(body)).await;
    assert_eq!(
        (s, v["output"].as_str().map(str::split_whitespace).map(Vec::from_iter)),
        (200, Some(vec!["NoNewPrivs:", "1"])),
        "{v}"
    );

    // Processes. 40 sleepers under A's first binding UID fill that UID's count, kernel-wide.
    let (ua_s, ub_s) = (format!("{ua}:{ua}"), format!("{ub}:{ub}"));
    let (ok, _, err) =
        exec(&a, Some(&ua_s), &["sh", "-c", "for i in $(seq 40); do sleep 600 >/dev/null 2>&1 & done; echo started"]);
    assert!(ok, "{err}");
    wait_for("A's binding UID to run its 40 processes", Duration::from_secs(20), || async {
        let out = Command::new("pgrep").args(["-c", "-u", &ua.to_string()]).output().expect("pgrep");
        let n: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
        (n >= 40).then_some(())
    })
    .await;
    // Under a limit of 20, a process of A's UID cannot fork, even in B: the count is per UID ...
    assert_eq!(python(&b, Some(&ua_s), &fork_under(20)), "EAGAIN", "the counter is the kernel's, per UID");
    // ... and B's own binding UID, which no process of A holds, still forks.
    assert_eq!(python(&b, Some(&ub_s), &fork_under(20)), "forked", "B keeps its own process limit");

    // Network. B listens on a port; the host and B itself reach it, A does not.
    let listen = "import socket, sys, os\n\
                  s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(16)\n\
                  open('/tmp/port.tmp', 'w').write(str(s.getsockname()[1])); os.rename('/tmp/port.tmp', '/tmp/port')\n\
                  while True:\n    c, _ = s.accept(); c.sendall(b'hello'); c.close()\n";
    let out = Command::new("docker").args(["exec", "-d", &b, "python3", "-c", listen]).output().expect("exec -d");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let port: u16 = wait_for("B's listener", Duration::from_secs(20), || async {
        let (ok, out, _) = exec(&b, None, &["cat", "/tmp/port"]);
        if ok { out.trim().parse().ok() } else { None }
    })
    .await;
    let b_ip = inspect(&b, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}");
    let a_ip = inspect(&a, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}");
    assert!(!b_ip.is_empty() && !a_ip.is_empty() && a_ip != b_ip, "{a_ip} {b_ip}");
    let connect = format!(
        "import socket\n\
         try:\n    c = socket.create_connection(('{b_ip}', {port}), timeout=3); print(c.recv(5).decode())\n\
         except OSError as e:\n    print('blocked', type(e).__name__)\n"
    );
    assert_eq!(python(&b, None, &connect), "hello", "B reaches its own listener on its address");
    let mut from_host = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::new(b_ip.parse().expect("ip"), port),
        Duration::from_secs(3),
    )
    .expect("the host reaches B's listener");
    let mut hello = String::new();
    std::io::Read::read_to_string(&mut from_host, &mut hello).expect("read");
    assert_eq!(hello, "hello");
    let from_a = python(&a, None, &connect);
    assert!(from_a.starts_with("blocked"), "A must not reach B: {from_a}");

    // Delete A: its range goes to the next sandbox.
    let (s, v) =
        dev.call(Method::DELETE, &format!("/v1/computers/{a_id}"), Some(json!({"commandKey": "iso-a-del"}))).await;
    assert_eq!(s, 202, "{v}");
    wait_for("A to be deleted", Duration::from_secs(60), || async {
        let (s, _) = dev.call(Method::GET, &format!("/v1/computers/{a_id}"), None).await;
        (s == 404).then_some(())
    })
    .await;
    assert!(containers_of(&a_id).is_empty(), "A's container is gone");
    let (_c_id, c) = create(&dev, &provider, "iso-c", &mut cleanup).await;
    assert_eq!(first_uid(&c), ua, "a deleted Computer's range is reused");
}
