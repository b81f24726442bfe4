//! A rolling upgrade (issue 37, item 18): a 3-node cluster of this build is restarted node by
//! node on a newer one (`computerd-upgrade-probe`: one store version ahead, with one more store
//! command) while bots are created through every node. Every write a node acknowledged is on
//! every node afterwards; the newer command is refused (nothing appended) while any node runs
//! the older build, and once every node runs the newer one it commits and every node applies it.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::cluster::build_bin_with;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i37_18_a_rolling_upgrade_loses_nothing_and_a_newer_command_waits_for_every_node() {
    let newer = build_bin_with("computerd-node", "computerd-upgrade-probe", &["upgrade-probe"]);
    let mut c = TestCluster::start(3).await;

    // The workload: bots created through each node in turn, the acknowledged ones noted.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let attempts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let urls: Vec<String> = (1..=3).map(|id| c.url(id, "/v1/bots")).collect();
    let workload = {
        let (stop, acked, attempts, token) = (stop.clone(), acked.clone(), attempts.clone(), c.token.clone());
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let url = &urls[(n % 3) as usize];
                n += 1;
                attempts.fetch_add(1, Ordering::Relaxed);
                let sent = http.post(url).bearer_auth(&token).json(&json!({"name": format!("w{n}")})).send().await;
                match sent {
                    Ok(r) if r.status() == 201 => {
                        let v: Value = r.json().await.unwrap_or(Value::Null);
                        if let Some(id) = v["id"].as_str() {
                            acked.lock().expect("acked").push(id.to_string());
                        }
                    }
                    // A node being restarted refuses or drops the call: its effect is unknown,
                    // and such bots are not counted.
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
    };
    let acked_now = |acked: &Arc<Mutex<Vec<String>>>| acked.lock().expect("acked").len();
    wait_for("the workload to write", Duration::from_secs(30), || async { (acked_now(&acked) >= 5).then_some(()) })
        .await;

    // (Each node's address, taken now: the cluster is changed below while the closure lives.)
    let probe_urls: std::collections::BTreeMap<u64, String> =
        (1..=3).map(|id| (id, c.url(id, "/v1/admin/upgrade-probe"))).collect();
    let owner = c.token.clone();
    let probe = |node: u64, note: &str| {
        let (url, token, body) = (probe_urls[&node].clone(), owner.clone(), json!({"note": note}));
        async move {
            let r = reqwest::Client::new().post(url).bearer_auth(token).json(&body).send().await.expect("probe");
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for id in [3u64, 2, 1] {
        let before = acked_now(&acked);
        assert!(c.terminate(id).await.is_some(), "node {id} stopped");
        c.nodes.get_mut(&id).expect("node").bin = Some(newer.clone());
        c.spawn(id);
        c.wait_voters(3).await;
        wait_for("writes after the restart", Duration::from_secs(60), || async {
            (acked_now(&acked) >= before + 5).then_some(())
        })
        .await;
        if id != 1 {
            // Some node still runs the older build: the newer command is refused, and nothing
            // is appended (an older node could not read it).
            let (st, v) = probe(id, "too early").await;
            assert_eq!((st, v["error"]["kind"].as_str()), (409, Some("conflict")), "node {id}: {v}");
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("not spoken by every node"), "{msg}");
        }
    }
    // Every node runs the newer build; once each has said so, the command commits.
    let (_, v) = wait_for("the newer command to commit", Duration::from_secs(60), || async {
        let (st, v) = probe(2, "upgraded").await;
        (st == 200).then_some((st, v))
    })
    .await;
    // This build speaks store version 7; the probe build is one ahead.
    assert_eq!(v["storeVersion"], 8, "{v}");
    stop.store(true, Ordering::Relaxed);
    workload.await.expect("workload");
    let acked = acked.lock().expect("acked").clone();
    assert!(
        acked.len() >= 20,
        "the workload ran through the upgrade: {} of {}",
        acked.len(),
        attempts.load(Ordering::Relaxed)
    );
    for id in 1..=3 {
        let notes = wait_for("the command on every node", Duration::from_secs(30), || async {
            let (st, v) = c.call(Method::GET, id, "/v1/admin/upgrade-probe", &c.token, None).await;
            (st == 200 && v["notes"] == json!(["upgraded"])).then_some(v)
        })
        .await;
        assert_eq!(notes["notes"], json!(["upgraded"]), "node {id}: only the committed one");
        let (st, v) = c.call(Method::GET, id, "/v1/bots?limit=1000", &c.token, None).await;
        assert_eq!(st, 200, "{v}");
        let have: std::collections::BTreeSet<&str> =
            v["bots"].as_array().expect("bots").iter().filter_map(|b| b["id"].as_str()).collect();
        let lost: Vec<&String> = acked.iter().filter(|id| !have.contains(id.as_str())).collect();
        assert!(lost.is_empty(), "node {id} lost acknowledged writes: {lost:?}");
    }
}
