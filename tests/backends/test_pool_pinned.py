"""``pinned=``: a request pinned to one endpoint of a pool goes there alone, whatever the pool's
load would choose, streamed, whole or passed through; against real simulators."""

from __future__ import annotations

import orjson
import pytest

from backends.errors import BackendError
from backends.pool import Pools, PoolSpec
from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app
from backends.upstream import Upstream
from tests.servers import serving

pytestmark = pytest.mark.anyio

CONFIG = SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.01)
CHAT = orjson.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
)
JSON = {"content-type": "application/json"}


async def test_pinned_requests_go_to_their_endpoint_alone():
    upstream = Upstream()
    await upstream.start()
    try:
        async with serving(create_app(CONFIG)) as a, serving(create_app(CONFIG)) as b:
            pools = Pools([PoolSpec("std", "tiny", (a, b))], upstream, lambda: 0.0)
            at = b + "/"
            assert pools.endpoint(at) is not None and pools.endpoint("http://127.0.0.1:9") is None
            for _ in range(3):
                whole = await pools.complete(["std"], "/v1/chat/completions", CHAT, JSON, pinned=at)
                assert whole.endpoint.url == b
                streamed = orjson.dumps(orjson.loads(CHAT) | {"stream": True})
                opened = await pools.open(
                    ["std"], "/v1/chat/completions", streamed, JSON, pinned=at
                )
                assert opened.endpoint.url == b
                opened.close()
                done = await pools.exchange(["std"], "GET", "/v1/models/tiny", b"", {}, pinned=at)
                assert done.endpoint.url == b and done.reply.status == 200
    finally:
        await upstream.close()


async def test_a_pinned_endpoint_that_is_down_is_not_replaced(closed_port):
    upstream = Upstream()
    await upstream.start()
    dead = f"http://127.0.0.1:{closed_port()}"
    try:
        async with serving(create_app(CONFIG)) as a:
            pools = Pools([PoolSpec("std", "tiny", (a, dead))], upstream, lambda: 0.0)
            at = dead
            with pytest.raises(BackendError):
                await pools.exchange(["std"], "GET", "/v1/models/tiny", b"", {}, pinned=at)
            served = await pools.exchange(["std"], "GET", "/v1/models/tiny", b"", {})
            assert served.endpoint.url == a
    finally:
        await upstream.close()
