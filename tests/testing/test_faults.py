"""The fault kit (`sandbox.testing.faults`): gates, planned failures, stalls, `park_calls`.

Each test drives a tiny "service" call that awaits `plan.checkpoint` before and after its
work, the way every stand-in does, and looks at what happened to the work and the caller.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandbox.testing.faults import FaultPlan, Gate, PlannedFailure, park_calls


class Service:
    """A stand-in in miniature: `create` makes a thing between its two checkpoints."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.made: list[str] = []

    async def create(self, name: str) -> str | object:
        answer = await self.plan.checkpoint("create", subject=name)
        if answer is not None:
            return answer
        self.made.append(name)
        await self.plan.checkpoint("create", after=True, subject=name)
        return name


async def test_a_gate_parks_before_the_work_until_released() -> None:
    service = Service(FaultPlan({"create"}))
    gate = service.plan.gate("create")
    task = asyncio.ensure_future(service.create("a"))
    await gate.reached.wait()
    assert service.made == [] and gate.waiting == 1 and not task.done()
    gate.release()
    assert await task == "a"
    assert service.made == ["a"] and gate.waiting == 0 and gate.hits == 1
    # Released: later calls pass at once.
    assert await service.create("b") == "b"
    assert gate.hits == 1


async def test_a_gate_after_the_work_holds_back_the_answer() -> None:
    service = Service(FaultPlan())
    gate = service.plan.gate("create", after=True)
    task = asyncio.ensure_future(service.create("a"))
    await gate.reached.wait()
    assert service.made == ["a"]  # made, its caller does not know yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.abandoned.is_set() and gate.waiting == 0


async def test_a_failed_gate_makes_parked_and_later_calls_raise() -> None:
    service = Service(FaultPlan())
    gate = service.plan.gate("create")
    first = asyncio.ensure_future(service.create("a"))
    await gate.reached.wait()
    boom = ConnectionResetError("peer went away")
    gate.fail(boom)
    with pytest.raises(ConnectionResetError) as info:
        await first
    assert info.value is boom
    assert gate.released and service.made == []
    # Later calls raise too, each its own copy (no shared traceback).
    with pytest.raises(ConnectionResetError) as later:
        await service.create("b")
    assert later.value is not boom and str(later.value) == "peer went away"


async def test_a_gate_made_with_an_error_fails_late() -> None:
    service = Service(FaultPlan())
    gate = service.plan.gate("create", after=True, error=TimeoutError("lost"))
    task = asyncio.ensure_future(service.create("a"))
    await gate.reached.wait()
    gate.release()
    with pytest.raises(TimeoutError, match="lost"):
        await task
    assert service.made == ["a"]


async def test_a_gate_with_times_catches_only_that_many_calls() -> None:
    service = Service(FaultPlan())
    gate = service.plan.gate("create", times=1)
    parked = asyncio.ensure_future(service.create("a"))
    await gate.reached.wait()
    assert gate.exhausted
    assert await service.create("b") == "b"  # the second call passes the exhausted gate
    assert not parked.done()
    gate.release()
    assert await parked == "a"
    assert service.made == ["b", "a"]


async def test_where_picks_the_calls_a_gate_catches() -> None:
    service = Service(FaultPlan())
    gate = service.plan.gate("create", where=lambda name: name.startswith("slow"))
    assert await service.create("quick") == "quick"
    task = asyncio.ensure_future(service.create("slow-1"))
    await gate.reached.wait()
    assert gate.hits == 1 and service.made == ["quick"]
    gate.release()
    assert await task == "slow-1"


async def test_every_matching_gate_parks_the_call_in_turn() -> None:
    service = Service(FaultPlan())
    first, second = service.plan.gate("create"), service.plan.gate("create")
    task = asyncio.ensure_future(service.create("a"))
    await first.reached.wait()
    assert not second.reached.is_set()
    first.release()
    await second.reached.wait()
    assert not task.done()
    second.release()
    assert await task == "a"


async def test_a_stall_never_answers_until_released() -> None:
    plan = FaultPlan()
    stall = plan.stall("create")
    assert isinstance(stall, Gate)
    task = asyncio.ensure_future(Service(plan).create("a"))
    await stall.reached.wait()
    plan.release_all()
    assert await task == "a"


async def test_planned_failure_raises_an_exception_the_nth_time() -> None:
    service = Service(FaultPlan())
    boom = OSError("disk full")
    failure = service.plan.fail("create", boom, skip=2, times=2)
    assert isinstance(failure, PlannedFailure)
    assert [await service.create("a"), await service.create("b")] == ["a", "b"]
    with pytest.raises(OSError) as third:
        await service.create("c")
    assert third.value is boom
    with pytest.raises(OSError) as fourth:
        await service.create("d")
    assert fourth.value is not boom
    assert failure.spent and failure.used == 2
    assert await service.create("e") == "e"
    assert service.made == ["a", "b", "e"]
    assert service.plan.calls == ["create"] * 5


async def test_planned_failure_after_the_work_loses_the_answer() -> None:
    service = Service(FaultPlan())
    service.plan.fail("create", ConnectionError("answer lost"), after=True)
    with pytest.raises(ConnectionError):
        await service.create("a")
    assert service.made == ["a"]


async def test_a_planned_value_is_handed_back_not_raised() -> None:
    service = Service(FaultPlan())
    service.plan.fail("create", 503, times=None)
    assert await service.create("a") == 503
    assert await service.create("b") == 503
    assert service.made == []


async def test_take_and_park_keep_their_own_order() -> None:
    plan = FaultPlan()
    plan.fail("create", 429)
    gate = plan.gate("create")
    # take first: the failure answers without parking (what the HTTP stand-ins do).
    assert plan.take("create") == 429
    assert plan.take("create") is None
    assert plan.gates_at("create") == [gate]
    parked = asyncio.ensure_future(plan.park("create"))
    await gate.reached.wait()
    gate.release()
    await parked
    assert plan.gates_at("create") == []


def test_unknown_points_and_bad_counts_are_refused() -> None:
    plan = FaultPlan({"create", "delete"})
    with pytest.raises(ValueError, match="unknown fault point 'crate'; known: create, delete"):
        plan.fail("crate", OSError())
    with pytest.raises(ValueError, match="unknown fault point"):
        plan.gate("crate")
    with pytest.raises(ValueError, match="times"):
        plan.fail("create", OSError(), times=0)
    with pytest.raises(ValueError, match="skip"):
        plan.fail("create", OSError(), skip=-1)
    with pytest.raises(ValueError, match="times"):
        plan.gate("create", times=0)
    assert plan.failures == [] and plan.gates == []


async def test_clear_forgets_faults_but_parked_calls_stay_parked() -> None:
    service = Service(FaultPlan())
    gate = service.plan.gate("create")
    service.plan.fail("create", OSError())
    task = asyncio.ensure_future(service.create("a"))
    await gate.reached.wait()
    service.plan.clear()
    assert not task.done()
    gate.release()
    assert await task == "a"  # the failure was forgotten while the call was parked


class Hooks:
    def __init__(self) -> None:
        self.done: list[str] = []

    async def start(self, name: str) -> str:
        self.done.append(name)
        return name.upper()


async def test_park_calls_before_the_real_method() -> None:
    hooks = Hooks()
    gate = park_calls(hooks, "start")
    task = asyncio.ensure_future(hooks.start("x"))
    await gate.reached.wait()
    assert hooks.done == []
    gate.release()
    assert await task == "X" and hooks.done == ["x"]
    assert Hooks().start.__name__ == "start"  # other instances are untouched
    assert await Hooks().start("y") == "Y"


async def test_park_calls_after_the_real_method_then_fail() -> None:
    hooks = Hooks()
    gate = park_calls(hooks, "start", after=True)
    task = asyncio.ensure_future(hooks.start("x"))
    await gate.reached.wait()
    assert hooks.done == ["x"]
    gate.fail(RuntimeError("the answer never came"))
    with pytest.raises(RuntimeError, match="never came"):
        await task


async def test_the_stand_ins_knobs_arm_their_one_plan(tmp_path: Path) -> None:
    from sandbox.testing.cloudflare_server import CloudflareWorkerServer, Stall
    from sandbox.testing.e2b_fake import FakeE2B
    from sandbox.testing.modal_fake import FakeModal

    modal = FakeModal()
    gate = modal.block("create", then_raise=OSError("late"))
    assert isinstance(gate, Gate) and modal.faults.gates == [gate]
    server = CloudflareWorkerServer(api_key="k", root=tmp_path / "cf")
    stall = server.stall("exec_stream")
    assert isinstance(stall, Stall) and stall is server.faults.gates[0]
    assert server.stall("exec_stream") is server.faults.gates[0]  # a new stall replaces it
    server.fail("exec", 503, times=2)
    answers = [server.faults.take("exec") for _ in range(3)]
    assert [getattr(a, "status", None) for a in answers] == [503, 503, None]
    async with FakeE2B(api_key="k", root=tmp_path) as e2b:
        with pytest.raises(ValueError, match="unknown fault point 'nope'"):
            e2b.block("nope")
        e2b.fail("create", OSError("down"), after=True)
        assert [f.point for f in e2b.faults.failures] == ["create"]
