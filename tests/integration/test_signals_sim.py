"""Acceptance signals against the simulator: per-request metrics, chunk counting, and the
pool's own counters when a server reports nothing per request."""

from __future__ import annotations

import time

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from tests.gateways import sim_stack

pytestmark = pytest.mark.anyio

POLICY = """
version: 1
pools:
  spec:
    kind: speculative
    model: qwen3-32b
    num_speculative_tokens: 4
    endpoints: ["{spec}"]
    chunk_acceptance: {chunks}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
guardrail: {{mode: threshold}}  # about signals: no exploration of the standard pool
rules: [{{name: default, start: spec}}]
"""
JSON = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Extract the name and age as JSON."}],
    "response_format": {"type": "json_object"},
    "temperature": 0,
    "max_tokens": 40,
}


def spec_sim(**kw) -> SimConfig:
    return SimConfig(mode=Mode.SPECULATIVE, k=4, time_scale=0.01, **kw)


async def run(tmp_path, sim: SimConfig, chunks: bool, n: int = 6):
    policy = POLICY.replace("{chunks}", str(chunks).lower())
    async with (
        sim_stack(tmp_path, policy, sim, scrape_interval_s=3600) as (url, services, _),
        httpx.AsyncClient() as c,
    ):
        await services.scraper.scrape()  # a first reading to difference against
        for _ in range(n):
            r = await c.post(url + "/v1/chat/completions", json=JSON)
            assert r.status_code == 200
        await services.scraper.scrape()
        summary = services.stats.views.summary(time.time())
        metrics = (await c.get(url + "/metrics")).text
    (slice_stats,) = summary.values()
    return slice_stats["pools"]["spec"], services.scraper.latest.get("spec"), metrics


async def test_per_request_metrics_and_pool_counters_agree(tmp_path):
    window, pool, metrics = await run(tmp_path, spec_sim(), chunks=True)
    assert window["measured"] == 6 and window["acceptance"] > 0.5
    assert pool is not None and pool.acceptance == pytest.approx(window["acceptance"])
    assert "speclane_requests_total{" in metrics and 'signal="per_request"' in metrics
    assert "speclane_pool_draft_acceptance_rate" in metrics


async def test_chunk_signal_when_the_server_reports_nothing_per_request(tmp_path):
    window, pool, metrics = await run(tmp_path, spec_sim(per_request_metrics=False), chunks=True)
    assert window["stepped"] == 6 and 'signal="chunks"' in metrics
    assert window["measured"] == 0  # chunks show steps, never drafts
    # this simulator drafts k in every step: tokens per step = 1 + k * draft acceptance,
    # short only by the last step, cut by max_tokens
    assert pool is not None
    assert window["tokens_per_step"] == pytest.approx(1 + 4 * pool.acceptance, rel=0.1)


async def test_pool_counters_are_the_evidence_when_chunks_are_not_trusted(tmp_path):
    sim = spec_sim(per_request_metrics=False, stream_interval=3)
    window, pool, metrics = await run(tmp_path, sim, chunks=False)
    assert 'signal="speed"' in metrics
    assert pool is not None
    assert window["measured"] == 6  # attributed: this slice alone used the pool
    assert window["acceptance"] == pytest.approx(pool.acceptance)


async def test_nothing_but_speed_from_a_server_without_draft_counts(tmp_path):
    sim = spec_sim(report_spec_metrics=False, stream_interval=3)
    window, pool, _ = await run(tmp_path, sim, chunks=False)
    assert pool is None
    assert window["measured"] == 0 and window["tpot_s"] is not None
