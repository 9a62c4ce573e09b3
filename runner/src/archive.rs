//! Tar streams for FILE archive_out (a folder walked into a pax tar, produced a chunk at
//! a time) and archive_in (a tar unpacked into a folder as its bytes arrive).
//!
//! Neither follows a symlink: the walk reports symlinks as members, and unpacking opens
//! every folder of a member's path with O_NOFOLLOW from the destination's fd, so a
//! member cannot land outside the destination (no absolute names, no "..", no path
//! through a symlink, including one an earlier member made).

use crate::proto::kind;
use std::collections::VecDeque;
use std::ffi::{CString, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why an archive operation failed: (ERROR kind, message).
pub type Failure = (&'static str, String);

const BLOCK: usize = 512;
/// The largest value an 11-digit octal field holds (sizes, mtimes).
const OCTAL_11: u64 = 8u64.pow(11);
/// The largest pax or GNU long-name record accepted while unpacking.
const MAX_META: u64 = 1 << 20;

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

/// One ustar header block (fields that do not fit are cut: a pax header before it
/// carries them whole).
fn ustar(name: &[u8], typeflag: u8, size: u64, mode: u32, mtime: u64, link: &[u8]) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    octal(&mut h[100..108], u64::from(mode & 0o7777));
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], if size < OCTAL_11 { size } else { 0 });
    octal(&mut h[136..148], if mtime < OCTAL_11 { mtime } else { 0 });
    h[148..156].copy_from_slice(b"        ");
    h[156] = typeflag;
    h[157..157 + link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// One pax record: "<length> <key>=<value>\n", the length counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while body + len.to_string().len() > len {
        len += 1;
    }
    let mut rec = format!("{len} {key}=").into_bytes();
    rec.extend_from_slice(value);
    rec.push(b'\n');
    debug_assert_eq!(rec.len(), len);
    rec
}

/// The header blocks of one member: a pax extended header first when its name, link,
/// size or mtime does not fit ustar.
pub fn member_header(name: &[u8], typeflag: u8, size: u64, mode: u32, mtime: i64, link: &[u8]) -> Vec<u8> {
    let mut records = Vec::new();
    if name.len() >= 100 {
        records.extend(pax_record("path", name));
    }
    if link.len() >= 100 {
        records.extend(pax_record("linkpath", link));
    }
    if size >= OCTAL_11 {
        records.extend(pax_record("size", size.to_string().as_bytes()));
    }
    let mtime_field = if (0..OCTAL_11 as i64).contains(&mtime) {
        mtime as u64
    } else {
        records.extend(pax_record("mtime", mtime.to_string().as_bytes()));
        0
    };
    let mut out = Vec::new();
    if !records.is_empty() {
        let mut pax_name = b"PaxHeader/".to_vec();
        pax_name.extend_from_slice(&name[..name.len().min(80)]);
        out.extend_from_slice(&ustar(&pax_name, b'x', records.len() as u64, 0o644, mtime_field, b""));
        let pad = padding(records.len() as u64) as usize;
        out.extend(records);
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    out.extend_from_slice(&ustar(name, typeflag, size, mode, mtime_field, link));
    out
}

fn io_failure(path: &Path, e: &io::Error) -> Failure {
    let k = match e.raw_os_error() {
        Some(libc::ENOENT) => kind::NOT_FOUND,
        Some(libc::EEXIST) => kind::EXISTS,
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => kind::INVALID,
        _ => kind::IO,
    };
    (k, format!("{}: {e}", path.display()))
}

fn sorted_names(dir: &Path) -> io::Result<VecDeque<OsString>> {
    let mut names: Vec<OsString> = fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.file_name())).collect();
    names.sort();
    Ok(names.into())
}

struct Level {
    rel: PathBuf,
    names: VecDeque<OsString>,
}

/// A folder being walked into a tar stream.
pub struct TarOut {
    root: PathBuf,
    stack: Vec<Level>,
    pending: Vec<u8>,
    pending_pos: usize,
    /// The member file being copied: (file, bytes left to send, padding after).
    file: Option<(File, u64, u64)>,
    finished: bool,
}

impl TarOut {
    /// Starts the walk of the folder at `root` (members are named relative to it).
    pub fn open(root: &Path) -> Result<TarOut, Failure> {
        let meta = fs::symlink_metadata(root).map_err(|e| io_failure(root, &e))?;
        if !meta.is_dir() {
            return Err((kind::INVALID, format!("{}: not a folder", root.display())));
        }
        let names = sorted_names(root).map_err(|e| io_failure(root, &e))?;
        Ok(TarOut {
            root: root.to_path_buf(),
            stack: vec![Level { rel: PathBuf::new(), names }],
            pending: Vec::new(),
            pending_pos: 0,
            file: None,
            finished: false,
        })
    }

    /// The next bytes of the stream (at most about `max`), or None once it is complete.
    pub fn next_chunk(&mut self, max: usize) -> Result<Option<Vec<u8>>, Failure> {
        let mut out = Vec::with_capacity(max.min(1 << 16));
        while out.len() < max {
            if self.pending_pos < self.pending.len() {
                let take = (self.pending.len() - self.pending_pos).min(max - out.len());
                out.extend_from_slice(&self.pending[self.pending_pos..self.pending_pos + take]);
                self.pending_pos += take;
                continue;
            }
            self.pending.clear();
            self.pending_pos = 0;
            if let Some((file, left, pad)) = &mut self.file {
                let want = (*left).min((max - out.len()) as u64) as usize;
                let start = out.len();
                out.resize(start + want, 0);
                let n = loop {
                    match file.read(&mut out[start..]) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        other => break other,
                    }
                };
                match n {
                    // A file that shrank while it was archived is padded with zeros to
                    // the size its header announced.
                    Ok(0) => {}
                    Ok(n) => out.truncate(start + n),
                    Err(e) => return Err((kind::IO, format!("read failed while archiving: {e}"))),
                }
                *left -= (out.len() - start) as u64;
                if *left == 0 {
                    self.pending.resize(*pad as usize, 0);
                    self.file = None;
                }
                continue;
            }
            if self.finished {
                break;
            }
            self.advance()?;
        }
        Ok(if out.is_empty() { None } else { Some(out) })
    }

    /// Moves to the next member: its header into `pending`, its file into `file`.
    fn advance(&mut self) -> Result<(), Failure> {
        let Some(top) = self.stack.last_mut() else {
            self.pending.resize(2 * BLOCK, 0);
            self.finished = true;
            return Ok(());
        };
        let Some(name) = top.names.pop_front() else {
            self.stack.pop();
            return Ok(());
        };
        let rel = top.rel.join(&name);
        let full = self.root.join(&rel);
        let meta = match fs::symlink_metadata(&full) {
            Ok(m) => m,
            // Removed since the folder was listed: not a member any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_failure(&full, &e)),
        };
        let name_bytes = rel.as_os_str().as_bytes();
        let ft = meta.file_type();
        if ft.is_dir() {
            let names = sorted_names(&full).map_err(|e| io_failure(&full, &e))?;
            let mut dir_name = name_bytes.to_vec();
            dir_name.push(b'/');
            self.pending = member_header(&dir_name, b'5', 0, meta.mode(), meta.mtime(), b"");
            self.stack.push(Level { rel, names });
        } else if ft.is_symlink() {
            let target = fs::read_link(&full).map_err(|e| io_failure(&full, &e))?;
            self.pending =
                member_header(name_bytes, b'2', 0, meta.mode(), meta.mtime(), target.as_os_str().as_bytes());
        } else if ft.is_file() {
            let file = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
                .open(&full)
                .map_err(|e| io_failure(&full, &e))?;
            let meta = file.metadata().map_err(|e| io_failure(&full, &e))?;
            if !meta.is_file() {
                return Ok(());
            }
            self.pending = member_header(name_bytes, b'0', meta.len(), meta.mode(), meta.mtime(), b"");
            let pad = padding(meta.len());
            if meta.len() == 0 {
                self.pending.resize(self.pending.len() + pad as usize, 0);
            } else {
                self.file = Some((file, meta.len(), pad));
            }
        }
        // FIFOs, devices and sockets are not archived.
        Ok(())
    }
}

fn cstr(bytes: &[u8]) -> Result<CString, Failure> {
    CString::new(bytes).map_err(|_| (kind::INVALID, "a member name holds a NUL byte".to_owned()))
}

/// Checks a member name and splits it into (folders, last component); None for the
/// destination itself ("./").
/// A member's folders (outermost first) and last component.
type Split<'a> = (Vec<&'a [u8]>, &'a [u8]);

fn split_name(name: &[u8]) -> Result<Option<Split<'_>>, Failure> {
    if name.starts_with(b"/") {
        return Err((kind::INVALID, format!("absolute member name {:?}", String::from_utf8_lossy(name))));
    }
    let mut parts: Vec<&[u8]> = name.split(|&b| b == b'/').filter(|p| !p.is_empty() && *p != b".").collect();
    if parts.contains(&&b".."[..]) {
        return Err((kind::INVALID, format!("member name with '..': {:?}", String::from_utf8_lossy(name))));
    }
    let Some(last) = parts.pop() else { return Ok(None) };
    Ok(Some((parts, last)))
}

enum Sink {
    File { file: File, parent: OwnedFd, name: CString, mtime: i64 },
    Skip,
}

enum State {
    Header,
    /// A member's bytes: `left` to copy, then `pad` to skip.
    Data {
        left: u64,
        pad: u64,
        sink: Sink,
    },
    /// A pax or GNU long-name record being collected.
    Meta {
        left: u64,
        pad: u64,
        typeflag: u8,
        data: Vec<u8>,
    },
    Done,
}

/// A tar stream being unpacked into a folder.
pub struct TarIn {
    root: OwnedFd,
    root_path: PathBuf,
    header: Vec<u8>,
    state: State,
    members: u64,
    next_path: Option<Vec<u8>>,
    next_link: Option<Vec<u8>>,
    next_size: Option<u64>,
    next_mtime: Option<i64>,
    zero_blocks: u32,
}

fn parse_number(field: &[u8]) -> Result<u64, Failure> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        // GNU base-256: big-endian after the marker bit.
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| bad("number too large"))?;
        }
        return Ok(v);
    }
    let text: Vec<u8> = field.iter().copied().take_while(|&b| b != 0).filter(|&b| b != b' ').collect();
    if text.is_empty() {
        return Ok(0);
    }
    let s = std::str::from_utf8(&text).map_err(|_| bad("bad octal field"))?;
    u64::from_str_radix(s, 8).map_err(|_| bad("bad octal field"))
}

fn bad(message: &str) -> Failure {
    (kind::INVALID, format!("malformed tar stream: {message}"))
}

fn field_bytes(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

impl TarIn {
    /// Opens (creating it with its parents when missing) the destination folder.
    pub fn open(path: &Path) -> Result<TarIn, Failure> {
        fs::create_dir_all(path).map_err(|e| io_failure(path, &e))?;
        let c = cstr(path.as_os_str().as_bytes())?;
        let fd = unsafe {
            libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        };
        if fd < 0 {
            return Err(io_failure(path, &io::Error::last_os_error()));
        }
        Ok(TarIn {
            root: unsafe { OwnedFd::from_raw_fd(fd) },
            root_path: path.to_path_buf(),
            header: Vec::with_capacity(BLOCK),
            state: State::Header,
            members: 0,
            next_path: None,
            next_link: None,
            next_size: None,
            next_mtime: None,
            zero_blocks: 0,
        })
    }

    /// Unpacks the next bytes of the stream.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), Failure> {
        while !data.is_empty() {
            match &mut self.state {
                State::Done => return Ok(()),
                State::Header => {
                    let take = (BLOCK - self.header.len()).min(data.len());
                    self.header.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.header.len() == BLOCK {
                        let block = std::mem::take(&mut self.header);
                        self.on_header(&block)?;
                    }
                }
                State::Data { left, pad, sink } => {
                    if *left > 0 {
                        let take = (*left).min(data.len() as u64) as usize;
                        if let Sink::File { file, .. } = sink {
                            file.write_all(&data[..take]).map_err(|e| io_failure(&self.root_path, &e))?;
                        }
                        *left -= take as u64;
                        data = &data[take..];
                    } else if *pad > 0 {
                        let take = (*pad).min(data.len() as u64) as usize;
                        *pad -= take as u64;
                        data = &data[take..];
                    }
                    if *left == 0 && *pad == 0 {
                        let State::Data { sink, .. } = std::mem::replace(&mut self.state, State::Header)
                        else {
                            unreachable!()
                        };
                        if let Sink::File { file, parent, name, mtime } = sink {
                            drop(file);
                            set_mtime(parent.as_raw_fd(), &name, mtime);
                        }
                    }
                }
                State::Meta { left, pad, data: meta, .. } => {
                    if *left > 0 {
                        let take = (*left).min(data.len() as u64) as usize;
                        meta.extend_from_slice(&data[..take]);
                        *left -= take as u64;
                        data = &data[take..];
                    } else if *pad > 0 {
                        let take = (*pad).min(data.len() as u64) as usize;
                        *pad -= take as u64;
                        data = &data[take..];
                    }
                    if *left == 0 && *pad == 0 {
                        let State::Meta { typeflag, data: meta, .. } =
                            std::mem::replace(&mut self.state, State::Header)
                        else {
                            unreachable!()
                        };
                        self.on_meta(typeflag, &meta)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The member count once the stream is complete (its end blocks, or at least a
    /// whole last member: some writers omit the end blocks).
    pub fn finish(self) -> Result<u64, Failure> {
        match self.state {
            State::Done => Ok(self.members),
            State::Header if self.header.is_empty() => Ok(self.members),
            _ => Err(bad("the stream ended inside a member")),
        }
    }

    fn on_meta(&mut self, typeflag: u8, meta: &[u8]) -> Result<(), Failure> {
        match typeflag {
            b'L' => self.next_path = Some(field_bytes(meta).to_vec()),
            b'K' => self.next_link = Some(field_bytes(meta).to_vec()),
            b'x' => {
                let mut rest = meta;
                while !rest.is_empty() {
                    let space = rest.iter().position(|&b| b == b' ').ok_or_else(|| bad("pax record"))?;
                    let len: usize = std::str::from_utf8(&rest[..space])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .filter(|&n| n > space + 1 && n <= rest.len())
                        .ok_or_else(|| bad("pax record length"))?;
                    let record = &rest[space + 1..len - 1];
                    let eq = record.iter().position(|&b| b == b'=').ok_or_else(|| bad("pax record"))?;
                    let (key, value) = (&record[..eq], &record[eq + 1..]);
                    let number = || {
                        std::str::from_utf8(value).ok().and_then(|s| s.split('.').next()?.parse::<i64>().ok())
                    };
                    match key {
                        b"path" => self.next_path = Some(value.to_vec()),
                        b"linkpath" => self.next_link = Some(value.to_vec()),
                        b"size" => {
                            self.next_size =
                                Some(number().filter(|&n| n >= 0).ok_or_else(|| bad("pax size"))? as u64)
                        }
                        b"mtime" => self.next_mtime = number(),
                        _ => {}
                    }
                    rest = &rest[len..];
                }
            }
            // 'g' (global pax headers) change nothing we keep.
            _ => {}
        }
        Ok(())
    }

    fn on_header(&mut self, h: &[u8]) -> Result<(), Failure> {
        if h.iter().all(|&b| b == 0) {
            self.zero_blocks += 1;
            if self.zero_blocks == 2 {
                self.state = State::Done;
            }
            return Ok(());
        }
        self.zero_blocks = 0;
        let stored = parse_number(&h[148..156])?;
        let sum: u64 =
            h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
        if stored != sum {
            return Err(bad("header checksum mismatch"));
        }
        let typeflag = h[156];
        let size = match self.next_size.take() {
            Some(s) if typeflag != b'x' && typeflag != b'g' => s,
            _ => parse_number(&h[124..136])?,
        };
        let pad = padding(size);
        if matches!(typeflag, b'x' | b'g' | b'L' | b'K') {
            if size > MAX_META {
                return Err(bad("an extended header over 1 MiB"));
            }
            self.state = State::Meta { left: size, pad, typeflag, data: Vec::new() };
            return Ok(());
        }
        let mut name = match self.next_path.take() {
            Some(p) => p,
            None => {
                let mut n = field_bytes(&h[..100]).to_vec();
                let prefix = field_bytes(&h[345..500]);
                if &h[257..262] == b"ustar" && !prefix.is_empty() {
                    let mut full = prefix.to_vec();
                    full.push(b'/');
                    full.extend_from_slice(&n);
                    n = full;
                }
                n
            }
        };
        let link = self.next_link.take().unwrap_or_else(|| field_bytes(&h[157..257]).to_vec());
        let mode = (parse_number(&h[100..108])? & 0o7777) as u32;
        let mtime = match self.next_mtime.take() {
            Some(m) => m,
            None => parse_number(&h[136..148])? as i64,
        };
        // Old (v7) archives mark a folder only by the slash ending its name.
        let typeflag = if name.ends_with(b"/") && matches!(typeflag, b'0' | 0) { b'5' } else { typeflag };
        while name.len() > 1 && name.ends_with(b"/") {
            name.pop();
        }
        let mut sink = Sink::Skip;
        if let Some((dirs, last)) = split_name(&name)? {
            let parent = self.open_parent(&dirs)?;
            let cname = cstr(last)?;
            match typeflag {
                b'5' => {
                    self.make_dir(parent.as_raw_fd(), &cname, mode)?;
                    self.members += 1;
                }
                b'0' | 0 | b'7' => {
                    self.clear(parent.as_raw_fd(), &cname)?;
                    let fd = unsafe {
                        libc::openat(
                            parent.as_raw_fd(),
                            cname.as_ptr(),
                            libc::O_WRONLY
                                | libc::O_CREAT
                                | libc::O_EXCL
                                | libc::O_NOFOLLOW
                                | libc::O_CLOEXEC,
                            mode as libc::c_uint,
                        )
                    };
                    if fd < 0 {
                        return Err(self.member_error(&name, io::Error::last_os_error()));
                    }
                    let file = unsafe { File::from_raw_fd(fd) };
                    // The umask must not change what the archive says.
                    let _ = unsafe { libc::fchmod(file.as_raw_fd(), mode) };
                    sink = Sink::File { file, parent, name: cname, mtime };
                    self.members += 1;
                }
                b'2' => {
                    self.clear(parent.as_raw_fd(), &cname)?;
                    let target = cstr(&link)?;
                    if unsafe { libc::symlinkat(target.as_ptr(), parent.as_raw_fd(), cname.as_ptr()) } != 0 {
                        return Err(self.member_error(&name, io::Error::last_os_error()));
                    }
                    set_mtime(parent.as_raw_fd(), &cname, mtime);
                    self.members += 1;
                }
                b'1' => {
                    let Some((tdirs, tlast)) = split_name(&link)? else {
                        return Err(bad("hard link to the root"));
                    };
                    let tparent = self.open_parent(&tdirs)?;
                    let tname = cstr(tlast)?;
                    self.clear(parent.as_raw_fd(), &cname)?;
                    let r = unsafe {
                        libc::linkat(
                            tparent.as_raw_fd(),
                            tname.as_ptr(),
                            parent.as_raw_fd(),
                            cname.as_ptr(),
                            0,
                        )
                    };
                    if r != 0 {
                        return Err(self.member_error(&name, io::Error::last_os_error()));
                    }
                    self.members += 1;
                }
                // Devices, FIFOs and other special members are not unpacked.
                _ => {}
            }
        }
        self.state = State::Data { left: size, pad, sink };
        Ok(())
    }

    fn member_error(&self, name: &[u8], e: io::Error) -> Failure {
        let k = match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => kind::INVALID,
            Some(libc::EISDIR) => kind::NOT_A_FILE,
            Some(libc::EEXIST) => kind::EXISTS,
            _ => kind::IO,
        };
        (k, format!("{}/{}: {e}", self.root_path.display(), String::from_utf8_lossy(name)))
    }

    /// Opens the member's parent folder through `dirs` without following a symlink,
    /// creating missing folders.
    fn open_parent(&self, dirs: &[&[u8]]) -> Result<OwnedFd, Failure> {
        let mut fd = unsafe { libc::fcntl(self.root.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err((kind::IO, io::Error::last_os_error().to_string()));
        }
        let mut cur = unsafe { OwnedFd::from_raw_fd(fd) };
        for dir in dirs {
            let c = cstr(dir)?;
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            fd = unsafe { libc::openat(cur.as_raw_fd(), c.as_ptr(), flags) };
            if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
                unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) };
                fd = unsafe { libc::openat(cur.as_raw_fd(), c.as_ptr(), flags) };
            }
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(self.member_error(dir, e));
            }
            cur = unsafe { OwnedFd::from_raw_fd(fd) };
        }
        Ok(cur)
    }

    fn make_dir(&self, parent: RawFd, name: &CString, mode: u32) -> Result<(), Failure> {
        // Owner rwx kept, so the members inside can be written.
        if unsafe { libc::mkdirat(parent, name.as_ptr(), (mode | 0o700) as libc::mode_t) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            let fd = unsafe { libc::openat(parent, name.as_ptr(), flags) };
            if fd >= 0 {
                unsafe { libc::close(fd) };
                return Ok(());
            }
        }
        Err(self.member_error(name.as_bytes(), e))
    }

    /// Removes a file or symlink at the member's place (never a folder).
    fn clear(&self, parent: RawFd, name: &CString) -> Result<(), Failure> {
        if unsafe { libc::unlinkat(parent, name.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(()),
            Some(libc::EISDIR) | Some(libc::EPERM) => Err((
                kind::NOT_A_FILE,
                format!("{}/{}: a folder is in the way", self.root_path.display(), name.to_string_lossy()),
            )),
            _ => Err(self.member_error(name.as_bytes(), e)),
        }
    }
}

fn set_mtime(parent: RawFd, name: &CString, mtime: i64) {
    let times = [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        libc::timespec { tv_sec: mtime as libc::time_t, tv_nsec: 0 },
    ];
    unsafe { libc::utimensat(parent, name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
}

/// Name bytes as a path (for messages and tests).
#[cfg(test)]
fn path_of(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(OsString::from_vec(bytes.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("runner-archive-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn archive(root: &Path) -> Vec<u8> {
        let mut t = TarOut::open(root).unwrap();
        let mut all = Vec::new();
        while let Some(chunk) = t.next_chunk(1000).unwrap() {
            assert!(chunk.len() <= 1000);
            all.extend(chunk);
        }
        all
    }

    #[test]
    fn round_trip_through_our_own_reader() {
        let d = tmpdir("rt");
        let src = d.join("src");
        fs::create_dir_all(src.join("sub/deeper")).unwrap();
        fs::write(src.join("a.txt"), b"hello").unwrap();
        let long = "n".repeat(150);
        fs::write(src.join("sub").join(&long), vec![7u8; 3000]).unwrap();
        fs::write(src.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink("../a.txt", src.join("sub/link")).unwrap();
        let tar = archive(&src);
        assert_eq!(tar.len() % BLOCK, 0);
        let dst = d.join("dst");
        let mut t = TarIn::open(&dst).unwrap();
        for piece in tar.chunks(333) {
            t.feed(piece).unwrap();
        }
        assert_eq!(t.finish().unwrap(), 6);
        assert_eq!(fs::read(dst.join("a.txt")).unwrap(), b"hello");
        assert_eq!(fs::read(dst.join("sub").join(&long)).unwrap(), vec![7u8; 3000]);
        assert_eq!(fs::read_link(dst.join("sub/link")).unwrap(), path_of(b"../a.txt"));
        assert!(dst.join("sub/deeper").is_dir());
        assert_eq!(fs::metadata(dst.join("empty")).unwrap().len(), 0);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn host_tar_reads_what_we_write() {
        if std::process::Command::new("tar").arg("--version").output().is_err() {
            return;
        }
        let d = tmpdir("host");
        let src = d.join("src");
        fs::create_dir_all(src.join("x")).unwrap();
        fs::write(src.join("x").join("f".repeat(120)), b"data").unwrap();
        fs::write(d.join("out.tar"), archive(&src)).unwrap();
        let listed = std::process::Command::new("tar").arg("-tf").arg(d.join("out.tar")).output().unwrap();
        assert!(listed.status.success());
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(text.contains("x/") && text.contains(&format!("x/{}", "f".repeat(120))), "{text}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_escapes() {
        let d = tmpdir("escape");
        let outside = d.join("outside");
        fs::create_dir_all(&outside).unwrap();
        let dst = d.join("dst");
        for (name, typeflag, link) in
            [(&b"../evil"[..], b'0', &b""[..]), (b"/abs", b'0', b""), (b"a/../../evil", b'0', b"")]
        {
            let mut t = TarIn::open(&dst).unwrap();
            let err = t.feed(&member_header(name, typeflag, 0, 0o644, 0, link)).unwrap_err();
            assert_eq!(err.0, kind::INVALID, "{err:?}");
        }
        // A symlink member, then a member through it: refused, nothing lands outside.
        let mut stream = member_header(b"ln", b'2', 0, 0o777, 0, outside.as_os_str().as_bytes());
        stream.extend(member_header(b"ln/evil", b'0', 4, 0o644, 0, b""));
        stream.extend(b"evil");
        stream.resize(stream.len() + padding(4) as usize, 0);
        let mut t = TarIn::open(&dst).unwrap();
        assert_eq!(t.feed(&stream).unwrap_err().0, kind::INVALID);
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn truncated_and_corrupt_streams() {
        let d = tmpdir("bad");
        let mut t = TarIn::open(&d.join("dst")).unwrap();
        let mut h = member_header(b"f", b'0', 10, 0o644, 0, b"");
        t.feed(&h[..BLOCK]).unwrap();
        t.feed(b"12345").unwrap();
        assert!(t.finish().is_err());
        h[0] = b'g';
        let mut t = TarIn::open(&d.join("dst2")).unwrap();
        assert!(t.feed(&h).unwrap_err().1.contains("checksum"));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn pax_records_count_their_own_length() {
        for n in [1, 5, 90, 95, 96, 97, 1000] {
            let r = pax_record("path", &vec![b'a'; n]);
            let len: usize = std::str::from_utf8(&r[..r.iter().position(|&b| b == b' ').unwrap()])
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(len, r.len());
        }
    }
}
