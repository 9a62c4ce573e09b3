//! A per-stream ring of the latest output: it keeps at most `capacity` bytes and counts
//! every byte ever produced, so readers address the stream by absolute offsets (the
//! byte at stream offset `o` lives at index `o % capacity`).
//!
//! The storage is its own anonymous mapping: pages are only backed once output reaches
//! them (an idle process costs nothing), and it is marked MADV_DONTFORK, so the runner's
//! fork of a keeper does not copy the page tables of every ring it holds (a fork's cost
//! would otherwise grow with the output kept). The keeper never touches rings.

/// The latest bytes of one output stream.
pub struct Ring {
    data: *mut u8,
    capacity: usize,
    map_len: usize,
    /// The stream offset one past the last byte produced (bytes ever produced).
    end: u64,
}

impl Ring {
    /// An empty ring that will hold at most `capacity` bytes. If the mapping cannot be
    /// made (no address space), the ring holds nothing: output is counted and dropped.
    pub fn new(capacity: usize) -> Self {
        if capacity == 0 {
            return Ring { data: std::ptr::null_mut(), capacity: 0, map_len: 0, end: 0 };
        }
        let page = 4096;
        let map_len = capacity.div_ceil(page) * page;
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Ring { data: std::ptr::null_mut(), capacity: 0, map_len: 0, end: 0 };
        }
        unsafe { libc::madvise(ptr, map_len, libc::MADV_DONTFORK) };
        Ring { data: ptr.cast(), capacity, map_len, end: 0 }
    }

    /// The offset of the oldest byte still held.
    pub fn start(&self) -> u64 {
        self.end - self.held() as u64
    }

    /// The offset one past the newest byte (total bytes produced).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The most bytes the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.end.min(self.capacity as u64) as usize
    }

    fn slice(&self) -> &[u8] {
        if self.data.is_null() {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(self.data, self.capacity) }
        }
    }

    /// Appends produced bytes, dropping the oldest beyond the capacity.
    pub fn push(&mut self, bytes: &[u8]) {
        let total = bytes.len() as u64;
        if self.capacity > 0 {
            // Only the last `capacity` bytes of the chunk can survive.
            let keep = &bytes[bytes.len().saturating_sub(self.capacity)..];
            let mut offset = self.end + total - keep.len() as u64;
            let buf = unsafe { std::slice::from_raw_parts_mut(self.data, self.capacity) };
            let mut rest = keep;
            while !rest.is_empty() {
                let at = (offset % self.capacity as u64) as usize;
                let n = rest.len().min(self.capacity - at);
                buf[at..at + n].copy_from_slice(&rest[..n]);
                rest = &rest[n..];
                offset += n as u64;
            }
        }
        self.end += total;
    }

    /// Copies up to `max` held bytes starting at `offset` (which must be within
    /// `start()..=end()`).
    pub fn read(&self, offset: u64, max: usize) -> Vec<u8> {
        debug_assert!(offset >= self.start() && offset <= self.end);
        let take = max.min((self.end - offset) as usize);
        let mut out = Vec::with_capacity(take);
        let buf = self.slice();
        let mut offset = offset;
        while out.len() < take {
            let at = (offset % self.capacity as u64) as usize;
            let n = (take - out.len()).min(self.capacity - at);
            out.extend_from_slice(&buf[at..at + n]);
            offset += n as u64;
        }
        out
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if !self.data.is_null() {
            unsafe { libc::munmap(self.data.cast(), self.map_len) };
        }
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
        ring.push(b"ab");
        assert_eq!(ring.read(9, 10), b"9ab");
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
        assert_eq!(ring.held(), 5);
    }

    #[test]
    fn matches_a_plain_model() {
        // Pseudo-random chunk sizes against "the last `cap` bytes of everything".
        let mut seed = 12345u64;
        for cap in [1usize, 7, 64, 4096, 5000] {
            let mut ring = Ring::new(cap);
            let mut all = Vec::new();
            for _ in 0..200 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let len = (seed >> 33) as usize % (cap * 2 + 3);
                let chunk: Vec<u8> = (0..len).map(|i| (all.len() + i) as u8).collect();
                ring.push(&chunk);
                all.extend_from_slice(&chunk);
                let start = all.len().saturating_sub(cap);
                assert_eq!(ring.start(), start as u64);
                assert_eq!(ring.read(start as u64, usize::MAX), &all[start..]);
            }
        }
    }

    #[test]
    fn zero_capacity_counts_and_keeps_nothing() {
        let mut ring = Ring::new(0);
        ring.push(b"abc");
        assert_eq!((ring.start(), ring.end(), ring.held()), (3, 3, 0));
        assert_eq!(ring.read(3, 10), b"");
    }

    #[test]
    fn idle_ring_holds_nothing() {
        let ring = Ring::new(64 << 20);
        assert_eq!(ring.held(), 0);
        assert_eq!(ring.end(), 0);
    }
}
