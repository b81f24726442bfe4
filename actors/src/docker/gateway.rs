//! A docker sandbox's egress gateway: the container that owns the sandbox's network namespace
//! when its Computer has an egress policy.
//!
//! The gateway is a small container of the template's image, named
//! `computerd-<computer id>-egress` and labelled [`LABEL_GATEWAY`], on the provider's network,
//! running `computer-agent egress-gateway serve` with `NET_ADMIN` and `NET_RAW` (and nothing
//! else). The sandbox is made with `NetworkMode: container:<gateway>`: it shares the gateway's
//! network namespace, and so its rules, but it has no `NET_ADMIN` (see [`super::SANDBOX_CAPS`]),
//! so not even its root can change them, mark a packet past them, or reach the gateway's
//! processes (another PID namespace). The gateway redirects every TCP connection to its
//! transparent proxy, which decides on the name the connection carries (TLS SNI, HTTP `Host`)
//! and connects to that name as the gateway resolves it; other protocols go by address. The
//! agent's link to the cluster (`serverUrl`'s addresses) is exempt.
//!
//! The policy is set with `docker exec <gateway> computer-agent egress-gateway set <policy>`:
//! at create before the sandbox starts (until then the gateway denies everything), and on each
//! change (the command answers once the new rules hold and the connections they deny are cut).
//! A recreate keeps the gateway, and the new sandbox joins it; a delete of the Computer removes
//! it after the sandbox.
//!
//! The gateway prints each connection it refuses as a line on its standard output
//! ([`computerd_proto::egress::Denied::line`]); its log is bounded ([`GATEWAY_LOG`]), and the
//! leader's egress watch follows it ([`DockerProvider::gateway_denials`]).

use std::collections::BTreeMap;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::ContainerCreateBody;
use bollard::models::HostConfig;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use computerd_proto::egress::Denied;
use computerd_proto::egress::EgressPolicy;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::AGENT_PATH;
use super::DockerProvider;
use super::Template;
use super::classify;
use crate::provider::ProviderError;

/// The label naming the Computer whose sandbox a gateway serves.
pub const LABEL_GATEWAY: &str = "computerd.egress-gateway-of";
/// The error kind of a policy change for a sandbox that has no gateway.
pub const NO_GATEWAY: &str = "egress_no_gateway";
/// The capabilities of a gateway: its rules (`NET_ADMIN`), and iptables' own socket (`NET_RAW`).
const GATEWAY_CAPS: [&str; 2] = ["NET_ADMIN", "NET_RAW"];
/// The gateway's memory ceiling, MiB.
const GATEWAY_MEMORY_MB: i64 = 128;

/// The gateway's log: docker's `json-file`, at most two files of 1 MiB (its lines are the
/// connections it refused; the egress watch follows them as they come).
const GATEWAY_LOG: [(&str, &str); 2] = [("max-size", "1m"), ("max-file", "2")];
/// The longest output line of a gateway kept for reading (longer ones are skipped).
const MAX_LINE: usize = 4096;

/// The gateway container of Computer `computer_id`.
pub fn gateway_name(computer_id: &str) -> String {
    format!("computerd-{computer_id}-egress")
}

/// What `computer-agent egress-gateway serve` reads from `COMPUTERD_EGRESS_CONFIG`.
#[derive(serde::Serialize)]
struct GatewayConfig<'a> {
    /// The cluster's addresses the agent dials (`ip:port`), exempt from the policy.
    link: Vec<String>,
    /// Names the gateway resolves itself (the template's `hosts`).
    hosts: &'a BTreeMap<String, String>,
}

impl DockerProvider {
    /// The addresses of `serverUrl` (resolved here when it names a host).
    async fn link_addresses(&self) -> Result<Vec<String>, ProviderError> {
        let (host, port) = super::server_host_port(&self.config.server_url);
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok(vec![std::net::SocketAddr::new(ip, port).to_string()]);
        }
        let found = tokio::net::lookup_host((host.as_str(), port)).await.map_err(|e| {
            ProviderError::NotSent(format!("the egress gateway needs serverUrl's address: {host}: {e}"))
        })?;
        let mut out: Vec<String> = found.map(|a| a.to_string()).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// The running gateway of `computer_id` for a sandbox of template `t` on `network`, with
    /// `policy` set: one already there (a recreate's) is kept; a stopped one is replaced.
    /// Answers its container id. On an error no gateway of this call is left behind.
    pub(super) async fn ensure_gateway(
        &self,
        docker: &Docker,
        computer_id: &str,
        t: &Template,
        network: &str,
        policy: &EgressPolicy,
    ) -> Result<String, ProviderError> {
        let name = gateway_name(computer_id);
        match docker.inspect_container(&name, None).await {
            Ok(c) => {
                if !serves(&c, computer_id) {
                    return Err(ProviderError::NotSent(format!(
                        "a container named {name} exists and is not this computer's egress gateway"
                    )));
                }
                let running = c.state.as_ref().and_then(|s| s.running).unwrap_or(false);
                let id = c.id.unwrap_or(name.clone());
                if running {
                    // A recreate's: revision 0 is ignored where a later change is in force (that is
                    // the stored policy, which the spec carries).
                    self.gateway_set(docker, &id, policy, 0).await?;
                    return Ok(id);
                }
                remove(docker, &id).await?;
            }
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(super::read_failed(e, "looking for the egress gateway")),
        }
        let config = GatewayConfig { link: self.link_addresses().await?, hosts: &t.hosts };
        let config = serde_json::to_string(&config).map_err(|e| ProviderError::NotSent(e.to_string()))?;
        let body = ContainerCreateBody {
            image: Some(t.image.clone()),
            cmd: Some(vec![AGENT_PATH.to_string(), "egress-gateway".into(), "serve".into()]),
            env: Some(vec![format!("COMPUTERD_EGRESS_CONFIG={config}")]),
            labels: Some(std::collections::HashMap::from([(LABEL_GATEWAY.to_string(), computer_id.to_string())])),
            host_config: Some(HostConfig {
                nano_cpus: Some(500_000_000),
                memory: Some(GATEWAY_MEMORY_MB << 20),
                pids_limit: Some(64),
                network_mode: Some(network.to_string()),
                extra_hosts: Some(extra_hosts(&t.hosts)),
                init: Some(true),
                binds: self.config.agent_binary.as_ref().map(|b| vec![format!("{b}:{AGENT_PATH}:ro")]),
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: Some(GATEWAY_CAPS.iter().map(|c| c.to_string()).collect()),
                security_opt: Some(vec!["no-new-privileges".into()]),
                log_config: Some(bollard::models::HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: Some(GATEWAY_LOG.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::new().name(&name).build();
        let created = docker.create_container(Some(opts), body).await.map_err(|e| match classify(e) {
            ProviderError::Lost(m) => ProviderError::NotSent(format!("creating the egress gateway: {m}")),
            other => other,
        })?;
        let started = match docker.start_container(&created.id, None).await {
            Ok(()) => self.gateway_set(docker, &created.id, policy, 0).await,
            Err(e) => Err(classify(e)),
        };
        match started {
            Ok(()) => Ok(created.id),
            Err(e) => {
                // No sandbox joined it: take it back, so the failed create leaves nothing.
                if let Err(r) = remove(docker, &created.id).await {
                    tracing::warn!(gateway = %created.id, error = %r, "a failed egress gateway could not be removed");
                }
                Err(match e {
                    ProviderError::Lost(m) | ProviderError::NotSent(m) => {
                        ProviderError::Rejected(format!("the egress gateway did not start: {m}"))
                    }
                    other => other,
                })
            }
        }
    }

    /// Sets `policy` of store revision `revision` in gateway `id` (`egress-gateway set`, which
    /// answers once it holds, or that a later revision is in force and stays).
    pub(super) async fn gateway_set(
        &self,
        docker: &Docker,
        id: &str,
        policy: &EgressPolicy,
        revision: u64,
    ) -> Result<(), ProviderError> {
        let json = serde_json::to_string(policy).map_err(|e| ProviderError::NotSent(e.to_string()))?;
        let revision = revision.to_string();
        let (code, _out, err) = self.gateway_exec(docker, id, &["set", &json, &revision]).await?;
        if code == 0 {
            Ok(())
        } else {
            Err(ProviderError::Rejected(format!("the egress gateway refused the policy: {}", err.trim())))
        }
    }

    /// Runs `computer-agent egress-gateway <args>` in gateway `id`: its exit code, stdout and stderr.
    async fn gateway_exec(
        &self,
        docker: &Docker,
        id: &str,
        args: &[&str],
    ) -> Result<(i64, String, String), ProviderError> {
        let mut cmd = vec![AGENT_PATH.to_string(), "egress-gateway".to_string()];
        cmd.extend(args.iter().map(|a| a.to_string()));
        let config = bollard::models::ExecConfig {
            cmd: Some(cmd),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let exec = docker.create_exec(id, config).await.map_err(|e| match classify(e) {
            // The exec was never made: nothing ran.
            ProviderError::Lost(m) => ProviderError::NotSent(m),
            other => other,
        })?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        match docker.start_exec(&exec.id, None::<bollard::exec::StartExecOptions>).await.map_err(classify)? {
            bollard::exec::StartExecResults::Attached { mut output, .. } => {
                while let Some(chunk) = output.next().await {
                    match chunk.map_err(classify)? {
                        bollard::container::LogOutput::StdOut { message } => out.extend_from_slice(&message),
                        bollard::container::LogOutput::StdErr { message } => err.extend_from_slice(&message),
                        _ => {}
                    }
                    if out.len() + err.len() > 1 << 20 {
                        return Err(ProviderError::Lost("the egress gateway's answer is over 1 MiB".into()));
                    }
                }
            }
            bollard::exec::StartExecResults::Detached => {
                return Err(ProviderError::Lost("the engine ran the gateway's command detached".into()));
            }
        }
        let code = docker.inspect_exec(&exec.id).await.map_err(classify)?.exit_code.unwrap_or(-1);
        Ok((code, String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned()))
    }

    /// The gateway of `computer_id`, if it has one (its container id).
    pub(super) async fn gateway_of(&self, docker: &Docker, computer_id: &str) -> Result<Option<String>, ProviderError> {
        match docker.inspect_container(&gateway_name(computer_id), None).await {
            Ok(c) => Ok(c.id.clone().filter(|_| serves(&c, computer_id))),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(e) => Err(super::read_failed(e, "looking for the egress gateway")),
        }
    }

    /// Sets a running Computer's policy in its gateway.
    pub(super) async fn set_gateway_policy(
        &self,
        computer_id: &str,
        policy: &EgressPolicy,
        revision: u64,
    ) -> Result<(), ProviderError> {
        let docker = self.docker().await?;
        let Some(id) = self.gateway_of(docker, computer_id).await? else {
            return Err(ProviderError::Refused {
                kind: NO_GATEWAY.into(),
                message: "this sandbox was created without an egress policy, so nothing stands between it and the network to change: create the Computer with \"egress\" (\"default\": \"allow\" filters nothing) to change it while it runs".into(),
            });
        };
        self.gateway_set(docker, &id, policy, revision).await
    }

    /// What the gateway of `computer_id` counted (`egress-gateway stats`), if it has one.
    pub(super) async fn gateway_stats(&self, computer_id: &str) -> Result<Option<serde_json::Value>, ProviderError> {
        let docker = self.docker().await?;
        let Some(id) = self.gateway_of(docker, computer_id).await? else { return Ok(None) };
        let (code, out, err) = self.gateway_exec(docker, &id, &["stats"]).await?;
        if code != 0 {
            return Err(ProviderError::Rejected(format!("the egress gateway's stats: {}", err.trim())));
        }
        serde_json::from_str(out.trim())
            .map(Some)
            .map_err(|e| ProviderError::Rejected(format!("the egress gateway's stats are not JSON: {e}")))
    }

    /// The connections the gateway of `computer_id` refuses from `since_ms` on (its log from
    /// that second, then followed), if it has one. The stream ends with the gateway.
    pub(super) async fn gateway_denials(
        &self,
        computer_id: &str,
        since_ms: u64,
    ) -> Result<Option<BoxStream<'static, Denied>>, ProviderError> {
        let docker = self.docker().await?;
        let Some(id) = self.gateway_of(docker, computer_id).await? else { return Ok(None) };
        let since = i32::try_from(since_ms / 1000).unwrap_or(i32::MAX);
        let opts = bollard::query_parameters::LogsOptionsBuilder::new().follow(true).stdout(true).since(since).build();
        let chunks = docker.logs(&id, Some(opts));
        let lines = futures::stream::unfold((chunks, Lines::default()), |(mut chunks, mut lines)| async move {
            loop {
                if let Some(line) = lines.next() {
                    return Some((line, (chunks, lines)));
                }
                match chunks.next().await? {
                    Ok(bollard::container::LogOutput::StdOut { message }) => lines.push(&message),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "an egress gateway's log ended");
                        return None;
                    }
                }
            }
        });
        Ok(Some(lines.filter_map(|l| std::future::ready(Denied::from_line(&l))).boxed()))
    }

    /// Removes the gateway of `computer_id` (after its sandbox), if it has one.
    pub(super) async fn remove_gateway(&self, computer_id: &str) -> Result<(), ProviderError> {
        let docker = self.docker().await?;
        match self.gateway_of(docker, computer_id).await? {
            Some(id) => remove(docker, &id).await,
            None => Ok(()),
        }
    }
}

/// Whole lines out of a gateway's output chunks (a line longer than [`MAX_LINE`] is skipped).
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
    skipping: bool,
    ready: std::collections::VecDeque<String>,
}

impl Lines {
    fn push(&mut self, bytes: &[u8]) {
        for part in bytes.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match part.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (part, false),
            };
            if !self.skipping {
                if self.partial.len() + body.len() > MAX_LINE {
                    self.partial.clear();
                    self.skipping = true;
                } else {
                    self.partial.extend_from_slice(body);
                }
            }
            if ends {
                if !self.skipping {
                    self.ready.push_back(String::from_utf8_lossy(&self.partial).into_owned());
                }
                self.partial.clear();
                self.skipping = false;
            }
        }
    }

    fn next(&mut self) -> Option<String> {
        self.ready.pop_front()
    }
}

/// Whether container `c` is the egress gateway of `computer_id` (by its label).
fn serves(c: &bollard::models::ContainerInspectResponse, computer_id: &str) -> bool {
    c.config.as_ref().and_then(|c| c.labels.as_ref()).and_then(|l| l.get(LABEL_GATEWAY)).map(String::as_str)
        == Some(computer_id)
}

/// Docker's `ExtraHosts` of a template's `hosts` (`name:address`).
pub fn extra_hosts(hosts: &BTreeMap<String, String>) -> Vec<String> {
    hosts.iter().map(|(name, ip)| format!("{name}:{ip}")).collect()
}

/// Removes container `id` (gone already is fine).
async fn remove(docker: &Docker, id: &str) -> Result<(), ProviderError> {
    let rm = RemoveContainerOptionsBuilder::new().force(true).build();
    match docker.remove_container(id, Some(rm)).await {
        Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        Err(e) => Err(classify(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_chunks_become_whole_lines_and_an_overlong_one_is_skipped() {
        let mut l = Lines::default();
        l.push(b"one\ntw");
        assert_eq!(l.next().as_deref(), Some("one"));
        assert_eq!(l.next(), None, "half a line waits");
        l.push(b"o\n");
        assert_eq!(l.next().as_deref(), Some("two"));
        l.push(&vec![b'x'; MAX_LINE + 1]);
        l.push(b"tail\nthree\n");
        assert_eq!(l.next().as_deref(), Some("three"), "the overlong line is skipped, the next kept");
        assert_eq!(l.next(), None);
    }
}
