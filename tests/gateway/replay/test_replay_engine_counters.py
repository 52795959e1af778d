"""Replay reads the engines' step counters as a running gateway does (``LoadScraper``,
``gateway/measure/enginesteps.py``): each replica learns a pool's step time from what its
engines counted between two of its readings, the prompt tokens their caches held left
out of the prefill beside the steps."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from backends.sim.cluster import Cluster
from backends.sim.config import Mode, SimConfig
from gateway.replay.replicas import SCRAPE_EVERY_S, Replicas
from policies.compiled import load_policy

BENCH = Path(__file__).parents[3] / "bench"
BASELINE = load_policy((BENCH / "policies" / "baseline.yaml").read_text())
ENDPOINTS = {"spec": ["spec#0"], "standard": ["standard#0"]}

Counters = dict[str, tuple[int, int, int, int, int]]
IDLE = (0, 0, 0, 0, 0)


def read(replicas: Replicas, pages: list[Counters]) -> None:
    """The replicas read each page in turn, a scrape interval apart."""
    for n, page in enumerate(pages):
        replicas.advance(n * SCRAPE_EVERY_S, dict, None, functools.partial(dict, page))


def test_a_replica_learns_a_busy_pools_step_from_its_engines_counters() -> None:
    replicas = Replicas(1, BASELINE, ENDPOINTS, lambda _: None)
    # the spec engine steps 40 times a reading; the standard one idles
    read(replicas, [{"spec#0": (40 * n, 300 * n, 0, 4, 0), "standard#0": IDLE} for n in range(3)])
    steps = replicas.all[0].stats.steps
    assert set(steps.curves) == {"spec"}  # an idle engine's readings teach nothing
    assert steps.curves["spec"].weight(2 * SCRAPE_EVERY_S) == pytest.approx(2.0, rel=0.05)


def test_the_simulated_cluster_counts_what_its_metrics_page_counts() -> None:
    """Steps, tokens scheduled, prompt tokens, requests running and prompt tokens cached,
    per endpoint, as ``backends/sim/metrics.py`` writes them for the live scraper: a prompt
    sent again is counted whole, and cached but for its last block."""
    cluster = Cluster({"standard": [SimConfig(Mode.STANDARD, enable_prefix_caching=True)]})
    assert cluster.counters() == {"standard#0": (0, 0, 0, 0, 0)}
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 800}]}
    for key in range(2):
        cluster.submit(key, "standard", body, cluster.next_event() or 0.0, max_tokens=8)
        while cluster.next_event() is not None:
            cluster.advance()
    steps, scheduled, prompt, running, cached = cluster.counters()["standard#0"]
    assert running == 0 and steps >= 16 and scheduled == prompt + 16
    one = prompt // 2  # the same prompt twice
    assert prompt == 2 * one and one - 16 <= cached < one  # all but its last block of 16


def test_an_engine_whose_page_has_no_step_histogram_teaches_nothing() -> None:
    """Live, an SGLang page has no ``vllm:iteration_tokens_total`` to read: replay does not
    learn from what its simulator counts either."""
    text = (BENCH / "policies" / "baseline.yaml").read_text()
    sglang = load_policy(text.replace("{kind: standard,", "{kind: standard, engine: sglang,"))
    replicas = Replicas(1, sglang, ENDPOINTS, lambda _: None)
    busy = [(40 * n, 300 * n, 0, 4, 0) for n in range(3)]
    read(replicas, [{"spec#0": step, "standard#0": step} for step in busy])
    assert set(replicas.all[0].stats.steps.curves) == {"spec"}
