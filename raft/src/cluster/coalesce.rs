//! One round serves every caller waiting when it starts: read-index confirmations are coalesced
//! so that a burst of linearizable reads costs one quorum round (and one forwarded call from a
//! follower), not one each.
//!
//! The rule that keeps it linearizable: a caller is answered only by a round that **started
//! after the caller arrived**. A caller arriving while a round is in flight waits for the next
//! one, which starts as soon as the current one ends and serves everyone who queued up behind
//! it. A read index is valid for a read when the leadership confirmation behind it began after
//! the read was asked for; a round begun earlier could miss a write acknowledged in between.
//!
//! Rounds are grouped by a key (the leader asked), so a round stuck on a leader that died does
//! not hold up the callers that moved on to the new one.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// Coalesces calls of one kind into rounds, per key.
pub(super) struct Coalescer<K, T> {
    groups: Mutex<HashMap<K, Group<T>>>,
}

/// The callers of one key waiting for the next round, and whether a round is running.
struct Group<T> {
    running: bool,
    waiting: Vec<oneshot::Sender<T>>,
}

impl<K, T> Default for Coalescer<K, T> {
    fn default() -> Self {
        Coalescer { groups: Mutex::new(HashMap::new()) }
    }
}

impl<K, T> Coalescer<K, T>
where
    K: Hash + Eq + Clone + Send + 'static,
    T: Clone + Send + 'static,
{
    /// Answers with the outcome of a round of `key` that starts after this call. When no round
    /// of `key` runs, one is started now with `round`; else the caller waits for the round after
    /// the running one (started with the `round` of whoever started the running one: every
    /// round of one key must do the same thing). `None` when the round was dropped without an
    /// answer (the runtime is shutting down).
    ///
    /// Rounds run in a task of their own, so a caller that gives up (its deadline, a leader
    /// change) neither cancels the round nor strands the others waiting on it.
    pub(super) async fn join<F, Fut>(self: &Arc<Self>, key: K, round: F) -> Option<T>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            let group = groups.entry(key.clone()).or_insert_with(|| Group { running: false, waiting: Vec::new() });
            group.waiting.push(tx);
            !std::mem::replace(&mut group.running, true)
        };
        if start {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.drive(key, round).await });
        }
        rx.await.ok()
    }

    /// Runs rounds of `key` while callers wait for one; each round takes the callers that were
    /// waiting when it started.
    async fn drive<F, Fut>(self: Arc<Self>, key: K, round: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let batch = {
                let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
                let Some(group) = groups.get_mut(&key) else { return };
                // Callers that gave up before their round began need no answer.
                group.waiting.retain(|tx| !tx.is_closed());
                if group.waiting.is_empty() {
                    groups.remove(&key);
                    return;
                }
                std::mem::take(&mut group.waiting)
            };
            let outcome = round().await;
            for tx in batch {
                let _ = tx.send(outcome.clone());
            }
        }
    }

    /// Keys with a round running or callers waiting (for tests).
    #[cfg(test)]
    fn busy(&self) -> usize {
        self.groups.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Callers of `key` waiting for the next round (for tests).
    #[cfg(test)]
    fn waiting(&self, key: &K) -> usize {
        self.groups.lock().unwrap_or_else(|p| p.into_inner()).get(key).map_or(0, |g| g.waiting.len())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering;

    use super::*;

    /// A round that records that it started (its number, from 1) and waits for a gate.
    struct Rounds {
        started: AtomicU64,
        gates: Mutex<Vec<oneshot::Sender<()>>>,
        started_tx: tokio::sync::mpsc::UnboundedSender<u64>,
    }

    fn rounds() -> (Arc<Rounds>, tokio::sync::mpsc::UnboundedReceiver<u64>) {
        let (started_tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Arc::new(Rounds { started: AtomicU64::new(0), gates: Mutex::new(Vec::new()), started_tx }), rx)
    }

    fn round(r: &Arc<Rounds>) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = u64> + Send>> + Send + 'static {
        let r = Arc::clone(r);
        move || {
            let r = Arc::clone(&r);
            Box::pin(async move {
                let n = r.started.fetch_add(1, Ordering::SeqCst) + 1;
                let (tx, rx) = oneshot::channel();
                r.gates.lock().unwrap().push(tx);
                let _ = r.started_tx.send(n);
                let _ = rx.await;
                n
            })
        }
    }

    fn open_gate(r: &Rounds) {
        open_gate_at(r, 0);
    }

    /// A caller joining a round of `key` in a task of its own.
    fn spawn_join(c: &Arc<Coalescer<u8, u64>>, r: &Arc<Rounds>, key: u8) -> tokio::task::JoinHandle<Option<u64>> {
        let (c, f) = (Arc::clone(c), round(r));
        tokio::spawn(async move { c.join(key, f).await })
    }

    #[tokio::test]
    async fn a_caller_arriving_during_a_round_is_served_by_a_later_round() {
        let c: Arc<Coalescer<u8, u64>> = Arc::default();
        let (r, mut started) = rounds();
        let first = spawn_join(&c, &r, 1);
        assert_eq!(started.recv().await, Some(1));
        // Round 1 is in flight: these arrive after it began and must not take its answer.
        let late: Vec<_> = (0..5).map(|_| spawn_join(&c, &r, 1)).collect();
        while c.waiting(&1) < 5 {
            tokio::task::yield_now().await;
        }
        open_gate(&r);
        assert_eq!(first.await.unwrap(), Some(1));
        // One round serves all five late callers.
        assert_eq!(started.recv().await, Some(2));
        open_gate(&r);
        for l in late {
            assert_eq!(l.await.unwrap(), Some(2));
        }
        assert_eq!(r.started.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn keys_do_not_wait_for_each_other_and_groups_are_forgotten() {
        let c: Arc<Coalescer<u8, u64>> = Arc::default();
        let (r, mut started) = rounds();
        let stuck = spawn_join(&c, &r, 1);
        assert_eq!(started.recv().await, Some(1));
        // Key 1's round never ends (a dead leader): key 2 still gets its own round.
        let other = spawn_join(&c, &r, 2);
        assert_eq!(started.recv().await, Some(2));
        open_gate_at(&r, 1);
        assert_eq!(other.await.unwrap(), Some(2));
        open_gate(&r);
        assert_eq!(stuck.await.unwrap(), Some(1));
        // Wait until both drivers saw nobody waiting and dropped their groups.
        while c.busy() > 0 {
            tokio::task::yield_now().await;
        }
    }

    fn open_gate_at(r: &Rounds, i: usize) {
        let gate = r.gates.lock().unwrap().remove(i);
        gate.send(()).unwrap();
    }

    #[tokio::test]
    async fn a_caller_that_gave_up_does_not_strand_the_others() {
        let c: Arc<Coalescer<u8, u64>> = Arc::default();
        let (r, mut started) = rounds();
        let gave_up = spawn_join(&c, &r, 1);
        assert_eq!(started.recv().await, Some(1));
        gave_up.abort();
        let _ = gave_up.await;
        let waiter = spawn_join(&c, &r, 1);
        while c.waiting(&1) < 1 {
            tokio::task::yield_now().await;
        }
        open_gate(&r);
        assert_eq!(started.recv().await, Some(2));
        open_gate(&r);
        assert_eq!(waiter.await.unwrap(), Some(2));
    }
}
