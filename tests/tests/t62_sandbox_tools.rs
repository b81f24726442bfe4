//! The default sandbox image has the tools agents reach for (issue 39), used the way an agent
//! would, as `user` in one real sandbox, with no network past the sandbox's own loopback: git,
//! a Python package index served by `python3 -m http.server` and `pip install --user` from it
//! (its console script lands on PATH), a venv, `npm install` of a local package, gcc, curl,
//! setsid, rg, jq, sqlite3 and the C.UTF-8 locale. And the image keeps the hardening: a user
//! session has no capabilities and no-new-privileges, and no file is setuid or setgid.

use std::time::Duration;

use base64::Engine;
use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::docker_provider;
use computerd_tests::wait::wait_for;
use reqwest::Method;
use serde_json::json;
use sha2::Digest;

/// Runs `command` to its end (as `user`, or as `root`) and answers its exit code and output
/// (waiting 20 s a call: less than the test client's 30 s timeout).
async fn run(c: &TestCluster, id: &str, command: &str, user: Option<&str>) -> (i64, String) {
    let mut body = json!({"command": command, "yieldTimeMs": 20_000});
    if let Some(u) = user {
        body["user"] = json!(u);
    }
    let (s, mut v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await;
    assert_eq!(s, 200, "{command}: {v}");
    let sid = v["sessionId"].as_str().expect("session id").to_string();
    let mut output = v["output"].as_str().expect("output").to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while v["running"] == json!(true) {
        assert!(tokio::time::Instant::now() < deadline, "{command} still runs after 3 minutes: {output}");
        let offset = v["offset"].as_u64().expect("offset");
        let path = format!("/v1/computers/{id}/sessions/{sid}?fromOffset={offset}&yieldTimeMs=20000");
        let (s, next) = c.call(Method::GET, 1, &path, &c.token, None).await;
        assert_eq!(s, 200, "{command}: {next}");
        output.push_str(next["output"].as_str().expect("output"));
        v = next;
    }
    assert_eq!(v["truncated"], json!(false), "{command}: {v}");
    (v["exitCode"].as_i64().unwrap_or_else(|| panic!("{command} ended without an exit code: {v}")), output)
}

/// The output of a command that must succeed as `user`.
async fn ok(c: &TestCluster, id: &str, command: &str) -> String {
    let (code, out) = run(c, id, command, None).await;
    assert_eq!(code, 0, "{command}: {out}");
    out
}

/// Writes a text file in the sandbox (a path relative to /workspace), as `user`.
async fn put(c: &TestCluster, id: &str, path: &str, content: &str) {
    let (s, v) = c
        .call(
            Method::PUT,
            1,
            &format!("/v1/computers/{id}/files?path={path}"),
            &c.token,
            Some(json!({"content": content})),
        )
        .await;
    assert_eq!(s, 200, "{path}: {v}");
}

/// The files of a tiny pure-Python wheel `tinypkg` 1.0 (with a console script), RECORD
/// included, as (path in the wheel, content).
fn tiny_wheel() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = vec![
        (
            "tinypkg/__init__.py".into(),
            "GREETING = \"hello from tinypkg\"\n\n\ndef main():\n    print(GREETING)\n".into(),
        ),
        ("tinypkg-1.0.dist-info/METADATA".into(), "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n".into()),
        (
            "tinypkg-1.0.dist-info/WHEEL".into(),
            "Wheel-Version: 1.0\nGenerator: computerd-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".into(),
        ),
        ("tinypkg-1.0.dist-info/entry_points.txt".into(), "[console_scripts]\ntinypkg-hello = tinypkg:main\n".into()),
    ];
    let mut record = String::new();
    for (path, content) in &files {
        let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(content.as_bytes()));
        record.push_str(&format!("{path},sha256={hash},{}\n", content.len()));
    }
    record.push_str("tinypkg-1.0.dist-info/RECORD,,\n");
    files.push(("tinypkg-1.0.dist-info/RECORD".into(), record));
    files
}

#[tokio::test]
async fn t10_the_tools_agents_reach_for_work_as_user_and_the_hardening_stays() {
    let c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "tools", "name": "tools", "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let id = id.as_str();
    assert_eq!(ok(&c, id, "id -un; pwd").await, "user\n/workspace\n");

    // git: a repository and a commit.
    let git = ok(
        &c,
        id,
        "mkdir repo && cd repo && git -c init.defaultBranch=main init -q && \
         git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x 2>&1 && \
         git log --format='%s %an <%ae>' && git rev-parse --abbrev-ref HEAD",
    )
    .await;
    assert_eq!(git, "x a <a@b>\nmain\n");

    // A package index on the sandbox's loopback (the test's sandboxes share the host's network,
    // so a free port of the host is one of the sandbox's).
    for (path, content) in tiny_wheel() {
        put(&c, id, &format!("wheel/{path}"), &content).await;
    }
    put(&c, id, "index/hello.txt", "hello over http\n").await;
    put(
        &c,
        id,
        "index/simple/tinypkg/index.html",
        "<!DOCTYPE html>\n<html><body><a href=\"/tinypkg-1.0-py3-none-any.whl\">tinypkg-1.0-py3-none-any.whl</a></body></html>\n",
    )
    .await;
    let zip = ok(
        &c,
        id,
        "cd wheel && python3 -m zipfile -c ../index/tinypkg-1.0-py3-none-any.whl tinypkg tinypkg-1.0.dist-info && \
         python3 -m zipfile -l ../index/tinypkg-1.0-py3-none-any.whl | awk 'NR > 1 { print $1 }' | sort",
    )
    .await;
    assert_eq!(
        zip,
        "tinypkg-1.0.dist-info/\ntinypkg-1.0.dist-info/METADATA\ntinypkg-1.0.dist-info/RECORD\n\
         tinypkg-1.0.dist-info/WHEEL\ntinypkg-1.0.dist-info/entry_points.txt\ntinypkg/\ntinypkg/__init__.py\n"
    );
    let port = computerd_tests::free_port();
    let serve = json!({
        "command": format!("exec python3 -m http.server {port} --bind 127.0.0.1 --directory /workspace/index 2>/workspace/server.err"),
        "yieldTimeMs": 300,
    });
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(serve)).await;
    assert_eq!((s, &v["running"]), (200, &json!(true)), "{v}");
    wait_for("the sandbox's http.server to answer", Duration::from_secs(30), || {
        let url = format!("http://127.0.0.1:{port}/hello.txt");
        let http = c.http.clone();
        async move {
            let r = http.get(url).send().await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;

    // curl, from inside, of that server.
    assert_eq!(ok(&c, id, &format!("curl -fsS http://127.0.0.1:{port}/hello.txt")).await, "hello over http\n");

    // pip install --user from the index (quiet: no "not on PATH" warning either), the import,
    // and the console script, found on PATH in ~/.local/bin.
    let pip = ok(
        &c,
        id,
        &format!(
            "pip install -q --user --no-cache-dir --disable-pip-version-check \
             --index-url http://127.0.0.1:{port}/simple/ tinypkg 2>&1"
        ),
    )
    .await;
    assert_eq!(pip, "");
    let imported = ok(&c, id, "python3 -c 'import tinypkg; print(tinypkg.GREETING, tinypkg.__file__)' 2>&1").await;
    assert_eq!(imported, "hello from tinypkg /home/user/.local/lib/python3.11/site-packages/tinypkg/__init__.py\n");
    assert_eq!(
        ok(&c, id, "tinypkg-hello; command -v tinypkg-hello").await,
        "hello from tinypkg\n/home/user/.local/bin/tinypkg-hello\n"
    );
    // A venv, with pip in it (python3-venv's ensurepip).
    let venv =
        ok(&c, id, "python3 -m venv /tmp/venv 2>&1 && /tmp/venv/bin/python -m pip --version | cut -d ' ' -f 1,4").await;
    assert_eq!(venv, "pip /tmp/venv/lib/python3.11/site-packages/pip\n");

    // npm install of a local package (npm 9 copies it into node_modules), without a registry.
    put(&c, id, "localpkg/package.json", r#"{"name": "localpkg", "version": "1.0.0", "main": "index.js"}"#).await;
    put(&c, id, "localpkg/index.js", "module.exports = () => \"hi from localpkg\";\n").await;
    put(&c, id, "app/package.json", r#"{"name": "app", "version": "1.0.0", "private": true}"#).await;
    let npm = ok(
        &c,
        id,
        "cd app && npm install --offline --no-audit --no-fund --silent ../localpkg 2>&1; echo npm=$?; \
         node -e 'console.log(require(\"localpkg\")())' 2>&1; cat node_modules/localpkg/index.js; \
         node -p 'require(\"./package.json\").dependencies.localpkg'",
    )
    .await;
    assert_eq!(npm, "npm=0\nhi from localpkg\nmodule.exports = () => \"hi from localpkg\";\nfile:../localpkg\n");

    // gcc (build-essential) of a hello world, run.
    put(&c, id, "hello.c", "#include <stdio.h>\nint main(void) { puts(\"hello, world\"); return 0; }\n").await;
    assert_eq!(ok(&c, id, "gcc -O2 -Wall -o hello hello.c 2>&1 && ./hello").await, "hello, world\n");

    // setsid (util-linux): the child leads a session of its own.
    let setsid = ok(&c, id, r#"setsid -w sh -c 'test "$(ps -o sid= -p $$ | tr -d " ")" = "$$" && echo leader'"#).await;
    assert_eq!(setsid, "leader\n");
    // rg (given a path: with none, it reads stdin, which a session keeps open), jq, sqlite3.
    put(&c, id, "rg/a.txt", "hay\na needle\nhay\n").await;
    put(&c, id, "rg/b.txt", "only hay\n").await;
    assert_eq!(ok(&c, id, "cd rg && rg -n --no-heading needle .").await, "./a.txt:2:a needle\n");
    assert_eq!(ok(&c, id, r#"echo '{"a": [1, 2, 3]}' | jq -c '.a | map(. * 2)'"#).await, "[2,4,6]\n");
    let sql = ok(&c, id, "sqlite3 :memory: 'create table t(x); insert into t values (41); select x + 1 from t;'").await;
    assert_eq!(sql, "42\n");

    // The C.UTF-8 locale.
    assert_eq!(ok(&c, id, r#"python3 -c 'print("€→", len("€→"))'"#).await, "€→ 2\n");
    let mut locale = String::from("LANG=C.UTF-8\nLANGUAGE=\n");
    for cat in [
        "CTYPE",
        "NUMERIC",
        "TIME",
        "COLLATE",
        "MONETARY",
        "MESSAGES",
        "PAPER",
        "NAME",
        "ADDRESS",
        "TELEPHONE",
        "MEASUREMENT",
        "IDENTIFICATION",
    ] {
        locale.push_str(&format!("LC_{cat}=\"C.UTF-8\"\n"));
    }
    locale.push_str("LC_ALL=\n");
    assert_eq!(ok(&c, id, "locale 2>&1").await, locale);

    // The hardening: no capabilities and no-new-privileges for a user session, and no setuid
    // or setgid file anywhere in the image (looked for as root, who may read every directory).
    let status = ok(&c, id, "grep -E '^(CapPrm|CapEff|NoNewPrivs):' /proc/self/status").await;
    assert_eq!(status, "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\n");
    let (code, suid) = run(&c, id, "find / -xdev -perm /6000 -type f 2>&1", Some("root")).await;
    assert_eq!((code, suid.as_str()), (0, ""), "setuid/setgid files in the image");
    // (A check that can fail: root does find a file it made setuid.)
    let (code, made) =
        run(&c, id, "install -m 4755 /bin/true /tmp/x && find / -xdev -perm /6000 -type f", Some("root")).await;
    assert_eq!((code, made.as_str()), (0, "/tmp/x\n"));
    let (code, _) = run(&c, id, "rm /tmp/x", Some("root")).await;
    assert_eq!(code, 0);

    // The server saw the index's requests and no error of its own.
    let log =
        ok(&c, id, "grep -c 'GET /simple/tinypkg/ HTTP/1.1\" 200' server.err; grep -ci traceback server.err; true")
            .await;
    assert_eq!(log, "1\n0\n");
}
