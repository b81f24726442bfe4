//! The transparent proxy: every TCP connection the sandbox opens (but loopback and the link) is
//! redirected here by the `nat` rules, and is let through or refused by the policy in force.
//!
//! A connection's original destination comes from conntrack (`SO_ORIGINAL_DST`). It is
//! decided from that address alone when no name could change the outcome
//! ([`Compiled::decide_address`]); else its first bytes are read for the name it carries
//! ([`sniff`](super::sniff), at most [`MAX_SNIFF`] bytes within [`SNIFF_DEADLINE`]) and the name
//! decides with the address ([`Compiled::decide`]). Let through by its address, it is connected
//! to its destination; by its name, to where the gateway resolves the name (the static hosts,
//! else DNS), the addresses a `deny` range holds left out. The bytes already read are sent on,
//! then bytes are copied both ways until both sides ended.
//!
//! # Policy changes and open connections
//!
//! The policy and the [`Registry`] of open connections share one lock, and each change of the
//! policy is a new generation. A connection decided under one generation is admitted (put in
//! the registry, its relay started) under the lock, decided again first if the generation
//! changed meanwhile; a change replaces the policy under the lock and takes out every open
//! connection the new policy refuses ([`still_allowed`]), whose relays are then aborted (both
//! sockets reset) and awaited. So no connection slips between a change and its cut.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::SocketAddr;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use computerd_proto::egress::Compiled;
use computerd_proto::egress::Decision;
use computerd_proto::egress::Denied;
use computerd_proto::egress::EgressPolicy;
use computerd_proto::egress::Target;
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;

use super::Config;
use super::MARK;
use super::sniff::MAX_SNIFF;
use super::sniff::Sniff;
use super::sniff::sniff;

/// How long a connection's first bytes are waited for when its name must be read.
pub const SNIFF_DEADLINE: Duration = Duration::from_secs(10);

/// The same for a connection its address already refuses (it is only named, and answered
/// `403` when it is an HTTP request; a client waiting for the server to speak is reset then).
pub const DENIED_SNIFF_DEADLINE: Duration = Duration::from_secs(2);

/// How long connecting upstream may take (each address).
const CONNECT: Duration = Duration::from_secs(10);

/// The most resolved addresses tried.
const MAX_ADDRESSES: usize = 4;

/// How many refused connections `stats` keeps.
pub const RECENT: usize = 32;

/// How long a change waits for the relays it cut to have closed their sockets.
const CUT_WAIT: Duration = Duration::from_secs(5);

/// A policy in force: as set, and compiled.
#[derive(Debug)]
pub struct Active {
    /// As set.
    pub policy: EgressPolicy,
    /// Compiled.
    pub compiled: Compiled,
}

/// An open connection let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conn {
    /// The name it carries, when it was read.
    pub name: Option<String>,
    /// Where the sandbox sent it.
    pub dst: SocketAddr,
    /// The address it is connected to (`dst`'s, or one the name resolved to).
    pub upstream: IpAddr,
    /// How it was let through: [`Decision::Address`] (to `dst`) or [`Decision::Name`].
    pub via: Decision,
}

/// Whether `policy` still lets an open connection through: a new connection like it is not
/// refused, one let through by its address (to the sandbox's choice of host) is still allowed
/// by its address, and one let through by its name is still allowed to the address it went to.
pub fn still_allowed(policy: Option<&Compiled>, c: &Conn) -> bool {
    let Some(p) = policy else { return false };
    let name = c.name.as_deref();
    match (p.decide(c.dst.ip(), name), c.via) {
        (Decision::Deny, _) => false,
        (Decision::Address, Decision::Address) => true,
        // The policy now trusts the name only as the gateway resolves it.
        (Decision::Name, Decision::Address) => false,
        (_, _) => p.decide(c.upstream, name) != Decision::Deny,
    }
}

/// The policy in force and the open connections, under one lock. `H` is what cuts a
/// connection (the relay's handle; anything in tests).
#[derive(Debug)]
pub struct Registry<H> {
    generation: u64,
    active: Option<Arc<Active>>,
    next: u64,
    open: HashMap<u64, (Conn, H)>,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Registry { generation: 0, active: None, next: 0, open: HashMap::new() }
    }
}

impl<H> Registry<H> {
    /// The policy in force (`None`: none set yet, all refused) and its generation.
    pub fn current(&self) -> (u64, Option<Arc<Active>>) {
        (self.generation, self.active.clone())
    }

    /// Whether a connection decided under `generation` may be admitted now (decided again
    /// when the policy changed since).
    pub fn admits(&self, generation: u64, conn: &Conn) -> bool {
        generation == self.generation || still_allowed(self.active.as_ref().map(|a| &a.compiled), conn)
    }

    /// Registers an admitted connection; its id.
    pub fn insert(&mut self, conn: Conn, handle: H) -> u64 {
        self.next += 1;
        self.open.insert(self.next, (conn, handle));
        self.next
    }

    /// Forgets a connection that ended.
    pub fn remove(&mut self, id: u64) {
        self.open.remove(&id);
    }

    /// The open connections.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Puts `active` in force and takes out the open connections it refuses: their handles,
    /// to cut them.
    pub fn replace(&mut self, active: Arc<Active>) -> Vec<H> {
        self.generation += 1;
        self.active = Some(active);
        let compiled = self.active.as_ref().map(|a| &a.compiled);
        let refused: Vec<u64> =
            self.open.iter().filter(|(_, (c, _))| !still_allowed(compiled, c)).map(|(id, _)| *id).collect();
        refused.into_iter().filter_map(|id| self.open.remove(&id)).map(|(_, h)| h).collect()
    }
}

/// A relay's handle: cutting it resets both sockets; `done` ends once they are closed.
#[derive(Debug)]
pub struct Handle {
    abort: tokio::task::AbortHandle,
    cut: Arc<AtomicBool>,
    done: tokio::sync::oneshot::Receiver<()>,
}

/// The counts `stats` gives.
#[derive(Debug, Default)]
struct Counts {
    allowed: u64,
    denied: u64,
    cut: u64,
    recent: VecDeque<Denied>,
}

/// The gateway's state.
#[derive(Debug)]
pub struct Gateway {
    link: Vec<SocketAddr>,
    hosts: HashMap<String, IpAddr>,
    nameservers: Vec<SocketAddr>,
    registry: Mutex<Registry<Handle>>,
    counts: Mutex<Counts>,
    /// One change at a time; the revision of the policy in force (0: the first, or none).
    changes: tokio::sync::Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gateway {
    /// A gateway with no policy (all refused).
    pub fn new(config: Config, nameservers: Vec<SocketAddr>) -> Gateway {
        Gateway {
            link: config.link,
            hosts: config.hosts,
            nameservers,
            registry: Mutex::new(Registry::default()),
            counts: Mutex::new(Counts::default()),
            changes: tokio::sync::Mutex::new(0),
        }
    }

    /// Sets the policy of revision `revision`: the rules first (their failure changes nothing),
    /// then the proxy's policy, then the open connections it refuses are cut. The number cut, or
    /// `None` when a policy of a later revision is already in force (a late change is ignored,
    /// so racing changes end at the store's latest). A policy of the same revision is set again.
    pub async fn set(&self, policy: EgressPolicy, revision: u64) -> Result<Option<usize>, String> {
        let compiled = policy.compile()?;
        let mut held = self.changes.lock().await;
        if revision < *held {
            return Ok(None);
        }
        super::rules::install_v4(Some(&compiled), &self.link).await?;
        *held = revision;
        let handles = lock(&self.registry).replace(Arc::new(Active { policy, compiled }));
        for h in &handles {
            h.cut.store(true, Ordering::SeqCst);
            h.abort.abort();
        }
        lock(&self.counts).cut += handles.len() as u64;
        let n = handles.len();
        for h in handles {
            let _ = tokio::time::timeout(CUT_WAIT, h.done).await;
        }
        Ok(Some(n))
    }

    /// `stats`: `{"policy", "allowed", "denied", "cut", "recent"}` (JSON text).
    pub fn stats(&self) -> String {
        #[derive(Serialize)]
        struct Stats<'a> {
            policy: Option<&'a EgressPolicy>,
            allowed: u64,
            denied: u64,
            cut: u64,
            recent: &'a VecDeque<Denied>,
        }
        let (_, active) = lock(&self.registry).current();
        let c = lock(&self.counts);
        let stats = Stats {
            policy: active.as_ref().map(|a| &a.policy),
            allowed: c.allowed,
            denied: c.denied,
            cut: c.cut,
            recent: &c.recent,
        };
        serde_json::to_string(&stats).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}).to_string())
    }

    /// Counts and reports a refused connection.
    fn record_denied(&self, host: &str, port: u16) {
        let d = Denied::new(host, port, super::now_ms());
        super::say_out(&d.line());
        let mut c = lock(&self.counts);
        c.denied += 1;
        if c.recent.len() == RECENT {
            c.recent.pop_front();
        }
        c.recent.push_back(d);
    }

    /// Refuses a connection: `403` to an HTTP request, else a reset.
    async fn deny(&self, mut client: TcpStream, name: Option<String>, dst: SocketAddr, http: bool) {
        let host = name.unwrap_or_else(|| dst.ip().to_string());
        self.record_denied(&host, dst.port());
        if !http {
            reset(client);
            return;
        }
        let body = format!("egress to {host} is denied by this Computer's policy\n");
        let answer = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let wrote = tokio::time::timeout(Duration::from_secs(5), async {
            client.write_all(answer.as_bytes()).await?;
            client.shutdown().await
        })
        .await;
        if !matches!(wrote, Ok(Ok(()))) {
            reset(client);
            return;
        }
        // Read what the client still sends (a body) for a moment, so closing with unread bytes
        // does not reset the connection before the client read the answer.
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while left > 0 {
                match client.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        })
        .await;
    }

    /// One redirected connection, from accept to its end. Never panics; every failure closes it.
    async fn handle(self: Arc<Self>, mut client: TcpStream) {
        let dst = match (original_dst(&client), client.local_addr()) {
            (Ok(dst), Ok(local)) if dst != local => dst,
            // Not redirected: a direct connection to the proxy's port.
            _ => return reset(client),
        };
        let (generation, active) = lock(&self.registry).current();
        let early = match &active {
            None => Some(Decision::Deny),
            Some(a) => a.compiled.decide_address(dst.ip()),
        };
        let mut first = Vec::new();
        let (mut name, mut http) = (None, false);
        let (generation, active, decision) = match early {
            Some(d @ Decision::Address) => (generation, active, d),
            // Refused by its address, or to be decided by its name: read it (briefly when it is
            // refused anyway, to name it in the record and answer an HTTP request `403`).
            _ => {
                let wait = if early.is_some() { DENIED_SNIFF_DEADLINE } else { SNIFF_DEADLINE };
                match read_name(&mut client, &mut first, wait).await {
                    Some((n, h)) => (name, http) = (n, h),
                    None if early.is_some() => return self.deny(client, None, dst, false).await,
                    None => return reset(client),
                }
                // The policy may have changed while the bytes came.
                let (generation, active) = lock(&self.registry).current();
                let d = active.as_ref().map_or(Decision::Deny, |a| a.compiled.decide(dst.ip(), name.as_deref()));
                (generation, active, d)
            }
        };
        let upstream = match decision {
            Decision::Deny => return self.deny(client, name, dst, http).await,
            Decision::Address => connect_marked(dst).await.ok(),
            Decision::Name => {
                let Some(n) = name.as_deref() else { return self.deny(client, name, dst, http).await };
                let addrs = match self.resolve(n).await {
                    Ok(a) => a,
                    Err(_) => return reset(client),
                };
                let deny = active.as_ref().map(|a| a.compiled.deny.as_slice()).unwrap_or_default();
                let addrs: Vec<IpAddr> = addrs.into_iter().filter(|ip| !in_range(deny, *ip)).collect();
                if addrs.is_empty() {
                    return self.deny(client, name, dst, http).await;
                }
                let mut up = None;
                for ip in addrs.into_iter().take(MAX_ADDRESSES) {
                    if let Ok(s) = connect_marked(SocketAddr::new(ip, dst.port())).await {
                        up = Some(s);
                        break;
                    }
                }
                up
            }
        };
        let Some(upstream) = upstream else { return reset(client) };
        let Ok(up_addr) = upstream.peer_addr() else { return reset(client) };
        let conn = Conn { name, dst, upstream: up_addr.ip(), via: decision };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let cut = Arc::new(AtomicBool::new(false));
        let admitted = {
            let mut registry = lock(&self.registry);
            if registry.admits(generation, &conn) {
                let relay = Relay { client, upstream, cut: cut.clone(), _done: done_tx };
                let task = tokio::spawn(relay.run(first));
                let handle = Handle { abort: task.abort_handle(), cut, done: done_rx };
                Ok((registry.insert(conn, handle), task))
            } else {
                Err((client, conn))
            }
        };
        match admitted {
            Ok((id, task)) => {
                lock(&self.counts).allowed += 1;
                let _ = task.await;
                lock(&self.registry).remove(id);
            }
            // The policy changed while it was connected, and the new one refuses it.
            Err((client, conn)) => self.deny(client, conn.name, dst, http).await,
        }
    }

    /// A name's addresses: the static hosts', else DNS's.
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, super::dns::DnsError> {
        if let Some(ip) = self.hosts.get(name) {
            return Ok(vec![*ip]);
        }
        super::dns::resolve(&self.nameservers, name, MARK).await
    }
}

/// Whether a range of `list` holds `ip`.
fn in_range(list: &[Target], ip: IpAddr) -> bool {
    list.iter().any(|t| matches!(t, Target::Range(r) if r.contains(ip)))
}

/// Accepts redirected connections forever; an accept error (no descriptors left) waits a moment.
pub async fn serve(gateway: Arc<Gateway>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((sock, _)) => {
                tokio::spawn(gateway.clone().handle(sock));
            }
            Err(e) => {
                super::say(&format!("egress gateway: accept: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Reads a connection's first bytes into `buf` until they tell its name, [`MAX_SNIFF`] bytes or
/// `wait`: the name and whether it is an HTTP request (`None`: the read failed).
async fn read_name(client: &mut TcpStream, buf: &mut Vec<u8>, wait: Duration) -> Option<(Option<String>, bool)> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut chunk = [0u8; 4096];
    loop {
        if let Sniff::Done { name, http } = sniff(buf) {
            return Some((name, http));
        }
        let room = MAX_SNIFF.saturating_sub(buf.len()).min(chunk.len());
        if room == 0 {
            return Some((None, false));
        }
        match tokio::time::timeout_at(deadline, client.read(&mut chunk[..room])).await {
            // Nothing more in time, or the client ended its side: no name.
            Err(_) | Ok(Ok(0)) => return Some((None, false)),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(_)) => return None,
        }
    }
}

/// The most bytes one `splice` moves (and the size asked of each direction's pipe).
const SPLICE_CHUNK: usize = 1 << 20;

/// The two sockets of a connection let through. When it is dropped (the relay ended or was
/// aborted) both close, reset when it was cut, and then `_done` tells the change waiting on it
/// (fields drop in order).
struct Relay {
    client: TcpStream,
    upstream: TcpStream,
    cut: Arc<AtomicBool>,
    _done: tokio::sync::oneshot::Sender<()>,
}

impl Relay {
    async fn run(mut self, first: Vec<u8>) {
        if !first.is_empty() && self.upstream.write_all(&first).await.is_err() {
            return;
        }
        // The bytes go socket to pipe to socket inside the kernel (`splice`): the gateway, on
        // half a CPU, would otherwise copy every byte of a download twice through its memory.
        let up = splice_one_way(&self.client, &self.upstream);
        let down = splice_one_way(&self.upstream, &self.client);
        // Either way's error ends both (as a copy would); an end of one side waits for the other.
        let _ = tokio::try_join!(up, down);
    }
}

/// A pipe's two ends, closed on drop.
struct Pipe(libc::c_int, libc::c_int);

impl Drop for Pipe {
    fn drop(&mut self) {
        // SAFETY: both descriptors were made by `pipe2` for this value and are closed once.
        unsafe {
            libc::close(self.0);
            libc::close(self.1);
        }
    }
}

/// Moves what `from` sends to `to` until `from` ends its side (then ends `to`'s writing side),
/// through a pipe with `splice`, never through user space. An error ends this direction only;
/// the relay ends when both have.
async fn splice_one_way(from: &TcpStream, to: &TcpStream) -> std::io::Result<()> {
    use tokio::io::Interest;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let pipe = Pipe(fds[0], fds[1]);
    // A bigger pipe moves more per call; the system's ceiling may refuse it, which is fine.
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe { libc::fcntl(pipe.1, libc::F_SETPIPE_SZ, SPLICE_CHUNK as libc::c_int) };
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    let splice = |src: libc::c_int, dst: libc::c_int, len: usize| -> std::io::Result<usize> {
        // SAFETY: splice between descriptors that stay open for the call; null offsets (sockets
        // and pipes have none).
        let n = unsafe { libc::splice(src, std::ptr::null_mut(), dst, std::ptr::null_mut(), len, flags) };
        if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
    };
    loop {
        from.readable().await?;
        let n = match from.try_io(Interest::READABLE, || splice(from.as_raw_fd(), pipe.1, SPLICE_CHUNK)) {
            Ok(0) => {
                // SAFETY: shutdown of the writing side of a socket the relay holds open.
                unsafe { libc::shutdown(to.as_raw_fd(), libc::SHUT_WR) };
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || splice(pipe.0, to.as_raw_fd(), left)) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(m) => left -= m.min(left),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.cut.load(Ordering::SeqCst) {
            super::set_reset_on_close(self.client.as_raw_fd());
            super::set_reset_on_close(self.upstream.as_raw_fd());
        }
    }
}

/// Closes a connection with a reset.
fn reset(s: TcpStream) {
    super::set_reset_on_close(s.as_raw_fd());
    drop(s);
}

/// Connects to `addr` from a socket carrying [`MARK`] (the rules let it out unredirected).
async fn connect_marked(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    super::set_mark(sock.as_raw_fd(), MARK)?;
    match tokio::time::timeout(CONNECT, sock.connect(addr)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting upstream timed out")),
    }
}

/// The destination a redirected connection was sent to (`SO_ORIGINAL_DST`, from conntrack).
fn original_dst(s: &TcpStream) -> std::io::Result<SocketAddr> {
    let mut addr =
        libc::sockaddr_in { sin_family: 0, sin_port: 0, sin_addr: libc::in_addr { s_addr: 0 }, sin_zero: [0; 8] };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt on an open socket, into a sockaddr_in of the length given.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if i32::from(addr.sin_family) != libc::AF_INET {
        return Err(std::io::Error::other("the original destination is not IPv4"));
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(addr.sin_port))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active(json: &str) -> Arc<Active> {
        let policy: EgressPolicy = serde_json::from_str(json).expect("a policy");
        let compiled = policy.compile().expect("compiles");
        Arc::new(Active { policy, compiled })
    }

    fn conn(name: Option<&str>, dst: &str, upstream: &str, via: Decision) -> Conn {
        Conn {
            name: name.map(str::to_string),
            dst: dst.parse().expect("dst"),
            upstream: upstream.parse().expect("upstream"),
            via,
        }
    }

    #[test]
    fn open_connections_are_decided_again_by_a_new_policy() {
        let names = active(r#"{"default":"deny","allow":["allowed.test","10.9.0.0/16"]}"#);
        let p = Some(&names.compiled);
        // Let through by name, to where the gateway resolved it: still allowed.
        assert!(still_allowed(p, &conn(Some("allowed.test"), "198.51.100.1:443", "172.18.0.1", Decision::Name)));
        // A name not allowed any more.
        assert!(!still_allowed(p, &conn(Some("other.test"), "198.51.100.1:443", "172.18.0.1", Decision::Name)));
        // Let through by address to the sandbox's choice: the name alone does not keep it now.
        assert!(!still_allowed(p, &conn(Some("allowed.test"), "198.51.100.1:443", "198.51.100.1", Decision::Address)));
        // By address to an allowed range: still allowed; with no name read, elsewhere: refused.
        assert!(still_allowed(p, &conn(None, "10.9.1.1:22", "10.9.1.1", Decision::Address)));
        assert!(!still_allowed(p, &conn(None, "203.0.113.1:22", "203.0.113.1", Decision::Address)));
        // By name, sent to an allowed range but connected elsewhere, the name not allowed.
        assert!(!still_allowed(p, &conn(Some("gone.test"), "10.9.1.1:80", "198.51.100.7", Decision::Name)));
        // A deny range holding the address the name went to.
        let ranges = active(r#"{"default":"allow","deny":["172.18.0.0/16"]}"#);
        assert!(!still_allowed(
            Some(&ranges.compiled),
            &conn(Some("allowed.test"), "198.51.100.1:443", "172.18.0.1", Decision::Name)
        ));
        assert!(still_allowed(
            Some(&ranges.compiled),
            &conn(Some("allowed.test"), "198.51.100.1:443", "198.51.100.1", Decision::Address)
        ));
        assert!(!still_allowed(None, &conn(None, "10.9.1.1:22", "10.9.1.1", Decision::Address)), "no policy: nothing");
    }

    #[test]
    fn a_change_cuts_exactly_the_connections_it_refuses() {
        let mut r: Registry<&str> = Registry::default();
        r.replace(active(r#"{"default":"allow"}"#));
        let (generation, _) = r.current();
        let a = conn(Some("allowed.test"), "198.51.100.1:443", "172.18.0.1", Decision::Name);
        let b = conn(Some("other.test"), "198.51.100.2:443", "198.51.100.2", Decision::Address);
        let c = conn(None, "10.9.1.1:22", "10.9.1.1", Decision::Address);
        assert!(r.admits(generation, &a) && r.admits(generation, &b));
        let ia = r.insert(a.clone(), "a");
        r.insert(b.clone(), "b");
        r.insert(c, "c");
        let mut cut = r.replace(active(r#"{"default":"deny","allow":["allowed.test","10.9.0.0/16"]}"#));
        cut.sort();
        assert_eq!(cut, ["b"]);
        assert_eq!(r.len(), 2);
        // A connection decided under the old generation is decided again before it is admitted.
        assert!(!r.admits(generation, &b), "refused by the policy now in force");
        assert!(r.admits(generation, &a));
        let (now, active_now) = r.current();
        assert!(now > generation && active_now.is_some());
        assert!(r.admits(now, &b), "decided under the current policy: admitted as decided");
        let cut = r.replace(active(r#"{"default":"deny"}"#));
        assert_eq!(cut.len(), 2);
        assert!(r.is_empty());
        r.remove(ia);
        assert!(r.is_empty());
    }

    #[test]
    fn the_first_decision_reads_the_name_only_when_it_matters() {
        // The decision the proxy makes before reading anything.
        let open = active(r#"{"default":"allow","deny":["203.0.113.0/24"]}"#);
        assert_eq!(open.compiled.decide_address("203.0.113.5".parse().expect("ip")), Some(Decision::Deny));
        assert_eq!(open.compiled.decide_address("198.51.100.5".parse().expect("ip")), Some(Decision::Address));
        let names = active(r#"{"default":"deny","allow":["allowed.test"]}"#);
        assert_eq!(names.compiled.decide_address("198.51.100.5".parse().expect("ip")), None);
        // Resolved addresses in a deny range are left out.
        let deny = active(r#"{"default":"deny","allow":["allowed.test"],"deny":["172.18.0.0/16"]}"#);
        assert!(in_range(&deny.compiled.deny, "172.18.0.1".parse().expect("ip")));
        assert!(!in_range(&deny.compiled.deny, "172.19.0.1".parse().expect("ip")));
    }

    #[tokio::test]
    async fn stats_keep_the_last_refusals_newest_last() {
        let g = Gateway::new(Config::default(), vec![]);
        for port in 0..(RECENT as u16 + 3) {
            g.record_denied("other.test", port);
        }
        let s: serde_json::Value = serde_json::from_str(&g.stats()).expect("JSON");
        assert!(g.stats().starts_with(r#"{"policy":null,"allowed":0,"denied":35,"cut":0,"recent":[{"host":"#));
        assert_eq!(s["policy"], serde_json::Value::Null);
        assert_eq!(s["denied"], RECENT as u64 + 3);
        let recent = s["recent"].as_array().expect("recent");
        assert_eq!(recent.len(), RECENT);
        assert_eq!(recent[0]["port"], 3);
        assert_eq!(recent[RECENT - 1]["port"], RECENT as u64 + 2);
        assert_eq!(recent[0]["host"], "other.test");
        assert!(recent[0]["at"].as_u64().is_some_and(|at| at > 1_600_000_000_000));
    }

    /// The relay with a real pair of sockets: cutting it (as a change does) resets the client
    /// and `done` fires once the sockets are closed.
    #[tokio::test]
    async fn a_cut_relay_resets_its_client() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let up_listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let mut app = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("connect");
        let (client, _) = listener.accept().await.expect("accept");
        let upstream = TcpStream::connect(up_listener.local_addr().expect("addr")).await.expect("connect");
        let (mut server, _) = up_listener.accept().await.expect("accept");
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let cut = Arc::new(AtomicBool::new(false));
        let relay = Relay { client, upstream, cut: cut.clone(), _done: done_tx };
        let task = tokio::spawn(relay.run(b"hello ".to_vec()));
        app.write_all(b"world").await.expect("write");
        let mut got = [0u8; 11];
        server.read_exact(&mut got).await.expect("relayed");
        assert_eq!(&got, b"hello world");
        cut.store(true, Ordering::SeqCst);
        task.abort();
        tokio::time::timeout(Duration::from_secs(5), done_rx)
            .await
            .expect("closed in time")
            .expect_err("sender dropped");
        let mut buf = [0u8; 8];
        let r = tokio::time::timeout(Duration::from_secs(5), app.read(&mut buf)).await.expect("ended in time");
        assert_eq!(r.expect_err("a reset").kind(), std::io::ErrorKind::ConnectionReset);
    }
}
