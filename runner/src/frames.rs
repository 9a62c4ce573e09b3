//! Frames: `u32 length | u8 type | u32 id | payload`, big-endian, length = 5 + payload.
//!
//! The reader is incremental (bytes arrive in any split) and refuses a length above the
//! bound before buffering the payload, so a hostile peer cannot make it allocate more
//! than one maximal frame.

/// The largest payload a frame may carry (1 MiB).
pub const MAX_PAYLOAD: usize = 1_048_576;
/// Bytes of the header after the length: the type and the id.
const HEAD: usize = 5;

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub id: u32,
    pub payload: Vec<u8>,
}

/// Why a byte stream is not a valid frame sequence (the connection must be closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The length field is below 5 (no room for type and id).
    TooShort(u32),
    /// The length field announces a payload above `MAX_PAYLOAD`.
    TooLong(u32),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooShort(n) => write!(f, "frame length {n} is below 5"),
            FrameError::TooLong(n) => write!(f, "frame length {n} exceeds the 1 MiB payload bound"),
        }
    }
}

/// Appends one encoded frame to `out`.
pub fn encode_into(out: &mut Vec<u8>, kind: u8, id: u32, payload: &[u8]) {
    debug_assert!(payload.len() <= MAX_PAYLOAD);
    let length = (HEAD + payload.len()) as u32;
    out.reserve(4 + HEAD + payload.len());
    out.extend_from_slice(&length.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends one frame whose payload is the concatenation of `parts` (no temporary copy).
pub fn encode_parts_into(out: &mut Vec<u8>, kind: u8, id: u32, parts: &[&[u8]]) {
    let size: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(size <= MAX_PAYLOAD);
    out.reserve(4 + HEAD + size);
    out.extend_from_slice(&((HEAD + size) as u32).to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// Encodes one frame into a new vector.
#[cfg(test)]
pub fn encode(kind: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, kind, id, payload);
    out
}

/// Accumulates received bytes and yields complete frames.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
}

impl FrameReader {
    /// A reader with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds received bytes.
    pub fn push(&mut self, data: &[u8]) {
        // Reclaim the consumed prefix before growing, so the buffer stays near one frame.
        if self.start > 0 && (self.start == self.buf.len() || self.start >= 65536) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered but not yet returned as frames.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed, or an error
    /// (after which the stream cannot be resynchronised).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let avail = &self.buf[self.start..];
        if avail.len() < 4 {
            return Ok(None);
        }
        let length = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]);
        if (length as usize) < HEAD {
            return Err(FrameError::TooShort(length));
        }
        if length as usize > HEAD + MAX_PAYLOAD {
            return Err(FrameError::TooLong(length));
        }
        let total = 4 + length as usize;
        if avail.len() < total {
            return Ok(None);
        }
        let kind = avail[4];
        let id = u32::from_be_bytes([avail[5], avail[6], avail[7], avail[8]]);
        let payload = avail[9..total].to_vec();
        self.start += total;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(Frame { kind, id, payload }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_byte_by_byte() {
        let mut wire = encode(0x02, 7, b"hello");
        encode_into(&mut wire, 0x0B, 0xFFFF_FFFF, b"");
        let mut reader = FrameReader::new();
        let mut frames = Vec::new();
        for b in &wire {
            reader.push(std::slice::from_ref(b));
            while let Some(f) = reader.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(
            frames,
            vec![
                Frame { kind: 0x02, id: 7, payload: b"hello".to_vec() },
                Frame { kind: 0x0B, id: 0xFFFF_FFFF, payload: vec![] },
            ]
        );
        assert_eq!(reader.pending(), 0);
    }

    #[test]
    fn header_layout_is_big_endian() {
        assert_eq!(encode(0x81, 0x01020304, b"x"), vec![0, 0, 0, 6, 0x81, 1, 2, 3, 4, b'x']);
    }

    #[test]
    fn refuses_oversized_length_before_buffering() {
        let mut reader = FrameReader::new();
        reader.push(&((5 + MAX_PAYLOAD + 1) as u32).to_be_bytes());
        assert_eq!(reader.next_frame(), Err(FrameError::TooLong((5 + MAX_PAYLOAD + 1) as u32)));
    }

    #[test]
    fn accepts_the_maximal_payload() {
        let payload = vec![0xAB; MAX_PAYLOAD];
        let mut reader = FrameReader::new();
        reader.push(&encode(0x03, 1, &payload));
        assert_eq!(reader.next_frame().unwrap().unwrap().payload.len(), MAX_PAYLOAD);
    }

    #[test]
    fn refuses_a_length_without_type_and_id() {
        let mut reader = FrameReader::new();
        reader.push(&[0, 0, 0, 4, 1, 0, 0, 0]);
        assert_eq!(reader.next_frame(), Err(FrameError::TooShort(4)));
    }

    #[test]
    fn incomplete_frame_waits() {
        let wire = encode(0x03, 2, b"abcdef");
        let mut reader = FrameReader::new();
        reader.push(&wire[..wire.len() - 1]);
        assert_eq!(reader.next_frame(), Ok(None));
        reader.push(&wire[wire.len() - 1..]);
        assert_eq!(reader.next_frame().unwrap().unwrap().payload, b"abcdef");
    }

    #[test]
    fn parts_encode_like_one_payload() {
        let mut a = Vec::new();
        encode_parts_into(&mut a, 0x83, 9, &[&[1], &5u64.to_be_bytes(), b"out"]);
        let mut payload = vec![1];
        payload.extend_from_slice(&5u64.to_be_bytes());
        payload.extend_from_slice(b"out");
        assert_eq!(a, encode(0x83, 9, &payload));
    }
}
