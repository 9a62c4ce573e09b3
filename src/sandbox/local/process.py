"""A local child process on a PTY or on pipes, driven by the event loop without threads.

Output is read from non-blocking fds with `loop.add_reader` (or a session's
`ReadinessHub`, one epoll set the loop watches as one fd); the exit is seen through a
pidfd (Linux) that becomes readable when the child dies. The exit status is read with
`WNOWAIT`, leaving the child a zombie until `close()` reaps it: while the zombie exists
its pid, and so its process group id, cannot be reused, which makes the final
`killpg(SIGKILL)` of the group safe. Used by the unix_local backend and by the fakes in
`sandbox.testing`, which run real processes behind fake providers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Mapping, Sequence

from ..errors import ProcessExitedError, SandboxError
from . import cgroups, spawn_helper
from . import tree as process_tree
from .readiness import Readers

# A pipe holds 64 KiB and a terminal less, so a bigger read only costs more: glibc serves
# an allocation past its mmap threshold (128 KiB at first) with an mmap and a munmap per
# read, and faults its pages in fresh each time, where 64 KiB reuses the same heap
# memory. Measured on a 50 MB pipe drain: 80-116 ms at 64 KiB against 144-198 at 256.
READ_CHUNK = 64 * 1024
READS_PER_WAKEUP = 8
KILL_WAIT_S = 5.0

OutputCallback = Callable[[bytes], None]


def _read_once(fd: int) -> bytes | None:
    """One non-blocking read: the bytes, b"" at the end (EIO: a terminal's other side
    closed), None when nothing is there now."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        return b""


def exit_code_from_wait(si_code: int, si_status: int) -> int:
    """Exit status as the contract reports it: the code, or 128+N for signal N."""
    if si_code == os.CLD_EXITED:
        return si_status
    return 128 + si_status


def _child_setup(
    *, tty: bool, reset_signals: bool, join_fds: Sequence[int]
) -> Callable[[], None] | None:
    """What the child runs between fork and exec (None: nothing, so Popen may vfork)."""
    if not (tty or reset_signals or join_fds):
        return None
    fds = tuple(join_fds)

    def setup() -> None:  # pragma: no cover - runs in the child
        # Into its cgroups first, before it can fork: nothing it starts escapes them.
        for fd in fds:
            os.write(fd, b"0")
        if tty:
            # We are a new session leader (start_new_session): the terminal on fd 0
            # becomes our controlling terminal, so Ctrl-C in the line discipline signals
            # our process group.
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    return setup


def _parent_ignores_interrupts() -> bool:
    return signal.SIG_IGN in (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGQUIT))


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """Set a terminal's size (the kernel sends SIGWINCH to its foreground group)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class LocalProcess:
    """A spawned child in its own session and process group.

    Callbacks run on the event loop: `on_stdout`/`on_stderr` with each chunk,
    `on_eof` once every output stream closed, `on_exit(code)` when the child died.
    """

    def __init__(self) -> None:
        self.pid = 0
        self.tty = False
        self.exit_code: int | None = None
        self.master_fd: int | None = None
        # The write end of the stdin pipe of a process on pipes started with `stdin`
        # (non-blocking; closed by `close_stdin`, the process then reads end-of-file).
        self.stdin_fd: int | None = None
        self._loop = asyncio.get_running_loop()
        # Where the output fds and the pidfd are watched: the loop, or a session's hub.
        self._readers: Readers = self._loop
        self._popen: subprocess.Popen[bytes] | None = None
        self._out_fds: dict[int, OutputCallback] = {}
        self._pidfd: int | None = None
        self._exited = asyncio.Event()
        self._eof = asyncio.Event()
        self._on_exit: Callable[[int], None] | None = None
        self._on_eof: Callable[[], None] | None = None
        self._reaped = False
        self._closed = False
        self._write_waiter: asyncio.Future[None] | None = None
        self._write_fd: int | None = None  # the fd a waiting write waits on
        self._swept: set[int] = set()
        self.tag: str | None = None
        self.leaf: cgroups.Leaf | None = None
        self._cgroup: cgroups.SessionCgroup | None = None

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        tty: bool,
        env: Mapping[str, str],
        cwd: str | None,
        rows: int = 24,
        cols: int = 80,
        stdin: bool = False,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback | None = None,
        on_exit: Callable[[int], None] | None = None,
        on_eof: Callable[[], None] | None = None,
        tag: str | None = None,
        cgroup: cgroups.SessionCgroup | None = None,
        join_fds: Sequence[int] = (),
        readers: Readers | None = None,
    ) -> LocalProcess:
        """Start `argv`. With `tty`, on a new PTY as its controlling terminal; else with
        stdin from /dev/null (a pipe we keep the write end of, with `stdin`) and
        stdout+stderr on one pipe (or two if `on_stderr`).
        With `tag` (see `process_tree.new_tag`), the process and everything it starts
        carry it in their environment, so a teardown also finds what escaped the tree.

        With `cgroup`, the process starts in a leaf of that session cgroup (see
        `local.cgroups`) and its teardowns kill the leaf, never reading
        /proc; `join_fds` are more `cgroup.procs` fds (v1 limits) it joins before exec.
        `readers` watches its fds instead of the event loop (a session's
        `ReadinessHub`, which must outlive the process).
        """
        self = cls()
        if readers is not None:
            self._readers = readers
        self.tty = tty
        self.tag = tag
        self._cgroup = cgroup
        if cgroup is not None:
            self.leaf = cgroup.new_leaf()
        if tag is not None:
            env = {**env, process_tree.TAG_VARIABLE: tag}
        self._on_exit = on_exit
        self._on_eof = on_eof
        parent_ends: list[int] = []
        child_ends: list[int] = []
        joins = list(join_fds)
        leaf_fd = pidfd = slave = -1
        try:
            if tty:
                master, slave = os.openpty()
                parent_ends.append(master)
                child_ends.append(slave)
                set_window_size(slave, rows, cols)
                stdin_end, stdout, stderr = slave, slave, slave
                self._out_fds[master] = on_stdout
                self.master_fd = master
            else:
                out_r, out_w = os.pipe()
                parent_ends.append(out_r)
                child_ends.append(out_w)
                self._out_fds[out_r] = on_stdout
                stdin_end = -1  # /dev/null, unless the caller keeps stdin open
                if stdin:
                    stdin_end, in_w = os.pipe()
                    parent_ends.append(in_w)
                    child_ends.append(stdin_end)
                    # Never blocks the loop: a full pipe waits in `write` for room.
                    os.set_blocking(in_w, False)
                    self.stdin_fd = in_w
                stdout, stderr = out_w, out_w
                if on_stderr is not None:
                    err_r, err_w = os.pipe()
                    parent_ends.append(err_r)
                    child_ends.append(err_w)
                    self._out_fds[err_r] = on_stderr
                    stderr = err_w
            helper = spawn_helper.loaded()
            if helper is not None:
                # -1 as fd 0: the helper opens /dev/null.
                fds = (stdin_end, stdout, stderr)
                pidfd = self._spawn_with(helper, argv, env, cwd, fds, tty, joins)
            if pidfd < 0:
                popen_in = subprocess.DEVNULL if stdin_end < 0 else stdin_end
                stdio = (popen_in, stdout, stderr)
                leaf_fd = self._spawn_popen(argv, env, cwd, stdio, tty, joins)
        except BaseException:
            for fd in parent_ends:
                os.close(fd)
            self.stdin_fd = None
            self._give_back_leaf()
            raise
        finally:
            for fd in child_ends:
                os.close(fd)
            if leaf_fd >= 0:
                os.close(leaf_fd)
        for fd in self._out_fds:
            os.set_blocking(fd, False)
            self._readers.add_reader(fd, self._on_readable, fd)
        self._watch_exit(pidfd)
        return self

    def _spawn_with(
        self,
        helper: spawn_helper.Helper,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        fds: tuple[int, int, int],
        tty: bool,
        joins: Sequence[int],
    ) -> int:
        """Start through the clone3 helper, born in the leaf; returns the pidfd, or -1
        when clone3 was refused (the helper is then off and `Popen` starts it)."""
        leaf_dir = -1 if self.leaf is None else self.leaf.open_directory()
        try:
            self.pid, pidfd = helper.spawn(
                argv, env=env, cwd=cwd, fds=fds, tty=tty, cgroup_fd=leaf_dir, join_fds=joins
            )
        except spawn_helper.CloneRefused as exc:
            spawn_helper.disable(f"clone3 was refused: {exc}")
            return -1
        finally:
            if leaf_dir >= 0:
                os.close(leaf_dir)
        return pidfd

    def _spawn_popen(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        stdio: tuple[int, int, int],
        tty: bool,
        joins: list[int],
    ) -> int:
        """Start through `Popen` (no helper); returns the leaf's join fd to close (-1)."""
        cgroup = self._cgroup
        reset = not tty and _parent_ignores_interrupts()
        # A terminal needs a preexec anyway (its fork costs the same with a write
        # more); pipes keep Popen's vfork when only the leaf is to join: this
        # process hops into the leaf around the vfork instead (`_popen_in_leaf`).
        hop = (
            self.leaf is not None
            and cgroup is not None
            and not (tty or reset or joins or cgroup.limited)
        )
        leaf_fd = -1
        if self.leaf is not None:
            leaf_fd = self.leaf.open_join()
            if not hop:
                joins.insert(0, leaf_fd)
        setup = _child_setup(tty=tty, reset_signals=reset, join_fds=joins)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                list(argv),
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                preexec_fn=setup,
                close_fds=True,
            )

        try:
            self._popen = self._popen_in_leaf(start, leaf_fd) if hop else start()
        except subprocess.SubprocessError as exc:
            # Only our preexec raises this: it could not join a cgroup.
            if leaf_fd >= 0:
                os.close(leaf_fd)
            raise SandboxError(f"could not place the process in its cgroup: {exc}") from None
        except BaseException:
            if leaf_fd >= 0:
                os.close(leaf_fd)
            raise
        self.pid = self._popen.pid
        return leaf_fd

    def _popen_in_leaf(
        self, start: Callable[[], subprocess.Popen[bytes]], join_fd: int
    ) -> subprocess.Popen[bytes]:
        """Run `start` with this process inside the leaf: the vforked child is born in
        it (no window before exec), and we move back right after."""
        assert self._cgroup is not None and self.leaf is not None
        with cgroups.HOP_LOCK:
            self._cgroup.hop_in(join_fd)
            try:
                return start()
            finally:
                self._cgroup.hop_out()

    def _give_back_leaf(self) -> None:
        """Hand the leaf back to the session once nothing in it is alive (else it stays
        the session's, and dies with it)."""
        if self.leaf is not None and self._cgroup is not None and not self.leaf.populated():
            self._cgroup.release(self.leaf, empty=True)
            self.leaf = None

    # ---- exit watching ---------------------------------------------------------------

    def _watch_exit(self, pidfd: int = -1) -> None:
        if pidfd >= 0:
            self._pidfd = pidfd
        else:
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):
                self._pidfd = None
        if self._pidfd is not None:
            self._readers.add_reader(self._pidfd, self._check_exit)
            return

        # No pidfd (old kernel, not Linux): one small thread blocks in waitid(WNOWAIT).
        def wait_in_thread() -> None:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening
                self._loop.call_soon_threadsafe(self._check_exit)

        threading.Thread(target=wait_in_thread, name=f"waitid-{self.pid}", daemon=True).start()

    def _check_exit(self) -> None:
        if self.exit_code is not None:
            return
        try:
            if self._pidfd is not None:
                result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            else:
                result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            result = None
            code = 255  # someone else reaped it: the status is gone
        else:
            if result is None:
                return
            code = exit_code_from_wait(result.si_code, result.si_status)
        if self._pidfd is not None:
            self._readers.remove_reader(self._pidfd)
        self.exit_code = code
        self._exited.set()
        if self._on_exit is not None:
            self._on_exit(code)

    @property
    def exited(self) -> bool:
        """True once the child has died (it may still be an unreaped zombie)."""
        return self.exit_code is not None

    async def wait(self) -> int:
        """Wait for the child's death and return its exit status."""
        await self._exited.wait()
        assert self.exit_code is not None
        return self.exit_code

    async def wait_eof(self) -> None:
        """Wait until every output stream has closed."""
        await self._eof.wait()

    # ---- output ----------------------------------------------------------------------

    def _on_readable(self, fd: int) -> None:
        callback = self._out_fds.get(fd)
        if callback is None:
            return
        if fd == self.master_fd:
            self._read_terminal(fd, callback)
            return
        for _ in range(READS_PER_WAKEUP):
            data = _read_once(fd)
            if data is None:
                return
            if not data:
                self._close_stream(fd)
                return
            callback(data)
            if not self._more_waiting(fd, len(data)):
                return

    def _read_terminal(self, fd: int, callback: OutputCallback) -> None:
        """`_on_readable` for the terminal: its reads are a few KiB each, so what one
        wakeup reads goes to `callback` once, joined (a copy of a few KiB costs less than
        the entry's per-chunk work: the buffer, the screen's tail, the wake-up check)."""
        chunks: list[bytes] = []
        ended = False
        try:
            for _ in range(READS_PER_WAKEUP):
                data = _read_once(fd)
                if data is None:
                    break
                if not data:
                    ended = True
                    break
                chunks.append(data)
        finally:
            # What was read is handed over even if a read then failed.
            if chunks:
                callback(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if ended:
            self._close_stream(fd)

    def _more_waiting(self, fd: int, got: int) -> bool:
        """Whether another read of the pipe `fd` now may find bytes. A pipe read returns
        all the pipe holds up to `READ_CHUNK`, so a shorter one drained it: reading again
        would only raise BlockingIOError, which costs more than the read itself. (A
        terminal is always read again, see `_read_terminal`: its non-blocking read first
        waits for the line discipline to take what the writer already sent, which
        FIONREAD does not, so a second read often finds more, and stopping early cost a
        PTY drain a third of its speed.)"""
        return got >= READ_CHUNK

    def drain_now(self) -> None:
        """Read whatever output is already waiting in the kernel, without blocking."""
        for fd in list(self._out_fds):
            self._on_readable(fd)

    def _close_stream(self, fd: int) -> None:
        if self._out_fds.pop(fd, None) is None:
            return
        self._readers.remove_reader(fd)
        if fd != self.master_fd:  # the master stays open until close(): writes may race
            os.close(fd)
        if not self._out_fds:
            self._eof.set()
            if self._on_eof is not None:
                self._on_eof()

    # ---- input and control -------------------------------------------------------------

    def _input_fd(self) -> int | None:
        """Where input goes: the terminal, or the open stdin pipe (None: neither)."""
        return self.master_fd if self.tty else self.stdin_fd

    async def write(self, data: bytes, on_progress: Callable[[int], None] | None = None) -> None:
        """Write all of `data` to the terminal (or the open stdin pipe), waiting for room
        when it is full.

        `on_progress(n)` is told each time the terminal took `n` more bytes, so a write
        cancelled half-way (its window ended, the process is being torn down) knows how
        much went in. Only one write waits for room at a time (calls are serialized).
        """
        view = memoryview(data)
        while view:
            fd = self._input_fd()
            if fd is None or self._closed:
                raise ProcessExitedError(f"process {self.pid} has no open terminal or stdin")
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                await self._writable(fd)
                continue
            except OSError as exc:
                # EPIPE on a pipe: the process closed its stdin or exited (SIGPIPE is
                # ignored in Python, so the write fails instead of killing us).
                raise ProcessExitedError(f"process {self.pid} input is closed: {exc}") from exc
            view = view[written:]
            if on_progress is not None:
                on_progress(written)

    def write_some(self, data: bytes) -> int:
        """Write what the terminal (or the open stdin pipe) takes right now (never
        waits); returns the count."""
        fd = self._input_fd()
        if fd is None or self._closed or self._write_waiter is not None:
            return 0  # closed (the slow path says so), or a write already waits
        try:
            return os.write(fd, data)
        except (BlockingIOError, OSError):
            return 0  # full, or gone: the slow path waits or raises the clear error

    def write_now(self, data: bytes) -> bool:
        """Write `data` only if the terminal takes all of it at once; never waits."""
        fd = self.master_fd
        if fd is None or self._closed:
            raise ProcessExitedError(f"process {self.pid} has no open terminal")
        try:
            return os.write(fd, data) == len(data)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ProcessExitedError(f"process {self.pid} terminal is closed: {exc}") from exc

    def close_stdin(self) -> None:
        """End the input of a process on pipes started with `stdin`: close our end of
        its stdin pipe, so it reads end-of-file after what is in the pipe. Idempotent.
        (The session calls it between writes; a write still waiting fails.)"""
        fd = self.stdin_fd
        if fd is None:
            return
        self.stdin_fd = None
        waiter = self._write_waiter
        if waiter is not None and self._write_fd == fd:
            self._loop.remove_writer(fd)  # never left on an fd number about to be reused
            self._write_fd = None
            if not waiter.done():
                waiter.set_exception(ProcessExitedError(f"process {self.pid} input was closed"))
        os.close(fd)

    def interrupt_terminal(self) -> None:
        """Ctrl-C on the terminal: the interrupt character if the terminal has room for
        it, else what the line discipline would do with it, SIGINT to the terminal's
        foreground process group (a process that stops reading its input still gets
        its Ctrl-C)."""
        if self.write_now(b"\x03"):
            return
        assert self.master_fd is not None
        try:
            group = os.tcgetpgrp(self.master_fd)
        except OSError:
            group = self.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGINT)

    async def _writable(self, fd: int) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()
        self._write_waiter = ready

        def on_writable() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(fd, on_writable)
        self._write_fd = fd
        try:
            await ready
        finally:
            self._write_waiter = None
            # close() or close_stdin() already removed it (and the fd may be reused).
            if self._write_fd == fd and not self._closed:
                self._loop.remove_writer(fd)
            self._write_fd = None

    def resize(self, rows: int, cols: int) -> None:
        """Resize the terminal (no-op once closed)."""
        if self.master_fd is not None and not self._closed:
            set_window_size(self.master_fd, rows, cols)

    def signal_group(self, sig: int) -> bool:
        """Send `sig` to the child's whole process group (ignoring a group that is gone);
        whether it was sent to the group.

        Safe while the leader is unreaped: its zombie keeps the group id from reuse.
        """
        if self.pid <= 0 or self._reaped:
            return False
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def terminate(self, grace_s: float, *, escapees: bool = True) -> None:
        """Stop the whole tree: polite signals, up to `grace_s` for the leader to go,
        then SIGKILL to all of it (its cgroup leaf, or its group and tree); then reap,
        close every fd, and wait until all of it is gone. Idempotent.

        `escapees=False` skips the search for tagged processes that left the tree
        (tag containment only): the session's own sweep follows at its close.
        """
        if self._closed:
            return
        try:
            if not self.exited and grace_s > 0:
                polite = (signal.SIGHUP, signal.SIGTERM, signal.SIGCONT)
                sent = [self.signal_group(sig) for sig in polite]
                # The rest of the tree (what left the group) gets them too, but no
                # process twice: a trap would run twice for one terminate.
                group = self.pid if all(sent) else None
                if self.leaf is not None:
                    self.leaf.signal(*polite, signalled_group=group)
                elif not self._reaped:
                    tag = self.tag if escapees else None
                    process_tree.signal_tree(self.pid, *polite, tag=tag, signalled_group=group)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace_s):
                        await self._exited.wait()
            self.signal_group(signal.SIGKILL)
            if self.leaf is not None:
                self.leaf.kill()
            if not self.exited:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KILL_WAIT_S):
                        await self._exited.wait()
        finally:
            self.close(sweep_tree=True, escapees=escapees)
        if self.leaf is not None:
            await self.leaf.wait_empty()
            self._give_back_leaf()
        if self._swept:
            await process_tree.wait_gone(self._swept)

    def finish_now(self, *, escapees: bool = True) -> bool:
        """`terminate` for a leader that has exited and whose cgroup leaf holds nobody
        alive: nothing is left to wait for, so all of it happens now (the group's
        SIGKILL, the reap, every fd closed, the leaf given back). Returns False, having
        done nothing, for any other process: `terminate` must wait for it."""
        if self._closed:
            return True
        leaf = self.leaf
        if not self.exited or leaf is None:
            return False
        try:
            if leaf.populated():
                return False
        except OSError:
            return False  # unreadable: `terminate` kills it whole and waits
        self.close(sweep_tree=True, escapees=escapees)
        return True

    def kill_now(self) -> None:
        """SIGKILL the group and the whole tree, synchronously, touching no event loop
        (for a session being garbage-collected)."""
        if self._closed or self._reaped:
            return
        self.signal_group(signal.SIGKILL)
        if self.leaf is not None:
            self.leaf.kill()
        else:
            process_tree.kill_tree(self.pid, tag=self.tag)

    def close(
        self, *, kill_group: bool = True, sweep_tree: bool = False, escapees: bool = True
    ) -> None:
        """Kill what is left of the group, reap the leader and close every fd.

        `kill_group=False` (for an already exited leader) reaps it without signalling
        the group, the way a remote daemon reaps a process whose children it leaves be;
        the provider fakes in `sandbox.testing` use it. `sweep_tree` also kills what
        left the group (see `sandbox.local.tree`): teardowns do, a one-shot command
        that ended by itself does not (its group kill is the fast path; what it left
        running dies at the session's close). In a cgroup leaf, the sweep is one write
        to the leaf's `cgroup.kill`. `escapees`: see `terminate`.
        """
        if self._closed:
            return
        self._closed = True
        if kill_group or not self.exited:
            self.signal_group(signal.SIGKILL)
            if kill_group and sweep_tree and not self._reaped:
                # Background jobs of an interactive shell have groups of their own, and
                # nohup'd or setsid'd children leave the group: kill the whole tree.
                if self.leaf is not None:
                    self.leaf.kill()
                else:
                    tag = self.tag if escapees else None
                    self._swept = process_tree.kill_tree(self.pid, tag=tag)
        waiter = self._write_waiter
        if waiter is not None and self._write_fd is not None:
            # A write waiting for room must not keep a writer on an fd number that is
            # about to be closed and reused by the next process.
            self._loop.remove_writer(self._write_fd)
            self._write_fd = None
            if not waiter.done():
                waiter.set_exception(ProcessExitedError(f"process {self.pid} was closed"))
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)
            self.stdin_fd = None
        for fd in list(self._out_fds):
            self._readers.remove_reader(fd)
            if fd != self.master_fd:
                os.close(fd)
        self._out_fds.clear()
        if self.master_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.master_fd)
        if self._pidfd is not None:
            self._readers.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._reap()
        self._give_back_leaf()

    def _reap(self) -> None:
        if self._reaped or self.pid <= 0:
            return
        self._reaped = True
        try:
            pid, _ = os.waitpid(self.pid, 0 if self.exited else os.WNOHANG)
        except ChildProcessError:
            pid = self.pid
        if pid == 0:
            # SIGKILL was sent but the child is not gone yet (uninterruptible sleep):
            # a thread waits for it so that it never stays a zombie.
            threading.Thread(target=_reap_blocking, args=(self.pid,), daemon=True).start()
        if self._popen is not None:
            # Popen must not reap it again (it would poll it from __del__ otherwise).
            self._popen.returncode = self.exit_code if self.exit_code is not None else -9


def _reap_blocking(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
