//! `computerctl` in a real pseudo-terminal, against a real node and a real `computer-agent`:
//! `login` asks for the token without echoing it and keeps it 0600; `exec -it python3` is an
//! interactive terminal (type `1+1`, see `2`); `cp` up and down keeps every byte (checked here
//! and by SHA-256 on both sides); a `computers create` whose answer is lost exits 75 and keeps
//! its command key, and running it again sends the same key, so there is one Computer, not two.
//! A Computer's name does where its id does; a name no Computer has, or two have, is an error.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use computerd_tests::ctl::Pty;
use computerd_tests::ctl::ctl_bin;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

const T: Duration = Duration::from_secs(60);

fn ctl(home: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(ctl_bin());
    cmd.env("COMPUTERCTL_HOME", home).env_remove("COMPUTERD_URL").env_remove("COMPUTERD_TOKEN").args(args);
    cmd
}

/// A TCP proxy that passes requests on and, while `lose` is set, drops the first answer: the
/// connection closes when the node starts answering, after it has acted.
async fn lossy_proxy(target: String, lose: Arc<AtomicBool>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else { continue };
            let lose = lose.clone();
            tokio::spawn(async move {
                let (mut ci, mut co) = inbound.into_split();
                let (mut si, mut so) = outbound.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut ci, &mut so).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = si.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    if lose.swap(false, Ordering::SeqCst) {
                        break; // the answer is lost: close without writing it
                    }
                    if co.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    format!("http://{addr}")
}

// Multi-threaded: the proxy serves while the test waits on the CLI in blocking calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_login_exec_it_cp_and_a_lost_create_answer() {
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "ctl").await;
    let state = c.dir.path().join("agent");
    let log = c.dir.path().join("agent.log");
    let _agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &[]);
    wait_state(&c, &id, "running").await;
    let home = c.dir.path().join("ctl-home");
    let url = c.url(1, "");
    let bin = ctl_bin();
    assert!(bin.exists(), "{}", bin.display());

    // login: the token is asked for on the terminal, not echoed, checked, and kept 0600.
    let mut t = Pty::spawn(ctl(&home, &["login", "--url", &url]));
    t.expect("Token: ", T);
    t.send(format!("{}\r", c.token).as_bytes());
    t.expect("logged in to", T);
    assert_eq!(t.wait(T), 0);
    assert!(!t.screen().contains(&c.token), "the token was echoed: {}", t.screen());
    let config = home.join("config.json");
    let mode = std::fs::metadata(&config).expect("config kept").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the config holds a secret");
    let kept: Value = serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("JSON");
    assert_eq!((kept["url"].as_str(), kept["token"].as_str()), (Some(url.as_str()), Some(c.token.as_str())));
    // A wrong token is refused and not kept.
    let mut t = Pty::spawn(ctl(&home.join("other"), &["login", "--url", &url]));
    t.expect("Token: ", T);
    t.send(b"cdt_not_a_token\r");
    t.expect("not accepted", T);
    assert_eq!(t.wait(T), 1);
    assert!(!home.join("other/config.json").exists());

    // exec -it: an interactive Python on a terminal.
    let mut t = Pty::spawn(ctl(&home, &["exec", "-it", &id, "python3"]));
    t.expect(">>> ", T);
    t.send(b"1+1\r");
    let shown = t.expect(">>> ", T);
    assert!(shown.contains("1+1\r\n2\r\n"), "the answer 2 on its own line: {shown:?}");
    t.send(b"import sys; sys.exit(7)\r");
    assert_eq!(t.wait(T), 7, "exec exits with the command's status: {}", t.screen());

    // exec without a terminal: output streamed, status passed on.
    let out = ctl(&home, &["exec", &id, "echo out; echo err >&2; exit 3"]).output().expect("run");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\nerr\n", "a session merges stdout and stderr");

    // Issue 39: a Computer's name does where its id does (here the paired Computer `local`).
    let out = ctl(&home, &["exec", "local", "echo by-name"]).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "by-name\n");
    let out = ctl(&home, &["--json", "computers", "get", "local"]).output().expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["id"], id.as_str(), "{v}");
    // A name no Computer has: a clear error, a non-zero exit, nothing run.
    let out = ctl(&home, &["exec", "no-such-box", "echo ran"]).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no Computer named \"no-such-box\""), "{err}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));

    // cp up and down, 3 MiB of random bytes, through a terminal (progress bars on it).
    let data: Vec<u8> = (0..3 << 20).map(|_| rand::random::<u8>()).collect();
    let local = c.dir.path().join("up.bin");
    std::fs::write(&local, &data).expect("write");
    let remote_dir = c.dir.path().join("in-the-computer");
    std::fs::create_dir_all(&remote_dir).expect("dir");
    let remote = format!("{id}:{}/copied.bin", remote_dir.display());
    let mut t = Pty::spawn(ctl(&home, &["cp", local.to_str().expect("utf8"), &remote]));
    assert_eq!(t.wait(T), 0, "{}", t.screen());
    assert_eq!(std::fs::read(remote_dir.join("copied.bin")).expect("copied up"), data, "up: byte equality");
    let back = c.dir.path().join("down.bin");
    let mut t = Pty::spawn(ctl(&home, &["cp", &remote, back.to_str().expect("utf8")]));
    assert_eq!(t.wait(T), 0, "{}", t.screen());
    assert_eq!(std::fs::read(&back).expect("copied down"), data, "down: byte equality");
    // By name too (`NAME:PATH`, as scp names a host).
    let by_name = c.dir.path().join("down-by-name.bin");
    let from = format!("local:{}/copied.bin", remote_dir.display());
    let out = ctl(&home, &["cp", &from, by_name.to_str().expect("utf8")]).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&by_name).expect("copied down by name"), data, "down by name: byte equality");
    // Issue 39: into a directory, as `cp` does (with and without the trailing slash).
    for target in [format!("{id}:{}/", remote_dir.display()), format!("{id}:{}", remote_dir.display())] {
        std::fs::remove_file(remote_dir.join("up.bin")).ok();
        let out = ctl(&home, &["cp", local.to_str().expect("utf8"), &target]).output().expect("run");
        assert!(out.status.success(), "{target}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read(remote_dir.join("up.bin")).expect("copied into the directory"), data, "{target}");
    }
    let out = ctl(&home, &["cp", &format!("{id}:{}/missing", remote_dir.display()), "x"]).output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("404"), "{}", String::from_utf8_lossy(&out.stderr));

    // Issue 39: the providers are listed (their ids are what `computers create --provider` takes).
    let body = json!({"kind": "e2b", "name": "elsewhere", "config": {"serverUrl": url, "endpoint": "http://127.0.0.1:9", "apiKey": "k"}});
    let (s, p) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    assert_eq!(s, 201, "{p}");
    let out = ctl(&home, &["--json", "providers"]).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(v["providers"].as_array().expect("providers").iter().any(|x| x["id"] == p["id"]), "{v}");
    let out = ctl(&home, &["providers"]).output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(p["id"].as_str().expect("id")) && text.contains("elsewhere"), "{text}");

    // The session list shows what exec ran.
    let out = ctl(&home, &["--json", "sessions", "ls", &id]).output().expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let commands: Vec<&str> =
        v["sessions"].as_array().expect("sessions").iter().filter_map(|s| s["command"].as_str()).collect();
    assert!(commands.contains(&"python3"), "{v}");

    // A create whose answer is lost: exit 75, the key kept; the same command again sends the
    // same key, so one Computer is created; once answered, the next create gets a new key.
    let lose = Arc::new(AtomicBool::new(true));
    let via = lossy_proxy(url.trim_start_matches("http://").to_string(), lose.clone()).await;
    let create = ["--json", "computers", "create", "--paired", "--name", "lost-answer"];
    let out = ctl(&home, &create).env("COMPUTERD_URL", &via).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(!lose.load(Ordering::SeqCst), "the proxy dropped an answer");
    let key = err.split("same key (").nth(1).and_then(|s| s.split(')').next()).expect("the key is named").to_string();
    assert!(key.starts_with("ck_"), "{err}");
    let named =
        |v: &Value| v["computers"].as_array().expect("list").iter().filter(|c| c["name"] == "lost-answer").count();
    let (_, v) = c.call(Method::GET, 1, "/v1/computers", &c.token, None).await;
    assert_eq!(named(&v), 1, "the lost answer's command was taken: {v}");
    let out = ctl(&home, &create).env("COMPUTERD_URL", &via).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sending again"), "{}", String::from_utf8_lossy(&out.stderr));
    let receipt: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(receipt["commandKey"], key.as_str(), "{receipt}");
    let (_, v) = c.call(Method::GET, 1, "/v1/computers", &c.token, None).await;
    assert_eq!(named(&v), 1, "the resend started nothing new: {v}");
    let out = ctl(&home, &create).output().expect("run");
    let again: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_ne!(again["commandKey"], key.as_str(), "an answered command is not kept");
    let (_, v) = c.call(Method::GET, 1, "/v1/computers", &c.token, None).await;
    assert_eq!(named(&v), 2, "a new command is a new Computer: {v}");

    // Issue 39: a name two Computers share stands for neither: the error names both ids.
    let twins: Vec<&str> = v["computers"]
        .as_array()
        .expect("list")
        .iter()
        .filter(|c| c["name"] == "lost-answer")
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(twins.len(), 2, "{v}");
    let out = ctl(&home, &["computers", "rm", "lost-answer"]).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("several Computers are named \"lost-answer\"") && err.contains("use an id"), "{err}");
    assert!(twins.iter().all(|t| err.contains(t)), "both ids are named: {err}");
    let (_, v) = c.call(Method::GET, 1, "/v1/computers", &c.token, None).await;
    assert_eq!(named(&v), 2, "nothing was deleted: {v}");

    // Issue 40: recreate is a docker sandbox's; an own machine's is refused with the reason.
    let out = ctl(&home, &["computers", "recreate", twins[0]]).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("an own machine is not recreated"), "{err}");
}

/// Issue 41: `computerctl secrets` puts a value asked for on the terminal without echoing it
/// (or read from stdin), lists metadata only, names secrets in a bot's grant (an unknown name
/// is refused), and deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i41_secrets_from_the_terminal_never_echoed() {
    let c = TestCluster::start(1).await;
    let (id, _code) = paired_computer(&c, "vaulted").await;
    let home = c.dir.path().join("ctl-home");
    let mut t = Pty::spawn(ctl(&home, &["login", "--url", &c.url(1, "")]));
    t.expect("Token: ", T);
    t.send(format!("{}\r", c.token).as_bytes());
    t.expect("logged in to", T);
    assert_eq!(t.wait(T), 0);

    let mut t = Pty::spawn(ctl(&home, &["secrets", "put", "site-a", "--origin", "https://site-a.example"]));
    t.expect("Value of site-a: ", T);
    t.send(b"typed-but-never-shown\r");
    t.expect("kept, sealed", T);
    assert_eq!(t.wait(T), 0);
    assert!(!t.screen().contains("typed-but-never-shown"), "the value was echoed: {}", t.screen());
    let mut put = ctl(
        &home,
        &["secrets", "put", "otp", "--origin", "https://site-a.example", "--kind", "totp", "--value-file", "-"],
    );
    let mut child =
        put.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().expect("spawn");
    use std::io::Write;
    child.stdin.take().expect("stdin").write_all(b"GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ\n").expect("write");
    assert!(child.wait_with_output().expect("wait").status.success());

    let out = ctl(&home, &["secrets", "ls"]).output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("site-a") && text.contains("password") && text.contains("otp"), "{text}");
    assert!(!text.contains("typed-but-never-shown") && !text.contains("GEZDGNBV"), "metadata only: {text}");

    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "filler"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let out = ctl(&home, &["secrets", "grant", &id, &bot, "site-a", "nope"]).output().expect("run");
    assert_ne!(out.status.code(), Some(0), "an unknown secret is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = ctl(&home, &["secrets", "grant", &id, &bot, "site-a", "otp"]).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, g) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/bots/{bot}"), &c.token, None).await;
    assert_eq!(g["secrets"], json!(["otp", "site-a"]), "{g}");
    let out = ctl(&home, &["secrets", "rm", "otp"]).output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let (_, v) = c.call(Method::GET, 1, "/v1/secrets", &c.token, None).await;
    assert_eq!(v["secrets"].as_array().map(Vec::len), Some(1), "{v}");
}
