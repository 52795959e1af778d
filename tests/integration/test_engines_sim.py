"""The gateway in front of each engine the simulator plays: which signal it reads, what it
scrapes, and TensorRT-LLM's drained-on-read stats with several gateway replicas."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from backends.sim.dialects import SimEngine
from backends.sim.server import create_app as sim_app
from tests.gateways import gateway, settings, sim_policy, sim_stack
from tests.redis_server import namespace, require_shared_redis
from tests.servers import serving

pytestmark = pytest.mark.anyio

JSON = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": 'Return {"name": "Ada", "age": 36} as JSON.'}],
    "response_format": {"type": "json_object"},
    "temperature": 0,
    "max_tokens": 40,
}


def spec(engine: SimEngine, **kw: object) -> SimConfig:
    return SimConfig(k=4, time_scale=0.005, engine=engine, **kw)  # type: ignore[arg-type]


def policy(engine: str) -> str:
    # threshold mode where the engine feeds it keeps the standard pool out of these tests
    mode = "threshold" if engine in ("vllm", "trtllm") else "economic"
    text = sim_policy(spec=f"engine: {engine}", standard=f"engine: {engine}")
    return text.replace("ladder:", f"guardrail: {{{{mode: {mode}}}}}\nladder:")


async def serve_some(url: str, n: int, stream: bool = True) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(n):
            r = await c.post(url + "/v1/chat/completions", json=JSON | {"stream": stream})
            assert r.status_code == 200
            await r.aread()


@pytest.mark.parametrize(
    ("engine", "signal"),
    [("vllm-neuron", "chunks"), ("sglang", "per_request"), ("trtllm", "per_request")],
)
async def test_each_engine_gives_the_signal_it_says(tmp_path, engine: str, signal: str) -> None:
    async with sim_stack(tmp_path, policy(engine), spec(SimEngine(engine))) as stack:
        await serve_some(stack.url, 3)
        async with httpx.AsyncClient() as c:
            ready = (await c.get(stack.url + "/readyz")).json()
    pool = ready["pools"]["spec"]
    assert pool["engine"] == engine and pool["signal"] == signal
    assert pool["signals_seen"]["last"] == signal
    assert pool["signals_seen"]["counts"] == {signal: 3}
    slice_ = next(iter(stack.services.stats.views.summary(0).values()))
    assert slice_["pools"]["spec"]["tokens_per_step"] > 1.5  # JSON: several tokens a step


async def test_trtllm_whole_answers_pass_through_and_still_say_their_steps(tmp_path) -> None:
    async with (
        sim_stack(tmp_path, policy("trtllm"), spec(SimEngine.TRTLLM)) as stack,
        httpx.AsyncClient() as c,
    ):
        r = await c.post(stack.url + "/v1/chat/completions", json=JSON)
        ready = (await c.get(stack.url + "/readyz")).json()
    assert r.json()["choices"][0]["avg_decoded_tokens_per_iter"] > 1.0  # the pool's own answer
    assert ready["pools"]["spec"]["signals_seen"]["counts"] == {"per_request": 1}


async def test_sglang_counts_are_asked_for_and_only_the_asking_client_sees_them(tmp_path):
    async with (
        sim_stack(tmp_path, policy("sglang"), spec(SimEngine.SGLANG)) as stack,
        httpx.AsyncClient() as c,
    ):
        plain = await c.post(stack.url + "/v1/chat/completions", json=JSON | {"stream": True})
        body = JSON | {"stream": True, "return_spec_tokens_details": True}
        asked = await c.post(stack.url + "/v1/chat/completions", json=body)
    assert "sglext" not in plain.text and "sglext" in asked.text
    slice_ = next(iter(stack.services.stats.views.summary(0).values()))
    assert slice_["pools"]["spec"]["measured"] == 2  # drafts counted for both
    assert slice_["pools"]["spec"]["acceptance"] > 0.5


async def test_sglang_gauges_are_shown_as_they_are(tmp_path) -> None:
    async with sim_stack(tmp_path, policy("sglang"), spec(SimEngine.SGLANG)) as stack:
        await serve_some(stack.url, 2)
        await stack.services.scraper.scrape()
        gauges = stack.services.scraper.gauges["spec"]
    assert gauges.rate is not None and 0 < gauges.rate <= 1
    assert gauges.lifetime_length is not None and gauges.lifetime_length > 1


async def scraped_equals_served(tmp_path, sim: SimConfig) -> None:
    async with sim_stack(tmp_path, policy("trtllm"), sim, scrape_interval_s=3600) as stack:
        scraper = stack.services.scraper
        await scraper.scrape()
        await serve_some(stack.url, 4)
        await scraper.scrape()
        async with httpx.AsyncClient() as c:
            served = (await c.get(stack.spec + "/sim/state")).json()["counters"]
    assert scraper.latest["spec"].draft_tokens == served["num_draft_tokens"] > 0
    assert scraper.latest["spec"].accepted_tokens == served["num_accepted_tokens"]


async def test_trtllm_cumulative_counters_are_read_where_the_server_has_them(tmp_path) -> None:
    await scraped_equals_served(tmp_path, spec(SimEngine.TRTLLM))


async def test_trtllm_drained_stats_are_counted_once_by_one_gateway(tmp_path) -> None:
    await scraped_equals_served(tmp_path, spec(SimEngine.TRTLLM, prometheus=False))


async def test_trtllm_drained_stats_across_replicas_are_neither_doubled_nor_lost(tmp_path):
    """Two gateway replicas scrape one server whose /metrics hands each iteration to one
    reader: each adds what it took to the shared total, so both see every iteration once."""
    url, ns = require_shared_redis(), namespace()
    sim = spec(SimEngine.TRTLLM, prometheus=False)
    async with (
        serving(sim_app(sim)) as spec_url,
        serving(sim_app(SimConfig(mode=Mode.STANDARD, time_scale=sim.time_scale))) as std_url,
    ):
        text = policy("trtllm").format(spec=spec_url, std=std_url)
        common = {"redis_url": url, "namespace": ns, "scrape_interval_s": 3600}
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
        async with (
            gateway(settings(tmp_path / "a", text, **common)) as (a, one),
            gateway(settings(tmp_path / "b", text, **common)) as (_, two),
        ):
            await asyncio.gather(one.scraper.scrape(), two.scraper.scrape())
            for _ in range(3):  # the replicas' reads interleave with the traffic
                await serve_some(a, 2)
                await one.scraper.scrape()
                await serve_some(a, 1)
                await two.scraper.scrape()
            await asyncio.gather(one.scraper.scrape(), two.scraper.scrape())
            async with httpx.AsyncClient() as c:
                served = (await c.get(spec_url + "/sim/state")).json()["counters"]
            totals = await one.state.drained(spec_url, {}, None, None)
    assert totals["draft_tokens"] == served["num_draft_tokens"] > 0
    assert totals["accepted_tokens"] == served["num_accepted_tokens"]
    assert totals["lost"] == 0 and totals["iterations"] == totals["last"] - totals["first"] + 1


async def test_speculation_turned_off_by_the_trtllm_gate_is_seen(tmp_path) -> None:
    sim = spec(SimEngine.TRTLLM, acceptance_rate_threshold=0.99, acceptance_rate_window_size=2)
    async with sim_stack(tmp_path, policy("trtllm"), sim, scrape_interval_s=3600) as stack:
        scraper = stack.services.scraper
        await scraper.scrape()
        for _ in range(5):  # drafts, then the gate closes, then decoding without drafts
            await serve_some(stack.url, 1)
            await scraper.scrape()
        async with httpx.AsyncClient() as c:
            ready = (await c.get(stack.url + "/readyz")).json()
    assert ready["pools"]["spec"]["speculation"]["state"] == "off"
