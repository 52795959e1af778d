"""Conversations keep their endpoint: through speclane in front of a pool of two real
standard simulators (and a speculative one), a 10-turn conversation stays on one endpoint, over chat
with the ``openai`` client and over Messages with the ``anthropic`` client as Claude Code
sends it (its billing line changing every turn); a turn goes elsewhere when its endpoint
is loaded past the bound; and two gateways sharing Redis keep a conversation where either
of them last sent it; and the prefix cache's hit ratio, read from the answers' usage, shows
per pool and endpoint."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from tests.gateways import gateway, policy_yaml, settings
from tests.redis_server import namespace, require_shared_redis
from tests.servers import serving

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
SYSTEM = "You are a careful coding agent. Read the files before you change them. " * 30
SCALE = 0.02
START_STANDARD = """
rules:
  - name: default
    start: standard
"""


class Sims:
    """A standard pool of two simulators, where requests start (a bottom rung: the
    guardrail never moves it), and a speculative one above it."""

    def __init__(self, std: list[str], spec: str) -> None:
        self.std, self.spec = std, spec

    def policy(self) -> str:
        return policy_yaml([self.spec], self.std, model=MODEL, rules=START_STANDARD)


@asynccontextmanager
async def sims() -> AsyncIterator[Sims]:
    def std(seed: int) -> SimConfig:
        return SimConfig(mode=Mode.STANDARD, time_scale=SCALE, seed=seed)

    async with (
        serving(sim_app(std(1))) as a,
        serving(sim_app(std(2))) as b,
        serving(sim_app(SimConfig(time_scale=SCALE))) as c,
    ):
        yield Sims([a, b], c)


async def prompt_tokens(c: httpx.AsyncClient, urls: list[str]) -> dict[str, float]:
    """Each simulator's ``vllm:prompt_tokens_total``."""
    out = {}
    for url in urls:
        text = (await c.get(url + "/metrics")).text
        line = next(x for x in text.splitlines() if x.startswith("vllm:prompt_tokens_total"))
        out[url] = float(line.split()[-1])
    return out


class Watch:
    """Which endpoint of the pool served each request, from the simulators' own counters."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.client = httpx.AsyncClient()
        self.before: dict[str, float] = {}

    async def mark(self) -> None:
        self.before = await prompt_tokens(self.client, self.urls)

    async def served(self) -> str:
        after = await prompt_tokens(self.client, self.urls)
        grown = [u for u in self.urls if after[u] > self.before[u]]
        assert len(grown) == 1, (self.before, after)
        [grew] = grown
        self.before = after
        return grew


def billing() -> str:
    cch = "".join(random.choices("0123456789abcdef", k=5))
    return f"x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli; cch={cch};"


async def test_a_chat_conversation_stays_on_one_endpoint(tmp_path: Path):
    async with sims() as pool, gateway(settings(tmp_path, pool.policy())) as (url, services):
        watch = Watch(pool.std)
        said: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        where = []
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as c:
            for turn in range(10):
                said.append({"role": "user", "content": f"Step {turn}: open file {turn}.py"})
                await watch.mark()
                answer = await c.chat.completions.create(
                    model=MODEL,
                    messages=said,
                    max_tokens=24,  # type: ignore[arg-type]
                )
                where.append(await watch.served())
                said.append({"role": "assistant", "content": answer.choices[0].message.content})
        await watch.client.aclose()
    assert len(set(where)) == 1, where


async def test_a_claude_code_conversation_stays_on_one_endpoint(tmp_path: Path):
    async with sims() as pool, gateway(settings(tmp_path, pool.policy())) as (url, _):
        watch = Watch(pool.std)
        said: list[dict[str, Any]] = []
        where = []
        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as c:
            for turn in range(10):
                said.append({"role": "user", "content": [{"type": "text", "text": f"Step {turn}"}]})
                system = [
                    {"type": "text", "text": billing()},
                    {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
                ]
                await watch.mark()
                async with c.messages.stream(
                    model=MODEL,
                    max_tokens=24,
                    system=system,  # type: ignore[arg-type]
                    messages=said,  # type: ignore[arg-type]
                ) as stream:
                    message = await stream.get_final_message()
                where.append(await watch.served())
                text = "".join(b.text for b in message.content if b.type == "text")
                said.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        await watch.client.aclose()
    assert len(set(where)) == 1, where


def chat(said: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": said, "max_tokens": 24, **extra}


async def turn(c: httpx.AsyncClient, url: str, said: list[dict[str, Any]], n: int) -> None:
    said.append({"role": "user", "content": f"Step {n}: open file {n}.py"})
    answer = await c.post(url + "/v1/chat/completions", json=chat(said))
    assert answer.status_code == 200, answer.text
    said.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})


@asynccontextmanager
async def load(
    c: httpx.AsyncClient, url: str, said: list[dict[str, Any]], n: int
) -> AsyncIterator[None]:
    """``n`` long streams of the conversation held open (their answers left unread)."""
    async with AsyncExitStack() as stack:
        for i in range(n):
            body = chat(
                [*said, {"role": "user", "content": f"long {i}"}], max_tokens=6000, stream=True
            )
            response = await stack.enter_async_context(
                c.stream("POST", url + "/v1/chat/completions", json=body)
            )
            assert response.status_code == 200
        yield


async def test_a_turn_goes_elsewhere_while_its_endpoint_is_past_the_bound(tmp_path: Path):
    async with sims() as pool, gateway(settings(tmp_path, pool.policy())) as (url, services):
        watch = Watch(pool.std)
        said: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        async with httpx.AsyncClient(timeout=30) as c:
            await watch.mark()
            await turn(c, url, said, 0)
            home = await watch.served()
            async with load(
                c, url, said, 2
            ):  # home holds 2: a third is past max(ceil(1.25 * 3 / 2), 2)
                loaded = {e.url: e.outstanding for e in services.pools.endpoints["standard"]}
                assert loaded[home] == 2, loaded
                await watch.mark()
                fork = [*said, {"role": "user", "content": "a second conversation from here"}]
                answer = await c.post(url + "/v1/chat/completions", json=chat(fork))
                assert answer.status_code == 200
                assert await watch.served() != home
        await watch.client.aclose()


@pytest.mark.redis
async def test_two_gateways_sharing_redis_keep_a_conversation_where_it_last_went(tmp_path: Path):
    redis_url, ns = require_shared_redis(), namespace()
    shared = {"redis_url": redis_url, "namespace": ns}
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    async with (
        sims() as pool,
        gateway(settings(tmp_path / "one", pool.policy(), **shared)) as (one, _),
        gateway(settings(tmp_path / "two", pool.policy(), **shared)) as (two, _),
    ):
        watch = Watch(pool.std)
        said: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        async with httpx.AsyncClient(timeout=30) as c:
            await watch.mark()
            await turn(c, one, said, 0)
            home = await watch.served()
            async with load(c, one, said, 2):  # replica one alone sees this load
                await watch.mark()
                await turn(c, one, said, 1)
                moved = await watch.served()
            assert moved != home
            where = []
            for n in range(2, 10):  # the other replica follows where the conversation went
                await asyncio.sleep(0.05)  # the shared map's writes are scheduled, not awaited
                await watch.mark()
                await turn(c, two if n % 2 == 0 else one, said, n)
                where.append(await watch.served())
        await watch.client.aclose()
    raw = aioredis.from_url(redis_url)
    for key in await raw.keys(f"{ns}:*"):
        await raw.delete(key)
    await raw.aclose()
    assert where == [moved] * 8


def caching_upstream() -> Starlette:
    """An engine that answers every Messages request whole, 300 of its 400 prompt tokens
    from its cache (as vLLM reports with --enable-prompt-tokens-details)."""

    async def messages(request: Request) -> JSONResponse:
        usage = {"input_tokens": 400, "output_tokens": 3, "cache_read_input_tokens": 300}
        return JSONResponse(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": usage,
            }
        )

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


async def test_the_cache_hit_ratio_shows_per_pool_and_endpoint(tmp_path: Path):
    token = {"authorization": "Bearer admin"}
    async with (
        serving(caching_upstream()) as a,
        serving(caching_upstream()) as b,
        gateway(
            settings(
                tmp_path,
                policy_yaml([a], [b], model=MODEL, rules=START_STANDARD),
                admin_token="admin",
            )
        ) as (url, _),
        anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client,
        httpx.AsyncClient() as c,
    ):
        for _ in range(3):
            await client.messages.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": SYSTEM}]
            )
        stats = (await c.get(url + "/admin/stats", headers=token)).json()["pools"]
        pools = (await c.get(url + "/admin/pools", headers=token)).json()["pools"]
        metrics = (await c.get(url + "/metrics")).text
    cache = stats["standard"]["prefix_cache"]
    assert (cache["requests"], cache["prompt_tokens"], cache["cached_tokens"]) == (3, 1200, 900)
    assert cache["hit_ratio"] == 0.75 and cache["endpoints"][b]["hit_ratio"] == 0.75
    assert pools["standard"]["prefix_cache_hit_ratio"] == 0.75
    assert pools["standard"]["endpoints"][0]["prefix_cache_hit_ratio"] == 0.75
    assert f'speclane_cached_prompt_tokens_total{{endpoint="{b}",pool="standard"}} 900.0' in metrics
    # the map believed the second and third prompts held whole; the engine held 300 of 400
    kept = cache["endpoints"][b]
    assert kept["kept_answers"] == 2 and 0.5 < kept["kept"] < 1.0
    assert pools["standard"]["endpoints"][0]["prefix_cache_kept"] == kept["kept"]
    gauge = f'speclane_endpoint_cache_kept_ratio{{endpoint="{b}",pool="standard"}}'
    assert f"{gauge} {kept['kept']}" in metrics


async def test_a_conversation_cached_on_the_old_rung_stays_there_when_moving_costs_more(
    tmp_path: Path,
):
    """The rung changes (a reload starts the rule on standard): a new conversation follows
    it at once; one cached on spec, with a long context and few short turns left as the
    slice's conversations go, is kept there, and its reason says the figures."""
    spec_first = policy_yaml(
        ["{spec}"],
        ["{std}"],
        model=MODEL,
        extra="guardrail: {mode: threshold, min_acceptance: 0, recover_above: 0}",
    )
    context = SYSTEM * 30  # ~14k tokens, where a few turns of 24 tokens save little
    async with sims() as pool:
        text = spec_first.replace("{spec}", pool.spec).replace("{std}", pool.std[0])
        async with (
            gateway(settings(tmp_path, text)) as (url, services),
            httpx.AsyncClient(timeout=30) as c,
        ):
            for n in range(6):  # the slice's conversations run to 4 turns
                said = [{"role": "system", "content": f"{n} {context}"}]
                for t in range(4):
                    await turn(c, url, said, t)
            cached = [{"role": "system", "content": f"late {context}"}]
            for t in range(3):
                await turn(c, url, cached, t)
            services.policy.path.write_text(text.replace("start: spec", "start: standard"))
            assert (await services.policy.reload()).changed
            fresh = await c.post(
                url + "/v1/chat/completions", json=chat([{"role": "user", "content": "new"}])
            )
            cached.append({"role": "user", "content": "Step 3"})
            kept = await c.post(url + "/v1/chat/completions", json=chat(cached))
            metrics = (await c.get(url + "/metrics")).text
    assert fresh.headers["x-speclane-pool"] == "standard"
    assert kept.headers["x-speclane-pool"] == "spec", kept.headers["x-speclane-reason"]
    reason = kept.headers["x-speclane-reason"]
    assert reason.startswith("kept on spec: moving would re-prefill "), reason
    assert (
        'speclane_conversation_moves_total{from_pool="spec",result="kept",to_pool="standard"} 1.0'
        in metrics
    )


async def test_the_mirrors_of_one_conversation_go_to_one_endpoint_of_the_shadow_pool(
    tmp_path: Path,
):
    """Every turn is mirrored to a speculative pool of two: each mirror finds the turns
    before it cached, where least-outstanding choice would alternate."""
    mirrored = """
rules:
  - name: default
    start: shadow
    shadow_fraction: 1.0
"""

    def spec(seed: int) -> SimConfig:
        return SimConfig(time_scale=SCALE, seed=seed)

    async with (
        serving(sim_app(spec(1))) as c1,
        serving(sim_app(spec(2))) as c2,
        serving(sim_app(SimConfig(mode=Mode.STANDARD, time_scale=SCALE))) as a,
    ):
        text = policy_yaml([c1, c2], [a], model=MODEL, rules=mirrored)
        async with gateway(settings(tmp_path, text)) as (url, services), httpx.AsyncClient() as c:
            said: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
            for t in range(6):
                await turn(c, url, said, t)
                while services.shadow.in_flight:  # one mirror at a time
                    await asyncio.sleep(0.01)
            counted = await prompt_tokens(c, [c1, c2])
    assert sorted(counted.values())[0] == 0.0, counted
