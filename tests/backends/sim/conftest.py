"""Fixtures for the simulated vLLM's tests: a real uvicorn server on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest
import uvicorn

from backends.sim.config import SimConfig
from backends.sim.server import create_app


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def running_sim(config: SimConfig) -> AsyncIterator[str]:
    """Serve ``config`` under uvicorn in this event loop; yields the base URL."""
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP;
    # without it every two-write response waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            log_level="warning",
            access_log=False,
            lifespan="on",
            loop="none",
            http="httptools",
        )
    )
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


class FakeTime:
    """A clock and a sleep for the real-time engine: sleeping moves the clock at once."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-ngram-k4"


def shape(value: object) -> object:
    """The keys (in order) and value kinds of a JSON value, without the values."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def sse_events(raw: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, ``[DONE]`` included."""
    return [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]


@pytest.fixture
def fixture_sse() -> Callable[[str], list[bytes]]:
    return lambda name: sse_events((FIXTURES / name).read_bytes())


@pytest.fixture
def fixture_json() -> Callable[[str], object]:
    return lambda name: orjson.loads((FIXTURES / name).read_bytes())


@pytest.fixture
def json_shape() -> Callable[[object], object]:
    return shape


@pytest.fixture
def sim_server() -> Callable[[SimConfig], contextlib.AbstractAsyncContextManager[str]]:
    return running_sim
