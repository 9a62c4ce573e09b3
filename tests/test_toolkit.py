"""The toolkit's pure parts: exit normalisation, the error policy, redaction, and the
argv builders' checks (the scripts themselves run in tests/test_shell_toolkit.py)."""

from __future__ import annotations

import errno

import pytest

import sandbox
from sandbox.backends import toolkit
from sandbox.backends.toolkit import shell
from sandbox.backends.toolkit.credentials import Secret


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (0, None, 0),
        (3, "signal: killed", 3),  # a code wins over the text
        (137, None, 137),  # 128+N from a wrapper: as is
        (255, None, 255),
        (-15, None, 143),  # -N: Python's returncode, some runtimes
        (-2, None, 130),
        (-500, None, 255),  # capped
        (-1, None, 137),  # Go's "signalled", no number: SIGKILL
        (-1, "signal: terminated", 143),
        (-1, "SIGINT", 130),
        (-1, "exit status -1: signal 9", 137),
        (-1, "Hangup", 129),
        (None, None, 255),  # nothing reported: unknown
        (None, "signal: killed (core dumped)", 137),
        (True, None, 255),  # not an int
        ("3", None, 255),
        (256 + 9, None, 137),  # ksh93's 256+N
        (1000, None, 255),
    ],
)
def test_normalize_exit(code: object, reason: str | None, expected: int) -> None:
    assert toolkit.normalize_exit(code, reason) == expected


def test_signal_from_reason_knows_nothing_else() -> None:
    assert toolkit.signal_from_reason("exited normally") is None
    assert toolkit.signal_from_reason("signal 0") is None
    assert toolkit.signal_from_reason("SIGNOTREAL") is None
    assert toolkit.signal_from_reason(None) is None


def test_retryable_statuses_are_one_set() -> None:
    assert toolkit.RETRYABLE_STATUSES == {408, 425, 429, 502, 503, 504}
    assert not toolkit.is_retryable_status(500)
    assert not toolkit.is_retryable_status(None)


@pytest.mark.parametrize(
    ("status", "retryable", "words"),
    [
        (401, False, "rejected the credentials (HTTP 401)"),
        (403, False, "HTTP 403, forbidden"),
        (404, False, "not found (HTTP 404)"),
        (400, False, "answered HTTP 400"),
        (500, False, "answered HTTP 500"),
        (408, True, "busy or unavailable (HTTP 408; try again)"),
        (425, True, "HTTP 425"),
        (429, True, "HTTP 429"),
        (503, True, "HTTP 503"),
    ],
)
def test_error_for_status(status: int, retryable: bool, words: str) -> None:
    error = toolkit.error_for_status(status, "create the sandbox", "why", service="the API")
    assert type(error) is sandbox.ProviderError
    assert error.retryable is retryable
    assert str(error).startswith("could not create the sandbox: ")
    assert words in str(error) and str(error).endswith(": why")


def test_error_for_status_redacts_and_shortens_the_detail() -> None:
    key = "sk-live-0123456789"
    detail = f"bad key {key}\nin header Authorization: Bearer {key} " + "x" * 1000
    error = toolkit.error_for_status(401, "start", detail, secrets=[Secret(key), None, ""])
    text = str(error)
    assert key not in text and "\n" not in text
    assert f"bad key {toolkit.REDACTED} in header" in text
    assert len(text) < 400 and text.endswith("...")
    assert str(toolkit.error_for_status(502, "start")).endswith("try again)")


def test_redact_hides_the_longest_secret_whole_and_skips_tiny_ones() -> None:
    text = "token abcd1234 and abcd and ab"
    assert toolkit.redact(text, ["abcd", "abcd1234", "ab"]) == (
        f"token {toolkit.REDACTED} and {toolkit.REDACTED} and ab"
    )
    assert toolkit.REDACTED == "<redacted>" == Secret("x").redact("x")


def test_transport_error_is_retryable_and_secret_free() -> None:
    secret_url = "https://user:hunter22@example.test/v1"
    cause = ConnectionRefusedError(errno.ECONNREFUSED, f"refused {secret_url}")
    wrapped = RuntimeError(f"failed {secret_url}")
    wrapped.__cause__ = cause
    error = toolkit.transport_error(wrapped, "start", service="the Worker")
    assert isinstance(error, sandbox.ConnectionLostError) and error.retryable
    assert str(error) == "could not start: cannot reach the Worker (connection refused)"
    assert "hunter22" not in str(error)
    assert str(toolkit.transport_error(RuntimeError(secret_url), "x")) == (
        "could not x: cannot reach the provider (RuntimeError)"
    )
    timed_out = toolkit.transport_error(TimeoutError(), "x", service="the engine")
    assert str(timed_out) == "could not x: the engine did not answer in time"
    assert timed_out.retryable
    assert "(reset)" in str(toolkit.transport_error(None, "x", reason="reset"))


def test_argv_builders_check_what_they_splice() -> None:
    tag = shell.new_tag()
    assert len(tag) == 32
    argv = shell.wrapper_argv(tag, ["echo", "hi"], rows=24, cols=80)
    assert argv[:2] == ["env", f"{shell.TAG_VARIABLE}={tag}"]
    assert argv[-4:] == ["24", "80", "echo", "hi"]
    assert shell.wrapper_argv(tag, ["x"], set_tag=False)[:2] == ["sh", "-c"]
    assert shell.tag_environment(tag) == {shell.TAG_VARIABLE: tag}
    for bad in ("", "short", "has space 12345", "$(reboot)12345", "x" * 65):
        with pytest.raises(ValueError):
            shell.check_tag(bad)
    with pytest.raises(ValueError):
        shell.wrapper_argv(tag, [])
    with pytest.raises(ValueError):
        shell.wrapper_argv(tag, ["x"], rows=24)
    with pytest.raises(ValueError):
        shell.kill_script([], ticks=1)
    with pytest.raises(ValueError):
        shell.kill_script([tag], ticks=-1)
    assert shell.kill_script([tag, tag], ticks=3)[-4:] == ["term", "3", tag, tag]
    assert shell.interrupt_script([tag])[-3:] == ["int", "0", tag]
    assert shell.grace_ticks(1.0) == 20 and shell.grace_ticks(0) == 0
    assert shell.command_line(["sh", "-c", "echo 'a b'"]) == "sh -c 'echo '\"'\"'a b'\"'\"''"
    assert shell.parse_kill_report("noise\nsandbox-kill: done\n") == "done"
    assert shell.parse_kill_report("sh: grep: not found") is None


def test_the_toolkit_re_exports_the_shell_trap() -> None:
    from sandbox.backends.toolkit.trap import ShellTrap

    assert toolkit.ShellTrap is ShellTrap
