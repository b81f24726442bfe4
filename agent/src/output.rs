//! A bounded output buffer with absolute offsets: readers ask for output from an offset and get
//! at most `max` bytes (the tail, marked truncated), never a split UTF-8 character.

use std::collections::VecDeque;

/// What one read answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The text (invalid UTF-8 from the program is replaced, never split).
    pub text: String,
    /// Output was skipped: more than `max` new bytes, or dropped from the buffer.
    pub truncated: bool,
    /// The offset after this chunk.
    pub offset: u64,
}

/// The buffer.
#[derive(Debug)]
pub struct OutputBuf {
    data: VecDeque<u8>,
    /// Absolute offset of `data[0]`.
    start: u64,
    /// Where the next read without an explicit offset starts.
    cursor: u64,
    cap: usize,
}

/// How many bytes at the end of `b` form an incomplete UTF-8 character.
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(4) {
        let byte = b[b.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte
        }
        let need = match byte {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 1,
        };
        return if need > back { back } else { 0 };
    }
    0
}

impl OutputBuf {
    /// A buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self { data: VecDeque::new(), start: 0, cursor: 0, cap }
    }

    /// Appends program output, dropping the oldest bytes past the capacity.
    pub fn push(&mut self, bytes: &[u8]) {
        self.data.extend(bytes);
        while self.data.len() > self.cap {
            let drop = self.data.len() - self.cap;
            self.data.drain(..drop);
            self.start += drop as u64;
        }
    }

    /// The offset after the last byte.
    pub fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    /// Reads new output from `from` (default: the cursor). Unless `done`, an incomplete character
    /// at the end is held back for the next read.
    pub fn read(&mut self, from: Option<u64>, max: usize, done: bool) -> Chunk {
        let chunk = self.peek(from.unwrap_or(self.cursor), max, done);
        self.cursor = chunk.offset;
        chunk
    }

    /// Like [`OutputBuf::read`] from `asked`, without moving the cursor.
    pub fn peek(&self, asked: u64, max: usize, done: bool) -> Chunk {
        let from = asked.clamp(self.start, self.end());
        let (a, b) = self.data.as_slices();
        let all: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        let mut stop = all.len();
        if !done {
            stop -= incomplete_tail(&all);
        }
        let begin = (from - self.start) as usize;
        let mut truncated = asked < self.start;
        let mut take_from = begin.min(stop);
        if stop - take_from > max {
            take_from = stop - max;
            truncated = true;
        }
        let mut skip = 0;
        while take_from + skip < stop && skip < 3 && all[take_from + skip] & 0b1100_0000 == 0b1000_0000 {
            skip += 1;
        }
        take_from += skip;
        let text = String::from_utf8_lossy(&all[take_from..stop]).into_owned();
        let offset = self.start + stop as u64;
        Chunk { text, truncated, offset }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_of_too_much_output_is_truncated_on_a_char_boundary() {
        let mut b = OutputBuf::new(1 << 20);
        b.push("ééééé".as_bytes()); // 10 bytes
        let c = b.read(None, 5, true);
        assert!(c.truncated);
        assert_eq!(c.text, "éé", "5 bytes of tail, starting on a boundary");
        assert_eq!(c.offset, 10);
        assert_eq!(b.read(None, 100, true).text, "");
    }

    #[test]
    fn an_incomplete_character_is_held_back_until_it_completes() {
        let mut b = OutputBuf::new(1 << 20);
        let euro = "€".as_bytes(); // 3 bytes
        b.push(b"a");
        b.push(&euro[..2]);
        let first = b.read(None, 100, false);
        assert_eq!((first.text.as_str(), first.offset), ("a", 1));
        b.push(&euro[2..]);
        assert_eq!(b.read(None, 100, false).text, "€");
    }

    #[test]
    fn rereading_from_an_offset_and_dropped_output() {
        let mut b = OutputBuf::new(4);
        b.push(b"abcdef");
        let c = b.read(Some(0), 100, true);
        assert_eq!((c.text.as_str(), c.truncated), ("cdef", true));
        let again = b.read(Some(4), 100, true);
        assert_eq!((again.text.as_str(), again.truncated), ("ef", false));
    }
}
