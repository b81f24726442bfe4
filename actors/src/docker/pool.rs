//! The docker provider's warm pool: containers made ahead of any create, from a template, their
//! agents waiting for an identity, each claimed whole by one Computer.
//!
//! Config: `pool: {"<template key>": {"size", "desktop"}}`, where a key names a template in
//! `templates`, or is `default` / `desktop` (what a create that names no template uses; see
//! [`DockerConfig::template`]). `desktop` defaults to whether the key is `desktop`. At most
//! [`MAX_POOL_SIZE`] per key, [`MAX_POOL_TOTAL`] in all, over at most [`MAX_POOL_KEYS`] keys; a
//! size of 0 keeps no pool.
//!
//! A pooled container is named [`pool_container_name`] (`computerd-pool-<pool id>`), labelled
//! [`LABEL_POOL`] (its pool id) and [`LABEL_POOL_KEY`] (its template key), never with a
//! Computer's labels; its agent gets no pairing code but the pool id and a token
//! ([`POOL_ID_ENV`], [`POOL_TOKEN_ENV`]); its runtime volume is `computerd-runtime-<pool id>`
//! (labelled with the pool id). A claim renames it `computerd-<computer id>`: from then on it is
//! that Computer's sandbox (its labels stay the pool's, so the provider finds it by name).

use std::collections::HashMap;

use bollard::errors::Error as DockerError;
use serde::Deserialize;

use super::DockerConfig;
use super::DockerProvider;
use super::Owner;
use super::Template;
use super::classify;
use super::container_name;
use super::read_failed;
use super::runtime_volume;
use crate::provider::CreateSpec;
use crate::provider::PoolWant;
use crate::provider::Pooled;
use crate::provider::ProviderError;

/// The label with a pooled container's pool id.
pub const LABEL_POOL: &str = "computerd.pool";
/// The label with a pooled container's template key.
pub const LABEL_POOL_KEY: &str = "computerd.pool-key";
/// The label naming the provider record a pooled container (and its volume) was made for.
pub const LABEL_POOL_PROVIDER: &str = "computerd.pool-provider";
/// The most sandboxes one pool key keeps ready.
pub const MAX_POOL_SIZE: u32 = 8;
/// The most sandboxes all of a provider's pools keep ready together.
pub const MAX_POOL_TOTAL: u32 = 16;
/// The most keys a provider's pool config has.
pub const MAX_POOL_KEYS: usize = 8;
/// The pooled agent's pool id.
pub const POOL_ID_ENV: &str = "COMPUTER_AGENT_POOL_ID";
/// The token a pooled agent waits for its identity with.
pub const POOL_TOKEN_ENV: &str = "COMPUTER_AGENT_POOL_TOKEN";

/// One template key's warm pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    /// How many sandboxes it keeps ready (0: none).
    pub size: u32,
    /// Whether they have a desktop (default: whether the key is `desktop`).
    #[serde(default)]
    pub desktop: Option<bool>,
}

impl PoolConfig {
    /// Whether the sandboxes of pool key `key` have a desktop.
    pub fn desktop_of(&self, key: &str) -> bool {
        self.desktop.unwrap_or(key == "desktop")
    }
}

/// The container name of a pooled sandbox before a Computer claims it.
pub fn pool_container_name(pool_id: &str) -> String {
    format!("computerd-pool-{pool_id}")
}

/// The Computer a pooled container's name says claimed it (`computerd-<id>`, the leading `/` of
/// a listed name allowed), with whether it is one a recreate set aside
/// (`computerd-<id>-replaced-<short id>`). `None`: unclaimed (`computerd-pool-…`) or not ours.
pub(super) fn claimed_by(name: &str) -> Option<(String, bool)> {
    let id = name.trim_start_matches('/').strip_prefix("computerd-")?;
    if id.is_empty() || id.starts_with("pool-") {
        return None;
    }
    match id.split_once("-replaced-") {
        Some((id, _)) if !id.is_empty() => Some((id.to_string(), true)),
        Some(_) => None,
        None => Some((id.to_string(), false)),
    }
}

/// A Docker name filter (an anchored regular expression) for exactly `name`.
pub(super) fn exact_name_filter(name: &str) -> String {
    let mut re = String::from("^/");
    for c in name.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            re.push('\\');
        }
        re.push(c);
    }
    re.push('$');
    re
}

/// Checks a config's `pool` (user input: every problem is named).
pub(super) fn check(c: &DockerConfig) -> Result<(), String> {
    if c.pool.len() > MAX_POOL_KEYS {
        return Err(format!("docker provider config: pool has {} keys, at most {MAX_POOL_KEYS}", c.pool.len()));
    }
    let mut keys: Vec<_> = c.pool.iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    let mut total: u64 = 0;
    for (key, p) in keys {
        let named = c.templates.contains_key(key);
        if !(named || key == "default" || key == "desktop") {
            return Err(format!(
                "docker provider config: pool {key:?} names no template: a pool key is \"default\", \"desktop\" or a name in templates"
            ));
        }
        if p.size > MAX_POOL_SIZE {
            return Err(format!("docker provider config: pool {key:?}: size is {}, at most {MAX_POOL_SIZE}", p.size));
        }
        // `default` and `desktop` (not templates) serve creates that name no template, which
        // pick the key by their desktop: another desktop there would serve none.
        if !named && p.desktop_of(key) != (key == "desktop") {
            return Err(format!(
                "docker provider config: pool {key:?}: desktop must be {} (a create naming no template uses {key:?} only {} a desktop)",
                key == "desktop",
                if key == "desktop" { "with" } else { "without" }
            ));
        }
        total += u64::from(p.size);
    }
    if total > u64::from(MAX_POOL_TOTAL) {
        return Err(format!("docker provider config: the pools' sizes add up to {total}, at most {MAX_POOL_TOTAL}"));
    }
    Ok(())
}

impl DockerConfig {
    /// The template of pool key `key`: the template of that name, else for `desktop` and
    /// `default` what a create naming no template gets.
    pub fn pool_template(&self, key: &str) -> Result<Template, ProviderError> {
        match key {
            k if self.templates.contains_key(k) => self.template(Some(k), false),
            "desktop" => self.template(None, true),
            "default" => self.template(None, false),
            other => Err(ProviderError::NotSent(format!("the provider has no pool key {other:?}"))),
        }
    }

    /// The warm pools the config asks for (keys of size 0 keep none), by key.
    pub fn pools(&self) -> Vec<PoolWant> {
        let mut want: Vec<PoolWant> = self
            .pool
            .iter()
            .filter(|(_, p)| p.size > 0)
            .map(|(key, p)| PoolWant { key: key.clone(), desktop: p.desktop_of(key), size: p.size })
            .collect();
        want.sort_by(|a, b| a.key.cmp(&b.key));
        want
    }

    /// The pool key that can serve a create of `spec`: its template key (the named template,
    /// else `desktop` / `default` by its desktop) has a pool of the same desktop, and the
    /// sandbox need not be made for it (no egress policy: that puts it behind a gateway made
    /// with it; no resources of its own: a pooled one has the template's).
    pub fn pool_key(&self, spec: &CreateSpec) -> Option<String> {
        if spec.egress.is_some() || spec.resources.is_some() {
            return None;
        }
        let key = match spec.template.as_deref() {
            // A name that is no template is refused by the create, not served.
            Some(name) if !self.templates.contains_key(name) => return None,
            Some(name) => name,
            None if spec.desktop => "desktop",
            None => "default",
        };
        let p = self.pool.get(key)?;
        (p.size > 0 && p.desktop_of(key) == spec.desktop).then(|| key.to_string())
    }
}

impl DockerProvider {
    /// Who a sandbox of pool key `key` (with a desktop or not) is made for: named
    /// [`pool_container_name`], labelled with the pool, on volume `computerd-runtime-<pool id>`,
    /// its agent given no pairing code but the pool id and `token`.
    pub(super) fn pool_owner(&self, provider_id: &str, key: &str, desktop: bool, pool_id: &str, token: &str) -> Owner {
        let spec = CreateSpec {
            computer_id: String::new(),
            command_key: String::new(),
            template: None,
            desktop,
            pairing_code: None,
            first_uid: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
        };
        let mut env = crate::provider::sandbox_env(&spec, &self.config.server_url, self.config.ca_cert.as_deref());
        env.push((POOL_ID_ENV.to_string(), pool_id.to_string()));
        env.push((POOL_TOKEN_ENV.to_string(), token.to_string()));
        Owner {
            name: pool_container_name(pool_id),
            labels: HashMap::from([
                (LABEL_POOL.to_string(), pool_id.to_string()),
                (LABEL_POOL_KEY.to_string(), key.to_string()),
                (LABEL_POOL_PROVIDER.to_string(), provider_id.to_string()),
            ]),
            volume: runtime_volume(pool_id),
            env,
        }
    }

    /// Makes and starts one sandbox of pool `key` ([`crate::provider::Provider::pool_start`]).
    pub(super) async fn start_pooled(
        &self,
        provider_id: &str,
        key: &str,
        pool_id: &str,
        token: &str,
    ) -> Result<String, ProviderError> {
        let ok_id = !pool_id.is_empty()
            && pool_id.len() <= 64
            && pool_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok_id {
            return Err(ProviderError::NotSent(format!(
                "a pool id is 1 to 64 letters, digits, '_' or '-', not {pool_id:?}"
            )));
        }
        let t = self.config.pool_template(key)?;
        let desktop = self.config.pool.get(key).map_or(key == "desktop", |p| p.desktop_of(key));
        let size = (t.cpus, t.memory_mb);
        self.check_image(&t.image).await?;
        let docker = self.docker().await?;
        let network = self.network(docker, &t).await?;
        let owner = self.pool_owner(provider_id, key, desktop, pool_id, token);
        if t.runtime_volume {
            let labels = HashMap::from([
                (LABEL_POOL.to_string(), pool_id.to_string()),
                (LABEL_POOL_PROVIDER.to_string(), provider_id.to_string()),
            ]);
            self.ensure_volume(docker, &owner.volume, labels).await?;
        }
        let made = self.create_and_start(docker, &owner, &t, size, &network).await;
        if t.runtime_volume
            && let Err(ProviderError::NotSent(_) | ProviderError::Rejected(_) | ProviderError::Refused { .. }) = &made
        {
            // No container of the pool id is left: neither is its volume.
            if let Err(e) =
                docker.remove_volume(&owner.volume, None::<bollard::query_parameters::RemoveVolumeOptions>).await
            {
                tracing::warn!(pool = %pool_id, error = %e, "the runtime volume of a refused pool start could not be removed");
            }
        }
        made
    }

    /// Names pooled sandbox `sandbox` for Computer `computer_id`
    /// ([`crate::provider::Provider::pool_claimed`]).
    pub(super) async fn claim_pooled(&self, sandbox: &str, computer_id: &str) -> Result<(), ProviderError> {
        let docker = self.docker().await?;
        let c = match docker.inspect_container(sandbox, None).await {
            Ok(c) => c,
            Err(DockerError::DockerResponseServerError { status_code: 404, message }) => {
                return Err(ProviderError::Rejected(format!("no container {sandbox}: {message}")));
            }
            Err(e) => return Err(read_failed(e, "inspecting the pooled sandbox")),
        };
        let want = container_name(computer_id);
        let name = c.name.as_deref().unwrap_or_default().trim_start_matches('/');
        if name == want {
            return Ok(());
        }
        let pool_id = c.config.as_ref().and_then(|c| c.labels.as_ref()).and_then(|l| l.get(LABEL_POOL));
        let Some(pool_id) = pool_id else {
            return Err(ProviderError::NotSent(format!("the container {sandbox} ({name}) is not a pooled sandbox")));
        };
        if name != pool_container_name(pool_id) {
            return Err(ProviderError::NotSent(format!(
                "the pooled sandbox {sandbox} is named {name}: another Computer claimed it"
            )));
        }
        let opts = bollard::query_parameters::RenameContainerOptionsBuilder::new().name(&want).build();
        let id = c.id.as_deref().unwrap_or(sandbox);
        docker.rename_container(id, opts).await.map_err(classify)
    }

    /// Every pooled sandbox, claimed or not ([`crate::provider::Provider::pool_list`]).
    pub(super) async fn list_pooled(&self, provider_id: &str) -> Result<Vec<Pooled>, ProviderError> {
        let list = self.labelled(format!("{LABEL_POOL_PROVIDER}={provider_id}")).await?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let pool_id = c.labels.as_ref()?.get(LABEL_POOL)?.clone();
                let name = c.names.iter().flatten().next().map(|n| n.trim_start_matches('/').to_string());
                Some(Pooled {
                    pool_id,
                    sandbox: c.id.clone()?,
                    name: name.unwrap_or_default(),
                    created_ms: u64::try_from(c.created.unwrap_or(0)).unwrap_or(0).saturating_mul(1000),
                    running: matches!(
                        c.state,
                        Some(
                            bollard::models::ContainerSummaryStateEnum::RUNNING
                                | bollard::models::ContainerSummaryStateEnum::PAUSED
                                | bollard::models::ContainerSummaryStateEnum::CREATED
                        )
                    ),
                })
            })
            .collect())
    }

    /// The pooled containers (all states) whose names match `pattern` (a Docker name filter).
    pub(super) async fn pooled_named(
        &self,
        pattern: String,
    ) -> Result<Vec<bollard::models::ContainerSummary>, ProviderError> {
        let filters = HashMap::from([("label", vec![LABEL_POOL.to_string()]), ("name", vec![pattern])]);
        let opts = bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        self.docker().await?.list_containers(Some(opts)).await.map_err(classify)
    }

    /// The pooled containers Computer `computer_id` claimed: its sandbox (named for it), and
    /// any a recreate set aside (`computerd-<id>-replaced-…`).
    pub(super) async fn pooled_of(
        &self,
        computer_id: &str,
    ) -> Result<Vec<bollard::models::ContainerSummary>, ProviderError> {
        let name = container_name(computer_id);
        let pattern = exact_name_filter(&name);
        let pattern = format!("{}(-replaced-[0-9a-f]+)?$", pattern.trim_end_matches('$'));
        let list = self.pooled_named(pattern).await?;
        Ok(list
            .into_iter()
            .filter(|c| c.names.iter().flatten().any(|n| claimed_by(n).is_some_and(|(id, _)| id == computer_id)))
            .collect())
    }
}
