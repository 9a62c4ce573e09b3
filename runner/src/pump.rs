//! The `connect` bridge's copy loop: stdin to the runner's socket and the socket to
//! stdout, with bounded buffers, until either side ends. What passes is turned by a
//! `Codec`: as it is (the binary bridge), or base64 lines (`connect --text`).

use crate::sys;
use std::os::fd::RawFd;

/// How much each direction may hold before the bridge stops reading its source.
const CAP: usize = 256 * 1024;
/// The most read from either side at once.
const READ: usize = 64 * 1024;

/// What the bridge does to the bytes on their way.
pub trait Codec {
    /// Input from the stream (`end`: nothing more will come) appended to `out` as the
    /// socket's bytes. Ok(true) ends the input (an end line); Err says why the input is
    /// bad (the bridge then exits 1).
    fn input(&mut self, data: &[u8], end: bool, out: &mut Vec<u8>) -> Result<bool, String>;
    /// The socket's bytes appended to `out` as the stream's.
    fn output(&mut self, data: &[u8], out: &mut Vec<u8>);
}

/// Bytes as they are.
pub struct Raw;

impl Codec for Raw {
    fn input(&mut self, data: &[u8], _end: bool, out: &mut Vec<u8>) -> Result<bool, String> {
        out.extend_from_slice(data);
        Ok(false)
    }

    fn output(&mut self, data: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(data);
    }
}

/// Copies `input` to `sock` and `sock` to `output` through `codec` until either side
/// ends (exit 0) or the input is bad (exit 1, said on stderr as `what: bad input`).
pub fn pump(input: RawFd, output: RawFd, sock: RawFd, codec: &mut dyn Codec, what: &str) -> i32 {
    for fd in [input, output, sock] {
        let _ = sys::set_nonblocking(fd);
    }
    let mut to_sock: Vec<u8> = Vec::new();
    let mut to_out: Vec<u8> = Vec::new();
    let (mut in_open, mut sock_open) = (true, true);
    let mut buf = vec![0u8; READ];
    loop {
        if (!in_open && to_sock.is_empty()) || (!sock_open && to_out.is_empty()) {
            return 0;
        }
        let mut fds = [
            libc::pollfd {
                fd: if in_open && to_sock.len() < CAP { input } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if sock_open && to_out.len() < CAP { sock } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if to_sock.is_empty() { -1 } else { sock },
                events: libc::POLLOUT,
                revents: 0,
            },
            libc::pollfd {
                fd: if to_out.is_empty() { -1 } else { output },
                events: libc::POLLOUT,
                revents: 0,
            },
        ];
        if unsafe { libc::poll(fds.as_mut_ptr(), 4, -1) } < 0 && sys::errno() != libc::EINTR {
            return 1;
        }
        if fds[0].revents != 0 {
            let read = match sys::read(input, &mut buf) {
                Ok(0) => {
                    in_open = false;
                    Some(0)
                }
                Ok(n) => Some(n),
                Err(e) if sys::would_block(&e) => None,
                Err(_) => {
                    in_open = false;
                    Some(0)
                }
            };
            if let Some(n) = read {
                match codec.input(&buf[..n], !in_open, &mut to_sock) {
                    Ok(true) => in_open = false,
                    Ok(false) => {}
                    Err(message) => {
                        eprintln!("sandbox-runner: {what}: bad input: {message}");
                        return 1;
                    }
                }
            }
        }
        if fds[1].revents != 0 {
            match sys::read(sock, &mut buf) {
                Ok(0) => sock_open = false,
                Ok(n) => codec.output(&buf[..n], &mut to_out),
                Err(e) if sys::would_block(&e) => {}
                Err(_) => sock_open = false,
            }
        }
        if fds[2].revents != 0 {
            match sys::write(sock, &to_sock) {
                Ok(n) => drop(to_sock.drain(..n)),
                Err(e) if sys::would_block(&e) => {}
                Err(_) => return 0,
            }
        }
        if fds[3].revents != 0 {
            match sys::write(output, &to_out) {
                Ok(n) => drop(to_out.drain(..n)),
                Err(e) if sys::would_block(&e) => {}
                Err(_) => return 0,
            }
        }
    }
}
