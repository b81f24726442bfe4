//! A reader of server-sent events from a streamed answer (only what computerd sends: `id`,
//! `event`, `data`, `retry`; comments and keep-alives are skipped).

/// One event.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// `id:`
    pub id: String,
    /// `event:` (`message` when absent).
    pub event: String,
    /// `data:` lines joined with `\n`.
    pub data: String,
}

/// Events as they arrive.
pub struct Reader {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Reader {
    /// Reads `resp`'s body.
    pub fn new(resp: reqwest::Response) -> Self {
        Reader { resp, buf: Vec::new() }
    }

    /// The next event; `None` when the answer ended.
    pub async fn next(&mut self) -> Result<Option<Event>, reqwest::Error> {
        loop {
            if let Some(ev) = take_event(&mut self.buf) {
                if ev.data.is_empty() && ev.event.is_empty() {
                    continue; // a `retry:` or a comment
                }
                return Ok(Some(ev));
            }
            match self.resp.chunk().await? {
                Some(c) => self.buf.extend_from_slice(&c),
                None => return Ok(None),
            }
        }
    }
}

/// Takes the first whole event (up to a blank line) out of `buf`.
fn take_event(buf: &mut Vec<u8>) -> Option<Event> {
    let end = buf.windows(2).position(|w| w == b"\n\n")?;
    let block: Vec<u8> = buf.drain(..end + 2).collect();
    let text = String::from_utf8_lossy(&block);
    let mut ev = Event::default();
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines() {
        let (field, value) =
            line.split_once(':').map(|(f, v)| (f, v.strip_prefix(' ').unwrap_or(v))).unwrap_or((line, ""));
        match field {
            "id" => ev.id = value.to_string(),
            "event" => ev.event = value.to_string(),
            "data" => data.push(value),
            _ => {}
        }
    }
    ev.data = data.join("\n");
    if !ev.data.is_empty() && ev.event.is_empty() {
        ev.event = "message".into();
    }
    Some(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_at_blank_lines() {
        let mut buf = b"retry: 100\n\nid: 5\nevent: output\ndata: {\"a\":1}\n\n: keep\n\nid: 9\nevent: en".to_vec();
        assert_eq!(take_event(&mut buf), Some(Event::default()));
        let ev = take_event(&mut buf).expect("an event");
        assert_eq!((ev.id.as_str(), ev.event.as_str(), ev.data.as_str()), ("5", "output", "{\"a\":1}"));
        assert_eq!(take_event(&mut buf), Some(Event::default()));
        assert_eq!(take_event(&mut buf), None, "half an event waits for the rest");
        buf.extend_from_slice(b"d\ndata: x\ndata: y\n\n");
        let ev = take_event(&mut buf).expect("the rest");
        assert_eq!((ev.event.as_str(), ev.data.as_str()), ("end", "x\ny"));
    }
}
