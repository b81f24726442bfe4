//! Reading the name a connection carries from its first bytes: the SNI of a TLS ClientHello, or
//! the `Host` of an HTTP/1.x request. Everything here parses bytes the sandbox sent, so nothing
//! indexes without a bound check and nothing panics: bytes that do not parse carry no name.
//!
//! [`sniff`] is called again with every read appended, and says [`Sniff::More`] while the bytes
//! so far could still become a name (a ClientHello split across TCP reads or TLS records, a
//! request whose headers have not ended). The caller stops at [`MAX_SNIFF`] bytes or its
//! deadline and then takes the connection as one without a name.

/// The most bytes read from a connection before it is decided.
pub const MAX_SNIFF: usize = 16 * 1024;

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniff {
    /// Not enough bytes yet to tell.
    More,
    /// Told: the name the connection carries (lower case, no port, no trailing dot), if any, and
    /// whether it is an HTTP/1.x request (a refusal is then answered `403`).
    Done {
        /// The SNI or `Host`; `None` for another protocol, a ClientHello without SNI, a request
        /// without `Host`, or a name that is not a plain host name.
        name: Option<String>,
        /// The bytes are an HTTP/1.x request.
        http: bool,
    },
}

impl Sniff {
    fn none() -> Sniff {
        Sniff::Done { name: None, http: false }
    }
}

/// Tells what `buf` (the connection's bytes so far) carries.
pub fn sniff(buf: &[u8]) -> Sniff {
    match buf.first() {
        None => Sniff::More,
        Some(0x16) => tls(buf),
        Some(_) => http(buf),
    }
}

// TLS

/// The TLS record header's length.
const RECORD_HEADER: usize = 5;
/// The largest TLS record payload (2^14, plus the expansion TLS 1.2 allows a ciphertext).
const MAX_RECORD: usize = 16384 + 2048;

/// The ClientHello's SNI. Handshake records are joined first: a ClientHello may span records.
fn tls(buf: &[u8]) -> Sniff {
    let mut handshake = Vec::new();
    let mut at = 0;
    let mut complete = true;
    while at < buf.len() {
        let Some(header) = buf.get(at..at + RECORD_HEADER) else {
            complete = false;
            break;
        };
        // A handshake record of TLS 1.0 to 1.3 (the record layer says 3.1 or 3.3, sometimes 3.0).
        if header[0] != 0x16 || header[1] != 3 {
            break;
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Sniff::none();
        }
        let start = at + RECORD_HEADER;
        match buf.get(start..start + len) {
            Some(payload) => handshake.extend_from_slice(payload),
            None => {
                handshake.extend_from_slice(buf.get(start..).unwrap_or_default());
                complete = false;
                break;
            }
        }
        at = start + len;
    }
    match client_hello_sni(&handshake) {
        Parsed::Done(name) => Sniff::Done { name, http: false },
        Parsed::Short if !complete || at >= buf.len() => Sniff::More,
        // A record of another type came before the ClientHello ended.
        Parsed::Short => Sniff::none(),
    }
}

/// The outcome of parsing a prefix.
enum Parsed<T> {
    Done(T),
    /// The bytes end before the answer: more may tell.
    Short,
}

/// A bounds-checked reader over a prefix of a message.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3).map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

/// The SNI of the ClientHello at the start of `hs` (handshake messages, joined). A ClientHello
/// cut short still answers when the server_name extension is whole before the cut.
fn client_hello_sni(hs: &[u8]) -> Parsed<Option<String>> {
    // Any `None` from the reader below is the bytes ending early.
    let mut r = Reader::new(hs);
    let Some(kind) = r.u8() else { return Parsed::Short };
    if kind != 1 {
        return Parsed::Done(None);
    }
    let Some(len) = r.u24() else { return Parsed::Short };
    // The body as far as it arrived (and never past the message's end).
    let body = &hs[4.min(hs.len())..hs.len().min(4 + len)];
    let whole = body.len() == len;
    let mut r = Reader::new(body);
    let short = || if whole { Parsed::Done(None) } else { Parsed::Short };
    // legacy_version, random.
    if r.take(2 + 32).is_none() {
        return short();
    }
    let Some(sid) = r.u8() else { return short() };
    if r.take(usize::from(sid)).is_none() {
        return short();
    }
    let Some(suites) = r.u16() else { return short() };
    if r.take(usize::from(suites)).is_none() {
        return short();
    }
    let Some(comp) = r.u8() else { return short() };
    if r.take(usize::from(comp)).is_none() {
        return short();
    }
    // No extensions at all: no SNI.
    let Some(ext_len) = r.u16() else { return short() };
    let ext_end = r.at + usize::from(ext_len);
    while r.at < ext_end {
        let (Some(kind), Some(len)) = (r.u16(), r.u16()) else { return short() };
        let Some(data) = r.take(usize::from(len)) else { return short() };
        if kind == 0 {
            return Parsed::Done(server_name(data));
        }
    }
    Parsed::Done(None)
}

/// The host name of a server_name extension's list (`None` when it holds no host name, more
/// than one, or one that is not a plain host name).
fn server_name(data: &[u8]) -> Option<String> {
    let mut r = Reader::new(data);
    let list = r.u16()?;
    let mut list = Reader::new(r.take(usize::from(list))?);
    let mut found = None;
    while list.at < list.buf.len() {
        let kind = list.u8()?;
        let len = list.u16()?;
        let name = list.take(usize::from(len))?;
        if kind == 0 {
            if found.is_some() {
                return None;
            }
            found = Some(host_name(name)?);
        }
    }
    found
}

// HTTP

/// The longest method token read before the space after it.
const MAX_METHOD: usize = 32;

/// The `Host` of an HTTP/1.x request (the authority of an absolute-form target wins, as for the
/// server; a `Host` that differs from it, or two `Host` headers, make the name unknown).
fn http(buf: &[u8]) -> Sniff {
    let method_len = buf.iter().take(MAX_METHOD + 1).position(|b| *b == b' ');
    let Some(method_len) = method_len else {
        let token = buf.iter().take(MAX_METHOD).all(|b| is_tchar(*b));
        return if token && buf.len() <= MAX_METHOD { Sniff::More } else { Sniff::none() };
    };
    if method_len == 0 || !buf[..method_len].iter().all(|b| is_tchar(*b)) {
        return Sniff::none();
    }
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        // Stop at once when the request line is there and is not HTTP/1.x.
        if let Some(line_end) = find(buf, b"\r\n")
            && request_target(&buf[..line_end]).is_none()
        {
            return Sniff::none();
        }
        return Sniff::More;
    };
    let head = &buf[..head_end];
    let mut lines = head.split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let Some(target) = lines.next().and_then(request_target) else { return Sniff::none() };
    let mut host: Option<Option<String>> = None;
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else { continue };
        if !line[..colon].eq_ignore_ascii_case(b"host") {
            continue;
        }
        if host.is_some() {
            return Sniff::Done { name: None, http: true };
        }
        host = Some(authority_host(trim(&line[colon + 1..])));
    }
    let host = host.flatten();
    let name = match absolute_authority(target) {
        Some(authority) => {
            let a = authority_host(authority);
            match (&a, &host) {
                (Some(a), Some(h)) if a != h => None,
                _ => a,
            }
        }
        None => host,
    };
    Sniff::Done { name, http: true }
}

/// The request target of an HTTP/1.x request line (`METHOD SP target SP HTTP/1.x`).
fn request_target(line: &[u8]) -> Option<&[u8]> {
    let mut parts = line.split(|b| *b == b' ');
    let _method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if parts.next().is_some() || target.is_empty() || !version.starts_with(b"HTTP/1.") {
        return None;
    }
    Some(target)
}

/// The authority of an absolute-form target (`http://host:port/path`), if it is one.
fn absolute_authority(target: &[u8]) -> Option<&[u8]> {
    let scheme_end = find(target, b"://")?;
    if scheme_end == 0 || !target[..scheme_end].iter().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b)) {
        return None;
    }
    let rest = &target[scheme_end + 3..];
    let end = rest.iter().position(|b| b"/?#".contains(b)).unwrap_or(rest.len());
    let authority = &rest[..end];
    // Userinfo is not part of the host.
    Some(match authority.iter().rposition(|b| *b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    })
}

/// The host of `host[:port]` or `[v6]:port`, checked.
fn authority_host(a: &[u8]) -> Option<String> {
    if let Some(rest) = a.strip_prefix(b"[") {
        let close = rest.iter().position(|b| *b == b']')?;
        let after = &rest[close + 1..];
        if !(after.is_empty() || after.strip_prefix(b":").is_some_and(|p| p.iter().all(u8::is_ascii_digit))) {
            return None;
        }
        let lit = std::str::from_utf8(&rest[..close]).ok()?;
        return lit.parse::<std::net::Ipv6Addr>().ok().map(|ip| ip.to_string());
    }
    let host = match a.iter().rposition(|b| *b == b':') {
        Some(colon) if a[colon + 1..].iter().all(u8::is_ascii_digit) => &a[..colon],
        Some(_) => return None,
        None => a,
    };
    host_name(host)
}

/// A host name (or an IPv4 literal) as sent, lower case and without a trailing dot, if it is one:
/// letters, digits, hyphens, underscores and dots, 1 to 253 long.
fn host_name(b: &[u8]) -> Option<String> {
    let b = b.strip_suffix(b".").unwrap_or(b);
    let ok = (1..=253).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && !b.starts_with(b".")
        && !b.windows(2).any(|w| w == b"..");
    ok.then(|| String::from_utf8_lossy(b).to_ascii_lowercase())
}

/// A `tchar` of RFC 9110 (the characters of a method token).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| *c != b' ' && *c != b'\t').unwrap_or(b.len());
    let end = b.iter().rposition(|c| *c != b' ' && *c != b'\t').map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn done(name: Option<&str>, http: bool) -> Sniff {
        Sniff::Done { name: name.map(str::to_string), http }
    }

    /// A real ClientHello: what a rustls client writes first for `name`.
    fn rustls_hello(name: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).expect("a name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("a client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("written");
        }
        out
    }

    /// A ClientHello built by hand: one record, the given extensions.
    fn hand_hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one suite
        body.extend([1, 0]); // null compression
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend(kind.to_be_bytes());
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
        }
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut hs = vec![1];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    fn sni_ext(names: &[(u8, &str)]) -> (u16, Vec<u8>) {
        let mut list = Vec::new();
        for (kind, n) in names {
            list.push(*kind);
            list.extend((n.len() as u16).to_be_bytes());
            list.extend(n.as_bytes());
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend(list);
        (0, data)
    }

    #[test]
    fn a_real_client_hello_gives_its_sni() {
        let hello = rustls_hello("Allowed.Test");
        assert_eq!(hello[0], 0x16);
        assert_eq!(sniff(&hello), done(Some("allowed.test"), false));
    }

    #[test]
    fn a_client_hello_split_across_reads_is_read_to_its_sni() {
        let hello = rustls_hello("pypi.org");
        // Before the extensions nothing can tell; after, the name is known once its extension is
        // whole (a hello cut later still gives it).
        for cut in 1..5 + 4 + 2 + 32 {
            assert_eq!(sniff(&hello[..cut]), Sniff::More, "cut at {cut}");
        }
        for cut in 1..hello.len() {
            let s = sniff(&hello[..cut]);
            assert!(s == Sniff::More || s == done(Some("pypi.org"), false), "cut at {cut}: {s:?}");
        }
        assert_eq!(sniff(&hello), done(Some("pypi.org"), false));
    }

    #[test]
    fn a_client_hello_split_across_records_is_joined() {
        let one = hand_hello(&[(0x000a, vec![0, 2, 0, 0x1d]), sni_ext(&[(0, "a.example.com")])]);
        let hs = &one[5..];
        let (a, b) = hs.split_at(10);
        let mut two = Vec::new();
        for part in [a, b] {
            two.extend([0x16, 3, 3]);
            two.extend((part.len() as u16).to_be_bytes());
            two.extend(part);
        }
        assert_eq!(sniff(&two[..5 + a.len()]), Sniff::More);
        assert_eq!(sniff(&two[..5 + a.len() + 7]), Sniff::More);
        assert_eq!(sniff(&two), done(Some("a.example.com"), false));
    }

    #[test]
    fn hand_built_hellos_without_a_plain_name_carry_none() {
        assert_eq!(sniff(&hand_hello(&[])), done(None, false), "no extensions");
        assert_eq!(sniff(&hand_hello(&[(0x000a, vec![0, 0])])), done(None, false), "no SNI");
        assert_eq!(sniff(&hand_hello(&[sni_ext(&[(0, "a.test"), (0, "b.test")])])), done(None, false), "two names");
        assert_eq!(sniff(&hand_hello(&[sni_ext(&[(0, "bad name")])])), done(None, false));
        assert_eq!(sniff(&hand_hello(&[sni_ext(&[(1, "x"), (0, "b.test")])])), done(Some("b.test"), false));
        // A handshake record then another record type before the hello ended: no name.
        let hello = hand_hello(&[sni_ext(&[(0, "a.test")])]);
        let mut cut = hello[..20].to_vec();
        cut[3..5].copy_from_slice(&15u16.to_be_bytes());
        cut.extend([0x17, 3, 3, 0, 1, 0]);
        assert_eq!(sniff(&cut), done(None, false));
    }

    #[test]
    fn http_hosts() {
        let get = |s: &str| sniff(s.as_bytes());
        assert_eq!(get("GET / HTTP/1.1\r\nHost: Allowed.Test:8080\r\n\r\n"), done(Some("allowed.test"), true));
        assert_eq!(get("GET / HTTP/1.1\r\nhost:other.test\r\nAccept: */*\r\n\r\n"), done(Some("other.test"), true));
        assert_eq!(get("POST /x HTTP/1.0\r\nX: y\r\nHOST:  a.test.  \r\n\r\nbody"), done(Some("a.test"), true));
        assert_eq!(get("GET http://proxy.test:81/a?b HTTP/1.1\r\n\r\n"), done(Some("proxy.test"), true));
        assert_eq!(get("GET http://u@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"), done(Some("a.test"), true));
        assert_eq!(get("GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n"), done(None, true), "conflicting");
        assert_eq!(get("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"), done(None, true), "two hosts");
        assert_eq!(get("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"), done(Some("::1"), true));
        assert_eq!(get("GET / HTTP/1.1\r\nHost: 203.0.113.7\r\n\r\n"), done(Some("203.0.113.7"), true));
        assert_eq!(get("GET / HTTP/1.1\r\nUser-Agent: x\r\n\r\n"), done(None, true), "no host");
        assert_eq!(get("GET / HTTP/1.1\r\nHost: a.test\r\n"), Sniff::More, "headers not ended");
        assert_eq!(get("GE"), Sniff::More);
        assert_eq!(get("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), done(None, false), "not HTTP/1.x");
        assert_eq!(get("SSH-2.0-OpenSSH_9.6\r\n"), done(None, false));
    }

    #[test]
    fn garbage_and_truncations_never_panic() {
        assert_eq!(sniff(b""), Sniff::More);
        assert_eq!(sniff(b"\x00\x01\x02garbage"), done(None, false));
        assert_eq!(sniff(&[0x16, 9, 9, 0, 4, 1, 0, 0, 0]), done(None, false), "not TLS 3.x");
        assert_eq!(sniff(&[0x16, 3, 1, 0, 0]), done(None, false), "an empty record");
        let hello = rustls_hello("pypi.org");
        let hand = hand_hello(&[sni_ext(&[(0, "a.test")])]);
        let http = b"GET http://a.test/ HTTP/1.1\r\nHost: a.test:1\r\n\r\n".to_vec();
        for input in [hello, hand, http] {
            for cut in 0..input.len() {
                let _ = sniff(&input[..cut]);
                let mut bad = input.clone();
                bad[cut] ^= 0xff;
                let _ = sniff(&bad);
                bad[cut] = 0xff;
                let _ = sniff(&bad);
            }
        }
        // Lengths that claim more than is there, at every level.
        let mut lying = hand_hello(&[sni_ext(&[(0, "a.test")])]);
        let n = lying.len();
        lying[n - 8] = 0xff;
        let _ = sniff(&lying);
        let _ = sniff(&[0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]);
    }
}
