"""`sandbox.session.registry.ProcessRegistry`, alone: real entries, no session.

Each hand-over is one synchronous step, so every test checks the three facts that
make up ownership after it: where the entry is (registered, starting, neither),
whether it is marked `removed`, and whether its id is still reserved.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from sandbox import arguments
from sandbox.errors import InvalidArgumentError, PtyProcessNotFoundError, SandboxError
from sandbox.process_entry import ProcessSpec, PtyEntry
from sandbox.session.registry import (
    ID_RANGE,
    PROTECTED_RECENT,
    PRUNED_MEMORY,
    RECORD_NAME_TRIES,
    ProcessRegistry,
)

SPEC = ProcessSpec(
    command=arguments.build_command(("true",), shell=True, env=None, cwd=None),
    tty=False,
    rows=24,
    cols=80,
)


def _open() -> None:
    """`check_open` of a running session."""


def _registry(max_processes: int = 64) -> ProcessRegistry:
    return ProcessRegistry("test", max_processes=max_processes, output_limit_bytes=4096)


async def _admitted(registry: ProcessRegistry, n: int = 1) -> list[PtyEntry]:
    entries = []
    for _ in range(n):
        entry, victim = await registry.reserve(SPEC, check_open=_open)
        assert victim is None
        assert registry.admit(entry)
        entries.append(entry)
    return entries


async def test_reserve_makes_a_starting_entry_whose_id_is_reserved() -> None:
    registry = _registry()
    entry, victim = await registry.reserve(SPEC, check_open=_open)
    assert victim is None
    assert ID_RANGE[0] <= entry.process_id < ID_RANGE[1]
    assert entry.output_limit == 4096
    assert registry.is_starting(entry) and len(registry) == 0
    assert registry.reserved == {entry.process_id}
    assert registry.entries() == [entry]
    with pytest.raises(PtyProcessNotFoundError):
        registry.lookup(entry.process_id)  # not registered yet


async def test_reserve_checks_the_session_under_the_lock() -> None:
    registry = _registry()

    def closed() -> None:
        raise SandboxError("closed")

    with pytest.raises(SandboxError, match="closed"):
        await registry.reserve(SPEC, check_open=closed)
    assert registry.reserved == set()


async def test_admit_registers_and_lookup_finds_it() -> None:
    registry = _registry()
    (entry,) = await _admitted(registry)
    assert not registry.is_starting(entry)
    assert registry.lookup(entry.process_id) is entry
    assert len(registry) == 1 and not entry.removed
    assert [info.process_id for info in registry.infos()] == [entry.process_id]


async def test_admit_after_the_close_took_the_entry_says_so() -> None:
    registry = _registry()
    entry, _ = await registry.reserve(SPEC, check_open=_open)
    assert registry.take_everything() == [entry]
    assert entry.removed
    assert not registry.admit(entry)
    assert len(registry) == 0 and registry.reserved == {entry.process_id}


async def test_take_starting_hands_over_once() -> None:
    registry = _registry()
    entry, _ = await registry.reserve(SPEC, check_open=_open)
    assert registry.take_starting(entry)
    assert entry.removed and not registry.is_starting(entry)
    assert registry.reserved == {entry.process_id}  # until its teardown releases it
    assert not registry.take_starting(entry)  # nobody can take it twice
    registry.release(entry)
    assert registry.reserved == set()


async def test_take_pops_a_registered_process_and_keeps_its_id_until_release() -> None:
    registry = _registry()
    first, second = await _admitted(registry, 2)
    assert registry.take(first.process_id) is first
    assert first.removed and not second.removed
    assert registry.reserved == {first.process_id, second.process_id}
    with pytest.raises(PtyProcessNotFoundError, match="no process with id"):
        registry.take(first.process_id)
    with pytest.raises(PtyProcessNotFoundError):
        registry.lookup(first.process_id)
    registry.release(first)
    assert registry.reserved == {second.process_id}


async def test_take_entry_takes_only_that_very_entry() -> None:
    registry = _registry()
    (entry,) = await _admitted(registry)
    impostor = PtyEntry(entry.process_id, SPEC)
    assert not registry.take_entry(impostor)
    assert not impostor.removed and registry.lookup(entry.process_id) is entry
    assert registry.take_entry(entry)
    assert not registry.take_entry(entry)


async def test_take_all_leaves_starting_entries_and_take_everything_takes_them() -> None:
    registry = _registry()
    live = await _admitted(registry, 3)
    starting, _ = await registry.reserve(SPEC, check_open=_open)
    taken = registry.take_all()
    assert taken == live and all(e.removed for e in taken)
    assert registry.is_starting(starting) and not starting.removed
    assert registry.take_everything() == [starting] and starting.removed
    assert registry.entries() == [] and len(registry.reserved) == 4
    for entry in [*taken, starting]:
        registry.release(entry)
    assert registry.reserved == set()


async def test_spawn_tasks_lists_the_starting_entries_spawns() -> None:
    registry = _registry()
    entry, _ = await registry.reserve(SPEC, check_open=_open)
    assert registry.spawn_tasks() == []
    spawn = asyncio.get_running_loop().create_future()
    entry.spawn_task = spawn
    assert registry.spawn_tasks() == [spawn]
    spawn.cancel()


async def test_lookup_refuses_a_non_int_id() -> None:
    registry = _registry()
    for bad in ("1000", True, 1000.0, None):
        with pytest.raises(InvalidArgumentError, match="process_id must be an int"):
            registry.lookup(bad)  # type: ignore[arg-type]


async def test_a_full_registry_prunes_the_least_recently_used_exited_process() -> None:
    registry = _registry(max_processes=PROTECTED_RECENT + 3)
    entries = await _admitted(registry, PROTECTED_RECENT + 3)
    for entry in entries:
        entry.touch()  # recency in this order: entries[0] least recent
    entries[1].report_exit(0)
    new, victim = await registry.reserve(SPEC, check_open=_open)
    assert victim is entries[1]  # exited beats less recently used
    assert victim.removed and victim.process_id in registry.reserved
    said = victim.decoder.decode_drained(victim.output.drain(), final=False)
    assert f"[sandbox: process {victim.process_id} was pruned" in said
    assert registry.is_starting(new)
    with pytest.raises(PtyProcessNotFoundError, match="was pruned: the session was full"):
        registry.lookup(victim.process_id)
    assert "least recently used exited one" in str(registry.gone(victim))


async def test_without_an_exited_one_the_least_recently_used_running_one_goes() -> None:
    registry = _registry(max_processes=PROTECTED_RECENT + 2)
    entries = await _admitted(registry, PROTECTED_RECENT + 2)
    for entry in reversed(entries):
        entry.touch()  # entries[-1] is now the least recently used
    _, victim = await registry.reserve(SPEC, check_open=_open)
    assert victim is entries[-1]
    assert "least recently used running one" in str(registry.not_found(victim.process_id))


async def test_the_most_recently_used_are_protected_even_when_exited() -> None:
    registry = _registry(max_processes=PROTECTED_RECENT + 2)
    entries = await _admitted(registry, PROTECTED_RECENT + 2)
    for entry in entries:
        entry.touch()
    entries[-1].report_exit(0)  # exited, but among the most recent
    assert registry.prune_victim() is entries[0]


async def test_a_registry_full_of_starting_entries_refuses_retryably() -> None:
    registry = _registry(max_processes=PROTECTED_RECENT + 1)
    for _ in range(PROTECTED_RECENT + 1):
        await registry.reserve(SPEC, check_open=_open)
    with pytest.raises(SandboxError, match="already starting") as caught:
        await registry.reserve(SPEC, check_open=_open)
    assert caught.value.retryable
    assert len(registry.reserved) == PROTECTED_RECENT + 1


async def test_the_warning_comes_once_at_the_mark(caplog: pytest.LogCaptureFixture) -> None:
    registry = _registry(max_processes=20)
    assert registry.warn_processes == 16
    with caplog.at_level(logging.WARNING, logger="sandbox"):
        await _admitted(registry, 15)
        assert not caplog.records
        await _admitted(registry, 1)
        assert len(caplog.records) == 1
        assert "16 of 20 processes" in caplog.records[0].getMessage()
        await _admitted(registry, 2)
    assert len(caplog.records) == 1


async def test_pruned_reasons_are_forgotten_oldest_first() -> None:
    registry = _registry(max_processes=PROTECTED_RECENT + 1)
    await _admitted(registry, PROTECTED_RECENT + 1)
    victims = []
    for _ in range(PRUNED_MEMORY + 1):
        new, victim = await registry.reserve(SPEC, check_open=_open)
        assert victim is not None
        victims.append(victim)  # not released: its id is never handed out again
        assert registry.admit(new)
        new.touch()
    assert "never existed" in str(registry.not_found(victims[0].process_id))
    assert "was pruned" in str(registry.not_found(victims[1].process_id))
    assert "was pruned" in str(registry.not_found(victims[-1].process_id))


async def test_ids_avoid_taken_names_for_a_bounded_number_of_tries() -> None:
    registry = _registry()
    asked: list[int] = []

    def all_but_third(process_id: int) -> bool:
        asked.append(process_id)
        return len(asked) < 3

    entry, _ = await registry.reserve(SPEC, check_open=_open, name_taken=all_but_third)
    assert entry.process_id == asked[2] and len(asked) == 3

    asked.clear()
    entry, _ = await registry.reserve(SPEC, check_open=_open, name_taken=lambda pid: True)
    assert isinstance(entry.process_id, int)  # taken anyway after the tries


async def test_an_id_in_use_is_never_handed_out_again() -> None:
    registry = _registry()
    retiring = (await _admitted(registry))[0]
    registry.take(retiring.process_id)
    low, high = ID_RANGE
    # Every id but one is reserved: the reservation must find exactly that one.
    registry._retiring.update(range(low, high))
    free = low + 12345
    registry._retiring.discard(free)
    entry, _ = await registry.reserve(SPEC, check_open=_open)
    assert entry.process_id == free
    assert RECORD_NAME_TRIES > 0


async def test_adopt_registers_a_resumed_entry_and_refuses_an_id_in_use() -> None:
    registry = _registry()
    (live,) = await _admitted(registry)
    resumed: PtyEntry = PtyEntry(live.process_id + 1, SPEC, output_limit=4096)
    registry.adopt(resumed)
    assert registry.lookup(resumed.process_id) is resumed
    assert registry.registered() == sorted([live, resumed], key=lambda e: e.started_at)
    with pytest.raises(InvalidArgumentError, match="already in use"):
        registry.adopt(PtyEntry(live.process_id, SPEC, output_limit=4096))
    assert registry.lookup(live.process_id) is live  # the one in use is left alone


async def test_take_all_starting_takes_only_the_starting_entries() -> None:
    registry = _registry()
    live = await _admitted(registry, 2)
    starting, _ = await registry.reserve(SPEC, check_open=_open)
    assert registry.take_all_starting() == [starting] and starting.removed
    assert registry.registered() == sorted(live, key=lambda e: e.started_at)
    assert starting.process_id in registry.reserved  # until its teardown releases it
