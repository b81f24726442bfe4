//! The docs test: README.md's five-minute tour ("## Five minutes with it"), run as written against
//! a real `computerd dev` with the local Docker engine. The commands are read from README.md when
//! the test runs (its indented shell lines, up to the Python program, which t97_mcp runs): lines
//! ending in `\` are joined and a trailing `# comment` dropped. What a reader fills in by hand is
//! filled in from the answers of the earlier commands (the node's URL and data dir, the provider's
//! id, the port address's label, the browser session's id; `$ID` and `$TOKEN` as the shell
//! variables the reader sets), and a placeholder left over (`…`, `<…>`) fails the test. Each
//! command runs with `bash -c` in a working directory of its own, with the built `computerctl` on
//! PATH and HOME a fresh directory, and each step's effect is checked: exec prints the kernel and
//! 42, the listing shows note.txt, the port address serves it, the screenshot is a 1280x800 PNG,
//! and the browser reads the sandbox's own directory listing.
//!
//! `COMPUTERD_README=PATH` runs the tour of another copy of the README (to see the test fail on a
//! broken command).

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use computerd_tests::ctl::ctl_bin;
use computerd_tests::dev::Dev;
use computerd_tests::docker::Containers;
use computerd_tests::docker::ensure_desktop_image;
use computerd_tests::wait_for;
use serde_json::Value;

const SECTION: &str = "## Five minutes with it";

/// How long one command may take (a sandbox with a desktop starts within this).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// The README to read: `COMPUTERD_README`, else the repository's.
fn readme() -> (PathBuf, String) {
    let path = std::env::var_os("COMPUTERD_README")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

/// The tour's text: from its heading to its Python program (or the next heading).
fn section(text: &str) -> &str {
    let start = text
        .lines()
        .scan(0, |at, l| {
            let here = *at;
            *at += l.len() + 1;
            Some((here, l))
        })
        .find(|(_, l)| l.trim_end() == SECTION)
        .map(|(at, _)| at + SECTION.len())
        .unwrap_or_else(|| panic!("README.md has no section {SECTION:?}"));
    let rest = &text[start..];
    let end = [rest.find("```python"), rest.find("\n## ")].into_iter().flatten().min().unwrap_or(rest.len());
    &rest[..end]
}

/// `line` without a trailing shell comment: a `#` at the start of a word, outside quotes.
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut escaped, mut word_start) = (false, false, false, true);
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            word_start = false;
            continue;
        }
        match c {
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && word_start => return line[..i].trim_end(),
            _ => {}
        }
        word_start = c.is_whitespace();
    }
    line.trim_end()
}

/// The section's commands: its indented lines, a line ending in `\` joined with the next, each
/// without its trailing comment.
fn commands(section: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in section.lines() {
        let indented = line.starts_with("    ") || line.starts_with('\t');
        if !indented {
            assert!(cur.is_empty(), "a command of the tour ends in `\\` with no line after it: {cur}");
            continue;
        }
        let l = line.trim();
        if let Some(head) = l.strip_suffix('\\') {
            cur.push_str(head.trim_end());
            cur.push(' ');
            continue;
        }
        cur.push_str(l);
        let command = strip_comment(&cur).to_string();
        if !command.is_empty() {
            out.push(command);
        }
        cur.clear();
    }
    assert!(cur.is_empty(), "a command of the tour ends in `\\` with no line after it: {cur}");
    out
}

/// What the test knows so far, to fill in the placeholders a reader fills in by hand.
#[derive(Debug, Default)]
struct Known {
    /// `http://127.0.0.1:<port>`.
    base: String,
    port: u16,
    data: String,
    token: String,
    provider: Option<String>,
    id: Option<String>,
    label: Option<String>,
    session: Option<String>,
}

impl Known {
    /// `command` with what is known filled in, or why not (a placeholder left over).
    fn fill(&self, command: &str) -> Result<String, String> {
        let mut c = command
            .replace("http://127.0.0.1:8080", &self.base)
            .replace(".localhost:8080", &format!(".localhost:{}", self.port))
            .replace("computerd-data", &self.data);
        for (placeholder, value) in [("cpp_…", &self.provider), ("<label>", &self.label), ("b-…", &self.session)] {
            if let Some(v) = value {
                c = c.replace(placeholder, v);
            }
        }
        let angle = c.find('<').and_then(|at| {
            let rest = &c[at + 1..];
            let end = rest.find('>')?;
            let name = &rest[..end];
            (!name.is_empty() && name.chars().all(|ch| ch.is_alphanumeric() || ch == '_' || ch == '-' || ch == '…'))
                .then(|| format!("<{name}>"))
        });
        if let Some(left) = c.contains('…').then(|| "…".to_string()).or(angle) {
            return Err(format!(
                "README's tour command\n    {command}\nstill holds the placeholder {left:?} once the test filled in what the \
                 earlier commands answered:\n    {c}\n(the tour must show where a reader gets each value it leaves out; known: \
                 provider {:?}, label {:?}, browser session {:?})",
                self.provider, self.label, self.session
            ));
        }
        Ok(c)
    }
}

/// The output of a command (stdout, then stderr).
struct Ran {
    ok: bool,
    stdout: String,
    all: String,
}

/// A tour in its working directory, with its HOME and PATH.
struct Tour {
    work: tempfile::TempDir,
    home: tempfile::TempDir,
    path: String,
}

impl Tour {
    fn new() -> Tour {
        let ctl = ctl_bin();
        let dir = ctl.parent().expect("computerctl's directory").display().to_string();
        let path = format!("{dir}:{}", std::env::var("PATH").unwrap_or_default());
        Tour { work: tempfile::tempdir().expect("work dir"), home: tempfile::tempdir().expect("home"), path }
    }

    /// Runs `command` (already filled in) with `bash -c`, `$TOKEN` and `$ID` set when known.
    async fn run(&self, known: &Known, command: &str) -> Ran {
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-c")
            .arg(format!("set -eu -o pipefail\n{command}"))
            .current_dir(self.work.path())
            .env("PATH", &self.path)
            .env("HOME", self.home.path())
            .env_remove("COMPUTERCTL_HOME")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("COMPUTERD_URL")
            .env_remove("COMPUTERD_TOKEN")
            .env_remove("TOKEN")
            .env_remove("ID")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        cmd.env("TOKEN", &known.token);
        if let Some(id) = &known.id {
            cmd.env("ID", id);
        }
        // A command that does not end is a failure like any other (the caller may clean up first).
        let Ok(out) = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output()).await else {
            let all = format!("(it did not end within {COMMAND_TIMEOUT:?})");
            return Ran { ok: false, stdout: String::new(), all };
        };
        let out = out.expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let all = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{}", all.trim_end());
        Ran { ok: out.status.success(), stdout, all }
    }

    /// Runs `command` and requires it to succeed.
    async fn must(&self, known: &Known, written: &str, command: &str) -> Ran {
        let ran = self.run(known, command).await;
        assert!(ran.ok, "README's tour command failed:\n    {written}\nrun as\n    {command}\nit said:\n{}", ran.all);
        ran
    }
}

/// The value after `flag` (`-o shot.png`) in a command, if any.
fn flag_value<'a>(command: &'a str, flags: &[&str]) -> Option<&'a str> {
    let words: Vec<&str> = command.split_whitespace().collect();
    words.windows(2).find(|w| flags.contains(&w[0])).map(|w| w[1])
}

#[tokio::test]
async fn t10_the_readme_tour_runs_as_written_against_dev() {
    let (readme_path, text) = readme();
    let tour_commands = commands(section(&text));
    assert!(!tour_commands.is_empty(), "{}: the tour has no commands", readme_path.display());

    ensure_desktop_image();
    let dev = Dev::start().await;
    assert!(!dev.docker_line.contains("off"), "Docker is here, so dev serves sandboxes: {}", dev.docker_line);
    let port: u16 = dev.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("dev's port");
    let mut known = Known {
        base: dev.base.clone(),
        port,
        data: dev.data().display().to_string(),
        token: dev.token.clone(),
        ..Known::default()
    };
    let mut cleanup = Containers::default();
    let tour = Tour::new();
    // The steps checked; each must be in the tour.
    let mut seen: Vec<&str> = Vec::new();

    for written in &tour_commands {
        let command = known.fill(written).unwrap_or_else(|why| panic!("{why}"));
        eprintln!("tour: {command}");
        let has = |s: &str| command.contains(s);
        if command.starts_with("computerctl login") {
            let ran = tour.must(&known, written, &command).await;
            assert!(ran.stdout.contains(&format!("logged in to {}", dev.base)), "{}", ran.all);
            seen.push("login");
        } else if command.starts_with("computerctl providers") {
            let ran = tour.must(&known, written, &command).await;
            let line = ran.stdout.lines().find(|l| l.ends_with("local docker"));
            let line =
                line.unwrap_or_else(|| panic!("`computerctl providers` lists no \"local docker\":\n{}", ran.all));
            let id = line.split_whitespace().next().unwrap_or_default();
            assert!(id.starts_with("cpp_"), "the provider's id comes first: {line}");
            known.provider = Some(id.to_string());
            seen.push("providers");
        } else if has("computers create") {
            let ran = tour.run(&known, &command).await;
            // The reader's way to the sandbox's id: `computerctl computers ls` (as the tour says).
            let ls = tour.must(&known, "computerctl computers ls", "computerctl computers ls").await;
            let mut ids: Vec<String> = ls
                .stdout
                .lines()
                .filter(|l| !l.trim_end().ends_with(" local"))
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .filter(|id| id.starts_with("cmp_"))
                .collect();
            let mut states = Vec::new();
            for id in &ids {
                cleanup.track(id);
                states.push(dev.call(reqwest::Method::GET, &format!("/v1/computers/{id}"), None).await.1);
            }
            assert!(
                ran.ok,
                "README's tour command failed:\n    {written}\nrun as\n    {command}\nit said:\n{}\nthe sandboxes: {states:#?}",
                ran.all
            );
            assert!(ran.stdout.contains("succeeded"), "{}", ran.all);
            assert_eq!(ids.len(), 1, "one sandbox besides `local`: {}", ls.stdout);
            let id = ids.pop().expect("the sandbox");
            let (s, c) = dev.call(reqwest::Method::GET, &format!("/v1/computers/{id}"), None).await;
            assert_eq!((s, c["state"].as_str()), (200, Some("running")), "--wait waited for it to run: {c}");
            known.id = Some(id);
            seen.push("create");
        } else if has("http.server") {
            tour.must(&known, written, &command).await;
            seen.push("serve");
        } else if command.starts_with("computerctl exec") {
            let ran = tour.must(&known, written, &command).await;
            let lines: Vec<&str> = ran.stdout.lines().map(str::trim_end).collect();
            assert!(lines.iter().any(|l| l.starts_with("Linux ")), "uname -a printed the kernel:\n{}", ran.all);
            assert!(lines.contains(&"42"), "python3 printed 42:\n{}", ran.all);
            seen.push("exec");
        } else if has("computerctl files") || has("computerctl cp") {
            let ran = tour.must(&known, written, &command).await;
            let listed = ran.stdout.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w == ["file", "6", "note.txt"]
            });
            assert!(listed, "the listing shows note.txt (6 bytes):\n{}", ran.all);
            seen.push("files");
        } else if has("ports open") {
            let ran = tour.must(&known, written, &command).await;
            let prefix = "http://8000-";
            let suffix = format!(".localhost:{port}/");
            let url = ran.stdout.split_whitespace().find(|w| w.starts_with(prefix) && w.ends_with(&suffix));
            let url = url.unwrap_or_else(|| panic!("ports open printed no {prefix}<label>{suffix}:\n{}", ran.all));
            let label = &url[prefix.len()..url.len() - suffix.len()];
            assert!(!label.is_empty(), "{url}");
            known.label = Some(label.to_string());
            seen.push("ports");
        } else if command.starts_with("curl") && has(".localhost:") {
            // The server started in the background may need a moment: ask until it answers (each
            // answer is printed).
            wait_for("the port address to serve note.txt (`hello`)", Duration::from_secs(60), || {
                let (tour, known, command) = (&tour, &known, &command);
                async move {
                    let ran = tour.run(known, command).await;
                    (ran.ok && ran.stdout == "hello\n").then_some(())
                }
            })
            .await;
            seen.push("port address");
        } else if has("desktop screenshot") {
            let ran = tour.must(&known, written, &command).await;
            let file = flag_value(&command, &["-o", "--output"]).unwrap_or("screenshot.png");
            let bytes = std::fs::read(tour.work.path().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{file} is a PNG");
            let img = image::load_from_memory(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!((img.width(), img.height()), (1280, 800), "the desktop's size");
            assert!(ran.stdout.contains("(1280x800, "), "{}", ran.all);
            seen.push("screenshot");
        } else if has("/browser/sessions") {
            let ran = tour.must(&known, written, &command).await;
            let v: Value = serde_json::from_str(&ran.stdout)
                .unwrap_or_else(|e| panic!("the browser's answer is not JSON ({e}):\n{}", ran.all));
            let session = v["session"].as_str().unwrap_or_else(|| panic!("no session id: {v}"));
            assert!(session.starts_with("b-"), "{v}");
            known.session = Some(session.to_string());
            seen.push("browser");
        } else if has("/browser/snapshot") {
            // The page is the sandbox's own server's listing of /workspace.
            let snapshot = wait_for("a snapshot of the sandbox's directory listing", Duration::from_secs(60), || {
                let (tour, known, command) = (&tour, &known, &command);
                async move {
                    let ran = tour.must(known, written, command).await;
                    let v: Value = serde_json::from_str(&ran.stdout)
                        .unwrap_or_else(|e| panic!("the snapshot is not JSON ({e}):\n{}", ran.all));
                    v["text"].as_str().is_some_and(|t| t.contains("note.txt")).then_some(v)
                }
            })
            .await;
            assert!(snapshot["text"].as_str().is_some_and(|t| t.contains("[ref=")), "refs to act on: {snapshot}");
            seen.push("snapshot");
        } else {
            // A command this test does not know yet still has to run.
            tour.must(&known, written, &command).await;
        }
    }
    let steps = [
        "login",
        "providers",
        "create",
        "exec",
        "files",
        "serve",
        "ports",
        "port address",
        "screenshot",
        "browser",
        "snapshot",
    ];
    let missing: Vec<&str> = steps.iter().copied().filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "{}: the tour no longer has the steps {missing:?} (this test checks each; change it with the README); it ran:\n{}",
        readme_path.display(),
        tour_commands.join("\n")
    );
    drop(cleanup);
}

#[test]
fn t20_the_tour_is_read_as_a_shell_reads_it() {
    let text = "## Five minutes with it\n\nSay:\n\n    a --x 1   # a comment\n    echo '# not' \"#\" b#c \\\n        next # gone\n\n```python\n    not a command\n```\n";
    assert_eq!(commands(section(text)), vec!["a --x 1".to_string(), "echo '# not' \"#\" b#c next".to_string()]);
    let known = Known { base: "http://127.0.0.1:5".into(), port: 5, data: "/d".into(), ..Known::default() };
    assert_eq!(
        known.fill(
            "c login --url http://127.0.0.1:8080 --token-file computerd-data/t; curl http://8000-x.localhost:8080/"
        ),
        Ok("c login --url http://127.0.0.1:5 --token-file /d/t; curl http://8000-x.localhost:5/".to_string())
    );
    for left in ["c --provider cpp_…", "curl http://8000-<label>.localhost:8080/"] {
        let why = known.fill(left).expect_err(left);
        assert!(why.contains("still holds the placeholder"), "{why}");
    }
    assert_eq!(known.fill("x >/dev/null 2>&1 <in").as_deref(), Ok("x >/dev/null 2>&1 <in"));
}
