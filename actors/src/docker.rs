//! The `docker` provider: sandboxes as containers of the local Docker engine, through the Engine
//! API (bollard; never the CLI).
//!
//! A create makes one container named `computerd-<computer id>`, labelled with the Computer id
//! and the command key (so an inspection can tell what happened after a lost answer), with the
//! template's CPU, memory and process limits, and starts it. Its entrypoint is `computer-agent`,
//! given the cluster's URL and the create's one-time pairing code; the Computer turns `running`
//! once that agent's link is up. Pause freezes the container (memory and processes kept, like
//! E2B), resume thaws it, delete removes it with its volumes.
//!
//! Failure kinds: a connection to the engine that cannot be made is `NotSent`; an answer of the
//! engine (a 4xx or 5xx) is `Rejected`; anything after the request left (a cut connection, a
//! timeout, an unreadable answer) is `Lost`. A create whose start is refused removes the container
//! it made, so a refusal leaves nothing behind; if even that removal fails, the answer is `Lost`.
//! No call is ever retried.
//!
//! Config (a provider record's `config`):
//! - `serverUrl` (required): the URL the agents in the sandboxes dial (a node or the load balancer;
//!   `https://` for TLS, while an `http://` one runs the agents with `--insecure`);
//! - `caCert`: the PEM of a private CA that signed `serverUrl`'s certificate; the agents pin it
//!   (`--ca-pem`). `computerd dev` registers its provider this way, with its local CA;
//! - `endpoint`: the engine's socket, default `unix:///var/run/docker.sock`;
//! - `network`: the container network; by default the provider's own [`SANDBOX_NETWORK`] (see
//!   below); a name given here (`bridge`, `host`, an operator's network) is used as it is;
//! - `agentBinary`: a host path mounted read-only over the image's `computer-agent` (for
//!   development and tests, so the agent need not be rebuilt into the image);
//! - `templates`: `{"name": {"image", "cpus", "memoryMb", "pids", "allowPrivate"}}`; a
//!   Computer's `template` names one; without one, `default`, else the image
//!   `computerd-sandbox:latest`. `allowPrivate` (CIDR ranges, each inside a private or
//!   link-local range) opens those ranges to the template's sandboxes (see egress below);
//! - `egress`: `"node"` (the default: the node installs the egress rules of its own networks, and
//!   a node that cannot, not root or without `iptables`, refuses the provider) or `"operator"`
//!   (the operator enforces egress from the sandbox network; the node installs nothing);
//! - `pool`: `{"<template key>": {"size", "desktop"}}`, the warm pools (see [`pool`]): sandboxes
//!   made ahead of any create, named `computerd-pool-<pool id>` and labelled [`LABEL_POOL`], which
//!   a Computer claims whole and renames `computerd-<computer id>`. A claimed pooled container is
//!   its Computer's sandbox as a created one is: listed, inspected, recreated (onto the volume it
//!   mounts, `computerd-runtime-<pool id>`) and deleted (with that volume) by its name.
//!
//! Hardening (every sandbox): all capabilities are dropped but [`SANDBOX_CAPS`] (no `NET_RAW`,
//! so no raw sockets or spoofed packets; no `MKNOD`, `SYS_CHROOT`, `SETFCAP`, `SETPCAP`,
//! `AUDIT_WRITE`), with `no-new-privileges` (a setuid binary or a file capability never raises a
//! process above what it had). The agent gets its Computer's own binding-UID range
//! (`COMPUTER_AGENT_MCP_FIRST_UID`, allocated in the store), so per-UID kernel counters such as
//! RLIMIT_NPROC are never shared by two sandboxes of one kernel. Unless the config names a
//! network, sandboxes go on [`SANDBOX_NETWORK`], a bridge with inter-container traffic off
//! (`enable_icc=false`): a sandbox never reaches another sandbox (nor, with the egress rules
//! below, the host or a private address). The network is created when missing; when nodes
//! sharing one engine race to create it, every one settles on the oldest network of that name
//! (and removes its own extra, if unused).
//!
//! Egress (`crate::egress`): before each create, and on each pass of the sandbox watch (`list`),
//! the node refills the rules of the network the sandbox joins: from it, the host's own
//! addresses take only new connections to the port the agents dial (`serverUrl`'s), and the
//! private and link-local ranges (10/8, 172.16/12, 192.168/16, 100.64/10, 169.254/16, fc00::/7,
//! fe80::/10: the metadata address, the LAN, other containers) are closed, but for DNS to the
//! host's resolvers and the agents' server. A template's `allowPrivate` opens ranges for its sandboxes only: every distinct set of opened
//! ranges gets a network of its own, `computerd-sandboxes-<hash of the set>` (same options),
//! whose rules open just that set. So the rules match the bridge a packet comes from, need no
//! per-sandbox address (assigned at start, reused after a delete), and a node restart refills
//! them whole. A named `network` is the operator's: no rules are installed for it.

use std::collections::BTreeSet;
use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::ContainerCreateBody;
use bollard::models::HostConfig;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use bollard::query_parameters::ListContainersOptionsBuilder;
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use serde::Deserialize;
use tokio::sync::OnceCell;

use crate::provider::CreateSpec;
use crate::provider::PoolWant;
use crate::provider::Pooled;
use crate::provider::Provider;
use crate::provider::ProviderError;
use crate::provider::SandboxInfo;

mod gateway;
pub mod pool;
mod template_check;
pub use gateway::LABEL_GATEWAY;
pub use gateway::NO_GATEWAY;
pub use gateway::gateway_name;
pub use pool::LABEL_POOL;
pub use pool::LABEL_POOL_KEY;
pub use pool::LABEL_POOL_PROVIDER;
pub use pool::MAX_POOL_KEYS;
pub use pool::MAX_POOL_SIZE;
pub use pool::MAX_POOL_TOTAL;
pub use pool::POOL_ID_ENV;
pub use pool::POOL_TOKEN_ENV;
pub use pool::PoolConfig;
pub use pool::pool_container_name;
pub use template_check::TEMPLATE_INVALID;

/// The image used when no template names one.
pub const DEFAULT_IMAGE: &str = "computerd-sandbox:latest";
/// The image used for a Computer created with a desktop when no template names one
/// (`deploy/build-desktop-image.sh`: Xvfb, a window manager, x11vnc, Chromium).
pub const DESKTOP_IMAGE: &str = "computerd-desktop:latest";
pub use crate::provider::CHROMIUM;
pub use crate::provider::DESKTOP_GEOMETRY;
/// Where the image keeps the agent.
const AGENT_PATH: &str = "/usr/local/bin/computer-agent";
/// The label with the Computer id.
pub const LABEL_COMPUTER: &str = "computerd.computer";
/// The label with the create's command key.
pub const LABEL_KEY: &str = "computerd.command-key";
/// The provider's own network for sandboxes (used unless the config names one).
pub const SANDBOX_NETWORK: &str = "computerd-sandboxes";
/// Where a sandbox mounts its Computer's runtime volume: the agent's tool runtime
/// (`COMPUTER_AGENT_RUNTIME_VOLUME`), inside its protected state dir, at the path an older
/// sandbox kept it in its writable layer, so the absolute paths the runtime records (a binding's
/// code and HOME, and whatever its tools wrote there) hold across a migration.
pub const RUNTIME_MOUNT: &str = "/var/lib/computer-agent/runtime";
/// The longest a migration's engine request (the archive's stream, the attach, the wait) may take.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The runtime loader's test hook (`computer_agent::runtime_load::PAUSE_ENV`).
const LOAD_PAUSE_ENV: &str = "COMPUTERD_LOAD_PAUSE_AT";
/// The error kind of a recreate that failed after the old sandbox was stopped (kept, stopped).
pub const RECREATE_FAILED: &str = "recreate_failed";
/// The bridge option that turns inter-container traffic off.
const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

/// The capabilities a sandbox keeps (Docker's default set minus `NET_RAW`, `MKNOD`,
/// `SYS_CHROOT`, `SETFCAP`, `SETPCAP` and `AUDIT_WRITE`). The agent runs as root and needs:
/// `SETUID`/`SETGID` to run sessions and tool bindings as other users (and `setgroups` to drop
/// root's groups); `KILL` to signal and drain those users' processes; `CHOWN` to give a binding
/// its home and private copy, and installs their files' owners; `DAC_OVERRIDE` and `FOWNER` to
/// read, write and chmod files that other users own (the files API, installs); `FSETID` so a
/// root write or chown keeps a file's setgid bit as package installs expect; `NET_BIND_SERVICE`
/// for servers on ports below 1024 (with `network: host` too).
pub const SANDBOX_CAPS: [&str; 8] =
    ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"];

/// One template: a local image and its limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Template {
    /// A local image (no registry is consulted).
    pub image: String,
    /// CPUs (fractions allowed), default 1.
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    /// Memory in MiB, default 1024.
    #[serde(default = "default_memory")]
    pub memory_mb: u64,
    /// At most this many processes, default 1024.
    #[serde(default = "default_pids")]
    pub pids: u64,
    /// Private or link-local ranges (CIDR) this template's sandboxes may reach.
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// Whether the sandboxes keep their tool runtime in the Computer's runtime volume (default)
    /// or, as sandboxes made before runtime volumes did, in their writable layer (lost with the
    /// container; a recreate onto a template with the volume migrates it).
    #[serde(default = "default_true")]
    pub runtime_volume: bool,
    /// Static names of the template's sandboxes, name → IP address (Docker's extra hosts; an
    /// egress gateway resolves them itself).
    #[serde(default)]
    pub hosts: std::collections::BTreeMap<String, String>,
}

fn default_true() -> bool {
    true
}

fn default_cpus() -> f64 {
    1.0
}
fn default_memory() -> u64 {
    1024
}
fn default_pids() -> u64 {
    1024
}

impl Template {
    fn default_image() -> Self {
        Template {
            image: DEFAULT_IMAGE.into(),
            cpus: default_cpus(),
            memory_mb: default_memory(),
            pids: default_pids(),
            allow_private: Vec::new(),
            runtime_volume: true,
            hosts: Default::default(),
        }
    }

    fn desktop_image() -> Self {
        Template {
            image: DESKTOP_IMAGE.into(),
            cpus: default_cpus(),
            memory_mb: default_memory(),
            pids: default_pids(),
            allow_private: Vec::new(),
            runtime_volume: true,
            hosts: Default::default(),
        }
    }
}

/// The CPUs and memory (MiB) of a sandbox of template `t` whose create asked `r`: the
/// template's where nothing is asked; more than the template's is refused, naming the ceiling.
pub fn within(t: &Template, r: Option<&crate::provider::Resources>) -> Result<(f64, u64), String> {
    let cpus = match r.and_then(|r| r.cpus) {
        None => t.cpus,
        Some(c) if !(c.is_finite() && c > 0.0) => return Err("resources.cpus must be a number above 0".into()),
        Some(c) if c > t.cpus => {
            return Err(format!("resources.cpus is {c}, above the template's ceiling of {} CPUs", t.cpus));
        }
        Some(c) => c,
    };
    let memory_mb = match r.and_then(|r| r.memory_mb) {
        None => t.memory_mb,
        Some(m) if m < 16 => return Err("resources.memoryMb must be at least 16".into()),
        Some(m) if m > t.memory_mb => {
            return Err(format!("resources.memoryMb is {m}, above the template's ceiling of {} MiB", t.memory_mb));
        }
        Some(m) => m,
    };
    Ok((cpus, memory_mb))
}

/// A docker provider's config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DockerConfig {
    /// What agents dial.
    pub server_url: String,
    /// The engine's socket.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The container network.
    #[serde(default)]
    pub network: Option<String>,
    /// A host path mounted over the image's agent.
    #[serde(default)]
    pub agent_binary: Option<String>,
    /// Templates by name.
    #[serde(default)]
    pub templates: HashMap<String, Template>,
    /// The call deadline (read by the factory).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// A private CA (PEM) the agents pin for `serverUrl`.
    #[serde(default)]
    pub ca_cert: Option<String>,
    /// Who enforces egress from the provider's networks: `node` (default) or `operator`.
    #[serde(default)]
    pub egress: Option<String>,
    /// The warm pools by template key ([`pool`]).
    #[serde(default)]
    pub pool: HashMap<String, PoolConfig>,
}

impl DockerConfig {
    /// Parses and checks a provider record's config (user input: every problem is named).
    pub fn parse(config: &serde_json::Map<String, serde_json::Value>) -> Result<DockerConfig, String> {
        let c: DockerConfig = serde_json::from_value(serde_json::Value::Object(config.clone()))
            .map_err(|e| format!("docker provider config: {e}"))?;
        if !(c.server_url.starts_with("http://") || c.server_url.starts_with("https://")) {
            return Err("docker provider config: serverUrl must be an http:// or https:// URL".into());
        }
        if let Some(e) = &c.endpoint
            && !e.starts_with("unix://")
        {
            return Err("docker provider config: endpoint must be a unix:// socket".into());
        }
        if let Some(ca) = &c.ca_cert {
            if !c.server_url.starts_with("https://") {
                return Err("docker provider config: caCert pins the CA of an https:// serverUrl".into());
            }
            if !ca.trim_start().starts_with("-----BEGIN CERTIFICATE-----") || ca.len() > 16 * 1024 {
                return Err(
                    "docker provider config: caCert must be one PEM certificate (-----BEGIN CERTIFICATE-----)".into()
                );
            }
        }
        if let Some(b) = &c.agent_binary
            && !b.starts_with('/')
        {
            return Err("docker provider config: agentBinary must be an absolute path".into());
        }
        match c.egress.as_deref() {
            None | Some("node") | Some("operator") => {}
            Some(other) => {
                return Err(format!(
                    "docker provider config: egress must be \"node\" (the node installs the sandboxes' egress rules) or \"operator\" (the operator enforces them), not {other:?}"
                ));
            }
        }
        for (name, t) in &c.templates {
            if !t.allow_private.is_empty() {
                if !c.node_egress() {
                    return Err(format!(
                        "docker provider config: template {name:?}: allowPrivate opens ranges in the node's egress rules, which a named network or \"egress\": \"operator\" does not have"
                    ));
                }
                crate::egress::parse_allowed(&t.allow_private)
                    .map_err(|e| format!("docker provider config: template {name:?}: allowPrivate: {e}"))?;
            }
            if t.hosts.len() > 64 {
                return Err(format!("docker provider config: template {name:?}: hosts names at most 64 names"));
            }
            for (host, ip) in &t.hosts {
                let named = matches!(
                    computerd_proto::egress::Target::parse(host),
                    Ok(computerd_proto::egress::Target::Name(_))
                );
                if !named || ip.parse::<std::net::IpAddr>().is_err() {
                    return Err(format!(
                        "docker provider config: template {name:?}: hosts maps host names to IP addresses, not {host:?} to {ip:?}"
                    ));
                }
            }
            let ok = !t.image.is_empty()
                && t.cpus > 0.0
                && t.cpus <= 256.0
                && (16..=1 << 20).contains(&t.memory_mb)
                && (16..=1 << 20).contains(&t.pids);
            if !ok {
                return Err(format!(
                    "docker provider config: template {name:?} needs an image, 0 < cpus <= 256, memoryMb and pids in 16..=1048576"
                ));
            }
        }
        pool::check(&c)?;
        Ok(c)
    }

    /// Whether the node installs egress rules for this provider's sandboxes (its own networks,
    /// unless the operator said they enforce egress).
    pub fn node_egress(&self) -> bool {
        self.network.is_none() && self.egress.as_deref() != Some("operator")
    }

    /// The named template; without a name, `desktop` (else the desktop image) for a Computer
    /// with a desktop, `default` (else the default image) for one without.
    pub fn template(&self, name: Option<&str>, desktop: bool) -> Result<Template, ProviderError> {
        match name {
            Some(n) => self
                .templates
                .get(n)
                .cloned()
                .ok_or_else(|| ProviderError::NotSent(format!("the provider has no template {n:?}"))),
            None if desktop => Ok(self.templates.get("desktop").cloned().unwrap_or_else(Template::desktop_image)),
            None => Ok(self.templates.get("default").cloned().unwrap_or_else(Template::default_image)),
        }
    }
}

/// The host's address on the provider's own sandbox network ([`SANDBOX_NETWORK`], made when
/// missing): where a sandbox on it reaches the host. Read from the network's gateway, or, when
/// the engine names none, as the address the host's kernel would send from into the subnet.
pub async fn bridge_address(endpoint: Option<&str>) -> Result<std::net::IpAddr, String> {
    let socket = endpoint.unwrap_or("unix:///var/run/docker.sock");
    let docker = Docker::connect_with_socket(socket, 5, bollard::API_DEFAULT_VERSION)
        .map_err(|e| format!("cannot use the Docker socket {socket}: {e}"))?;
    let docker =
        docker.negotiate_version().await.map_err(|e| format!("the Docker engine at {socket} did not answer: {e}"))?;
    let id = ensure_network(&docker).await.map_err(|e| format!("the sandbox network {SANDBOX_NETWORK}: {e}"))?;
    let net = docker
        .inspect_network(&id, None::<bollard::query_parameters::InspectNetworkOptions>)
        .await
        .map_err(|e| format!("the Docker engine has no usable network {SANDBOX_NETWORK}: {e}"))?;
    let configs = net.ipam.and_then(|i| i.config).unwrap_or_default();
    for c in &configs {
        if let Some(gw) = c.gateway.as_deref().and_then(|g| g.parse().ok()) {
            return Ok(gw);
        }
    }
    for c in &configs {
        let Some((base, _)) = c.subnet.as_deref().and_then(|s| s.split_once('/')) else { continue };
        let Ok(std::net::IpAddr::V4(base)) = base.parse::<std::net::IpAddr>() else { continue };
        // A datagram socket "connected" into the subnet sends nothing; its local address is the
        // host's own on that network.
        let probe = std::net::Ipv4Addr::from(u32::from(base) + 2);
        let udp = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        if udp.connect((probe, 9)).is_ok()
            && let Ok(local) = udp.local_addr()
        {
            return Ok(local.ip());
        }
    }
    Err(format!("the Docker network {SANDBOX_NETWORK} names no gateway or IPv4 subnet"))
}

/// The host and port of a `serverUrl` (`http(s)://host[:port][/...]`; 80 or 443 by default).
pub(crate) fn server_host_port(url: &str) -> (String, u16) {
    let (rest, default) = match url.strip_prefix("https://") {
        Some(r) => (r, 443),
        None => (url.strip_prefix("http://").unwrap_or(url), 80),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').unwrap_or((v6, ""));
        let port = after.strip_prefix(':').and_then(|p| p.parse().ok()).unwrap_or(default);
        return (host.to_string(), port);
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().unwrap_or(default)),
        None => (authority.to_string(), default),
    }
}

/// A sortable key of an engine timestamp (RFC 3339 with up to nine, trimmed, fraction digits).
fn created_key(created: &str) -> String {
    let (secs, rest) = created.split_once('.').unwrap_or((created.trim_end_matches('Z'), ""));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    format!("{secs}.{digits:0<9}")
}

/// The network of the sandboxes whose template opens `allowed` (sorted, no repeats):
/// [`SANDBOX_NETWORK`] when it opens nothing, else `computerd-sandboxes-<hash of the set>`
/// (FNV-1a, stable across builds, so every node on one engine picks the same).
pub fn network_name(allowed: &[crate::egress::Cidr]) -> String {
    if allowed.is_empty() {
        return SANDBOX_NETWORK.to_string();
    }
    let text = allowed.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{SANDBOX_NETWORK}-{h:016x}")
}

/// The id of the oldest network named `name` (by creation, then id), if any; an error when that
/// network lets sandboxes talk to each other.
async fn oldest_network(docker: &Docker, name: &str) -> Result<Option<String>, DockerError> {
    let filters = HashMap::from([("name", vec![name])]);
    let opts = bollard::query_parameters::ListNetworksOptionsBuilder::new().filters(&filters).build();
    let mut nets: Vec<_> =
        docker.list_networks(Some(opts)).await?.into_iter().filter(|n| n.name.as_deref() == Some(name)).collect();
    nets.sort_by_key(|n| (n.created.as_deref().map(created_key), n.id.clone()));
    let Some(n) = nets.into_iter().next() else { return Ok(None) };
    let icc_off = n.options.as_ref().and_then(|o| o.get(ICC_OPTION)).is_some_and(|v| v == "false");
    if !icc_off {
        return Err(DockerError::DockerResponseServerError {
            status_code: 409,
            message: format!(
                "the network {name} exists without {ICC_OPTION}=false, so its sandboxes could reach each other: remove it, or name a network in the provider config"
            ),
        });
    }
    Ok(n.id)
}

/// Finds the provider's own sandbox network, or creates it: a bridge with inter-container
/// traffic off. Safe when several nodes race: an engine may then hold several networks of that
/// name (older engines do not refuse duplicates); every caller settles on the oldest and removes
/// the one it made if that is not it. Answers its id.
pub async fn ensure_network(docker: &Docker) -> Result<String, DockerError> {
    ensure_network_for(docker, &[]).await
}

/// [`ensure_network`] for the network of the sandboxes whose template opens `allowed`
/// ([`network_name`]); its label `computerd.allow-private` lists them.
pub async fn ensure_network_for(docker: &Docker, allowed: &[crate::egress::Cidr]) -> Result<String, DockerError> {
    let name = network_name(allowed);
    let name = name.as_str();
    if let Some(id) = oldest_network(docker, name).await? {
        return Ok(id);
    }
    let mut labels = HashMap::from([("computerd.network".to_string(), "sandboxes".to_string())]);
    if !allowed.is_empty() {
        let list = allowed.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        labels.insert("computerd.allow-private".to_string(), list);
    }
    let request = bollard::models::NetworkCreateRequest {
        name: name.into(),
        driver: Some("bridge".into()),
        options: Some(HashMap::from([(ICC_OPTION.to_string(), "false".to_string())])),
        labels: Some(labels),
        ..Default::default()
    };
    let mine = match docker.create_network(request).await {
        Ok(r) => Some(r.id),
        // Another caller made it meanwhile (engines that check names answer 409).
        Err(DockerError::DockerResponseServerError { status_code: 409, .. }) => None,
        Err(e) => return Err(e),
    };
    let oldest = oldest_network(docker, name).await?;
    if let (Some(mine), Some(oldest)) = (&mine, &oldest)
        && mine != oldest
    {
        // Unused as yet by anyone who settled on the oldest; an error leaves an idle network.
        let _ = docker.remove_network(mine).await;
    }
    oldest.ok_or_else(|| DockerError::DockerResponseServerError {
        status_code: 404,
        message: format!("the network {name} vanished just after it was made"),
    })
}

/// The adapter of one docker provider record.
pub struct DockerProvider {
    config: DockerConfig,
    client: OnceCell<Docker>,
    timeout: Duration,
}

/// The container name of a Computer.
pub fn container_name(computer_id: &str) -> String {
    format!("computerd-{computer_id}")
}

/// The runtime volume of a Computer: one named Docker volume per home key, the Computer's id
/// (never a path a caller chooses), kept by the engine apart from any container, so it outlives
/// a remove and a recreate.
pub fn runtime_volume(computer_id: &str) -> String {
    format!("computerd-runtime-{computer_id}")
}

/// The volume mounted at [`RUNTIME_MOUNT`] among a container's mounts, if any.
fn runtime_mount(mounts: Option<&Vec<bollard::models::MountPoint>>) -> Option<String> {
    mounts.into_iter().flatten().find(|m| m.destination.as_deref() == Some(RUNTIME_MOUNT)).and_then(|m| m.name.clone())
}

/// The runtime volume of an inspected pooled container no Computer claimed yet (still named
/// [`pool_container_name`] of its pool id), if it mounts one.
fn unclaimed_pool_volume(c: &bollard::models::ContainerInspectResponse) -> Option<String> {
    let pool_id = c.config.as_ref()?.labels.as_ref()?.get(LABEL_POOL)?;
    let name = c.name.as_deref()?.trim_start_matches('/');
    (name == pool_container_name(pool_id)).then(|| runtime_mount(c.mounts.as_ref())).flatten()
}

/// Removes container `id` with its anonymous volumes (gone already: done).
async fn remove_container(docker: &Docker, id: &str) -> Result<(), ProviderError> {
    let rm = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    match docker.remove_container(id, Some(rm)).await {
        Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        Err(e) => Err(classify(e)),
    }
}

/// Removes volume `name` (gone already: done).
async fn remove_volume(docker: &Docker, name: &str) -> Result<(), ProviderError> {
    match docker.remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>).await {
        Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        Err(e) => Err(classify(e)),
    }
}

/// Who a sandbox container is made for (a Computer's create, or a pool): its name, labels,
/// runtime volume (mounted at [`RUNTIME_MOUNT`] when the template keeps one) and environment
/// (name, value).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    name: String,
    labels: HashMap<String, String>,
    volume: String,
    env: Vec<(String, String)>,
}

/// A failure of a recreate once the old sandbox is stopped: it is kept, stopped.
fn recreate_failed(old: &str, why: impl std::fmt::Display) -> ProviderError {
    ProviderError::Refused {
        kind: RECREATE_FAILED.into(),
        message: format!("{why}; the old sandbox {old} is kept, stopped, and the recreate may be tried again"),
    }
}

/// An engine error of a read made before anything changed: nothing was done.
fn read_failed(e: DockerError, what: &str) -> ProviderError {
    match classify(e) {
        ProviderError::NotSent(m) | ProviderError::Lost(m) | ProviderError::Rejected(m) => {
            ProviderError::NotSent(format!("{what}: {m}"))
        }
        other => other,
    }
}

/// Sorts an engine error into the three failure kinds.
fn classify(e: DockerError) -> ProviderError {
    match e {
        DockerError::DockerResponseServerError { status_code, message } => {
            ProviderError::Rejected(format!("the Docker engine answered {status_code}: {message}"))
        }
        DockerError::SocketNotFoundError(p) => ProviderError::NotSent(format!("no Docker socket at {p}")),
        DockerError::HyperLegacyError { err } if err.is_connect() => {
            ProviderError::NotSent(format!("cannot reach the Docker engine: {err}"))
        }
        other => ProviderError::Lost(format!("the Docker engine's answer was lost: {other}")),
    }
}

impl DockerProvider {
    /// An adapter for a parsed config; `timeout` bounds each engine request.
    pub fn new(config: DockerConfig, timeout: Duration) -> Self {
        DockerProvider { config, client: OnceCell::new(), timeout }
    }

    /// The engine client, connected and version-negotiated once. Failing here sends nothing.
    async fn docker(&self) -> Result<&Docker, ProviderError> {
        self.client
            .get_or_try_init(|| async {
                let socket = self.config.endpoint.as_deref().unwrap_or("unix:///var/run/docker.sock");
                let secs = self.timeout.as_secs().max(1);
                let d = Docker::connect_with_socket(socket, secs, bollard::API_DEFAULT_VERSION)
                    .map_err(|e| ProviderError::NotSent(format!("cannot use the Docker socket {socket}: {e}")))?;
                // The engine may speak an older API than the client: agree on one first.
                d.negotiate_version()
                    .await
                    .map_err(|e| ProviderError::NotSent(format!("the Docker engine did not answer: {e}")))
            })
            .await
    }

    /// The network a sandbox of template `t` joins: the config's, else the provider's own for
    /// the ranges `t` opens, with its egress rules (re)installed. Nothing was created yet: a
    /// failure here is a failure before the create was sent.
    async fn network(&self, docker: &Docker, t: &Template) -> Result<String, ProviderError> {
        if let Some(n) = &self.config.network {
            return Ok(n.clone());
        }
        let allowed = crate::egress::parse_allowed(&t.allow_private).map_err(ProviderError::NotSent)?;
        let not_sent = |e| match classify(e) {
            ProviderError::Lost(m) | ProviderError::NotSent(m) => ProviderError::NotSent(m),
            ProviderError::Rejected(m) | ProviderError::Refused { message: m, .. } => {
                ProviderError::NotSent(format!("the sandbox network: {m}"))
            }
        };
        let id = ensure_network_for(docker, &allowed).await.map_err(not_sent)?;
        if self.config.node_egress() {
            self.install_egress(docker, &id, allowed).await.map_err(|e| {
                ProviderError::NotSent(format!(
                    "the sandboxes' egress rules could not be installed, so no sandbox is made: {e} (run the node as root with iptables, or set \"egress\": \"operator\" if the operator enforces egress)"
                ))
            })?;
        }
        Ok(id)
    }

    /// Installs (refills) the egress rules of network `id`, whose sandboxes may reach `allowed`.
    async fn install_egress(&self, docker: &Docker, id: &str, allowed: Vec<crate::egress::Cidr>) -> Result<(), String> {
        let plan = self.egress_plan(docker, id, allowed).await.map_err(|e| format!("the network {id}: {e}"))?;
        tokio::task::spawn_blocking(move || crate::egress::install(&plan))
            .await
            .map_err(|e| format!("installing the egress rules: {e}"))?
    }

    /// Refills the egress rules of every network of this provider's templates that exists: on
    /// each sandbox-watch pass (the leader's, every few seconds), so rules flushed by someone
    /// else, or lost with a reboot, come back without waiting for a create. Failures are logged.
    async fn refresh_egress(&self, docker: &Docker) {
        if !self.config.node_egress() {
            return;
        }
        let mut sets = BTreeSet::from([Vec::new()]);
        sets.extend(self.config.templates.values().filter_map(|t| crate::egress::parse_allowed(&t.allow_private).ok()));
        for allowed in sets {
            let name = network_name(&allowed);
            let id = match oldest_network(docker, &name).await {
                Ok(Some(id)) => id,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(network = %name, error = %e, "cannot look up a sandbox network");
                    continue;
                }
            };
            if let Err(e) = self.install_egress(docker, &id, allowed).await {
                tracing::warn!(network = %name, error = %e, "cannot refill the sandboxes' egress rules");
            }
        }
    }

    /// What the egress rules of network `id` let through.
    async fn egress_plan(
        &self,
        docker: &Docker,
        id: &str,
        allowed: Vec<crate::egress::Cidr>,
    ) -> Result<crate::egress::Plan, DockerError> {
        let net = docker.inspect_network(id, None::<bollard::query_parameters::InspectNetworkOptions>).await?;
        let bridge = net
            .options
            .as_ref()
            .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
            .unwrap_or_else(|| format!("br-{}", id.get(..12).unwrap_or(id)));
        let (host, agent_port) = server_host_port(&self.config.server_url);
        // The agents' server passes the private ranges too (a load balancer on the LAN); one of
        // the host's own addresses needs no such rule (its packets take INPUT).
        let blocked = crate::egress::blocked();
        let agent_hosts = tokio::net::lookup_host((host.as_str(), agent_port))
            .await
            .map(|a| {
                a.map(|a| a.ip())
                    .filter(|ip| blocked.iter().any(|b| b.contains(*ip)) && !crate::egress::is_local(*ip))
                    .collect()
            })
            .unwrap_or_default();
        Ok(crate::egress::Plan {
            bridge,
            ipv6: net.enable_ipv6.unwrap_or(false),
            agent_port,
            agent_hosts,
            allowed,
            resolvers: crate::egress::host_resolvers(),
        })
    }

    /// Moves an older sandbox's tool runtime out of its writable layer ([`RUNTIME_MOUNT`] in the
    /// stopped container `old`) into the Computer's runtime volume: the engine's archive of that
    /// directory (a tar read from the stopped container, over the Engine API, so the engine may
    /// be on another host) is streamed into `computer-agent load-runtime` in a loader container
    /// of the new template's image that mounts the volume, with no network and only the
    /// capabilities that keep owners and modes. The loader checks every member, stages into the
    /// volume's protected staging, verifies the snapshot, and publishes durably; `--or-same`
    /// makes a second try after a publish (a later step failed) a no-op. A sandbox that never
    /// made a runtime has nothing to move. Any failure keeps `old` stopped.
    async fn migrate(&self, old: &str, t: &Template, volume: &str) -> Result<(), ProviderError> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        // The archive's stream, the attach and the wait last as long as the load: a client of
        // their own, whose requests may take the migration's whole deadline.
        let socket = self.config.endpoint.as_deref().unwrap_or("unix:///var/run/docker.sock");
        let long = Docker::connect_with_socket(socket, MIGRATION_TIMEOUT.as_secs(), bollard::API_DEFAULT_VERSION)
            .map_err(|e| recreate_failed(old, format!("cannot use the Docker socket {socket}: {e}")))?;
        let docker = &long
            .negotiate_version()
            .await
            .map_err(|e| recreate_failed(old, format!("the Docker engine did not answer: {e}")))?;
        // `DIR/.`: the engine's tar of the directory's contents, rooted at `./` (the loader's root).
        let path = format!("{RUNTIME_MOUNT}/.");
        let opts = bollard::query_parameters::DownloadFromContainerOptionsBuilder::new().path(&path).build();
        let mut archive = docker.download_from_container(old, Some(opts));
        let first = match archive.next().await {
            Some(Ok(chunk)) => chunk,
            None | Some(Err(DockerError::DockerResponseServerError { status_code: 404, .. })) => return Ok(()),
            Some(Err(e)) => return Err(recreate_failed(old, format!("reading the old runtime: {}", classify(e)))),
        };
        let short = old.get(..12).unwrap_or(old);
        let mount = bollard::models::Mount {
            target: Some("/volume".into()),
            source: Some(volume.to_string()),
            typ: Some(bollard::models::MountType::VOLUME),
            ..Default::default()
        };
        let binds = self.config.agent_binary.as_ref().map(|b| vec![format!("{b}:{AGENT_PATH}:ro")]);
        let body = ContainerCreateBody {
            image: Some(t.image.clone()),
            cmd: Some(
                [AGENT_PATH, "load-runtime", "--archive", "-", "--into", "/volume", "--or-same"]
                    .map(String::from)
                    .to_vec(),
            ),
            labels: Some(HashMap::from([("computerd.runtime-load".to_string(), old.to_string())])),
            // The loader's test hook (it pauses at a publish step, to be killed there), passed on
            // only when the node itself runs with it.
            env: std::env::var(LOAD_PAUSE_ENV).ok().map(|step| vec![format!("{LOAD_PAUSE_ENV}={step}")]),
            open_stdin: Some(true),
            stdin_once: Some(true),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                binds,
                mounts: Some(vec![mount]),
                // The loader streams (1 MiB buffers) and hashes on a few threads.
                memory: Some(1 << 30),
                pids_limit: Some(64),
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: Some(["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"].map(String::from).to_vec()),
                security_opt: Some(vec!["no-new-privileges".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = format!("computerd-load-{short}");
        let failed = |why: String| recreate_failed(old, format!("the runtime migration: {why}"));
        // A loader of an earlier try that was cut off goes first.
        let rm = RemoveContainerOptionsBuilder::new().force(true).build();
        let _ = docker.remove_container(&name, Some(rm.clone())).await;
        let opts = CreateContainerOptionsBuilder::new().name(&name).build();
        let loader = docker.create_container(Some(opts), body).await.map_err(|e| failed(classify(e).to_string()))?.id;
        let run = async {
            let attach = bollard::query_parameters::AttachContainerOptionsBuilder::new()
                .stdin(true)
                .stdout(true)
                .stderr(true)
                .stream(true)
                .build();
            let bollard::container::AttachContainerResults { mut output, mut input } =
                docker.attach_container(&loader, Some(attach)).await.map_err(|e| classify(e).to_string())?;
            docker.start_container(&loader, None).await.map_err(|e| classify(e).to_string())?;
            let said = async {
                let mut text = Vec::new();
                while let Some(Ok(o)) = output.next().await {
                    if text.len() < 64 * 1024 {
                        text.extend_from_slice(&o.into_bytes());
                    }
                }
                String::from_utf8_lossy(&text).into_owned()
            };
            let feed = async {
                input.write_all(&first).await?;
                while let Some(chunk) = archive.next().await {
                    let chunk = chunk.map_err(|e| std::io::Error::other(format!("reading the old runtime: {e}")))?;
                    input.write_all(&chunk).await?;
                }
                input.shutdown().await
            };
            let (fed, said) = tokio::join!(feed, said);
            let wait = bollard::query_parameters::WaitContainerOptionsBuilder::new().build();
            let code = match docker.wait_container(&loader, Some(wait)).next().await {
                Some(Ok(w)) => w.status_code,
                // A non-zero exit comes as an error carrying the code.
                Some(Err(DockerError::DockerContainerWaitError { code, .. })) => code,
                Some(Err(e)) => return Err(format!("waiting for the loader: {e}")),
                None => return Err("the loader's wait ended without a code".into()),
            };
            // The loader's answer is its last JSON line.
            let answer =
                said.lines().rev().find(|l| l.trim_start().starts_with('{')).unwrap_or(said.trim()).to_string();
            // A loader that finished an earlier try's journaled publish reads no archive.
            let resumed = serde_json::from_str::<serde_json::Value>(&answer).is_ok_and(|v| v["resumed"] == true);
            match (code, fed) {
                (0, Ok(())) => Ok(answer),
                (0, Err(_)) if resumed => Ok(answer),
                (0, Err(e)) => Err(format!("the archive did not reach the loader whole: {e}")),
                (code, _) => Err(format!("the loader refused it (exit {code}): {answer}")),
            }
        };
        let result = run.await;
        let _ = docker.remove_container(&loader, Some(rm)).await;
        match result {
            Ok(answer) => {
                tracing::info!(old = %old, volume = %volume, loaded = %answer, "runtime migrated");
                Ok(())
            }
            Err(why) => Err(failed(why)),
        }
    }

    /// Makes a volume for a tool runtime, `volume`, labelled `label`=`value` (the Computer, or
    /// the pool id); making an existing one answers it. Nothing else has changed yet: a failure
    /// sends nothing.
    async fn ensure_volume(
        &self,
        docker: &Docker,
        volume: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), ProviderError> {
        let request = bollard::models::VolumeCreateRequest {
            name: Some(volume.to_string()),
            labels: Some(labels),
            ..Default::default()
        };
        docker.create_volume(request).await.map(|_| ()).map_err(|e| read_failed(e, "the runtime volume"))
    }

    /// Who the sandbox of a create of `spec` is made for: named for its Computer, labelled with
    /// it and the command key, on its runtime volume, with the create's env and the agent's.
    fn create_owner(&self, spec: &CreateSpec) -> Owner {
        Owner {
            name: container_name(&spec.computer_id),
            labels: HashMap::from([
                (LABEL_COMPUTER.to_string(), spec.computer_id.clone()),
                (LABEL_KEY.to_string(), spec.command_key.clone()),
            ]),
            volume: runtime_volume(&spec.computer_id),
            env: crate::provider::sandbox_env(spec, &self.config.server_url, self.config.ca_cert.as_deref()),
        }
    }

    /// Creates and starts a sandbox container for `owner`; a refused start removes it, so a
    /// refusal leaves none.
    async fn create_and_start(
        &self,
        docker: &Docker,
        owner: &Owner,
        t: &Template,
        size: (f64, u64),
        network: &str,
    ) -> Result<String, ProviderError> {
        let opts = CreateContainerOptionsBuilder::new().name(&owner.name).build();
        let body = self.container_body(owner, t, size, network);
        let created = docker.create_container(Some(opts), body).await.map_err(classify)?;
        match docker.start_container(&created.id, None).await {
            Ok(()) => Ok(created.id),
            Err(e) => match classify(e) {
                ProviderError::Rejected(why) => {
                    // Nothing runs: take back the container made above, so the refusal leaves none.
                    let rm = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
                    match docker.remove_container(&created.id, Some(rm)).await {
                        Ok(()) => Err(ProviderError::Rejected(why)),
                        Err(e) => Err(ProviderError::Lost(format!(
                            "the start was refused ({why}) and the container {} could not be removed: {e}",
                            created.id
                        ))),
                    }
                }
                // The container exists either way; only its start is in doubt.
                ProviderError::NotSent(m) | ProviderError::Lost(m) | ProviderError::Refused { message: m, .. } => {
                    Err(ProviderError::Lost(m))
                }
            },
        }
    }

    /// The container of a sandbox for `owner`. `cpus` and `memory_mb` are the sandbox's
    /// ([`within`]).
    fn container_body(
        &self,
        owner: &Owner,
        t: &Template,
        (cpus, memory_mb): (f64, u64),
        network: &str,
    ) -> ContainerCreateBody {
        let mut env: Vec<String> = owner.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if t.runtime_volume {
            env.push(format!("COMPUTER_AGENT_RUNTIME_VOLUME={RUNTIME_MOUNT}"));
        }
        let binds = self.config.agent_binary.as_ref().map(|b| vec![format!("{b}:{AGENT_PATH}:ro")]);
        let runtime = bollard::models::Mount {
            target: Some(RUNTIME_MOUNT.into()),
            source: Some(owner.volume.clone()),
            typ: Some(bollard::models::MountType::VOLUME),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(t.image.clone()),
            cmd: Some(vec![AGENT_PATH.to_string()]),
            env: Some(env),
            labels: Some(owner.labels.clone()),
            working_dir: Some("/root".into()),
            host_config: Some(HostConfig {
                nano_cpus: Some((cpus * 1e9) as i64),
                memory: Some((memory_mb as i64) << 20),
                pids_limit: Some(t.pids as i64),
                network_mode: Some(network.to_string()),
                // A sandbox behind a gateway shares the gateway's /etc/hosts (Docker refuses
                // extra hosts with another container's network).
                extra_hosts: (!network.starts_with("container:")).then(|| gateway::extra_hosts(&t.hosts)),
                init: Some(true),
                binds,
                mounts: t.runtime_volume.then(|| vec![runtime]),
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: Some(SANDBOX_CAPS.iter().map(|c| c.to_string()).collect()),
                security_opt: Some(vec!["no-new-privileges".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[async_trait]
impl Provider for DockerProvider {
    async fn create(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        let t = self.config.template(spec.template.as_deref(), spec.desktop)?;
        let size = within(&t, spec.resources.as_ref()).map_err(ProviderError::NotSent)?;
        // The template's image can be a sandbox (checked once per image id): a bad one is
        // refused before any container of the Computer exists.
        self.check_image(&t.image).await?;
        let docker = self.docker().await?;
        let network = self.network(docker, &t).await?;
        let owner = self.create_owner(spec);
        if t.runtime_volume {
            self.ensure_volume(
                docker,
                &owner.volume,
                HashMap::from([(LABEL_COMPUTER.to_string(), spec.computer_id.clone())]),
            )
            .await?;
        }
        let Some(policy) = &spec.egress else {
            return self.create_and_start(docker, &owner, &t, size, &network).await;
        };
        let gateway = self.ensure_gateway(docker, &spec.computer_id, &t, &network, policy).await?;
        let made = self.create_and_start(docker, &owner, &t, size, &format!("container:{gateway}")).await;
        if let Err(ProviderError::NotSent(_) | ProviderError::Rejected(_) | ProviderError::Refused { .. }) = &made
            && let Err(e) = self.remove_gateway(&spec.computer_id).await
        {
            tracing::warn!(computer = %spec.computer_id, error = %e, "the egress gateway of a refused create could not be removed");
        }
        made
    }

    fn reference_of(&self, computer_id: &str) -> Option<String> {
        Some(container_name(computer_id))
    }

    async fn recreate(&self, sandbox: &str, spec: &CreateSpec) -> Result<String, ProviderError> {
        let t = self.config.template(spec.template.as_deref(), spec.desktop)?;
        let size = within(&t, spec.resources.as_ref()).map_err(ProviderError::NotSent)?;
        self.check_image(&t.image).await?;
        let docker = self.docker().await?;
        let mut network = self.network(docker, &t).await?;
        if let Some(policy) = &spec.egress {
            // The gateway stays (or is made): the new sandbox joins it.
            let gateway = self.ensure_gateway(docker, &spec.computer_id, &t, &network, policy).await?;
            network = format!("container:{gateway}");
        }
        let name = container_name(&spec.computer_id);
        // The old sandbox as the engine has it now (gone: only the volume carries over).
        let old = match docker.inspect_container(sandbox, None).await {
            Ok(c) => Some(c),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => None,
            Err(e) => return Err(read_failed(e, "inspecting the old sandbox")),
        };
        if let Some(c) = &old {
            let labels = c.config.as_ref().and_then(|c| c.labels.as_ref());
            let labelled = labels.and_then(|l| l.get(LABEL_COMPUTER)) == Some(&spec.computer_id);
            // A pooled sandbox is its Computer's once the claim named it so.
            let claimed = labels.is_some_and(|l| l.contains_key(LABEL_POOL))
                && c.name.as_deref().map(|n| n.trim_start_matches('/')) == Some(name.as_str());
            if !(labelled || claimed) {
                return Err(ProviderError::NotSent(format!("the container {sandbox} is not this computer's sandbox")));
            }
        }
        if !t.runtime_volume {
            return Err(ProviderError::NotSent(
                "a recreate keeps the tool runtime in the Computer's runtime volume: the template must have runtimeVolume".into(),
            ));
        }
        // The volume carried over: the one the old sandbox mounts (a pooled one's is its pool
        // id's), else the Computer's own (made if missing).
        let mounted = old.as_ref().and_then(|c| runtime_mount(c.mounts.as_ref()));
        let mut owner = self.create_owner(spec);
        match mounted {
            Some(v) => owner.volume = v,
            None => {
                self.ensure_volume(
                    docker,
                    &owner.volume,
                    HashMap::from([(LABEL_COMPUTER.to_string(), spec.computer_id.clone())]),
                )
                .await?
            }
        }
        let volume = owner.volume.clone();
        let Some(old) = old else {
            // Nothing to stop or move: a new sandbox on the kept volume.
            return self.create_and_start(docker, &owner, &t, size, &network).await;
        };
        let old_id = old.id.clone().unwrap_or_else(|| sandbox.to_string());
        let state = old.state.as_ref().and_then(|s| s.status).map(|s| s.to_string()).unwrap_or_default();
        if state == "paused" {
            docker.unpause_container(&old_id).await.map_err(classify)?;
        }
        let stop = bollard::query_parameters::StopContainerOptionsBuilder::new().t(10).build();
        match docker.stop_container(&old_id, Some(stop)).await {
            // 304: it was not running.
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => {}
            Err(e) => return Err(classify(e)),
        }
        // From here the old sandbox is stopped: a failure keeps it so, for another try.
        if runtime_mount(old.mounts.as_ref()).is_none() {
            self.migrate(&old_id, &t, &volume).await?;
        }
        // The new sandbox takes the Computer's container name; the old one steps aside.
        let short = old_id.get(..12).unwrap_or(&old_id);
        let aside = format!("{name}-replaced-{short}");
        let renamed = old.name.as_deref().map(|n| n.trim_start_matches('/')) == Some(name.as_str());
        if renamed {
            let opts = bollard::query_parameters::RenameContainerOptionsBuilder::new().name(&aside).build();
            docker.rename_container(&old_id, opts).await.map_err(|e| recreate_failed(&old_id, classify(e)))?;
        }
        match self.create_and_start(docker, &owner, &t, size, &network).await {
            Ok(new) => {
                let rm = RemoveContainerOptionsBuilder::new().force(true).build();
                if let Err(e) = docker.remove_container(&old_id, Some(rm)).await {
                    // The new sandbox runs; the old one, stopped, goes with the Computer's delete.
                    tracing::warn!(old = %old_id, error = %e, "the replaced sandbox could not be removed");
                }
                Ok(new)
            }
            Err(e) => {
                if renamed {
                    let opts = bollard::query_parameters::RenameContainerOptionsBuilder::new().name(&name).build();
                    if let Err(r) = docker.rename_container(&old_id, opts).await {
                        tracing::warn!(old = %old_id, error = %r, "the kept sandbox keeps its name {aside}");
                    }
                }
                Err(match e {
                    ProviderError::Lost(m) => ProviderError::Lost(m),
                    other => recreate_failed(&old_id, other),
                })
            }
        }
    }

    async fn delete_computer(&self, sandbox: &str, computer_id: &str, _command_key: &str) -> Result<(), ProviderError> {
        let docker = self.docker().await?;
        // The runtime volumes that go too: the Computer's own, and the one each of its sandboxes
        // mounts (a pooled sandbox's is its pool id's), read before the sandboxes go.
        let mut volumes = BTreeSet::from([runtime_volume(computer_id)]);
        if !sandbox.is_empty() {
            match docker.inspect_container(sandbox, None).await {
                Ok(c) => volumes.extend(runtime_mount(c.mounts.as_ref())),
                Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
                Err(e) => return Err(read_failed(e, "inspecting the sandbox")),
            }
        }
        remove_container(docker, sandbox).await?;
        // A sandbox a failed recreate kept, stopped (a pooled one, set aside, bears the
        // Computer's name only).
        let mut kept = self.labelled(format!("{LABEL_COMPUTER}={computer_id}")).await?;
        kept.extend(self.pooled_of(computer_id).await?);
        for c in kept {
            let Some(id) = c.id else { continue };
            volumes.extend(runtime_mount(c.mounts.as_ref()));
            remove_container(docker, &id).await?;
        }
        self.remove_gateway(computer_id).await?;
        for volume in volumes {
            remove_volume(docker, &volume).await?;
        }
        Ok(())
    }

    async fn pause(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        self.docker().await?.pause_container(sandbox).await.map_err(classify)
    }

    fn ended_state(&self, state: &str) -> bool {
        // Resume unpauses; a container that exited (its agent died, or the engine restarted) is
        // not brought back by it. No restart policy is set, so `exited` stays.
        matches!(state, "exited" | "dead")
    }

    async fn resume(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        self.docker().await?.unpause_container(sandbox).await.map_err(classify)
    }

    async fn delete(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        let docker = self.docker().await?;
        // An unclaimed pooled sandbox's runtime volume is its own alone: it goes with it (a
        // Computer's goes with the Computer, `delete_computer`).
        let own_volume = match docker.inspect_container(sandbox, None).await {
            Ok(c) => unclaimed_pool_volume(&c),
            // Already gone: the effect wanted holds.
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => return Ok(()),
            Err(e) => return Err(read_failed(e, "inspecting the sandbox")),
        };
        remove_container(docker, sandbox).await?;
        match own_volume {
            Some(volume) => remove_volume(docker, &volume).await,
            None => Ok(()),
        }
    }

    async fn set_egress(
        &self,
        _sandbox: &str,
        computer_id: &str,
        policy: &computerd_proto::egress::EgressPolicy,
        revision: u64,
    ) -> Result<(), ProviderError> {
        self.set_gateway_policy(computer_id, policy, revision).await
    }

    async fn egress_stats(&self, computer_id: &str) -> Result<Option<serde_json::Value>, ProviderError> {
        self.gateway_stats(computer_id).await
    }

    async fn egress_denials(
        &self,
        computer_id: &str,
        since_ms: u64,
    ) -> Result<Option<futures::stream::BoxStream<'static, computerd_proto::egress::Denied>>, ProviderError> {
        self.gateway_denials(computer_id, since_ms).await
    }

    async fn inspect(&self, computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError> {
        let list = self.labelled(format!("{LABEL_COMPUTER}={computer_id}")).await?;
        if let Some(c) = list.iter().find(|c| is_named_for(c, computer_id)) {
            return Ok(Some(info(c)));
        }
        // A claimed pooled sandbox bears its Computer's name, not its label.
        let pooled = self.pooled_named(pool::exact_name_filter(&container_name(computer_id))).await?;
        Ok(pooled.iter().find(|c| is_named_for(c, computer_id)).or(list.first()).map(info))
    }

    async fn list(&self) -> Result<Option<HashMap<String, SandboxInfo>>, ProviderError> {
        // Two lists: the engine ANDs label filters.
        let list = self.labelled(LABEL_COMPUTER.to_string()).await?;
        let pooled = self.labelled(LABEL_POOL.to_string()).await?;
        self.refresh_egress(self.docker().await?).await;
        // A recreate's old sandbox may stand beside the new one for a moment (or stay, stopped,
        // when its removal failed): the one named for the Computer is its sandbox.
        let mut by_computer: HashMap<String, SandboxInfo> = HashMap::new();
        for c in &list {
            let Some(id) = c.labels.as_ref().and_then(|l| l.get(LABEL_COMPUTER)) else { continue };
            if by_computer.contains_key(id) && !is_named_for(c, id) {
                continue;
            }
            by_computer.insert(id.clone(), info(c));
        }
        // A claimed pooled sandbox, named for its Computer (unclaimed ones are no Computer's).
        for c in &pooled {
            let claimed = c.names.iter().flatten().find_map(|n| pool::claimed_by(n).filter(|(_, aside)| !aside));
            if let Some((id, _)) = claimed {
                by_computer.insert(id, info(c));
            }
        }
        Ok(Some(by_computer))
    }

    fn pools(&self) -> Vec<PoolWant> {
        self.config.pools()
    }

    fn pool_key(&self, spec: &CreateSpec) -> Option<String> {
        self.config.pool_key(spec)
    }

    async fn pool_start(
        &self,
        provider_id: &str,
        key: &str,
        pool_id: &str,
        token: &str,
    ) -> Result<String, ProviderError> {
        self.start_pooled(provider_id, key, pool_id, token).await
    }

    async fn pool_claimed(&self, sandbox: &str, computer_id: &str) -> Result<(), ProviderError> {
        self.claim_pooled(sandbox, computer_id).await
    }

    async fn pool_list(&self, provider_id: &str) -> Result<Vec<Pooled>, ProviderError> {
        self.list_pooled(provider_id).await
    }
}

impl DockerProvider {
    /// The sandboxes (containers labelled with a Computer id, and pooled ones) whose agents pin
    /// `ca_pem`, the private CA of the cluster that made them, as (Computer id, container); an
    /// unclaimed pooled one is keyed by its pool id (its runtime volume is
    /// `runtime_volume(pool id)`, so `delete_computer` with that key removes it whole). No label
    /// names the cluster, but the CA `computerd dev` hands its agents is its data dir's own (made
    /// there), so `computerd dev --down` finds its sandboxes this way, and no one else's.
    pub async fn pinning(&self, ca_pem: &str) -> Result<Vec<(String, SandboxInfo)>, ProviderError> {
        let docker = self.docker().await?;
        let wanted = format!("COMPUTER_AGENT_CA_PEM={ca_pem}");
        let mut candidates = Vec::new();
        for c in self.labelled(LABEL_COMPUTER.to_string()).await? {
            if let Some(computer) = c.labels.as_ref().and_then(|l| l.get(LABEL_COMPUTER)) {
                candidates.push((computer.clone(), c));
            }
        }
        for c in self.labelled(LABEL_POOL.to_string()).await? {
            let claimed = c.names.iter().flatten().find_map(|n| pool::claimed_by(n)).map(|(id, _)| id);
            if let Some(key) = claimed.or_else(|| c.labels.as_ref().and_then(|l| l.get(LABEL_POOL)).cloned()) {
                candidates.push((key, c));
            }
        }
        let mut found = Vec::new();
        for (key, c) in candidates {
            let Some(id) = c.id.as_deref() else { continue };
            let env = match docker.inspect_container(id, None).await {
                Ok(i) => i.config.and_then(|c| c.env).unwrap_or_default(),
                // Removed meanwhile.
                Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => continue,
                Err(e) => return Err(classify(e)),
            };
            if env.contains(&wanted) {
                found.push((key, info(&c)));
            }
        }
        Ok(found)
    }

    async fn labelled(&self, label: String) -> Result<Vec<bollard::models::ContainerSummary>, ProviderError> {
        let filters = HashMap::from([("label", vec![label])]);
        let opts = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        self.docker().await?.list_containers(Some(opts)).await.map_err(classify)
    }
}

/// Whether a listed container bears the name of Computer `computer_id`'s sandbox.
fn is_named_for(c: &bollard::models::ContainerSummary, computer_id: &str) -> bool {
    let want = format!("/{}", container_name(computer_id));
    c.names.iter().flatten().any(|n| *n == want)
}

fn info(c: &bollard::models::ContainerSummary) -> SandboxInfo {
    SandboxInfo {
        sandbox: c.id.clone().unwrap_or_default(),
        state: c.state.map(|s| s.to_string()).unwrap_or_else(|| "unknown".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> Result<DockerConfig, String> {
        DockerConfig::parse(v.as_object().expect("object"))
    }

    #[test]
    fn config_is_checked() {
        let ok = cfg(serde_json::json!({"serverUrl": "http://10.0.0.1:8080"})).expect("ok");
        assert_eq!(ok.template(None, false), Ok(Template::default_image()));
        assert_eq!(ok.template(None, true).map(|t| t.image), Ok(DESKTOP_IMAGE.to_string()));
        assert!(matches!(ok.template(Some("gpu"), false), Err(ProviderError::NotSent(_))));
        assert!(cfg(serde_json::json!({})).is_err(), "serverUrl is required");
        assert!(cfg(serde_json::json!({"serverUrl": "ftp://x"})).is_err());
        assert!(cfg(serde_json::json!({"serverUrl": "http://x", "endpoint": "tcp://x:2375"})).is_err());
        assert!(cfg(serde_json::json!({"serverUrl": "http://x", "agentBinary": "rel/agent"})).is_err());
        let t = serde_json::json!({"serverUrl": "http://x", "templates": {"small": {"image": "i", "cpus": 0}}});
        assert!(cfg(t).is_err());
        let t =
            serde_json::json!({"serverUrl": "http://x", "templates": {"small": {"image": "i", "privileged": true}}});
        assert!(cfg(t).is_err(), "unknown template fields are refused");
        let t = serde_json::json!({"serverUrl": "http://x", "templates": {"small": {"image": "i", "memoryMb": 256}}});
        let small = cfg(t).expect("ok").template(Some("small"), false).expect("template");
        assert_eq!((small.image.as_str(), small.memory_mb, small.cpus), ("i", 256, 1.0));
    }

    #[test]
    fn a_pinned_ca_reaches_the_agent() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let plain = serde_json::json!({"serverUrl": "http://x", "caCert": pem});
        assert!(cfg(plain).is_err_and(|e| e.contains("https://")), "a CA pins an https:// server only");
        let junk = serde_json::json!({"serverUrl": "https://x", "caCert": "hello"});
        assert!(cfg(junk).is_err_and(|e| e.contains("PEM")));
        let c = cfg(serde_json::json!({"serverUrl": "https://172.17.0.1:8080", "caCert": pem})).expect("ok");
        let p = DockerProvider::new(c, Duration::from_secs(1));
        let spec = CreateSpec {
            computer_id: "cmp_1".into(),
            command_key: "k".into(),
            template: None,
            desktop: false,
            pairing_code: Some("code".into()),
            first_uid: Some(265_536),
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
        };
        let body = p.container_body(&p.create_owner(&spec), &Template::default_image(), (1.0, 1024), SANDBOX_NETWORK);
        let env = body.env.unwrap_or_default();
        assert!(env.contains(&format!("COMPUTER_AGENT_CA_PEM={pem}")), "{env:?}");
        assert!(!env.iter().any(|e| e.starts_with("COMPUTER_AGENT_INSECURE")), "{env:?}");
        assert!(env.contains(&"COMPUTER_AGENT_USER=user".to_string()), "{env:?}");
        assert!(env.contains(&"COMPUTER_AGENT_MCP_FIRST_UID=265536".to_string()), "{env:?}");
        let host = body.host_config.expect("host config");
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        let caps = host.cap_add.unwrap_or_default();
        assert!(!caps.iter().any(|c| c == "NET_RAW") && caps.len() == SANDBOX_CAPS.len(), "{caps:?}");
        assert_eq!(host.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(host.network_mode.as_deref(), Some(SANDBOX_NETWORK));
    }

    /// Issue 39, item 5: a create's resources stay within the template's ceilings (which are
    /// also the defaults), and its env is the container's, under the agent's own settings.
    #[tokio::test]
    async fn i39_5_resources_within_the_ceilings_and_env_in_the_container() {
        let t = serde_json::json!({"serverUrl": "http://x", "templates": {"small": {"image": "i", "cpus": 2, "memoryMb": 2048}}});
        let p = DockerProvider::new(cfg(t).expect("ok"), Duration::from_secs(1));
        let small = p.config.template(Some("small"), false).expect("template");
        let ask = |cpus: Option<f64>, memory_mb: Option<u64>| crate::provider::Resources { cpus, memory_mb };
        assert_eq!(within(&small, None), Ok((2.0, 2048)), "the template's by default");
        assert_eq!(within(&small, Some(&ask(Some(0.5), None))), Ok((0.5, 2048)));
        assert_eq!(within(&small, Some(&ask(None, Some(512)))), Ok((2.0, 512)));
        let over = within(&small, Some(&ask(Some(3.0), None))).expect_err("over");
        assert!(over.contains("resources.cpus") && over.contains("ceiling of 2 CPUs"), "{over}");
        let over = within(&small, Some(&ask(None, Some(4096)))).expect_err("over");
        assert!(over.contains("resources.memoryMb") && over.contains("2048 MiB"), "{over}");
        assert!(within(&small, Some(&ask(Some(0.0), None))).is_err());
        assert!(within(&small, Some(&ask(Some(f64::NAN), None))).is_err());

        let mut spec = CreateSpec {
            computer_id: "cmp_1".into(),
            command_key: "k".into(),
            template: Some("small".into()),
            desktop: false,
            pairing_code: Some("code".into()),
            first_uid: None,
            env: Default::default(),
            resources: Some(ask(Some(4.0), None)),
            metadata: Default::default(),
            egress: None,
        };
        // Refused before anything is sent: the engine is not asked.
        let refused = p.create(&spec).await.expect_err("over the ceiling");
        assert!(matches!(&refused, ProviderError::NotSent(m) if m.contains("ceiling")), "{refused:?}");

        spec.resources = Some(ask(Some(0.5), Some(256)));
        spec.env.insert("GREETING".into(), "hello world".into());
        spec.env.insert("HOME".into(), "/elsewhere".into());
        let size = within(&small, spec.resources.as_ref()).expect("within");
        let body = p.container_body(&p.create_owner(&spec), &small, size, SANDBOX_NETWORK);
        let env = body.env.unwrap_or_default();
        assert!(env.contains(&"GREETING=hello world".to_string()), "{env:?}");
        assert!(env.contains(&"COMPUTER_AGENT_PAIR=code".to_string()), "{env:?}");
        assert_eq!(
            env.iter().filter(|e| e.starts_with("HOME=")).collect::<Vec<_>>(),
            ["HOME=/root"],
            "the agent's own win"
        );
        let host = body.host_config.expect("host config");
        assert_eq!((host.nano_cpus, host.memory), (Some(500_000_000), Some(256 << 20)));
    }

    #[test]
    fn templates_open_private_ranges_on_networks_of_their_own() {
        let t = serde_json::json!({"serverUrl": "http://x", "templates": {
            "lan": {"image": "i", "allowPrivate": ["10.20.0.0/16", "169.254.169.254/32"]},
            "plain": {"image": "i"},
        }});
        let c = cfg(t).expect("ok");
        assert!(c.node_egress());
        let lan = c.template(Some("lan"), false).expect("template");
        let allowed = crate::egress::parse_allowed(&lan.allow_private).expect("ranges");
        let name = network_name(&allowed);
        assert!(name.starts_with("computerd-sandboxes-") && name.len() == SANDBOX_NETWORK.len() + 17, "{name}");
        let reordered =
            crate::egress::parse_allowed(&["169.254.169.254/32".into(), "10.20.0.0/16".into()]).expect("ok");
        assert_eq!(network_name(&reordered), name, "one network per set of ranges, in any order");
        assert_eq!(network_name(&[]), SANDBOX_NETWORK);
        for (bad, says) in [
            (serde_json::json!(["10.20.0.1/16"]), "host bits"),
            (serde_json::json!(["8.8.8.0/24"]), "not inside"),
            (serde_json::json!(["nonsense"]), "not a CIDR"),
            (serde_json::json!("10.0.0.0/8"), "sequence"),
        ] {
            let t =
                serde_json::json!({"serverUrl": "http://x", "templates": {"t": {"image": "i", "allowPrivate": bad}}});
            assert!(cfg(t).is_err_and(|e| e.contains(says)), "{says}");
        }
        let named = serde_json::json!({"serverUrl": "http://x", "network": "bridge",
            "templates": {"t": {"image": "i", "allowPrivate": ["10.0.0.0/8"]}}});
        assert!(cfg(named).is_err_and(|e| e.contains("named network")));
        let op = serde_json::json!({"serverUrl": "http://x", "egress": "operator"});
        assert!(!cfg(op).expect("ok").node_egress());
        assert!(
            cfg(serde_json::json!({"serverUrl": "http://x", "egress": "none"})).is_err_and(|e| e.contains("egress"))
        );
    }

    fn pooled_cfg() -> DockerConfig {
        cfg(serde_json::json!({"serverUrl": "https://172.17.0.1:8080",
            "caCert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "templates": {"small": {"image": "i", "memoryMb": 256}, "nopool": {"image": "i"}, "shown": {"image": "d"}},
            "pool": {"default": {"size": 2}, "desktop": {"size": 1}, "small": {"size": 3},
                "nopool": {"size": 0}, "shown": {"size": 1, "desktop": true}}}))
        .expect("ok")
    }

    fn plain_spec(template: Option<&str>, desktop: bool) -> CreateSpec {
        CreateSpec {
            computer_id: "cmp_1".into(),
            command_key: "k".into(),
            template: template.map(String::from),
            desktop,
            pairing_code: Some("code".into()),
            first_uid: Some(265_536),
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
        }
    }

    #[test]
    fn pool_config_is_checked() {
        let with = |pool: serde_json::Value| {
            cfg(serde_json::json!({"serverUrl": "http://x",
                "templates": {"a": {"image": "i"}, "b": {"image": "i"}, "c": {"image": "i"}},
                "pool": pool}))
        };
        assert!(with(serde_json::json!({"a": {"size": 8}})).is_ok());
        let over = with(serde_json::json!({"a": {"size": 9}})).expect_err("over the size ceiling");
        assert!(over.contains("\"a\"") && over.contains("at most 8"), "{over}");
        let total = with(serde_json::json!({"a": {"size": 8}, "b": {"size": 8}, "c": {"size": 1}})).expect_err("total");
        assert!(total.contains("add up to 17") && total.contains("at most 16"), "{total}");
        assert!(with(serde_json::json!({"a": {"size": 8}, "b": {"size": 8}, "c": {"size": 0}})).is_ok());
        let unknown = with(serde_json::json!({"gpu": {"size": 1}})).expect_err("no such template");
        assert!(unknown.contains("\"gpu\"") && unknown.contains("names no template"), "{unknown}");
        assert!(with(serde_json::json!({"default": {"size": 1}, "desktop": {"size": 1}})).is_ok());
        assert!(with(serde_json::json!({"a": {"size": 1, "warm": true}})).is_err(), "unknown pool fields are refused");
        assert!(with(serde_json::json!({"a": {}})).is_err(), "size is required");
        let dead = with(serde_json::json!({"default": {"size": 1, "desktop": true}})).expect_err("serves nothing");
        assert!(dead.contains("desktop must be false"), "{dead}");
        let dead = with(serde_json::json!({"desktop": {"size": 1, "desktop": false}})).expect_err("serves nothing");
        assert!(dead.contains("desktop must be true"), "{dead}");
        let templates: serde_json::Map<_, _> =
            (0..9).map(|i| (format!("t{i}"), serde_json::json!({"image": "i"}))).collect();
        let pool: serde_json::Map<_, _> = (0..9).map(|i| (format!("t{i}"), serde_json::json!({"size": 0}))).collect();
        let many = cfg(serde_json::json!({"serverUrl": "http://x", "templates": templates, "pool": pool}));
        assert!(many.is_err_and(|e| e.contains("9 keys") && e.contains("at most 8")));

        // `desktop` defaults to the key being `desktop`; size 0 keeps no pool.
        let c = pooled_cfg();
        let want = |key: &str, desktop: bool, size: u32| PoolWant { key: key.into(), desktop, size };
        assert_eq!(
            c.pools(),
            [want("default", false, 2), want("desktop", true, 1), want("shown", true, 1), want("small", false, 3)]
        );
        let p = DockerProvider::new(c, Duration::from_secs(1));
        assert_eq!(Provider::pools(&p).len(), 4);
        assert_eq!(p.config.pool_template("small").map(|t| t.memory_mb), Ok(256));
        assert_eq!(p.config.pool_template("desktop").map(|t| t.image), Ok(DESKTOP_IMAGE.to_string()));
        assert_eq!(p.config.pool_template("default").map(|t| t.image), Ok(DEFAULT_IMAGE.to_string()));
        assert!(matches!(p.config.pool_template("gpu"), Err(ProviderError::NotSent(_))));
        assert!(cfg(serde_json::json!({"serverUrl": "http://x"})).expect("ok").pools().is_empty());
    }

    #[test]
    fn pool_keys_serve_only_creates_a_pooled_sandbox_fits() {
        let p = DockerProvider::new(pooled_cfg(), Duration::from_secs(1));
        let key = |spec: &CreateSpec| Provider::pool_key(&p, spec);
        assert_eq!(key(&plain_spec(None, false)).as_deref(), Some("default"));
        assert_eq!(key(&plain_spec(None, true)).as_deref(), Some("desktop"));
        assert_eq!(key(&plain_spec(Some("small"), false)).as_deref(), Some("small"), "a template's pool");
        assert_eq!(key(&plain_spec(Some("shown"), true)).as_deref(), Some("shown"));
        assert_eq!(key(&plain_spec(Some("small"), true)), None, "a desktop the pool has not");
        assert_eq!(key(&plain_spec(Some("shown"), false)), None, "a desktop the create did not ask");
        assert_eq!(key(&plain_spec(Some("nopool"), false)), None, "size 0");
        assert_eq!(key(&plain_spec(Some("gpu"), false)), None, "no such template: the create refuses it");
        let mut spec = plain_spec(Some("small"), false);
        spec.egress = Some(serde_json::from_value(serde_json::json!({"default": "allow"})).expect("policy"));
        assert_eq!(key(&spec), None, "an egress policy needs a gateway made with the sandbox");
        let mut spec = plain_spec(Some("small"), false);
        spec.resources = Some(crate::provider::Resources { cpus: Some(0.5), memory_mb: None });
        assert_eq!(key(&spec), None, "resources of its own");
        let none = DockerProvider::new(cfg(serde_json::json!({"serverUrl": "http://x"})).expect("ok"), Duration::ZERO);
        assert_eq!(Provider::pool_key(&none, &plain_spec(None, false)), None, "no pool configured");
    }

    #[test]
    fn a_pooled_container_waits_for_its_identity() {
        let p = DockerProvider::new(pooled_cfg(), Duration::from_secs(1));
        let owner = p.pool_owner("cpp_1", "small", false, "p1", "tok");
        assert_eq!(owner.name, "computerd-pool-p1");
        assert_eq!(owner.name, pool_container_name("p1"));
        assert_eq!(owner.volume, "computerd-runtime-p1");
        let t = p.config.pool_template("small").expect("template");
        let body = p.container_body(&owner, &t, (t.cpus, t.memory_mb), SANDBOX_NETWORK);
        let labels = body.labels.clone().unwrap_or_default();
        assert_eq!(
            labels,
            HashMap::from([
                (LABEL_POOL.to_string(), "p1".to_string()),
                (LABEL_POOL_KEY.to_string(), "small".to_string()),
                (LABEL_POOL_PROVIDER.to_string(), "cpp_1".to_string())
            ]),
            "the pool's labels, no Computer's"
        );
        let env = body.env.clone().unwrap_or_default();
        for want in [
            "COMPUTER_AGENT_POOL_ID=p1",
            "COMPUTER_AGENT_POOL_TOKEN=tok",
            "COMPUTER_AGENT_SERVER=https://172.17.0.1:8080",
            "COMPUTER_AGENT_USER=user",
            &format!("COMPUTER_AGENT_RUNTIME_VOLUME={RUNTIME_MOUNT}"),
        ] {
            assert!(env.iter().any(|e| e == want), "{want}: {env:?}");
        }
        assert!(env.iter().any(|e| e.starts_with("COMPUTER_AGENT_CA_PEM=")), "{env:?}");
        for absent in ["COMPUTER_AGENT_PAIR", "COMPUTER_AGENT_MCP_FIRST_UID", "COMPUTER_AGENT_DESKTOP"] {
            assert!(!env.iter().any(|e| e.starts_with(absent)), "{absent}: {env:?}");
        }
        let host = body.host_config.expect("host config");
        let mounts = host.mounts.unwrap_or_default();
        assert_eq!(mounts.len(), 1);
        assert_eq!(
            (mounts[0].source.as_deref(), mounts[0].target.as_deref()),
            (Some("computerd-runtime-p1"), Some(RUNTIME_MOUNT))
        );
        assert_eq!(host.memory, Some(256 << 20), "the template's size");
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));

        // A desktop pool's agent keeps a desktop.
        let desk = p.pool_owner("cpp_1", "desktop", true, "p2", "tok2");
        assert!(desk.env.iter().any(|(k, _)| k == "COMPUTER_AGENT_DESKTOP"), "{:?}", desk.env);
        // A create's sandbox keeps the Computer's labels, name and volume.
        let created = p.create_owner(&plain_spec(None, false));
        assert_eq!((created.name.as_str(), created.volume.as_str()), ("computerd-cmp_1", "computerd-runtime-cmp_1"));
        assert_eq!(created.labels.get(LABEL_COMPUTER).map(String::as_str), Some("cmp_1"));
        assert!(!created.labels.contains_key(LABEL_POOL));
        assert!(created.env.iter().any(|(k, v)| k == "COMPUTER_AGENT_PAIR" && v == "code"));
    }

    #[test]
    fn pooled_names_say_who_claimed_them() {
        assert_eq!(pool::claimed_by("/computerd-cmp_1"), Some(("cmp_1".to_string(), false)));
        assert_eq!(pool::claimed_by("computerd-cmp_1"), Some(("cmp_1".to_string(), false)));
        assert_eq!(pool::claimed_by("/computerd-cmp_1-replaced-0123456789ab"), Some(("cmp_1".to_string(), true)));
        assert_eq!(pool::claimed_by("/computerd-pool-p1"), None, "unclaimed");
        assert_eq!(pool::claimed_by("/computerd-"), None);
        assert_eq!(pool::claimed_by("/other"), None);
        assert_eq!(pool::exact_name_filter("computerd-cmp_1"), "^/computerd-cmp_1$");
        assert_eq!(pool::exact_name_filter("a.b"), "^/a\\.b$");
    }

    #[test]
    fn the_agents_port_is_read_from_the_server_url() {
        assert_eq!(server_host_port("https://172.18.0.1:8443"), ("172.18.0.1".into(), 8443));
        assert_eq!(server_host_port("https://lb.example/x"), ("lb.example".into(), 443));
        assert_eq!(server_host_port("http://lb.example"), ("lb.example".into(), 80));
        assert_eq!(server_host_port("http://[fd00::1]:9000/"), ("fd00::1".into(), 9000));
    }

    #[test]
    fn engine_timestamps_sort_by_time() {
        let a = created_key("2026-12-01T21:30:00.1234Z");
        let b = created_key("2026-12-01T21:30:00.12345Z");
        let c = created_key("2026-12-01T21:30:01Z");
        assert!(a < b && b < c, "{a} {b} {c}");
    }
}
