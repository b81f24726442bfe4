//! Builds the adapter of a stored provider record.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use computerd_raft::sm::Provider as ProviderRecord;
use computerd_raft::sm::ProviderKind;

use crate::daytona::DaytonaConfig;
use crate::daytona::DaytonaProvider;
use crate::docker::DockerConfig;
use crate::docker::DockerProvider;
use crate::e2b::E2bConfig;
use crate::e2b::E2bProvider;
use crate::fake::FakeProvider;
use crate::provider::Provider;
use crate::provider::Unavailable;

/// The default deadline of one provider call; a call past it is a lost answer.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Node-level provider options.
#[derive(Debug, Clone, Default)]
pub struct ProviderFactory {
    /// Where fake providers keep their journals; `None` disables the fake kind.
    pub fake_dir: Option<PathBuf>,
}

impl ProviderFactory {
    /// The adapter and the call deadline for a provider record.
    pub fn build(&self, p: &ProviderRecord) -> (Arc<dyn Provider>, Duration) {
        let timeout =
            p.config.get("timeoutMs").and_then(|v| v.as_u64()).map(Duration::from_millis).unwrap_or(match p.kind {
                // Above Daytona's own 30 s wait on create and start.
                ProviderKind::Daytona => crate::daytona::DEFAULT_TIMEOUT,
                _ => DEFAULT_CALL_TIMEOUT,
            });
        let adapter: Arc<dyn Provider> = match (p.kind, &self.fake_dir) {
            (ProviderKind::Fake, Some(dir)) => {
                let cfg: serde_json::Map<String, serde_json::Value> = p.config.clone().into_iter().collect();
                Arc::new(FakeProvider::new(dir.join(format!("{}.jsonl", p.id)), &cfg))
            }
            (ProviderKind::Fake, None) => Arc::new(Unavailable("fake providers are disabled on this node".into())),
            (ProviderKind::Docker, _) => {
                let cfg: serde_json::Map<String, serde_json::Value> = p.config.clone().into_iter().collect();
                match DockerConfig::parse(&cfg) {
                    Ok(c) => Arc::new(DockerProvider::new(c, timeout)),
                    Err(e) => Arc::new(Unavailable(e)),
                }
            }
            (ProviderKind::E2b, _) => {
                let cfg: serde_json::Map<String, serde_json::Value> = p.config.clone().into_iter().collect();
                match E2bConfig::parse(&cfg).and_then(|c| E2bProvider::new(c, secret(p, "apiKey"), timeout)) {
                    Ok(a) => Arc::new(a),
                    Err(e) => Arc::new(Unavailable(e)),
                }
            }
            (ProviderKind::Daytona, _) => {
                let cfg: serde_json::Map<String, serde_json::Value> = p.config.clone().into_iter().collect();
                match DaytonaConfig::parse(&cfg).and_then(|c| DaytonaProvider::new(c, secret(p, "apiKey"), timeout)) {
                    Ok(a) => Arc::new(a),
                    Err(e) => Arc::new(Unavailable(e)),
                }
            }
        };
        (adapter, timeout)
    }
}

/// A credential field of a provider record (empty when missing).
fn secret(p: &ProviderRecord, key: &str) -> String {
    p.secrets.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_string()
}

/// Whether a provider can hold a Computer of `template` to `policy` (its create asks for one, or
/// a change of a running Computer's): the docker kind can, through an egress gateway, unless
/// its sandboxes share the host's network (`network: host`, where no gateway can stand between
/// them and it); E2B can, unless its rules would mean something else (`e2b::network`); Daytona
/// takes ranges only, at create (`daytona::network`).
/// The error is the `ComputerUnsupported` message.
pub fn check_egress(p: &ProviderRecord, policy: &computerd_proto::egress::EgressPolicy) -> Result<(), String> {
    let cfg: serde_json::Map<String, serde_json::Value> = p.config.clone().into_iter().collect();
    match p.kind {
        ProviderKind::Docker => {
            let c = DockerConfig::parse(&cfg)?;
            if c.network.as_deref() == Some("host") {
                return Err("egress: this provider's sandboxes use the host's network (\"network\": \"host\"), so no gateway can stand between them and it; use a provider with its own network".into());
            }
            Ok(())
        }
        ProviderKind::E2b => {
            let c = crate::e2b::E2bConfig::parse(&cfg)?;
            crate::e2b::network(policy, &c.server_url).map(|_| ())
        }
        // (serverUrl's addresses are added at create, within the same limit of 5.)
        ProviderKind::Daytona => crate::daytona::network(policy, &[]).map(|_| ()),
        ProviderKind::Fake => policy.compile().map(|_| ()),
    }
}

/// Checks a create's `resources` against provider record `p` before anything is stored (issue
/// 39, item 5): a docker template's `cpus` and `memoryMb` are the ceilings (and the defaults);
/// E2B's template and Daytona's snapshot fix a sandbox's CPUs and memory, so both refuse them;
/// the fake kind takes them. The error names the field, and the ceiling.
pub fn check_resources(
    p: &ProviderRecord,
    template: Option<&str>,
    desktop: bool,
    r: &crate::provider::Resources,
) -> Result<(), String> {
    let cfg: serde_json::Map<String, serde_json::Value> = p.config.clone().into_iter().collect();
    match p.kind {
        ProviderKind::Docker => {
            let c = DockerConfig::parse(&cfg)?;
            let t = c.template(template, desktop).map_err(|e| format!("resources: {e}"))?;
            crate::docker::within(&t, Some(r)).map(|_| ())
        }
        ProviderKind::E2b => Err(
            "resources: an E2B sandbox's CPUs and memory are fixed by its template (build a template with the size wanted, and name it in source.template)"
                .into(),
        ),
        ProviderKind::Daytona => Err(
            "resources: a Daytona sandbox's CPUs and memory are fixed by its snapshot (make a snapshot with the size wanted, and name it in source.template)"
                .into(),
        ),
        ProviderKind::Fake => Ok(()),
    }
}
