//! `computer-agent --server URL [--pair CODE] --state DIR`: pairs once, then keeps the link up.
//! `computer-agent --server URL --pool-id ID --pool-token TOKEN --state DIR`: a warm sandbox:
//! starts what needs no identity (the desktop, the browser), waits in the pool for one
//! (`pool`), then pairs with the code it is given.
//! `computer-agent load-runtime --archive FILE|- --into DIR [--expect-snapshot HEX]`: loads a
//! runtime archive (`runtime_load`).
//! `computer-agent egress-gateway serve|set POLICY|stats`: the egress gateway (`egress`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use clap::Parser;
use computer_agent::link;
use computer_agent::pairing;
use computer_agent::pool;
use computer_agent::service::AgentService;
use computer_agent::sessions::Sessions;

/// The agent on a Computer.
#[derive(Debug, Parser)]
#[command(name = "computer-agent", version, about)]
struct Cli {
    /// The cluster's URL (any node, or the load balancer), e.g. https://cluster.example:8443;
    /// plain http:// only to a loopback address, or with --insecure.
    #[arg(long, env = "COMPUTER_AGENT_SERVER")]
    server: String,
    /// Trust only this CA (PEM) for the server's certificate (default: the system's roots).
    #[arg(long, env = "COMPUTER_AGENT_CA", conflicts_with = "ca_pem")]
    ca: Option<PathBuf>,
    /// The same, given as the CA's PEM text (the Docker provider passes it this way).
    #[arg(long, env = "COMPUTER_AGENT_CA_PEM")]
    ca_pem: Option<String>,
    /// Allow plain http:// to a non-loopback server (the credential and the sessions then cross
    /// the network in clear).
    #[arg(long, env = "COMPUTER_AGENT_INSECURE")]
    insecure: bool,
    /// A one-time pairing code (from the Computer's create execution). When it was already used
    /// and DIR holds a credential (a restarted sandbox), the stored credential is used.
    #[arg(long, env = "COMPUTER_AGENT_PAIR")]
    pair: Option<String>,
    /// Start as a warm sandbox of this pool (with --pool-token): do what needs no identity, then
    /// wait for one at the server (`/v1/agent/pool`) and pair with the code it gives. A DIR that
    /// holds a credential (claimed before a restart) uses it without waiting.
    #[arg(long, env = "COMPUTER_AGENT_POOL_ID", requires = "pool_token", conflicts_with = "pair")]
    pool_id: Option<String>,
    /// The pool's secret, proving this sandbox is one of it (never shown).
    #[arg(
        long,
        env = "COMPUTER_AGENT_POOL_TOKEN",
        requires = "pool_id",
        conflicts_with = "pair",
        hide_env_values = true
    )]
    pool_token: Option<String>,
    /// Where the machine credential is kept.
    #[arg(long, env = "COMPUTER_AGENT_STATE")]
    state: PathBuf,
    /// The workspace: sessions' working directory and where relative paths resolve, for files,
    /// sessions and tool archives (default: the home directory; made when missing).
    #[arg(long, env = "COMPUTER_AGENT_WORKDIR")]
    workdir: Option<PathBuf>,
    /// The account sessions and file calls run as unless a call says `"user": "root"` (default:
    /// the agent's own; only an agent started as root may name another, e.g. `user` in a
    /// sandbox).
    #[arg(long, env = "COMPUTER_AGENT_USER")]
    user: Option<String>,
    /// Let tool bindings run under the agent's own UID when it is not root (it cannot give them
    /// UIDs of their own). Such bindings are marked `sharedUid` in every listing; without this
    /// flag a non-root agent refuses tool installs (`isolation_unavailable`).
    #[arg(long, env = "COMPUTER_AGENT_SHARED_UID_BINDINGS")]
    shared_uid_bindings: bool,
    /// Where tool packages, their bindings' homes and the registry live (root-owned; default
    /// STATE/runtime).
    #[arg(long, env = "COMPUTER_AGENT_RUNTIME")]
    runtime: Option<PathBuf>,
    /// A volume that holds the tool runtime apart from the sandbox (the Docker provider's, kept
    /// across recreates) and is the runtime: its layout marker is checked (an unknown layout
    /// version is refused) or, on a volume that has none, written.
    #[arg(long, env = "COMPUTER_AGENT_RUNTIME_VOLUME", conflicts_with = "runtime")]
    runtime_volume: Option<PathBuf>,
    /// The deadline of one MCP tool call, in seconds.
    #[arg(long, env = "COMPUTER_AGENT_MCP_DEADLINE_SECS", default_value_t = 45)]
    mcp_deadline_secs: u64,
    /// The first UID given to a tool binding (agents sharing a machine need separate ranges).
    #[arg(long, env = "COMPUTER_AGENT_MCP_FIRST_UID", default_value_t = computer_agent::mcp::bindings::FIRST_UID)]
    mcp_first_uid: u32,
    /// A tool call's answer is kept this long for replays of the call (then a replay is
    /// answered `result_expired`; the call is never run again).
    #[arg(long, env = "COMPUTER_AGENT_TOOL_RESULT_RETENTION_SECS", default_value_t = 7 * 24 * 3600)]
    tool_result_retention_secs: u64,
    /// A session no call used for this many seconds is ended.
    #[arg(long, env = "COMPUTER_AGENT_SESSION_IDLE_SECS", default_value_t = computer_agent::sessions::IDLE_LIMIT.as_secs_f64())]
    session_idle_secs: f64,
    /// Start and keep a desktop of this size (`1280x800x24`): Xvfb and a window manager, run
    /// as the desktop's own account (`computerd-desktop`, else `nobody`), with a cookie no
    /// session can read. The Docker provider sets it for a Computer created with a desktop.
    #[arg(long, env = "COMPUTER_AGENT_DESKTOP", conflicts_with = "desktop_display")]
    desktop: Option<computer_agent::desktop::xserver::Geometry>,
    /// Opt in to screenshots and input actions on this existing display number (a paired
    /// machine's own, e.g. 0 for `:0`), reached with --desktop-xauthority. Never a stream.
    #[arg(long, env = "COMPUTER_AGENT_DESKTOP_DISPLAY", requires = "desktop_xauthority")]
    desktop_display: Option<u32>,
    /// The X authority file of --desktop-display.
    #[arg(long, env = "COMPUTER_AGENT_DESKTOP_XAUTHORITY")]
    desktop_xauthority: Option<PathBuf>,
    /// Let the cluster open connections to this machine's ports (`127.0.0.1:<port>`) for their
    /// public addresses (`PUT …/ports/:port`). The Docker provider sets it for sandboxes; a
    /// paired machine's ports stay closed unless its owner sets it.
    #[arg(long, env = "COMPUTER_AGENT_PORTS")]
    ports: bool,
    /// Offer a browser: Chromium at this path, run as the desktop's account and driven over a
    /// CDP pipe (its profiles under /var/lib/computerd-browser). Needs --desktop for takeover
    /// mode. The Docker provider sets it for a Computer created with a desktop.
    #[arg(long, env = "COMPUTER_AGENT_BROWSER")]
    browser: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // `computer-agent load-runtime …`: the runtime loader, a command of its own (no link).
    if std::env::args_os().nth(1).is_some_and(|a| a == "load-runtime") {
        return computer_agent::runtime_load::command(std::env::args_os().skip(1));
    }
    // `computer-agent egress-gateway …`: the egress gateway of a sandbox's network namespace.
    if std::env::args_os().nth(1).is_some_and(|a| a == "egress-gateway") {
        return computer_agent::egress::command(std::env::args_os().skip(1)).await;
    }
    computerd_proto::mux::keep_freed_memory();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COMPUTER_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Not dumpable: no process without CAP_SYS_PTRACE, though of the agent's own account (a
    // session, or root in a sandbox, which has no such capability), can attach to the agent or
    // read its memory or `/proc/<pid>/environ`, where a pairing code or the credential may be.
    // Sessions exec a program, which makes them dumpable again.
    // SAFETY: prctl with integer arguments only; it changes this process's flag.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        eprintln!("computer-agent: cannot make the agent undumpable: {}", std::io::Error::last_os_error());
        return std::process::ExitCode::from(2);
    }
    let users = match computer_agent::users::Users::new(cli.user.as_deref()) {
        Ok(u) => u,
        Err(why) => {
            eprintln!("computer-agent: {why}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match (&cli.runtime, &cli.runtime_volume) {
        (_, Some(volume)) => match computer_agent::layout::runtime_volume(volume) {
            Ok(r) => r,
            Err(why) => {
                eprintln!("computer-agent: {why}");
                return std::process::ExitCode::from(2);
            }
        },
        (Some(r), None) => r.clone(),
        (None, None) => cli.state.join("runtime"),
    };
    // What a claim from the warm pool gave (the sessions' environment, the bindings' first UID),
    // kept for an agent restarted after it.
    let claim = match pool::load_claim(&cli.state) {
        Ok(c) => c.unwrap_or_default(),
        Err(why) => {
            eprintln!("computer-agent: {why}");
            return std::process::ExitCode::from(2);
        }
    };
    // A warm sandbox waits for its identity, unless it was claimed before a restart.
    let waiting = match (&cli.pool_id, &cli.pool_token) {
        (Some(id), Some(token)) => match pairing::load(&cli.state) {
            Ok(c) => {
                eprintln!("computer-agent: claimed before as {}; using the stored credential", c.computer_id);
                None
            }
            Err(pairing::PairError::NotPaired) => Some((id.clone(), token.clone())),
            Err(e) => {
                eprintln!("computer-agent: {e}");
                return std::process::ExitCode::from(2);
            }
        },
        _ => None,
    };
    let mut first_uid = claim.first_uid.unwrap_or(cli.mcp_first_uid);
    // Before pairing writes the credential: the state is the agent's alone (and the bindings'
    // group's, to pass through to the runtime). A warm sandbox learns the bindings' first UID
    // with its identity, and protects the state then.
    if waiting.is_none()
        && let Err(code) = protect_state(&cli.state, first_uid, cli.shared_uid_bindings)
    {
        return code;
    }
    let idle_limit = std::time::Duration::try_from_secs_f64(cli.session_idle_secs).ok().filter(|d| !d.is_zero());
    let Some(idle_limit) = idle_limit else {
        eprintln!("computer-agent: --session-idle-secs must be a positive number of seconds");
        return std::process::ExitCode::from(2);
    };
    use computer_agent::tls::Ca;
    let ca = cli.ca.as_deref().map(Ca::File).or(cli.ca_pem.as_deref().map(Ca::Pem));
    let dial = match computer_agent::tls::dial(&cli.server, ca, cli.insecure) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("computer-agent: {why}");
            return std::process::ExitCode::from(2);
        }
    };
    let cred = match (&waiting, &cli.pair) {
        (Some(_), _) => None,
        (None, Some(code)) => match pair_patiently(&dial, code, &cli.state).await {
            Ok(c) => {
                eprintln!("computer-agent: paired as {}", c.computer_id);
                Some(c)
            }
            Err(e) => match pairing::load(&cli.state) {
                Ok(c) => {
                    eprintln!("computer-agent: {e}; using the stored credential of {}", c.computer_id);
                    Some(c)
                }
                Err(_) => {
                    eprintln!("computer-agent: {e}");
                    return std::process::ExitCode::from(3);
                }
            },
        },
        (None, None) => match pairing::load(&cli.state) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("computer-agent: {e}");
                return std::process::ExitCode::from(2);
            }
        },
    };
    let workdir = cli
        .workdir
        .or_else(|| std::env::var_os("HOME").map(PathBuf::from))
        .unwrap_or_else(|| users.default_account().home.clone());
    if let Err(e) = computer_agent::layout::workspace(&workdir, users.default_account()) {
        eprintln!("computer-agent: cannot make the workspace {}: {e}", workdir.display());
        return std::process::ExitCode::from(2);
    }
    let limits = computer_agent::mcp::runner::RunLimits {
        deadline: std::time::Duration::from_secs(cli.mcp_deadline_secs.max(1)),
        ..Default::default()
    };
    let results = computer_agent::mcp::results::ResultLimits {
        retention: std::time::Duration::from_secs(cli.tool_result_retention_secs),
        ..Default::default()
    };
    use computer_agent::desktop::Desktop;
    use computer_agent::desktop::Scope;
    use computer_agent::desktop::xserver;
    let desktop = match (cli.desktop, cli.desktop_display, &cli.desktop_xauthority) {
        (Some(geometry), _, _) => {
            let started = match xserver::desktop_account() {
                Ok(account) => xserver::start(geometry, account, std::path::Path::new(xserver::RUN_DIR)).await,
                Err(why) => Err(why),
            };
            match started {
                Ok(display) => Some(Desktop::new(display, Scope::Full).with_size(geometry.width, geometry.height)),
                Err(why) => {
                    eprintln!("computer-agent: cannot start the desktop: {why}");
                    return std::process::ExitCode::from(2);
                }
            }
        }
        (None, Some(number), Some(auth)) => match xserver::existing(number, auth) {
            Ok(display) => Some(Desktop::new(display, Scope::ScreenshotsAndActions)),
            Err(why) => {
                eprintln!("computer-agent: cannot use display :{number}: {why}");
                return std::process::ExitCode::from(2);
            }
        },
        _ => None,
    };
    let browser = match &cli.browser {
        Some(chromium) if desktop.as_ref().is_some_and(|d| d.scope() == Scope::Full) || cli.desktop.is_none() => {
            match xserver::desktop_account() {
                Ok(account) => Some(computer_agent::browser::Browser::new(
                    chromium.clone(),
                    account,
                    PathBuf::from(computer_agent::browser::ROOT),
                    workdir.clone(),
                    desktop.clone().filter(|d| d.scope() == Scope::Full),
                )),
                Err(why) => {
                    eprintln!("computer-agent: no account for the browser: {why}");
                    return std::process::ExitCode::from(2);
                }
            }
        }
        _ => None,
    };
    // The identity: the one found above, or, for a warm sandbox, the one the pool gives it now
    // (its desktop and browser are up already).
    let (cred, env) = match (cred, waiting) {
        (Some(c), _) => (c, claim.env),
        (None, waiting) => {
            let Some((pool_id, token)) = waiting else {
                eprintln!("computer-agent: {}", pairing::PairError::NotPaired);
                return std::process::ExitCode::from(2);
            };
            eprintln!("computer-agent: waiting in the pool as {pool_id}");
            let assignment = match pool::wait(&dial, &pool_id, &token).await {
                Ok(a) => a,
                Err(why) => {
                    eprintln!("computer-agent: {why}");
                    return std::process::ExitCode::from(3);
                }
            };
            eprintln!("computer-agent: claimed as {}", assignment.computer_id);
            if let Some(uid) = assignment.first_uid {
                first_uid = uid;
            }
            if let Err(code) = protect_state(&cli.state, first_uid, cli.shared_uid_bindings) {
                return code;
            }
            // Kept before pairing: once the credential is stored, a restart no longer waits.
            if let Err(why) = pool::save_claim(&cli.state, &pool::Claim::from(&assignment)) {
                eprintln!("computer-agent: {why}");
                return std::process::ExitCode::from(2);
            }
            match pair_patiently(&dial, &assignment.pairing_code, &cli.state).await {
                Ok(c) => {
                    eprintln!("computer-agent: paired as {}", c.computer_id);
                    if c.computer_id != assignment.computer_id {
                        eprintln!(
                            "computer-agent: the pool claimed this sandbox as {} but it paired as {}",
                            assignment.computer_id, c.computer_id
                        );
                    }
                    (c, assignment.env)
                }
                Err(e) => {
                    eprintln!("computer-agent: {e}");
                    return std::process::ExitCode::from(3);
                }
            }
        }
    };
    let sessions = Sessions::default().with_base_env(env);
    sessions.start_reaper(idle_limit);
    let isolation = computer_agent::mcp::bindings::Isolation::of_agent(first_uid, cli.shared_uid_bindings);
    let tools = computer_agent::mcp::bindings::Tools::new(runtime, workdir.clone(), limits, first_uid)
        .with_isolation(isolation)
        .with_result_limits(results);
    // A binding's UID must be able to pass through to the runtime; if it cannot, installs are
    // refused naming the directory in the way.
    if let Some(why) = tools.check_reach().await {
        tracing::warn!(reason = %why, "tool packages cannot run here");
    }
    let svc = AgentService {
        sessions,
        workdir,
        generation: Arc::new(AtomicU64::new(0)),
        tools: Some(tools),
        users,
        desktop,
        ports: cli.ports,
        browser,
    };
    // On a worker of the runtime, not on this thread: the link, its tunnels and its gRPC
    // connections then hand work to each other on the worker's own queues. Run here, every
    // frame would cross between this thread and a worker (a futex wake each way).
    match tokio::spawn(link::run(dial, cred, svc)).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("computer-agent: the link's task failed: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Leaves the state dir to the agent (and to the tool bindings' group of `first_uid`, to pass
/// through to the runtime): before pairing writes the credential.
fn protect_state(state: &std::path::Path, first_uid: u32, shared: bool) -> Result<(), std::process::ExitCode> {
    let isolation = computer_agent::mcp::bindings::Isolation::of_agent(first_uid, shared);
    computer_agent::layout::protect(state, isolation.group()).map_err(|e| {
        eprintln!("computer-agent: cannot protect the state dir {}: {e}", state.display());
        std::process::ExitCode::from(2)
    })
}

/// Pairs, waiting out a server that cannot be reached yet (a sandbox may start before its
/// cluster answers) for up to the code's lifetime; a refusal is final.
async fn pair_patiently(
    dial: &computer_agent::tls::Dial,
    code: &str,
    state: &std::path::Path,
) -> Result<pairing::Credential, pairing::PairError> {
    let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match pairing::pair(dial, code, state).await {
            Err(pairing::PairError::Unreachable(e)) if tokio::time::Instant::now() < give_up => {
                eprintln!("computer-agent: cannot reach {} yet ({e}); retrying", dial.server);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
            }
            other => return other,
        }
    }
}
