"""The one fault kit of `sandbox.testing`: gates, planned failures and stalls.

Every stand-in (`blaxel_server`, `cloudflare_server`, `e2b_fake`, `daytona_fake`,
`modal_fake`) injects its faults through a `FaultPlan`, and tests park a session's own
methods with `park_calls`; each stand-in keeps its knob names (`fail`, `block`, `stall`)
as thin wrappers over the plan, so every backend's tests speak one dialect.

The words:

- a **point** names a place where a stand-in checks for faults: an SDK call
  (`"commands.run"`), an HTTP endpoint (`"exec"`) or a step inside one
  (`"terminal_output"`). A call may pass a point twice: before its work, and with
  `after=True` once the work is done but before the caller hears of it (a sandbox
  created whose answer is lost);
- a **gate** (`Gate`) parks calls at a point: its `reached` event is set when one
  arrives, so a test cancels or closes at a known moment (never after a sleep);
  `release()` lets parked and later calls through, `fail(exc)` makes them raise;
- a **stall** is a gate nobody releases: a call that never answers (a peer that
  accepts and stays silent). `FaultPlan.stall` is `gate` under the name tests read;
- a **planned failure** (`FaultPlan.fail`) makes the Nth call at a point (after `skip`
  calls, `times` of them, None for all) fail: with an exception, which `checkpoint`
  raises, or with any other value (an HTTP status, a response body), which
  `checkpoint` or `take` hands back for the stand-in to answer with.

A stand-in calls `await plan.checkpoint(point, after=..., subject=...)` where the
real service could fail; `subject` (a process, an argv) is what `where=` predicates
see. Stand-ins that must keep a particular order between failing and parking use
`take` and `park` separately.

Example, a close racing a create whose answer is lost::

    plan = FaultPlan({"create"})
    gate = plan.gate("create", after=True)
    task = asyncio.ensure_future(service_create(plan))  # awaits plan.checkpoint(...)
    await gate.reached.wait()   # the sandbox exists; its creator does not know yet
    task.cancel()
    gate.release()
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

__all__ = ["FaultPlan", "Gate", "PlannedFailure", "Predicate", "park_calls"]

# What `where=` takes: a test of a call's subject (its path, name or arguments).
Predicate = Callable[[Any], bool]


class Gate:
    """Parks the calls that reach it until `release()` or `fail()`.

    `reached` is set when a call parks; `abandoned` when a parked call was cancelled
    (its caller went away), so a test knows the stand-in saw the disconnect. `hits`
    counts the calls that parked here, `waiting` those parked now. With `times` the
    gate catches only that many calls (later ones pass); `where` limits it to calls
    whose subject it accepts. A released gate lets every later call through at once.
    """

    def __init__(
        self,
        point: str = "",
        *,
        after: bool = False,
        where: Predicate | None = None,
        times: int | None = None,
        error: BaseException | None = None,
    ) -> None:
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 or None, not {times}")
        self.point = point
        self.after = after
        self.where = where
        self.times = times
        self.reached = asyncio.Event()
        self.abandoned = asyncio.Event()
        self.hits = 0
        self.waiting = 0
        self._error = error
        self._released = asyncio.Event()

    def __repr__(self) -> str:
        where = " after" if self.after else ""
        state = "released" if self.released else f"waiting={self.waiting}"
        return f"<Gate {self.point!r}{where} hits={self.hits} {state}>"

    @property
    def released(self) -> bool:
        """Whether `release()` or `fail()` was called."""
        return self._released.is_set()

    @property
    def exhausted(self) -> bool:
        """Whether the gate caught all the calls it was made for (`times`)."""
        return self.times is not None and self.hits >= self.times

    def release(self) -> None:
        """Let every parked call (and every later one) go on."""
        self._released.set()

    def fail(self, error: BaseException) -> None:
        """Release the gate so that every parked call (and every later one that reaches
        it) raises `error` instead of going on."""
        self._error = error
        self._released.set()

    def catches(self, subject: object = None) -> bool:
        """Whether a call with `subject` would park here now."""
        if self.exhausted or (self.released and self._error is None):
            return False
        return self.where is None or self.where(subject)

    async def park(self) -> None:
        """Wait here until released (what a stand-in awaits at its point); raise the
        gate's error if it has one. A cancelled wait sets `abandoned`."""
        self.hits += 1
        self.waiting += 1
        self.reached.set()
        try:
            await self._released.wait()
        except asyncio.CancelledError:
            self.abandoned.set()
            raise
        finally:
            self.waiting -= 1
        if self._error is not None:
            raise _fresh(self._error, self.hits)


class PlannedFailure:
    """One planned failure: after `skip` matching calls, the next `times` (None: all)
    fail with `error`. `used` counts the calls it failed."""

    def __init__(
        self,
        point: str,
        error: object,
        *,
        times: int | None = 1,
        skip: int = 0,
        after: bool = False,
        where: Predicate | None = None,
    ) -> None:
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 or None, not {times}")
        if skip < 0:
            raise ValueError(f"skip must not be negative, not {skip}")
        self.point = point
        self.error = error
        self.times = times
        self.skip = skip
        self.after = after
        self.where = where
        self.used = 0

    def __repr__(self) -> str:
        return f"<PlannedFailure {self.point!r} {self.error!r} used={self.used}>"

    @property
    def spent(self) -> bool:
        """Whether it failed every call it was planned for."""
        return self.times is not None and self.used >= self.times

    def _claim(self, subject: object) -> bool:
        if self.spent or (self.where is not None and not self.where(subject)):
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        self.used += 1
        return True


def _fresh(error: BaseException, use: int) -> BaseException:
    """`error` itself the first time, a copy after: one instance raised twice would
    chain the tracebacks of unrelated calls."""
    return error if use <= 1 else copy.copy(error)


class FaultPlan:
    """The faults armed at a stand-in's points, and the record of calls that reached them.

    `points`, when given, are the names a stand-in checks; arming any other name is a
    `ValueError` (a typo would otherwise arm nothing). `calls` lists, in order, the
    points `checkpoint` saw before their work.
    """

    def __init__(self, points: Iterable[str] | None = None) -> None:
        self.points = frozenset(points) if points is not None else None
        self.calls: list[str] = []
        self.gates: list[Gate] = []
        self.failures: list[PlannedFailure] = []

    def _known(self, point: str) -> str:
        if self.points is not None and point not in self.points:
            known = ", ".join(sorted(self.points))
            raise ValueError(f"unknown fault point {point!r}; known: {known}")
        return point

    # ---- arming ----------------------------------------------------------------------

    def fail(
        self,
        point: str,
        error: object,
        *,
        times: int | None = 1,
        skip: int = 0,
        after: bool = False,
        where: Predicate | None = None,
    ) -> PlannedFailure:
        """Make calls at `point` fail with `error` (an exception to raise, or a value such
        as an HTTP status the stand-in answers with): the `times` calls (None: all) that
        come after `skip` matching ones; with `after`, once their work is done."""
        failure = PlannedFailure(
            self._known(point), error, times=times, skip=skip, after=after, where=where
        )
        self.failures.append(failure)
        return failure

    def gate(
        self,
        point: str,
        *,
        after: bool = False,
        where: Predicate | None = None,
        times: int | None = None,
        error: BaseException | None = None,
    ) -> Gate:
        """Park calls at `point` (before their work, or with `after` once it is done) until
        the returned gate is released; `times` limits how many it catches, `error` is
        raised by the parked calls once released (a call that fails late)."""
        gate = Gate(self._known(point), after=after, where=where, times=times, error=error)
        self.gates.append(gate)
        return gate

    def stall(self, point: str, *, where: Predicate | None = None) -> Gate:
        """A call at `point` that never answers until the returned gate is released."""
        return self.gate(point, where=where)

    def release_all(self) -> None:
        """Release every gate (at the end of a test, or when the stand-in stops)."""
        for gate in self.gates:
            gate.release()

    def clear(self) -> None:
        """Forget every armed failure and gate; calls parked now stay parked until their
        gate is released."""
        self.gates.clear()
        self.failures.clear()

    # ---- what a stand-in calls -------------------------------------------------------

    def gates_at(self, point: str, *, after: bool = False, subject: object = None) -> list[Gate]:
        """The gates a call at `point` would park at now, in the order it would meet them."""
        return [
            g for g in self.gates if g.point == point and g.after == after and g.catches(subject)
        ]

    def take(self, point: str, *, after: bool = False, subject: object = None) -> object | None:
        """Claim the planned failure for this call, if any, and return its error (the
        exception is returned, not raised); None when the call should go on."""
        for failure in self.failures:
            if failure.point == point and failure.after == after and failure._claim(subject):
                error = failure.error
                if isinstance(error, BaseException):
                    return _fresh(error, failure.used)
                return error
        return None

    async def park(self, point: str, *, after: bool = False, subject: object = None) -> None:
        """Park at every gate that catches this call, one after the other."""
        for gate in self.gates_at(point, after=after, subject=subject):
            if gate.catches(subject):  # an earlier gate's wait may have changed it
                await gate.park()

    async def checkpoint(
        self, point: str, *, after: bool = False, subject: object = None
    ) -> object | None:
        """A call passing `point`: recorded (when not `after`), parked at matching gates,
        then failed as planned: an exception is raised, any other planned error is
        returned for the stand-in to answer with (None: go on)."""
        if not after:
            self.calls.append(point)
        await self.park(point, after=after, subject=subject)
        error = self.take(point, after=after, subject=subject)
        if isinstance(error, BaseException):
            raise error
        return error


def park_calls(obj: object, name: str, *, after: bool = False) -> Gate:
    """Park every call of the async method `name` of `obj` (this instance only) at a new
    gate, returned. The real method still does all the work: before it (`after=False`)
    or after it, with its result held back until the gate is released (what it made
    exists; its caller does not know yet). A gate that `fail`s makes the calls raise.

    A method that returns an awaitable or None (a `_spawn_process` that may finish
    without awaiting) is parked too: the parked call awaits what it returns, so the
    session sees an awaitable and runs it as its owned task, which is what parks.
    """
    original: Callable[..., Awaitable[Any] | None] = getattr(obj, name)
    gate = Gate(name, after=after)

    @functools.wraps(original)
    async def parked(*args: Any, **kwargs: Any) -> Any:
        if not after:
            await gate.park()
        result = original(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if after:
            await gate.park()
        return result

    setattr(obj, name, parked)
    return gate
