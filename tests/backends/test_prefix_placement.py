"""Placement inside a pool by prompt prefix: the endpoint that holds the conversation, under
the load bound; new conversations spread by rendezvous hashing; failover, ejection and
slow start unchanged. The pure choice by table, then the real pool against real
simulators."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson
import pytest

from backends.placement import Affinity, Costs, Placed, place
from backends.pool import Pools, PoolSpec
from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app
from backends.upstream import Upstream
from tests.servers import serving

CONFIG = SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.01)
JSON = {"content-type": "application/json"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Busy:
    url: str
    outstanding: int = 0
    prefilling: int = 0


HOLDS_B = frozenset({"b"})


def full(endpoint: Busy) -> float:
    return 1.0


def urls(endpoints: list[Busy]) -> list[str]:
    return [e.url for e in endpoints]


def test_the_endpoint_that_holds_the_conversation_comes_first():
    serving = [Busy("a"), Busy("b"), Busy("c")]
    held = {"b": 40, "c": 12}
    order, how = place(serving, Affinity(7, held, frozenset({"b", "c"})), full)
    assert urls(order) == ["b", "a", "c"] and how is Placed.CACHE


def test_holding_a_prompt_that_others_share_is_no_reason_to_go_there():
    serving = [Busy("a"), Busy("b"), Busy("c")]
    order, how = place(serving, Affinity(7, {"b": 10}), full)  # b holds the system prompt
    assert how is Placed.SPREAD
    assert urls(order)[0] == urls(place(serving, Affinity(7), full)[0])[0]


@pytest.mark.parametrize(
    ("loads", "first", "how"),
    [
        ((0, 0, 0), "b", Placed.CACHE),
        ((0, 1, 0), "b", Placed.CACHE),  # one in flight on an idle pool is no overload
        ((2, 2, 2), "b", Placed.CACHE),  # 3 <= ceil(1.25 * 7 / 3) = 3
        ((1, 3, 1), None, Placed.BOUND),  # 4 > ceil(1.25 * 6 / 3) = 3
        ((0, 4, 0), None, Placed.BOUND),
    ],
)
def test_no_endpoint_goes_past_the_bound(loads, first, how):
    serving = [Busy(url, load) for url, load in zip("abc", loads, strict=True)]
    order, placed = place(serving, Affinity(7, {"b": 40}, HOLDS_B), full)
    assert placed is how
    if first is not None:
        assert order[0].url == first
    else:
        assert order[0].url != "b"
        total = sum(loads) + 1
        assert order[0].outstanding + 1 <= max(1.25 * total / 3 + 1, 2)


def test_a_bigger_epsilon_keeps_more_load_on_the_holder():
    serving = [Busy("a", 1), Busy("b", 3), Busy("c", 1)]
    assert place(serving, Affinity(7, {"b": 40}, HOLDS_B, epsilon=1.0), full)[1] is Placed.CACHE


def test_an_endpoint_in_slow_start_takes_a_share_of_what_it_could():
    serving = [Busy("a", 1), Busy("b", 1), Busy("c", 1)]
    ramping = {"a": 1.0, "b": 0.5, "c": 1.0}  # 2 > 0.5 * max(ceil(1.25 * 4 / 3), 2)
    order, how = place(serving, Affinity(7, {"b": 40}, HOLDS_B), lambda e: ramping[e.url])
    assert how is Placed.BOUND and order[0].url != "b"


def line(per_seq_s: float) -> Costs:
    """A pool whose decode step is 25 ms plus ``per_seq_s`` a sequence, prefilling a prompt
    token in 20 us, and a request of 100 steps."""
    return Costs(prefill_s=2e-5, step_s=lambda n: 0.025 + per_seq_s * n, steps=100.0)


def priced(held_blocks: int, costs: Costs, epsilon: float = 0.25) -> Affinity:
    """b holds ``held_blocks`` blocks of 64 tokens; a holds 8 (the shared system prompt)."""
    held = {"a": 8, "b": held_blocks}
    return Affinity(7, held, HOLDS_B, epsilon, block_tokens=64.0, costs={"std": costs})


@pytest.mark.parametrize(
    ("loads", "blocks", "per_seq_s", "how"),
    [
        # 2 more sequences beside it add 100 x 2 x 1 ms = 0.2 s; re-prefilling 492 blocks
        # (31,488 tokens) costs 0.63 s: it stays where its cache is, past the bound
        ((1, 3, 1), 500, 0.001, Placed.LOADED),
        # a short conversation (92 blocks, 5,888 tokens: 0.12 s) is not worth the wait
        ((1, 3, 1), 100, 0.001, Placed.BOUND),
        # nor is a long one on a pool whose every sequence slows each step by 5 ms (1 s)
        ((1, 3, 1), 500, 0.005, Placed.BOUND),
        # a busy endpoint: 9 more sequences, 0.9 s
        ((1, 10, 1), 500, 0.001, Placed.BOUND),
    ],
)
def test_past_the_bound_the_holder_keeps_it_when_waiting_costs_less_than_re_prefilling(
    loads, blocks, per_seq_s, how
):
    serving = [Busy(url, load) for url, load in zip("abc", loads, strict=True)]
    order, placed = place(serving, priced(blocks, line(per_seq_s)), full, "std")
    assert placed is how
    assert (order[0].url == "b") is (how is Placed.LOADED)


def test_prefills_queued_on_the_holder_count_against_it():
    # as the first case above (0.2 s of slower steps against 0.63 s of re-prefill), but b
    # has 25,000 prompt tokens queued ahead of the request (0.5 s) and a none
    serving = [Busy("a", 1), Busy("b", 3, prefilling=25_000), Busy("c", 1)]
    order, how = place(serving, priced(500, line(0.001)), full, "std")
    assert how is Placed.BOUND and order[0].url != "b"
    serving[0].prefilling = serving[2].prefilling = 20_000  # the others are as busy
    assert place(serving, priced(500, line(0.001)), full, "std")[1] is Placed.LOADED


def test_without_prices_for_its_pool_the_bound_holds():
    serving = [Busy("a", 1), Busy("b", 3), Busy("c", 1)]
    assert place(serving, priced(500, line(0.001)), full, "other")[1] is Placed.BOUND
    assert place(serving, priced(500, line(0.001)), full)[1] is Placed.BOUND


def test_an_endpoint_in_slow_start_is_never_kept_past_its_bound():
    serving = [Busy("a", 1), Busy("b", 1), Busy("c", 1)]
    ramping = {"a": 1.0, "b": 0.5, "c": 1.0}
    order, how = place(serving, priced(500, line(0.001)), lambda e: ramping[e.url], "std")
    assert how is Placed.BOUND and order[0].url != "b"


def test_a_new_conversation_still_spreads_within_the_bound():
    serving = [Busy("a", 1), Busy("b", 9), Busy("c", 1)]
    new = Affinity(7, {"b": 8}, frozenset(), block_tokens=64.0, costs={"std": line(0.001)})
    order, how = place(serving, new, full, "std")
    assert how is Placed.SPREAD and order[0].url != "b"


def test_new_conversations_spread_and_each_lands_in_one_place():
    serving = [Busy("http://a:1"), Busy("http://b:1"), Busy("http://c:1")]
    firsts = [place(serving, Affinity(key), full)[0][0].url for key in range(3000)]
    counts = {url: firsts.count(url) for url in urls(serving)}
    assert all(800 < n < 1200 for n in counts.values()), counts
    again = [place(list(reversed(serving)), Affinity(key), full)[0][0].url for key in range(3000)]
    assert again == firsts  # the same winner whatever order the endpoints come in


def test_a_gone_endpoint_moves_only_its_own_conversations():
    three = [Busy("http://a:1"), Busy("http://b:1"), Busy("http://c:1")]
    two = three[:2]
    for key in range(500):
        before = place(three, Affinity(key), full)[0][0].url
        after = place(two, Affinity(key), full)[0][0].url
        assert before == after or before == "http://c:1"


def body(prompt: str, stream: bool = False) -> bytes:
    said = [{"role": "user", "content": prompt}]
    return orjson.dumps(CHAT | {"messages": said, "stream": stream})


@pytest.mark.anyio
async def test_the_pool_sends_the_conversation_where_it_is_held_until_that_is_past_the_bound():
    upstream = Upstream()
    await upstream.start()
    try:
        async with (
            serving(create_app(CONFIG)) as a,
            serving(create_app(CONFIG)) as b,
            serving(create_app(CONFIG)) as c,
        ):
            pools = Pools([PoolSpec("std", "tiny", (a, b, c))], upstream, lambda: 0.0)
            held = Affinity(5, {b: 30}, frozenset({b}))
            for _ in range(4):
                done = await pools.complete(
                    ["std"], "/v1/chat/completions", body("x"), JSON, affinity=held
                )
                assert done.endpoint.url == b and done.placed is Placed.CACHE
            # four streams held open on b: 5 > max(ceil(1.25 * 5 / 3), 2), past the bound
            opened = [
                await pools.open(["std"], "/v1/chat/completions", body("y", True), JSON, pinned=b)
                for _ in range(4)
            ]
            spilled = await pools.complete(
                ["std"], "/v1/chat/completions", body("x"), JSON, affinity=held
            )
            assert spilled.endpoint.url != b and spilled.placed is Placed.BOUND
            for stream in opened:
                stream.close()
            back = await pools.complete(
                ["std"], "/v1/chat/completions", body("x"), JSON, affinity=held
            )
            assert back.endpoint.url == b
    finally:
        await upstream.close()


@pytest.mark.anyio
async def test_a_holder_that_is_down_fails_over_and_is_ejected_like_any_other(closed_port):
    upstream = Upstream()
    await upstream.start()
    dead = f"http://127.0.0.1:{closed_port()}"
    try:
        async with serving(create_app(CONFIG)) as a:
            pools = Pools([PoolSpec("std", "tiny", (a, dead))], upstream, lambda: 0.0)
            held = Affinity(5, {dead: 30}, frozenset({dead}))
            for _ in range(6):
                done = await pools.complete(
                    ["std"], "/v1/chat/completions", body("x"), JSON, affinity=held
                )
                assert done.endpoint.url == a
            assert [e.url for e in pools.ejected("std")] == [dead]
            done = await pools.complete(
                ["std"], "/v1/chat/completions", body("x"), JSON, affinity=held
            )
            assert done.endpoint.url == a and done.attempts == ()
            assert done.placed is Placed.SPREAD  # its holder is out of service
    finally:
        await upstream.close()


@pytest.mark.anyio
async def test_a_try_counts_its_uncached_prompt_as_queued_until_its_first_event():
    upstream = Upstream()
    await upstream.start()
    try:
        async with serving(create_app(CONFIG)) as a, serving(create_app(CONFIG)) as b:
            pools = Pools([PoolSpec("std", "tiny", (a, b))], upstream, lambda: 0.0)
            held = Affinity(5, {b: 30}, frozenset({b}), block_tokens=64.0, tokens=3_000)
            (endpoint,) = [e for e in pools.endpoints["std"] if e.url == b]
            whole = asyncio.create_task(
                pools.complete(["std"], "/v1/chat/completions", body("x"), JSON, affinity=held)
            )
            while endpoint.outstanding == 0:
                await asyncio.sleep(0.001)
            assert endpoint.prefilling == 3_000 - 30 * 64  # what b does not hold, until done
            await whole
            assert endpoint.prefilling == 0
            opened = await pools.open(
                ["std"], "/v1/chat/completions", body("x", True), JSON, affinity=held
            )
            assert opened.endpoint is endpoint and endpoint.outstanding == 1
            assert endpoint.prefilling == 0  # its first event came: prefilled
            opened.close()
    finally:
        await upstream.close()
