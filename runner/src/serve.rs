//! Starting the server: the socket (mode 0600 in a 0700 folder), the "already running"
//! check under a lock, `--detach`, and the `connect` bridge.

use crate::server::{Config, Server};
use crate::sys;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long (at most 107 bytes)"));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Ok((addr, len))
}

fn unix_socket() -> io::Result<OwnedFd> {
    let fd = sys::cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A connected (blocking) socket to a runner at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let (addr, len) = sockaddr(path)?;
    let fd = unix_socket()?;
    sys::cvt(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(fd)
}

/// Holds an exclusive flock on `<socket>.lock` while deciding who serves.
struct Lock {
    _fd: OwnedFd,
}

fn lock(socket: &Path) -> io::Result<Lock> {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fd =
        sys::cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) })?;
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    sys::cvt(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) })?;
    Ok(Lock { _fd: fd })
}

/// What `listen` found.
pub enum Listening {
    /// A live runner already accepts on the path.
    AlreadyRunning,
    Socket(OwnedFd),
}

/// Binds the socket, unless a live runner already accepts there; a stale socket file
/// (nobody accepting) is replaced. The parent folder is created 0700.
pub fn listen(path: &Path) -> io::Result<Listening> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent)?;
        }
    }
    let _lock = lock(path)?;
    match connect(path) {
        Ok(_) => return Ok(Listening::AlreadyRunning),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            // Only a socket is replaced: a regular file at the path is somebody else's.
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(path)?;
            }
        }
        Err(_) => {}
    }
    let (addr, len) = sockaddr(path)?;
    let fd = unix_socket()?;
    // Created 0600 from the start (no window where others could connect).
    let old = unsafe { libc::umask(0o177) };
    let bound =
        sys::cvt(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) });
    unsafe { libc::umask(old) };
    bound?;
    sys::cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(Listening::Socket(fd))
}

/// Removes the socket file (at shutdown).
pub fn remove_socket(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// `serve`: returns the process exit code.
pub fn serve(socket: PathBuf, orphan_timeout: Option<std::time::Duration>, detach: bool) -> i32 {
    sys::occupy_stdio();
    if detach {
        return serve_detached(socket, orphan_timeout);
    }
    match listen(&socket) {
        Ok(Listening::AlreadyRunning) => {
            eprintln!("sandbox-runner: already running at {}", socket.display());
            0
        }
        Ok(Listening::Socket(fd)) => run(socket, orphan_timeout, fd),
        Err(e) => {
            eprintln!("sandbox-runner: cannot listen on {}: {e}", socket.display());
            1
        }
    }
}

fn run(socket: PathBuf, orphan_timeout: Option<std::time::Duration>, fd: OwnedFd) -> i32 {
    match Server::new(Config { socket, orphan_timeout }, fd) {
        Ok(server) => {
            server.run();
            0
        }
        Err(e) => {
            eprintln!("sandbox-runner: {e}");
            1
        }
    }
}

/// Forks a daemon in its own session; this process exits 0 once the daemon's socket
/// accepts (or a live runner was found), 1 if it could not start.
fn serve_detached(socket: PathBuf, orphan_timeout: Option<std::time::Duration>) -> i32 {
    let (ready_r, ready_w) = match sys::pipe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandbox-runner: {e}");
            return 1;
        }
    };
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!("sandbox-runner: fork: {}", io::Error::last_os_error());
        return 1;
    }
    if pid == 0 {
        drop(ready_r);
        unsafe { libc::setsid() };
        let _ = std::env::set_current_dir("/");
        // Relative socket paths were resolved against the starter's folder.
        let code = match listen(&socket) {
            Ok(Listening::AlreadyRunning) => {
                let _ = sys::write_all(ready_w.as_raw_fd(), b"R");
                0
            }
            Ok(Listening::Socket(fd)) => {
                let _ = sys::write_all(ready_w.as_raw_fd(), b"L");
                drop(ready_w);
                redirect_stdio();
                run(socket, orphan_timeout, fd)
            }
            Err(e) => {
                let msg = format!("E{e}");
                let _ = sys::write_all(ready_w.as_raw_fd(), msg.as_bytes());
                1
            }
        };
        unsafe { libc::_exit(code) };
    }
    drop(ready_w);
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    loop {
        match sys::read(ready_r.as_raw_fd(), &mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
        if got.first() == Some(&b'L') || got.first() == Some(&b'R') {
            break;
        }
    }
    match got.first() {
        Some(b'L') => 0,
        Some(b'R') => {
            // The daemon found a live runner and exits; reap it.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            0
        }
        _ => {
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            eprintln!(
                "sandbox-runner: could not start: {}",
                String::from_utf8_lossy(got.get(1..).unwrap_or_default())
            );
            1
        }
    }
}

fn redirect_stdio() {
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
    if null >= 0 {
        for fd in 0..3 {
            unsafe { libc::dup2(null, fd) };
        }
        if null > 2 {
            unsafe { libc::close(null) };
        }
    }
}

/// `connect`: bridges stdin/stdout to the socket until either side closes; returns the
/// exit code. With `start`, starts a detached runner first when none accepts; with
/// `text`, both directions are base64 lines (`textlink`), after the `ready` line if
/// one is asked for.
pub fn bridge(
    socket: PathBuf,
    start: bool,
    text: bool,
    ready: Option<&str>,
    orphan_timeout: Option<std::time::Duration>,
) -> i32 {
    let sock = match connect(&socket) {
        Ok(fd) => fd,
        Err(_) if start => {
            let code = start_detached(&socket, orphan_timeout);
            if code != 0 {
                return code;
            }
            match connect(&socket) {
                Ok(fd) => fd,
                Err(e) => {
                    eprintln!("sandbox-runner: cannot connect to {}: {e}", socket.display());
                    return 1;
                }
            }
        }
        Err(e) => {
            eprintln!("sandbox-runner: cannot connect to {}: {e}", socket.display());
            return 1;
        }
    };
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // O_NONBLOCK belongs to the open file, which a terminal shares with the shell:
    // give stdin and stdout their flags back when done.
    let saved: Vec<(RawFd, i32)> =
        [0, 1].iter().map(|&fd| (fd, unsafe { libc::fcntl(fd, libc::F_GETFL) })).collect();
    let code = if text {
        crate::textlink::bridge(0, 1, sock.as_raw_fd(), ready)
    } else {
        crate::pump::pump(0, 1, sock.as_raw_fd(), &mut crate::pump::Raw, "connect")
    };
    for (fd, flags) in saved {
        if flags >= 0 {
            unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        }
    }
    code
}

/// Runs `serve --detach` from this same binary and waits for it to report.
fn start_detached(socket: &Path, orphan_timeout: Option<std::time::Duration>) -> i32 {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve").arg("--socket").arg(socket).arg("--detach");
    cmd.arg("--orphan-timeout").arg(orphan_timeout.map_or(0, |d| d.as_secs()).to_string());
    // The daemon must not hold the bridge's stdio (the exec stream would never end).
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    match cmd.status() {
        Ok(s) if s.success() => 0,
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => {
            eprintln!("sandbox-runner: cannot start the runner: {e}");
            1
        }
    }
}
