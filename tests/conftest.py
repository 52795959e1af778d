"""Shared fixtures, and the order the suite starts in.

``make check`` runs the suite in parallel processes (pytest-xdist, ``--dist load``), and the
tests marked ``long`` run first: the longest test bounds the run's wall time, so it must not
start at the end (docs/development.md, "Tests in parallel")."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator

import pytest

CPU_NICE = 10


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def closed_port() -> Iterator[Callable[[], int]]:
    """Gives ports that refuse every connection while the test runs: each is bound here and
    never listens, so no server another worker starts meanwhile can take it, as it can take
    a port that was merely free when it was picked."""
    held: list[socket.socket] = []

    def port() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        held.append(sock)
        return int(sock.getsockname()[1])

    yield port
    for sock in held:
        sock.close()


@pytest.fixture(autouse=True)
def _cpu_bound_gives_way(request: pytest.FixtureRequest) -> None:
    """A test of a ``cpu`` group (``cpu``, ``cpu-replay``) lowers its process's priority
    (for good: a process cannot raise it again), so that on two cores the tests that measure
    time, and the servers they start, get the CPU first."""
    group = request.node.get_closest_marker("xdist_group")
    if group is not None and str(group.args[0]).startswith("cpu") and os.nice(0) < CPU_NICE:
        os.nice(CPU_NICE - os.nice(0))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``long(seconds)`` tests first, longest first, then the rest in their order. Every
    worker collects the same order, as xdist requires."""
    items.sort(key=_expected_s, reverse=True)


def _expected_s(item: pytest.Item) -> float:
    long = item.get_closest_marker("long")
    return float(long.args[0]) if long is not None else 0.0
