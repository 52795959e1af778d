"""``HingeFit``: a pool's step time as a floor and a slope past a knee, the alternative to
the guardrail's line, on a synthetic table shaped like a GPU's step curve (flat while
memory-bound, linear in tokens once compute-bound)."""

from __future__ import annotations

import random

import pytest

from backends.sim.model import GpuCostModel
from policies.steptime import HINGE_KNEES, HingeFit, Line, StepFit

# a synthetic GPU-shaped curve with a flat floor and one knee (an 8B-on-H100 estimate from
# bandwidth and FLOP rates); the measured H200 table is in test_steptime_measured.py
GPU = GpuCostModel(
    floor_s=0.006,
    low_per_token_s=0.0,
    per_token_s=2.5e-5,
    knee_tokens=240.0,
    kv_per_token_s=4.4e-8,
    kv_min_seqs=0.0,
    draft_floor_s=0.0012,
    draft_per_token_s=5e-6,
    draft_knee_tokens=240.0,
    draft_kv_per_token_s=1.1e-8,
    draft_kv_min_seqs=0.0,
    source="synthetic",
)
K = 4
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def gpu_step(batch: float, k: int | None, context: int = 512) -> float:
    spec = k is not None
    return GPU.decode_step_seconds(batch=batch, k=k or 0, speculative=spec, context=context)


def feed(fit, k, batches, *, noise=0.05, n=600, seed=1, t0=0.0, context=512) -> None:
    rng = random.Random(seed)
    for i in range(n):
        batch = rng.choice(batches)
        fit.add(t0 + i * 0.1, batch, gpu_step(batch, k, context) * (1 + rng.gauss(0, noise)))


def worst(fit, k, context=512) -> float:
    out = 0.0
    for batch in BATCHES:
        got = fit.predict(60.0, batch)
        assert got is not None
        out = max(out, abs(got.seconds / gpu_step(batch, k, context) - 1))
    return out


def test_the_hinge_follows_a_speculative_pool_past_its_knee_better_than_a_line():
    # k=4 at short contexts: flat-ish until ~48 sequences (240 tokens), then 5 tokens each
    hinge, line = HingeFit(tokens_per_seq=K + 1), StepFit(tokens_per_seq=K + 1)
    feed(hinge, K, BATCHES)
    feed(line, K, BATCHES)
    chosen = hinge.hinge(60.0)
    assert chosen is not None and 16 <= chosen.knee <= 64
    # the floor still rises a little below the knee (KV reads, the draft), which a hinge
    # with a flat floor leaves to its residuals
    assert worst(hinge, K) < 0.12
    assert worst(line, K) > 1.3 * worst(hinge, K)


@pytest.mark.parametrize(("k", "context"), [(None, 512), (None, 2048), (K, 8192)])
def test_a_curve_the_kv_reads_make_straight_stays_a_line(k, context):
    # a standard pool never reaches the knee by batch 256; at 8k contexts the cache reads
    # outweigh the bend
    hinge, line = HingeFit(tokens_per_seq=(k or 0) + 1), StepFit(tokens_per_seq=(k or 0) + 1)
    feed(hinge, k, BATCHES, context=context)
    feed(line, k, BATCHES, context=context)
    chosen = hinge.hinge(60.0)
    assert chosen is not None and chosen.knee == 0.0
    assert worst(hinge, k, context) == pytest.approx(worst(line, k, context), abs=1e-6)
    assert worst(hinge, k, context) < 0.1


def test_straight_data_stays_a_line_and_flat_data_a_floor():
    fit = HingeFit()
    rng = random.Random(3)
    for i in range(400):
        batch = rng.choice(BATCHES)
        fit.add(i * 0.1, batch, (0.025 + 0.0008 * batch) * (1 + rng.gauss(0, 0.05)))
    chosen = fit.hinge(40.0)
    assert chosen is not None and chosen.knee == 0.0
    assert chosen.line.a == pytest.approx(0.025, rel=0.1)
    assert chosen.line.b == pytest.approx(0.0008, rel=0.1)
    flat = HingeFit()
    feed(flat, None, (1, 2, 4, 8, 16))  # all below the knee
    small = flat.hinge(60.0)
    assert small is not None
    assert small.at(8).seconds == pytest.approx(gpu_step(8, None), rel=0.05)


def test_a_knee_needs_observations_on_both_sides():
    fit = HingeFit()
    for i in range(50):
        fit.add(i * 0.1, 64, gpu_step(64, K))
    fit.add(5.0, 1, gpu_step(1, K))  # one observation below 64: not enough for any knee
    chosen = fit.hinge(5.0)
    assert chosen is not None and chosen.knee == 0.0


def test_the_state_is_constant_in_size_and_decays_like_the_line():
    fit, line = HingeFit(), StepFit()
    feed(fit, K, BATCHES, n=50)
    size = (len(fit.xx), len(fit.xy), len(fit.above))
    feed(fit, K, BATCHES, n=500, seed=2, t0=5.0)
    assert (len(fit.xx), len(fit.xy), len(fit.above)) == size
    assert size == (len(HINGE_KNEES),) * 3
    feed(line, K, BATCHES, n=50)
    feed(line, K, BATCHES, n=500, seed=2, t0=5.0)
    assert fit.weight(55.0 + 600) == pytest.approx(line.weight(55.0 + 600), rel=1e-9)
    assert fit.weight(55.0 + 1200) == pytest.approx(fit.weight(55.0) / 16)  # 4 half-lives
    assert HingeFit().predict(0.0, 4) is None
    prior = Line(0.01, 0.001, 0.0, ((1e-6, 0.0, 0.0), (0.0, 1e-8, 0.0), (0.0, 0.0, 0.0)))
    assert HingeFit().predict(0.0, 4, prior) is not None


def test_doubt_grows_far_above_the_batches_seen():
    fit = HingeFit()
    feed(fit, K, (1, 2, 4, 8, 16, 32, 64))
    near, far = fit.predict(60.0, 16), fit.predict(60.0, 512)
    assert near is not None and far is not None
    assert far.log_var > 3 * near.log_var
