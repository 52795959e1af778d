"""A Redis that answers what no Redis would, through a real gateway on loopback in front of
simulators: a reply of another type than the command's, a malformed length (which
redis-py's parser meets with ``ValueError``), or another protocol's page. The gateway starts,
serves every request on its own state (the prefix map's lookup, a stored response's pin),
says it is degraded, and its background work (the pub/sub listener, the pin writer) is
still there when a real Redis answers again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.services import Services
from tests.gateways import gateway, policy_yaml, settings
from tests.redis_server import private_redis
from tests.servers import serving

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

MODEL = "qwen3-32b"
TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}
LONG = "a prompt long enough for the prefix map to be looked up " * 20
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 4}
RESPONSES = {"model": MODEL, "input": LONG, "max_output_tokens": 4}
GARBAGE = {
    "another type": b":1\r\n",
    "a malformed length": b"$abc\r\n",
    "an http page": b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
}


class Garbling:
    """A TCP proxy in front of a Redis (``port``), or of nothing: while ``reply`` is set,
    every command read is answered with it and nothing reaches the Redis behind."""

    def __init__(self, port: int | None, reply: bytes | None) -> None:
        self.reply = reply
        self._port = port
        self._open: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.append(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self._port is not None:
                behind, upstream = await asyncio.open_connection("127.0.0.1", self._port)
                self._open.append(upstream)
                pump = asyncio.create_task(_pump(behind, writer))
            while data := await reader.read(65536):
                if self.reply is not None:
                    writer.write(self.reply * max(1, data.count(b"*")))
                elif upstream is not None:
                    upstream.write(data)
            if upstream is not None:
                pump.cancel()
        except OSError:
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    def switch(self, reply: bytes | None) -> None:
        """Answer ``reply`` from now on (None: pass on to the Redis behind), on connections
        made from now on."""
        self.reply = reply
        for writer in self._open:
            writer.close()
        self._open.clear()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)


@asynccontextmanager
async def garbling(port: int | None, reply: bytes | None) -> AsyncIterator[tuple[str, Garbling]]:
    proxy = Garbling(port, reply)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0", proxy
    finally:
        proxy.switch(None)
        server.close()


@asynccontextmanager
async def stack(tmp: Path, redis_url: str, **overrides: Any) -> AsyncIterator[tuple[str, Services]]:
    """A gateway sharing state through ``redis_url``, in front of simulators: a speculative
    one and a standard pool of two (so that the prefix map has a choice to make)."""

    def sim(mode: Mode) -> Any:
        return sim_app(SimConfig(mode=mode, zero_latency=True))

    async with (
        serving(sim(Mode.SPECULATIVE)) as spec,
        serving(sim(Mode.STANDARD)) as a,
        serving(sim(Mode.STANDARD)) as b,
    ):
        text = policy_yaml([spec], [a, b], model=MODEL)
        cfg = settings(
            tmp, text, redis_url=redis_url, namespace="ns", admin_token=TOKEN, **overrides
        )
        async with gateway(cfg) as running:
            yield running


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


@pytest.mark.parametrize("reply", list(GARBAGE.values()), ids=list(GARBAGE))
async def test_a_redis_answering_garbage_fails_no_request(tmp_path, reply):
    async with (
        garbling(None, reply) as (url, _),
        stack(tmp_path, url, sync_interval_s=0.2) as (gw, _),
        httpx.AsyncClient(timeout=30) as c,
    ):
        answers = []
        first = await c.post(gw + "/v1/responses", json=RESPONSES)
        answers.append(first)
        stored = first.json()["id"]
        for stream in (False, True):
            answers.append(
                await c.post(gw + "/v1/chat/completions", json=CHAT | {"stream": stream})
            )
            follow = RESPONSES | {"stream": stream, "previous_response_id": stored}
            answers.append(await c.post(gw + "/v1/responses", json=follow))
        answers.append(await c.get(gw + f"/v1/responses/{stored}"))
        await asyncio.sleep(0.5)  # sync rounds meet the garbage
        answers.append(await c.get(gw + "/admin/guardrail", headers=AUTH))
        answers.append(await c.get(gw + "/admin/audit", headers=AUTH))
        ready = (await c.get(gw + "/readyz")).json()
    assert [a.status_code for a in answers] == [200] * len(answers), answers[-1].text
    assert ready["ready"] is True and ready["state"]["degraded"] is True


async def test_background_work_outlives_a_redis_that_answered_garbage(tmp_path):
    """A malformed reply meets the pub/sub listener and the pin writer; once Redis answers
    again the listener is subscribed and a relayed response's pin is written."""
    with private_redis() as server:
        async with (
            garbling(server.port, None) as (url, proxy),
            stack(tmp_path, url, sync_interval_s=0.2) as (gw, _),
            httpx.AsyncClient(timeout=30) as c,
        ):
            direct = aioredis.from_url(server.url)

            async def listening() -> bool:
                subscribed = await direct.pubsub_numsub("ns:changes")
                return bool(subscribed and subscribed[0][1] == 1)

            assert await until(listening, 5)
            proxy.switch(GARBAGE["a malformed length"])
            for _ in range(3):
                assert (await c.post(gw + "/v1/responses", json=RESPONSES)).status_code == 200
                await asyncio.sleep(0.3)
            proxy.switch(None)
            assert await until(listening, 5)
            later = (await c.post(gw + "/v1/responses", json=RESPONSES)).json()["id"]

            async def pinned() -> bool:
                return bool(await direct.exists(f"ns:pin:{{anonymous}}:{later}"))

            pin_written = await until(pinned, 5)
            await direct.aclose()
    assert pin_written


async def test_a_drained_read_waits_out_a_redis_failure(tmp_path):
    """An endpoint whose counters vanish on read (TensorRT-LLM's ``/metrics``), read while
    Redis fails: its totals go on from what Redis last gave, and Redis gets what that read
    took once it answers again, so no iteration is lost."""
    with private_redis() as server:
        async with (
            garbling(server.port, None) as (url, proxy),
            stack(tmp_path, url) as (_, services),
        ):
            drained = services.state.drained
            before = await drained("e", {"iterations": 10.0, "drafts": 4.0}, 1, 10)
            proxy.switch(GARBAGE["a malformed length"])
            during = await drained("e", {"iterations": 5.0, "drafts": 2.0}, 11, 15)
            proxy.switch(None)
            after = await drained("e", {"iterations": 5.0, "drafts": 1.0}, 16, 20)
    assert before["iterations"] == 10.0
    assert (during["iterations"], during["drafts"], during["last"]) == (15.0, 6.0, 15.0)
    assert (after["iterations"], after["drafts"], after["lost"]) == (20.0, 7.0, 0.0)
