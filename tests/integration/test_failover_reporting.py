"""What speclane says after a failover: the serving pool and why in the headers, one count
per request served elsewhere, the dead pool unhealthy on /readyz; and the pool acceptance
gauge from scraped counters, which goes away when a pool stops drafting or answering."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.measure.scrape import PoolScraper
from gateway.measure.telemetry import PoolReading
from tests.gateways import gateway, settings, sim_policy
from tests.servers import serving

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
# about failover reporting: a guardrail that judges wall-clock step times of a 1%-speed
# simulator must not move the slice (and change the decision) while the test watches it
POLICY = sim_policy(spec="timeouts: {connect_s: 1, first_byte_s: 5}") + (
    "guardrail: {{mode: threshold, min_samples: 30}}\n"
)
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "write python"}],
    "temperature": 0,
    "max_tokens": 12,
}


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, spec_url: str, std_url: str) -> Any:
    text = POLICY.format(spec=spec_url, std=std_url)
    async with gateway(settings(tmp_path, text)) as running:
        yield running


async def test_a_killed_pool_reports_every_request_served_elsewhere(tmp_path):
    fast = SimConfig(time_scale=0.01)
    std_sim = SimConfig(mode=Mode.STANDARD, time_scale=0.01)
    n_alive, n_dead = 5, 40
    async with (
        serving(sim_app(std_sim)) as std_url,
        contextlib.AsyncExitStack() as spec_life,
    ):
        spec_url = await spec_life.enter_async_context(serving(sim_app(fast)))
        async with stack(tmp_path, spec_url, std_url) as (url, services), httpx.AsyncClient() as c:
            for _ in range(n_alive):
                ok = await c.post(url + "/v1/chat/completions", json=BODY)
                assert ok.headers["x-speclane-pool"] == "spec"
                assert not ok.headers["x-speclane-reason"].startswith("failover")
            await spec_life.aclose()  # the speculative server dies
            reasons = []
            for i in range(n_dead):
                body = BODY | {"stream": i % 2 == 0}
                answer = await c.post(url + "/v1/chat/completions", json=body)
                assert answer.status_code == 200
                assert answer.headers["x-speclane-pool"] == "standard"
                reasons.append(answer.headers["x-speclane-reason"])
            ready = (await c.get(url + "/readyz")).json()
            metrics = (await c.get(url + "/metrics")).text
    assert all(r.startswith("failover: spec ") and "served by standard" in r for r in reasons)
    assert "failed: cannot connect" in reasons[0]  # the first request tried the dead server
    assert any("had no endpoint in service" in r for r in reasons)  # later ones skipped it
    assert all(r.endswith("decided: " + reasons[0].split("decided: ")[1]) for r in reasons)
    failovers = samples(metrics, "speclane_failovers_total")
    key = (("pool", "spec"), ("result", "served"), ("served_by", "standard"))
    assert failovers == {key: n_dead}
    tries = samples(metrics, "speclane_upstream_failures_total")
    assert 1 <= tries[(("pool", "spec"),)] < n_dead  # an ejected endpoint is not tried
    assert ready["pools"]["spec"]["healthy"] is False and ready["models"][MODEL] is True
    assert services.pools.healthy("standard")


class Wall:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_pool_gauge_goes_away_when_its_pool_stops_drafting(tmp_path):
    sim = SimConfig(time_scale=0.01)
    std_sim = SimConfig(mode=Mode.STANDARD, time_scale=0.01)
    async with (
        serving(sim_app(std_sim)) as std_url,
        contextlib.AsyncExitStack() as spec_life,
    ):
        spec_url = await spec_life.enter_async_context(serving(sim_app(sim)))
        async with stack(tmp_path, spec_url, std_url) as (url, services), httpx.AsyncClient() as c:
            wall, shown = Wall(), dict[str, PoolReading]()
            scraper = PoolScraper(
                services.pools, services.upstream, services.stats, wall, shown, window_s=60
            )
            await c.post(url + "/v1/chat/completions", json=BODY)
            await scraper.scrape()  # one reading: the server's totals so far stand in
            first = shown["spec"]
            assert first.basis == "lifetime" and first.fed_at == wall.now
            for _ in range(3):
                await c.post(url + "/v1/chat/completions", json=BODY)
            wall.now += 10
            await scraper.scrape()
            assert shown["spec"].basis == "window" and shown["spec"].fed_at == wall.now
            fed = wall.now
            wall.now += 30
            await scraper.scrape()  # no drafts in this interval: the window still has some
            assert shown["spec"].fed_at == fed
            wall.now += 31
            await scraper.scrape()  # nothing drafted for a whole window: no value
            assert "spec" not in shown
            await c.post(url + "/v1/chat/completions", json=BODY)
            wall.now += 10
            await scraper.scrape()
            assert shown["spec"].fed_at == wall.now
            await spec_life.aclose()  # the server stops answering scrapes
            wall.now += 61
            await scraper.scrape()
            assert "spec" not in shown and scraper.failures >= 1


async def test_metrics_show_the_gauge_and_when_it_was_fed(tmp_path):
    sim, std_sim = SimConfig(time_scale=0.01), SimConfig(mode=Mode.STANDARD, time_scale=0.01)
    async with (
        serving(sim_app(sim)) as spec_url,
        serving(sim_app(std_sim)) as std_url,
        stack(tmp_path, spec_url, std_url) as (url, services),
        httpx.AsyncClient() as c,
    ):
        await c.post(url + "/v1/chat/completions", json=BODY)
        await services.scraper.scrape()
        text = (await c.get(url + "/metrics")).text
    rate = samples(text, "speclane_pool_draft_acceptance_rate")
    ((labels, value),) = rate.items()
    assert dict(labels)["pool"] == "spec" and 0 <= value <= 1
    fed = samples(text, "speclane_pool_counters_fed_timestamp_seconds")
    assert list(fed) == [(("pool", "spec"),)]
    assert re.fullmatch(r"\d{10}\.\d+", f"{next(iter(fed.values())):.3f}")


async def test_a_whole_answer_that_breaks_is_served_by_another_endpoint(tmp_path):
    """A standard pool passes non-streaming requests through; when one server drops the
    connection halfway through a body, the answer has not reached the client, so another
    endpoint serves it, and the client never sees the break."""
    dying = SimConfig(mode=Mode.STANDARD, time_scale=0.01, faults=Faults(die_rate=1.0))
    healthy = SimConfig(mode=Mode.STANDARD, time_scale=0.01, seed=2)
    spec = SimConfig(time_scale=0.01)
    async with (
        serving(sim_app(spec)) as spec_url,
        serving(sim_app(dying)) as dead_url,
        serving(sim_app(healthy)) as ok_url,
    ):
        text = sim_policy(start="standard").format(spec=spec_url, std=dead_url)
        text = text.replace(f'["{dead_url}"]', f'["{dead_url}", "{ok_url}"]')
        # the same request six times: by its prompt it would go to one endpoint every time;
        # least-outstanding choice takes each endpoint in turn, the dying one included
        spread = settings(tmp_path, text, prefix_affinity=False)
        async with gateway(spread) as (url, _), httpx.AsyncClient() as c:
            answers = [await c.post(url + "/v1/chat/completions", json=BODY) for _ in range(6)]
            metrics = (await c.get(url + "/metrics")).text
            async with httpx.AsyncClient(base_url=dead_url) as direct:
                with pytest.raises(httpx.RemoteProtocolError):
                    await direct.post("/v1/chat/completions", json=BODY)
    assert [a.status_code for a in answers] == [200] * 6
    assert all("service_tier" in a.json() for a in answers)  # passed through whole
    failovers = samples(metrics, "speclane_failovers_total")
    same_pool = (("pool", "standard"), ("result", "served"), ("served_by", "standard"))
    assert failovers.get(same_pool, 0) >= 1
