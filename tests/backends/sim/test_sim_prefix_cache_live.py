"""A real simulator server with its prefix cache, through the real openai and anthropic
clients: conversations hit the cache from their second turn, usage and /metrics say so, and
memory pressure makes requests wait and be preempted."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from backends.sim.config import SimConfig

pytestmark = pytest.mark.anyio

Server = Callable[[SimConfig], contextlib.AbstractAsyncContextManager[str]]
SYSTEM = "You are a careful assistant who explains how an inference engine caches. " * 30
CACHING = SimConfig(
    served_model_names=("tiny",), time_scale=0.01, seed=5, enable_prompt_tokens_details=True
)


def metric(page: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", page, re.MULTILINE)
    assert found is not None, name
    return float(found.group(1))


async def scrape(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/metrics")).text


@contextlib.asynccontextmanager
async def openai_client(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    try:
        yield api
    finally:
        await api.close()


async def test_chat_turns_hit_the_cache_and_metrics_move(sim_server: Server) -> None:
    async with sim_server(CACHING) as url, openai_client(url) as api:
        messages: list[Any] = [{"role": "system", "content": SYSTEM}]
        cached: list[int] = []
        prompts: list[int] = []
        for turn in range(4):
            messages.append({"role": "user", "content": f"question {turn}: and then?"})
            answer = await api.chat.completions.create(
                model="tiny", messages=messages, max_tokens=40, temperature=0
            )
            assert answer.usage is not None
            details = answer.usage.prompt_tokens_details
            cached.append((details.cached_tokens or 0) if details is not None else 0)
            prompts.append(answer.usage.prompt_tokens)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        page = await scrape(url)
    assert cached[0] == 0
    assert all(c > 0 and c % 16 == 0 for c in cached[1:])
    # each turn finds at least the whole previous prompt
    assert all(cached[i] >= prompts[i - 1] - 16 for i in range(1, 4))
    assert metric(page, "vllm:prefix_cache_hits_total") == sum(cached)
    assert metric(page, "vllm:prefix_cache_queries_total") == sum(prompts)
    assert metric(page, "vllm:prompt_tokens_cached_total") == sum(cached)
    assert 'source="local_cache_hit"} ' + f"{float(sum(cached))}" in page
    assert metric(page, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(page, "vllm:num_preemptions_total") == 0.0


async def test_streamed_completions_report_cached_tokens(sim_server: Server) -> None:
    async with sim_server(CACHING) as url, openai_client(url) as api:
        seen: list[int] = []
        for extra in ("", " And one more line."):
            chunks = await api.completions.create(
                model="tiny",
                prompt=SYSTEM + extra,
                max_tokens=10,
                stream=True,
                stream_options={"include_usage": True},
            )
            usage = [c.usage async for c in chunks if c.usage is not None][-1]
            details = usage.prompt_tokens_details
            seen.append((details.cached_tokens or 0) if details is not None else 0)
    assert seen[0] == 0 and seen[1] > 0


async def test_messages_conversation_reads_the_cache(sim_server: Server) -> None:
    async with (
        sim_server(CACHING) as url,
        anthropic.AsyncAnthropic(base_url=url, api_key="none", max_retries=0) as claude,
    ):
        messages: list[Any] = []
        read = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"step {turn}"})
            if turn == 2:  # streamed, as Claude Code sends it
                async with claude.messages.stream(
                    model="tiny", system=SYSTEM, messages=messages, max_tokens=30
                ) as stream:
                    final = await stream.get_final_message()
                usage, content = final.usage, [b.model_dump() for b in final.content]
            else:
                whole = await claude.messages.create(
                    model="tiny", system=SYSTEM, messages=messages, max_tokens=30
                )
                usage, content = whole.usage, [b.model_dump() for b in whole.content]
            read.append(usage.cache_read_input_tokens or 0)
            messages.append({"role": "assistant", "content": content})
    assert read[0] == 0 and read[1] > 0 and read[2] > read[1]


async def test_responses_report_cached_tokens_by_default(sim_server: Server) -> None:
    plain = SimConfig(served_model_names=("tiny",), time_scale=0.01, seed=5)
    async with sim_server(plain) as url, openai_client(url) as api:
        first = await api.responses.create(
            model="tiny", instructions=SYSTEM, input="hello", max_output_tokens=20
        )
        follow = await api.responses.create(
            model="tiny", input="more", previous_response_id=first.id, max_output_tokens=20
        )
        chat = await api.chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}],
            max_tokens=5,
        )
    assert first.usage is not None and follow.usage is not None
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert follow.usage.input_tokens_details.cached_tokens > 0
    # without --enable-prompt-tokens-details chat reports no details, as vLLM
    assert chat.usage is not None and chat.usage.prompt_tokens_details is None


async def test_short_kv_memory_makes_requests_wait_and_preempts(sim_server: Server) -> None:
    tight = SimConfig(
        served_model_names=("tiny",),
        time_scale=0.01,
        seed=5,
        max_model_len=1024,
        kv_cache_tokens=2048,
        draft_kv_share=0.0,
    )
    async with sim_server(tight) as url, openai_client(url) as api:

        async def one(i: int) -> None:
            await api.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"{i} " + SYSTEM[:1800]}],
                max_tokens=200,
                temperature=0,
            )

        calls = [asyncio.create_task(one(i)) for i in range(8)]
        waiting = 0.0
        while not all(c.done() for c in calls):
            waiting = max(waiting, metric(await scrape(url), "vllm:num_requests_waiting"))
            await asyncio.sleep(0.005)
        await asyncio.gather(*calls)
        page = await scrape(url)
        async with httpx.AsyncClient() as c:
            kv = (await c.get(f"{url}/sim/state")).json()["kv"]
    assert waiting > 0
    assert metric(page, "vllm:num_preemptions_total") == kv["preemptions"] > 0
    assert metric(page, "vllm:kv_cache_usage_perc") == 0.0
    assert kv["blocks"] == 2048 // 16 and kv["used_blocks"] == 0
