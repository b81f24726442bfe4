//! A link's lifecycle ([`run`], one per live agent link on this node, in the link's own task) and
//! the link registry. [`run`] registers the link (newest generation wins), drives its WebSocket
//! ([`computerd_proto::mux`]): pings the agent, relays the agent's session reports (as
//! `computer_session` events and work for the idle-pause plan), and attaches the HTTP/2
//! connections that calls open; when the link ends (the WebSocket fails, the agent is silent,
//! or a newer generation registers) it unregisters it (only if still its generation) and
//! commits `LinkDown` for its generation only, so an old link never unregisters or offlines a
//! newer one.
//!
//! Calls reach the agent through [`Link::client`], over an HTTP/2 connection (an epoch) opened on
//! the link when a call needs one and kept while calls come; [`LINGER`] after the last call the
//! link lets it go, and the connection ends when the calls still holding it are done.
//!
//! Memory: an idle link is the WebSocket and this one task, with no HTTP/2 state at all. A link
//! was an HTTP/2 connection for its whole life before, which cost about 43 KiB per idle link
//! (h2's 16 KiB write and 8 KiB read buffers, hyper's request queue and tasks), and a ractor
//! actor before that (about 40 KiB more). Proposals are boxed or spawned so that their large
//! futures are not part of every idle link's task.
//!
//! Told by: the registry (replaced), callers (an epoch to attach). Speaks gRPC to the agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use computerd_proto::LINK_GENERATION;
use computerd_proto::agent::SessionEnded;
use computerd_proto::agent::agent_client::AgentClient;
use computerd_proto::channel::LinkChannel;
use computerd_proto::mux;
use computerd_proto::mux::EpochEnd;
use computerd_proto::mux::Event;
use computerd_proto::mux::Mux;
use computerd_proto::mux::Refused;
use computerd_proto::mux::Transport;
use computerd_proto::mux::TunnelEnd;
use computerd_proto::mux::TunnelIo;
use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use prost::Message as _;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;

use crate::now_ms;

/// How often the node pings an agent (and checks on the link).
pub const PING_EVERY: Duration = Duration::from_secs(5);
/// How long an agent may be silent (its pongs included) before the link is taken for lost.
pub const SILENCE: Duration = Duration::from_secs(12);
/// How long an HTTP/2 connection stays open on a link after its last call was started, unless
/// the registry says otherwise ([`LinkRegistry::with_linger`]).
pub const LINGER: Duration = Duration::from_secs(15);
/// How long the agent may take to open what a tunnel asks for (its own connect to a port gives
/// up after 10 s).
pub const TUNNEL_OPEN_WITHIN: Duration = Duration::from_secs(30);
/// How long a link that was told to end (replaced, or shed) waits for calls still under way.
const DRAIN: Duration = Duration::from_secs(60);

/// Adds the link generation to every call.
#[derive(Clone)]
pub struct Generation(pub u64);

impl Interceptor for Generation {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert(LINK_GENERATION, self.0.into());
        Ok(req)
    }
}

/// A gRPC client of one agent over its link.
pub type Agent = AgentClient<InterceptedService<LinkChannel, Generation>>;

/// One live link.
#[derive(Clone)]
pub struct Link {
    /// Its generation.
    pub generation: u64,
    shared: Arc<Shared>,
}

/// What a link's task shares with its callers.
struct Shared {
    /// Told when a newer generation replaces it (or the node sheds it).
    replaced: tokio::sync::Notify,
    /// Told when a caller opened an epoch for the task to attach.
    opened: tokio::sync::Notify,
    /// One opener at a time (concurrent first calls share one epoch).
    opening: tokio::sync::Mutex<()>,
    epochs: Mutex<Epochs>,
    /// How many HTTP/2 connections are open on the link (as of the task's last turn).
    open: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Epochs {
    /// The link ended: no more epochs.
    closed: bool,
    /// The number of the last epoch opened.
    last: u32,
    /// Epochs opened by callers, for the task to attach.
    new: Vec<EpochEnd>,
    /// The number of the last tunnel opened.
    last_tunnel: u32,
    /// Tunnels opened by callers, for the task to attach.
    new_tunnels: Vec<TunnelEnd>,
    /// The open channel, and when a call last took it.
    current: Option<(LinkChannel, Instant)>,
}

impl Shared {
    fn current(&self) -> Option<LinkChannel> {
        let mut e = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        match &mut e.current {
            Some((c, used)) if !c.is_closed() => {
                *used = Instant::now();
                Some(c.clone())
            }
            _ => None,
        }
    }

    /// Lets the channel go once no call took it for `linger`.
    fn expire(&self, linger: Duration) {
        let mut e = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        if e.current.as_ref().is_some_and(|(c, used)| c.is_closed() || used.elapsed() >= linger) {
            e.current = None;
        }
    }

    /// True while an HTTP/2 connection is open on the link.
    fn connected(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    fn take_new(&self) -> (Vec<EpochEnd>, Vec<TunnelEnd>) {
        let mut e = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut e.new), std::mem::take(&mut e.new_tunnels))
    }

    /// Hands the task what callers opened.
    fn attach_new<T: Transport>(&self, mux: &mut Mux<T>) {
        let (epochs, tunnels) = self.take_new();
        epochs.into_iter().for_each(|e| mux.attach(e));
        tunnels.into_iter().for_each(|t| mux.attach_tunnel(t));
    }

    /// No more epochs; the ones not attached yet end (their calls fail).
    fn close(&self) {
        let mut e = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        e.closed = true;
        e.new.clear();
        e.new_tunnels.clear();
        e.current = None;
    }
}

impl Link {
    /// A client of the agent: over the link's open HTTP/2 connection, or a new one (an epoch the
    /// link's task attaches). Fails when the link ended.
    pub async fn client(&self) -> Result<Agent, tonic::Status> {
        let agent = |c: LinkChannel| {
            AgentClient::with_origin(
                InterceptedService::new(c, Generation(self.generation)),
                tonic::codegen::http::Uri::from_static("http://agent.link"),
            )
            .max_decoding_message_size(8 << 20)
            .max_encoding_message_size(8 << 20)
        };
        if let Some(c) = self.shared.current() {
            return Ok(agent(c));
        }
        let _one = self.shared.opening.lock().await;
        if let Some(c) = self.shared.current() {
            return Ok(agent(c));
        }
        let gone = || tonic::Status::unavailable("the agent's link ended");
        let io = {
            let mut e = self.shared.epochs.lock().unwrap_or_else(|p| p.into_inner());
            if e.closed {
                return Err(gone());
            }
            e.last += 1;
            let (end, io) = mux::epoch(e.last);
            e.new.push(end);
            io
        };
        self.shared.opened.notify_one();
        let (channel, connection) = computerd_proto::channel::open(io)
            .await
            .map_err(|e| tonic::Status::unavailable(format!("cannot open a connection on the agent's link: {e}")))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection on an agent link ended");
            }
        });
        let mut e = self.shared.epochs.lock().unwrap_or_else(|p| p.into_inner());
        if e.closed {
            return Err(gone());
        }
        e.current = Some((channel.clone(), Instant::now()));
        Ok(agent(channel))
    }
}

impl Link {
    /// Opens a byte tunnel to the agent ([`computerd_proto::mux::tunnel`]): `open` (JSON) says
    /// to what; the agent's refusal comes back as its error kind and message (an empty kind: the
    /// link ended). Fails at once when the link ended, and after [`TUNNEL_OPEN_WITHIN`] without
    /// an answer.
    pub async fn tunnel(&self, open: &[u8]) -> Result<TunnelIo, Refused> {
        let opening = {
            let mut e = self.shared.epochs.lock().unwrap_or_else(|p| p.into_inner());
            if e.closed {
                return Err(Refused::link_ended());
            }
            e.last_tunnel += 1;
            let (end, opening) = mux::tunnel::open(e.last_tunnel, open);
            e.new_tunnels.push(end);
            opening
        };
        self.shared.opened.notify_one();
        match tokio::time::timeout(TUNNEL_OPEN_WITHIN, opening.answer()).await {
            Ok(answer) => answer,
            // Dropping the opening resets the tunnel, should the answer still come.
            Err(_) => {
                Err(Refused { kind: "unavailable".into(), message: "the agent did not open the tunnel in time".into() })
            }
        }
    }
}

/// The links this node holds, by Computer id.
pub struct LinkRegistry {
    inner: Mutex<HashMap<String, Link>>,
    added: tokio::sync::Notify,
    linger: Duration,
    /// Links ending (between leaving the map and their end committed), and a wake-up each
    /// time one is done.
    ending: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
}

impl Default for LinkRegistry {
    fn default() -> Self {
        Self::with_linger(LINGER)
    }
}

impl LinkRegistry {
    /// A registry whose links keep an HTTP/2 connection `linger` after its last call.
    pub fn with_linger(linger: Duration) -> Self {
        Self {
            inner: Mutex::default(),
            added: tokio::sync::Notify::new(),
            linger,
            ending: std::sync::atomic::AtomicUsize::new(0),
            ended: tokio::sync::Notify::new(),
        }
    }

    /// How many of the links hold an HTTP/2 connection (the others are idle), as of their
    /// tasks' last turns.
    pub fn connected(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|l| l.shared.connected()).count()
    }

    /// The live link of a Computer on this node.
    pub fn get(&self, computer_id: &str) -> Option<Link> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(computer_id).cloned()
    }

    /// Registers a link unless a newer generation is already here (answers false then); the link
    /// it replaces is told to stop.
    fn insert(&self, computer_id: &str, link: Link) -> bool {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(computer_id).is_some_and(|l| l.generation >= link.generation) {
            return false;
        }
        if let Some(old) = map.insert(computer_id.to_string(), link) {
            old.shared.replaced.notify_one();
        }
        drop(map);
        self.added.notify_waiters();
        true
    }

    /// Waits until a link of the Computer is here, or `deadline` passes.
    pub async fn wait(&self, computer_id: &str, deadline: tokio::time::Instant) -> Option<Link> {
        loop {
            let added = self.added.notified();
            if let Some(l) = self.get(computer_id) {
                return Some(l);
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return self.get(computer_id);
            }
        }
    }

    /// Removes the entry only if it is still `generation`.
    fn remove_if(&self, computer_id: &str, generation: u64) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(computer_id).is_some_and(|l| l.generation == generation) {
            map.remove(computer_id);
        }
    }

    /// Ends every link this node holds (their agents reconnect, through the balancer, to a node
    /// that can commit their new generation); answers how many.
    pub fn shed_all(&self) -> usize {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for link in map.values() {
            link.shared.replaced.notify_one();
        }
        map.len()
    }

    /// Ends every link (as [`LinkRegistry::shed_all`]) and waits, up to `within`, until each has
    /// recorded its end in the store: a node that stops does so before its Raft stops.
    pub async fn shed_and_settle(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        self.shed_all();
        loop {
            let ended = self.ended.notified();
            if self.is_empty() && self.ending.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                tracing::info!(links = self.len(), "links still ending at the stop");
                return;
            }
        }
    }

    /// How many links this node holds.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a link starts with.
pub struct LinkArgs {
    /// The Computer.
    pub computer_id: String,
    /// The committed generation of this link.
    pub generation: u64,
    /// The store.
    pub cluster: Cluster,
    /// This node's links.
    pub links: Arc<LinkRegistry>,
    /// Work seen on this node (the agent's running commands).
    pub activity: Arc<crate::idle::Activity>,
}

/// Why a link ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEnd {
    /// A newer generation of the same Computer was already registered on this node.
    Stale,
    /// A newer generation of the same Computer registered on this node, or the node shed it.
    Replaced,
    /// The WebSocket ended or failed, or the agent was silent for [`SILENCE`].
    Lost,
}

/// Runs one link until it ends: registers it (newest generation wins), drives its WebSocket
/// (pings, the agent's reports, the epochs calls open), and when the link ends unregisters it
/// (only if still its generation) and commits `LinkDown` for its generation. A link told to end
/// lets the calls under way finish first (for at most a minute).
pub async fn run<T: Transport>(args: LinkArgs, mut mux: Mux<T>) -> LinkEnd {
    let shared = Arc::new(Shared {
        replaced: tokio::sync::Notify::new(),
        opened: tokio::sync::Notify::new(),
        opening: tokio::sync::Mutex::new(()),
        epochs: Mutex::new(Epochs::default()),
        open: std::sync::atomic::AtomicUsize::new(0),
    });
    let a = &args;
    if !a.links.insert(&a.computer_id, Link { generation: a.generation, shared: shared.clone() }) {
        tracing::info!(computer_id = %a.computer_id, generation = a.generation, "a newer link is already here");
        link_down(a).await;
        return LinkEnd::Stale; // dropping the WebSocket closes the link
    }
    tracing::info!(computer_id = %a.computer_id, generation = a.generation, "agent linked");
    let linger = a.links.linger;
    // One timer: pings every PING_EVERY, and a linger shorter than that is kept to.
    let mut tick = tokio::time::interval(PING_EVERY.min(linger / 2).max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pinged = Instant::now();
    // Reports are committed in tasks of their own, a bounded number at a time per link (an agent
    // that floods reports waits, its link with it).
    let proposals = Arc::new(tokio::sync::Semaphore::new(REPORTS_IN_FLIGHT));
    let end = loop {
        tokio::select! {
            event = mux.next() => match event {
                Event::Report(r) => on_report(a, &r, &proposals).await,
                Event::Accepted(_) => {} // a node serves no epochs: dropping it closes it
                Event::Tunnel(t) => t.refuse("invalid_request", "a node opens no tunnels to an agent"),
                Event::Ended(e) => {
                    tracing::debug!(computer_id = %a.computer_id, error = %e, "the link's WebSocket ended");
                    break LinkEnd::Lost;
                }
            },
            () = shared.replaced.notified() => break LinkEnd::Replaced,
            () = shared.opened.notified() => shared.attach_new(&mut mux),
            _ = tick.tick() => {
                if mux.last_rx().elapsed() > SILENCE {
                    tracing::info!(computer_id = %a.computer_id, "the agent was silent for {SILENCE:?}");
                    break LinkEnd::Lost;
                }
                shared.expire(linger);
                if pinged.elapsed() >= PING_EVERY {
                    pinged = Instant::now();
                    mux.ping();
                }
            }
        }
        shared.open.store(mux.epochs(), std::sync::atomic::Ordering::Relaxed);
    };
    match end {
        LinkEnd::Replaced => {
            tracing::info!(computer_id = %a.computer_id, generation = a.generation, "link told to end (a newer one replaced it, or this node shed it)")
        }
        _ => tracing::info!(computer_id = %a.computer_id, generation = a.generation, "agent link lost"),
    }
    a.activity.set_busy(&a.computer_id, false);
    a.links.ending.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    a.links.remove_if(&a.computer_id, a.generation);
    shared.close();
    link_down(a).await;
    a.links.ending.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    a.links.ended.notify_waiters();
    if end == LinkEnd::Replaced {
        drain(&mut mux, &shared).await;
    }
    end
}

/// Drives the WebSocket of a link told to end until the calls on it are done (its epochs ended),
/// the WebSocket ends, or [`DRAIN`] passes.
async fn drain<T: Transport>(mux: &mut Mux<T>, shared: &Shared) {
    let deadline = tokio::time::sleep(DRAIN);
    tokio::pin!(deadline);
    // Epochs opened just before the end are attached so that their calls end cleanly.
    shared.attach_new(mux);
    while mux.epochs() > 0 {
        tokio::select! {
            event = mux.next() => if matches!(event, Event::Ended(_)) { return },
            () = &mut deadline => return,
        }
    }
}

/// How many reports of one link may be committing at once.
const REPORTS_IN_FLIGHT: usize = 16;

/// One report of the agent: its running commands (work, for the idle-pause plan), and a session
/// that ended after its wait (a `computer_session` event, committed in a task of its own while
/// the link goes on).
async fn on_report(a: &LinkArgs, r: &[u8], proposals: &Arc<tokio::sync::Semaphore>) {
    let Ok(e) = SessionEnded::decode(r) else {
        tracing::warn!(computer_id = %a.computer_id, "a malformed report from the agent");
        return;
    };
    a.activity.set_busy(&a.computer_id, e.running > 0);
    let cmd = if !e.desktop_json.is_empty() {
        let Ok(desktop) = serde_json::from_str(&e.desktop_json) else {
            tracing::warn!(computer_id = %a.computer_id, "a malformed desktop report from the agent");
            return;
        };
        Command::DesktopStatus { computer_id: a.computer_id.clone(), generation: a.generation, desktop }
    } else if e.lease_report {
        // The desktop's input lease changed: an event.
        Command::DesktopLease {
            computer_id: a.computer_id.clone(),
            generation: a.generation,
            holder: Some(e.lease_holder).filter(|h| !h.is_empty()),
            at_ms: now_ms(),
        }
    } else if e.session_id.is_empty() {
        return; // a status report only
    } else {
        session_ended(a, e)
    };
    let Ok(permit) = proposals.clone().acquire_owned().await else { return };
    let (cluster, computer_id) = (a.cluster.clone(), a.computer_id.clone());
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(err) = cluster.propose(Request::new(cmd)).await {
            tracing::warn!(computer_id = %computer_id, error = %err, "could not record an agent's report");
        }
    });
}

fn session_ended(a: &LinkArgs, e: SessionEnded) -> Command {
    Command::SessionEnded {
        computer_id: a.computer_id.clone(),
        generation: a.generation,
        session_id: e.session_id,
        owner: e.owner,
        exit_code: e.exit_code,
        signal: e.signal,
        at_ms: now_ms(),
    }
}

/// Sheds this node's links while it is out of touch with a quorum (a partition): it cannot
/// commit their commands or record their sessions' ends, and their agents can reach the majority
/// even where no balancer shuts their connections. Checks every `every` until `stop`.
pub async fn run_shedder(
    cluster: Cluster,
    links: Arc<LinkRegistry>,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    while crate::tick(every, &mut stop).await {
        if !links.is_empty() && !cluster.quorum_contact() {
            let n = links.shed_all();
            tracing::warn!(links = n, "out of touch with a quorum: shedding the agent links");
        }
    }
}

/// Commits `LinkDown` for this link's generation only.
async fn link_down(a: &LinkArgs) {
    let cmd = Command::LinkDown { computer_id: a.computer_id.clone(), generation: a.generation, at_ms: now_ms() };
    if let Err(e) = Box::pin(a.cluster.propose(Request::new(cmd))).await {
        if a.cluster.is_stopping() {
            // The next link's generation supersedes this one; nothing is lost.
            tracing::info!(computer_id = %a.computer_id, "the node stops: the link's end is not recorded");
            return;
        }
        tracing::warn!(computer_id = %a.computer_id, error = %e, "could not record the link's end");
    }
}
