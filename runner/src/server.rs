//! The event loop: one thread, poll(2) over the listening socket, the signal fd, every
//! client connection and every process fd. Nothing blocks on a peer: sockets and pipes
//! are non-blocking, a connection's queued output is bounded (streams are pulled from
//! the rings only while it has room), and a process's output is always read into its
//! ring whether or not anybody is reading it.

use crate::cgroup::{self, Cgroups};
use crate::files::{self, ConnFiles};
use crate::frames::{self, FrameReader, MAX_PAYLOAD};
use crate::process::{self, REC_EXITED, REC_STARTED};
use crate::proto::{self, kind, Spawn};
use crate::ring::Ring;
use crate::sys;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A connection stops being read, and stops receiving stream data, once this much
/// output is queued for it.
const HIGH_WATER: usize = 512 * 1024;
/// The largest OUTPUT chunk (payload bytes after the 9-byte stream header).
const CHUNK: usize = 64 * 1024;
/// Reads per process fd per loop turn (fairness between processes).
const READS_PER_TURN: usize = 4;
/// A connection stops being read while this much INPUT waits for its processes.
const MAX_PENDING_INPUT: usize = 4 * MAX_PAYLOAD;
/// The most simultaneous connections.
const MAX_CONNECTIONS: usize = 256;
/// The most argv entries, and argv bytes, one LISTED record shows.
const LIST_ARGV_ENTRIES: usize = 1024;
const LIST_ARGV_BYTES: usize = 16 * 1024;
/// The most JSON values one LISTED carries.
const LIST_MAX_VALUES: usize = 100_000;
/// How long EXIT waits for the output to reach EOF after the child was reaped (a
/// descendant may hold the pipe open).
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// How the server runs.
pub struct Config {
    pub socket: PathBuf,
    /// None = never exit for lack of clients.
    pub orphan_timeout: Option<Duration>,
}

struct Input {
    conn: u64,
    id: u32,
    data: Vec<u8>,
    pos: usize,
}

struct Proc {
    argv: Vec<String>,
    tty: bool,
    keeper: libc::pid_t,
    keeper_alive: bool,
    pid: Option<libc::pid_t>,
    started: bool,
    spawn_reply: Option<(u64, u32)>,
    cwd: Option<String>,
    control: Option<OwnedFd>,
    control_buf: Vec<u8>,
    /// The child's exec status pipe, until its end-of-file (or an error record).
    exec_status: Option<OwnedFd>,
    exec_buf: Vec<u8>,
    /// The child exec'd (the exec status pipe ended without a record).
    exec_ok: bool,
    stdin: Option<OwnedFd>,
    stdin_queue: VecDeque<Input>,
    /// CLOSE_STDIN requests waiting for the queue to drain.
    close_replies: Vec<(u64, u32)>,
    out: [Option<OwnedFd>; 2],
    rings: [Ring; 2],
    backpressure: bool,
    /// The process's cgroup leaf, when the runner has cgroups.
    leaf: Option<PathBuf>,
    status: Option<i32>,
    reaped_at: Option<Instant>,
    /// The exit status is known and the output is closed: EXIT may be sent.
    ended: bool,
    /// SIGNALs (signal, scope) that came before the child started: delivered once it
    /// did (the keeper may not have forked it yet, so a tree kill would find nothing).
    pending_signals: Vec<(i32, u8)>,
}

impl Proc {
    fn code(&self) -> Option<i32> {
        if self.ended {
            self.status.map(process::exit_code)
        } else {
            None
        }
    }
}

struct Attach {
    next: [u64; 2],
    exit_sent: bool,
}

struct Conn {
    fd: OwnedFd,
    reader: FrameReader,
    out: Vec<u8>,
    out_pos: usize,
    hello: bool,
    /// Flush what is queued, then close (after a refused HELLO).
    closing: bool,
    dead: bool,
    attach: BTreeMap<u32, Attach>,
    pending_input: usize,
    files: ConnFiles,
    /// The type of the frame being handled (what immediate replies name in "for").
    answering: u8,
}

impl Conn {
    fn queued(&self) -> usize {
        self.out.len() - self.out_pos
    }

    fn send(&mut self, kind: u8, id: u32, payload: &[u8]) {
        frames::encode_into(&mut self.out, kind, id, payload);
    }

    fn send_json(&mut self, kind: u8, id: u32, value: serde_json::Value) {
        let body = serde_json::to_vec(&value).unwrap_or_default();
        self.send(kind, id, &body);
    }

    /// ERROR answering the frame being handled.
    fn error(&mut self, id: u32, kind: &str, message: &str) {
        self.error_for(id, self.answering, kind, message);
    }

    /// ERROR answering a frame of type `answers` (for replies sent later).
    fn error_for(&mut self, id: u32, answers: u8, kind: &str, message: &str) {
        self.send(proto::ERROR, id, &proto::error_payload(kind, message, answers));
    }

    /// OK answering the frame being handled.
    fn ok(&mut self, id: u32, body: serde_json::Value) {
        self.ok_for(id, self.answering, body);
    }

    /// OK answering a frame of type `answers`.
    fn ok_for(&mut self, id: u32, answers: u8, body: serde_json::Value) {
        self.send(proto::OK, id, &proto::ok_payload(body, answers));
    }

    fn wants_input(&self) -> bool {
        !self.closing && !self.dead && self.queued() < HIGH_WATER && self.pending_input < MAX_PENDING_INPUT
    }
}

#[derive(Clone, Copy)]
enum Token {
    Listen,
    Signal,
    Conn(u64),
    Control(u32),
    Exec(u32),
    Out(u32, usize),
    Stdin(u32),
}

/// The runner's state.
pub struct Server {
    config: Config,
    listener: OwnedFd,
    signals: OwnedFd,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    procs: BTreeMap<u32, Proc>,
    last_client: Instant,
    shutdown: bool,
    /// The one read buffer (process output and client bytes).
    buf: Vec<u8>,
    /// Set when accept ran out of fds: the listener is left out of the poll until then.
    accept_paused_until: Option<Instant>,
    /// A cgroup v2 leaf per process, where the sandbox allows it.
    cgroups: Option<Cgroups>,
    /// Leaves of forgotten processes that were not empty yet when dropped.
    stale_leaves: Vec<PathBuf>,
}

/// Blocks the signals the loop reads through a signalfd, and ignores SIGPIPE (a closed
/// peer is an EPIPE error, not a death).
pub fn signal_fd() -> io::Result<OwnedFd> {
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = sys::cvt(libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

impl Server {
    /// A server over an already listening socket.
    pub fn new(config: Config, listener: OwnedFd) -> io::Result<Server> {
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        process::raise_fd_limit();
        sys::set_nonblocking(listener.as_raw_fd())?;
        Ok(Server {
            config,
            listener,
            signals: signal_fd()?,
            conns: BTreeMap::new(),
            next_conn: 1,
            procs: BTreeMap::new(),
            last_client: Instant::now(),
            shutdown: false,
            buf: vec![0u8; CHUNK],
            accept_paused_until: None,
            cgroups: Cgroups::detect(),
            stale_leaves: Vec::new(),
        })
    }

    /// Runs until a shutdown signal or the orphan timeout; then kills every tree.
    pub fn run(mut self) {
        let mut pollfds: Vec<libc::pollfd> = Vec::new();
        let mut tokens: Vec<Token> = Vec::new();
        while !self.shutdown {
            pollfds.clear();
            tokens.clear();
            let mut add = |fd: RawFd, events: i16, token: Token| {
                pollfds.push(libc::pollfd { fd, events, revents: 0 });
                tokens.push(token);
            };
            add(self.signals.as_raw_fd(), libc::POLLIN, Token::Signal);
            if self.accept_paused_until.is_some_and(|t| Instant::now() >= t) {
                self.accept_paused_until = None;
            }
            if self.accept_paused_until.is_none() {
                add(self.listener.as_raw_fd(), libc::POLLIN, Token::Listen);
            }
            for (&id, c) in &self.conns {
                let mut ev = 0;
                if c.wants_input() {
                    ev |= libc::POLLIN;
                }
                if c.queued() > 0 {
                    ev |= libc::POLLOUT;
                }
                add(c.fd.as_raw_fd(), ev, Token::Conn(id));
            }
            for (&id, p) in &self.procs {
                if let Some(fd) = &p.control {
                    add(fd.as_raw_fd(), libc::POLLIN, Token::Control(id));
                }
                if let Some(fd) = &p.exec_status {
                    add(fd.as_raw_fd(), libc::POLLIN, Token::Exec(id));
                }
                for (s, fd) in p.out.iter().enumerate() {
                    if let (Some(fd), false) = (fd, paused(&self.conns, id, p, s)) {
                        add(fd.as_raw_fd(), libc::POLLIN, Token::Out(id, s));
                    }
                }
                if let (Some(fd), false, true) = (&p.stdin, p.stdin_queue.is_empty(), p.started) {
                    add(fd.as_raw_fd(), libc::POLLOUT, Token::Stdin(id));
                }
            }
            let timeout = self.poll_timeout();
            let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, timeout) };
            if n < 0 && sys::errno() != libc::EINTR {
                break;
            }
            // Controls first: a process's STARTED record must be seen before its output.
            let ready: Vec<(Token, i16)> = tokens
                .iter()
                .zip(&pollfds)
                .filter(|(_, p)| p.revents != 0)
                .map(|(t, p)| (*t, p.revents))
                .collect();
            for &(token, _) in &ready {
                if let Token::Signal = token {
                    self.on_signals();
                }
            }
            for &(token, _) in &ready {
                match token {
                    Token::Control(id) => self.on_control(id),
                    Token::Exec(id) => self.on_exec_status(id),
                    _ => {}
                }
            }
            for &(token, _) in &ready {
                match token {
                    Token::Out(id, s) => self.on_output(id, s),
                    Token::Stdin(id) => self.write_stdin(id),
                    _ => {}
                }
            }
            for &(token, revents) in &ready {
                match token {
                    Token::Listen => self.accept(),
                    Token::Conn(id) => self.on_conn(id, revents),
                    _ => {}
                }
            }
            self.finish_processes();
            let ids: Vec<u64> = self.conns.keys().copied().collect();
            for id in ids {
                self.handle_frames(id);
            }
            self.pump_all();
            if !self.conns.is_empty() {
                self.last_client = Instant::now();
            } else if let Some(limit) = self.config.orphan_timeout {
                if self.last_client.elapsed() >= limit {
                    self.shutdown = true;
                }
            }
        }
        self.kill_everything();
    }

    fn poll_timeout(&self) -> i32 {
        let mut wait: Option<Duration> = None;
        let mut consider = |d: Duration| wait = Some(wait.map_or(d, |w: Duration| w.min(d)));
        let now = Instant::now();
        for p in self.procs.values() {
            // A grace already over and still not ended is held for a lagging reader:
            // that reader's progress, not a timer, moves it on.
            if let (Some(at), false) = (p.reaped_at, p.ended) {
                if at + EXIT_GRACE > now {
                    consider(at + EXIT_GRACE - now);
                }
            }
        }
        if let Some(t) = self.accept_paused_until {
            consider(t.saturating_duration_since(Instant::now()));
        }
        if self.conns.is_empty() {
            if let Some(limit) = self.config.orphan_timeout {
                consider((self.last_client + limit).saturating_duration_since(Instant::now()));
            }
        }
        match wait {
            None => -1,
            // Round up so a deadline is not polled for in a busy loop.
            Some(d) => (d.as_millis().min(3_600_000) as i32) + 1,
        }
    }

    fn on_signals(&mut self) {
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        loop {
            let n = unsafe {
                libc::read(self.signals.as_raw_fd(), (&mut info as *mut libc::signalfd_siginfo).cast(), size)
            };
            if n != size as isize {
                break;
            }
            if info.ssi_signo == libc::SIGTERM as u32 || info.ssi_signo == libc::SIGINT as u32 {
                self.shutdown = true;
            }
        }
        self.reap();
    }

    /// Reaps keepers (and any real child whose keeper died: it re-parents here).
    fn reap(&mut self) {
        self.stale_leaves.retain(|leaf| !cgroup::remove(leaf));
        loop {
            let mut status = 0;
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            for p in self.procs.values_mut() {
                if p.keeper == pid {
                    p.keeper_alive = false;
                    // The keeper exits once nothing of its tree is left: the leaf is empty.
                    if p.leaf.as_deref().is_some_and(cgroup::remove) {
                        p.leaf = None;
                    }
                } else if p.pid == Some(pid) && p.status.is_none() {
                    p.status = Some(status);
                    p.reaped_at = Some(Instant::now());
                }
            }
        }
    }

    fn on_control(&mut self, id: u32) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        let Some(fd) = &p.control else { return };
        let mut buf = [0u8; 256];
        let eof = match sys::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => true,
            Ok(n) => {
                p.control_buf.extend_from_slice(&buf[..n]);
                false
            }
            Err(e) => !sys::would_block(&e),
        };
        while p.control_buf.len() >= 8 {
            let rec: Vec<u8> = p.control_buf.drain(..8).collect();
            let tag = u32::from_be_bytes(rec[..4].try_into().unwrap());
            let value = i32::from_be_bytes(rec[4..].try_into().unwrap());
            match tag {
                REC_STARTED => p.pid = Some(value),
                REC_EXITED => {
                    if p.status.is_none() {
                        p.status = Some(value);
                        p.reaped_at = Some(Instant::now());
                    }
                }
                _ => {
                    let (k, msg) = process::spawn_error(tag, value, &p.argv[0], p.cwd.as_deref());
                    self.fail_spawn(id, k, &msg);
                    return;
                }
            }
        }
        if eof {
            p.control = None;
            if p.pid.is_none() {
                self.fail_spawn(id, kind::IO, "the process keeper ended before the child started");
                return;
            }
        }
        self.maybe_started(id);
    }

    /// The child's exec status: a record says why the exec failed, end-of-file alone
    /// that it succeeded.
    fn on_exec_status(&mut self, id: u32) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        let Some(fd) = &p.exec_status else { return };
        let mut buf = [0u8; 64];
        let eof = match sys::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => true,
            Ok(n) => {
                p.exec_buf.extend_from_slice(&buf[..n]);
                false
            }
            Err(e) => !sys::would_block(&e),
        };
        if p.exec_buf.len() >= 8 {
            let tag = u32::from_be_bytes(p.exec_buf[..4].try_into().unwrap());
            let value = i32::from_be_bytes(p.exec_buf[4..8].try_into().unwrap());
            let (k, msg) = process::spawn_error(tag, value, &p.argv[0], p.cwd.as_deref());
            self.fail_spawn(id, k, &msg);
            return;
        }
        if eof {
            p.exec_status = None;
            p.exec_ok = p.exec_buf.is_empty();
            if !p.exec_ok {
                self.fail_spawn(id, kind::IO, "the child's start report was cut short");
                return;
            }
            self.maybe_started(id);
        }
    }

    /// Once the child exec'd and its pid is known: SPAWNED, then any INPUT or
    /// CLOSE_STDIN that came right behind the SPAWN.
    fn maybe_started(&mut self, id: u32) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        if !p.started {
            let (true, Some(pid)) = (p.exec_ok, p.pid) else { return };
            p.started = true;
            if let Some((conn, req)) = p.spawn_reply.take() {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.send_json(proto::SPAWNED, req, json!({"pid": pid}));
                }
            }
            for (sig, scope) in std::mem::take(&mut p.pending_signals) {
                deliver(p, sig, scope);
            }
        }
        self.write_stdin(id);
    }

    fn fail_spawn(&mut self, id: u32, kind: &str, message: &str) {
        if let Some(mut p) = self.procs.remove(&id) {
            if let Some(leaf) = p.leaf.take() {
                if !cgroup::remove(&leaf) {
                    self.stale_leaves.push(leaf);
                }
            }
            if let Some((conn, req)) = p.spawn_reply.take() {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.attach.remove(&id);
                    c.error_for(req, proto::SPAWN, kind, message);
                }
            }
            // INPUT or CLOSE_STDIN sent right behind the SPAWN: the process never ran.
            let inputs = p.stdin_queue.drain(..).map(|i| (i.conn, i.id, proto::INPUT));
            let closes = p.close_replies.drain(..).map(|(conn, id)| (conn, id, proto::CLOSE_STDIN));
            for (conn, req, answers) in inputs.chain(closes).collect::<Vec<_>>() {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.error_for(req, answers, kind::NOT_FOUND, "the process did not start");
                }
            }
        }
    }

    fn on_output(&mut self, id: u32, stream: usize) {
        let Some(p) = self.procs.get(&id) else { return };
        let mut room = room(&self.conns, id, p, stream);
        let p = self.procs.get_mut(&id).unwrap();
        for _ in 0..READS_PER_TURN {
            let Some(fd) = &p.out[stream] else { return };
            let want = room.min(self.buf.len());
            if want == 0 {
                return;
            }
            match sys::read(fd.as_raw_fd(), &mut self.buf[..want]) {
                Ok(0) => {
                    p.out[stream] = None;
                    return;
                }
                Ok(n) => {
                    p.rings[stream].push(&self.buf[..n]);
                    room -= n;
                }
                Err(e) if sys::would_block(&e) => return,
                // EIO: a pty whose every slave fd is closed, i.e. EOF.
                Err(_) => {
                    p.out[stream] = None;
                    return;
                }
            }
        }
    }

    fn write_stdin(&mut self, id: u32) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        // Held until SPAWNED went out, so a call's replies keep the order of the calls.
        if !p.started {
            return;
        }
        let mut done: Vec<(u64, u32, Option<String>)> = Vec::new();
        while let Some(front) = p.stdin_queue.front_mut() {
            let Some(fd) = &p.stdin else { break };
            if front.pos == front.data.len() {
                let i = p.stdin_queue.pop_front().unwrap();
                done.push((i.conn, i.id, None));
                continue;
            }
            match sys::write(fd.as_raw_fd(), &front.data[front.pos..]) {
                Ok(n) => front.pos += n,
                Err(e) if sys::would_block(&e) => break,
                Err(e) => {
                    let i = p.stdin_queue.pop_front().unwrap();
                    done.push((i.conn, i.id, Some(format!("cannot write to the process: {e}"))));
                    // The reader is gone: everything queued behind fails the same way.
                    while let Some(i) = p.stdin_queue.pop_front() {
                        done.push((i.conn, i.id, Some(format!("cannot write to the process: {e}"))));
                    }
                }
            }
        }
        let mut closed = Vec::new();
        if p.stdin_queue.is_empty() && !p.close_replies.is_empty() {
            p.stdin = None;
            closed = std::mem::take(&mut p.close_replies);
        }
        for (conn, req, err) in done {
            if let Some(c) = self.conns.get_mut(&conn) {
                match err {
                    None => c.ok_for(req, proto::INPUT, json!({})),
                    Some(m) => c.error_for(req, proto::INPUT, kind::IO, &m),
                }
            }
        }
        for (conn, req) in closed {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.ok_for(req, proto::CLOSE_STDIN, json!({}));
            }
        }
        self.recount_pending_input();
    }

    fn recount_pending_input(&mut self) {
        for c in self.conns.values_mut() {
            c.pending_input = 0;
        }
        for p in self.procs.values() {
            for i in &p.stdin_queue {
                if let Some(c) = self.conns.get_mut(&i.conn) {
                    c.pending_input += i.data.len() - i.pos;
                }
            }
        }
    }

    /// Marks processes ended once reaped and drained (or the grace passed).
    fn finish_processes(&mut self) {
        let now = Instant::now();
        let mut failed: Vec<(u64, u32, u8)> = Vec::new();
        let held: Vec<u32> = self
            .procs
            .iter()
            .filter(|(id, p)| (0..2).any(|s| paused(&self.conns, **id, p, s)))
            .map(|(id, _)| *id)
            .collect();
        for (id, p) in self.procs.iter_mut() {
            if p.ended || p.status.is_none() {
                continue;
            }
            let drained = p.out.iter().all(|o| o.is_none());
            // Output held back for a lagging reader is not given up on after the grace.
            let late = p.reaped_at.is_some_and(|at| now >= at + EXIT_GRACE) && !held.contains(id);
            if drained || late {
                p.out = [None, None];
                p.stdin = None;
                p.ended = true;
                failed.extend(p.stdin_queue.drain(..).map(|i| (i.conn, i.id, proto::INPUT)));
                failed.extend(p.close_replies.drain(..).map(|(conn, id)| (conn, id, proto::CLOSE_STDIN)));
            }
        }
        for (conn, req, answers) in failed {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.error_for(req, answers, kind::IO, "the process has ended");
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                if matches!(sys::errno(), libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) {
                    // Out of fds: the pending connection stays readable, so stop polling
                    // the socket for a moment rather than spin on it.
                    self.accept_paused_until = Some(Instant::now() + Duration::from_millis(100));
                }
                return;
            }
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            if self.conns.len() >= MAX_CONNECTIONS {
                continue;
            }
            let id = self.next_conn;
            self.next_conn += 1;
            self.conns.insert(
                id,
                Conn {
                    fd,
                    reader: FrameReader::new(),
                    out: Vec::new(),
                    out_pos: 0,
                    hello: false,
                    closing: false,
                    dead: false,
                    attach: BTreeMap::new(),
                    pending_input: 0,
                    files: ConnFiles::default(),
                    answering: 0,
                },
            );
        }
    }

    fn on_conn(&mut self, id: u64, revents: i16) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if revents & libc::POLLOUT != 0 {
            flush(c);
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            if c.wants_input() {
                match sys::read(c.fd.as_raw_fd(), &mut self.buf) {
                    Ok(0) => c.dead = true,
                    Ok(n) => c.reader.push(&self.buf[..n]),
                    Err(e) if sys::would_block(&e) => {}
                    Err(_) => c.dead = true,
                }
            } else if revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                // Gone while it was not being read: nothing it could receive any more.
                c.dead = true;
            }
        }
        self.handle_frames(id);
    }

    /// Handles complete frames already read while the connection has room for the
    /// replies (and its INPUT is not piling up). Called after every loop turn too: a
    /// limit may clear without any event on the connection itself.
    fn handle_frames(&mut self, id: u64) {
        loop {
            let Some(c) = self.conns.get_mut(&id) else { return };
            if c.closing || c.queued() >= HIGH_WATER || c.pending_input >= MAX_PENDING_INPUT {
                break;
            }
            match c.reader.next_frame() {
                Ok(Some(frame)) => self.on_frame(id, frame),
                Ok(None) => break,
                Err(_) => {
                    // Unframeable bytes: nothing after them can be trusted.
                    c.dead = true;
                    break;
                }
            }
        }
    }

    fn on_frame(&mut self, cid: u64, frame: frames::Frame) {
        let frames::Frame { kind: t, id, payload } = frame;
        let Some(c) = self.conns.get_mut(&cid) else { return };
        c.answering = t;
        if !c.hello {
            if t != proto::HELLO {
                c.error(id, kind::PROTOCOL, "the first frame must be HELLO");
                c.closing = true;
                return;
            }
            match serde_json::from_slice::<proto::Hello>(&payload) {
                Ok(h) if h.version == proto::PROTOCOL_VERSION => {
                    c.hello = true;
                    c.send_json(
                        proto::HELLO_OK,
                        0,
                        json!({"version": proto::PROTOCOL_VERSION, "runner": proto::RUNNER_VERSION,
                               "pid": std::process::id(), "max_frame": MAX_PAYLOAD}),
                    );
                }
                Ok(h) => {
                    c.error(
                        id,
                        kind::UNSUPPORTED,
                        &format!("protocol version {} is not supported (this runner speaks 1)", h.version),
                    );
                    c.closing = true;
                }
                Err(e) => {
                    c.error(id, kind::INVALID, &format!("bad HELLO payload: {e}"));
                    c.closing = true;
                }
            }
            return;
        }
        match t {
            proto::SPAWN => self.spawn(cid, id, &payload),
            proto::INPUT => self.input(cid, id, payload),
            proto::CLOSE_STDIN => self.close_stdin(cid, id),
            proto::RESIZE => self.resize(cid, id, &payload),
            proto::SIGNAL => self.signal(cid, id, &payload),
            proto::ATTACH => self.attach(cid, id, &payload),
            proto::DETACH => {
                let known = self.procs.contains_key(&id);
                let c = self.conns.get_mut(&cid).unwrap();
                c.attach.remove(&id);
                if !known {
                    c.error(id, kind::NOT_FOUND, "no such process");
                }
            }
            proto::LIST => self.list(cid, id),
            proto::FORGET => self.forget(cid, id),
            proto::PING => {
                if payload.len() > proto::MAX_PING {
                    c.error(id, kind::INVALID, "a PING payload is at most 64 bytes");
                } else {
                    c.send(proto::PONG, id, &payload);
                }
            }
            proto::FILE => files::op(&mut c.files, id, &payload, &mut c.out),
            proto::DATA => files::data(&mut c.files, id, &payload, &mut c.out),
            proto::END => files::end(&mut c.files, id, &mut c.out),
            proto::HELLO => c.error(id, kind::PROTOCOL, "HELLO was already received"),
            other => c.error(id, kind::PROTOCOL, &format!("unknown frame type 0x{other:02x}")),
        }
    }

    fn spawn(&mut self, cid: u64, id: u32, payload: &[u8]) {
        let c = self.conns.get_mut(&cid).unwrap();
        if self.procs.contains_key(&id) {
            return c.error(id, kind::EXISTS, &format!("process id {id} is in use (FORGET it first)"));
        }
        if self.procs.len() >= proto::MAX_PROCESSES {
            return c.error(id, kind::TOO_LARGE, "too many processes are kept (FORGET ended ones)");
        }
        let spawn = match Spawn::parse(payload) {
            Ok(s) => s,
            Err(m) => return c.error(id, kind::INVALID, &m),
        };
        let leaf = self.cgroups.as_mut().and_then(|cg| cg.leaf(id));
        let started = match process::start(&spawn, leaf.as_ref().map(|(_, fd)| fd.as_raw_fd())) {
            Ok(s) => s,
            Err(e) => {
                if let Some((path, _)) = &leaf {
                    cgroup::remove(path);
                }
                return c.error(id, kind::IO, &format!("cannot start the process: {e}"));
            }
        };
        let leaf = leaf.map(|(path, _)| path);
        c.attach.insert(id, Attach { next: [0, 0], exit_sent: false });
        let ring = spawn.ring();
        self.procs.insert(
            id,
            Proc {
                argv: spawn.argv,
                tty: spawn.tty,
                keeper: started.keeper,
                keeper_alive: true,
                pid: None,
                started: false,
                spawn_reply: Some((cid, id)),
                cwd: spawn.cwd,
                control: Some(started.control),
                control_buf: Vec::new(),
                exec_status: Some(started.exec_status),
                exec_buf: Vec::new(),
                exec_ok: false,
                stdin: started.stdin,
                stdin_queue: VecDeque::new(),
                close_replies: Vec::new(),
                out: [Some(started.out), started.err],
                rings: [Ring::new(ring), Ring::new(ring)],
                backpressure: spawn.backpressure,
                leaf,
                status: None,
                reaped_at: None,
                ended: false,
                pending_signals: Vec::new(),
            },
        );
    }

    fn input(&mut self, cid: u64, id: u32, data: Vec<u8>) {
        let c = self.conns.get_mut(&cid).unwrap();
        let Some(p) = self.procs.get_mut(&id) else { return c.error(id, kind::NOT_FOUND, "no such process") };
        // A client may send INPUT right behind SPAWN: it waits for the child's start.
        if p.stdin.is_none() || !p.close_replies.is_empty() {
            let why = if p.ended { "the process has ended" } else { "the process's stdin is closed" };
            return c.error(id, kind::INVALID, why);
        }
        c.pending_input += data.len();
        p.stdin_queue.push_back(Input { conn: cid, id, data, pos: 0 });
        self.write_stdin(id);
    }

    fn close_stdin(&mut self, cid: u64, id: u32) {
        let c = self.conns.get_mut(&cid).unwrap();
        let Some(p) = self.procs.get_mut(&id) else { return c.error(id, kind::NOT_FOUND, "no such process") };
        if p.tty {
            return c.error(
                id,
                kind::UNSUPPORTED,
                "a terminal has no end of input (send the EOF character ^D as INPUT)",
            );
        }
        if p.stdin.is_none() {
            return c.ok(id, json!({}));
        }
        p.close_replies.push((cid, id));
        self.write_stdin(id);
    }

    fn resize(&mut self, cid: u64, id: u32, payload: &[u8]) {
        let c = self.conns.get_mut(&cid).unwrap();
        let Some(p) = self.procs.get(&id) else { return c.error(id, kind::NOT_FOUND, "no such process") };
        let (Some(rows), Some(cols), 4) =
            (proto::be_u16(payload, 0), proto::be_u16(payload, 2), payload.len())
        else {
            return c.error(id, kind::INVALID, "RESIZE carries u16 rows and u16 cols");
        };
        if !p.tty {
            return c.error(id, kind::UNSUPPORTED, "the process has no terminal");
        }
        if rows == 0 || cols == 0 {
            return c.error(id, kind::INVALID, "rows and cols must be at least 1");
        }
        if let Some(master) = &p.out[0] {
            if let Err(e) = sys::set_winsize(master.as_raw_fd(), rows, cols) {
                return c.error(id, kind::IO, &format!("cannot resize: {e}"));
            }
        }
        c.ok(id, json!({}));
    }

    fn signal(&mut self, cid: u64, id: u32, payload: &[u8]) {
        let c = self.conns.get_mut(&cid).unwrap();
        let Some(p) = self.procs.get(&id) else { return c.error(id, kind::NOT_FOUND, "no such process") };
        let &[sig, scope] = payload else {
            return c.error(id, kind::INVALID, "SIGNAL carries u8 signal, u8 scope");
        };
        let sig = sig as i32;
        if sig > libc::SIGRTMAX() || scope > 2 {
            return c.error(id, kind::INVALID, "unknown signal number or scope");
        }
        if sig != 0 && !p.started && p.status.is_none() && p.keeper_alive {
            // Not started yet (a SIGNAL right behind its SPAWN): delivered once it is.
            self.procs.get_mut(&id).unwrap().pending_signals.push((sig, scope));
            return c.ok(id, json!({"delivered": true}));
        }
        let delivered = deliver(p, sig, scope);
        c.ok(id, json!({"delivered": delivered}));
    }

    fn attach(&mut self, cid: u64, id: u32, payload: &[u8]) {
        let c = self.conns.get_mut(&cid).unwrap();
        let Some(p) = self.procs.get(&id) else { return c.error(id, kind::NOT_FOUND, "no such process") };
        let (Some(a), Some(b), 16) = (proto::be_u64(payload, 0), proto::be_u64(payload, 8), payload.len())
        else {
            return c.error(id, kind::INVALID, "ATTACH carries u64 stdout offset, u64 stderr offset");
        };
        // An offset past the end (from another runner's stream) starts at the end.
        let next = [a.min(p.rings[0].end()), b.min(p.rings[1].end())];
        c.attach.insert(id, Attach { next, exit_sent: false });
    }

    fn list(&mut self, cid: u64, id: u32) {
        let c = self.conns.get_mut(&cid).unwrap();
        let mut entries = Vec::new();
        let mut size = 64;
        let mut truncated = false;
        let mut values = 0;
        for (pid, p) in &self.procs {
            // argv is shown, not replayed: a huge one is cut (the entry says so).
            let mut argv: Vec<&str> = Vec::new();
            let mut budget = LIST_ARGV_BYTES;
            let mut cut = false;
            for a in &p.argv {
                if argv.len() == LIST_ARGV_ENTRIES || budget == 0 {
                    cut = true;
                    break;
                }
                let piece = proto::cut(a, budget);
                cut |= piece.len() < a.len();
                budget -= piece.len();
                argv.push(piece);
            }
            let mut entry = json!({
                "id": pid, "pid": p.pid, "argv": argv, "tty": p.tty, "running": !p.ended,
                "code": p.code(), "stdout_end": p.rings[0].end(), "stderr_end": p.rings[1].end(),
            });
            if cut {
                entry["argv_truncated"] = true.into();
            }
            let len = entry.to_string().len() + 1;
            // Within one frame, and within what a careful JSON reader accepts (values
            // counted like the commas between them).
            values += 10 + argv.len();
            if size + len > MAX_PAYLOAD || values > LIST_MAX_VALUES {
                truncated = true;
                break;
            }
            size += len;
            entries.push(entry);
        }
        c.send_json(proto::LISTED, id, json!({"processes": entries, "truncated": truncated}));
    }

    fn forget(&mut self, cid: u64, id: u32) {
        let c = self.conns.get_mut(&cid).unwrap();
        let Some(p) = self.procs.get(&id) else { return c.error(id, kind::NOT_FOUND, "no such process") };
        if !p.ended {
            return c.error(id, kind::INVALID, "the process is running (signal it first)");
        }
        // What it left behind (background descendants) goes with the record.
        if p.keeper_alive {
            kill_tree(p, libc::SIGKILL);
        }
        if let Some(leaf) = self.procs.remove(&id).and_then(|mut p| p.leaf.take()) {
            if !cgroup::remove(&leaf) {
                self.stale_leaves.push(leaf);
            }
        }
        for c in self.conns.values_mut() {
            c.attach.remove(&id);
        }
        self.conns.get_mut(&cid).unwrap().ok(id, json!({}));
    }

    /// Moves stream data and downloads into every connection with room, writes, and
    /// drops dead connections.
    fn pump_all(&mut self) {
        for c in self.conns.values_mut() {
            // Until the socket is full or nothing is left: a paused stream has no fd in
            // the poll set to wake the loop, so its data must not wait for one.
            loop {
                let added = !c.dead && !c.closing && pump(c, &self.procs);
                flush(c);
                if !added || c.queued() > 0 || c.dead {
                    break;
                }
            }
            if c.closing && c.queued() == 0 {
                c.dead = true;
            }
        }
        let dead: Vec<u64> = self.conns.iter().filter(|(_, c)| c.dead).map(|(id, _)| *id).collect();
        for id in dead {
            if let Some(mut c) = self.conns.remove(&id) {
                files::abort(&mut c.files);
            }
            // Its INPUT not yet begun is dropped (nobody will hear it was written, and a
            // client reconnecting in a loop must not pile up memory); a partly written
            // one is finished, so the stream stays whole.
            for p in self.procs.values_mut() {
                p.stdin_queue.retain(|i| i.conn != id || i.pos > 0);
            }
        }
        self.recount_pending_input();
    }

    fn kill_everything(&mut self) {
        for p in self.procs.values() {
            if p.keeper_alive {
                kill_tree(p, libc::SIGKILL);
                unsafe { libc::kill(p.keeper, libc::SIGKILL) };
            }
        }
        crate::serve::remove_socket(&self.config.socket);
        if let Some(cg) = &self.cgroups {
            // Leaves empty once the kernel has finished the deaths (bounded wait).
            let mut leaves: Vec<PathBuf> = self
                .procs
                .values_mut()
                .filter_map(|p| p.leaf.take())
                .chain(self.stale_leaves.drain(..))
                .collect();
            for _ in 0..100 {
                leaves.retain(|leaf| !cgroup::remove(leaf));
                if leaves.is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = std::fs::remove_dir(cg.parent());
        }
    }
}

/// Sends `sig` to a process's whole tree: for SIGKILL, its cgroup leaf's `cgroup.kill`
/// first (when it has one), then the keeper's sweep of its descendants either way.
/// True when something was signalled.
/// Sends `sig` to the process (scope 0), its group (1) or its whole tree (2).
fn deliver(p: &Proc, sig: i32, scope: u8) -> bool {
    let running = p.started && p.status.is_none();
    match (scope, p.pid) {
        (0, Some(pid)) if running => unsafe { libc::kill(pid, sig) == 0 },
        // The group outlives its leader while members live; the keeper holds them.
        (1, Some(pid)) if running || p.keeper_alive => unsafe { libc::kill(-pid, sig) == 0 },
        (2, _) if p.keeper_alive => kill_tree(p, sig),
        _ => false,
    }
}

fn kill_tree(p: &Proc, sig: i32) -> bool {
    let mut delivered = false;
    if let (Some(leaf), libc::SIGKILL) = (&p.leaf, sig) {
        let members = std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap_or_default();
        delivered = !members.trim().is_empty() && cgroup::kill(leaf).is_ok();
    }
    (process::signal_tree(p.keeper, sig) > 0) || delivered
}

/// How many bytes of a stream may be read now without dropping any an attached
/// connection has not received (unbounded without backpressure: the ring drops).
fn room(conns: &BTreeMap<u64, Conn>, id: u32, p: &Proc, s: usize) -> usize {
    let ring = &p.rings[s];
    // A ring of 0 bytes keeps nothing to protect.
    if !p.backpressure || ring.capacity() == 0 {
        return usize::MAX;
    }
    let lag =
        conns.values().filter_map(|c| c.attach.get(&id)).map(|a| ring.end() - a.next[s]).max().unwrap_or(0);
    ring.capacity().saturating_sub(lag as usize)
}

/// Whether a backpressure process's stream is not read now: some attached connection
/// is a whole ring behind on it.
fn paused(conns: &BTreeMap<u64, Conn>, id: u32, p: &Proc, s: usize) -> bool {
    p.out[s].is_some() && room(conns, id, p, s) == 0
}

/// Fills `c` from the rings of its attached processes (round robin, one chunk per
/// stream per round) and its downloads, while it has room.
fn pump(c: &mut Conn, procs: &BTreeMap<u32, Proc>) -> bool {
    c.attach.retain(|id, _| procs.contains_key(id));
    let mut added = false;
    loop {
        let mut progress = false;
        for (id, a) in c.attach.iter_mut() {
            if c.out.len() - c.out_pos >= HIGH_WATER {
                return true;
            }
            let p = &procs[id];
            if !p.started {
                continue;
            }
            for s in 0..2 {
                let ring = &p.rings[s];
                if a.next[s] < ring.start() {
                    let parts: [&[u8]; 3] =
                        [&[s as u8 + 1], &a.next[s].to_be_bytes(), &ring.start().to_be_bytes()];
                    frames::encode_parts_into(&mut c.out, proto::GAP, *id, &parts);
                    a.next[s] = ring.start();
                    progress = true;
                }
                if a.next[s] < ring.end() {
                    let chunk = ring.read(a.next[s], CHUNK);
                    let parts: [&[u8]; 3] = [&[s as u8 + 1], &a.next[s].to_be_bytes(), &chunk];
                    frames::encode_parts_into(&mut c.out, proto::OUTPUT, *id, &parts);
                    a.next[s] += chunk.len() as u64;
                    progress = true;
                }
            }
            if let (Some(code), false) = (p.code(), a.exit_sent) {
                if a.next[0] == p.rings[0].end() && a.next[1] == p.rings[1].end() {
                    let body = serde_json::to_vec(&json!({"code": code})).unwrap_or_default();
                    frames::encode_into(&mut c.out, proto::EXIT, *id, &body);
                    a.exit_sent = true;
                }
            }
        }
        if c.queued() < HIGH_WATER && files::pump(&mut c.files, &mut c.out) {
            progress = true;
        }
        if !progress {
            return added;
        }
        added = true;
    }
}

/// Writes what is queued until the socket would block.
fn flush(c: &mut Conn) {
    while c.out_pos < c.out.len() {
        match sys::write(c.fd.as_raw_fd(), &c.out[c.out_pos..]) {
            Ok(n) => c.out_pos += n,
            Err(e) if sys::would_block(&e) => break,
            Err(_) => {
                c.dead = true;
                break;
            }
        }
    }
    if c.out_pos == c.out.len() {
        c.out.clear();
        c.out_pos = 0;
    } else if c.out_pos > HIGH_WATER {
        c.out.drain(..c.out_pos);
        c.out_pos = 0;
    }
}
