//! The runner binary end to end over its socket: real processes, real pipes and ptys.
//! Quick (well under a second each); they need /bin/sh, sleep, sort and /proc.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Runner {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Runner {
    fn start(tag: &str) -> Runner {
        let dir = std::env::temp_dir().join(format!("runner-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let socket = dir.join("s");
        let child = Command::new(env!("CARGO_BIN_EXE_sandbox-runner"))
            .args(["serve", "--socket", socket.to_str().unwrap(), "--orphan-timeout", "30"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the runner did not listen");
            std::thread::sleep(Duration::from_millis(5));
        }
        Runner { child, dir, socket }
    }

    fn connect(&self) -> Client {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client { s };
        c.send(0x01, 0, br#"{"version": 1}"#);
        assert_eq!(c.recv().0, 0x81);
        c
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Client {
    s: UnixStream,
}

impl Client {
    fn send(&mut self, t: u8, id: u32, payload: &[u8]) {
        let mut f = ((5 + payload.len()) as u32).to_be_bytes().to_vec();
        f.push(t);
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(payload);
        self.s.write_all(&f).unwrap();
    }

    fn json(&mut self, t: u8, id: u32, v: serde_json::Value) {
        self.send(t, id, v.to_string().as_bytes());
    }

    fn recv(&mut self) -> (u8, u32, Vec<u8>) {
        let mut head = [0u8; 9];
        self.s.read_exact(&mut head).unwrap();
        let n = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize - 5;
        let mut payload = vec![0; n];
        self.s.read_exact(&mut payload).unwrap();
        (head[4], u32::from_be_bytes(head[5..9].try_into().unwrap()), payload)
    }

    /// Frames until EXIT of `id`: (stdout, stderr, gaps, code).
    fn until_exit(&mut self, id: u32) -> (Vec<u8>, Vec<u8>, usize, i64) {
        let (mut out, mut err, mut gaps) = (Vec::new(), Vec::new(), 0);
        loop {
            let (t, i, p) = self.recv();
            if i != id {
                continue;
            }
            match t {
                0x83 if p[0] == 1 => out.extend_from_slice(&p[9..]),
                0x83 => err.extend_from_slice(&p[9..]),
                0x85 => gaps += 1,
                0x84 => {
                    let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                    return (out, err, gaps, v["code"].as_i64().unwrap());
                }
                _ => {}
            }
        }
    }

    fn reply(&mut self, id: u32) -> serde_json::Value {
        loop {
            let (t, i, p) = self.recv();
            if i == id && (t == 0x90 || t == 0xFF || t == 0x82) {
                let mut v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                v["type"] = t.into();
                return v;
            }
        }
    }
}

#[test]
fn pipes_stdin_eof_and_exit_codes() {
    let r = Runner::start("pipes");
    let mut c = r.connect();
    c.json(0x02, 1, serde_json::json!({"argv": ["sh", "-c", "echo out; echo err >&2; exit 7"]}));
    assert_eq!(c.reply(1)["type"], 0x82);
    assert_eq!(c.until_exit(1), (b"out\n".to_vec(), b"err\n".to_vec(), 0, 7));

    c.json(0x02, 2, serde_json::json!({"argv": ["sort"], "stdin": "open", "merge_stderr": true}));
    c.send(0x03, 2, b"b\nc\na\n");
    c.send(0x04, 2, b"");
    let mut replies = Vec::new();
    while replies.len() < 3 {
        replies.push(c.reply(2));
    }
    assert_eq!(replies[0]["type"], 0x82);
    assert_eq!(replies[1]["for"], 3);
    assert_eq!(replies[2]["for"], 4);
    assert_eq!(c.until_exit(2), (b"a\nb\nc\n".to_vec(), vec![], 0, 0));

    c.json(0x02, 3, serde_json::json!({"argv": ["no-such-program-here"]}));
    assert_eq!(c.reply(3)["kind"], "command_not_found");
    c.json(0x02, 3, serde_json::json!({"argv": ["true"], "cwd": "/no/such/folder"}));
    assert_eq!(c.reply(3)["kind"], "workdir");
}

#[test]
fn tree_kill_reaches_escapees() {
    let r = Runner::start("tree");
    let mut c = r.connect();
    let script = "sleep 300 & setsid sh -c 'sleep 301 & sleep 302' & (sleep 303 &) ; echo ready; wait";
    c.json(0x02, 1, serde_json::json!({"argv": ["sh", "-c", script]}));
    assert_eq!(c.reply(1)["type"], 0x82);
    loop {
        let (t, _, p) = c.recv();
        if t == 0x83 && p[9..].starts_with(b"ready") {
            break;
        }
    }
    c.send(0x06, 1, &[libc::SIGKILL as u8, 2]);
    assert_eq!(c.reply(1)["delivered"], true);
    assert_eq!(c.until_exit(1).3, 128 + 9);
    // Every descendant was under the keeper; it exits once none is left.
    let runner_pid = r.child.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{runner_pid}/task/{runner_pid}/children")).unwrap();
        if children.trim().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {children}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ring_gap_and_reattach() {
    let r = Runner::start("ring");
    let mut c = r.connect();
    c.json(
        0x02,
        1,
        serde_json::json!({"argv": ["sh", "-c", "head -c 100000 /dev/zero"], "ring_bytes": 1000}),
    );
    assert_eq!(c.reply(1)["type"], 0x82);
    c.until_exit(1);
    let mut d = r.connect();
    let mut offsets = 10u64.to_be_bytes().to_vec();
    offsets.extend_from_slice(&0u64.to_be_bytes());
    d.send(0x07, 1, &offsets);
    let (t, _, p) = d.recv();
    assert_eq!(t, 0x85);
    assert_eq!(p[0], 1);
    assert_eq!(u64::from_be_bytes(p[1..9].try_into().unwrap()), 10);
    assert_eq!(u64::from_be_bytes(p[9..17].try_into().unwrap()), 99_000);
    let (out, _, gaps, code) = d.until_exit(1);
    assert_eq!((out.len(), gaps, code), (1000, 0, 0));
    d.send(0x09, 77, b"");
    let (t, _, p) = d.recv();
    assert_eq!(t, 0x89);
    let listed: serde_json::Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(listed["processes"][0]["stdout_end"], 100_000);
    d.send(0x0A, 1, b"");
    assert_eq!(d.reply(1)["type"], 0x90);
}

#[test]
fn tty_resize_and_input() {
    let r = Runner::start("tty");
    let mut c = r.connect();
    c.json(0x02, 1, serde_json::json!({"argv": ["sh", "-c", "read x; stty size; echo got $x"], "tty": true, "rows": 10, "cols": 33}));
    assert_eq!(c.reply(1)["type"], 0x82);
    c.send(0x05, 1, &[0, 12, 0, 40]);
    assert_eq!(c.reply(1)["for"], 5);
    c.send(0x04, 1, b"");
    assert_eq!(c.reply(1)["kind"], "unsupported");
    c.send(0x03, 1, b"hi\r");
    assert_eq!(c.reply(1)["for"], 3);
    let (out, _, _, code) = c.until_exit(1);
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("12 40") && text.contains("got hi"), "{text}");
    assert_eq!(code, 0);
}

#[test]
fn protocol_errors() {
    let r = Runner::start("proto");
    let mut c = UnixStream::connect(&r.socket).map(|s| Client { s }).unwrap();
    c.send(0x0B, 1, b"x");
    let (t, _, p) = c.recv();
    assert_eq!(t, 0xFF);
    assert!(String::from_utf8_lossy(&p).contains("protocol"));
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "closed after a frame before HELLO");

    let mut c = r.connect();
    c.s.write_all(&(5 + 1_048_577u32).to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "an oversized frame closes the connection");

    let mut c = r.connect();
    c.send(0x0B, 9, &[7; 65]);
    assert_eq!(c.reply(9)["kind"], "invalid");
    c.send(0x0B, 9, b"ok");
    assert_eq!(c.recv(), (0x8B, 9, b"ok".to_vec()));
}

#[test]
fn input_beyond_the_pending_bound_is_all_written() {
    let r = Runner::start("input");
    let mut c = r.connect();
    c.json(0x02, 1, serde_json::json!({"argv": ["sh", "-c", "sleep 0.2; wc -c"], "stdin": "open"}));
    let chunk = vec![b'x'; 1 << 20];
    // More than the 4 MiB the runner queues per connection: it stops reading the socket
    // until the process takes some, then must go on without a new event from us.
    let writer = {
        let mut s = c.s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut w = Client { s: s.try_clone().unwrap() };
            for _ in 0..6 {
                w.send(0x03, 1, &chunk);
            }
            w.send(0x04, 1, b"");
            w.send(0x0B, 5, b"done");
            s.flush().unwrap();
        })
    };
    let mut oks = 0;
    let mut pong = false;
    let mut out = Vec::new();
    loop {
        let (t, i, p) = c.recv();
        match (t, i) {
            (0x90, 1) => oks += 1,
            (0x8B, 5) => pong = true,
            (0x83, 1) => out.extend_from_slice(&p[9..]),
            (0x84, 1) => break,
            (0xFF, _) => panic!("{}", String::from_utf8_lossy(&p)),
            _ => {}
        }
    }
    writer.join().unwrap();
    assert_eq!((oks, pong), (7, true));
    assert_eq!(String::from_utf8_lossy(&out).trim(), (6 << 20).to_string());
}

#[test]
fn backpressure_loses_nothing() {
    let r = Runner::start("bp");
    let mut c = r.connect();
    let total = 3_000_000u64;
    c.json(
        0x02,
        1,
        serde_json::json!({"argv": ["head", "-c", total.to_string(), "/dev/zero"], "ring_bytes": 65536,
                           "backpressure": true}),
    );
    // While we read nothing the process must be held back, not run to its end.
    std::thread::sleep(Duration::from_millis(300));
    let mut other = r.connect();
    other.send(0x09, 0x8000_0000, b"");
    let (t, _, p) = other.recv();
    assert_eq!(t, 0x89);
    let listed: serde_json::Value = serde_json::from_slice(&p).unwrap();
    let produced = listed["processes"][0]["stdout_end"].as_u64().unwrap();
    assert!(produced < total, "not held back: {produced}");
    let (out, _, gaps, code) = c.until_exit(1);
    assert_eq!((out.len() as u64, gaps, code), (total, 0, 0));
}

#[test]
fn detached_runner_is_found_again_and_the_orphan_timeout_ends_everything() {
    let dir = std::env::temp_dir().join(format!("runner-it-detach-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let socket = dir.join("sub/s");
    let serve = |timeout: &str| {
        Command::new(env!("CARGO_BIN_EXE_sandbox-runner"))
            .args(["serve", "--detach", "--socket", socket.to_str().unwrap(), "--orphan-timeout", timeout])
            .status()
            .unwrap()
    };
    assert!(serve("1").success());
    // A second start finds the first runner and leaves it alone.
    assert!(serve("1").success());
    let s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut c = Client { s };
    c.send(0x01, 0, br#"{"version": 1}"#);
    let (_, _, hello) = c.recv();
    let runner_pid = serde_json::from_slice::<serde_json::Value>(&hello).unwrap()["pid"].as_i64().unwrap();
    c.json(0x02, 1, serde_json::json!({"argv": ["sh", "-c", "setsid sleep 300 & echo $!; wait"]}));
    assert_eq!(c.reply(1)["type"], 0x82);
    let (t, _, p) = c.recv();
    assert_eq!(t, 0x83);
    let sleeper: i32 = String::from_utf8_lossy(&p[9..]).trim().parse().unwrap();
    drop(c);
    // No client for a second: the runner kills every tree and exits, removing its socket.
    let deadline = Instant::now() + Duration::from_secs(10);
    let gone =
        |pid: i64| !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    while !(gone(runner_pid) && gone(sleeper.into()) && !socket.exists()) {
        assert!(Instant::now() < deadline, "runner or its process outlived the orphan timeout");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn random_frames_do_not_upset_the_runner() {
    let r = Runner::start("fuzz");
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    for round in 0..4 {
        let mut c = r.connect();
        for _ in 0..500 {
            let t = (next() % 0x20) as u8 | if next() % 4 == 0 { 0x80 } else { 0 };
            let len = (next() % 40) as usize;
            let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            c.send(t, next() % 8, &payload);
        }
        // Half the connections vanish without reading; the others must still be served.
        if round % 2 == 0 {
            drop(c);
            continue;
        }
        c.send(0x0B, 0xFFFF_FFF0, b"still here");
        loop {
            let (t, i, p) = c.recv();
            if (t, i) == (0x8B, 0xFFFF_FFF0) {
                assert_eq!(p, b"still here");
                break;
            }
        }
    }
    let mut c = r.connect();
    c.send(0x0B, 1, b"x");
    assert_eq!(c.recv(), (0x8B, 1, b"x".to_vec()));
}
