"""``Pools.complete``, the one way to a whole answer, with either reader: a body read whole,
or a stream folded into one answer by the caller's ``Assemble``. Breaks are retried inside
the pools for both, on endpoints whose answers have not broken, within the break budget;
against real simulators."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import orjson
import pytest

from backends.errors import BreaksSpent, Unavailable
from backends.pool import Opened, Pools, PoolSpec
from backends.retries import BreakBudget
from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.server import create_app
from backends.upstream import DONE, Upstream
from tests.servers import serving

pytestmark = pytest.mark.anyio

ASK = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
WHOLE = orjson.dumps(ASK)
STREAMED = orjson.dumps(ASK | {"stream": True})
JSON = {"content-type": "application/json"}
PATH = "/v1/chat/completions"


def sim(seed: int, dies: bool) -> SimConfig:
    return SimConfig(
        mode=Mode.STANDARD,
        served_model_names=("tiny",),
        seed=seed,
        time_scale=0.01,
        faults=Faults(die_rate=1.0 if dies else 0.0, die_after_chunks=2),
    )


@asynccontextmanager
async def pools_of(*dies: bool) -> AsyncIterator[tuple[Pools, list[str]]]:
    """One pool of a simulator per entry, tried in that order (none has load yet); those
    marked ``True`` drop every answer part way. Yields the pools and the URLs."""
    upstream = Upstream()
    await upstream.start()
    try:
        async with AsyncExitStack() as servers:
            urls = [
                await servers.enter_async_context(serving(create_app(sim(seed, dying))))
                for seed, dying in enumerate(dies, start=1)
            ]
            yield Pools([PoolSpec("std", "tiny", tuple(urls))], upstream, lambda: 0.0), urls
    finally:
        await upstream.close()


async def assemble(opened: Opened) -> dict[str, Any]:
    """The smallest assembler: count the stream's events up to ``[DONE]``, and close it
    (a break raises ``StreamBroken`` from the stream)."""
    failed = True
    try:
        events = [opened.stream.first, *opened.stream.take_pending()]
        async for batch in opened.stream.batches():
            events += batch
        failed = False
        return {"events": sum(e != DONE for e in events)}
    finally:
        opened.close(failed=failed)


def load(pools: Pools) -> list[int]:
    return [e.outstanding for e in pools.endpoints["std"]]


@pytest.mark.parametrize("assembled", [False, True], ids=["body", "assembled"])
async def test_a_whole_answer_that_breaks_is_served_by_the_next_endpoint(assembled):
    async with pools_of(True, False) as (pools, (dying, healthy)):
        budget = BreakBudget(3, math.inf)
        done = await pools.complete(
            ["std"],
            PATH,
            STREAMED if assembled else WHOLE,
            JSON,
            budget=budget,
            assemble=assemble if assembled else None,
        )
        assert done.endpoint.url == healthy
        assert [a.url for a in done.attempts] == [dying]
        assert "broke" in done.attempts[0].error
        assert (budget.spent, budget.broke) == (1, [dying])
        if assembled:
            assert done.answer["events"] > 2 and orjson.loads(done.body) == done.answer
        else:
            assert done.answer["choices"][0]["message"]["content"]
        assert load(pools) == [0, 0]  # every try counted once, whichever reader
        assert [e.health.consecutive for e in pools.endpoints["std"]] == [1, 0]


@pytest.mark.parametrize("assembled", [False, True], ids=["body", "assembled"])
async def test_when_the_budget_runs_out_an_assembled_answer_says_how_often_it_broke(assembled):
    """Every answer breaks: one try and two retries. An assembled answer ends with
    ``BreaksSpent`` (the client's 502), a body with what every try failed with (503)."""
    async with pools_of(True, True) as (pools, _):
        budget = BreakBudget(2, math.inf)
        with pytest.raises((BreaksSpent, Unavailable)) as failed:
            await pools.complete(
                ["std"],
                PATH,
                STREAMED if assembled else WHOLE,
                JSON,
                budget=budget,
                assemble=assemble if assembled else None,
            )
        if assembled:
            assert isinstance(failed.value, BreaksSpent) and failed.value.times == 3
        else:
            assert isinstance(failed.value, Unavailable)
        assert budget.spent == 2 and budget.ran_out
        assert load(pools) == [0, 0]
