"""`sandbox.session.options.SessionOptions`, alone: every check at its boundary."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox.errors import InvalidArgumentError
from sandbox.session import PROTECTED_RECENT
from sandbox.session.options import SessionOptions


def test_the_defaults_pass_and_the_options_are_frozen() -> None:
    options = SessionOptions()
    assert options.max_processes > PROTECTED_RECENT and options.teardown_concurrency >= 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_processes = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "least"),
    [
        ("max_processes", PROTECTED_RECENT + 1),
        ("output_limit_bytes", 1024),
        ("teardown_concurrency", 1),
    ],
)
def test_an_int_option_is_refused_below_its_least_value(name: str, least: int) -> None:
    assert getattr(SessionOptions(**{name: least}), name) == least
    with pytest.raises(InvalidArgumentError, match=f"^{name} must be at least {least}, not "):
        SessionOptions(**{name: least - 1})
    for bad in (True, 2.0 * least, str(least)):
        with pytest.raises(InvalidArgumentError, match=f"^{name} must be an int, not "):
            SessionOptions(**{name: bad})


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("read_limit_bytes", "read_limit_bytes must be an int >= 0, not "),
        ("exec_output_limit_bytes", r"exec_output_limit_bytes must be an int >= 0 \(bytes\)"),
    ],
)
def test_a_byte_count_may_be_zero_but_not_negative(name: str, message: str) -> None:
    assert getattr(SessionOptions(**{name: 0}), name) == 0
    for bad in (-1, False, "16M"):
        with pytest.raises(InvalidArgumentError, match=f"^{message}"):
            SessionOptions(**{name: bad})


def test_the_first_bad_option_in_order_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^max_processes"):
        SessionOptions(max_processes=0, teardown_concurrency=0, read_limit_bytes=-1)
    with pytest.raises(InvalidArgumentError, match=r"^teardown_concurrency"):
        SessionOptions(teardown_concurrency=0, read_limit_bytes=-1)
    with pytest.raises(InvalidArgumentError, match=r"^read_limit_bytes"):
        SessionOptions(read_limit_bytes=-1, exec_output_limit_bytes=-1)
