//! Message types and payload shapes of protocol version 1 (docs/runner.md).

use serde::Deserialize;
use std::collections::BTreeMap;

/// The protocol version this runner speaks.
pub const PROTOCOL_VERSION: u64 = 1;
/// The runner's own version (reported by HELLO_OK and `version`).
pub const RUNNER_VERSION: &str = env!("CARGO_PKG_VERSION");

// Client -> runner.
pub const HELLO: u8 = 0x01;
pub const SPAWN: u8 = 0x02;
pub const INPUT: u8 = 0x03;
pub const CLOSE_STDIN: u8 = 0x04;
pub const RESIZE: u8 = 0x05;
pub const SIGNAL: u8 = 0x06;
pub const ATTACH: u8 = 0x07;
pub const DETACH: u8 = 0x08;
pub const LIST: u8 = 0x09;
pub const FORGET: u8 = 0x0A;
pub const PING: u8 = 0x0B;
pub const FILE: u8 = 0x10;
pub const DATA: u8 = 0x11;
pub const END: u8 = 0x12;

// Runner -> client.
pub const HELLO_OK: u8 = 0x81;
pub const SPAWNED: u8 = 0x82;
pub const OUTPUT: u8 = 0x83;
pub const EXIT: u8 = 0x84;
pub const GAP: u8 = 0x85;
pub const LISTED: u8 = 0x89;
pub const PONG: u8 = 0x8B;
pub const OK: u8 = 0x90;
pub const DATA_OUT: u8 = 0x91;
pub const END_OUT: u8 = 0x92;
pub const ERROR: u8 = 0xFF;

/// The largest PING payload echoed.
pub const MAX_PING: usize = 64;
/// The largest ring a process may ask for (64 MiB).
pub const MAX_RING: u64 = 64 << 20;
/// The ring size when SPAWN does not say.
pub const DEFAULT_RING: u64 = 1 << 20;
/// The most process records (running or kept) the runner holds.
pub const MAX_PROCESSES: usize = 4096;
/// The most argv entries / environment entries a SPAWN may carry.
pub const MAX_ARGS: usize = 65536;

/// Error kinds (the ERROR payload's "kind").
pub mod kind {
    pub const NOT_FOUND: &str = "not_found";
    pub const EXISTS: &str = "exists";
    pub const WORKDIR: &str = "workdir";
    pub const COMMAND_NOT_FOUND: &str = "command_not_found";
    pub const NOT_A_FILE: &str = "not_a_file";
    pub const TOO_LARGE: &str = "too_large";
    pub const UNSUPPORTED: &str = "unsupported";
    pub const INVALID: &str = "invalid";
    pub const IO: &str = "io";
    pub const PROTOCOL: &str = "protocol";
}

/// The HELLO payload.
#[derive(Deserialize)]
pub struct Hello {
    pub version: u64,
}

/// Whether the child's stdin is a pipe the client writes to, or at EOF from the start.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum StdinMode {
    Open,
    Closed,
}

/// The SPAWN payload.
/// Unknown fields are ignored, so a later client may add some.
#[derive(Deserialize, Debug)]
pub struct Spawn {
    pub argv: Vec<String>,
    /// The whole environment of the child; absent = the runner's own.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default = "default_rows")]
    pub rows: u16,
    #[serde(default = "default_cols")]
    pub cols: u16,
    #[serde(default)]
    pub stdin: Option<StdinMode>,
    #[serde(default)]
    pub merge_stderr: bool,
    /// Lossless streaming (an addition to v1): while an attached connection is a whole
    /// ring behind on a stream, the runner stops reading that stream (the process blocks
    /// on its writes) instead of dropping bytes that connection has not received.
    #[serde(default)]
    pub backpressure: bool,
    #[serde(default)]
    pub ring_bytes: Option<u64>,
}

fn default_rows() -> u16 {
    24
}

fn default_cols() -> u16 {
    80
}

impl Spawn {
    /// Parses and checks a SPAWN payload; the error is the ERROR message.
    pub fn parse(payload: &[u8]) -> Result<Spawn, String> {
        let spawn: Spawn = serde_json::from_slice(payload).map_err(|e| format!("bad SPAWN payload: {e}"))?;
        if spawn.argv.is_empty() {
            return Err("argv is empty".into());
        }
        if spawn.argv.len() > MAX_ARGS || spawn.env.as_ref().is_some_and(|e| e.len() > MAX_ARGS) {
            return Err("too many argv or env entries".into());
        }
        if spawn.argv.iter().any(|a| a.contains('\0')) {
            return Err("argv holds a NUL byte".into());
        }
        if let Some(env) = &spawn.env {
            if env
                .iter()
                .any(|(k, v)| k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0'))
            {
                return Err("an environment name is empty or holds '=' or NUL, or a value holds NUL".into());
            }
        }
        if spawn.cwd.as_ref().is_some_and(|c| c.contains('\0')) {
            return Err("cwd holds a NUL byte".into());
        }
        if spawn.rows == 0 || spawn.cols == 0 {
            return Err("rows and cols must be at least 1".into());
        }
        Ok(spawn)
    }

    /// The effective stdin mode (a terminal's input is open unless told otherwise).
    pub fn stdin_mode(&self) -> StdinMode {
        self.stdin.unwrap_or(if self.tty { StdinMode::Open } else { StdinMode::Closed })
    }

    /// The ring size in bytes, clamped to the runner's bound.
    pub fn ring(&self) -> usize {
        self.ring_bytes.unwrap_or(DEFAULT_RING).min(MAX_RING) as usize
    }
}

/// Whether `t` is a frame type a client sends (what a reply's "for" may name).
pub fn is_client_type(t: u8) -> bool {
    matches!(t, HELLO..=PING | FILE..=END)
}

/// The longest ERROR message sent (a message quoting a huge argv[0] is cut).
pub const MAX_MESSAGE: usize = 4096;

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// An ERROR payload; `answers` is the type of the frame it answers ("for"), 0 for none.
pub fn error_payload(kind: &str, message: &str, answers: u8) -> Vec<u8> {
    let mut v = serde_json::json!({"kind": kind, "message": cut(message, MAX_MESSAGE)});
    if is_client_type(answers) {
        v["for"] = answers.into();
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// An OK payload: `body` (a JSON object) plus "for", the type of the frame it answers.
pub fn ok_payload(mut body: serde_json::Value, answers: u8) -> Vec<u8> {
    if is_client_type(answers) {
        body["for"] = answers.into();
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

/// A big-endian u64 at `at`, if the payload is long enough.
pub fn be_u64(p: &[u8], at: usize) -> Option<u64> {
    p.get(at..at + 8).map(|b| u64::from_be_bytes(b.try_into().unwrap()))
}

/// A big-endian u16 at `at`, if the payload is long enough.
pub fn be_u16(p: &[u8], at: usize) -> Option<u16> {
    p.get(at..at + 2).map(|b| u16::from_be_bytes(b.try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_defaults() {
        let s = Spawn::parse(br#"{"argv": ["true"]}"#).unwrap();
        assert_eq!(s.stdin_mode(), StdinMode::Closed);
        assert_eq!((s.rows, s.cols, s.ring()), (24, 80, 1 << 20));
        let t = Spawn::parse(br#"{"argv": ["sh"], "tty": true, "ring_bytes": 99999999999}"#).unwrap();
        assert_eq!(t.stdin_mode(), StdinMode::Open);
        assert_eq!(t.ring(), 64 << 20);
    }

    #[test]
    fn spawn_full_payload() {
        let s = Spawn::parse(
            br#"{"argv": ["cat"], "env": {"A": "b"}, "cwd": null, "tty": false, "rows": 10,
                "cols": 20, "stdin": "open", "merge_stderr": true, "ring_bytes": 10}"#,
        )
        .unwrap();
        assert_eq!(s.stdin_mode(), StdinMode::Open);
        assert!(s.merge_stderr);
        assert_eq!(s.env.unwrap()["A"], "b");
    }

    #[test]
    fn spawn_refusals() {
        for bad in [
            &br#"{"argv": []}"#[..],
            br#"{"argv": "ls"}"#,
            br#"{"argv": ["a\u0000b"]}"#,
            br#"{"argv": ["a"], "env": {"A=B": "c"}}"#,
            br#"{"argv": ["a"], "stdin": "maybe"}"#,
            br#"{"argv": ["a"], "rows": 0}"#,
            br#"{"argv": ["a"], "rows": 70000}"#,
            b"not json",
        ] {
            assert!(Spawn::parse(bad).is_err(), "accepted {}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn replies_name_the_call() {
        let e: serde_json::Value = serde_json::from_slice(&error_payload("io", "m", INPUT)).unwrap();
        assert_eq!(e, serde_json::json!({"kind": "io", "message": "m", "for": 3}));
        let e: serde_json::Value = serde_json::from_slice(&error_payload("protocol", "m", 0x77)).unwrap();
        assert!(e.get("for").is_none());
        let o: serde_json::Value = serde_json::from_slice(&ok_payload(serde_json::json!({}), FILE)).unwrap();
        assert_eq!(o, serde_json::json!({"for": 16}));
        assert!(is_client_type(END) && is_client_type(HELLO) && !is_client_type(0x0C) && !is_client_type(OK));
    }

    #[test]
    fn long_messages_are_cut_at_a_character() {
        let long = "é".repeat(5000);
        let e: serde_json::Value = serde_json::from_slice(&error_payload("io", &long, 0)).unwrap();
        assert!(e["message"].as_str().unwrap().len() <= MAX_MESSAGE);
        assert_eq!(cut("abc", 2), "ab");
        assert_eq!(cut("é", 1), "");
    }

    #[test]
    fn integers() {
        assert_eq!(be_u64(&[0, 0, 0, 0, 0, 0, 1, 2], 0), Some(258));
        assert_eq!(be_u64(&[0; 7], 0), None);
        assert_eq!(be_u16(&[1, 2, 3], 1), Some(0x0203));
    }
}
