"""The shell lines the e2b backend hands to envd, built on the toolkit's wrapper and kill
scripts (`sandbox.backends.toolkit.shell`).

E2B's `kill` only SIGKILLs the process it started, and reports a death by signal as -1
without the signal, so every command runs under the toolkit's `sh` wrapper (128+N for a
death by signal N, a random tag in its environment) and interrupt/terminate run the
toolkit's kill script as a second command, which finds the tagged tree through /proc.

- A terminal (`pty.create`) is a login bash that envd starts as a session leader (Go's
  `pty.Start` sets `Setsid`); the shell trap's exec mode replaces it with the wrapper,
  which so leads the session the toolkit's wrapper expects. The terminal's own
  environment carries the tag too, so what the login shell started before that is found.
- A pipe command (`commands.run`) is `bash -l -c LINE`, which envd starts in its own
  session and process group (no `Setsid`/`Setpgid`): the wrapper cannot lead a session
  there (`setsid` would fork when the process already leads a group, and a kill of the
  forked parent would then miss the wrapper). So the line runs the wrapper as a `set -m`
  job, which gives it a process group of its own: the interrupt script's SIGINT goes to
  that group, and the line kills what is left of it once the command ended (the sweep
  the wrapper does itself only as a session leader). The bash carries a tag of its own
  (its environment, from envd), the wrapper gets the command's tag from its `env`: the
  interrupt script, given the command's tag only, finds the wrapper as the tree's root
  and signals the job's group (not the bash, which is in envd's group), while the kill
  script, given both, also finds the bash and a job it forked but has not yet exec'd.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import InvalidArgumentError
from ..toolkit import command_line, interrupt_script, kill_script, wrapper_argv

# Linux's bound on one argument or environment string (`MAX_ARG_STRLEN`, 32 pages),
# its terminating NUL included: envd's start of `bash` fails beyond it.
MAX_ARG_STRLEN = 32 * 4096


def pipe_line(tag: str, command: str, *, stdin: bool = False) -> str:
    """The bash line (run by envd as `bash -l -c`) that runs `command` on pipes under the
    tagged wrapper, as a job in its own process group, and exits with its status.

    The bash's own stderr is /dev/null (a job killed by a signal is reported there);
    the job gets the real stderr. Its stdin is /dev/null, or with `stdin` the bash's
    own (envd's pipe: a job keeps it under `set -m`, where job control is on)."""
    wrapped = command_line(wrapper_argv(tag, ["sh", "-c", command]))
    redirect = "" if stdin else " </dev/null"
    return fits_one_string(
        f"exec 3>&2 2>/dev/null; set -m; {wrapped}{redirect} 2>&3 3>&- & "
        "wait $!; s=$?; kill -KILL -- -$! 2>/dev/null; exit $s"
    )


def tty_command(tag: str, command: str) -> str:
    """The `sh` script the shell trap's exec mode runs in place of E2B's login shell:
    the wrapper (which then leads the terminal's session) running `command`. The tag
    comes from the terminal's environment (`tag_environment`)."""
    return "exec " + command_line(wrapper_argv(tag, ["sh", "-c", command], set_tag=False))


# The terminal's environment variable that carries the shell trap's line (`line_environment`).
LINE_VARIABLE = "SANDBOX_TRAP_LINE"
# What is typed into the terminal: the same short printable line whatever the command.
# It copies the trap's line into a shell variable of the login bash (not exported) and
# removes it from the environment before running it, so the command never inherits it.
TYPED_LINE = f'l=${LINE_VARIABLE}; unset {LINE_VARIABLE}; eval "$l"\n'


def fits_one_string(text: str, *, prefix: str = "") -> str:
    """`text` when `prefix + text` fits one argument or environment string, else an
    `InvalidArgumentError` (rather than the provider's failure to start `bash`)."""
    size = len(prefix.encode()) + len(text.encode()) + 1
    if size > MAX_ARG_STRLEN:
        raise InvalidArgumentError(
            f"the command is too long for e2b: with its wrapper it takes {size} bytes, "
            f"over the {MAX_ARG_STRLEN} bytes one argument may hold (write a script "
            "file with write_file and run that)"
        )
    return text


def line_environment(line: str) -> dict[str, str]:
    """The terminal environment that hands the shell trap's `line` to the login bash.

    The line is not typed: a terminal in canonical mode (the login bash reads its
    profile before its line editor takes the terminal) keeps at most 4095 bytes of a
    line and drops the rest, and a long command, or data that grew fourfold as octal
    escapes, would be cut. An environment string may hold 128 KiB (Linux's
    `MAX_ARG_STRLEN`), what a pipe command's `bash -c` argument may hold too."""
    text = line.removesuffix("\n")
    return {LINE_VARIABLE: fits_one_string(text, prefix=f"{LINE_VARIABLE}=")}


def kill_line(tags: Sequence[str]) -> str:
    """The command that SIGKILLs every tree tagged with one of `tags` (no grace: E2B's
    own `kill` gives none either, and a terminate must not wait on the command)."""
    return command_line(kill_script(tags, ticks=0))


def interrupt_line(tag: str) -> str:
    """The command that sends SIGINT to the process group of the tree tagged `tag`."""
    return command_line(interrupt_script([tag]))
