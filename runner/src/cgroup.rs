//! A cgroup v2 leaf per process, where the sandbox lets the runner make one.
//!
//! At start the runner looks for its own cgroup v2 folder and tries to create
//! `sandbox-runner.<pid>` inside it; if that works (and the kernel has `cgroup.kill`),
//! each process gets a leaf `p<id>.<n>` there. The keeper starts the child directly in its
//! leaf (`clone3` with CLONE_INTO_CGROUP: no write to `cgroup.procs`, which would cost
//! an RCU grace period per start), so the child and everything it starts are in it from
//! their first instruction, and a tree kill is one write to the leaf's `cgroup.kill`.
//! Where none of this is possible (a read-only /sys/fs/cgroup, as in most containers, or
//! cgroup v1) nothing changes: the keeper's subreaper sweep does the job alone.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The runner's folder of leaves.
pub struct Cgroups {
    parent: PathBuf,
    next: u64,
}

/// Undoes the octal escapes of /proc/self/mountinfo (a space is `\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The runner's own cgroup v2 folder: the cgroup2 mount point joined with the "0::"
/// path of /proc/self/cgroup.
fn own_directory() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split(' ').next()? != "cgroup2" {
            return None;
        }
        // Only a mount of the hierarchy's root maps "0::" paths directly.
        let mut fields = left.split(' ');
        let root = fields.nth(3)?;
        let point = fields.next()?;
        (root == "/").then(|| unescape(point))
    })?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new(&mount).join(path.trim_start_matches('/')))
}

impl Cgroups {
    /// The runner's folder of leaves, if the sandbox lets it make one.
    pub fn detect() -> Option<Cgroups> {
        if std::env::var_os("SANDBOX_RUNNER_NO_CGROUPS").is_some_and(|v| !v.is_empty() && v != "0") {
            return None;
        }
        let own = own_directory()?;
        clean_stale(&own);
        let parent = own.join(format!("sandbox-runner.{}", std::process::id()));
        std::fs::create_dir(&parent).ok()?;
        // cgroup.kill: Linux 5.14. Without it a leaf would not make kills any better.
        if !parent.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&parent);
            return None;
        }
        Some(Cgroups { parent, next: 0 })
    }

    /// A new leaf for process `id` and an fd of its folder (for CLONE_INTO_CGROUP).
    pub fn leaf(&mut self, id: u32) -> Option<(PathBuf, OwnedFd)> {
        self.next += 1;
        let path = self.parent.join(format!("p{id}.{}", self.next));
        std::fs::create_dir(&path).ok()?;
        let c = CString::new(path.as_os_str().as_bytes()).ok()?;
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            let _ = std::fs::remove_dir(&path);
            return None;
        }
        Some((path, unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The folder of leaves (removed at shutdown).
    pub fn parent(&self) -> &Path {
        &self.parent
    }
}

/// Removes the (empty) folders of runners that died without cleaning up.
fn clean_stale(own: &Path) {
    let Ok(entries) = std::fs::read_dir(own) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("sandbox-runner.")) else { continue };
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        if let Ok(leaves) = std::fs::read_dir(entry.path()) {
            for leaf in leaves.flatten().filter(|l| l.file_type().is_ok_and(|t| t.is_dir())) {
                let _ = std::fs::remove_dir(leaf.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// SIGKILLs everything in a leaf at once.
pub fn kill(leaf: &Path) -> io::Result<()> {
    std::fs::write(leaf.join("cgroup.kill"), b"1")
}

/// Removes a leaf once it is empty; false while something still lives in it.
pub fn remove(leaf: &Path) -> bool {
    match std::fs::remove_dir(leaf) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/odd\04"), r"/odd\04");
    }
}
