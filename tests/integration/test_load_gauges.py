"""Other replicas' traffic counts: the load meter reads each endpoint's own count of the
requests it runs and queues, standard pools included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from gateway.measure.loadscrape import in_flight
from tests.gateways import sim_policy, sim_stack

pytestmark = pytest.mark.anyio
FIXTURES = Path(__file__).parents[1] / "vllm_fixtures"
LONG = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Tell me a long story."}],
    "temperature": 0.7,
    "max_tokens": 400,
    "ignore_eos": True,
}


def test_the_gauges_of_vllm_and_sglang_pages_are_read():
    page = (FIXTURES / "metrics-excerpt.txt").read_text()  # real vLLM 0.32: 0 running
    assert in_flight(page) == 0.0
    sglang = (
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3.0\n"
        "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 2.0\n"
    )
    assert in_flight(sglang) == 5.0
    assert in_flight("# TYPE other gauge\nother 1.0\n") is None


async def test_requests_another_replica_sends_raise_the_ladder_load(tmp_path):
    spec = SimConfig(mode=Mode.SPECULATIVE, k=4, time_scale=1.0)
    async with (
        sim_stack(tmp_path, sim_policy(), spec, scrape_interval_s=3600) as stack,
        httpx.AsyncClient(timeout=60) as client,
    ):
        services = stack.services
        assert services.load_scraper is not None
        standard = services.pools.endpoints["standard"][0].url
        # four long answers straight from the standard server: this gateway sent nothing
        others = [
            asyncio.create_task(client.post(standard + "/v1/chat/completions", json=LONG))
            for _ in range(4)
        ]
        for _ in range(200):  # until the server has taken all four in
            await services.load_scraper.scrape()
            services.load.sample(services.clock())
            if services.load.mean(standard, services.clock() - 0.01, services.clock()) == 4:
                break
            await asyncio.sleep(0.02)
        start = services.clock()
        await asyncio.sleep(0.5)
        services.load.sample(services.clock())
        mean = services.load.mean(standard, start, services.clock())
        ladder = services.load.ladder("qwen3-32b", services.clock())
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
    assert mean is not None and 3.5 <= mean <= 4.0  # four in flight, none of them ours
    assert ladder is not None and ladder > 0  # smoothed toward 2; without the gauges 0


async def test_an_endpoint_whose_metrics_page_does_not_answer_is_ejected(tmp_path, closed_port):
    """Reading the gauges is an active health check too: a standard endpoint that takes no
    traffic and stops answering (here: nothing listens on its port any more) is ejected
    after the outlier detector's consecutive failures, without a client paying for it."""
    spec = SimConfig(mode=Mode.SPECULATIVE, k=4, zero_latency=True)
    async with sim_stack(
        tmp_path, sim_policy(), spec, scrape_interval_s=3600, outlier_consecutive_failures=3
    ) as stack:
        services = stack.services
        assert services.load_scraper is not None
        (standard,) = services.pools.endpoints["standard"]
        for _ in range(2):
            await services.load_scraper.scrape()
        assert services.pools.healthy("standard")  # answering: nothing counted
        standard.url = f"http://127.0.0.1:{closed_port()}"  # the server is gone
        for _ in range(2):
            await services.load_scraper.scrape()
        assert services.pools.healthy("standard")
        await services.load_scraper.scrape()
        assert not services.pools.healthy("standard")


async def test_a_busy_engines_counters_teach_its_pools_step_time(tmp_path):
    """Between two readings of a busy server's step histogram and running gauge, the pool's
    step-time curve gets an observation of its own engine's mean step, with no answer of
    this gateway's needed (four long answers sent straight to the standard server)."""
    spec = SimConfig(mode=Mode.SPECULATIVE, k=4, time_scale=1.0)
    async with (
        sim_stack(tmp_path, sim_policy(), spec, scrape_interval_s=3600) as stack,
        httpx.AsyncClient(timeout=60) as client,
    ):
        services = stack.services
        assert services.load_scraper is not None
        standard = services.pools.endpoints["standard"][0].url
        others = [
            asyncio.create_task(client.post(standard + "/v1/chat/completions", json=LONG))
            for _ in range(4)
        ]
        learned = 0.0
        for _ in range(100):
            await services.load_scraper.scrape()
            fit = services.stats.steps.curves.get("standard")
            learned = fit.weight(services.wall()) if fit is not None else 0.0
            if learned >= 2:
                break
            await asyncio.sleep(0.1)
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
    assert learned >= 2
