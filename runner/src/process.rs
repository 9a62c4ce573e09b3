//! Starting a process under its keeper, and ending process trees.
//!
//! Per SPAWN the runner forks a keeper (this binary's code, no exec). The keeper marks
//! itself a child subreaper, starts its own session, and forks the real child. Every
//! descendant that double-forks or calls setsid re-parents to the keeper, never past it,
//! so `/proc/<keeper>/task/*/children`, walked recursively, is the whole tree. The keeper
//! reports to the runner over a pipe in 8-byte records (tag, value): STARTED(pid) as soon
//! as it forked the child (or a setup error), and EXITED(wait status) when it reaps the
//! child; it then keeps reaping descendants and exits when none is left.
//!
//! Whether the exec worked goes straight from the child to the runner, through a second,
//! close-on-exec pipe: end-of-file without a record means the exec succeeded, a record
//! says why it failed. The runner learns of a start without waiting for the keeper to
//! wake up and relay it.

use crate::proto::{kind, Spawn, StdinMode};
use crate::sys;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Keeper record: the child was forked; value = its pid.
pub const REC_STARTED: u32 = 1;
/// Keeper/child record: chdir failed; value = errno.
pub const REC_ERR_CHDIR: u32 = 2;
/// Child record: exec failed; value = errno.
pub const REC_ERR_EXEC: u32 = 3;
/// Keeper/child record: another setup step failed; value = errno.
pub const REC_ERR_SETUP: u32 = 4;
/// Keeper record: the child was reaped; value = its wait status.
pub const REC_EXITED: u32 = 5;

/// The fds the runner keeps for a started process.
pub struct Started {
    pub keeper: libc::pid_t,
    /// The keeper's record pipe (read end, non-blocking).
    pub control: OwnedFd,
    /// The child's exec status pipe (read end, non-blocking): EOF alone = exec'd.
    pub exec_status: OwnedFd,
    /// Where INPUT goes: the stdin pipe, or the pty master (shared with `out`).
    pub stdin: Option<OwnedFd>,
    /// stdout (or the pty master, or stdout+stderr when merged).
    pub out: OwnedFd,
    pub err: Option<OwnedFd>,
}

/// Maps a failed SPAWN record to the ERROR kind and message.
pub fn spawn_error(tag: u32, errno: i32, argv0: &str, cwd: Option<&str>) -> (&'static str, String) {
    let why = io::Error::from_raw_os_error(errno);
    match tag {
        REC_ERR_CHDIR => (kind::WORKDIR, format!("cannot enter {}: {why}", cwd.unwrap_or("?"))),
        REC_ERR_EXEC
            if matches!(
                errno,
                libc::ENOENT | libc::EACCES | libc::ENOTDIR | libc::ENOEXEC | libc::ELOOP | libc::EISDIR
            ) =>
        {
            (kind::COMMAND_NOT_FOUND, format!("{argv0}: {why}"))
        }
        REC_ERR_EXEC => (kind::IO, format!("cannot execute {argv0}: {why}")),
        _ => (kind::IO, format!("cannot set up the process: {why}")),
    }
}

/// The exit code of a wait status: the code, or 128+N for signal N.
pub fn exit_code(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// The fd limit the runner was started with (children get it back).
static ORIGINAL_NOFILE: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

/// Raises the runner's soft fd limit to the hard one (each process costs it up to four
/// fds); every child starts with the original limit again, since some programs walk
/// every possible fd at start.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        let _ = ORIGINAL_NOFILE.set(lim);
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
}

/// The default PATH when the child's environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything the child needs, prepared before fork.
struct ExecPlan {
    /// Candidate program paths, in PATH order.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: Option<CString>,
}

impl ExecPlan {
    fn new(spawn: &Spawn) -> ExecPlan {
        let env: Vec<(String, String)> = match &spawn.env {
            Some(map) => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            None => std::env::vars_os()
                .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
                .collect(),
        };
        let prog = &spawn.argv[0];
        let candidates = if prog.contains('/') {
            vec![sys::cstring(prog)]
        } else {
            let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or(DEFAULT_PATH);
            path.split(':')
                .map(|dir| if dir.is_empty() { "." } else { dir })
                .map(|dir| sys::cstring(&format!("{}/{prog}", dir.trim_end_matches('/'))))
                .collect()
        };
        ExecPlan {
            candidates,
            argv: spawn.argv.iter().map(|a| sys::cstring(a)).collect(),
            env: env.iter().map(|(k, v)| sys::cstring(&format!("{k}={v}"))).collect(),
            cwd: spawn.cwd.as_deref().map(sys::cstring),
        }
    }
}

fn ptrs(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

fn record(fd: RawFd, tag: u32, value: i32) {
    let mut rec = [0u8; 8];
    rec[..4].copy_from_slice(&tag.to_be_bytes());
    rec[4..].copy_from_slice(&value.to_be_bytes());
    let _ = sys::write_all(fd, &rec);
}

/// Restores what a new program expects: default dispositions, empty mask.
fn reset_signals() {
    unsafe {
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Starts `spawn` under a new keeper. Errors here are the runner's own (pipes, pty, fork);
/// the child's errors arrive later as keeper records.
pub fn start(spawn: &Spawn, leaf: Option<RawFd>) -> io::Result<Started> {
    let plan = ExecPlan::new(spawn);
    // (child side, runner side) of each standard stream.
    let (stdin_child, stdin_runner, out_child, out_runner, err_child, err_runner, slave);
    if spawn.tty {
        let (master, s) = sys::open_pty(spawn.rows, spawn.cols)?;
        stdin_child = None;
        out_child = None;
        err_child = None;
        // A terminal stays the child's stdin either way; "closed" only refuses INPUT.
        stdin_runner = if spawn.stdin_mode() == StdinMode::Open { Some(master.try_clone()?) } else { None };
        out_runner = master;
        err_runner = None;
        slave = Some(s);
    } else {
        let (r, w) = sys::pipe()?;
        if spawn.stdin_mode() == StdinMode::Open {
            stdin_child = Some(r);
            stdin_runner = Some(w);
        } else {
            // A pipe whose write end is closed at once: the child reads EOF.
            stdin_child = Some(r);
            stdin_runner = None;
            drop(w);
        }
        let (r, w) = sys::pipe()?;
        out_child = Some(w);
        out_runner = r;
        if spawn.merge_stderr {
            err_child = None;
            err_runner = None;
        } else {
            let (r, w) = sys::pipe()?;
            err_child = Some(w);
            err_runner = Some(r);
        }
        slave = None;
    }
    let (control_r, control_w) = sys::pipe()?;
    let (exec_r, exec_w) = sys::pipe()?;
    let keeper = unsafe { libc::fork() };
    if keeper == -1 {
        return Err(io::Error::last_os_error());
    }
    if keeper == 0 {
        let child_fds = ChildFds {
            stdin: stdin_child.as_ref().map(|f| f.as_raw_fd()),
            out: out_child.as_ref().map(|f| f.as_raw_fd()),
            err: err_child.as_ref().map(|f| f.as_raw_fd()),
            slave: slave.as_ref().map(|f| f.as_raw_fd()),
            status: exec_w.as_raw_fd(),
            leaf,
        };
        keeper_main(&plan, child_fds, control_w.as_raw_fd(), spawn.tty);
    }
    drop((stdin_child, out_child, err_child, slave, control_w, exec_w));
    sys::set_nonblocking(control_r.as_raw_fd())?;
    sys::set_nonblocking(exec_r.as_raw_fd())?;
    sys::set_nonblocking(out_runner.as_raw_fd())?;
    if let Some(fd) = &err_runner {
        sys::set_nonblocking(fd.as_raw_fd())?;
    }
    if let Some(fd) = &stdin_runner {
        sys::set_nonblocking(fd.as_raw_fd())?;
    }
    Ok(Started {
        keeper,
        control: control_r,
        exec_status: exec_r,
        stdin: stdin_runner,
        out: out_runner,
        err: err_runner,
    })
}

/// The child's ends of its standard streams (raw, owned by the forked image).
struct ChildFds {
    stdin: Option<RawFd>,
    out: Option<RawFd>,
    err: Option<RawFd>,
    slave: Option<RawFd>,
    /// The write end of the exec status pipe (close-on-exec).
    status: RawFd,
    /// The cgroup leaf to start the child in, if any.
    leaf: Option<RawFd>,
}

/// clone3's argument (linux/sched.h, the fields up to `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Like fork, but the child starts inside the cgroup `leaf`; falls back to fork where
/// the kernel refuses (no clone3, or the leaf cannot take it).
fn fork_into(leaf: Option<RawFd>) -> libc::pid_t {
    if let Some(fd) = leaf {
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: fd as u64,
            ..CloneArgs::default()
        };
        // Without CLONE_VM this is a fork: the child runs on its copy of this stack.
        let r = unsafe {
            libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
        };
        if r >= 0 {
            return r as libc::pid_t;
        }
    }
    unsafe { libc::fork() }
}

/// The keeper: never returns.
fn keeper_main(plan: &ExecPlan, fds: ChildFds, control: RawFd, tty: bool) -> ! {
    let keep: Vec<RawFd> =
        [fds.stdin, fds.out, fds.err, fds.slave, Some(fds.status), Some(control), fds.leaf]
            .into_iter()
            .flatten()
            .collect();
    // Drop the runner's sockets and other processes' fds: only this tree's remain.
    sys::close_fds_except(3, &keep);
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        // Told apart from the runner in ps (comm only; the arguments stay the runner's).
        libc::prctl(libc::PR_SET_NAME, c"runner-keeper".as_ptr(), 0, 0, 0);
        libc::setsid();
        // The runner may die; the keeper's record writes must not kill it.
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    let child = fork_into(fds.leaf);
    if child == -1 {
        record(control, REC_ERR_SETUP, sys::errno());
        unsafe { libc::_exit(1) }
    }
    if child == 0 {
        unsafe { libc::close(control) };
        child_main(plan, &fds, fds.status, tty);
    }
    record(control, REC_STARTED, child);
    for fd in [fds.stdin, fds.out, fds.err, fds.slave, Some(fds.status), fds.leaf].into_iter().flatten() {
        unsafe { libc::close(fd) };
    }
    // Reap the child and every descendant that re-parents here, until none is left.
    loop {
        let mut status = 0;
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == child {
            record(control, REC_EXITED, status);
        } else if pid == -1 && sys::errno() != libc::EINTR {
            break;
        }
    }
    unsafe { libc::_exit(0) }
}

/// The real child: never returns.
fn child_main(plan: &ExecPlan, fds: &ChildFds, status: RawFd, tty: bool) -> ! {
    let fail = |tag: u32, errno: i32| -> ! {
        record(status, tag, errno);
        unsafe { libc::_exit(127) }
    };
    reset_signals();
    if let Some(lim) = ORIGINAL_NOFILE.get() {
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) };
    }
    unsafe { libc::setsid() };
    // Move the sources above 2 first so dup2 onto 0..2 cannot clobber one of them.
    let lift = |fd: Option<RawFd>| fd.map(|fd| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) });
    let (stdin, out, err, slave) = (lift(fds.stdin), lift(fds.out), lift(fds.err), lift(fds.slave));
    let targets: [Option<RawFd>; 3] = if tty {
        if unsafe { libc::ioctl(slave.unwrap_or(-1), libc::TIOCSCTTY, 0) } == -1 {
            fail(REC_ERR_SETUP, sys::errno());
        }
        [slave, slave, slave]
    } else {
        [stdin, out, err.or(out)]
    };
    for (target, src) in targets.iter().enumerate() {
        if let Some(src) = src {
            if unsafe { libc::dup2(*src, target as RawFd) } == -1 {
                fail(REC_ERR_SETUP, sys::errno());
            }
        }
    }
    // Every fd above 2 closes at exec (the status pipe too: its EOF means success).
    let r = unsafe {
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 4 as libc::c_uint)
    };
    if r != 0 {
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            let list: Vec<RawFd> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
            for fd in list.into_iter().filter(|&fd| fd > 2 && fd != status) {
                unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            }
        }
    }
    if let Some(cwd) = &plan.cwd {
        if unsafe { libc::chdir(cwd.as_ptr()) } == -1 {
            fail(REC_ERR_CHDIR, sys::errno());
        }
    }
    let argv = ptrs(&plan.argv);
    let env = ptrs(&plan.env);
    // Like execvpe: the first candidate that is not missing; EACCES remembered.
    let mut last = libc::ENOENT;
    let mut denied = false;
    for path in &plan.candidates {
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), env.as_ptr()) };
        let e = sys::errno();
        match e {
            libc::ENOEXEC => {
                // A script without a #! line: run it with the shell, as execvp does.
                let mut sh_argv = vec![c"/bin/sh".as_ptr(), path.as_ptr()];
                sh_argv.extend_from_slice(&argv[1..]);
                unsafe { libc::execve(c"/bin/sh".as_ptr(), sh_argv.as_ptr(), env.as_ptr()) };
                fail(REC_ERR_EXEC, libc::ENOEXEC);
            }
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG => {}
            _ => {
                last = e;
                break;
            }
        }
        last = e;
    }
    if denied && matches!(last, libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG) {
        last = libc::EACCES;
    }
    fail(REC_ERR_EXEC, last)
}

/// The pids below `root` (children first, then theirs), read from
/// /proc/<pid>/task/*/children; zombies are left out (they are already dead).
pub fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            let Ok(text) = std::fs::read_to_string(path) else { continue };
            for child in text.split_ascii_whitespace().filter_map(|s| s.parse::<libc::pid_t>().ok()) {
                if out.len() >= 1_000_000 {
                    return out;
                }
                if !is_zombie(child) {
                    out.push(child);
                }
                todo.push(child);
            }
        }
    }
    out
}

fn is_zombie(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the last ')' (the command name may hold parentheses).
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Sends `sig` to every descendant of `keeper`. For SIGKILL it repeats until none is
/// left, so a process forking while it is being killed cannot leave a survivor (its new
/// children re-parent to the keeper and are found by the next pass). Returns how many
/// signals were sent.
pub fn signal_tree(keeper: libc::pid_t, sig: i32) -> usize {
    let mut sent = 0;
    for pass in 0..200 {
        let pids = descendants(keeper);
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            if unsafe { libc::kill(*pid, sig) } == 0 {
                sent += 1;
            }
        }
        if sig != libc::SIGKILL {
            break;
        }
        // Let the kernel finish the deaths before looking again (bounded: 200 passes).
        let pause = if pass < 10 { 200 } else { 2000 };
        std::thread::sleep(std::time::Duration::from_micros(pause));
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(3 << 8), 3);
        assert_eq!(exit_code(libc::SIGKILL), 137);
        assert_eq!(exit_code(0), 0);
    }

    #[test]
    fn path_search_uses_the_child_environment() {
        let spawn = Spawn::parse(br#"{"argv": ["prog", "x"], "env": {"PATH": "/a:/b/"}}"#).unwrap();
        let plan = ExecPlan::new(&spawn);
        let c: Vec<_> = plan.candidates.iter().map(|c| c.to_str().unwrap().to_owned()).collect();
        assert_eq!(c, ["/a/prog", "/b/prog"]);
        assert_eq!(plan.env.len(), 1);
        let spawn = Spawn::parse(br#"{"argv": ["./x"], "env": {}}"#).unwrap();
        assert_eq!(ExecPlan::new(&spawn).candidates.len(), 1);
        let spawn = Spawn::parse(br#"{"argv": ["ls"], "env": {}}"#).unwrap();
        assert_eq!(ExecPlan::new(&spawn).candidates[0].to_str().unwrap(), "/usr/local/sbin/ls");
    }

    #[test]
    fn spawn_errors_map_to_kinds() {
        assert_eq!(spawn_error(REC_ERR_EXEC, libc::ENOENT, "x", None).0, kind::COMMAND_NOT_FOUND);
        assert_eq!(spawn_error(REC_ERR_EXEC, libc::EACCES, "x", None).0, kind::COMMAND_NOT_FOUND);
        assert_eq!(spawn_error(REC_ERR_CHDIR, libc::ENOENT, "x", Some("/nope")).0, kind::WORKDIR);
        assert_eq!(spawn_error(REC_ERR_EXEC, libc::E2BIG, "x", None).0, kind::IO);
    }
}
