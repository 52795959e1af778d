"""Partial upstream failure through a real gateway in front of real simulators: independent
errors on every endpoint, a recovered pool hit by a burst, an endpoint that drops every
stream after its first event, and streams that break mid-answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.server import create_app as sim_app
from tests.gateways import gateway, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def sim(mode: Mode, seed: int, *, timed: bool = False, **faults: Any) -> SimConfig:
    """A simulator that answers at once, or (``timed``) one engine step at a time, fast."""
    return SimConfig(
        mode=mode, seed=seed, zero_latency=not timed, time_scale=0.02, faults=Faults(**faults)
    )


SHORT = "{connect_s: 1, first_byte_s: 2, idle_s: 2}"  # a hung endpoint is found fast
# an answer that breaks breaks after its second chunk; a try that merely waits on a loaded
# machine must not end as a timeout, which the break retries do not count
PATIENT = "{connect_s: 10, first_byte_s: 30, idle_s: 30}"


def policy(
    spec: Sequence[str],
    standard: Sequence[str],
    start: str,
    whole: bool = False,
    timeouts: str = SHORT,
) -> str:
    return f"""
version: 1
pools:
  spec:
    kind: speculative
    model: {MODEL}
    num_speculative_tokens: 4
    endpoints: [{", ".join(spec)}]
    timeouts: {timeouts}
  standard:
    kind: standard
    model: {MODEL}
    endpoints: [{", ".join(standard)}]
    timeouts: {timeouts}
    passthrough_non_streaming: {str(whole).lower()}  # false: stream and assemble
ladder: [spec, standard]
rules: [{{name: default, start: {start}}}]
"""


@asynccontextmanager
async def stack(
    tmp: Path,
    spec: Sequence[SimConfig],
    standard: Sequence[SimConfig],
    start: str = "spec",
    whole: bool = False,
    timeouts: str = SHORT,
    **overrides: Any,
) -> AsyncIterator[tuple[str, Any, list[str], list[str]]]:
    """A gateway in front of one simulator per config; yields its URL, its services and
    the simulators' URLs (speculative, standard). Rules start on ``start``: on ``standard``
    the guardrail never moves traffic, so every request meets the endpoints under test.
    ``whole``: the standard pool takes non-streaming requests non-streaming."""
    async with AsyncExitStack() as servers:
        spec_urls = [await servers.enter_async_context(serving(sim_app(c))) for c in spec]
        std_urls = [await servers.enter_async_context(serving(sim_app(c))) for c in standard]
        text = policy(spec_urls, std_urls, start, whole, timeouts)
        async with gateway(settings(tmp, text, **overrides)) as (url, services):
            yield url, services, spec_urls, std_urls


async def control(c: httpx.AsyncClient, url: str, faults: dict[str, Any]) -> None:
    response = await c.post(url + "/sim/control", json={"faults": faults})
    assert response.status_code == 200


async def run(
    c: httpx.AsyncClient, url: str, n: int, concurrency: int, **extra: Any
) -> list[httpx.Response]:
    """``n`` requests, ``concurrency`` at a time, each its own (as many clients' are: an
    error every endpoint gives the same body is that body's, not the endpoints')."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> httpx.Response:
        messages = [{"role": "user", "content": f"Say hello to {i}."}]
        async with gate:
            body = {**CHAT, "messages": messages, **extra}
            return await c.post(url + "/v1/chat/completions", json=body)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_independent_errors_on_every_endpoint_rarely_reach_the_client(tmp_path):
    """30% errors on each of three endpoints in two pools: a request fails only when every
    endpoint it may try fails (0.3^3 = 2.7%), not when breakers open."""
    spec = [sim(Mode.SPECULATIVE, 1, error_rate=0.3)]
    standard = [sim(Mode.STANDARD, 2, error_rate=0.3), sim(Mode.STANDARD, 3, error_rate=0.3)]
    async with stack(tmp_path, spec, standard) as (url, _, _, _), httpx.AsyncClient() as c:
        answers = await run(c, url, 600, 16)
    failed = [r for r in answers if r.status_code != 200]
    assert len(failed) <= 30, f"{len(failed)} of 600 failed"  # at most 5%
    assert {r.status_code for r in failed} <= {503}
    assert all(r.headers.get("retry-after") for r in failed)


async def test_a_burst_after_recovery_is_served(tmp_path):
    spec = [sim(Mode.SPECULATIVE, 1, error_rate=1.0)]
    standard = [sim(Mode.STANDARD, 2, error_rate=1.0)]
    async with (
        stack(tmp_path, spec, standard) as (url, services, spec_urls, std_urls),
        httpx.AsyncClient() as c,
    ):
        down = await run(c, url, 12, 1)
        assert not services.pools.healthy("spec") and not services.pools.healthy("standard")
        for sim_url in spec_urls + std_urls:
            await control(c, sim_url, {"error_rate": 0.0})
        burst = await run(c, url, 20, 20)
        after = await run(c, url, 20, 20)
    assert {r.status_code for r in down} == {503}
    retry = int(down[-1].headers["retry-after"])
    assert 1 <= retry <= 30
    assert [r.status_code for r in burst + after] == [200] * 40
    assert services.pools.healthy("spec")  # it served, so it is back (and ramping up)


async def test_an_endpoint_that_drops_every_stream_after_its_first_event_is_ejected(tmp_path):
    standard = [
        sim(Mode.STANDARD, 1, timed=True, die_rate=1.0, die_after_chunks=2),
        sim(Mode.STANDARD, 2),
    ]
    # the same request forty times: by its prompt it would go to one endpoint every time;
    # least-outstanding choice takes each endpoint in turn, the dying one included
    spread = {"prefix_affinity": False}
    async with (
        stack(tmp_path, [sim(Mode.SPECULATIVE, 3)], standard, "standard", **spread) as running,
        httpx.AsyncClient() as c,
    ):
        url, services, _, std_urls = running
        broken = 0
        for _ in range(40):
            r = await c.post(url + "/v1/chat/completions", json={**CHAT, "stream": True})
            broken += '"error"' in r.text.rsplit("data: ", 1)[-1]
        ready = (await c.get(url + "/readyz")).json()
    states = {e["url"]: e["health"] for e in ready["pools"]["standard"]["endpoints"]}
    assert states[std_urls[0]] == "ejected" and states[std_urls[1]] == "serving"
    assert broken == 5  # the failures in a row that ejected it, and no more
    assert services.pools.healthy("standard")


def dying(rate: float) -> tuple[list[SimConfig], list[SimConfig]]:
    """Every endpoint (one speculative, two standard) drops ``rate`` of its answers part way."""
    spec = [sim(Mode.SPECULATIVE, 3, timed=True, die_rate=rate, die_after_chunks=2)]
    standard = [
        sim(Mode.STANDARD, seed, timed=True, die_rate=rate, die_after_chunks=2) for seed in (1, 2)
    ]
    return spec, standard


def counted(metrics: str, result: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("speclane_failovers_total{") and f'result="{result}"' in line
    )


@pytest.mark.parametrize("whole", [False, True], ids=["assembled", "passed-through"])
async def test_non_streaming_answers_that_break_mid_way_are_retried_until_whole(tmp_path, whole):
    """20% of every endpoint's answers break part way: a non-streaming client never sees it.
    With one retry about 0.2 x 0.2 of 200 requests (8) would fail; the budget's retries go
    on across endpoints and rungs, so none does."""
    spec, standard = dying(0.2)
    async with (
        stack(tmp_path, spec, standard, "standard", whole, PATIENT, break_retries=10) as (url, *_),
        httpx.AsyncClient(timeout=30) as c,
    ):
        whole_answers = await run(c, url, 200, 8)
        metrics = (await c.get(url + "/metrics")).text
    assert [r.status_code for r in whole_answers] == [200] * 200
    assert all(r.json()["choices"][0]["message"]["content"] for r in whole_answers)
    retried = counted(metrics, "retried_after_break")
    assert 15 <= retried <= 90  # about 0.2 / 0.8 of 200 requests: each break retried once
    assert counted(metrics, "exhausted_after_break") == 0


@pytest.mark.parametrize("whole", [False, True], ids=["assembled", "passed-through"])
async def test_break_retries_stop_at_the_budget(tmp_path, whole):
    """Every answer breaks: each request is tried once and then exactly ``break_retries``
    times more, and the client gets an error, never a hang or a truncated body.

    No endpoint is ejected here. An ejection gives up the whole answers awaited from the
    endpoint (``test_hostile_upstreams.py``), and a try given up is not a break: on a
    loaded machine, where answers take longer, one request in a few dozen runs would then
    end with a break retry left."""
    spec, standard = dying(1.0)
    kept = {"break_retries": 3, "outlier_consecutive_failures": 1000, "outlier_interval_s": 1e3}
    async with (
        stack(tmp_path, spec, standard, "standard", whole, PATIENT, **kept) as (url, *_),
        httpx.AsyncClient(timeout=30) as c,
    ):
        answers = await run(c, url, 10, 2)
        metrics = (await c.get(url + "/metrics")).text
    assert {r.status_code for r in answers} == ({503} if whole else {502})
    assert all(r.json()["error"]["message"] for r in answers)
    assert counted(metrics, "retried_after_break") == 30
    assert counted(metrics, "exhausted_after_break") == 10


async def test_broken_streams_end_with_an_error_event_and_are_not_retried(tmp_path):
    """A streaming client whose stream broke after it started gets a final error event,
    never a silent end, and no retry: part of its answer was sent."""
    spec, standard = dying(0.2)
    async with (
        stack(tmp_path, spec, standard, "standard") as (url, *_),
        httpx.AsyncClient(timeout=30) as c,
    ):
        streamed = await run(c, url, 200, 8, stream=True)
        metrics = (await c.get(url + "/metrics")).text
    ends = [r.text.rstrip().rsplit("\n", 1)[-1] for r in streamed]
    errors = [e for e in ends if e != "data: [DONE]"]
    assert all('"error"' in e and "upstream_stream_broken" in e for e in errors)
    assert 15 <= len(errors) <= 70  # about 20% of the 200
    assert counted(metrics, "retried_after_break") == 0


async def test_a_hanging_endpoint_times_out_fails_over_and_is_ejected(tmp_path):
    spec = [sim(Mode.SPECULATIVE, 1, hang_rate=1.0)]
    text_timeouts = {"outlier_consecutive_failures": 2}
    async with (
        stack(tmp_path, spec, [sim(Mode.STANDARD, 2)], **text_timeouts) as (url, services, _, _),
        httpx.AsyncClient(timeout=10) as c,
    ):
        answers = await run(c, url, 4, 1, stream=True)
        fast = await run(c, url, 4, 1)
    assert [r.status_code for r in answers + fast] == [200] * 8
    assert {r.headers["x-speclane-pool"] for r in answers + fast} == {"standard"}
    assert not services.pools.healthy("spec")


async def test_a_whole_answer_awaited_from_an_endpoint_ejected_meanwhile_is_tried_elsewhere(
    tmp_path,
):
    """A passed-through whole answer shows nothing before it is done, so a hung server
    would hold it for ``total_s`` (30 s here). When the endpoint is ejected meanwhile (two
    streams that timed out on it), the awaited answer is given up at once and served by the
    next rung, well inside the client's 15 s."""
    async with AsyncExitStack() as servers:
        hung = await servers.enter_async_context(
            serving(sim_app(sim(Mode.SPECULATIVE, 1, hang_rate=1.0)))
        )
        standard = await servers.enter_async_context(serving(sim_app(sim(Mode.STANDARD, 2))))
        text = f"""
version: 1
pools:
  spec:
    kind: speculative
    model: {MODEL}
    num_speculative_tokens: 4
    endpoints: [{hung}]
    timeouts: {{first_byte_s: 1, idle_s: 1, total_s: 30}}
    passthrough_non_streaming: true
  standard: {{kind: standard, model: {MODEL}, endpoints: [{standard}]}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""
        config = settings(tmp_path, text, outlier_consecutive_failures=2)
        async with gateway(config) as (url, services), httpx.AsyncClient(timeout=15) as c:
            whole = asyncio.create_task(c.post(url + "/v1/chat/completions", json=CHAT))
            await asyncio.sleep(0.2)  # it is waiting on the hung endpoint
            streams = await run(c, url, 2, 1, stream=True)
            answer = await whole
    assert [r.status_code for r in streams] == [200, 200]
    assert answer.status_code == 200 and answer.headers["x-speclane-pool"] == "standard"
    assert "ejected while the answer was awaited" in answer.headers["x-speclane-reason"]
    assert not services.pools.healthy("spec")


# a JSON schema vLLM accepts and cannot run: its engine fails the request with a 500
NEVER_ENDS = {"$ref": "#/$defs/n", "$defs": {"n": {"$ref": "#/$defs/n"}}}


def _health(ready: dict[str, Any]) -> dict[str, list[str]]:
    return {name: [e["health"] for e in pool["endpoints"]] for name, pool in ready["pools"].items()}


async def test_a_run_of_bad_bodies_beside_good_traffic_ejects_nothing(tmp_path):
    """Requests whose body every endpoint fails (a JSON schema that is a ``$ref`` cycle:
    500 from vLLM, and from the simulator) are the requests' own fault: twelve of them,
    each tried on all three endpoints, eject none, not even the standard pool's one, which
    sees no other traffic."""
    spec = [sim(Mode.SPECULATIVE, 1), sim(Mode.SPECULATIVE, 2)]
    async with (
        stack(tmp_path, spec, [sim(Mode.STANDARD, 3)]) as (url, _, _, _),
        httpx.AsyncClient(timeout=30) as c,
    ):
        done = asyncio.Event()

        async def good() -> list[int]:
            statuses = []
            while not done.is_set():
                statuses += [r.status_code for r in await run(c, url, 2, 2)]
            return statuses

        beside = asyncio.create_task(good())
        bad = []
        for i in range(12):
            fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": NEVER_ENDS}}
            body = {**CHAT, "messages": [{"role": "user", "content": f"JSON for {i}"}],
                    "response_format": fmt, "stream": i % 2 == 0}  # fmt: skip
            bad.append(await c.post(url + "/v1/chat/completions", json=body))
        done.set()
        served = await beside
        health = _health((await c.get(url + "/readyz")).json())
    assert {r.status_code for r in bad} == {503}, [r.text for r in bad]
    assert set(served) == {200}
    assert health == {"spec": ["serving", "serving"], "standard": ["serving"]}, health


async def test_an_endpoint_that_fails_what_others_serve_is_still_ejected(tmp_path):
    """The same 500s from one endpoint only, whose requests the others then serve: its own
    fault, counted, and it is ejected."""
    spec = [sim(Mode.SPECULATIVE, 1, error_rate=1.0), sim(Mode.SPECULATIVE, 2)]
    # the requests share their prompt's first block, so by prefix they would all go to one
    # endpoint, the healthy one half the time: least-outstanding choice sends each of them
    # to both in turn
    spread = {"prefix_affinity": False}
    async with (
        stack(tmp_path, spec, [sim(Mode.STANDARD, 3)], **spread) as (url, _, _, _),
        httpx.AsyncClient(timeout=30) as c,
    ):
        answers = await run(c, url, 24, 1)
        health = _health((await c.get(url + "/readyz")).json())
    assert {r.status_code for r in answers} == {200}
    assert sorted(health["spec"]) == ["ejected", "serving"], health
