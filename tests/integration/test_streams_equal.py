"""A streamed answer through speclane is the pool's own stream, event by event (up to ``id``,
``created`` and nulls), whether or not the client asked for usage. speclane always asks the
pool for usage; vLLM then moves ``system_fingerprint`` from the last choice's chunk to the
usage chunk, so when speclane drops that chunk the fingerprint must go back where it was.
Also: the gateway's own error answers carry ``x-request-id`` like every other answer."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from backends.sim.config import SimConfig
from tests.gateways import sim_policy, sim_stack
from tests.integration.test_answers_equal import CHAT, COMPLETION, same

pytestmark = pytest.mark.anyio


async def events(c: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    out = []
    async with c.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else same(orjson.loads(data)))
    return out


def shape(stream: list[Any]) -> tuple[Any, ...]:
    """What a stream says, whatever its chunk edges: the text, each event's keys and the
    last choice chunk's fields besides the text, the usage chunk."""
    chunks = [e for e in stream if isinstance(e, dict)]
    text = "".join(
        c.get("delta", {}).get("content", "") or c.get("text", "")
        for e in chunks
        for c in e.get("choices", ())
    )
    last = [e for e in chunks if e.get("choices")][-1]
    ending = {k: v for k, v in last.items() if k != "choices"}
    choice = {k: v for k, v in last["choices"][0].items() if k not in ("delta", "text")}
    usage = [  # per-request metrics vary with the steps; their fields do not
        {k: sorted(v["speculative_decoding"]) if k == "metrics" else v for k, v in e.items()}
        for e in chunks
        if not e.get("choices")
    ]
    return text, sorted({tuple(sorted(e)) for e in chunks}), ending, choice, usage, stream[-1]


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("start", ["spec", "standard"])
async def test_streams_equal_the_pools_own(tmp_path, usage, start):
    policy = sim_policy(start=start)
    async with (
        sim_stack(tmp_path, policy, SimConfig(time_scale=0.01)) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        direct = (
            stack.spec if start == "spec" else stack.services.pools.endpoints["standard"][0].url
        )
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
            asked = {**body, "stream": True}
            if usage:
                asked["stream_options"] = {"include_usage": True}
            ours = await events(c, stack.url + path, asked)
            theirs = await events(c, direct + path, asked)
            if start == "standard":
                assert ours == theirs, path
            else:  # speculation: steps (so chunk edges) differ from one request to the next
                assert shape(ours) == shape(theirs), path
            last_choice = [e for e in ours if isinstance(e, dict) and e.get("choices")][-1]
            assert ("system_fingerprint" in last_choice) is not usage


async def test_the_gateways_own_errors_carry_the_request_id(tmp_path):
    async with (
        sim_stack(tmp_path, sim_policy(), SimConfig(time_scale=0.01)) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        unknown = await c.post(
            stack.url + "/v1/chat/completions",
            json={**CHAT, "model": "nope"},
            headers={"x-request-id": "req-42"},
        )
        invalid = await c.post(stack.url + "/v1/chat/completions", json={**CHAT, "n": "two"})
    assert unknown.status_code == 404 and unknown.headers["x-request-id"] == "req-42"
    assert invalid.status_code == 400 and len(invalid.headers["x-request-id"]) == 24
