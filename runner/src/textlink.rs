//! `connect --text`: the bridge for a provider whose exec stream carries text only (E2B
//! decodes a command's stdout as UTF-8, replacing what is not). Each direction is a
//! sequence of lines, each the standard base64 (RFC 4648, padded) of at most
//! `LINE_DATA` bytes, ended by `\n` (a `\r` before it is allowed on input). The bytes
//! themselves are the protocol's, as through the binary bridge.
//!
//! Bad input (a character outside base64, a line longer than `MAX_LINE`) ends the
//! bridge with a message on stderr and exit code 1: never a hang, never a buffer that
//! grows without bound. A line that is just `.` ends the input as an end of file would
//! (a terminal in raw mode has no end of file to give).
//!
//! Over a terminal (Blaxel's and Cloudflare's terminal sockets, where the bridge is
//! typed into a shell): a terminal among stdin and stdout is put in raw mode first (no
//! echo, no line editing, no signal keys, no CR/NL translation), so the lines pass as
//! they are, never as keystrokes a line discipline interprets; with `--ready TOKEN` the
//! bridge then prints `sandbox-runner-ready TOKEN` on a line of its own, so the client
//! knows where the shell's prompt and echo end and the link begins (the typed line holds
//! the token, never that phrase). The terminal's settings are put back at the end.

use crate::pump::Codec;
use crate::sys;
use std::os::fd::RawFd;

/// The most bytes of data one line carries (its base64 is 4/3 of it).
pub const LINE_DATA: usize = 48 * 1024;
/// The longest line accepted on input, its `\r\n` included.
pub const MAX_LINE: usize = LINE_DATA / 3 * 4 + 2;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends the base64 of `data` to `out`.
pub fn encode(data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63]);
        out.push(ALPHABET[(n >> 12) as usize & 63]);
        out.push(if chunk.len() > 1 { ALPHABET[(n >> 6) as usize & 63] } else { b'=' });
        out.push(if chunk.len() > 2 { ALPHABET[n as usize & 63] } else { b'=' });
    }
}

fn value(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    } as u32)
}

/// Appends what the base64 `text` encodes to `out`; strict: a length that is a
/// multiple of 4, padding only at the end, nothing else.
// `%`, not `is_multiple_of`: a build from the sdist may meet a cargo older than 1.87.
#[allow(unknown_lints, clippy::manual_is_multiple_of)]
pub fn decode(text: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    if text.len() % 4 != 0 {
        return Err(format!("a base64 line of {} characters (not a multiple of 4)", text.len()));
    }
    let quads = text.len() / 4;
    for (i, q) in text.chunks(4).enumerate() {
        let pad = if i + 1 == quads { q.iter().rev().take_while(|&&c| c == b'=').count() } else { 0 };
        if pad > 2 {
            return Err("bad base64 padding".into());
        }
        let mut n = 0u32;
        for &c in &q[..4 - pad] {
            n = (n << 6) | value(c).ok_or_else(|| format!("a byte that is not base64: {c:#04x}"))?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Ok(())
}

/// The line that ends the input (not base64: no data line can be it).
pub const END_LINE: &[u8] = b".";

/// Takes every complete line out of `pending` and appends its bytes to `out`. With
/// `end`, what remains (a last line without its `\n`) is a line too. Returns true at
/// the end line (`END_LINE`): what follows it is dropped.
pub fn take_lines(pending: &mut Vec<u8>, out: &mut Vec<u8>, end: bool) -> Result<bool, String> {
    let mut start = 0;
    while let Some(at) = pending[start..].iter().position(|&c| c == b'\n') {
        let mut line = &pending[start..start + at];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line == END_LINE {
            pending.clear();
            return Ok(true);
        }
        if line.len() + 2 > MAX_LINE {
            return Err(format!("a line of {} characters (at most {})", line.len(), MAX_LINE - 2));
        }
        decode(line, out)?;
        start += at + 1;
    }
    pending.drain(..start);
    if pending.len() > MAX_LINE {
        return Err(format!("a line longer than {MAX_LINE} characters"));
    }
    if end && !pending.is_empty() {
        let rest = std::mem::take(pending);
        let line = rest.strip_suffix(b"\r").unwrap_or(&rest);
        if line != END_LINE {
            decode(line, out)?;
        }
        return Ok(true);
    }
    Ok(false)
}

/// Appends `data` to `out` as lines of at most `LINE_DATA` bytes each.
pub fn encode_lines(data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(LINE_DATA) {
        encode(chunk, out);
        out.push(b'\n');
    }
}

/// A terminal's settings, put back when dropped.
struct RawTerminal {
    fd: RawFd,
    saved: libc::termios,
}

impl RawTerminal {
    /// Raw mode on `fd` if it is a terminal (None otherwise, or if it cannot be set).
    fn enter(fd: RawFd) -> Option<RawTerminal> {
        if unsafe { libc::isatty(fd) } != 1 {
            return None;
        }
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        unsafe { libc::cfmakeraw(&mut raw) };
        // Reads return what is there: nothing waits for a count or a timer.
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(RawTerminal { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The ready line `--ready TOKEN` prints.
pub fn ready_line(token: &str) -> Vec<u8> {
    format!("sandbox-runner-ready {token}\n").into_bytes()
}

/// `connect --text`: raw mode on a terminal among `input` and `output`, the ready line
/// if asked for, then `pump`; the terminal's settings are put back at the end.
pub fn bridge(input: RawFd, output: RawFd, sock: RawFd, ready: Option<&str>) -> i32 {
    let _raw_in = RawTerminal::enter(input);
    // The same terminal on both sides is set once (its settings are shared).
    let same = unsafe {
        let (mut a, mut b): (libc::stat, libc::stat) = (std::mem::zeroed(), std::mem::zeroed());
        libc::fstat(input, &mut a) == 0
            && libc::fstat(output, &mut b) == 0
            && a.st_rdev == b.st_rdev
            && a.st_ino == b.st_ino
    };
    let _raw_out = if same && _raw_in.is_some() { None } else { RawTerminal::enter(output) };
    if let Some(token) = ready {
        if sys::write_all(output, &ready_line(token)).is_err() {
            return 1;
        }
    }
    pump(input, output, sock)
}

/// Base64 lines on the stream, bytes on the socket (`pending`: input text not yet a
/// whole line).
pub struct Lines {
    pending: Vec<u8>,
}

impl Codec for Lines {
    fn input(&mut self, data: &[u8], end: bool, out: &mut Vec<u8>) -> Result<bool, String> {
        self.pending.extend_from_slice(data);
        take_lines(&mut self.pending, out, end)
    }

    fn output(&mut self, data: &[u8], out: &mut Vec<u8>) {
        encode_lines(data, out);
    }
}

/// Copies base64 lines from `input` to `sock` as bytes, and `sock`'s bytes to `output`
/// as base64 lines, with bounded buffers (`pump`), until either side ends (exit 0) or
/// the input is bad (exit 1, said on stderr).
pub fn pump(input: RawFd, output: RawFd, sock: RawFd) -> i32 {
    crate::pump::pump(input, output, sock, &mut Lines { pending: Vec::new() }, "connect --text")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(data: &[u8]) -> String {
        let mut out = Vec::new();
        encode(data, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn rfc4648_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(enc(plain.as_bytes()), coded);
            let mut back = Vec::new();
            decode(coded.as_bytes(), &mut back).unwrap();
            assert_eq!(back, plain.as_bytes());
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for len in 0..data.len() {
            let mut back = Vec::new();
            decode(enc(&data[..len]).as_bytes(), &mut back).unwrap();
            assert_eq!(back, &data[..len]);
        }
    }

    #[test]
    fn refuses_what_is_not_base64() {
        for bad in ["Zg=", "Zg===", "Z===", "Zm9v!mFy", "Zg==Zm8=", "Zm 9v", "=Zm9"] {
            assert!(decode(bad.as_bytes(), &mut Vec::new()).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn lines_split_anywhere_and_crlf() {
        let mut coded = Vec::new();
        encode_lines(b"hello", &mut coded);
        encode_lines(b"world", &mut coded);
        coded.splice(8..8, b"\r".iter().copied()); // "aGVsbG8=" then "\r\n"
        for cut in 0..coded.len() {
            let mut pending = coded[..cut].to_vec();
            let mut out = Vec::new();
            take_lines(&mut pending, &mut out, false).unwrap();
            pending.extend_from_slice(&coded[cut..]);
            take_lines(&mut pending, &mut out, true).unwrap();
            assert_eq!(out, b"helloworld", "cut at {cut}");
            assert!(pending.is_empty());
        }
    }

    #[test]
    fn a_last_line_without_newline_counts_at_the_end_only() {
        let mut pending = b"Zm9v".to_vec();
        let mut out = Vec::new();
        take_lines(&mut pending, &mut out, false).unwrap();
        assert!(out.is_empty());
        take_lines(&mut pending, &mut out, true).unwrap();
        assert_eq!(out, b"foo");
    }

    #[test]
    fn over_long_lines_are_refused_whole_or_partial() {
        let mut pending = vec![b'A'; MAX_LINE + 1];
        assert!(take_lines(&mut pending, &mut Vec::new(), false).is_err());
        let mut pending = vec![b'A'; MAX_LINE + 4];
        pending.push(b'\n');
        assert!(take_lines(&mut pending, &mut Vec::new(), false).is_err());
    }

    #[test]
    fn the_end_line_ends_the_input_and_drops_what_follows() {
        for text in [&b"Zm9v\n.\nYmFy\n"[..], b"Zm9v\r\n.\r\nYmFy", b"Zm9v\n."] {
            let mut pending = text.to_vec();
            let mut out = Vec::new();
            let end = take_lines(&mut pending, &mut out, text.ends_with(b".")).unwrap();
            assert!(end, "{text:?}");
            assert_eq!(out, b"foo");
            assert!(pending.is_empty());
        }
        let mut pending = b"Zm9v\n".to_vec();
        assert!(!take_lines(&mut pending, &mut Vec::new(), false).unwrap());
        // Only a whole line of "." ends it: "." inside a line is bad base64.
        assert!(take_lines(&mut b"Zm9v.\n".to_vec(), &mut Vec::new(), false).is_err());
        assert!(take_lines(&mut b"..\n".to_vec(), &mut Vec::new(), false).is_err());
    }

    #[test]
    fn the_ready_line_holds_the_phrase_the_typed_line_lacks() {
        assert_eq!(ready_line("abc9"), b"sandbox-runner-ready abc9\n");
    }

    #[test]
    fn output_lines_are_bounded() {
        let data = vec![7u8; LINE_DATA * 2 + 1];
        let mut out = Vec::new();
        encode_lines(&data, &mut out);
        let lines: Vec<&[u8]> = out.split(|&c| c == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.len() + 2 <= MAX_LINE));
        let mut pending = out.clone();
        let mut back = Vec::new();
        take_lines(&mut pending, &mut back, true).unwrap();
        assert_eq!(back, data);
    }
}
