//! Thin wrappers over the libc calls the runner makes, returning `io::Result`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `Err(last_os_error)` when `ret` is -1.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The current errno.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets O_NONBLOCK on `fd`.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// One read(2); `Ok(0)` is EOF.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One write(2).
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes all of `buf` to a blocking fd (used only by the keeper and the starter).
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether an error means "try again later" on a non-blocking fd.
pub fn would_block(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR))
}

/// A C string from a Rust one (callers have refused NUL bytes already).
pub fn cstring(s: &str) -> CString {
    CString::new(s.as_bytes().to_vec()).unwrap_or_default()
}

/// Opens a new pseudo-terminal of rows x cols: (master, slave), both close-on-exec.
pub fn open_pty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let master = cvt(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    cvt(unsafe { libc::grantpt(master.as_raw_fd()) })?;
    cvt(unsafe { libc::unlockpt(master.as_raw_fd()) })?;
    let mut name = [0 as libc::c_char; 128];
    let r = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    let slave = cvt(unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    set_winsize(master.as_raw_fd(), rows, cols)?;
    Ok((master, slave))
}

/// Sets a terminal's size.
pub fn set_winsize(fd: RawFd, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    cvt(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// Closes every fd from `low` up except those in `keep` (sorted or not). Uses
/// close_range where the kernel has it, else walks /proc/self/fd.
pub fn close_fds_except(low: RawFd, keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd >= low).collect();
    keep.sort_unstable();
    keep.dedup();
    let close_range = |from: libc::c_uint, to: libc::c_uint| unsafe {
        libc::syscall(libc::SYS_close_range, from, to, 0 as libc::c_uint) == 0
    };
    let mut from = low as libc::c_uint;
    let mut ok = true;
    for &k in &keep {
        let k = k as libc::c_uint;
        if k > from {
            ok &= close_range(from, k - 1);
        }
        from = k + 1;
    }
    ok &= close_range(from, libc::c_uint::MAX);
    if ok {
        return;
    }
    // Old kernel: list the open fds first, then close them (closing while reading the
    // directory would close the directory's own fd).
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(_) => (low..1024).collect(),
    };
    for fd in fds {
        if fd >= low && !keep.contains(&fd) {
            unsafe { libc::close(fd) };
        }
    }
}

/// Ensures fds 0, 1 and 2 are open (on /dev/null, else on a pipe), so no fd the runner
/// creates later can land on a standard number.
pub fn occupy_stdio() {
    for fd in 0..3 {
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
            if null == -1 {
                let mut p = [0; 2];
                unsafe { libc::pipe(p.as_mut_ptr()) };
            }
        }
    }
}
