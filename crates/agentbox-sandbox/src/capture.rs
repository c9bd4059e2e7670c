//! Bounded output capture: the first bytes, the last bytes, and a count of what fell between.
//!
//! Failures are usually at the end of a log and the command line that caused them at the start,
//! so both ends are kept. Memory stays at `head + tail` whatever the command prints.

use std::collections::VecDeque;

/// What was kept of one output stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
    /// Bytes the command wrote in all.
    pub total: u64,
}

impl Captured {
    /// Everything, when nothing was cut.
    pub fn complete(bytes: Vec<u8>) -> Self {
        let total = bytes.len() as u64;
        Captured {
            head: bytes,
            tail: Vec::new(),
            total,
        }
    }

    pub fn cut(&self) -> u64 {
        self.total
            .saturating_sub((self.head.len() + self.tail.len()) as u64)
    }

    pub fn truncated(&self) -> bool {
        self.cut() > 0
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The bytes when complete, `None` when some were cut.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        if self.truncated() {
            return None;
        }
        let mut all = self.head.clone();
        all.extend_from_slice(&self.tail);
        Some(all)
    }

    /// Lossy UTF-8 with a marker where bytes were cut.
    pub fn to_text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.truncated() {
            if !text.ends_with('\n') && !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!(
                "[... {} cut: {} of {} bytes shown (first {}, last {}) ...]\n",
                human_bytes(self.cut()),
                self.head.len() + self.tail.len(),
                self.total,
                self.head.len(),
                self.tail.len()
            ));
        }
        text.push_str(&String::from_utf8_lossy(&self.tail));
        text
    }

    /// What was written from byte `offset` on, as far as it was kept: the part of the head past
    /// it, and the tail, with what fell between (or was cut) counted.
    pub fn since(&self, offset: u64) -> Captured {
        let offset = offset.min(self.total);
        let head_len = self.head.len() as u64;
        let tail_start = self.total - self.tail.len() as u64;
        Captured {
            head: self.head[offset.min(head_len) as usize..].to_vec(),
            tail: self.tail[offset.saturating_sub(tail_start).min(self.tail.len() as u64) as usize..]
                .to_vec(),
            total: self.total - offset,
        }
    }

    /// Re-cut to smaller bounds (e.g. a tool that shows the model less than was captured).
    pub fn shrink(&self, head: usize, tail: usize) -> Captured {
        let mut ht = HeadTail::new(head, tail);
        ht.push(&self.head);
        let skipped = self.cut();
        ht.skip(skipped);
        ht.push(&self.tail);
        ht.finish()
    }
}

pub use agentbox_hostfs::human_bytes;

/// Accumulates a stream into a [`Captured`] with bounded memory.
#[derive(Debug)]
pub struct HeadTail {
    head_max: usize,
    tail_max: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    pub fn new(head_max: usize, tail_max: usize) -> Self {
        HeadTail {
            head_max,
            tail_max,
            head: Vec::with_capacity(head_max.min(64 * 1024)),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.head_max.saturating_sub(self.head.len());
        if room > 0 {
            let take = room.min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.is_empty() || self.tail_max == 0 {
            return;
        }
        if data.len() >= self.tail_max {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_max..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_max);
        self.tail.drain(..overflow);
        self.tail.extend(data);
    }

    /// Account for bytes that were seen but not kept (they fall between head and tail).
    /// What was kept in the tail before the gap is not contiguous with what follows, so it goes.
    fn skip(&mut self, n: u64) {
        if n > 0 {
            self.total += n;
            self.tail.clear();
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn finish(self) -> Captured {
        Captured {
            head: self.head,
            tail: self.tail.into(),
            total: self.total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_keeps_only_what_came_after_the_offset() {
        // "abcd" ... "nop" of 16 bytes (e..m cut).
        let c = Captured {
            head: b"abcd".to_vec(),
            tail: b"nop".to_vec(),
            total: 16,
        };
        let all = c.since(0);
        assert_eq!(all, c);
        let mid_head = c.since(2);
        assert_eq!(
            (&mid_head.head[..], &mid_head.tail[..], mid_head.total),
            (&b"cd"[..], &b"nop"[..], 14)
        );
        assert_eq!(mid_head.cut(), 9);
        let in_cut = c.since(6);
        assert_eq!(
            (&in_cut.head[..], &in_cut.tail[..], in_cut.total),
            (&b""[..], &b"nop"[..], 10)
        );
        assert_eq!(in_cut.cut(), 7);
        let in_tail = c.since(14);
        assert_eq!(in_tail.bytes().unwrap(), b"op");
        assert!(c.since(16).is_empty());
        assert!(c.since(99).is_empty());
        let whole = Captured::complete(b"hello world".to_vec());
        assert_eq!(whole.since(6).bytes().unwrap(), b"world");
    }

    #[test]
    fn keeps_everything_under_the_bounds() {
        let mut ht = HeadTail::new(10, 10);
        ht.push(b"hello ");
        ht.push(b"world");
        let c = ht.finish();
        assert!(!c.truncated());
        assert_eq!(c.bytes().unwrap(), b"hello world");
        assert_eq!(c.to_text(), "hello world");
    }

    #[test]
    fn keeps_head_and_tail_and_counts_the_cut() {
        let mut ht = HeadTail::new(4, 3);
        for chunk in [&b"abcdef"[..], b"ghij", b"klmnop"] {
            ht.push(chunk);
        }
        let c = ht.finish();
        assert_eq!(c.head, b"abcd");
        assert_eq!(c.tail, b"nop");
        assert_eq!(c.total, 16);
        assert_eq!(c.cut(), 9);
        assert!(c.bytes().is_none());
        let text = c.to_text();
        assert!(text.starts_with("abcd\n[... 9 bytes cut"), "{text}");
        assert!(text.ends_with("...]\nnop"), "{text}");
    }

    #[test]
    fn a_chunk_larger_than_the_tail_keeps_its_end() {
        let mut ht = HeadTail::new(0, 3);
        ht.push(b"xy");
        ht.push(b"0123456789");
        assert_eq!(ht.finish().tail, b"789");
    }

    #[test]
    fn memory_stays_bounded_for_large_streams() {
        let mut ht = HeadTail::new(1024, 1024);
        let chunk = vec![b'a'; 64 * 1024];
        for _ in 0..1024 {
            ht.push(&chunk);
        }
        assert_eq!(ht.total(), 64 * 1024 * 1024);
        let c = ht.finish();
        assert_eq!(c.head.len() + c.tail.len(), 2048);
    }

    #[test]
    fn shrink_recuts_with_the_right_count() {
        let c = Captured::complete(b"0123456789".to_vec());
        let s = c.shrink(2, 3);
        assert_eq!(s.head, b"01");
        assert_eq!(s.tail, b"789");
        assert_eq!(s.total, 10);
        let mut ht = HeadTail::new(3, 3);
        ht.push(b"abcdefghijklmnop");
        let s = ht.finish().shrink(2, 2);
        assert_eq!(
            (s.head.as_slice(), s.tail.as_slice(), s.total),
            (&b"ab"[..], &b"op"[..], 16)
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(12), "12 bytes");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }
}
