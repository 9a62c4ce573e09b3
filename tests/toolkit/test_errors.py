"""The one HTTP error policy (sandbox.backends.toolkit.errors): retryable statuses, errors
for a status, redaction, transport errors."""

from __future__ import annotations

import errno

import pytest

import sandbox
from sandbox.backends import toolkit
from sandbox.backends.toolkit.credentials import Secret


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
