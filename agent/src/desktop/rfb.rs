//! The client-to-server half of an RFB (VNC) connection, read message by message, so that input
//! reaches the display only from a person who holds the input lease: a viewer's pointer, key,
//! clipboard and resize messages are dropped here, on the server side, whatever the viewer's
//! own flag says. A message this filter does not know closes the stream (it cannot tell where
//! the next one starts, and guessing could let input through).
//!
//! The handshake passes as it is: the version (12 bytes), the client's choice of security type
//! (1 byte; RFB 3.7 and 3.8), and ClientInit (1 byte). The server side (x11vnc on the agent's
//! own socket) offers only `None`, so no security reply follows.
//!
//! Only the three published versions pass: `003.003`, `003.007` and `003.008`. A server reads
//! the others by rules of its own (libvncserver treats every 3.x below 3.7 as 3.3, with no
//! security byte from the client), and a filter that read them otherwise would be a byte out of
//! step with the server from then on: a message it passes as harmless would reach the server as
//! keys. So the filter refuses what it would have to guess at. It is not the only wall: a `view`
//! stream's x11vnc runs with `-viewonly` (see [`super::stream`]).

/// What a message is, for the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Handshake or a request for pixels: always passes.
    Neutral,
    /// Changes the desktop (pointer, keys, clipboard, screen size): passes only with the lease.
    Input,
}

/// One complete piece of the client's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Its class.
    pub class: Class,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Version,
    Security,
    Init,
    Messages,
}

/// The filter's state: bytes not yet making a whole piece.
#[derive(Debug)]
pub struct ClientStream {
    stage: Stage,
    /// RFB 3.3: the server picks the security type; the client sends no byte for it.
    old: bool,
    buf: Vec<u8>,
}

impl Default for ClientStream {
    fn default() -> Self {
        Self { stage: Stage::Version, old: false, buf: Vec::new() }
    }
}

/// The versions a client may speak: the three the protocol publishes, read as the server reads
/// them.
const VERSIONS: [&[u8]; 3] = [b"RFB 003.003\n", b"RFB 003.007\n", b"RFB 003.008\n"];

/// The largest message the filter holds while it waits for the rest (a clipboard text).
pub const MAX_MESSAGE: usize = 1 << 20;

impl ClientStream {
    /// Takes bytes from the client; answers the whole pieces they complete, in order, or why the
    /// stream must close.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Piece>, String> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(len) = self.next_len()? {
            if self.buf.len() < len {
                break;
            }
            let bytes: Vec<u8> = self.buf.drain(..len).collect();
            let class = match self.stage {
                Stage::Version => {
                    self.old = bytes == b"RFB 003.003\n";
                    self.stage = if self.old { Stage::Init } else { Stage::Security };
                    Class::Neutral
                }
                Stage::Security => {
                    if bytes[0] != 1 {
                        return Err(format!("security type {} is not offered", bytes[0]));
                    }
                    self.stage = Stage::Init;
                    Class::Neutral
                }
                Stage::Init => {
                    self.stage = Stage::Messages;
                    Class::Neutral
                }
                Stage::Messages => classify(bytes[0]),
            };
            out.push(Piece { class, bytes });
        }
        Ok(out)
    }

    /// The length of the next piece, once enough of it is here to tell (`None`: wait).
    fn next_len(&self) -> Result<Option<usize>, String> {
        let b = &self.buf;
        let need = |n: usize| if b.len() >= n { Some(()) } else { None };
        let len = match self.stage {
            Stage::Version => {
                if need(12).is_none() {
                    return Ok(None);
                }
                let version = &b[..12];
                if !VERSIONS.contains(&version) {
                    return Err(if version.starts_with(b"RFB ") {
                        format!(
                            "RFB version {:?} is not accepted (only 003.003, 003.007 and 003.008)",
                            String::from_utf8_lossy(&version[4..11])
                        )
                    } else {
                        "not an RFB client".into()
                    });
                }
                12
            }
            Stage::Security | Stage::Init => 1,
            Stage::Messages => {
                let Some(&kind) = b.first() else { return Ok(None) };
                let at = |i: usize| b.get(i).copied().map(usize::from);
                let u16_at = |i: usize| Some(at(i)? << 8 | at(i + 1)?);
                let u32_at = |i: usize| Some(u16_at(i)? << 16 | u16_at(i + 2)?);
                let len = match kind {
                    0 => Some(20),                     // SetPixelFormat
                    2 => u16_at(2).map(|n| 4 + 4 * n), // SetEncodings
                    3 => Some(10),                     // FramebufferUpdateRequest
                    4 => Some(8),                      // KeyEvent
                    5 => Some(6),                      // PointerEvent
                    // ClientCutText; a negative length is the extended clipboard's (its size is -n).
                    6 => u32_at(4).map(|n| 8 + (n as u32 as i32).unsigned_abs() as usize),
                    150 => Some(10),                  // EnableContinuousUpdates
                    248 => at(8).map(|n| 9 + n),      // ClientFence
                    251 => at(6).map(|n| 8 + 16 * n), // SetDesktopSize
                    255 => match at(1) {
                        // QEMU
                        None => None,
                        Some(0) => Some(12), // extended KeyEvent
                        Some(sub) => return Err(format!("QEMU message {sub} is not supported")),
                    },
                    k => return Err(format!("RFB message type {k} is not supported")),
                };
                match len {
                    Some(n) if n > MAX_MESSAGE => return Err(format!("an RFB message of {n} bytes")),
                    Some(n) => n,
                    None => return Ok(None),
                }
            }
        };
        Ok(Some(len))
    }
}

fn classify(kind: u8) -> Class {
    match kind {
        4 | 5 | 6 | 251 | 255 => Class::Input,
        _ => Class::Neutral,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_then_messages_are_split_and_classed_whatever_the_chunks() {
        let mut stream = Vec::new();
        stream.extend_from_slice(b"RFB 003.008\n");
        stream.push(1); // security None
        stream.push(1); // ClientInit, shared
        stream.extend_from_slice(&[2, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7]); // SetEncodings, 2
        stream.extend_from_slice(&[3, 0, 0, 0, 0, 0, 4, 0, 3, 0]); // update request
        stream.extend_from_slice(&[5, 1, 0, 10, 0, 20]); // pointer
        stream.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0, 0x61]); // key
        stream.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 3, b'a', b'b', b'c']); // clipboard
        stream.extend_from_slice(&[248, 0, 0, 0, 0, 0, 0, 1, 2, 9, 9]); // fence with 2 bytes
        stream.extend_from_slice(&[6, 0, 0, 0, 0xff, 0xff, 0xff, 0xfc, 1, 2, 3, 4]); // extended clipboard, 4 bytes
        for chunk in [1usize, 3, 7, 64] {
            let mut f = ClientStream::default();
            let mut pieces = Vec::new();
            for c in stream.chunks(chunk) {
                pieces.extend(f.push(c).expect("valid"));
            }
            let classes: Vec<Class> = pieces.iter().map(|p| p.class).collect();
            use Class::*;
            assert_eq!(classes, vec![Neutral, Neutral, Neutral, Neutral, Neutral, Input, Input, Input, Neutral, Input]);
            let joined: Vec<u8> = pieces.iter().flat_map(|p| p.bytes.clone()).collect();
            assert_eq!(joined, stream, "every byte in order, chunks of {chunk}");
        }
    }

    #[test]
    fn unknown_messages_and_other_security_close_the_stream() {
        let mut f = ClientStream::default();
        f.push(b"RFB 003.008\n\x01\x01").expect("handshake");
        assert!(f.push(&[77]).is_err());
        let mut g = ClientStream::default();
        assert!(g.push(b"RFB 003.008\n\x02").is_err(), "VNC auth is not offered");
        assert!(ClientStream::default().push(b"GET / HTTP/1.1\r\n").is_err());
        let mut big = ClientStream::default();
        big.push(b"RFB 003.008\n\x01\x01").expect("handshake");
        assert!(big.push(&[6, 0, 0, 0, 0x10, 0, 0, 0]).is_err(), "a 256 MiB clipboard");
        let mut old = ClientStream::default();
        let p = old.push(b"RFB 003.003\n\x01\x05\x00\x00\x01\x00\x01").expect("3.3");
        assert_eq!(p.iter().map(|p| p.class).collect::<Vec<_>>(), vec![Class::Neutral, Class::Neutral, Class::Input]);
    }

    /// Issue 36, item 1: a client that says 3.5 sends no security byte to libvncserver, which
    /// reads 3.x below 3.7 as 3.3; a filter that read it as 3.7 was a byte behind the server.
    /// Every version but the three published ones is refused before a byte reaches the server.
    #[test]
    fn i36_1_only_the_published_versions_pass() {
        for minor in 0..=9u32 {
            let version = format!("RFB 003.00{minor}\n");
            let got = ClientStream::default().push(version.as_bytes());
            match minor {
                3 | 7 | 8 => assert_eq!(got.expect(&version).len(), 1, "{version}"),
                _ => assert!(got.is_err(), "{version} passed"),
            }
        }
        for other in ["RFB 003.889\n", "RFB 004.000\n", "RFB 003.0085", "RFB 003.008\r"] {
            assert!(ClientStream::default().push(other.as_bytes()).is_err(), "{other:?} passed");
        }
        // In 3.3 no security byte follows: the byte after the version is ClientInit, and the
        // message after it is classed where the server reads it.
        let mut f = ClientStream::default();
        let p = f.push(b"RFB 003.003\n\x02\x02\x02\x00\x00\x04\x01\x00\x00\x00\x00\x00\x5a").expect("3.3");
        let classes: Vec<Class> = p.iter().map(|p| p.class).collect();
        assert_eq!(classes, vec![Class::Neutral, Class::Neutral, Class::Neutral, Class::Input]);
    }
}
