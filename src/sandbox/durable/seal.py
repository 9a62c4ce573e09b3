"""The seal: what tells a ref or a lease this user's library wrote from one a sandbox forged.

A ref file often lives where a sandboxed process can write (`sandbox open > W/ref.json`
in its own workspace, a folder `sandbox cp` copies into), and a lease lives inside the
sandbox. Both decide things on the host: where a sandbox is, whether a folder is ours to
delete, who may tear a sandbox down. So every ref and every lease record carries an
HMAC-SHA256 under a key the sandbox never sees:

- the *user key*: 32 random bytes in `<state>/ref-key` (mode 0600) in this user's
  private state folder (`SANDBOX_STATE_DIR`, else `$XDG_STATE_HOME/sandbox`, else
  `~/.local/state/sandbox`; mode 0700, owned by this user, not a symlink). No sandbox
  reaches it: a confined unix_local jail shows no home folder, remote sandboxes never
  get host files, and an unconfined unix_local process is this user anyway. To resume
  a ref on another machine, give it the same key file (copy the folder, or point
  `SANDBOX_STATE_DIR` at a copy).
- a *session secret* per session, derived from the user key and the session id: it
  seals the session's lease records, so a process in the sandbox, which can write the
  lease file, cannot write a record that passes.

Each seal covers a purpose label as well as the data, so a sealed lease can never pass
as a ref (or the other way round).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading

from ..errors import HostPathError

KEY_BYTES = 32
KEY_FILE = "ref-key"
# The key file holds the key as hex and a newline; anything longer is not ours.
MAX_KEY_FILE_BYTES = 4 * KEY_BYTES
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

REF_PURPOSE = "sandbox-ref-v1"
LEASE_PURPOSE = "sandbox-lease-v1"

_lock = threading.Lock()
_keys: dict[str, bytes] = {}


def state_folder() -> str:
    """This user's private state folder (made 0700 when missing; see the module)."""
    explicit = os.environ.get("SANDBOX_STATE_DIR")
    if explicit:
        return os.path.abspath(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(os.path.abspath(base), "sandbox")


def _private_folder(path: str) -> int:
    """An fd of `path`, made 0700 when missing, refused unless it is a private folder
    of this user (no symlink, owned by us, nobody else may enter it)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, FOLDER_FLAGS)
    except OSError as exc:
        raise HostPathError(
            f"cannot use the private state folder {path!r}: {exc.strerror or exc}", path=path
        ) from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise HostPathError(
            f"cannot use the state folder {path!r}: it must be a folder of this user that "
            "nobody else may read or enter (chmod 700)",
            path=path,
        )
    return fd


def _read_key(folder: int, path: str) -> bytes | None:
    try:
        fd = os.open(KEY_FILE, READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostPathError(
            f"cannot read the ref key in {path!r}: {exc.strerror or exc}", path=path
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise HostPathError(
                f"the ref key in {path!r} is not a private file of this user", path=path
            )
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise HostPathError(f"the ref key in {path!r} is malformed", path=path)
    return key


def _make_key(folder: int, path: str) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    temporary = f".{KEY_FILE}.{secrets.token_hex(6)}"
    fd = os.open(temporary, CREATE_FLAGS, 0o600, dir_fd=folder)
    try:
        os.write(fd, key.hex().encode() + b"\n")
    finally:
        os.close(fd)
    try:
        # A link, not a rename: two processes making the key at once must agree on one.
        os.link(temporary, KEY_FILE, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary, dir_fd=folder)
    found = _read_key(folder, path)
    assert found is not None
    return found


def user_key() -> bytes:
    """This user's key (read once per state folder, made on first use)."""
    path = state_folder()
    with _lock:
        key = _keys.get(path)
        if key is not None:
            return key
        folder = _private_folder(path)
        try:
            key = _read_key(folder, path) or _make_key(folder, path)
        finally:
            os.close(folder)
        _keys[path] = key
        return key


def seal(purpose: str, data: bytes, key: bytes | None = None) -> str:
    """The hex seal of `data` for `purpose` under `key` (default: the user key)."""
    mac = hmac.new(key if key is not None else user_key(), digestmod=hashlib.sha256)
    mac.update(purpose.encode() + b"\0")
    mac.update(data)
    return mac.hexdigest()


def is_sealed(purpose: str, data: bytes, claimed: object, key: bytes | None = None) -> bool:
    """Whether `claimed` is the seal of `data` for `purpose` (constant-time)."""
    if not isinstance(claimed, str) or len(claimed) != 64:
        return False
    return hmac.compare_digest(seal(purpose, data, key), claimed)


def session_secret(session_id: str) -> bytes:
    """The secret that seals session `session_id`'s lease records (never sent anywhere)."""
    return hmac.new(user_key(), b"lease-key\0" + session_id.encode(), hashlib.sha256).digest()
