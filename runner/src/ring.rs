//! A per-stream ring of the latest output: it keeps at most `capacity` bytes, grows only
//! as output arrives (an idle process costs nothing), and counts every byte ever produced
//! so readers address the stream by absolute offsets.

use std::collections::VecDeque;

/// The latest bytes of one output stream.
pub struct Ring {
    data: VecDeque<u8>,
    capacity: usize,
    /// The stream offset one past the last byte produced (bytes ever produced).
    end: u64,
}

impl Ring {
    /// An empty ring that will hold at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Ring { data: VecDeque::new(), capacity, end: 0 }
    }

    /// The offset of the oldest byte still held.
    pub fn start(&self) -> u64 {
        self.end - self.data.len() as u64
    }

    /// The offset one past the newest byte (total bytes produced).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The most bytes the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends produced bytes, dropping the oldest beyond the capacity.
    pub fn push(&mut self, bytes: &[u8]) {
        self.end += bytes.len() as u64;
        if bytes.len() >= self.capacity {
            self.data.clear();
            self.data.extend(&bytes[bytes.len() - self.capacity..]);
            return;
        }
        let overflow = (self.data.len() + bytes.len()).saturating_sub(self.capacity);
        self.data.drain(..overflow);
        self.data.extend(bytes);
    }

    /// Copies up to `max` held bytes starting at `offset` (which must be within
    /// `start()..=end()`).
    pub fn read(&self, offset: u64, max: usize) -> Vec<u8> {
        let start = self.start();
        debug_assert!(offset >= start && offset <= self.end);
        let skip = (offset - start) as usize;
        let take = max.min(self.data.len() - skip);
        let (a, b) = self.data.as_slices();
        let mut out = Vec::with_capacity(take);
        if skip < a.len() {
            let first = take.min(a.len() - skip);
            out.extend_from_slice(&a[skip..skip + first]);
            out.extend_from_slice(&b[..take - first]);
        } else {
            let s = skip - a.len();
            out.extend_from_slice(&b[s..s + take]);
        }
        out
    }

    /// Bytes held in memory now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_bytes_and_counts_all() {
        let mut ring = Ring::new(4);
        ring.push(b"abc");
        assert_eq!((ring.start(), ring.end()), (0, 3));
        ring.push(b"def");
        assert_eq!((ring.start(), ring.end()), (2, 6));
        assert_eq!(ring.read(2, 100), b"cdef");
        assert_eq!(ring.read(4, 1), b"e");
        assert_eq!(ring.read(6, 10), b"");
    }

    #[test]
    fn a_chunk_larger_than_the_ring_keeps_its_tail() {
        let mut ring = Ring::new(3);
        ring.push(b"0123456789");
        assert_eq!((ring.start(), ring.end()), (7, 10));
        assert_eq!(ring.read(7, 10), b"789");
    }

    #[test]
    fn reads_across_the_wrap() {
        let mut ring = Ring::new(5);
        for chunk in [&b"ab"[..], b"cd", b"ef", b"gh", b"i"] {
            ring.push(chunk);
        }
        assert_eq!(ring.start(), 4);
        assert_eq!(ring.read(4, 5), b"efghi");
        assert_eq!(ring.read(5, 3), b"fgh");
        assert!(ring.held() <= 5);
    }

    #[test]
    fn idle_ring_holds_nothing() {
        let ring = Ring::new(64 << 20);
        assert_eq!(ring.held(), 0);
        assert_eq!(ring.end(), 0);
    }
}
