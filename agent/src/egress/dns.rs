//! The gateway's own DNS client: it resolves the names it lets through by name
//! ([`Decision::Name`](computerd_proto::egress::Decision::Name)), so a sandbox never chooses the
//! address an allowed name goes to.
//!
//! It asks the nameservers `/etc/resolv.conf` listed when the gateway started (Docker's embedded
//! resolver, `127.0.0.11`, on a user-defined network), never the file again: the sandbox shares
//! it and its root may rewrite it. One question over UDP, `A` then `AAAA` when there is no `A`,
//! with a random id, the answer's id and question checked (answers that do not match are
//! ignored until the timeout), [`TIMEOUT`] per try and one retry. Only the answer section of the
//! response is read, following a CNAME chain within it; every length and compression pointer is
//! checked, so a hostile or broken response is an error, never a panic.

use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::Ipv6Addr;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// How long one try waits for its answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Tries per nameserver and question (one retry).
const TRIES: usize = 2;

/// The longest CNAME chain followed.
const MAX_CHAIN: usize = 8;

/// The most compression pointers followed in one name.
const MAX_JUMPS: usize = 32;

/// The largest response read.
const MAX_RESPONSE: usize = 4096;

/// The `A` record type.
pub const A: u16 = 1;
/// The `AAAA` record type.
pub const AAAA: u16 = 28;
/// The `CNAME` record type.
const CNAME: u16 = 5;
/// The `IN` class.
const IN: u16 = 1;

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The name cannot be asked (not a host name).
    #[error("{0:?} is not a name that can be resolved")]
    BadName(String),
    /// The response does not parse.
    #[error("malformed DNS response: {0}")]
    Malformed(&'static str),
    /// The response answers another question (or another id).
    #[error("the DNS response answers another question")]
    Mismatch,
    /// The name does not exist.
    #[error("no such name")]
    NoSuchName,
    /// The server failed (its RCODE).
    #[error("the DNS server answered rcode {0}")]
    Failed(u8),
    /// No server answered in time.
    #[error("no DNS answer in time")]
    Timeout,
    /// No nameserver is known.
    #[error("no nameserver (none in /etc/resolv.conf at start)")]
    NoServer,
    /// A socket call failed.
    #[error("DNS socket: {0}")]
    Io(#[from] std::io::Error),
}

/// `name` without case and trailing dot, checked to be encodable.
fn normalize(name: &str) -> Result<String, DnsError> {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    let ok = !n.is_empty() && n.len() <= 253 && n.split('.').all(|l| (1..=63).contains(&l.len()));
    if ok { Ok(n) } else { Err(DnsError::BadName(name.to_string())) }
}

/// A query for `name`'s `qtype` records (recursion desired).
pub fn encode_query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, DnsError> {
    let name = normalize(name)?;
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend(id.to_be_bytes());
    q.extend([0x01, 0x00]); // RD
    q.extend([0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.push(0);
    q.extend(qtype.to_be_bytes());
    q.extend(IN.to_be_bytes());
    Ok(q)
}

/// A bounds-checked read of `n` bytes at `at`.
fn get(msg: &[u8], at: usize, n: usize) -> Result<&[u8], DnsError> {
    msg.get(at..at.checked_add(n).ok_or(DnsError::Malformed("length"))?).ok_or(DnsError::Malformed("truncated"))
}

fn u16_at(msg: &[u8], at: usize) -> Result<u16, DnsError> {
    let b = get(msg, at, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

/// The name at `at` (lower case, dotted) and the offset after it where it is written. A
/// compression pointer must point before the part of the name that holds it (so pointers
/// cannot loop), and a name is 255 bytes at most.
fn read_name(msg: &[u8], at: usize) -> Result<(String, usize), DnsError> {
    let mut name: Vec<u8> = Vec::new();
    let mut pos = at;
    let mut segment = at;
    let mut after = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(pos).ok_or(DnsError::Malformed("truncated name"))?;
        match len & 0xc0 {
            0x00 if len == 0 => {
                pos += 1;
                break;
            }
            0x00 => {
                let label = get(msg, pos + 1, usize::from(len))?;
                if name.len() + label.len() + 1 > 255 {
                    return Err(DnsError::Malformed("name too long"));
                }
                if !name.is_empty() {
                    name.push(b'.');
                }
                name.extend(label.iter().map(u8::to_ascii_lowercase));
                pos += 1 + label.len();
            }
            0xc0 => {
                let low = *msg.get(pos + 1).ok_or(DnsError::Malformed("truncated pointer"))?;
                let target = (usize::from(len & 0x3f) << 8) | usize::from(low);
                jumps += 1;
                if target >= segment || jumps > MAX_JUMPS {
                    return Err(DnsError::Malformed("compression pointer loop"));
                }
                after.get_or_insert(pos + 2);
                pos = target;
                segment = target;
            }
            _ => return Err(DnsError::Malformed("unknown label type")),
        }
    }
    Ok((String::from_utf8_lossy(&name).into_owned(), after.unwrap_or(pos)))
}

/// A record of the answer section the client uses.
enum Record {
    Addr(String, IpAddr),
    Cname(String, String),
}

/// The `qtype` addresses a response gives for `name` (following CNAMEs within the answer
/// section); an empty list when the name has none of that type.
pub fn parse_response(msg: &[u8], id: u16, name: &str, qtype: u16) -> Result<Vec<IpAddr>, DnsError> {
    let want = normalize(name)?;
    let header = get(msg, 0, 12)?;
    if u16::from_be_bytes([header[0], header[1]]) != id || header[2] & 0x80 == 0 {
        return Err(DnsError::Mismatch);
    }
    let [qd, an] = [4, 6].map(|i| u16::from_be_bytes([header[i], header[i + 1]]));
    if qd != 1 {
        return Err(DnsError::Mismatch);
    }
    let (qname, mut at) = read_name(msg, 12)?;
    if qname != want || u16_at(msg, at)? != qtype || u16_at(msg, at + 2)? != IN {
        return Err(DnsError::Mismatch);
    }
    at += 4;
    match header[3] & 0x0f {
        0 => {}
        3 => return Err(DnsError::NoSuchName),
        rcode => return Err(DnsError::Failed(rcode)),
    }
    let mut records = Vec::new();
    for _ in 0..an {
        let (owner, next) = read_name(msg, at)?;
        let fixed = get(msg, next, 10)?;
        let kind = u16::from_be_bytes([fixed[0], fixed[1]]);
        let class = u16::from_be_bytes([fixed[2], fixed[3]]);
        let len = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        let data_at = next + 10;
        let data = get(msg, data_at, len)?;
        at = data_at + len;
        if class != IN {
            continue;
        }
        match (kind, data.len()) {
            (A, 4) if qtype == A => {
                records.push(Record::Addr(owner, Ipv4Addr::new(data[0], data[1], data[2], data[3]).into()))
            }
            (AAAA, 16) if qtype == AAAA => {
                let mut b = [0u8; 16];
                b.copy_from_slice(data);
                records.push(Record::Addr(owner, Ipv6Addr::from(b).into()))
            }
            (A | AAAA, _) if kind == qtype => return Err(DnsError::Malformed("address of the wrong length")),
            (CNAME, _) => {
                let (target, end) = read_name(msg, data_at)?;
                if end != at {
                    return Err(DnsError::Malformed("CNAME data length"));
                }
                records.push(Record::Cname(owner, target));
            }
            _ => {}
        }
    }
    let mut current = want;
    for _ in 0..=MAX_CHAIN {
        let addrs: Vec<IpAddr> = records
            .iter()
            .filter_map(|r| match r {
                Record::Addr(owner, ip) if *owner == current => Some(*ip),
                _ => None,
            })
            .collect();
        if !addrs.is_empty() {
            return Ok(addrs);
        }
        let next = records.iter().find_map(|r| match r {
            Record::Cname(owner, target) if *owner == current => Some(target.clone()),
            _ => None,
        });
        match next {
            Some(t) => current = t,
            None => break,
        }
    }
    Ok(Vec::new())
}

/// The nameservers of a `resolv.conf` text (port 53), in order.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next()).flatten()
        })
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Resolves `name`: its `A` addresses, else its `AAAA` ones, from the first of `servers` that
/// answers. The queries' sockets carry `mark` (the gateway's rules let them out).
pub async fn resolve(servers: &[SocketAddr], name: &str, mark: u32) -> Result<Vec<IpAddr>, DnsError> {
    if servers.is_empty() {
        return Err(DnsError::NoServer);
    }
    for qtype in [A, AAAA] {
        let mut last = DnsError::Timeout;
        let mut answered = false;
        for server in servers {
            match ask(*server, name, qtype, mark).await {
                Ok(addrs) if !addrs.is_empty() => return Ok(addrs),
                Ok(_) => {
                    answered = true;
                    break;
                }
                Err(DnsError::NoSuchName) => return Err(DnsError::NoSuchName),
                Err(e) => last = e,
            }
        }
        if !answered {
            // No server answered (asking again for AAAA would only wait as long again).
            return Err(last);
        }
    }
    Ok(Vec::new())
}

/// One question to one server, tried [`TRIES`] times.
async fn ask(server: SocketAddr, name: &str, qtype: u16, mark: u32) -> Result<Vec<IpAddr>, DnsError> {
    let mut last = DnsError::Timeout;
    for _ in 0..TRIES {
        let id: u16 = rand::random();
        let query = encode_query(id, name, qtype)?;
        let bind: SocketAddr =
            if server.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
        let sock = tokio::net::UdpSocket::bind(bind).await?;
        super::set_mark(sock.as_raw_fd(), mark)?;
        sock.connect(server).await?;
        sock.send(&query).await?;
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let mut buf = vec![0u8; MAX_RESPONSE];
        loop {
            let n = match tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
                Err(_) => break,
                Ok(Err(e)) => {
                    // A refused port (ICMP) on a connected socket: this server does not answer.
                    last = DnsError::Io(e);
                    break;
                }
                Ok(Ok(n)) => n,
            };
            match parse_response(&buf[..n], id, name, qtype) {
                // Not the answer to this question: a stray or forged datagram.
                Err(DnsError::Mismatch) | Err(DnsError::Malformed(_)) => continue,
                other => return other,
            }
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: u16, flags: u16, an: u16) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(id.to_be_bytes());
        m.extend(flags.to_be_bytes());
        m.extend([0, 1]);
        m.extend(an.to_be_bytes());
        m.extend([0, 0, 0, 0]);
        m
    }

    /// A response to `query` whose answers follow.
    fn response(query: &[u8], flags: u16, an: u16) -> Vec<u8> {
        let mut m = header(u16::from_be_bytes([query[0], query[1]]), flags, an);
        m.extend(&query[12..]);
        m
    }

    fn rr(owner: &[u8], kind: u16, data: &[u8]) -> Vec<u8> {
        let mut r = owner.to_vec();
        r.extend(kind.to_be_bytes());
        r.extend(IN.to_be_bytes());
        r.extend(300u32.to_be_bytes());
        r.extend((data.len() as u16).to_be_bytes());
        r.extend(data);
        r
    }

    #[test]
    fn a_query_is_encoded() {
        let q = encode_query(0xbeef, "WWW.Example.com.", A).expect("a query");
        let want: &[u8] =
            b"\xbe\xef\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x07example\x03com\x00\x00\x01\x00\x01";
        assert_eq!(q, want);
        assert_eq!(&encode_query(1, "a.test", AAAA).expect("a query")[20..22], &[0, 28]);
        assert!(encode_query(1, "", A).is_err());
        assert!(encode_query(1, "a..b", A).is_err());
        assert!(encode_query(1, &"x".repeat(64), A).is_err());
    }

    #[test]
    fn a_cname_then_an_a_record_with_compression_pointers() {
        let q = encode_query(7, "www.example.com", A).expect("a query");
        let mut m = response(&q, 0x8180, 2);
        // www.example.com (pointer to the question at 12) CNAME edge.cdn.test.
        m.extend(rr(&[0xc0, 12], CNAME, b"\x04edge\x03cdn\x04test\x00"));
        // The CNAME's data starts at its record's offset + 12: point the A's owner there.
        let cname_data = 12 + q.len() - 12 + 2 + 10;
        let ptr = [0xc0, cname_data as u8];
        m.extend(rr(&ptr, A, &[192, 0, 2, 10]));
        m.extend(rr(&[0xc0, 12], AAAA, &[0; 16])); // not counted in an: ignored
        assert_eq!(
            parse_response(&m, 7, "www.example.com", A).expect("parsed"),
            vec!["192.0.2.10".parse::<IpAddr>().expect("ip")]
        );
        // Another id, another question: a mismatch.
        assert!(matches!(parse_response(&m, 8, "www.example.com", A), Err(DnsError::Mismatch)));
        assert!(matches!(parse_response(&m, 7, "other.test", A), Err(DnsError::Mismatch)));
        // A CNAME whose target has no address in the answer: no address.
        let mut only = response(&q, 0x8180, 1);
        only.extend(rr(&[0xc0, 12], CNAME, b"\x04edge\x03cdn\x04test\x00"));
        assert_eq!(parse_response(&only, 7, "www.example.com", A).expect("parsed"), Vec::<IpAddr>::new());
        // An address of another owner is not the name's.
        let mut other = response(&q, 0x8180, 1);
        other.extend(rr(b"\x05other\x04test\x00", A, &[192, 0, 2, 66]));
        assert_eq!(parse_response(&other, 7, "www.example.com", A).expect("parsed"), Vec::<IpAddr>::new());
    }

    #[test]
    fn aaaa_records_and_error_codes() {
        let q = encode_query(9, "v6.test", AAAA).expect("a query");
        let mut m = response(&q, 0x8180, 1);
        let ip: Ipv6Addr = "2001:db8::1".parse().expect("ip");
        m.extend(rr(&[0xc0, 12], AAAA, &ip.octets()));
        assert_eq!(parse_response(&m, 9, "v6.test", AAAA).expect("parsed"), vec![IpAddr::V6(ip)]);
        let nx = response(&q, 0x8183, 0);
        assert!(matches!(parse_response(&nx, 9, "v6.test", AAAA), Err(DnsError::NoSuchName)));
        let fail = response(&q, 0x8182, 0);
        assert!(matches!(parse_response(&fail, 9, "v6.test", AAAA), Err(DnsError::Failed(2))));
        let not_response = response(&q, 0x0100, 0);
        assert!(matches!(parse_response(&not_response, 9, "v6.test", AAAA), Err(DnsError::Mismatch)));
    }

    #[test]
    fn malformed_responses_are_errors_not_panics() {
        let q = encode_query(7, "a.test", A).expect("a query");
        // A pointer to itself, and two pointers to each other.
        let mut self_loop = response(&q, 0x8180, 1);
        let at = self_loop.len();
        self_loop.extend(rr(&[0xc0, at as u8], A, &[1, 2, 3, 4]));
        assert!(matches!(parse_response(&self_loop, 7, "a.test", A), Err(DnsError::Malformed(_))));
        let mut pair = response(&q, 0x8180, 1);
        let at = pair.len();
        pair.extend([1, b'x', 0xc0, (at + 4) as u8, 0xc0, at as u8]);
        pair.extend([0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4]);
        assert!(matches!(parse_response(&pair, 7, "a.test", A), Err(DnsError::Malformed(_))));
        // An address of the wrong length, rdata past the end, a label type 0x40.
        let mut bad_len = response(&q, 0x8180, 1);
        bad_len.extend(rr(&[0xc0, 12], A, &[1, 2, 3]));
        assert!(matches!(parse_response(&bad_len, 7, "a.test", A), Err(DnsError::Malformed(_))));
        let mut good = response(&q, 0x8180, 1);
        good.extend(rr(&[0xc0, 12], A, &[1, 2, 3, 4]));
        assert!(parse_response(&good, 7, "a.test", A).is_ok());
        for cut in 0..good.len() {
            assert!(parse_response(&good[..cut], 7, "a.test", A).is_err(), "cut at {cut}");
        }
        let mut label = good.clone();
        label[q.len()] = 0x40;
        assert!(parse_response(&label, 7, "a.test", A).is_err());
        // Every byte flipped: never a panic.
        for i in 0..good.len() {
            let mut m = good.clone();
            m[i] ^= 0xff;
            let _ = parse_response(&m, 7, "a.test", A);
        }
        assert!(parse_response(&[], 7, "a.test", A).is_err());
    }

    #[test]
    fn nameservers_of_resolv_conf() {
        let text = "# docker\nnameserver 127.0.0.11\nsearch x\noptions ndots:0\nnameserver  ::1\nnameserver fe80::1%eth0\nnameserver\n";
        assert_eq!(nameservers(text), vec!["127.0.0.11:53".parse().expect("a"), "[::1]:53".parse().expect("b")]);
    }
}
