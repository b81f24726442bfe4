//! The egress watch: on the leader, one follower per Computer whose sandbox sits behind egress
//! enforcement that tells of the connections it refuses (a docker sandbox's gateway, through
//! its log). A follower gathers the refusals of a short window ([`WINDOW`]) and commits them as
//! one `EgressDenied` report: their count and a sample. So a sandbox that hammers a denied host
//! costs the store one event per window, not one per connection.
//!
//! A follower starts from the Computer's last recorded refusal (`egress_denied_through`), so a
//! new leader resumes where the old one's reports ended; the store drops a report with nothing
//! newer. Refusals in the same millisecond as the last recorded one are not reported again.
//! Each pass (every [`PASS_EVERY`]) starts followers for Computers that gained a policy, and
//! ends those of Computers that lost it, were deleted or stopped; a follower whose stream ended
//! (its gateway restarted) starts again on the next pass. A node that stops leading ends all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use computerd_proto::egress::Denied;
use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::MAX_DENIED_SAMPLE;
use computerd_raft::sm::Request;
use computerd_raft::sm::Source;
use futures::StreamExt;
use tokio::sync::watch;

use crate::factory::ProviderFactory;
use crate::now_ms;
use crate::provider::Provider;

/// How long a follower gathers refusals after the first before it reports them.
pub const WINDOW: Duration = Duration::from_secs(2);
/// How often the leader looks for Computers to follow.
pub const PASS_EVERY: Duration = Duration::from_secs(2);

/// A follower's task, ended when dropped.
struct Follower(tokio::task::JoinHandle<()>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the watch until `stop`.
pub async fn run_egress_watch(cluster: Cluster, providers: ProviderFactory, mut stop: watch::Receiver<bool>) {
    let mut followers: HashMap<String, Follower> = HashMap::new();
    while crate::tick(PASS_EVERY, &mut stop).await {
        if cluster.view().leader_id == Some(cluster.id()) {
            pass(&cluster, &providers, &mut followers);
        } else {
            followers.clear();
        }
    }
}

/// One pass: a follower for each Computer with a policy and a live sandbox, and none for others.
fn pass(cluster: &Cluster, providers: &ProviderFactory, followers: &mut HashMap<String, Follower>) {
    let wanted = cluster.state().read(|s| {
        let mut wanted = HashMap::new();
        for c in s.computers.values() {
            let Source::Provider { provider, .. } = &c.source else { continue };
            let live = matches!(c.state, ComputerState::Running | ComputerState::Paused | ComputerState::Starting);
            if c.egress.is_none() || !live || c.sandbox.is_none() {
                continue;
            }
            if let Some(p) = s.providers.get(provider) {
                wanted.insert(c.id.clone(), (p.clone(), c.egress_denied_through));
            }
        }
        wanted
    });
    followers.retain(|id, f| wanted.contains_key(id) && !f.0.is_finished());
    for (id, (record, through)) in wanted {
        if followers.contains_key(&id) {
            continue;
        }
        let (adapter, _) = providers.build(&record);
        let task = tokio::spawn(follow(cluster.clone(), adapter, id.clone(), through));
        followers.insert(id, Follower(task));
    }
}

/// Follows one Computer's refusals after `through` until its stream ends.
async fn follow(cluster: Cluster, adapter: Arc<dyn Provider>, computer_id: String, mut through: u64) {
    let denials = match adapter.egress_denials(&computer_id, through).await {
        Ok(Some(d)) => d,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(computer_id = %computer_id, error = %e, "cannot follow the egress enforcement");
            return;
        }
    };
    let mut denials = denials.fuse();
    loop {
        let Some(report) = gather(&mut denials, through).await else { return };
        let ended = report.ended;
        through = report.through;
        let cmd = Command::EgressDenied {
            computer_id: computer_id.clone(),
            count: report.count,
            sample: report.sample,
            through_ms: report.through,
            at_ms: now_ms(),
        };
        match cluster.propose(Request::new(cmd)).await {
            Ok(computerd_raft::sm::Response::Rejected(r)) => {
                tracing::debug!(computer_id = %computer_id, reason = ?r, "the store refused a denial report")
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(computer_id = %computer_id, error = %e, "cannot record a denial report"),
        }
        if ended {
            return;
        }
    }
}

/// Refusals gathered for one report.
#[derive(Debug, PartialEq)]
struct Report {
    count: u64,
    sample: Vec<Denied>,
    through: u64,
    /// The stream ended while gathering.
    ended: bool,
}

/// Waits for the first refusal after `after`, then gathers those of the next [`WINDOW`]: their
/// count, a sample (distinct hosts and ports first), and the latest time. `None`: the stream
/// ended with nothing new.
async fn gather<S: futures::Stream<Item = Denied> + Unpin + futures::stream::FusedStream>(
    denials: &mut S,
    after: u64,
) -> Option<Report> {
    let first = loop {
        let d = denials.next().await?;
        if d.at > after {
            break d;
        }
    };
    let mut r = Report { count: 0, sample: Vec::new(), through: after, ended: false };
    let mut extra = Vec::new();
    let mut add = |r: &mut Report, d: Denied| {
        r.count += 1;
        r.through = r.through.max(d.at);
        // Distinct hosts and ports first; repeats kept aside, only as many as could fill it.
        if r.sample.iter().any(|s| s.host == d.host && s.port == d.port) {
            if extra.len() < MAX_DENIED_SAMPLE {
                extra.push(d);
            }
        } else if r.sample.len() < MAX_DENIED_SAMPLE {
            r.sample.push(d);
        }
    };
    add(&mut r, first);
    let deadline = tokio::time::Instant::now() + WINDOW;
    loop {
        match tokio::time::timeout_at(deadline, denials.next()).await {
            Ok(Some(d)) if d.at > after => add(&mut r, d),
            Ok(Some(_)) => {}
            Ok(None) => {
                r.ended = true;
                break;
            }
            Err(_) => break,
        }
    }
    // Room left in the sample takes repeats, in order.
    let room = MAX_DENIED_SAMPLE.saturating_sub(r.sample.len());
    r.sample.extend(extra.into_iter().take(room));
    r.sample.sort_by_key(|d| d.at);
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(host: &str, port: u16, at: u64) -> Denied {
        Denied::new(host, port, at)
    }

    /// Issue 41, item 3: one report per window, its count of all, a sample that prefers
    /// distinct hosts, and nothing at or before the last recorded time.
    #[tokio::test(start_paused = true)]
    async fn i41_refusals_of_a_window_make_one_report() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut rx = rx.fuse();
        tx.unbounded_send(d("old.test", 80, 5)).expect("send");
        for i in 0..20 {
            tx.unbounded_send(d("flood.test", 80, 10 + i)).expect("send");
        }
        tx.unbounded_send(d("other.test", 443, 40)).expect("send");
        let r = gather(&mut rx, 5).await.expect("a report");
        assert_eq!((r.count, r.through, r.ended), (21, 40, false));
        assert_eq!(r.sample.len(), MAX_DENIED_SAMPLE);
        assert!(r.sample.iter().any(|s| s.host == "other.test"), "a distinct host is never crowded out: {r:?}");
        assert!(r.sample.iter().all(|s| s.host != "old.test"));
        assert!(r.sample.windows(2).all(|w| w[0].at <= w[1].at), "in time order");

        // Within the window, later refusals join; after it, they make the next report.
        tx.unbounded_send(d("a.test", 1, 50)).expect("send");
        let next = tokio::spawn(async move {
            let r = gather(&mut rx, 40).await;
            (r, rx)
        });
        tokio::time::sleep(WINDOW / 2).await;
        tx.unbounded_send(d("b.test", 2, 60)).expect("send");
        let (r, mut rx) = next.await.expect("joined");
        let r = r.expect("a report");
        assert_eq!((r.count, r.through), (2, 60));
        drop(tx);
        assert_eq!(gather(&mut rx, 60).await, None, "the stream ended with nothing new");
    }
}
