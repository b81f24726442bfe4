//! Several nodes: forming, forwarding, linearizable reads, leader loss, catch-up, snapshots,
//! membership changes, and random kill/restart under a stream of writes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::wait_for;
use rand::Rng;
use reqwest::Method;

/// Three nodes form one cluster of three voters; a write sent to a follower is forwarded to the
/// leader, and a read on another follower sees it at once (quorum-confirmed read).
#[tokio::test]
async fn t10_three_nodes_form_and_forward() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    for id in 1..=3 {
        let h = c.health(id).await.expect("health");
        assert_eq!(h["members"].as_array().expect("members").len(), 3);
        assert_eq!(h["leaderId"], leader);
    }
    for n in 0..20 {
        let (s, bot) = c.create_bot(followers[0], &format!("b{n}")).await.expect("create");
        assert_eq!(s, 201, "{bot}");
        let id = bot["id"].as_str().expect("id").to_string();
        // Read right away on the other follower: it must already see the write.
        let seen = c.bot_ids(followers[1]).await.expect("list");
        assert!(seen.contains(&id), "follower {} missed an acknowledged write", followers[1]);
    }
}

/// SIGKILL of the leader: the others elect a new leader and writes go on; the killed node
/// restarts from its data dir and catches up.
#[tokio::test]
async fn t20_leader_kill_then_catch_up() {
    let mut c = TestCluster::start(3).await;
    let old = c.leader().await;
    for n in 0..10 {
        assert_eq!(c.create_bot(old, &format!("before{n}")).await.expect("create").0, 201);
    }
    c.kill(old);
    let new = c.leader().await;
    assert_ne!(new, old);
    let mut acked = Vec::new();
    for n in 0..10 {
        let (s, bot) = c.create_bot(new, &format!("after{n}")).await.expect("create");
        assert_eq!(s, 201);
        acked.push(bot["id"].as_str().expect("id").to_string());
    }
    c.spawn(old);
    c.wait_voters(3).await;
    let target = c.health(new).await.expect("health")["lastApplied"].as_u64().expect("applied");
    c.wait_applied(old, target).await;
    let seen = c.bot_ids(old).await.expect("list");
    assert_eq!(seen.len(), 20);
    assert!(acked.iter().all(|a| seen.contains(a)));
}

/// A node whose data dir is wiped rejoins and catches up through a snapshot, since the log it
/// would need was purged.
#[tokio::test]
async fn t30_wiped_node_rejoins_through_snapshot() {
    let mut c = TestCluster::start_with(3, &["--snapshot-every", "20", "--keep-logs", "5"]).await;
    let victim = {
        let leader = c.leader().await;
        (1..=3).find(|i| *i != leader && *i != 1).unwrap_or(if leader == 2 { 3 } else { 2 })
    };
    c.kill(victim);
    let writer = c.alive()[0];
    for n in 0..100 {
        assert_eq!(c.create_bot(writer, &format!("w{n}")).await.expect("create").0, 201);
    }
    let leader = c.leader().await;
    let purged = wait_for("the leader to purge its log", Duration::from_secs(30), || async {
        c.health(leader).await?["purgedIndex"].as_u64().filter(|p| *p > 20)
    })
    .await;
    c.wipe(victim);
    // A member's id enrols again only with a single-use join secret minted for it (the reusable
    // secret is refused for a live member's id: issue 36).
    let (s, v) = c
        .call(
            Method::POST,
            leader,
            "/v1/cluster/join-tokens",
            &c.token,
            Some(serde_json::json!({"ttlSecs": 300, "nodeId": victim})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let secret = v["joinToken"].as_str().expect("a join secret").to_string();
    c.spawn_with(victim, &["--join-token", &secret]); // joins again through node 1 with an empty data dir
    c.wait_voters(3).await;
    let target = c.health(leader).await.expect("health")["lastApplied"].as_u64().expect("applied");
    c.wait_applied(victim, target).await;
    let h = c.health(victim).await.expect("health");
    let snap = h["snapshotIndex"].as_u64().expect("the rejoined node installed a snapshot");
    assert!(snap >= purged, "snapshot {snap} does not cover the purged log {purged}");
    assert_eq!(c.bot_ids(victim).await.expect("list").len(), 100);
    // A node whose log was purged restarts from its snapshot file plus the log after it.
    assert_eq!(c.terminate(leader).await, Some(0));
    c.spawn(leader);
    c.wait_voters(3).await;
    let target = c.health(victim).await.expect("health")["lastApplied"].as_u64().expect("applied");
    c.wait_applied(leader, target).await;
    assert_eq!(c.bot_ids(leader).await.expect("list").len(), 100);
}

/// A follower whose snapshot file is damaged (one flipped byte) refuses to start, naming the
/// file and the checksum, and changes nothing; restarted with `--reinstall-snapshot` it moves the
/// file aside, rebuilds its store on a member's snapshot before Raft starts (its vote and its log
/// after that snapshot kept: nothing it acknowledged goes backwards) and catches up; then it
/// restarts without the flag. No node panics on the way (the leader once did, at a follower
/// whose log reverted).
#[tokio::test]
async fn t35_damaged_snapshot_refuses_then_reinstall_takes_a_members() {
    let mut c = TestCluster::start_with(3, &["--snapshot-every", "20", "--keep-logs", "5"]).await;
    let leader = c.leader().await;
    // Node 1 bootstraps (no --join): the victim is another follower.
    let victim = (2..=3).find(|i| *i != leader).expect("a follower that joins");
    for n in 0..60 {
        assert_eq!(c.create_bot(leader, &format!("a{n}")).await.expect("create").0, 201);
    }
    let snaps = c.nodes[&victim].data.join("store").join("snapshots");
    wait_for("the victim to snapshot and purge", Duration::from_secs(30), || async {
        let h = c.health(victim).await?;
        h["purgedIndex"].as_u64().filter(|p| *p > 20)?;
        h["snapshotIndex"].as_u64().filter(|s| *s > 20)
    })
    .await;
    assert_eq!(c.terminate(victim).await, Some(0));
    let file = std::fs::read_dir(&snaps)
        .expect("snapshot dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("snapshot-")))
        .expect("a snapshot file");
    let mut bytes = std::fs::read(&file).expect("read");
    let at = bytes.len() - 3;
    bytes[at] ^= 0x20;
    std::fs::write(&file, &bytes).expect("flip a byte");

    let (code, stderr) = c.run_to_exit(victim, &[]);
    assert_ne!(code, 0, "a damaged snapshot must stop the start");
    assert!(stderr.contains(&file.display().to_string()) && stderr.contains("checksum"), "{stderr}");
    assert!(stderr.contains("--reinstall-snapshot"), "the refusal names the way out: {stderr}");
    assert_eq!(std::fs::read(&file).expect("the file is still there"), bytes, "the refusal changed the file");

    for n in 0..30 {
        assert_eq!(c.create_bot(leader, &format!("b{n}")).await.expect("create").0, 201);
    }
    c.spawn_with(victim, &["--reinstall-snapshot"]);
    c.wait_voters(3).await;
    let target = c.health(leader).await.expect("health")["lastApplied"].as_u64().expect("applied");
    c.wait_applied(victim, target).await;
    assert_eq!(c.bot_ids(victim).await.expect("list").len(), 90);
    let name = file.file_name().expect("name").to_string_lossy().into_owned();
    assert_eq!(std::fs::read(snaps.join(format!("discarded-{name}"))).expect("kept aside"), bytes);

    // An ordinary restart after the reinstall: the snapshot it took verifies.
    assert_eq!(c.terminate(victim).await, Some(0));
    c.spawn(victim);
    c.wait_voters(3).await;
    for n in 0..30 {
        assert_eq!(c.create_bot(leader, &format!("c{n}")).await.expect("create").0, 201);
    }
    let target = c.health(leader).await.expect("health")["lastApplied"].as_u64().expect("applied");
    for id in 1..=3 {
        c.wait_applied(id, target).await;
        assert_eq!(c.bot_ids(id).await.expect("list").len(), 120, "node {id}");
    }
    assert_eq!(c.leader().await, leader, "the leader kept its place");
    assert_no_panic(&c);
}

/// No node's log shows a panic.
fn assert_no_panic(c: &TestCluster) {
    for id in c.nodes.keys() {
        let log = c.log_tail(*id, usize::MAX);
        assert!(!log.contains("panicked at"), "node {id} panicked:\n{}", c.log_tail(*id, 60));
    }
}

/// Snapshot builds race installs under load: with a snapshot every 10 entries and 2 kept, a
/// follower is killed (-9) in turn, the leader writes on past its log, and the follower restarts
/// into a leader's snapshot install while it replays and builds its own, with writes still
/// coming. After every round, and after every node is restarted once more at the end, each node
/// starts (none finds a snapshot file missing or a gap behind its log) and all agree on the
/// state.
#[tokio::test]
async fn t36_snapshot_builds_race_installs_under_load_across_restarts() {
    let mut c = TestCluster::start_with(3, &["--snapshot-every", "10", "--keep-logs", "2"]).await;
    let mut n = 0u32;
    for round in 0..4u64 {
        let leader = c.leader().await;
        let followers: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
        let victim = followers[(round % 2) as usize];
        c.kill(victim);
        for _ in 0..40 {
            assert_eq!(c.create_bot(leader, &format!("r{n}")).await.expect("create").0, 201);
            n += 1;
        }
        c.spawn(victim);
        // Writes go on while the victim replays, builds and takes the leader's snapshot.
        for _ in 0..30 {
            let (s, body) = c.create_bot(leader, &format!("r{n}")).await.expect("create");
            assert_eq!(s, 201, "round {round}: {body}");
            n += 1;
        }
        c.wait_voters(3).await;
        let target = c.health(leader).await.expect("health")["lastApplied"].as_u64().expect("applied");
        c.wait_applied(victim, target).await;
        assert_eq!(c.bot_ids(victim).await.expect("list").len(), n as usize, "round {round}");
    }
    for id in 1..=3 {
        assert_eq!(c.terminate(id).await, Some(0), "node {id} stops cleanly");
        c.spawn(id);
        c.wait_voters(3).await;
    }
    let leader = c.leader().await;
    assert_eq!(c.create_bot(leader, "last").await.expect("create").0, 201);
    let target = c.health(leader).await.expect("health")["lastApplied"].as_u64().expect("applied");
    let mut seen = Vec::new();
    for id in 1..=3 {
        c.wait_applied(id, target).await;
        let mut ids = c.bot_ids(id).await.expect("list");
        ids.sort();
        assert_eq!(ids.len(), n as usize + 1, "node {id}");
        seen.push(ids);
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "the nodes disagree on the bots");
    assert_no_panic(&c);
}

/// A node can be removed from the membership; the rest go on.
#[tokio::test]
async fn t40_remove_a_node() {
    let mut c = TestCluster::start(3).await;
    let r = c.req(Method::DELETE, 1, "/v1/cluster/nodes/3", &c.token).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 204);
    c.kill(3);
    c.nodes.remove(&3);
    c.wait_voters(2).await;
    assert_eq!(c.create_bot(2, "after-removal").await.expect("create").0, 201);
    let r = c.req(Method::DELETE, 1, "/v1/cluster/nodes/42", &c.token).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 404);
}

/// Five rounds of SIGKILL of a random node (the leader or not) and restart, under a stream of
/// writes through random nodes: no acknowledged (2xx) write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_random_kill_restart_loses_no_acknowledged_write() {
    let mut c = TestCluster::start(3).await;
    let urls: Vec<String> = (1..=3).map(|i| c.url(i, "/v1/bots")).collect();
    let (http, token) = (c.http.clone(), c.token.clone());
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (http, token, urls, acked, stop) = (http.clone(), token.clone(), urls.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let url = &urls[(n as usize + w) % urls.len()];
                let r = http
                    .post(url)
                    .bearer_auth(&token)
                    .json(&serde_json::json!({"name": format!("w{w}-{n}")}))
                    .timeout(Duration::from_secs(15))
                    .send()
                    .await;
                if let Ok(r) = r
                    && r.status().as_u16() == 201
                    && let Ok(v) = r.json::<serde_json::Value>().await
                    && let Some(id) = v["id"].as_str()
                {
                    acked.lock().expect("lock").push(id.to_string());
                }
            }
        }));
    }
    for round in 0..5 {
        let before = acked.lock().expect("lock").len();
        // Let some writes through in this configuration first.
        wait_for("writes to progress", Duration::from_secs(30), || {
            let n = acked.lock().expect("lock").len();
            async move { (n >= before + 20).then_some(()) }
        })
        .await;
        let leader = c.leader().await;
        let victim = if round % 2 == 0 { leader } else { rand::rng().random_range(1..=3) };
        c.kill(victim);
        let after_kill = acked.lock().expect("lock").len();
        wait_for("writes to resume after the kill", Duration::from_secs(30), || {
            let n = acked.lock().expect("lock").len();
            async move { (n >= after_kill + 10).then_some(()) }
        })
        .await;
        c.spawn(victim);
        c.wait_voters(3).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let acked: BTreeSet<String> = acked.lock().expect("lock").iter().cloned().collect();
    assert!(acked.len() >= 100, "only {} writes acknowledged", acked.len());
    for id in 1..=3 {
        let seen: BTreeSet<String> = c.bot_ids(id).await.expect("list").into_iter().collect();
        let lost: Vec<&String> = acked.difference(&seen).collect();
        assert!(lost.is_empty(), "node {id} lost {} acknowledged writes: {:?}", lost.len(), &lost[..lost.len().min(5)]);
    }
}

/// A data dir of one cluster, started with `--join` to a member of another cluster, stops the
/// node with a clear message; neither cluster changes.
#[tokio::test]
async fn t60_data_dir_of_another_cluster_is_refused() {
    let a = TestCluster::start(1).await;
    let mut b = TestCluster::start(1).await;
    assert_eq!(b.terminate(1).await, Some(0));
    let (code, err) = b.run_to_exit(1, &["--join", &a.nodes[&1].grpc]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("belongs to cluster"), "{err}");
    let h = a.health(1).await.expect("health");
    assert_eq!(h["members"].as_array().expect("members").len(), 1, "cluster a did not change");
}
