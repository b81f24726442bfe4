//! The cluster's mutual TLS, against real node processes: a caller without a node certificate,
//! or with one of another CA, is refused on every node-to-node method and changes nothing; a
//! node's certificate cannot speak for another node; a removed node's certificate is refused
//! and its open connection closed; wrong and used join secrets are refused; certificates renew
//! themselves under load.

use std::time::Duration;
use std::time::Instant;

use computerd_proto::cluster::Empty;
use computerd_proto::cluster::JoinRequest;
use computerd_proto::cluster::McpRelay;
use computerd_proto::cluster::RouteChunk;
use computerd_proto::cluster::RouteHead;
use computerd_proto::cluster::cluster_service_client::ClusterServiceClient;
use computerd_proto::cluster::routing_client::RoutingClient;
use computerd_raft::TypeConfig;
use computerd_raft::network::encode;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_tests::TestCluster;
use computerd_tests::tls;
use computerd_tests::wait_for;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::VoteRequest;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use tonic::transport::Channel;

type Vote = computerd_raft::typ::Vote;

/// Calls every node-to-node method once on `channel`; answers each method's result.
async fn every_method(channel: Channel, term: u64, as_node: u64) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    let mut cluster = ClusterServiceClient::new(channel.clone());
    let mut routing = RoutingClient::new(channel);
    let propose = Request::new(Command::SetJoinSecret { by: "tok_x".into(), hash: "evil".into() });
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, as_node),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let vote = VoteRequest::<TypeConfig>::new(Vote::new(term, as_node), None);
    let join = JoinRequest {
        node_id: as_node,
        http_addr: "x:1".into(),
        grpc_addr: "x:2".into(),
        check_only: false,
        fresh: false,
    };
    let head = files_head();
    vec![
        ("Propose", cluster.propose(encode(&propose).expect("encode")).await.map(drop)),
        ("Join", cluster.join(join).await.map(drop)),
        ("AppendEntries", cluster.append_entries(encode(&append).expect("encode")).await.map(drop)),
        ("Vote", cluster.vote(encode(&vote).expect("encode")).await.map(drop)),
        ("ReadIndex", cluster.read_index(Empty {}).await.map(drop)),
        ("Forward", routing.forward(futures::stream::iter([head])).await.map(drop)),
        (
            "RelayMcp",
            routing
                .relay_mcp(McpRelay { computer_id: "cmp_x".into(), json: "{}".into(), token_id: String::new() })
                .await
                .map(drop),
        ),
    ]
}

/// The head of a routed file read on a Computer that does not exist.
fn files_head() -> RouteChunk {
    RouteChunk {
        head: Some(RouteHead {
            method: "GET".into(),
            path: "/v1/computers/cmp_x/files?path=a".into(),
            ..Default::default()
        }),
        body: vec![],
    }
}

/// What a refusal must not have changed: term, applied index, members.
async fn fingerprint(c: &TestCluster, id: u64) -> Value {
    let h = c.health(id).await.expect("health");
    json!({"term": h["term"], "lastApplied": h["lastApplied"], "members": h["members"]})
}

/// No certificate: `UNAUTHENTICATED` on every method. A certificate of another CA: the handshake
/// is refused. Neither changes the term, the log or the members.
#[tokio::test]
async fn t10_strangers_are_refused_on_every_method() {
    let c = TestCluster::start(1).await;
    let before = fingerprint(&c, 1).await;
    let term = before["term"].as_u64().expect("term") + 10;
    for (what, result) in every_method(tls::channel_with(&c, 1, None), term, 9).await {
        let s = result.expect_err(what);
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{what} without a certificate: {s:?}");
    }
    let stranger = tls::stranger(&c.dir.path().join("stranger"), 9);
    for (what, result) in every_method(tls::channel_with(&c, 1, Some(stranger)), term, 9).await {
        let s = result.expect_err(what);
        let text = computerd_raft::tls::status_chain(&s);
        assert_ne!(s.code(), tonic::Code::Ok, "{what}");
        assert!(!text.contains("cannot decode"), "{what} reached the service: {text}");
    }
    // A plaintext client (as curl --http2-prior-knowledge would be) gets no gRPC answer at all.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", c.nodes[&1].grpc)).expect("uri");
    let mut client = ClusterServiceClient::new(plain.connect_lazy());
    assert!(client.read_index(Empty {}).await.is_err(), "plaintext is refused");
    assert_eq!(fingerprint(&c, 1).await, before, "nothing changed");
}

/// Node 2's certificate cannot vote or append as node 3, nor join as node 9: each is refused
/// before it reaches Raft, and the term does not move.
#[tokio::test]
async fn t20_a_node_certificate_cannot_speak_for_another() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let (speaker, claimed) = if leader == 2 { (3, 1) } else { (2, if leader == 3 { 1 } else { 3 }) };
    let before = fingerprint(&c, leader).await;
    let term = before["term"].as_u64().expect("term") + 10;
    let results = every_method(tls::channel_as(&c, speaker, leader), term, claimed).await;
    for (what, result) in results.into_iter().filter(|(w, _)| ["AppendEntries", "Vote"].contains(w)) {
        let s = result.expect_err(what);
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{what} as node {claimed}: {s:?}");
    }
    let after = fingerprint(&c, leader).await;
    assert_eq!(after["term"], before["term"], "no vote moved the term");
    assert_eq!(c.leader().await, leader);
}

/// `DELETE /v1/cluster/nodes/3`: node 3's certificate is refused at the next handshake, and a
/// connection it had open is closed within 5 s.
#[tokio::test]
async fn t30_a_removed_node_is_refused_and_cut_off() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let (removed, via) = if leader == 3 { (2, 1) } else { (3, if leader == 1 { 1 } else { leader }) };
    let open = tls::channel_as(&c, removed, via);
    let mut client = ClusterServiceClient::new(open);
    client.read_index(Empty {}).await.expect("a member's call before the removal");
    c.kill(removed);
    let (s, v) = c.call(Method::DELETE, via, &format!("/v1/cluster/nodes/{removed}"), &c.token, None).await;
    assert_eq!(s, 204, "{v}");
    let cut = Instant::now();
    wait_for("the removed node's open connection to close", Duration::from_secs(5), || {
        let mut client = client.clone();
        async move { client.read_index(Empty {}).await.is_err().then_some(()) }
    })
    .await;
    eprintln!("the removed node's connection failed {:?} after the removal", cut.elapsed());
    let mut fresh = ClusterServiceClient::new(tls::channel_as(&c, removed, via));
    fresh.read_index(Empty {}).await.expect_err("a new handshake is refused");
    let log = c.log_tail(via, 400);
    assert!(log.contains("a revoked node certificate was refused"), "the node says why: {log}");
}

/// A single-use join secret lets one node in; the same secret again, and a wrong secret, stop
/// the joining node with a clear message and add no member.
#[tokio::test]
async fn t40_wrong_or_used_join_secrets_are_refused() {
    let mut c = TestCluster::start(1).await;
    let (s, v) = c.call(Method::POST, 1, "/v1/cluster/join-tokens", &c.token, Some(json!({"ttlSecs": 60}))).await;
    assert_eq!((s, v["singleUse"].clone()), (201, json!(true)), "{v}");
    let once = v["joinToken"].as_str().expect("token").to_string();
    let grpc = c.nodes[&1].grpc.clone();
    c.add_node(2, Some(grpc.clone()));
    c.add_node(3, Some(grpc.clone()));
    c.add_node(4, Some(grpc.clone()));
    // Node 2 joins with it (run by hand: the harness passes the reusable secret).
    let n2 = &c.nodes[&2];
    let mut two = std::process::Command::new(computerd_tests::computerd_bin())
        .args(["serve", "--node-id", "2", "--data"])
        .arg(&n2.data)
        .args(["--http", &n2.http, "--grpc", &n2.grpc, "--peer-source-ip", &n2.ip.to_string(), "--join", &grpc])
        .args(["--join-token", &once])
        .stderr(std::fs::File::create(&n2.log).expect("log"))
        .spawn()
        .expect("node 2");
    c.wait_voters(2).await;
    let (code, err) = c.run_to_exit(3, &["--join", &grpc, "--join-token", &once]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refused this node's join"), "a used secret: {err}");
    let wrong = format!("{}.{}", &once[..once.rfind('.').expect("dots")], "0".repeat(64));
    let (code, err) = c.run_to_exit(4, &["--join", &grpc, "--join-token", &wrong]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refused this node's join"), "a wrong secret: {err}");
    let h = c.health(1).await.expect("health");
    assert_eq!(h["members"].as_array().map(Vec::len), Some(2), "only node 2 joined: {h}");
    let _ = two.kill();
    let _ = two.wait();
}

/// Certificates valid for 8 s renew themselves at half-life: under a stream of writes for 20 s
/// (past two lifetimes), every write is acknowledged and every node's certificate was renewed.
#[tokio::test]
async fn t50_certificates_renew_under_load() {
    let c = TestCluster::start_with(3, &["--cert-validity-secs", "8"]).await;
    // Every write below is a new bot: the caps go up so the run cannot meet them.
    c.raise_limits().await;
    let first: Vec<u64> = (1..=3).map(|n| tls::pki_of(&c, n).not_after()).collect();
    let started = Instant::now();
    let (mut acked, mut failed) = (0, Vec::new());
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(20) {
        i += 1;
        let node = 1 + (i % 3);
        match c.create_bot(node, &format!("renew-{i}")).await {
            Ok((201, _)) => acked += 1,
            other => failed.push(format!("{node}: {other:?}")),
        }
    }
    assert!(failed.is_empty(), "writes failed while certificates renewed: {failed:?}");
    let now: Vec<u64> = (1..=3).map(|n| tls::pki_of(&c, n).not_after()).collect();
    for n in 0..3 {
        assert!(now[n] >= first[n] + 10, "node {} renewed: {} -> {}", n + 1, first[n], now[n]);
    }
    let h = c.health(1).await.expect("health");
    assert_eq!(h["members"].as_array().map(Vec::len), Some(3));
    eprintln!("{acked} writes acknowledged while certificates renewed; not_after {first:?} -> {now:?}");
}

/// The cluster's reusable join secret, as the first node wrote it.
fn join_secret(c: &TestCluster) -> computerd_raft::tls::JoinSecret {
    let text = std::fs::read_to_string(c.nodes[&1].data.join("join.token")).expect("node 1's join secret");
    computerd_raft::tls::JoinSecret::parse(&text).expect("a join secret")
}

/// Enrols as `node_id` with `secret` through node `via`, without a certificate (as a joining
/// node does); answers the certificates (installed in the test's dir) or the refusal.
async fn enrol(
    c: &TestCluster,
    via: u64,
    node_id: u64,
    secret: &str,
) -> Result<std::sync::Arc<computerd_raft::tls::Pki>, tonic::Status> {
    let csr = computerd_raft::tls::Csr::new().expect("a CSR");
    let mut client = ClusterServiceClient::new(tls::channel_with(c, via, None));
    let req = computerd_proto::cluster::EnrollRequest { node_id, secret: secret.to_string(), csr_pem: csr.pem.clone() };
    let reply = client.enroll(req).await?.into_inner();
    let dir = c.dir.path().join(format!("enrolled-{node_id}-{}", rand::random::<u32>()));
    let pki = computerd_raft::tls::Pki::install(
        &dir,
        node_id,
        &reply.ca_pem,
        &reply.cert_pem,
        &csr,
        computerd_raft::tls::VALIDITY,
    )
    .expect("the certificate enrolling answered");
    Ok(std::sync::Arc::new(pki))
}

/// A node process that is killed when the test ends, however it ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 36, item 2: with the reusable join secret, an enrolment as a live member's id (node 1,
/// the voter holding the CA's key) is refused with `PERMISSION_DENIED`, and commits nothing; the
/// same secret still enrols a new id, and a single-use secret minted for node 1's id lets node 1
/// enrol again (a member whose data dir was lost) while it refuses any other id.
#[tokio::test]
async fn i36_2_an_enrolment_as_a_members_id_is_refused() {
    let c = TestCluster::start(1).await;
    let secret = join_secret(&c);
    let before = fingerprint(&c, 1).await;
    let s = enrol(&c, 1, 1, &secret.secret).await.expect_err("an enrolment as node 1");
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("member"), "the refusal says why: {s:?}");
    assert_eq!(fingerprint(&c, 1).await, before, "the refusal wrote nothing");
    // The secret is right: a new id enrols with it.
    enrol(&c, 1, 7, &secret.secret).await.expect("a new node enrols");
    // A single-use secret for node 1 only: node 2 cannot use it, node 1 can, once.
    let (s, v) =
        c.call(Method::POST, 1, "/v1/cluster/join-tokens", &c.token, Some(json!({"ttlSecs": 60, "nodeId": 1}))).await;
    assert_eq!(s, 201, "{v}");
    let for_one = computerd_raft::tls::JoinSecret::parse(v["joinToken"].as_str().expect("token")).expect("secret");
    let s = enrol(&c, 1, 2, &for_one.secret).await.expect_err("node 2 with node 1's secret");
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    enrol(&c, 1, 1, &for_one.secret).await.expect("node 1 enrols again with its own secret");
    let s = enrol(&c, 1, 1, &for_one.secret).await.expect_err("the single-use secret again");
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
}

/// Issue 36, item 2: a certificate of a node that enrolled but never joined cannot remove a
/// voter (`Leave`), propose a command, fetch the CA's key, ask for a read index or make a
/// routed call (an MCP relay, a forward, a blob fetch, a catch-up): each is `PERMISSION_DENIED`
/// on the leader and on a follower, and nothing changes.
#[tokio::test]
async fn i36_2_a_certificate_of_a_node_that_never_joined_is_not_a_member() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let follower = (1..=3).find(|n| *n != leader).expect("a follower");
    let outsider = enrol(&c, 1, 9, &join_secret(&c).secret).await.expect("node 9 enrols");
    let before = fingerprint(&c, leader).await;
    let victim = (1..=3).find(|n| *n != leader && *n != follower).expect("a third node");
    for to in [leader, follower] {
        let mut client = ClusterServiceClient::new(tls::channel_with(&c, to, Some(outsider.clone())));
        let leave = JoinRequest {
            node_id: victim,
            http_addr: String::new(),
            grpc_addr: String::new(),
            check_only: false,
            fresh: false,
        };
        let propose = Request::new(Command::SetJoinSecret { by: "tok_x".into(), hash: "evil".into() });
        let results = [
            ("Leave", client.leave(leave).await.map(drop)),
            ("Propose", client.propose(encode(&propose).expect("encode")).await.map(drop)),
            ("FetchCaKey", client.fetch_ca_key(Empty {}).await.map(drop)),
            ("ReadIndex", client.read_index(Empty {}).await.map(drop)),
        ];
        for (what, result) in results {
            let s = result.expect_err(what);
            assert_eq!(s.code(), tonic::Code::PermissionDenied, "{what} on node {to}: {s:?}");
        }
        // Nor the routing service: an MCP relay names a token by its id only, and a blob is
        // fetched by its id; both are for members.
        let mut routing = RoutingClient::new(tls::channel_with(&c, to, Some(outsider.clone())));
        let relay = McpRelay { computer_id: "cmp_x".into(), json: "{}".into(), token_id: "tok_x".into() };
        let head = files_head();
        let want = computerd_proto::cluster::BlobWant { blob_id: "blb_x".into() };
        let results = [
            ("RelayMcp", routing.relay_mcp(relay).await.map(drop)),
            ("Forward", routing.forward(futures::stream::iter([head])).await.map(drop)),
            ("BlobFetch", routing.blob_fetch(want).await.map(drop)),
            ("CatchUp", routing.catch_up(Empty {}).await.map(drop)),
        ];
        for (what, result) in results {
            let s = result.expect_err(what);
            assert_eq!(s.code(), tonic::Code::PermissionDenied, "{what} on node {to}: {s:?}");
        }
    }
    let after = fingerprint(&c, leader).await;
    assert_eq!(after["members"], before["members"], "no member was removed");
    assert_eq!(after["lastApplied"], before["lastApplied"], "nothing was proposed");
    // A member's certificate still proposes and reads through the same calls.
    let mut member = ClusterServiceClient::new(tls::channel_as(&c, follower, leader));
    member.read_index(Empty {}).await.expect("a member's read index");
}

/// Issue 36, item 2: after `DELETE /v1/cluster/nodes/<id>`, the removed node restarted with an
/// empty `tls/` and the same join secret file (as compose and k8s keep it mounted) is refused:
/// it stops with a clear message and is not a member again. Its id cannot be given a
/// single-use secret either.
#[tokio::test]
async fn i36_2_a_removed_node_never_enrols_again() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let removed = if leader == 3 { 2 } else { 3 };
    c.kill(removed);
    let (s, v) = c.call(Method::DELETE, leader, &format!("/v1/cluster/nodes/{removed}"), &c.token, None).await;
    assert_eq!(s, 204, "{v}");
    c.wait_voters(2).await;
    std::fs::remove_dir_all(c.nodes[&removed].data.join("tls")).expect("empty tls/");
    c.spawn(removed); // --join and --join-token-file as before
    let mut child = Reaped(c.nodes.get_mut(&removed).and_then(|n| n.child.take()).expect("it runs"));
    let status = wait_for("the removed node to stop", Duration::from_secs(60), || {
        let s = child.0.try_wait().expect("try_wait");
        async move { s }
    })
    .await;
    let log = std::fs::read_to_string(&c.nodes[&removed].log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("refused this node's join") && log.contains("removed"), "it says why: {log}");
    for id in c.alive() {
        let h = c.health(id).await.expect("health");
        let members: Vec<u64> =
            h["members"].as_array().expect("members").iter().filter_map(|m| m["id"].as_u64()).collect();
        assert!(!members.contains(&removed), "node {id} lists the removed node: {h}");
    }
    let (s, v) = c
        .call(
            Method::POST,
            leader,
            "/v1/cluster/join-tokens",
            &c.token,
            Some(json!({"ttlSecs": 60, "nodeId": removed})),
        )
        .await;
    assert_eq!(s, 400, "no secret for a removed id: {v}");
}

/// Issue 36, item 4: 1,000 enrolments with a wrong secret, from one source, write nothing to the
/// Raft log: the first ones are refused on the secret's hash (`UNAUTHENTICATED`), the rest by
/// the per-source limit (`RESOURCE_EXHAUSTED`).
#[tokio::test]
async fn i36_4_bad_enrolments_write_nothing_to_the_log() {
    let c = TestCluster::start(1).await;
    let good = join_secret(&c);
    let wrong = "0".repeat(good.secret.len());
    assert_ne!(wrong, good.secret);
    let before = fingerprint(&c, 1).await;
    let mut client = ClusterServiceClient::new(tls::channel_with(&c, 1, None));
    let csr = computerd_raft::tls::Csr::new().expect("a CSR");
    let (mut refused, mut limited) = (0, 0);
    for i in 0..1000u64 {
        let req = computerd_proto::cluster::EnrollRequest {
            node_id: 100 + i,
            secret: wrong.clone(),
            csr_pem: csr.pem.clone(),
        };
        let s = client.enroll(req).await.expect_err("a wrong secret");
        match s.code() {
            tonic::Code::Unauthenticated => refused += 1,
            tonic::Code::ResourceExhausted => limited += 1,
            other => panic!("enrolment {i}: {other:?} {s:?}"),
        }
    }
    eprintln!("1,000 bad enrolments: {refused} refused on the secret, {limited} by the per-source limit");
    assert!(refused >= 1 && limited >= 1, "{refused} refused, {limited} limited");
    assert_eq!(fingerprint(&c, 1).await, before, "the log did not move");
}
