"""The suite's shared docker container (tests/backend_fixtures/docker.py) left behind by a
run that was stopped (SIGTERM to `make test`) is removed by the next run, and no other
container is: real containers on this machine's engine."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.backend_fixtures import docker as fixture


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Ids of the containers a test creates (never started); removed after it."""
    reason = fixture.skip_reason()
    if reason:
        pytest.skip(reason)
    ids: list[str] = []
    yield ids
    for container_id in ids:
        fixture._remove(container_id)


def _create(made: list[str], labels: dict[str, str]) -> str:
    info = fixture._client().create_container(
        fixture.image(), command=fixture.KEEPALIVE, labels=labels
    )
    made.append(str(info["Id"]))
    return made[-1]


def _exists(container_id: str) -> bool:
    return any(c["Id"] == container_id for c in fixture._client().containers(all=True))


def test_a_stopped_runs_shared_container_is_removed_and_nothing_else(
    made: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A label of this test's own: every parallel worker removes the leftovers it finds
    # when it makes its own shared container, and would take this test's planted one.
    monkeypatch.setattr(fixture, "SHARED_LABEL", f"{fixture.SHARED_LABEL}.{os.getpid()}")
    ended = subprocess.Popen(["sleep", "3600"])
    gone_owner = fixture.owner_token(ended.pid)
    ended.kill()
    ended.wait()
    live_owner = fixture.owner_token(os.getpid())
    assert gone_owner and live_owner and fixture.owner_token(ended.pid) == ""
    shared = {fixture.SHARED_LABEL: "1"}
    leftover = _create(made, {**shared, fixture.OWNER_LABEL: gone_owner})
    running_run = _create(made, {**shared, fixture.OWNER_LABEL: live_owner})
    unowned = _create(made, shared)  # made before owners were labelled: not judged
    other_namespace = _create(
        made, {**shared, fixture.OWNER_LABEL: "pid:[1] 1 1"}
    )  # a run elsewhere on this engine
    not_shared = _create(made, {fixture.OWNER_LABEL: gone_owner})

    removed = fixture.remove_leftovers()

    assert leftover in removed and not _exists(leftover)
    for kept in (running_run, unowned, other_namespace, not_shared):
        assert kept not in removed and _exists(kept)


def test_the_shared_container_names_its_owner() -> None:
    reason = fixture.skip_reason()
    if reason:
        pytest.skip(reason)
    labels = fixture._client().inspect_container(fixture.shared_container())["Config"]["Labels"]
    assert labels[fixture.SHARED_LABEL] == "1"
    assert labels[fixture.OWNER_LABEL] == fixture.owner_token(os.getpid())
