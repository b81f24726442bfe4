//! Part 1: a session call (and a small file read, and input to `cat`) sent to the node that holds
//! the agent's link, against the same sent to another node, which routes it there.

use std::future::Future;
use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::api::MIN_YIELD_MS;
use computerd_bench::report::Recorder;
use computerd_bench::report::Summary;
use computerd_bench::report::excerpt;
use computerd_bench::report::spawn_agent;
use computerd_tests::TestCluster;
use computerd_tests::agent::paired_computer;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::json;

/// Untimed rounds before part 1's samples (connections, the agent's first spawns).
const WARMUP_ROUNDS: usize = 10;
/// Samples per node of part 1's `cat` input check (each takes the 250 ms yield).
const CAT_SAMPLES: usize = 5;
/// Bytes of part 1's small file.
const FILE_SMALL: usize = 64;
/// Longest wait for the agent to link.
const LINK_BOUND: Duration = Duration::from_secs(60);
/// Pause between two polls.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// Pause after a failed request, so a broken part does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// One operation sent to the owner and to a non-owner.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Routed {
    pub what: &'static str,
    pub owner: Summary,
    pub non_owner: Summary,
}

/// Part 1's result.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Part1 {
    pub leader: u64,
    pub owner: u64,
    pub non_owner: u64,
    pub session: Routed,
    /// The small file read.
    pub file: Routed,
    /// The `cat` input check (the yield floor); None when it failed.
    pub cat: Option<Routed>,
    pub cat_error: Option<String>,
    /// `linkNode` after the samples (the link must not have moved).
    pub link_node_after: Option<u64>,
}

/// `linkNode` of the Computer, read on `api`'s node.
async fn link_node(api: &Api, computer: &str) -> Result<Option<u64>> {
    let v = api.get(&format!("/v1/computers/{computer}")).await?;
    Ok(if v["state"] == "running" { v["linkNode"].as_u64() } else { None })
}

/// Part 1 on the 3-node cluster `c`: its two followers, the agent linked to the first.
pub async fn part_routing(c: &TestCluster, http: &reqwest::Client, agent_bin: &Path, samples: usize) -> Result<Part1> {
    let leader = c.leader().await;
    let followers: Vec<u64> = c.nodes.keys().copied().filter(|id| *id != leader).collect();
    let (owner, non_owner) = match followers.as_slice() {
        [x, y, ..] => (*x, *y),
        _ => bail!("expected two followers, the leader is {leader} of {:?}", c.nodes.keys().collect::<Vec<_>>()),
    };
    let (computer, code) = paired_computer(c, "bench-routing").await;
    let api = |id: u64| Api { http: http.clone(), base: c.url(id, ""), token: c.token.clone() };
    let (to_owner, to_other) = (api(owner), api(non_owner));
    let agent_log = c.dir.path().join("agent.log");
    let _agent = spawn_agent(agent_bin, &to_owner.base, &code, c.dir.path(), &agent_log)?;
    let deadline = Instant::now() + LINK_BOUND;
    loop {
        // Both nodes must see the link on X (so Y routes it without a barrier or a redirect).
        let on_owner = link_node(&to_owner, &computer).await.ok().flatten();
        let on_other = link_node(&to_other, &computer).await.ok().flatten();
        if on_owner == Some(owner) && on_other == Some(owner) {
            break;
        }
        if Instant::now() >= deadline {
            let tail = std::fs::read_to_string(&agent_log).unwrap_or_default();
            bail!(
                "the agent did not link to node {owner} (node {owner} sees {on_owner:?}, node {non_owner} sees \
                 {on_other:?}); its log: {}",
                tail.lines().rev().take(10).collect::<Vec<_>>().join(" | ")
            );
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    eprintln!("  linked to node {owner}; non-owner node {non_owner}; leader node {leader}");
    let on = |on_owner: bool| if on_owner { &to_owner } else { &to_other };
    let routed = |what, (on_owner, via_other): (Recorder, Recorder)| Routed {
        what,
        owner: on_owner.summary(format!("to node {owner} (owner)")),
        non_owner: via_other.summary(format!("to node {non_owner}, routed to {owner}")),
    };

    let calls = alternate(samples, |on_owner| on(on_owner).session_exit(&computer, "true", "")).await;
    let session = routed("session `true`, start to exit", calls);

    eprintln!("  a 64-byte file read, {samples} each");
    let file_path = c.dir.path().join("bench-64B.txt");
    let data: Vec<u8> = (0..FILE_SMALL).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&file_path, &data).with_context(|| format!("write {}", file_path.display()))?;
    let calls = alternate(samples, |on_owner| on(on_owner).read_file(&computer, &file_path, &data)).await;
    let file = routed("GET files (64 bytes, raw body)", calls);

    eprintln!("  input to an open `cat` session ({CAT_SAMPLES} each)");
    let (cat, cat_error) = match cat_check(&to_owner, &to_other, &computer).await {
        Ok(calls) => (Some(routed("input \"x\\n\" to `cat`, yieldTimeMs 250", calls)), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let link_node_after = link_node(&to_owner, &computer).await.ok().flatten();
    Ok(Part1 { leader, owner, non_owner, session, file, cat, cat_error, link_node_after })
}

/// [`WARMUP_ROUNDS`] untimed rounds, then `samples` rounds of `call(true)` (to the owner) and
/// `call(false)` (routed), alternating which goes first so neither always follows the other.
async fn alternate<F, C>(samples: usize, mut call: C) -> (Recorder, Recorder)
where
    C: FnMut(bool) -> F,
    F: Future<Output = Result<Duration>>,
{
    for _ in 0..WARMUP_ROUNDS {
        let _ = call(true).await;
        let _ = call(false).await;
    }
    let (mut on_owner, mut via_other) = (Recorder::default(), Recorder::default());
    for i in 0..samples {
        if i % 2 == 0 {
            on_owner.record(call(true).await, ERROR_PAUSE).await;
            via_other.record(call(false).await, ERROR_PAUSE).await;
        } else {
            via_other.record(call(false).await, ERROR_PAUSE).await;
            on_owner.record(call(true).await, ERROR_PAUSE).await;
        }
    }
    (on_owner, via_other)
}

/// Input `x\n` with the shortest yield to an open `cat` session, on the owner and routed.
async fn cat_check(to_owner: &Api, to_other: &Api, computer: &str) -> Result<(Recorder, Recorder)> {
    let body = json!({"command": "cat", "yieldTimeMs": MIN_YIELD_MS});
    let v = to_owner.post(&format!("/v1/computers/{computer}/sessions"), body, StatusCode::OK).await?;
    let sid = match (v["running"].as_bool(), v["session"].as_str()) {
        (Some(true), Some(sid)) => sid.to_string(),
        _ => bail!("`cat` should still run: {}", excerpt(&v)),
    };
    let (mut on_owner, mut via_other) = (Recorder::default(), Recorder::default());
    for _ in 0..CAT_SAMPLES {
        on_owner.record(to_owner.cat_echo(computer, &sid).await, ERROR_PAUSE).await;
        via_other.record(to_other.cat_echo(computer, &sid).await, ERROR_PAUSE).await;
    }
    to_owner.stop_cat_session(computer, &sid).await;
    Ok((on_owner, via_other))
}
