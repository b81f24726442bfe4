//! The contract every sandbox provider adapter implements.
//!
//! Contract: an adapter makes exactly one attempt per call. It never retries, and it never
//! resumes (or otherwise changes) a sandbox on its own. It says precisely how a call ended:
//! before anything was sent ([`ProviderError::NotSent`]), answered with a refusal
//! ([`ProviderError::Rejected`]), or sent without a usable answer ([`ProviderError::Lost`]). Only
//! the last leaves the outcome unknown. Calls may be cancelled by the caller's deadline, which
//! the caller then treats as [`ProviderError::Lost`].

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
pub use computerd_raft::sm::Resources;

/// What a create needs to know.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    /// The Computer id (adapters label sandboxes with it, so an inspection can find them).
    pub computer_id: String,
    /// The command key of the create (also a label).
    pub command_key: String,
    /// The template/image, if any.
    pub template: Option<String>,
    /// Whether a desktop is wanted.
    pub desktop: bool,
    /// The one-time code the sandbox's agent pairs with (providers that start our agent).
    pub pairing_code: Option<String>,
    /// The first UID of the Computer's own binding-UID range (allocated in the store for
    /// providers whose sandboxes share a kernel), handed to its agent.
    pub first_uid: Option<u32>,
    /// The create's environment for every session (checked by the create route: no
    /// `COMPUTER_AGENT_*` name). The agent's own settings are added after it.
    pub env: BTreeMap<String, String>,
    /// The CPUs and memory asked for (`None`: the template's).
    pub resources: Option<Resources>,
    /// The creator's labels, passed on where the provider has a place for them.
    pub metadata: BTreeMap<String, String>,
    /// Where the sandbox may connect (`None`: anywhere the provider lets it).
    pub egress: Option<computerd_proto::egress::EgressPolicy>,
}

/// Name/value pairs as a JSON object of strings: a remote provider's env, metadata or labels.
pub fn string_object<K: AsRef<str>, V: AsRef<str>>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> serde_json::Map<String, serde_json::Value> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_string(), serde_json::Value::String(v.as_ref().to_string())))
        .collect()
}

/// The environment of a new sandbox that runs our agent: the create's own (`spec.env`), then
/// the agent's settings ([`agent_env`]), which win on a shared name.
pub fn sandbox_env(spec: &CreateSpec, server_url: &str, ca_cert: Option<&str>) -> Vec<(String, String)> {
    let agent = agent_env(spec, server_url, ca_cert);
    let mut env: Vec<(String, String)> = spec
        .env
        .iter()
        .filter(|(k, _)| !agent.iter().any(|(a, _)| a == *k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(agent);
    env
}

/// Where the agent keeps its credential inside a sandbox.
pub const AGENT_STATE: &str = "/var/lib/computer-agent";
/// Chromium in the desktop image (the agent's browser).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// The size of a sandbox's desktop.
pub const DESKTOP_GEOMETRY: &str = "1280x800x24";

/// The environment that starts our agent in a new sandbox (every provider that runs one): the
/// cluster's URL, the create's one-time pairing code, how to trust the cluster, and what the
/// sandbox offers (ports, a desktop and its browser).
pub fn agent_env(spec: &CreateSpec, server_url: &str, ca_cert: Option<&str>) -> Vec<(String, String)> {
    let mut env = vec![
        ("COMPUTER_AGENT_SERVER".to_string(), server_url.to_string()),
        ("COMPUTER_AGENT_STATE".to_string(), AGENT_STATE.to_string()),
        ("HOME".to_string(), "/root".to_string()),
        // Sessions and file calls run as the image's `user` (uid 1000) in its workspace, unless a
        // call says root; the agent alone stays root.
        ("COMPUTER_AGENT_USER".to_string(), "user".to_string()),
        ("COMPUTER_AGENT_WORKDIR".to_string(), "/workspace".to_string()),
    ];
    if let Some(code) = &spec.pairing_code {
        env.push(("COMPUTER_AGENT_PAIR".into(), code.clone()));
    }
    // An http:// serverUrl is a plain WebSocket across the network, which the agent refuses
    // unless told: the operator chose it in the provider's config.
    if server_url.starts_with("http://") {
        env.push(("COMPUTER_AGENT_INSECURE".into(), "true".into()));
    }
    if let Some(ca) = ca_cert {
        env.push(("COMPUTER_AGENT_CA_PEM".into(), ca.to_string()));
    }
    // The Computer's own binding UIDs (sandboxes sharing a kernel; none: the agent's default).
    if let Some(uid) = spec.first_uid {
        env.push(("COMPUTER_AGENT_MCP_FIRST_UID".into(), uid.to_string()));
    }
    // Its ports get public addresses through the agent's link.
    env.push(("COMPUTER_AGENT_PORTS".into(), "true".into()));
    // The agent starts the display and keeps it (the image must have Xvfb), and a browser: the
    // image's Chromium, over a CDP pipe.
    if spec.desktop {
        env.push(("COMPUTER_AGENT_DESKTOP".into(), DESKTOP_GEOMETRY.into()));
        env.push(("COMPUTER_AGENT_BROWSER".into(), CHROMIUM.into()));
    }
    env
}

/// Checks a remote provider's `serverUrl` and `caCert` (what its sandboxes' agents dial).
pub fn check_server_url(kind: &str, server_url: &str, ca_cert: Option<&str>) -> Result<(), String> {
    if !(server_url.starts_with("http://") || server_url.starts_with("https://")) {
        return Err(format!("{kind} provider config: serverUrl must be an http:// or https:// URL"));
    }
    if let Some(ca) = ca_cert {
        if !server_url.starts_with("https://") {
            return Err(format!("{kind} provider config: caCert pins the CA of an https:// serverUrl"));
        }
        if !ca.trim_start().starts_with("-----BEGIN CERTIFICATE-----") || ca.len() > 16 * 1024 {
            return Err(format!(
                "{kind} provider config: caCert must be one PEM certificate (-----BEGIN CERTIFICATE-----)"
            ));
        }
    }
    Ok(())
}

/// How a provider call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProviderError {
    /// Nothing was sent: the call had no effect.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The provider answered and refused: the call had no effect.
    #[error("rejected by the provider: {0}")]
    Rejected(String),
    /// The provider answered and refused for a reason the caller can act on (a missing
    /// template, a quota, a wrong credential, a rate limit): the call had no effect. `kind` is
    /// the execution's error kind.
    #[error("refused by the provider ({kind}): {message}")]
    Refused {
        /// `template_not_found`, `provider_quota`, `provider_unauthorized`, `provider_rate_limited`.
        kind: String,
        /// The provider's words.
        message: String,
    },
    /// Sent, but the answer was lost or came too late: the effect is unknown.
    #[error("answer lost: {0}")]
    Lost(String),
}

/// What an inspection finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The provider's reference.
    pub sandbox: String,
    /// The provider's state name.
    pub state: String,
}

/// The warm pool a provider's config asks for, per template key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolWant {
    /// The template key creates name (`default` and `desktop` for creates that name none).
    pub key: String,
    /// Whether its sandboxes have a desktop.
    pub desktop: bool,
    /// How many sandboxes it keeps ready.
    pub size: u32,
}

/// A pooled sandbox as the provider lists it (made ahead of any create, its agent waiting for
/// an identity; or claimed by a Computer already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooled {
    /// The pool id it was made with (its label).
    pub pool_id: String,
    /// The provider's reference (a container id).
    pub sandbox: String,
    /// Its name now: a claimed one carries its Computer's.
    pub name: String,
    /// When it was made (Unix ms).
    pub created_ms: u64,
    /// Whether it runs (or is paused): one that exited serves no one.
    pub running: bool,
}

/// A sandbox provider adapter.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Creates a sandbox; answers its reference.
    async fn create(&self, spec: &CreateSpec) -> Result<String, ProviderError>;
    /// Pauses a sandbox (memory and processes kept where the provider can). `command_key` is
    /// the execution's key (with the sandbox, it names this effect: an adapter may pass it on
    /// as the provider's idempotency key).
    async fn pause(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError>;
    /// Resumes a paused sandbox.
    async fn resume(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError>;
    /// Deletes a sandbox and its files.
    async fn delete(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError>;
    /// Replaces a Computer's sandbox `sandbox` (which may have vanished) with a new one made as
    /// `spec` says, carrying over what the provider keeps for the Computer apart from its
    /// sandboxes (Docker: the tool runtime's volume); answers the new sandbox's reference. A
    /// failure before the old sandbox was stopped is `NotSent` or `Rejected` and changed nothing;
    /// one after is `Refused` (the old sandbox kept, stopped), or `Lost`.
    async fn recreate(&self, _sandbox: &str, _spec: &CreateSpec) -> Result<String, ProviderError> {
        Err(ProviderError::NotSent("this provider cannot recreate a sandbox".into()))
    }
    /// Deletes a Computer's sandbox and whatever else the provider keeps for it (Docker: its
    /// runtime volume, and a sandbox a failed recreate kept). By default, [`Provider::delete`].
    async fn delete_computer(&self, sandbox: &str, _computer_id: &str, command_key: &str) -> Result<(), ProviderError> {
        self.delete(sandbox, command_key).await
    }
    /// Applies a new egress policy, of the store's revision `revision`, to the running (or
    /// paused) sandbox of Computer `computer_id`: new connections follow it at once, open ones
    /// it now denies are cut. Where the provider keeps revisions (the docker gateway), one older
    /// than the policy in force is ignored, so racing changes end at the latest. An error
    /// changed nothing. By default the provider cannot.
    async fn set_egress(
        &self,
        _sandbox: &str,
        _computer_id: &str,
        _policy: &computerd_proto::egress::EgressPolicy,
        _revision: u64,
    ) -> Result<(), ProviderError> {
        Err(ProviderError::Refused {
            kind: computerd_proto::ErrorKind::ComputerUnsupported.as_str().into(),
            message: "this provider cannot change a sandbox's egress while it runs".into(),
        })
    }
    /// What enforces Computer `computer_id`'s egress counted (connections let through, denied
    /// with the latest ones, cut by a change), if the provider can tell.
    async fn egress_stats(&self, _computer_id: &str) -> Result<Option<serde_json::Value>, ProviderError> {
        Ok(None)
    }
    /// The connections Computer `computer_id`'s egress enforcement refuses from `since_ms` on
    /// (its clock; a few from the same second before may come too), as they happen, if the
    /// provider can tell (`None`: it cannot, or nothing enforces a policy there). The stream
    /// ends when the enforcement goes or its output breaks.
    async fn egress_denials(
        &self,
        _computer_id: &str,
        _since_ms: u64,
    ) -> Result<Option<futures::stream::BoxStream<'static, computerd_proto::egress::Denied>>, ProviderError> {
        Ok(None)
    }
    /// The warm pools this provider's config asks for (none by default).
    fn pools(&self) -> Vec<PoolWant> {
        Vec::new()
    }
    /// The pool key that can serve a create of `spec` (`None`: it must be made cold): its
    /// template has a pool of the same desktop, and nothing in it needs the sandbox made for it
    /// (an egress policy, resources other than the template's).
    fn pool_key(&self, _spec: &CreateSpec) -> Option<String> {
        None
    }
    /// Makes and starts one sandbox of pool `key` for provider record `provider_id`, labelled
    /// with both and `pool_id`, whose agent waits for its identity with `token`; answers its
    /// reference. A refusal leaves none.
    async fn pool_start(
        &self,
        _provider_id: &str,
        _key: &str,
        _pool_id: &str,
        _token: &str,
    ) -> Result<String, ProviderError> {
        Err(ProviderError::NotSent("this provider keeps no warm pool".into()))
    }
    /// Gives pooled sandbox `sandbox`, claimed by Computer `computer_id`, that Computer's name
    /// (idempotent: done already, it changes nothing).
    async fn pool_claimed(&self, _sandbox: &str, _computer_id: &str) -> Result<(), ProviderError> {
        Ok(())
    }
    /// Every pooled sandbox the provider holds for provider record `provider_id` (another
    /// record, or another cluster, on the same engine has its own), claimed or not.
    async fn pool_list(&self, _provider_id: &str) -> Result<Vec<Pooled>, ProviderError> {
        Ok(Vec::new())
    }
    /// Looks up the sandbox of a Computer (by its labels), to settle an unknown outcome.
    async fn inspect(&self, computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError>;
    /// The reference a Computer's sandbox has when none was recorded (a create whose answer was
    /// lost and then decided succeeded), if the provider names sandboxes deterministically.
    fn reference_of(&self, _computer_id: &str) -> Option<String> {
        None
    }
    /// How often a running sandbox's own expiry must be pushed ahead with
    /// [`Provider::keep_alive`] (`None`: it has none, as Docker's).
    fn keep_alive_every(&self) -> Option<Duration> {
        None
    }
    /// Pushes a running sandbox's own expiry ahead (E2B's absolute timeout). Never resumes it.
    async fn keep_alive(&self, _sandbox: &str) -> Result<(), ProviderError> {
        Ok(())
    }
    /// Every sandbox the provider holds for any Computer, by Computer id (`None`: the provider
    /// cannot list them, so vanished sandboxes are not watched for).
    async fn list(&self) -> Result<Option<std::collections::HashMap<String, SandboxInfo>>, ProviderError> {
        Ok(None)
    }
    /// Whether a listed sandbox in provider state `state` is paused or stopped, with its files
    /// kept (what a resume brings back): the sandbox watch then reports a running Computer
    /// paused behind the cluster's back.
    fn paused_state(&self, _state: &str) -> bool {
        false
    }

    /// Whether a listed sandbox in provider state `state` has ended for good: its processes are
    /// gone and a resume cannot bring it back (a Docker container that exited: resume unpauses).
    /// The sandbox watch then reports its Computer failed, with the state as the reason, rather
    /// than leaving it `starting` or `running` with no agent.
    fn ended_state(&self, _state: &str) -> bool {
        false
    }
}

/// The adapter of a provider kind that this build cannot drive yet: every call fails before
/// anything is sent, so executions fail cleanly and the Computer stays.
pub struct Unavailable(pub String);

#[async_trait]
impl Provider for Unavailable {
    async fn create(&self, _spec: &CreateSpec) -> Result<String, ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn pause(&self, _sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn resume(&self, _sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn delete(&self, _sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn inspect(&self, _computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
}
