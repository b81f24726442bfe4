//! `computerctl`: the computerd API from a terminal.
//!
//! `login` keeps the URL and token (0600); every other command calls the API with them. Lifecycle
//! commands keep their command key on disk until the answer arrives (`pending`), so a lost
//! answer is resent with the same key by running the same command again. `--json` prints the
//! API's answers as they are, for scripts.

mod config;
mod copy;
mod exec;
mod pending;
mod sse;

use std::io::BufRead;
use std::io::IsTerminal;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use anyhow::bail;
use clap::Parser;
use clap::Subcommand;
use computerd_client::Client;
use computerd_client::NewComputer;
use computerd_client::Source;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// The computerd API from a terminal.
///
/// Wherever a Computer is asked for, its id (`cmp_…`) or its name will do; a name must belong to
/// exactly one of the Computers you may see (else the command names their ids: use one).
#[derive(Parser)]
#[command(name = "computerctl", version, about)]
struct Cli {
    /// Print the API's JSON answers (for scripts).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Keep the cluster's URL and a token (asked for on the terminal, or read from a file or
    /// stdin; never from the command line, where other users could read it).
    Login {
        /// The API's base URL, e.g. `http://127.0.0.1:8080`.
        #[arg(long)]
        url: String,
        /// Read the token from this file (`-` for stdin).
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Computers: list, read, create, pause, resume, delete.
    #[command(subcommand)]
    Computers(Computers),
    /// The providers Computers can be created at (their ids for `computers create --provider`).
    Providers,
    /// Run a command in a Computer (`bash -lc`), streaming its output; exits with its status.
    Exec {
        /// Forward stdin to the command.
        #[arg(short, long)]
        interactive: bool,
        /// Give the command a terminal (with `-i`: this terminal in raw mode, resized with it).
        #[arg(short, long)]
        tty: bool,
        /// `root` to run as root (if allowed), `user` (the default).
        #[arg(long)]
        user: Option<String>,
        /// The working directory.
        #[arg(long)]
        cwd: Option<String>,
        /// `NAME=value`, repeatable.
        #[arg(short, long = "env")]
        env: Vec<String>,
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// One argument: a command line; several: a command and its arguments. Without one,
        /// an interactive `bash`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Copy a file to or from a Computer (`COMPUTER:PATH`, COMPUTER its id `cmp_…` or its name),
    /// checked by SHA-256 both ways. As with scp, a colon before any slash names a Computer: a
    /// local file with a colon in its name is `./a:b`.
    Cp {
        /// `LOCAL` or `COMPUTER:PATH`.
        from: String,
        /// `COMPUTER:PATH` or `LOCAL`.
        to: String,
        /// `root` to read or write as root (if allowed).
        #[arg(long)]
        user: Option<String>,
    },
    /// List a directory in a Computer.
    Files {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// The directory (relative paths start at the workspace).
        #[arg(default_value = ".")]
        path: String,
    },
    /// Shell sessions.
    #[command(subcommand)]
    Sessions(Sessions),
    /// MCP tool packages of a bot.
    #[command(subcommand)]
    Tools(Tools),
    /// A Computer's public port addresses.
    #[command(subcommand)]
    Ports(Ports),
    /// A Computer's desktop.
    #[command(subcommand)]
    Desktop(Desktop),
    /// Your vault: secrets a bot may have typed into a site's fields without seeing them.
    #[command(subcommand)]
    Secrets(Secrets),
}

#[derive(Subcommand)]
enum Secrets {
    /// Your secrets: names, kinds, origins and times (never a value).
    Ls,
    /// Put a secret (made or replaced). The value is asked for on the terminal without echo, or
    /// read from a file or stdin; never from the command line, where other users could read it.
    Put {
        /// Its name (1 to 64 of a-z, 0-9, `.`, `_`, `-`).
        name: String,
        /// An origin whose pages may receive it (`https://site-a.example`); repeatable.
        #[arg(long = "origin", required = true)]
        origins: Vec<String>,
        /// `password` (the default), `totp` (a base32 seed) or `text`.
        #[arg(long)]
        kind: Option<String>,
        /// Read the value from this file (`-` for stdin); its last newline is dropped.
        #[arg(long)]
        value_file: Option<PathBuf>,
    },
    /// Delete a secret.
    Rm {
        /// Its name.
        name: String,
    },
    /// Let a bot have secrets filled on a Computer (replaces the list; none removes them).
    Grant {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// The bot (`bot_…`).
        bot: String,
        /// The secrets' names.
        names: Vec<String>,
    },
}

#[derive(Subcommand)]
enum Computers {
    /// The Computers you may see.
    Ls,
    /// One Computer.
    Get {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
    },
    /// Create a Computer: a provider's sandbox, or (`--paired`) your own machine.
    Create {
        /// A display name.
        #[arg(long)]
        name: Option<String>,
        /// The provider (`cpp_…`, see `GET /v1/computer-providers`).
        #[arg(long, conflicts_with = "paired", required_unless_present = "paired")]
        provider: Option<String>,
        /// The provider's template.
        #[arg(long)]
        template: Option<String>,
        /// Pair a machine of your own: answers the code to start `computer-agent` with.
        #[arg(long)]
        paired: bool,
        /// With a desktop (screenshots, mouse, keyboard, browser).
        #[arg(long)]
        desktop: bool,
        /// Pause after this many seconds without work (default 600; 0 = never).
        #[arg(long, default_value_t = 600)]
        pause_after: u64,
        /// Owned by the organization.
        #[arg(long)]
        shared: bool,
        /// Wait until the execution ends, and a sandbox until it runs (its agent linked).
        #[arg(long)]
        wait: bool,
    },
    /// Pause a Computer.
    Pause {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// Wait until the execution ends.
        #[arg(long)]
        wait: bool,
    },
    /// Resume a Computer.
    Resume {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// Wait until the execution ends, and the Computer until it runs again.
        #[arg(long)]
        wait: bool,
    },
    /// Replace a sandbox with a new one (of another template, say a newer image), keeping its
    /// tool packages, bindings and their state (docker sandboxes).
    Recreate {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// The provider template of the new sandbox (default: the Computer's).
        #[arg(long)]
        template: Option<String>,
        /// Wait until the execution ends, and the Computer until its new sandbox runs.
        #[arg(long)]
        wait: bool,
    },
    /// Delete a Computer.
    Rm {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// Wait until the execution ends.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Subcommand)]
enum Sessions {
    /// Your sessions on a Computer: running ones, then those that ended in the last 10 minutes.
    Ls {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
    },
}

#[derive(Subcommand)]
enum Tools {
    /// A bot's installed packages (bindings) and their tools.
    Ls {
        /// `bot_…`
        bot: String,
    },
    /// Install an MCP package from a file in a Computer's workspace.
    Install {
        /// `bot_…`
        bot: String,
        /// The Computer holding the archive: its id (`cmp_…`) or its name.
        #[arg(long)]
        computer: String,
        /// The archive's path in the Computer.
        #[arg(long)]
        artifact: String,
        /// The manifest (a local JSON file; the format: docs/tool-packages.md).
        #[arg(long)]
        manifest: PathBuf,
    },
    /// Call a tool of a binding (journaled: the same `--operation-id` never runs twice).
    Call {
        /// `bot_…`
        bot: String,
        /// The binding.
        binding: String,
        /// The tool's name.
        tool: String,
        /// The arguments, a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// The call's id (default: a new one).
        #[arg(long)]
        operation_id: Option<String>,
    },
}

#[derive(Subcommand)]
enum Ports {
    /// The Computer's open ports.
    Ls {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
    },
    /// Give a port a public address (shown this once).
    Open {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// The port in the Computer.
        port: u16,
    },
    /// End a port's address.
    Close {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// The port.
        port: u16,
    },
}

#[derive(Subcommand)]
enum Desktop {
    /// Save a screenshot.
    Screenshot {
        /// The Computer: its id (`cmp_…`) or its name.
        computer: String,
        /// Where (default `screenshot.<format>`).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// `png`, `webp` (lossless) or `jpeg`.
        #[arg(long, default_value = "png")]
        format: String,
    },
}

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("computerctl: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(run(cli)).unwrap_or_else(|e| {
        eprintln!("computerctl: {e:#}");
        // EX_TEMPFAIL: a lost answer; the same command again resends it safely.
        if e.downcast_ref::<pending::Lost>().is_some_and(|l| !l.key.is_empty()) { 75 } else { 1 }
    });
    // Do not wait for a blocked read of stdin (`exec -i`).
    std::process::exit(code);
}

/// A client without a total timeout (copies and streams last), but with a connect timeout.
fn client(login: &config::Login) -> anyhow::Result<Client> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .build()
        .context("cannot make an HTTP client")?;
    Ok(Client::with_http(&login.url, &login.token, http))
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let json = cli.json;
    if let Cmd::Login { url, token_file } = cli.command {
        return login(url, token_file, json).await;
    }
    let c = client(&config::load()?)?;
    match cli.command {
        Cmd::Login { .. } => bail!("login is handled above"),
        Cmd::Computers(cmd) => computers(&c, cmd, json).await,
        Cmd::Exec { interactive, tty, user, cwd, env, computer, command } => {
            let env = env
                .iter()
                .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect::<Option<Vec<_>>>()
                .context("--env takes NAME=value")?;
            let command = if command.is_empty() { "bash".to_string() } else { exec::command_line(&command) };
            let computer = computer_id(&c, &computer).await?;
            exec::run(&c, exec::ExecArgs { computer, command, interactive, tty, user, cwd, env }).await
        }
        Cmd::Cp { from, to, user } => {
            let from = resolve_end(&c, copy::End::parse(&from)).await?;
            let to = resolve_end(&c, copy::End::parse(&to)).await?;
            let done = copy::copy(&c, from, to, user.as_deref()).await?;
            show(json, &done, |v| format!("{} ({} bytes, sha256 {})", v["path"], v["size"], v["sha256"]));
            Ok(0)
        }
        Cmd::Files { computer, path } => {
            let computer = computer_id(&c, &computer).await?;
            let v = get(&c, &format!("/v1/computers/{computer}/directory?path={}", esc(&path))).await?;
            show(json, &v, |v| {
                rows(&v["entries"], |e| {
                    format!(
                        "{:<5} {:>10}  {}",
                        e["type"].as_str().unwrap_or("?"),
                        e["size"],
                        e["name"].as_str().unwrap_or("")
                    )
                })
            });
            Ok(0)
        }
        Cmd::Sessions(Sessions::Ls { computer }) => {
            let computer = computer_id(&c, &computer).await?;
            let v = get(&c, &format!("/v1/computers/{computer}/sessions")).await?;
            show(json, &v, |v| {
                rows(&v["sessions"], |s| {
                    let state = if s["running"] == true {
                        "running".to_string()
                    } else {
                        format!(
                            "exit {}",
                            s["exitCode"].as_i64().map(|c| c.to_string()).unwrap_or_else(|| s["signal"].to_string())
                        )
                    };
                    format!(
                        "{}  {:<10} {}",
                        s["session"].as_str().unwrap_or(""),
                        state,
                        s["command"].as_str().unwrap_or("")
                    )
                })
            });
            Ok(0)
        }
        Cmd::Tools(cmd) => tools(&c, cmd, json).await,
        Cmd::Providers => {
            let v = get(&c, "/v1/computer-providers").await?;
            show(json, &v, |v| {
                rows(&v["providers"], |p| {
                    format!(
                        "{}\t{}\t{}",
                        p["id"].as_str().unwrap_or(""),
                        p["kind"].as_str().unwrap_or(""),
                        p["name"].as_str().unwrap_or("")
                    )
                })
            });
            Ok(0)
        }
        Cmd::Ports(cmd) => ports(&c, cmd, json).await,
        Cmd::Secrets(cmd) => secrets(&c, cmd, json).await,
        Cmd::Desktop(Desktop::Screenshot { computer, output, format }) => {
            let computer = computer_id(&c, &computer).await?;
            let resp = c
                .raw(Method::POST, &format!("/v1/computers/{computer}/desktop/screenshot"))
                .header("Accept", format!("image/{format}"))
                .json(&json!({"format": format}))
                .send()
                .await?;
            let resp = Client::check(resp).await?;
            let dim = |k: &str| resp.headers().get(k).and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
            let (w, h) = (dim("x-width"), dim("x-height"));
            let bytes = resp.bytes().await?;
            let out = output.unwrap_or_else(|| PathBuf::from(format!("screenshot.{format}")));
            std::fs::write(&out, &bytes).with_context(|| format!("cannot write {}", out.display()))?;
            let v = json!({"path": out.display().to_string(), "width": w, "height": h, "size": bytes.len()});
            show(json, &v, |v| {
                format!(
                    "{} ({}x{}, {} bytes)",
                    out.display(),
                    v["width"].as_str().unwrap_or("?"),
                    v["height"].as_str().unwrap_or("?"),
                    v["size"]
                )
            });
            Ok(0)
        }
    }
}

/// Percent-escapes a query value.
fn esc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn get(c: &Client, path: &str) -> anyhow::Result<Value> {
    Ok(c.request(Method::GET, path, None).await?)
}

/// Every Computer the caller may see, page after page (`nextAfter`).
async fn list_computers(c: &Client) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/computers?after={}", esc(a)),
            None => "/v1/computers".to_string(),
        };
        let v = get(c, &path).await?;
        all.extend(v["computers"].as_array().cloned().unwrap_or_default());
        match v["nextAfter"].as_str() {
            // A page that does not move on would loop for ever.
            Some(n) if after.as_deref() != Some(n) => after = Some(n.to_string()),
            _ => break,
        }
    }
    Ok(all)
}

/// Whether `s` has the shape of a Computer id: `cmp_` then letters, digits, `-` or `_`.
fn is_computer_id(s: &str) -> bool {
    s.len() <= 100
        && s.strip_prefix("cmp_")
            .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
}

/// The id of the Computer `arg` stands for: an id as it is, else the one Computer named `arg`
/// among those the caller may see (none, or several, is an error naming them).
async fn computer_id(c: &Client, arg: &str) -> anyhow::Result<String> {
    if is_computer_id(arg) {
        return Ok(arg.to_string());
    }
    let all = list_computers(c).await.with_context(|| format!("cannot look up the Computer named {arg:?}"))?;
    let ids: Vec<&str> = all.iter().filter(|v| v["name"] == arg).filter_map(|v| v["id"].as_str()).collect();
    match ids.as_slice() {
        [] => bail!("no Computer named {arg:?} (`computerctl computers ls` lists them)"),
        [one] => Ok(one.to_string()),
        several => bail!("several Computers are named {arg:?}: {}; use an id", several.join(", ")),
    }
}

/// A copy's end with its Computer (an id or a name) as an id.
async fn resolve_end(c: &Client, end: copy::End) -> anyhow::Result<copy::End> {
    Ok(match end {
        copy::End::Remote { computer, path } => copy::End::Remote { computer: computer_id(c, &computer).await?, path },
        local => local,
    })
}

/// Prints `v` as JSON, or as `human` says.
fn show(json: bool, v: &Value, human: impl Fn(&Value) -> String) {
    let text = if json { format!("{v:#}") } else { human(v) };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{text}");
}

fn rows(list: &Value, row: impl Fn(&Value) -> String) -> String {
    let lines: Vec<String> = list.as_array().map(|a| a.iter().map(&row).collect()).unwrap_or_default();
    if lines.is_empty() { "(none)".into() } else { lines.join("\n") }
}

async fn login(url: String, token_file: Option<PathBuf>, json: bool) -> anyhow::Result<i32> {
    let token = match token_file {
        Some(p) if p.as_os_str() == "-" => read_line(&mut std::io::stdin().lock())?,
        Some(p) => std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?,
        None if std::io::stdin().is_terminal() => prompt_hidden("Token: ")?,
        None => read_line(&mut std::io::stdin().lock())?,
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("no token given");
    }
    let login = config::Login { url: url.trim_end_matches('/').to_string(), token };
    // The token must work before it is kept.
    let c = client(&login)?;
    let v = c.request(Method::GET, "/v1/computers?limit=1", None).await.context("the token was not accepted")?;
    let _ = v;
    let path = config::save(&login)?;
    show(json, &json!({"url": login.url, "config": path.display().to_string()}), |_| {
        format!("logged in to {} (kept in {}, mode 0600)", login.url, path.display())
    });
    Ok(0)
}

fn read_line(r: &mut impl BufRead) -> anyhow::Result<String> {
    let mut s = String::new();
    r.read_line(&mut s)?;
    Ok(s)
}

/// Asks on the terminal without echoing what is typed.
fn prompt_hidden(prompt: &str) -> anyhow::Result<String> {
    use nix::sys::termios;
    use std::os::fd::AsFd;
    // Echo goes off before the prompt is shown: what is typed as soon as it shows never echoes.
    let stdin = std::io::stdin();
    let saved = termios::tcgetattr(stdin.as_fd()).ok();
    if let Some(t) = &saved {
        let mut quiet = t.clone();
        quiet.local_flags.remove(termios::LocalFlags::ECHO);
        let _ = termios::tcsetattr(stdin.as_fd(), termios::SetArg::TCSANOW, &quiet);
    }
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let line = read_line(&mut stdin.lock());
    if let Some(t) = &saved {
        let _ = termios::tcsetattr(stdin.as_fd(), termios::SetArg::TCSANOW, t);
    }
    eprintln!();
    line
}

fn computer_row(c: &Value) -> String {
    format!(
        "{}  {:<9} {}",
        c["id"].as_str().unwrap_or(""),
        c["state"].as_str().unwrap_or(""),
        c["name"].as_str().unwrap_or("")
    )
}

/// Waits until the Computer runs (a sandbox is `starting` until its agent links); answers its
/// state, or fails when it failed or the time is up.
async fn wait_running(c: &Client, id: &str, until: std::time::Instant) -> anyhow::Result<String> {
    loop {
        let v = get(c, &format!("/v1/computers/{id}")).await?;
        match v["state"].as_str().unwrap_or("") {
            "running" => return Ok("running".into()),
            "failed" | "deleted" => anyhow::bail!("the computer {id} is {} (see its executions)", v["state"]),
            s if std::time::Instant::now() >= until => anyhow::bail!("the computer {id} is still {s}"),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn computers(c: &Client, cmd: Computers, json: bool) -> anyhow::Result<i32> {
    // Whether `--wait` also waits for the Computer to run (a sandbox's agent links after the
    // execution succeeded).
    let mut runs_after = false;
    let (prepared, wait) = match cmd {
        Computers::Ls => {
            let all = list_computers(c).await?;
            show(json, &json!({"computers": all}), |v| rows(&v["computers"], computer_row));
            return Ok(0);
        }
        Computers::Get { computer } => {
            let computer = computer_id(c, &computer).await?;
            let v = get(c, &format!("/v1/computers/{computer}")).await?;
            show(json, &v, |v| format!("{v:#}"));
            return Ok(0);
        }
        Computers::Create { name, provider, template, paired, desktop, pause_after, shared, wait } => {
            let source = match provider {
                Some(p) if !paired => Source::Provider { provider: p, template },
                _ => Source::Paired,
            };
            runs_after = matches!(source, Source::Provider { .. });
            let mut new = NewComputer::new(source);
            new.name = name;
            new.desktop = desktop;
            new.pause_after = (pause_after > 0).then_some(pause_after);
            new.shared = shared;
            (c.computers().create(new), wait)
        }
        Computers::Pause { computer, wait } => (c.computers().pause(&computer_id(c, &computer).await?), wait),
        Computers::Resume { computer, wait } => {
            runs_after = true;
            (c.computers().resume(&computer_id(c, &computer).await?), wait)
        }
        Computers::Recreate { computer, template, wait } => {
            runs_after = true;
            (c.computers().recreate(&computer_id(c, &computer).await?, template.as_deref()), wait)
        }
        Computers::Rm { computer, wait } => (c.computers().delete(&computer_id(c, &computer).await?), wait),
    };
    let kept = pending::Pending::keep(c, prepared)?;
    if kept.resent {
        eprintln!("computerctl: sending again the command {} whose answer was lost", kept.command.command_key());
    }
    let mut receipt = kept.send().await?;
    let mut computer_state = None;
    if wait {
        let until = std::time::Instant::now() + Duration::from_secs(600);
        receipt = c.wait_execution(&receipt.execution_id, Duration::from_secs(600)).await?;
        if runs_after && receipt.state == "succeeded" {
            computer_state = Some(wait_running(c, &receipt.resource.id, until).await?);
        }
    }
    let v = json!({
        "computerState": computer_state,
        "executionId": receipt.execution_id,
        "commandKey": receipt.command_key,
        "kind": receipt.kind,
        "state": receipt.state,
        "computerId": receipt.resource.id,
        "pairingCode": receipt.pairing_code,
        "approvalId": receipt.approval_id,
    });
    show(json, &v, |v| {
        let mut s = format!(
            "{} {} {}: {}",
            v["kind"].as_str().unwrap_or(""),
            v["computerId"].as_str().unwrap_or(""),
            v["executionId"].as_str().unwrap_or(""),
            v["state"].as_str().unwrap_or("")
        );
        if let Some(code) = v["pairingCode"].as_str() {
            s.push_str(&format!("\npairing code: {code} (computer-agent --server URL --pairing-code {code})"));
        }
        if let Some(a) = v["approvalId"].as_str() {
            s.push_str(&format!("\nwaiting for approval {a}"));
        }
        s
    });
    Ok(if receipt.state == "failed" || receipt.state == "outcome_unknown" { 1 } else { 0 })
}

async fn tools(c: &Client, cmd: Tools, json: bool) -> anyhow::Result<i32> {
    match cmd {
        Tools::Ls { bot } => {
            let v = get(c, &format!("/api/bots/{bot}/tools")).await?;
            show(json, &v, |v| {
                rows(&v["bindings"], |b| {
                    let tools: Vec<&str> = b["tools"]
                        .as_array()
                        .map(|t| t.iter().filter_map(|t| t["name"].as_str().or(t.as_str())).collect())
                        .unwrap_or_default();
                    format!(
                        "{}  {} {}  {}",
                        b["bindingId"].as_str().or(b["id"].as_str()).unwrap_or(""),
                        b["name"].as_str().or(b["package"].as_str()).unwrap_or(""),
                        b["version"].as_str().unwrap_or(""),
                        tools.join(", ")
                    )
                })
            });
        }
        Tools::Install { bot, computer, artifact, manifest } => {
            let computer = computer_id(c, &computer).await?;
            let text = std::fs::read(&manifest).with_context(|| format!("cannot read {}", manifest.display()))?;
            let manifest: Value = serde_json::from_slice(&text).context("the manifest is not JSON")?;
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message("installing (the node checks and unpacks the archive)");
            bar.enable_steady_tick(Duration::from_millis(120));
            let body = json!({"artifactPath": artifact, "manifest": manifest, "computerId": computer});
            let v = c.request(Method::POST, &format!("/api/bots/{bot}/tools/install"), Some(&body)).await;
            bar.finish_and_clear();
            let v = v?;
            show(json, &v, |v| format!("installed: binding {}", v["bindingId"].as_str().unwrap_or("")));
        }
        Tools::Call { bot, binding, tool, args, operation_id } => {
            let arguments: Value = serde_json::from_str(&args).context("--args is not a JSON object")?;
            if !arguments.is_object() {
                bail!("--args must be a JSON object");
            }
            let op = operation_id.unwrap_or_else(|| format!("op_{}", hex::encode(rand_bytes())));
            let body = json!({"operationId": op, "tool": tool, "arguments": arguments});
            let v = c.request(Method::POST, &format!("/api/bots/{bot}/tools/{binding}/call"), Some(&body)).await?;
            show(json, &v, |v| format!("{:#}", v["result"]));
        }
    }
    Ok(0)
}

/// 16 random bytes (from the kernel), for operation ids.
fn rand_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    b
}

async fn ports(c: &Client, cmd: Ports, json: bool) -> anyhow::Result<i32> {
    match cmd {
        Ports::Ls { computer } => {
            let computer = computer_id(c, &computer).await?;
            let v = get(c, &format!("/v1/computers/{computer}/ports")).await?;
            show(json, &v, |v| {
                rows(&v["ports"], |p| {
                    format!(
                        "{:<6} {:<5} {}",
                        p["port"],
                        p["protocol"].as_str().unwrap_or(""),
                        p["state"].as_str().unwrap_or("")
                    )
                })
            });
        }
        Ports::Open { computer, port } => {
            let computer = computer_id(c, &computer).await?;
            let v = c.request(Method::PUT, &format!("/v1/computers/{computer}/ports/{port}"), Some(&json!({}))).await?;
            show(json, &v, |v| match v["url"].as_str() {
                Some(u) => format!("{u}\n(shown this once: anyone with this address may use the port)"),
                None => format!("waiting for approval {}", v["approvalId"].as_str().unwrap_or("")),
            });
        }
        Ports::Close { computer, port } => {
            let computer = computer_id(c, &computer).await?;
            c.request(Method::DELETE, &format!("/v1/computers/{computer}/ports/{port}"), None).await?;
            show(json, &json!({"closed": port}), |_| format!("port {port} closed"));
        }
    }
    Ok(0)
}

async fn secrets(c: &Client, cmd: Secrets, json: bool) -> anyhow::Result<i32> {
    match cmd {
        Secrets::Ls => {
            let v = get(c, "/v1/secrets").await?;
            show(json, &v, |v| {
                rows(&v["secrets"], |s| {
                    let origins: Vec<&str> = s["origins"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    format!(
                        "{:<24} {:<8} {}",
                        s["name"].as_str().unwrap_or(""),
                        s["kind"].as_str().unwrap_or(""),
                        origins.join(" ")
                    )
                })
            });
        }
        Secrets::Put { name, origins, kind, value_file } => {
            let value = match value_file {
                Some(p) if p.as_os_str() == "-" => read_line(&mut std::io::stdin().lock())?,
                Some(p) => std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?,
                None if std::io::stdin().is_terminal() => prompt_hidden(&format!("Value of {name}: "))?,
                None => read_line(&mut std::io::stdin().lock())?,
            };
            let value = value.strip_suffix('\n').unwrap_or(&value);
            let value = value.strip_suffix('\r').unwrap_or(value);
            let mut body = json!({"value": value, "origins": origins});
            if let Some(k) = kind {
                body["kind"] = json!(k);
            }
            let v = c.request(Method::PUT, &format!("/v1/secrets/{}", esc(&name)), Some(&body)).await?;
            show(json, &v, |v| {
                format!("{} ({}) kept, sealed", v["name"].as_str().unwrap_or(""), v["kind"].as_str().unwrap_or(""))
            });
        }
        Secrets::Rm { name } => {
            c.request(Method::DELETE, &format!("/v1/secrets/{}", esc(&name)), None).await?;
            show(json, &json!({"deleted": name}), |_| format!("{name} deleted"));
        }
        Secrets::Grant { computer, bot, names } => {
            let computer = computer_id(c, &computer).await?;
            let path = format!("/v1/computers/{computer}/bots/{}", esc(&bot));
            let v = c.request(Method::PUT, &path, Some(&json!({"secrets": names}))).await?;
            show(json, &v, |v| {
                let names: Vec<&str> =
                    v["secrets"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
                if names.is_empty() {
                    format!("{bot} may have no secret filled on {computer}")
                } else {
                    format!("{bot} may have {} filled on {computer}", names.join(", "))
                }
            });
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts of a shell line that are commands (split at `;`, `&&` and `|` outside quotes),
    /// without a trailing comment.
    fn commands(line: &str) -> Vec<String> {
        let (mut out, mut cur) = (Vec::new(), String::new());
        let (mut single, mut double) = (false, false);
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\'' if !double => single = !single,
                '"' if !single => double = !double,
                '#' if !single && !double && cur.ends_with(' ') => break,
                ';' | '|' if !single && !double => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                '&' if !single && !double && chars.peek() == Some(&'&') => {
                    chars.next();
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        out.push(cur);
        out.into_iter().map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()
    }

    /// Every `computerctl` command in README.md and docs/cli.md parses as computerctl parses its
    /// arguments (subcommands, flags, values), so the docs cannot name one that does not exist.
    /// (README's tour also runs, in t92.)
    #[test]
    fn every_computerctl_command_in_the_docs_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut checked = 0;
        for doc in ["README.md", "docs/cli.md"] {
            let text = std::fs::read_to_string(root.join(doc)).expect("the doc");
            for (n, line) in text.lines().enumerate().filter(|(_, l)| l.starts_with("    ")) {
                for cmd in commands(line).into_iter().filter(|c| c.starts_with("computerctl ")) {
                    let args = shlex::split(&cmd).unwrap_or_else(|| panic!("{doc}:{}: not a shell line: {cmd}", n + 1));
                    if let Err(e) = Cli::try_parse_from(&args) {
                        panic!("{doc}:{}: `{cmd}` does not parse:\n{e}", n + 1);
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked >= 25, "the docs' computerctl commands were found ({checked})");
        assert!(Cli::try_parse_from(["computerctl", "computers", "make"]).is_err(), "a wrong one fails");
        assert_eq!(commands("a 'x; y' && b # c; d"), vec!["a 'x; y'", "b"]);
    }

    #[test]
    fn ids_are_taken_as_they_are_and_anything_else_is_a_name() {
        assert!(is_computer_id("cmp_0123abcd"));
        assert!(is_computer_id("cmp_a-b_c"));
        assert!(!is_computer_id("cmp_"), "no id after the prefix");
        assert!(!is_computer_id("cmp_my box"), "a name that starts like an id");
        assert!(!is_computer_id("box"));
        assert!(!is_computer_id(&format!("cmp_{}", "a".repeat(100))));
    }
}
