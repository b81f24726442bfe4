//! The `daytona` provider: sandboxes at Daytona, through its published REST API (the API
//! server of `daytonaio/daytona`, `apps/api`, routes under `/sandbox`), authenticated with
//! `Authorization: Bearer <apiKey>` (and `X-Daytona-Organization-ID` when configured).
//!
//! - **create** = `POST /sandbox` from the snapshot (the Computer's template, else the config's
//!   `snapshot`, default `computerd-agent`: an image whose entrypoint is our agent), with our
//!   agent's settings as `env` and `labels` naming the Computer and the command key. Daytona's
//!   own auto-stop is off (`autoStopInterval: 0`), auto-archive at its maximum (`0`) and
//!   auto-delete off (`-1`), because `pauseAfter` is ours.
//! - **egress** ([`network`]): at create only, as `networkAllowList` (at most 5 CIDR ranges,
//!   with `serverUrl`'s addresses among them so the agent's link stays up) under
//!   `"default": "deny"`; Daytona has no deny list and takes no names in it, and changes to a
//!   running sandbox are not made here, so those are refused (`ComputerUnsupported`, naming the
//!   limit).
//! - **pause** = `POST /sandbox/{id}/stop`: files are kept, processes are not (the Computer's
//!   `pauseKeeps` says `files`). On start the entrypoint runs again and the agent links again
//!   with the credential it kept on disk.
//! - **resume** = `POST /sandbox/{id}/start`.
//! - Stop and start are asynchronous at Daytona: the stop answers while the runner is still
//!   stopping the sandbox (a start sent then fails), and the start's server waits up to 30 s for
//!   the runner and may answer `starting`. So both then poll `GET /sandbox/{id}` until the state
//!   asked for (`stopped` or `archived`; `started`), within the call's deadline; past it, or in
//!   Daytona's `error` state, the outcome is unknown (`Lost`). The call deadline (`timeoutMs`,
//!   default 60 s, at least 35 s) is above Daytona's own 30 s wait on create and start.
//! - **delete** = `DELETE /sandbox/{id}`; 404 means it is gone already.
//! - **inspect** = `GET /sandbox?labels={"computerd.computer": "<id>"}`; **list** (the sandbox
//!   watch) = `GET /sandbox` page by page (`nextCursor`).
//!
//! A `tty` session on a Daytona Computer is refused with `ComputerUnsupported` (SPEC §2) by the
//! session route, which knows the provider kind.
//!
//! Failures: no connection is `NotSent`; 401/403 `provider_unauthorized` (a 403 about a quota is
//! `provider_quota`), a missing snapshot `template_not_found`, 429 `provider_rate_limited`, other
//! 4xx `provider_rejected`; a 5xx, a cut connection or no answer within the deadline is `Lost`.
//! One attempt per call, never a retry.
//!
//! Config: `serverUrl` (required) and `caCert` as for docker; `endpoint` (default
//! `https://app.daytona.io/api`; `http://` to loopback only, for tests); `snapshot`; `target`
//! (the region); `organizationId`; `timeoutMs`. Secret: `apiKey` (write-only; sent only to
//! `endpoint`, never logged).

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

/// Daytona's API.
pub const DEFAULT_ENDPOINT: &str = "https://app.daytona.io/api";
/// The snapshot of a Computer that names none.
pub const DEFAULT_SNAPSHOT: &str = "computerd-agent";
/// The label with the Computer id.
pub const LABEL_COMPUTER: &str = "computerd.computer";
/// The label with the create's command key.
pub const LABEL_KEY: &str = "computerd.command-key";
/// At most this many pages of 100 sandboxes are read by one list (the sandbox watch's pass).
const MAX_PAGES: usize = 50;

/// How long Daytona's API server itself waits for its runner on a create or a start.
pub const SERVER_WAIT: Duration = Duration::from_secs(30);
/// The call deadline of a daytona provider with no `timeoutMs`: twice the server's own wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest `timeoutMs` accepted: the server's own wait, and 5 s for the exchange.
pub const MIN_TIMEOUT_MS: u64 = 35_000;
/// The longest `timeoutMs` accepted.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// A daytona provider's config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaytonaConfig {
    /// What agents dial.
    pub server_url: String,
    /// A private CA (PEM) the agents pin for `serverUrl`.
    #[serde(default)]
    pub ca_cert: Option<String>,
    /// Daytona's API base URL.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The snapshot of a Computer that names no template.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// The region.
    #[serde(default)]
    pub target: Option<String>,
    /// The organization, when the key serves several.
    #[serde(default)]
    pub organization_id: Option<String>,
    /// The call deadline (read by the factory).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl DaytonaConfig {
    /// Parses and checks a provider record's config (user input: every problem is named).
    pub fn parse(config: &serde_json::Map<String, Value>) -> Result<DaytonaConfig, String> {
        let c: DaytonaConfig = serde_json::from_value(Value::Object(config.clone()))
            .map_err(|e| format!("daytona provider config: {e}"))?;
        check_server_url("daytona", &c.server_url, c.ca_cert.as_deref())?;
        Endpoint::parse(c.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), None)
            .map_err(|e| format!("daytona provider config: {e}"))?;
        if let Some(ms) = c.timeout_ms
            && !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&ms)
        {
            return Err(format!(
                "daytona provider config: timeoutMs must be {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS}: Daytona's API itself waits up to {} s on create and start",
                SERVER_WAIT.as_secs()
            ));
        }
        for (name, v) in [("snapshot", &c.snapshot), ("target", &c.target), ("organizationId", &c.organization_id)] {
            if v.as_deref().is_some_and(|t| t.is_empty() || t.len() > 256 || t.chars().any(char::is_control)) {
                return Err(format!("daytona provider config: {name} must be 1 to 256 printable bytes"));
            }
        }
        Ok(c)
    }
}

/// The adapter of one daytona provider record.
pub struct DaytonaProvider {
    config: DaytonaConfig,
    endpoint: Endpoint,
    bearer: String,
    deadline: Duration,
}

impl std::fmt::Debug for DaytonaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("DaytonaProvider").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

/// What a Daytona error answer says, for a message.
fn says(a: &Answer) -> String {
    let v = a.json();
    let m = match v.get("message") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => Some(list.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("; ")),
        _ => None,
    };
    match m {
        Some(m) => format!("Daytona answered {}: {m}", a.status),
        None => format!("Daytona answered {}: {}", a.status, a.excerpt()),
    }
}

/// Sorts a Daytona answer that is not a success. `create` says whether "not found" means the
/// snapshot.
fn refusal(a: &Answer, create: bool) -> ProviderError {
    let message = says(a);
    let lower = message.to_ascii_lowercase();
    let refused = |kind: &str| ProviderError::Refused { kind: kind.into(), message: message.clone() };
    match a.status {
        400..=499 if lower.contains("quota") || lower.contains("limit exceeded") => refused("provider_quota"),
        401 | 403 => refused("provider_unauthorized"),
        429 => refused("provider_rate_limited"),
        400 | 404 if create && lower.contains("snapshot") && lower.contains("not found") => {
            refused("template_not_found")
        }
        400..=499 => ProviderError::Rejected(message),
        _ => ProviderError::Lost(format!("{message} (a server error: the call may have taken effect)")),
    }
}

/// A sandbox reference must be a Daytona id: it goes into a path.
fn check_id(sandbox: &str) -> Result<(), ProviderError> {
    check_sandbox_id("Daytona", sandbox)
}

impl DaytonaProvider {
    /// An adapter for a parsed config, its API key and the call deadline.
    pub fn new(config: DaytonaConfig, api_key: String, timeout: Duration) -> Result<Self, String> {
        let endpoint = Endpoint::parse(config.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), None)?;
        if api_key.is_empty() || api_key.chars().any(char::is_control) {
            return Err("the daytona provider has no usable apiKey".into());
        }
        let deadline = inner_deadline(timeout);
        Ok(DaytonaProvider { config, endpoint, bearer: format!("Bearer {api_key}"), deadline })
    }

    async fn call(&self, method: http::Method, path: &str, body: Option<&Value>) -> Result<Answer, ProviderError> {
        self.call_within(method, path, body, self.deadline).await
    }

    async fn call_within(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
        deadline: Duration,
    ) -> Result<Answer, ProviderError> {
        let mut headers = vec![("Authorization", self.bearer.as_str())];
        if let Some(org) = &self.config.organization_id {
            headers.push(("X-Daytona-Organization-ID", org.as_str()));
        }
        self.endpoint.call(method, path, &headers, body, deadline).await
    }

    /// After a stop or start Daytona accepted (at `since`): polls the sandbox until it is in one
    /// of `want`, within the call's deadline. What was asked for was sent, so a sandbox that
    /// does not get there in time, lands in `error`, or is gone is an unknown outcome.
    async fn wait_for(&self, sandbox: &str, want: &[&str], since: tokio::time::Instant) -> Result<(), ProviderError> {
        let until = since + self.deadline;
        let mut pause = Duration::from_millis(100);
        let mut last = String::from("unknown");
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(ProviderError::Lost(format!(
                    "the sandbox was still {last} when the call's deadline passed (wanted {})",
                    want.join(" or ")
                )));
            }
            let a = self.call_within(http::Method::GET, &format!("/sandbox/{sandbox}"), None, left).await?;
            match a.status {
                200 => {}
                404 => return Err(ProviderError::Lost("the sandbox is gone at Daytona".into())),
                _ => return Err(ProviderError::Lost(format!("{} on the sandbox's state", says(&a)))),
            }
            last = a.json()["state"].as_str().unwrap_or("unknown").to_string();
            if want.contains(&last.as_str()) {
                return Ok(());
            }
            if matches!(last.as_str(), "error" | "build_failed" | "destroyed" | "destroying") {
                return Err(ProviderError::Lost(format!("the sandbox went to Daytona's {last} state")));
            }
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// The body of a create.
    fn create_body(&self, spec: &CreateSpec) -> Value {
        let snapshot = spec.template.clone().or_else(|| self.config.snapshot.clone());
        let env = string_object(sandbox_env(spec, &self.config.server_url, self.config.ca_cert.as_deref()));
        // The creator's metadata as labels, then ours (the create route keeps `computerd.`).
        let mut labels = string_object(&spec.metadata);
        labels.insert(LABEL_COMPUTER.into(), json!(spec.computer_id));
        labels.insert(LABEL_KEY.into(), json!(spec.command_key));
        let mut b = json!({
            "snapshot": snapshot.unwrap_or_else(|| DEFAULT_SNAPSHOT.into()),
            "env": env,
            "labels": labels,
            "autoStopInterval": 0,
            "autoArchiveInterval": 0,
            "autoDeleteInterval": -1,
        });
        if let Some(t) = &self.config.target {
            b["target"] = json!(t);
        }
        b
    }

    /// `serverUrl`'s addresses, as single-address ranges.
    async fn server_ranges(&self) -> Result<Vec<String>, ProviderError> {
        let (host, port) = crate::docker::server_host_port(&self.config.server_url);
        let addrs: Vec<std::net::IpAddr> = match host.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| ProviderError::NotSent(format!("egress: serverUrl's address: {host}: {e}")))?
                .map(|a| a.ip())
                .collect(),
        };
        let mut out: Vec<String> =
            addrs.iter().map(|ip| format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 })).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    async fn expect_ok(&self, method: http::Method, path: String, gone_ok: bool) -> Result<(), ProviderError> {
        let a = self.call(method, &path, None).await?;
        match a.status {
            200..=299 => Ok(()),
            404 if gone_ok => Ok(()),
            _ => Err(refusal(&a, false)),
        }
    }
}

/// The most ranges Daytona's `networkAllowList` takes.
pub const MAX_ALLOW_LIST: usize = 5;

/// Daytona's create fields for `policy`, whose sandboxes' agents dial from `server` (ranges):
/// `{}` for a policy that lets everything through, else `networkAllowList`. An error names what
/// Daytona cannot hold.
pub fn network(
    policy: &computerd_proto::egress::EgressPolicy,
    server: &[String],
) -> Result<serde_json::Map<String, Value>, String> {
    use computerd_proto::egress::DefaultAction;
    use computerd_proto::egress::Target;
    let c = policy.compile()?;
    if let Some((entry, _)) = policy
        .allow
        .iter()
        .chain(&policy.deny)
        .zip(c.allow.iter().chain(&c.deny))
        .find(|(_, t)| !matches!(t, Target::Range(_)))
    {
        return Err(format!(
            "egress: Daytona's networkAllowList takes CIDR ranges only (at most {MAX_ALLOW_LIST}), not the name {entry:?}"
        ));
    }
    if !policy.deny.is_empty() {
        return Err("egress: Daytona has no deny list; say what is allowed under \"default\": \"deny\"".into());
    }
    let mut out = serde_json::Map::new();
    if c.default == DefaultAction::Allow {
        return Ok(out);
    }
    let mut ranges: Vec<String> = c
        .allow
        .iter()
        .filter_map(|t| match t {
            Target::Range(r) => Some(r.to_string()),
            // (Names were refused above.)
            _ => None,
        })
        .collect();
    for s in server {
        if !ranges.contains(s) {
            ranges.push(s.clone());
        }
    }
    if ranges.len() > MAX_ALLOW_LIST {
        return Err(format!(
            "egress: Daytona's networkAllowList takes at most {MAX_ALLOW_LIST} ranges, and this policy needs {} (with serverUrl's {} for the agent's link)",
            ranges.len(),
            server.len()
        ));
    }
    out.insert("networkAllowList".into(), json!(ranges.join(",")));
    Ok(out)
}

#[async_trait]
impl Provider for DaytonaProvider {
    async fn create(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        // (The create route refuses them first; this holds when its node did not know the
        // provider yet.)
        if spec.resources.is_some() {
            return Err(ProviderError::NotSent(
                "resources: a Daytona sandbox's CPUs and memory are fixed by its snapshot".into(),
            ));
        }
        let mut body = self.create_body(spec);
        if let Some(policy) = &spec.egress {
            let server = self.server_ranges().await?;
            let fields = network(policy, &server).map_err(ProviderError::NotSent)?;
            if let Some(b) = body.as_object_mut() {
                b.extend(fields);
            }
        }
        let a = self.call(http::Method::POST, "/sandbox", Some(&body)).await?;
        if !(200..=299).contains(&a.status) {
            return Err(refusal(&a, true));
        }
        match a.json().get("id").and_then(Value::as_str) {
            Some(id) if check_id(id).is_ok() => Ok(id.to_string()),
            _ => Err(ProviderError::Lost(format!("Daytona answered {} without a usable sandbox id", a.status))),
        }
    }

    async fn pause(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let since = tokio::time::Instant::now();
        self.expect_ok(http::Method::POST, format!("/sandbox/{sandbox}/stop"), false).await?;
        self.wait_for(sandbox, &["stopped", "archived"], since).await
    }

    async fn resume(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        let since = tokio::time::Instant::now();
        self.expect_ok(http::Method::POST, format!("/sandbox/{sandbox}/start"), false).await?;
        self.wait_for(sandbox, &["started"], since).await
    }

    async fn delete(&self, sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        check_id(sandbox)?;
        self.expect_ok(http::Method::DELETE, format!("/sandbox/{sandbox}"), true).await
    }

    async fn list(&self) -> Result<Option<HashMap<String, SandboxInfo>>, ProviderError> {
        let mut held = HashMap::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let (items, next) = self.page(cursor.as_deref()).await?;
            for s in &items {
                if matches!(s["state"].as_str(), Some("destroyed" | "destroying")) {
                    continue;
                }
                if let (Some(computer), Some(id)) = (s["labels"][LABEL_COMPUTER].as_str(), s["id"].as_str()) {
                    let state = s["state"].as_str().unwrap_or("unknown").to_string();
                    held.insert(computer.to_string(), SandboxInfo { sandbox: id.to_string(), state });
                }
            }
            match next {
                Some(c) => cursor = Some(c),
                None => return Ok(Some(held)),
            }
        }
        // Too many sandboxes to list in one pass: none is reported vanished.
        Ok(None)
    }

    fn paused_state(&self, state: &str) -> bool {
        // Stopped by its runner (or archived after): a start brings it back.
        matches!(state, "stopped" | "archived")
    }

    async fn inspect(&self, computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError> {
        let labels = json!({LABEL_COMPUTER: computer_id}).to_string();
        let a = self.call(http::Method::GET, &format!("/sandbox?labels={}", encode(&labels)), None).await?;
        if a.status != 200 {
            return Err(refusal(&a, false));
        }
        let v = a.json();
        let Some(items) = v.get("items").and_then(Value::as_array) else {
            return Err(ProviderError::Lost("Daytona's list answer has no items".into()));
        };
        Ok(items
            .iter()
            .filter(|s| s["labels"][LABEL_COMPUTER] == computer_id)
            .filter(|s| !matches!(s["state"].as_str(), Some("destroyed" | "destroying")))
            .find_map(|s| {
                Some(SandboxInfo {
                    sandbox: s["id"].as_str()?.to_string(),
                    state: s["state"].as_str().unwrap_or("unknown").to_string(),
                })
            }))
    }
}

impl DaytonaProvider {
    /// One page of the sandbox list (`GET /sandbox?limit=100[&cursor=…]`): its items and the
    /// next cursor.
    async fn page(&self, cursor: Option<&str>) -> Result<(Vec<Value>, Option<String>), ProviderError> {
        let mut path = "/sandbox?limit=100".to_string();
        if let Some(c) = cursor {
            path.push_str(&format!("&cursor={}", encode(c)));
        }
        let a = self.call(http::Method::GET, &path, None).await?;
        if a.status != 200 {
            return Err(refusal(&a, false));
        }
        let v = a.json();
        let Some(items) = v.get("items").and_then(Value::as_array) else {
            return Err(ProviderError::Lost("Daytona's list answer has no items".into()));
        };
        let next = v.get("nextCursor").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_string);
        Ok((items.clone(), next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: Value) -> Result<DaytonaConfig, String> {
        DaytonaConfig::parse(v.as_object().expect("object"))
    }

    #[test]
    fn config_is_checked() {
        assert!(cfg(json!({"serverUrl": "https://cd.example.com"})).is_ok());
        assert!(cfg(json!({})).is_err());
        assert!(cfg(json!({"serverUrl": "https://x", "endpoint": "http://app.daytona.io/api"})).is_err());
        assert!(cfg(json!({"serverUrl": "https://x", "snapshot": ""})).is_err());
        assert!(cfg(json!({"serverUrl": "https://x", "autoStop": 5})).is_err());
    }

    /// Issue 37, item 14: the call deadline is above Daytona's own 30 s wait on create and start.
    /// Issue 41, item 3: ranges under "default": "deny" become networkAllowList with the
    /// cluster's address; names, deny lists and more than 5 ranges are refused, naming the limit.
    #[test]
    fn i41_egress_maps_to_daytona_allow_list_or_is_refused() {
        use computerd_proto::egress::DefaultAction;
        use computerd_proto::egress::EgressPolicy;
        let p = |default, allow: &[&str], deny: &[&str]| EgressPolicy {
            default,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        let server = vec!["198.51.100.7/32".to_string()];
        let m = network(&p(DefaultAction::Deny, &["10.1.0.0/16", "203.0.113.9"], &[]), &server).expect("ranges");
        assert_eq!(m["networkAllowList"], json!("10.1.0.0/16,203.0.113.9/32,198.51.100.7/32"));
        assert!(network(&p(DefaultAction::Allow, &[], &[]), &server).expect("open").is_empty());
        let e = network(&p(DefaultAction::Deny, &["pypi.org"], &[]), &server).expect_err("a name");
        assert!(e.contains("CIDR ranges only") && e.contains("pypi.org"), "{e}");
        assert!(
            network(&p(DefaultAction::Allow, &[], &["10.0.0.0/8"]), &server)
                .expect_err("deny")
                .contains("no deny list")
        );
        let six = ["10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16", "10.4.0.0/16", "10.5.0.0/16"];
        assert!(network(&p(DefaultAction::Deny, &six, &[]), &server).expect_err("six").contains("at most 5"));
    }

    #[test]
    fn i37_14_the_deadline_is_above_the_servers_own_wait() {
        let err =
            cfg(json!({"serverUrl": "https://x", "timeoutMs": 30000})).expect_err("30 s is the server's own wait");
        assert!(err.contains("timeoutMs must be 35000"), "{err}");
        assert!(cfg(json!({"serverUrl": "https://x", "timeoutMs": 35000})).is_ok());
        assert!(DEFAULT_TIMEOUT > SERVER_WAIT && MIN_TIMEOUT_MS > SERVER_WAIT.as_millis() as u64);
    }

    #[test]
    fn a_create_body_turns_daytonas_own_timers_off() {
        let c = cfg(json!({"serverUrl": "https://cd.example.com", "target": "eu"})).expect("ok");
        let p = DaytonaProvider::new(c, "key".into(), Duration::from_secs(5)).expect("adapter");
        let spec = CreateSpec {
            computer_id: "cmp_1".into(),
            command_key: "k1".into(),
            template: Some("snap".into()),
            desktop: false,
            pairing_code: Some("code".into()),
            first_uid: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
        };
        let b = p.create_body(&spec);
        assert_eq!(b["snapshot"], "snap");
        assert_eq!((b["autoStopInterval"].clone(), b["autoDeleteInterval"].clone()), (json!(0), json!(-1)));
        assert_eq!(b["labels"], json!({"computerd.computer": "cmp_1", "computerd.command-key": "k1"}));
        assert_eq!((b["env"]["COMPUTER_AGENT_PAIR"].clone(), b["target"].clone()), (json!("code"), json!("eu")));
        assert!(!format!("{p:?}").contains("Bearer"), "the key is never shown");
        // Issue 39, item 5: the create's env and metadata (as labels) go along.
        let mut spec = spec;
        spec.env.insert("GREETING".into(), "hi".into());
        spec.metadata.insert("team".into(), "a".into());
        let b = p.create_body(&spec);
        assert_eq!(
            (b["env"]["GREETING"].clone(), b["env"]["COMPUTER_AGENT_PAIR"].clone()),
            (json!("hi"), json!("code"))
        );
        assert_eq!(b["labels"], json!({"team": "a", "computerd.computer": "cmp_1", "computerd.command-key": "k1"}));
        assert!(b.get("cpu").is_none() && b.get("memory").is_none(), "the snapshot fixes the size");
    }

    #[test]
    fn refusals_are_sorted() {
        let a = |status: u16, msg: &str| Answer {
            status,
            body: serde_json::to_vec(&json!({"statusCode": status, "message": msg})).expect("json").into(),
            retry_after: None,
            next_token: None,
        };
        let kind = |e: ProviderError| match e {
            ProviderError::Refused { kind, .. } => kind,
            ProviderError::Rejected(_) => "rejected".into(),
            ProviderError::Lost(_) => "lost".into(),
            ProviderError::NotSent(_) => "not_sent".into(),
        };
        assert_eq!(kind(refusal(&a(401, "Unauthorized"), true)), "provider_unauthorized");
        assert_eq!(kind(refusal(&a(403, "Total CPU quota exceeded"), true)), "provider_quota");
        assert_eq!(kind(refusal(&a(404, "Snapshot snap not found"), true)), "template_not_found");
        assert_eq!(kind(refusal(&a(400, "Snapshot snap not found"), true)), "template_not_found");
        assert_eq!(kind(refusal(&a(429, "ThrottlerException: Too Many Requests"), false)), "provider_rate_limited");
        assert_eq!(kind(refusal(&a(400, "Sandbox is not started"), false)), "rejected");
        assert_eq!(kind(refusal(&a(502, "Bad Gateway"), true)), "lost");
    }
}
