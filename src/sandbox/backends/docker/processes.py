"""What the docker session starts as an exec: a process for an entry (`spawn_exec`), whose
handle is the `DockerExec` itself (a `Process`: the base session's hooks write, resize,
interrupt, end its input, drain and kill through it), and a one-shot command
(`start_exec`, a `DockerOneShot`). `check_half_close` refuses an open stdin where the
engine's connection cannot end it; `checked_command` puts a command behind its command
check when it needs one, and `exec_environment` adds the terminal's `TERM`.

Each takes what it needs from the session (the engine, the exec options, the kill
batcher, the command's resolved `cwd`, the grace of a kill), never the session itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...backend import CommandSpec, ExecCapture, OutputSink, settle
from ...errors import UnsupportedOperationError
from ..toolkit import CommandCheck, ShellTrap, wait_for_verdict
from .engine import Engine
from .execs import DockerExec, DockerOneShot, ExecOptions, KillBatcher

# The terminal type of a tty process whose command and session set no TERM.
DEFAULT_TERM = "xterm-256color"

# Appended to the output (a one-shot's stderr) of a process the memory limit killed, as
# on unix_local.
MEMORY_NOTE = b"\n[sandbox: killed by the session's memory limit (memory_limit_bytes)]\n"


def checked_command(
    spec: CommandSpec, cwd: str | None, *, announce: bool
) -> tuple[Sequence[str], str | None, CommandCheck | None]:
    """The argv and working directory of the exec of `spec` (whose `cwd` resolves to
    `cwd`), and the command check they run (None when there is no `cwd` and a shell
    runs the command). With a check the exec starts in the session's directory and the
    check changes to `cwd`: the engine would otherwise fail the exec itself (exit
    126/127, its error as output)."""
    check = CommandCheck.needed(spec, cwd=cwd)
    if check is None:
        return spec.argv, cwd, None
    return check.argv(spec.argv, announce=announce), None, check


def exec_environment(
    spec: CommandSpec, session_env: Mapping[str, str], *, tty: bool
) -> dict[str, str]:
    """The command's own variables (the session's come with every exec), plus
    `TERM=DEFAULT_TERM` for a terminal when neither sets it."""
    env = dict(spec.env or {})
    if tty and "TERM" not in env and "TERM" not in session_env:
        env["TERM"] = DEFAULT_TERM
    return env


async def spawn_exec(
    entry: OutputSink[DockerExec],
    engine: Engine,
    options: ExecOptions,
    killer: KillBatcher | None,
    *,
    cwd: str | None,
    grace_s: float,
) -> None:
    """Start the entry's command (its `cwd` resolved to `cwd`; behind its command check
    if it needs one) as an attached exec whose socket feeds the entry (no thread); with
    a check, wait for its verdict. The handle is stored before the first await, so a
    teardown of a cancelled spawn finds it; `grace_s` is its kill's."""
    spec = entry.spec
    if spec.stdin:
        check_half_close(engine)
    argv, cwd, check = checked_command(spec.command, cwd, announce=True)
    env = exec_environment(spec.command, options.env, tty=spec.tty)
    trap = None if check is None else ShellTrap(report_exit=False, token=check.token)

    def on_output(stream: int, data: bytes) -> None:
        # The check's markers come on stdout (the terminal, for a tty): the trap strips
        # them. Stderr never carries them: it goes straight through.
        if trap is not None and stream == 1:
            data = trap.feed(data)
        entry.feed(data)

    def on_exit(code: int) -> None:
        if proc.memory_killed:
            entry.feed(MEMORY_NOTE)
        entry.report_exit(code)

    proc = DockerExec(
        engine,
        options,
        argv,
        tty=spec.tty,
        env=env,
        cwd=cwd,
        rows=spec.rows,
        cols=spec.cols,
        stdin=spec.stdin,
        on_output=on_output,
        on_eof=entry.report_eof,
        on_exit=on_exit,
        on_lost=entry.report_lost,
        killer=killer,
        process_id=entry.process_id,
        grace_s=grace_s,
    )
    entry.handle = proc
    await proc.start()
    if trap is not None and check is not None:
        await wait_for_verdict(entry, trap, check)


async def start_exec(
    engine: Engine,
    options: ExecOptions,
    killer: KillBatcher | None,
    spec: CommandSpec,
    capture: ExecCapture,
    *,
    cwd: str | None,
) -> DockerOneShot:
    """Start `spec` (its `cwd` resolved to `cwd`; behind its command check if it needs
    one, which `capture` then holds) as one exec on pipes, stdout and stderr kept apart
    (each chunk straight into the bounded capture), and return it as a `DockerOneShot`.
    Cancelled or failed after the exec may exist, it is killed here: nobody else knows
    it."""
    argv, cwd, capture.check = checked_command(spec, cwd, announce=False)
    env = exec_environment(spec, options.env, tty=False)
    first = bytearray()  # the first bytes, whatever the stream (see DockerOneShot)

    def collect(stream: int, data: bytes) -> None:
        if len(first) < 256:
            first.extend(data[: 256 - len(first)])
        # Stream 3 (an engine error) is kept with stderr, where the user looks.
        (capture.add_stdout if stream == 1 else capture.add_stderr)(data)

    proc = DockerExec(
        engine, options, argv, tty=False, env=env, cwd=cwd, on_output=collect, killer=killer
    )
    try:
        await proc.start()
    except BaseException as exc:
        try:
            await settle(proc.terminate(0))  # nobody else knows it
        except Exception as cleanup_exc:
            exc.add_note(f"killing the half-started command also failed: {cleanup_exc}")
        raise
    return DockerOneShot(proc, engine, first, lambda: capture.add_stderr(MEMORY_NOTE))


def check_half_close(engine: Engine) -> None:
    """Refuse `stdin=True` before anything starts where the hijacked stream cannot be
    half-closed: over TLS a half-close ends the TLS session itself (its reads would
    then see raw records), and the SDK gives no TLS close_notify for one direction."""
    base_url = str(getattr(engine.api, "base_url", ""))
    if base_url.startswith("https"):
        raise UnsupportedOperationError(
            "stdin=True: the docker backend ends a process's input by half-closing its "
            "exec stream, which a TLS connection to the engine (DOCKER_TLS_VERIFY, "
            "tcp with tls) cannot do; use a unix socket or plain tcp engine, tty=True, "
            "or redirect the input from a file"
        )
