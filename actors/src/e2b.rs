//! The `e2b` provider: sandboxes at E2B, through its published REST API (`e2b-dev/infra`,
//! `spec/openapi.yml`: `POST /sandboxes`, `GET /sandboxes/{id}`, `GET /v2/sandboxes`,
//! `POST /sandboxes/{id}/pause`, `POST /sandboxes/{id}/connect`, `POST /sandboxes/{id}/timeout`,
//! `DELETE /sandboxes/{id}`), authenticated with `X-API-Key`.
//!
//! - **create** = `POST /sandboxes` from the template (the Computer's, else the config's
//!   `template`, default `computerd-agent`: `deploy/e2b/`), with our agent's settings as
//!   `envVars` (the cluster's URL and the create's one-time pairing code) and `metadata` naming
//!   the Computer and the command key. E2B's timeout is absolute and capped by the account's
//!   plan, while `pauseAfter` is ours: the sandbox is made with `autoPause` (on timeout it is
//!   paused, never killed), `autoResume` off (traffic never wakes it behind our back), and a
//!   timeout of `sandboxTimeoutSec` (default 3600, the smallest plan's cap), which
//!   [`Provider::keep_alive`] pushes ahead while the Computer runs.
//! - **pause** = `POST /sandboxes/{id}/pause` (files, memory and processes kept). A sandbox
//!   already paused answers 409 saying so: the effect wanted holds. E2B answers 409 too for a
//!   sandbox that "cannot be paused while in '<state>' state" (or whose snapshot is being made):
//!   that pause did not happen, and fails as refused.
//! - **resume** = `POST /sandboxes/{id}/connect`, which also resumes a paused sandbox. So it is
//!   called only here, inside a resume execution, never to read.
//! - **delete** = `DELETE /sandboxes/{id}` (kill); 404 means it is gone already.
//! - **egress** ([`network`]): a create's policy goes in `network` (`allowOut`: names, addresses
//!   and ranges; `denyOut`: addresses and ranges); a change is `PUT /sandboxes/{id}/network`.
//!   E2B lets `allowOut` win over `denyOut`, where ours denies first, so a policy whose meaning
//!   would change is refused (`ComputerUnsupported`) rather than passed on: names in `deny`, and
//!   a `deny` list under `"default": "deny"`. Under `"default": "deny"` the cluster's host
//!   (`serverUrl`'s) is added to `allowOut`, so the agent's link stays up.
//! - **inspect** = `GET /v2/sandboxes?metadata=computerd.computer=<id>` (running and paused);
//!   **list** (the sandbox watch) = the same without the filter, page by page (`X-Next-Token`).
//!
//! Failures: no connection is `NotSent`; 401/403 `provider_unauthorized`, 404 on create
//! `template_not_found`, 429 `provider_rate_limited`, a quota or concurrency limit
//! `provider_quota`, other 4xx `provider_rejected` (all: nothing happened); a 5xx, a cut
//! connection or no answer within the deadline is `Lost` (a gateway's 5xx does not prove the
//! sandbox was not made), hence `outcome_unknown`. One attempt per call, never a retry.
//!
//! Config: `serverUrl` (required) and `caCert` as for docker; `endpoint` (default
//! `https://api.e2b.app`; `http://` to loopback only, for tests); `template`;
//! `sandboxTimeoutSec` (60..=86400); `timeoutMs`. Secret: `apiKey` (write-only; sent only to
//! `endpoint`, in the header, never logged).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use crate::http_call::Answer;
use crate::http_call::Endpoint;
use crate::http_call::check_sandbox_id;
use crate::http_call::encode;
use crate::http_call::inner_deadline;
use crate::provider::CreateSpec;
use crate::provider::Provider;
use crate::provider::ProviderError;
use crate::provider::SandboxInfo;
use crate::provider::check_server_url;
use crate::provider::sandbox_env;
use crate::provider::string_object;

/// E2B's API.
pub const DEFAULT_ENDPOINT: &str = "https://api.e2b.app";
/// The template `deploy/e2b/` builds.
pub const DEFAULT_TEMPLATE: &str = "computerd-agent";
/// The metadata key with the Computer id.
pub const META_COMPUTER: &str = "computerd.computer";
/// The metadata key with the create's command key.
pub const META_KEY: &str = "computerd.command-key";
/// At most this many pages of 100 sandboxes are read by one list (the sandbox watch's pass).
const MAX_PAGES: usize = 50;

/// An e2b provider's config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct E2bConfig {
    /// What agents dial.
    pub server_url: String,
    /// A private CA (PEM) the agents pin for `serverUrl`.
    #[serde(default)]
    pub ca_cert: Option<String>,
    /// E2B's API base URL.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The template of a Computer that names none.
    #[serde(default)]
    pub template: Option<String>,
    /// The sandbox's timeout, refreshed while it runs.
    #[serde(default)]
    pub sandbox_timeout_sec: Option<u32>,
    /// The call deadline (read by the factory).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl E2bConfig {
    /// Parses and checks a provider record's config (user input: every problem is named).
    pub fn parse(config: &serde_json::Map<String, Value>) -> Result<E2bConfig, String> {
        let c: E2bConfig =
            serde_json::from_value(Value::Object(config.clone())).map_err(|e| format!("e2b provider config: {e}"))?;
        check_server_url("e2b", &c.server_url, c.ca_cert.as_deref())?;
        Endpoint::parse(c.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), None)
            .map_err(|e| format!("e2b provider config: {e}"))?;
        if c.sandbox_timeout_sec.is_some_and(|t| !(60..=86_400).contains(&t)) {
            return Err("e2b provider config: sandboxTimeoutSec must be 60 to 86400".into());
        }
        if c.template.as_deref().is_some_and(|t| t.is_empty() || t.len() > 128) {
            return Err("e2b provider config: template must be 1 to 128 bytes".into());
        }
        Ok(c)
    }

    fn sandbox_timeout(&self) -> u32 {
        self.sandbox_timeout_sec.unwrap_or(3600)
    }
}

/// The adapter of one e2b provider record.
pub struct E2bProvider {
    config: E2bConfig,
    endpoint: Endpoint,
    api_key: String,
    deadline: Duration,
}

impl std::fmt::Debug for E2bProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("E2bProvider").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

/// What an E2B error answer says, for a message.
fn says(a: &Answer) -> String {
    let v = a.json();
    match v.get("message").and_then(Value::as_str) {
        Some(m) => format!("E2B answered {}: {m}", a.status),
        None => format!("E2B answered {}: {}", a.status, a.excerpt()),
    }
}

/// Sorts an E2B answer that is not a success. `create` says whether a 404 means the template.
fn refusal(a: &Answer, create: bool) -> ProviderError {
    let message = says(a);
    let lower = message.to_ascii_lowercase();
    let refused = |kind: &str| ProviderError::Refused { kind: kind.into(), message: message.clone() };
    match a.status {
        401 | 403 => refused("provider_unauthorized"),
        429 if lower.contains("concurren") || lower.contains("limit of") || lower.contains("quota") => {
            refused("provider_quota")
        }
        429 => refused("provider_rate_limited"),
        404 if create => refused("template_not_found"),
        400..=499 if lower.contains("quota") || lower.contains("limit") => refused("provider_quota"),
        400..=499 => ProviderError::Rejected(message),
        _ => ProviderError::Lost(format!("{message} (a server error: the call may have taken effect)")),
    }
}

/// What a pause's answer means: done, or already paused (a 409 that says so); any other 409
/// (a sandbox in a state that cannot be paused, a snapshot being made) is a pause that did not
/// happen.
fn pause_answer(a: &Answer) -> Result<(), ProviderError> {
    match a.status {
        200..=299 => Ok(()),
        409 if says(a).to_ascii_lowercase().contains("already paused") => Ok(()),
        409 => Err(ProviderError::Rejected(format!("E2B did not pause the sandbox: {}", says(a)))),
        _ => Err(refusal(a, false)),
    }
}

impl E2bProvider {
    /// An adapter for a parsed config, its API key and the call deadline.
    pub fn new(config: E2bConfig, api_key: String, timeout: Duration) -> Result<Self, String> {
        let endpoint = Endpoint::parse(config.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), None)?;
        if api_key.is_empty() {
            return Err("the e2b provider has no apiKey".into());
        }
        let deadline = inner_deadline(timeout);
        Ok(E2bProvider { config, endpoint, api_key, deadline })
    }

    async fn call(&self, method: http::Method, path: &str, body: Option<&Value>) -> Result<Answer, ProviderError> {
        self.endpoint.call(method, path, &[("X-API-Key", &self.api_key)], body, self.deadline).await
    }

    /// The body of a create.
    fn new_sandbox(&self, spec: &CreateSpec) -> Result<Value, ProviderError> {
        let template = spec.template.clone().or_else(|| self.config.template.clone());
        let env = string_object(sandbox_env(spec, &self.config.server_url, self.config.ca_cert.as_deref()));
        // The creator's metadata, then ours (the create route keeps `computerd.` for us).
        let mut metadata = string_object(&spec.metadata);
        metadata.insert(META_COMPUTER.into(), json!(spec.computer_id));
        metadata.insert(META_KEY.into(), json!(spec.command_key));
        let mut body = json!({
            "templateID": template.unwrap_or_else(|| DEFAULT_TEMPLATE.into()),
            "timeout": self.config.sandbox_timeout(),
            "autoPause": true,
            "autoResume": {"enabled": false},
            "metadata": metadata,
            "envVars": env,
        });
        if let Some(p) = &spec.egress {
            body["network"] = network(p, &self.config.server_url).map_err(ProviderError::NotSent)?;
        }
        Ok(body)
    }
}

/// E2B's `network` for `policy`, whose sandboxes' agents dial `server_url`; an error names what
/// E2B cannot hold as ours means it.
pub fn network(policy: &computerd_proto::egress::EgressPolicy, server_url: &str) -> Result<Value, String> {
    use computerd_proto::egress::DefaultAction;
    use computerd_proto::egress::Target;
    let c = policy.compile()?;
    if let Some(name) = policy.deny.iter().zip(&c.deny).find(|(_, t)| !matches!(t, Target::Range(_))) {
        return Err(format!("egress: E2B's denyOut takes addresses and ranges only, not the name {:?}", name.0));
    }
    match c.default {
        // Under "allow", our allow entries change nothing (deny comes first): only deny goes.
        DefaultAction::Allow => Ok(json!({"denyOut": policy.deny})),
        DefaultAction::Deny if !policy.deny.is_empty() => Err(
            "egress: E2B lets allowOut win over denyOut, so under \"default\": \"deny\" a deny list cannot narrow allow there; leave deny empty"
                .into(),
        ),
        DefaultAction::Deny => {
            let mut allow = policy.allow.clone();
            let (host, _) = crate::docker::server_host_port(server_url);
            if !allow.contains(&host) {
                allow.push(host);
            }
            Ok(json!({"allowOut": allow, "denyOut": ["0.0.0.0/0"]}))
        }
    }
}

/// A sandbox reference must be a E2B id: it goes into a path.
fn check_id(sandbox: &str) -> Result<(), ProviderError> {
    check_sandbox_id("E2B", sandbox)
}

#[async_trait]
impl Provider for E2bProvider {
    async fn create(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        // (The create route refuses them first; this holds when its node did not know the
        // provider yet.)
        if spec.resources.is_some() {
            return Err(ProviderError::NotSent(
                "resources: an E2B sandbox's CPUs and memory are fixed by its template".into(),
            ));
        }
        let a = self.call(http::Method::POST, "/sandboxes", Some(&self.new_sandbox(spec)?)).await?;
        if a.status != 201 && a.status != 200 {
            return Err(refusal(&a, true));
        }
        match a.json().get("sandboxID").and_then(Value::as_str) {
            Some(id) if check_id(id).is_ok() => Ok(id.to_string()),
            _ => Err(ProviderError::Lost(format!("E2B answered {} without a usable sandboxID", a.status))),
        }
    }

    async fn pause(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let a = self.call(http::Method::POST, &format!("/sandboxes/{sandbox}/pause"), None).await?;
        pause_answer(&a)
    }

    async fn resume(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let body = json!({"timeout": self.config.sandbox_timeout()});
        let a = self.call(http::Method::POST, &format!("/sandboxes/{sandbox}/connect"), Some(&body)).await?;
        match a.status {
            200..=299 => Ok(()),
            _ => Err(refusal(&a, false)),
        }
    }

    async fn delete(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let a = self.call(http::Method::DELETE, &format!("/sandboxes/{sandbox}"), None).await?;
        match a.status {
            200..=299 => Ok(()),
            // Gone already: the effect wanted holds.
            404 => Ok(()),
            _ => Err(refusal(&a, false)),
        }
    }

    async fn set_egress(
        &self,
        sandbox: &str,
        _computer_id: &str,
        policy: &computerd_proto::egress::EgressPolicy,
        _revision: u64,
    ) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let body = network(policy, &self.config.server_url).map_err(|message| ProviderError::Refused {
            kind: computerd_proto::ErrorKind::ComputerUnsupported.as_str().into(),
            message,
        })?;
        let a = self.call(http::Method::PUT, &format!("/sandboxes/{sandbox}/network"), Some(&body)).await?;
        match a.status {
            200..=299 => Ok(()),
            _ => Err(refusal(&a, false)),
        }
    }

    async fn inspect(&self, computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError> {
        let query = encode(&format!("{META_COMPUTER}={computer_id}"));
        let a =
            self.call(http::Method::GET, &format!("/v2/sandboxes?metadata={query}&state=running,paused"), None).await?;
        if a.status != 200 {
            return Err(refusal(&a, false));
        }
        let v = a.json();
        let Some(list) = v.as_array() else {
            return Err(ProviderError::Lost("E2B's list answer is not an array".into()));
        };
        Ok(list.iter().filter(|s| s["metadata"][META_COMPUTER] == computer_id).find_map(|s| {
            Some(SandboxInfo {
                sandbox: s["sandboxID"].as_str()?.to_string(),
                state: s["state"].as_str().unwrap_or("unknown").to_string(),
            })
        }))
    }

    async fn list(&self) -> Result<Option<HashMap<String, SandboxInfo>>, ProviderError> {
        let mut held = HashMap::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut path = "/v2/sandboxes?state=running,paused&limit=100".to_string();
            if let Some(t) = &token {
                path.push_str(&format!("&nextToken={}", encode(t)));
            }
            let a = self.call(http::Method::GET, &path, None).await?;
            if a.status != 200 {
                return Err(refusal(&a, false));
            }
            let v = a.json();
            let Some(list) = v.as_array() else {
                return Err(ProviderError::Lost("E2B's list answer is not an array".into()));
            };
            for s in list {
                if let (Some(computer), Some(id)) = (s["metadata"][META_COMPUTER].as_str(), s["sandboxID"].as_str()) {
                    let state = s["state"].as_str().unwrap_or("unknown").to_string();
                    held.insert(computer.to_string(), SandboxInfo { sandbox: id.to_string(), state });
                }
            }
            match a.next_token {
                Some(t) => token = Some(t),
                None => return Ok(Some(held)),
            }
        }
        // Too many sandboxes to list in one pass: none is reported vanished.
        Ok(None)
    }

    fn paused_state(&self, state: &str) -> bool {
        // `autoPause: true`: a sandbox whose timeout passed (a keep-alive failed) is paused.
        state == "paused"
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        // A third of the timeout: two refreshes may fail before the sandbox would pause.
        Some(Duration::from_secs(u64::from(self.config.sandbox_timeout()) / 3))
    }

    async fn keep_alive(&self, sandbox: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let body = json!({"timeout": self.config.sandbox_timeout()});
        let a = self.call(http::Method::POST, &format!("/sandboxes/{sandbox}/timeout"), Some(&body)).await?;
        match a.status {
            200..=299 => Ok(()),
            _ => Err(refusal(&a, false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: Value) -> Result<E2bConfig, String> {
        E2bConfig::parse(v.as_object().expect("object"))
    }

    #[test]
    fn config_is_checked() {
        assert!(cfg(json!({"serverUrl": "https://cd.example.com"})).is_ok());
        assert!(cfg(json!({})).is_err(), "serverUrl is required");
        assert!(cfg(json!({"serverUrl": "https://x", "endpoint": "http://api.e2b.app"})).is_err(), "no clear text");
        assert!(cfg(json!({"serverUrl": "https://x", "endpoint": "http://127.0.0.1:9"})).is_ok());
        assert!(cfg(json!({"serverUrl": "https://x", "sandboxTimeoutSec": 5})).is_err());
        assert!(cfg(json!({"serverUrl": "https://x", "apiUrl": "x"})).is_err(), "unknown fields are refused");
    }

    #[test]
    fn a_create_body_follows_the_spec() {
        let c = cfg(json!({"serverUrl": "https://cd.example.com", "template": "tpl"})).expect("ok");
        let p = E2bProvider::new(c, "key".into(), Duration::from_secs(5)).expect("adapter");
        let spec = CreateSpec {
            computer_id: "cmp_1".into(),
            command_key: "k1".into(),
            template: None,
            desktop: false,
            pairing_code: Some("code".into()),
            first_uid: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
        };
        let b = p.new_sandbox(&spec).expect("a body");
        assert_eq!(b["templateID"], "tpl");
        assert_eq!((b["autoPause"].clone(), b["autoResume"]["enabled"].clone()), (json!(true), json!(false)));
        assert_eq!(b["metadata"], json!({"computerd.computer": "cmp_1", "computerd.command-key": "k1"}));
        assert_eq!(b["envVars"]["COMPUTER_AGENT_PAIR"], "code");
        assert_eq!(b["envVars"]["COMPUTER_AGENT_SERVER"], "https://cd.example.com");
        assert!(!format!("{p:?}").contains("key\""), "the key is never shown");
        // Issue 39, item 5: the create's env and metadata go along, ours win on a shared name.
        let mut spec = spec;
        spec.env.insert("GREETING".into(), "hi".into());
        spec.metadata.insert("team".into(), "a".into());
        let b = p.new_sandbox(&spec).expect("a body");
        assert_eq!(
            (b["envVars"]["GREETING"].clone(), b["envVars"]["COMPUTER_AGENT_PAIR"].clone()),
            (json!("hi"), json!("code"))
        );
        assert_eq!(b["metadata"], json!({"team": "a", "computerd.computer": "cmp_1", "computerd.command-key": "k1"}));
    }

    /// Issue 41, item 3: a policy goes to E2B as it means, or is refused naming why.
    #[test]
    fn i41_egress_maps_to_e2b_network_or_is_refused() {
        use computerd_proto::egress::DefaultAction;
        use computerd_proto::egress::EgressPolicy;
        let p = |default, allow: &[&str], deny: &[&str]| EgressPolicy {
            default,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        let url = "https://cd.example.com:8443";
        assert_eq!(
            network(&p(DefaultAction::Deny, &["pypi.org", "10.1.0.0/16"], &[]), url).expect("deny"),
            json!({"allowOut": ["pypi.org", "10.1.0.0/16", "cd.example.com"], "denyOut": ["0.0.0.0/0"]}),
            "the agent's link stays open"
        );
        assert_eq!(
            network(&p(DefaultAction::Allow, &["pypi.org"], &["203.0.113.0/24"]), url).expect("allow"),
            json!({"denyOut": ["203.0.113.0/24"]})
        );
        assert!(network(&p(DefaultAction::Allow, &[], &["ads.test"]), url).expect_err("a name").contains("ads.test"));
        assert!(
            network(&p(DefaultAction::Deny, &["*.a.test"], &["10.0.0.1"]), url)
                .expect_err("narrowing")
                .contains("allowOut win")
        );
    }

    #[test]
    fn refusals_are_sorted() {
        let a = |status: u16, msg: &str| Answer {
            status,
            body: serde_json::to_vec(&json!({"code": status, "message": msg})).expect("json").into(),
            retry_after: None,
            next_token: None,
        };
        let kind = |e: ProviderError| match e {
            ProviderError::Refused { kind, .. } => kind,
            ProviderError::Rejected(_) => "rejected".into(),
            ProviderError::Lost(_) => "lost".into(),
            ProviderError::NotSent(_) => "not_sent".into(),
        };
        assert_eq!(kind(refusal(&a(401, "Invalid API key"), false)), "provider_unauthorized");
        assert_eq!(kind(refusal(&a(404, "template 'x' not found"), true)), "template_not_found");
        assert_eq!(kind(refusal(&a(404, "sandbox not found"), false)), "rejected");
        assert_eq!(kind(refusal(&a(429, "Too many requests"), true)), "provider_rate_limited");
        assert_eq!(
            kind(refusal(&a(429, "You have reached the maximum number of concurrent E2B sandboxes"), true)),
            "provider_quota"
        );
        assert_eq!(kind(refusal(&a(500, "boom"), true)), "lost");
        assert_eq!(kind(refusal(&a(503, "no capacity"), true)), "lost");
    }

    /// Issue 37, item 13: only the 409 that says "already paused" is a pause that holds.
    #[test]
    fn i37_13_only_already_paused_is_a_pause() {
        let a = |status: u16, msg: &str| Answer {
            status,
            body: serde_json::to_vec(&json!({"code": status, "message": msg})).expect("json").into(),
            retry_after: None,
            next_token: None,
        };
        assert!(pause_answer(&a(204, "")).is_ok());
        assert!(pause_answer(&a(409, "Sandbox ix1 is already paused")).is_ok());
        for other in [
            "Sandbox 'ix1' cannot be paused while in 'resuming' state",
            "Sandbox snapshot is currently being created",
            "Sandbox ix1 is already running",
        ] {
            assert!(
                matches!(pause_answer(&a(409, other)), Err(ProviderError::Rejected(m)) if m.contains(other)),
                "{other}"
            );
        }
    }

    #[test]
    fn ids_go_into_paths_only_when_plain() {
        assert!(check_id("i1b2c3d4e5f6g7h8i9j0").is_ok());
        for bad in ["", "../x", "a/b", "a?b", "a b"] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }
}
