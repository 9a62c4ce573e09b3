"""The `runner` option's policy, one for every backend that can run its processes
through the runner (docs/runner.md, "Delivery"): `False` never, `True` always (a failed
delivery or start fails the session's start, saying why), `None` (auto) the runner
where this install has a build for the sandbox and the sandbox takes it, else the
backend's own path with the reason (`runner_fallback_reason`, and a warning on the
backend's logger when the install had a runner: the fallback is a surprise then).

`RunnerChoice` is one session's decision; `RunnerReport` gives a session class the two
public properties that tell it (`uses_runner`, `runner_fallback_reason`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...runner import runner_binary, unavailable_reason
from .runner_place import FALLBACK_ERRORS, RUNNER_OFF, fallen_back

R = TypeVar("R")

# Why an auto session has no runner when this install has none for the sandbox's
# machine (the install has a build, for another architecture).
NO_BUILD_FOR_MACHINE = "runner: this install has no build for the sandbox's machine"


class RunnerChoice:
    """What the `runner` option (`asked`) decided for one session: `uses` (before the
    start, what the option would pick: `predicted` is what auto would, e.g. whether
    this install has a runner at all) and `reason` (why the started session has none;
    None while it has one, and before the start)."""

    def __init__(self, asked: bool | None, *, predicted: bool | None = None) -> None:
        self.asked = asked
        if asked is None and predicted is None:
            # Only auto asks the install (a stat, the hash cached per process).
            predicted = runner_binary() is not None
        self.uses = asked is True or (asked is None and bool(predicted))
        self.reason: str | None = None

    async def decide(
        self, start: Callable[[], Awaitable[R | None]], *, backend: str, where: str
    ) -> R | None:
        """The session's runner from `start` (deliver, start and connect; None where
        this install has no build for the sandbox's machine) under the option's policy;
        `uses` and `reason` say what came of it. `where`: "container", "sandbox"."""
        if self.asked is False:
            runner = None
            self.reason = RUNNER_OFF
        elif self.asked:
            runner = await start()
        else:
            try:
                runner = await start()
            except FALLBACK_ERRORS as exc:
                runner = None
                self.reason = fallen_back(backend, where, exc)
            else:
                if runner is None:
                    self.reason = unavailable_reason() or NO_BUILD_FOR_MACHINE
        self.uses = runner is not None
        if runner is not None:
            self.reason = None
        return runner

    def record(self, runner: object | None, reason: str | None) -> None:
        """What a backend that applies the policy itself decided (its runner, or None
        and why not)."""
        self.uses = runner is not None
        self.reason = None if runner is not None else reason


class RunnerReport:
    """The public face of a session's `RunnerChoice` (kept in `_runner_choice`)."""

    _runner_choice: RunnerChoice

    @property
    def uses_runner(self) -> bool:
        """Whether the session's processes and commands go through the runner
        (docs/runner.md): decided at start by the `runner` option (before it, what the
        options would pick)."""
        return self._runner_choice.uses

    @property
    def runner_fallback_reason(self) -> str | None:
        """Why the started session runs its processes without the runner:
        "runner=False", the reason this install has no runner for the sandbox, or the
        failed delivery or start of auto mode; None while it uses the runner (and
        before start)."""
        return self._runner_choice.reason
