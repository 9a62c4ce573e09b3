//! FILE operations: read (streamed as DATA frames), write (uploaded as DATA frames into
//! a temporary file renamed over the target at END), stat, list, remove, make_dir.
//!
//! Nothing here follows a final symlink (a symlink is reported, replaced or removed as
//! itself), and nothing opens a FIFO or device for reading: files are opened with
//! O_NONBLOCK | O_NOFOLLOW and checked with fstat before a byte is read.

use crate::archive::{TarIn, TarOut};
use crate::frames;
use crate::proto::{self, kind};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The most uploads one connection may have open at once.
const MAX_UPLOADS: usize = 64;
/// How many refused upload ids are remembered (their DATA/END are then dropped quietly).
const REFUSED_MEMORY: usize = 256;
/// The most entries a list answers when the request does not say.
const DEFAULT_MAX_ENTRIES: u64 = 10_000;
/// DATA chunk size for downloads.
const CHUNK: usize = 64 * 1024;

enum Source {
    File { file: File, left: u64 },
    Tar(Box<TarOut>),
}

struct Download {
    id: u32,
    source: Source,
}

enum Upload {
    File { tmp: PathBuf, dest: PathBuf, file: File, mode: u32 },
    Tar(Box<TarIn>),
}

/// A connection's downloads and uploads in progress.
#[derive(Default)]
pub struct ConnFiles {
    downloads: VecDeque<Download>,
    uploads: BTreeMap<u32, Upload>,
    refused: VecDeque<u32>,
}

use crate::archive::Failure;

fn fail<T>(kind: &'static str, message: impl Into<String>) -> Result<T, Failure> {
    Err((kind, message.into()))
}

/// The ERROR kind of an OS error about `path`.
fn io_failure(path: &Path, e: &io::Error) -> Failure {
    let k = match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => kind::NOT_FOUND,
        Some(libc::EEXIST) => kind::EXISTS,
        Some(libc::EISDIR) | Some(libc::ELOOP) => kind::NOT_A_FILE,
        Some(libc::ENOTEMPTY) => kind::INVALID,
        Some(libc::EFBIG) => kind::TOO_LARGE,
        _ => kind::IO,
    };
    (k, format!("{}: {e}", path.display()))
}

fn send_error(out: &mut Vec<u8>, id: u32, answers: u8, (k, message): Failure) {
    frames::encode_into(out, proto::ERROR, id, &proto::error_payload(k, &message, answers));
}

fn send_ok(out: &mut Vec<u8>, id: u32, answers: u8, value: Value) {
    frames::encode_into(out, proto::OK, id, &proto::ok_payload(value, answers));
}

fn str_field<'a>(req: &'a Value, name: &str) -> Result<&'a str, Failure> {
    match req.get(name) {
        Some(Value::String(s)) if !s.is_empty() && !s.contains('\0') => Ok(s),
        _ => fail(kind::INVALID, format!("\"{name}\" must be a non-empty string")),
    }
}

fn bool_field(req: &Value, name: &str) -> Result<bool, Failure> {
    match req.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        _ => fail(kind::INVALID, format!("\"{name}\" must be a boolean")),
    }
}

fn uint_field(req: &Value, name: &str, default: u64) -> Result<u64, Failure> {
    match req.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => {
            v.as_u64().map_or_else(|| fail(kind::INVALID, format!("\"{name}\" must be a whole number")), Ok)
        }
    }
}

/// A FILE frame.
pub fn op(files: &mut ConnFiles, id: u32, payload: &[u8], out: &mut Vec<u8>) {
    let result = serde_json::from_slice::<Value>(payload)
        .map_err(|e| (kind::INVALID, format!("bad FILE payload: {e}")))
        .and_then(|req| dispatch(files, id, &req));
    match result {
        Ok(Some(value)) => send_ok(out, id, proto::FILE, value),
        Ok(None) => {}
        Err(f) => {
            // An upload refused at its start: its DATA and END are dropped quietly.
            if serde_json::from_slice::<Value>(payload)
                .is_ok_and(|r| r.get("op").is_some_and(|o| o == "write" || o == "archive_in"))
            {
                remember_refused(files, id);
            }
            send_error(out, id, proto::FILE, f)
        }
    }
}

fn remember_refused(files: &mut ConnFiles, id: u32) {
    if files.refused.len() >= REFUSED_MEMORY {
        files.refused.pop_front();
    }
    files.refused.push_back(id);
}

fn dispatch(files: &mut ConnFiles, id: u32, req: &Value) -> Result<Option<Value>, Failure> {
    let op = str_field(req, "op")?;
    let path = PathBuf::from(str_field(req, "path")?);
    match op {
        "read" => read(files, id, &path, uint_field(req, "max_bytes", u64::MAX)?).map(|_| None),
        "write" => {
            let mode = uint_field(req, "mode", 0o644)?;
            if mode > 0o7777 {
                return fail(kind::INVALID, "\"mode\" is at most 0o7777");
            }
            start_upload(files, id, &path, mode as u32, bool_field(req, "parents")?).map(|_| None)
        }
        "stat" => {
            let meta = fs::symlink_metadata(&path).map_err(|e| io_failure(&path, &e))?;
            Ok(Some(stat_value(&path, &meta)))
        }
        "list" => list(&path, uint_field(req, "max_entries", DEFAULT_MAX_ENTRIES)?).map(Some),
        "remove" => remove(&path, bool_field(req, "recursive")?).map(Some),
        "make_dir" => make_dir(&path, bool_field(req, "parents")?).map(Some),
        "archive_out" => {
            let tar = TarOut::open(&path)?;
            files.downloads.push_back(Download { id, source: Source::Tar(Box::new(tar)) });
            Ok(None)
        }
        "archive_in" => {
            check_upload_slot(files, id)?;
            let tar = TarIn::open(&path)?;
            files.uploads.insert(id, Upload::Tar(Box::new(tar)));
            Ok(None)
        }
        other => fail(kind::INVALID, format!("unknown FILE op {other:?}")),
    }
}

fn read(files: &mut ConnFiles, id: u32, path: &Path, max_bytes: u64) -> Result<(), Failure> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| io_failure(path, &e))?;
    let meta = file.metadata().map_err(|e| io_failure(path, &e))?;
    if !meta.is_file() {
        return fail(kind::NOT_A_FILE, format!("{}: not a regular file", path.display()));
    }
    if meta.len() > max_bytes {
        return fail(
            kind::TOO_LARGE,
            format!("{}: {} bytes, over the limit of {max_bytes}", path.display(), meta.len()),
        );
    }
    // A file growing while it is read is cut at max_bytes.
    files.downloads.push_back(Download { id, source: Source::File { file, left: max_bytes } });
    Ok(())
}

/// Moves download chunks into `out` while it has room; true when something was added.
pub fn pump(files: &mut ConnFiles, out: &mut Vec<u8>) -> bool {
    let Some(d) = files.downloads.front_mut() else { return false };
    let id = d.id;
    let next: Result<Option<Vec<u8>>, Failure> = match &mut d.source {
        Source::File { file, left } => {
            let want = ((*left).min(CHUNK as u64)) as usize;
            let mut buf = vec![0u8; want];
            match if want == 0 { Ok(0) } else { file.read(&mut buf) } {
                Ok(0) => Ok(None),
                Ok(n) => {
                    *left -= n as u64;
                    buf.truncate(n);
                    Ok(Some(buf))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(Vec::new())),
                Err(e) => Err((kind::IO, format!("read failed: {e}"))),
            }
        }
        Source::Tar(tar) => tar.next_chunk(CHUNK),
    };
    match next {
        Ok(Some(bytes)) if bytes.is_empty() => {}
        Ok(Some(bytes)) => frames::encode_into(out, proto::DATA_OUT, id, &bytes),
        Ok(None) => {
            frames::encode_into(out, proto::END_OUT, id, b"");
            files.downloads.pop_front();
        }
        Err(f) => {
            files.downloads.pop_front();
            send_error(out, id, proto::FILE, f);
        }
    }
    true
}

fn check_upload_slot(files: &ConnFiles, id: u32) -> Result<(), Failure> {
    if files.uploads.contains_key(&id) {
        return fail(kind::EXISTS, format!("an upload with id {id} is in progress"));
    }
    if files.uploads.len() >= MAX_UPLOADS {
        return fail(kind::TOO_LARGE, "too many uploads in progress on this connection");
    }
    Ok(())
}

fn start_upload(
    files: &mut ConnFiles,
    id: u32,
    dest: &Path,
    mode: u32,
    parents: bool,
) -> Result<(), Failure> {
    check_upload_slot(files, id)?;
    match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => return fail(kind::NOT_A_FILE, format!("{}: is a folder", dest.display())),
        Ok(m) if !m.is_file() && !m.file_type().is_symlink() => {
            return fail(kind::NOT_A_FILE, format!("{}: not a regular file", dest.display()))
        }
        _ => {}
    }
    let name = dest.file_name().ok_or((kind::INVALID, format!("{}: no file name", dest.display())))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if parents {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&parent)
            .map_err(|e| io_failure(&parent, &e))?;
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = parent.join(format!(".{}.runner-{}-{n}.tmp", name.to_string_lossy(), std::process::id()));
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| io_failure(dest, &e))?;
    files.uploads.insert(id, Upload::File { tmp, dest: dest.to_path_buf(), file, mode });
    Ok(())
}

/// A client DATA frame (upload bytes).
pub fn data(files: &mut ConnFiles, id: u32, payload: &[u8], out: &mut Vec<u8>) {
    let Some(up) = files.uploads.get_mut(&id) else {
        if !files.refused.contains(&id) {
            send_error(out, id, proto::DATA, (kind::NOT_FOUND, format!("no upload with id {id}")));
            remember_refused(files, id);
        }
        return;
    };
    let result = match up {
        Upload::File { file, dest, .. } => file.write_all(payload).map_err(|e| io_failure(dest, &e)),
        Upload::Tar(tar) => tar.feed(payload),
    };
    if let Err(f) = result {
        if let Some(Upload::File { tmp, .. }) = files.uploads.remove(&id) {
            let _ = fs::remove_file(&tmp);
        }
        remember_refused(files, id);
        send_error(out, id, proto::DATA, f);
    }
}

/// A client END frame (upload complete): the temporary file replaces the target.
pub fn end(files: &mut ConnFiles, id: u32, out: &mut Vec<u8>) {
    let Some(up) = files.uploads.remove(&id) else {
        if let Some(i) = files.refused.iter().position(|&r| r == id) {
            files.refused.remove(i);
        } else {
            send_error(out, id, proto::END, (kind::NOT_FOUND, format!("no upload with id {id}")));
        }
        return;
    };
    match up {
        Upload::File { tmp, dest, file, mode } => {
            match file.set_permissions(fs::Permissions::from_mode(mode)).and_then(|_| fs::rename(&tmp, &dest))
            {
                Ok(()) => send_ok(out, id, proto::END, json!({})),
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
                    send_error(out, id, proto::END, io_failure(&dest, &e));
                }
            }
        }
        Upload::Tar(tar) => match tar.finish() {
            Ok(members) => send_ok(out, id, proto::END, json!({"members": members})),
            Err(f) => send_error(out, id, proto::END, f),
        },
    }
}

/// Drops a closed connection's transfers (unfinished uploads leave no file behind).
pub fn abort(files: &mut ConnFiles) {
    for (_, up) in std::mem::take(&mut files.uploads) {
        if let Upload::File { tmp, .. } = up {
            let _ = fs::remove_file(&tmp);
        }
    }
    files.downloads.clear();
}

fn stat_value(path: &Path, meta: &fs::Metadata) -> Value {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    };
    let name = path.file_name().map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy());
    let mtime = meta.mtime() as f64 + meta.mtime_nsec() as f64 / 1e9;
    let mut v = json!({
        "name": name, "path": path.to_string_lossy(), "kind": kind, "size": meta.len(),
        "mode": meta.mode() & 0o7777, "mtime": mtime,
    });
    if ft.is_symlink() {
        if let Ok(target) = fs::read_link(path) {
            v["link_target"] = json!(target.to_string_lossy());
        }
    }
    v
}

fn list(path: &Path, max_entries: u64) -> Result<Value, Failure> {
    let meta = fs::symlink_metadata(path).map_err(|e| io_failure(path, &e))?;
    if !meta.is_dir() {
        return fail(kind::INVALID, format!("{}: not a folder", path.display()));
    }
    let mut entries = Vec::new();
    let mut truncated = false;
    let mut size = 0usize;
    for entry in fs::read_dir(path).map_err(|e| io_failure(path, &e))? {
        let Ok(entry) = entry else { continue };
        if entries.len() as u64 >= max_entries {
            truncated = true;
            break;
        }
        let child = entry.path();
        let Ok(meta) = fs::symlink_metadata(&child) else { continue };
        let v = stat_value(&child, &meta);
        // The answer must fit one frame.
        size += v.to_string().len() + 1;
        if size > frames::MAX_PAYLOAD - 64 {
            truncated = true;
            break;
        }
        entries.push(v);
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(json!({"entries": entries, "truncated": truncated}))
}

fn remove(path: &Path, recursive: bool) -> Result<Value, Failure> {
    let meta = fs::symlink_metadata(path).map_err(|e| io_failure(path, &e))?;
    let done = if meta.is_dir() {
        if recursive {
            fs::remove_dir_all(path)
        } else {
            fs::remove_dir(path)
        }
    } else {
        fs::remove_file(path)
    };
    done.map_err(|e| io_failure(path, &e))?;
    Ok(json!({}))
}

fn make_dir(path: &Path, parents: bool) -> Result<Value, Failure> {
    let made = fs::DirBuilder::new().recursive(parents).mode(0o755).create(path);
    match made {
        Ok(()) => Ok(json!({})),
        Err(e) => Err(io_failure(path, &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::FrameReader;

    fn frames_of(out: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
        let mut r = FrameReader::new();
        r.push(out);
        let mut v = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            v.push((f.kind, f.id, f.payload));
        }
        v
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("runner-files-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn req(files: &mut ConnFiles, id: u32, v: Value) -> Vec<(u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        op(files, id, v.to_string().as_bytes(), &mut out);
        while pump(files, &mut out) {}
        frames_of(&out)
    }

    #[test]
    fn write_then_read_back() {
        let d = tmpdir("rw");
        let target = d.join("a/b/f.txt");
        let mut files = ConnFiles::default();
        assert!(req(&mut files, 1, json!({"op": "write", "path": target, "parents": true, "mode": 0o600}))
            .is_empty());
        let mut out = Vec::new();
        data(&mut files, 1, b"hello ", &mut out);
        data(&mut files, 1, b"world", &mut out);
        end(&mut files, 1, &mut out);
        assert_eq!(frames_of(&out), vec![(proto::OK, 1, br#"{"for":18}"#.to_vec())]);
        assert_eq!(fs::read(&target).unwrap(), b"hello world");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, 0o600);
        let got = req(&mut files, 2, json!({"op": "read", "path": target, "max_bytes": 100}));
        assert_eq!(got, vec![(proto::DATA_OUT, 2, b"hello world".to_vec()), (proto::END_OUT, 2, vec![])]);
        let got = req(&mut files, 3, json!({"op": "read", "path": target, "max_bytes": 5}));
        assert_eq!(got[0].0, proto::ERROR);
        assert!(String::from_utf8_lossy(&got[0].2).contains("too_large"));
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(d.join("a/b")).unwrap().count(), 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refusals() {
        let d = tmpdir("refuse");
        let mut files = ConnFiles::default();
        std::os::unix::fs::symlink("/etc/hostname", d.join("link")).unwrap();
        let kind_of = |frames: Vec<(u8, u32, Vec<u8>)>| -> String {
            assert_eq!(frames.len(), 1);
            let v: Value = serde_json::from_slice(&frames[0].2).unwrap();
            v["kind"].as_str().unwrap_or("").to_owned()
        };
        assert_eq!(kind_of(req(&mut files, 1, json!({"op": "read", "path": d.join("link")}))), "not_a_file");
        assert_eq!(kind_of(req(&mut files, 2, json!({"op": "read", "path": d}))), "not_a_file");
        assert_eq!(kind_of(req(&mut files, 3, json!({"op": "read", "path": d.join("none")}))), "not_found");
        assert_eq!(kind_of(req(&mut files, 4, json!({"op": "write", "path": d}))), "not_a_file");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(kind_of(req(&mut files, 10, json!({"op": "read", "path": fifo}))), "not_a_file");
        assert_eq!(kind_of(req(&mut files, 11, json!({"op": "write", "path": fifo}))), "not_a_file");
        assert_eq!(kind_of(req(&mut files, 5, json!({"op": "write", "path": d.join("x/y")}))), "not_found");
        assert_eq!(kind_of(req(&mut files, 6, json!({"op": "make_dir", "path": d}))), "exists");
        assert_eq!(
            kind_of(req(&mut files, 7, json!({"op": "archive_out", "path": d.join("link")}))),
            "invalid"
        );
        assert_eq!(kind_of(req(&mut files, 8, json!({"op": "chmod", "path": d}))), "invalid");
        assert_eq!(kind_of(req(&mut files, 9, json!({"op": "stat"}))), "invalid");
        // DATA and END of a refused upload are dropped quietly.
        let mut out = Vec::new();
        data(&mut files, 5, b"x", &mut out);
        end(&mut files, 5, &mut out);
        assert!(out.is_empty());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn stat_list_remove() {
        let d = tmpdir("slr");
        fs::write(d.join("f"), b"abc").unwrap();
        std::os::unix::fs::symlink("f", d.join("l")).unwrap();
        let mut files = ConnFiles::default();
        assert!(
            req(&mut files, 1, json!({"op": "make_dir", "path": d.join("sub/deeper"), "parents": true}))[0].0
                == proto::OK
        );
        let got = req(&mut files, 2, json!({"op": "list", "path": d}));
        let v: Value = serde_json::from_slice(&got[0].2).unwrap();
        let names: Vec<_> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_owned(), e["kind"].as_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            names,
            [("f".into(), "file".into()), ("l".into(), "symlink".into()), ("sub".into(), "dir".into())]
        );
        let got = req(&mut files, 3, json!({"op": "stat", "path": d.join("l")}));
        let v: Value = serde_json::from_slice(&got[0].2).unwrap();
        assert_eq!(v["link_target"], "f");
        let got = req(&mut files, 4, json!({"op": "list", "path": d, "max_entries": 1}));
        let v: Value = serde_json::from_slice(&got[0].2).unwrap();
        assert_eq!((v["entries"].as_array().unwrap().len(), v["truncated"].as_bool()), (1, Some(true)));
        assert_eq!(req(&mut files, 5, json!({"op": "remove", "path": d.join("sub")}))[0].0, proto::ERROR);
        assert_eq!(
            req(&mut files, 6, json!({"op": "remove", "path": d.join("sub"), "recursive": true}))[0].0,
            proto::OK
        );
        // Removing the symlink leaves its target.
        assert_eq!(req(&mut files, 7, json!({"op": "remove", "path": d.join("l")}))[0].0, proto::OK);
        assert!(d.join("f").exists());
        fs::remove_dir_all(&d).unwrap();
    }
}
