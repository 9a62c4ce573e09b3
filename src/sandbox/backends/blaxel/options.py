"""The checks of `BlaxelSession`'s options, all made when the session is made, not when
first used (a bad grace period would otherwise surface as a raw TypeError in a
teardown)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...backend import check_env, check_seconds, check_str
from ...errors import InvalidArgumentError
from .client import SESSION_LABEL
from .workspace import NOT_WITH_SNAPSHOT


def check_options(
    *,
    seconds: Mapping[str, Any],
    heartbeat_s: Any,
    terminate_grace_s: Any,
    texts: Mapping[str, Any],
    snapshot: Any,
    not_with_snapshot: Mapping[str, Any],
    labels: Any,
    create_timeout_s: Any,
    sizes: Mapping[str, Any],
    runner: Any,
) -> Mapping[str, str] | None:
    """Check every option (`InvalidArgumentError` for the first bad one): `seconds`
    positive durations, `heartbeat_s` one or None, `terminate_grace_s` one or zero,
    `texts` strings or None, nothing of `not_with_snapshot` beside a `snapshot`, the
    `labels` (never the library's own), `create_timeout_s` a positive int or None,
    `sizes` positive ints, `runner` True, False or None. Returns the checked labels."""
    for option, value in seconds.items():
        check_seconds(option, value)
    check_seconds("heartbeat_s", heartbeat_s, allow_none=True)
    check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
    for option, text in texts.items():
        check_str(option, text)
    if snapshot is not None:
        refused = [option for option in NOT_WITH_SNAPSHOT if not_with_snapshot[option]]
        if refused:
            raise InvalidArgumentError(
                f"snapshot= replaces {'=, '.join(refused)}= (a fork runs with the "
                "snapshot's image, memory and region)"
            )
    checked = check_env(labels, name="labels", variables=False)
    if checked and SESSION_LABEL in checked:
        raise InvalidArgumentError(
            f"labels[{SESSION_LABEL!r}] is the library's own mark of the sandboxes it "
            "creates: choose another label"
        )
    if create_timeout_s is not None and (
        isinstance(create_timeout_s, bool)
        or not isinstance(create_timeout_s, int)
        or create_timeout_s <= 0
    ):
        raise InvalidArgumentError(
            f"create_timeout_s must be a positive int, not {create_timeout_s!r}"
        )
    for option, number in sizes.items():
        if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
            raise InvalidArgumentError(f"{option} must be a positive int, not {number!r}")
    if runner is not None and not isinstance(runner, bool):
        raise InvalidArgumentError(f"runner must be True, False or None, not {runner!r}")
    return checked
