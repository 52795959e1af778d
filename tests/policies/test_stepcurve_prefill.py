"""A step observed beside prefill says little about the decode step: a request's prefill is
attributed to the steps decoding when its prompt's prefill ended, not to the steps it ran
in, so an observation's prompt tokens are known only to about their own number."""

from __future__ import annotations

import random

from policies.stepcurve import NOISE_SD, CurveFit, ladder, prefill_weight

# a 32B-shaped target on one H200 (backends/sim/model.py: GPU_32B) and k = 4 passes of a
# draft a tenth of its floor
FLOOR, LOW, HIGH, KNEE, KV = 0.0228, 5.32e-5, 1.143e-4, 177.0, 8.87e-8
DRAFT_FLOOR, DRAFT_TOKEN, DRAFT_KV, K = 0.00229, 6.4e-6, 1.55e-8, 4
CHUNK, STEPS = 2048.0, 20


def step(seqs: float, context: float, prefill: float) -> float:
    """A speculative step: the target verifies and prefills, each draft pass reads its cache."""
    tokens = seqs * (K + 1) + prefill
    kv = seqs * context * max(1.0, 16.0 / seqs)
    target = FLOOR + LOW * min(tokens, KNEE) + HIGH * max(tokens - KNEE, 0.0) + KV * kv
    return target + K * (DRAFT_FLOOR + DRAFT_TOKEN * seqs + DRAFT_KV * kv)


def observed(weighted: bool, seed: int = 5) -> float:
    """The learned step at 6 sequences of 10k tokens over its truth, from requests of up to
    3k tokens of context per sequence decoding 20 steps each, a third of them beside a long
    prompt prefilled in chunks of 2,048 tokens (a step with a chunk runs past the knee),
    attributed by when its prefill ended: up to half of it more or less than the request saw."""
    rng = random.Random(seed)
    fit = CurveFit(k=K)
    for i in range(3000):
        seqs = rng.uniform(4, 16)
        chunks = rng.randint(1, 4) if rng.random() < 1 / 3 else 0
        # a prompt still prefilling is not yet in the cache: less context beside chunks
        context = rng.uniform(200, 1000) if chunks else rng.uniform(200, 3000)
        steps = [step(seqs, context, CHUNK if n < chunks else 0.0) for n in range(STEPS)]
        seconds = sum(steps) / STEPS * rng.lognormvariate(0.0, 0.02)
        told = chunks * CHUNK / STEPS * rng.uniform(0.5, 1.5)
        tokens = seqs * (K + 1)
        weight = prefill_weight(tokens, told) if weighted else 1.0
        fit.add(
            i * 0.1,
            seconds,
            tokens=tokens,
            seqs=seqs,
            kv=seqs * context,
            prefill=told,
            weight=weight,
        )
    (curve,) = ladder([fit], [K], 0.1, 300.0)
    assert curve is not None
    return curve.at(6.0, 10_000.0).seconds / step(6.0, 10_000.0, 0.0)


def test_a_pure_decode_step_weighs_fully_and_a_prefill_step_less_the_more_it_prefills():
    assert prefill_weight(40.0, 0.0) == 1.0
    weights = [prefill_weight(40.0, p) for p in (10.0, 100.0, 1000.0, 10_000.0)]
    assert weights == sorted(weights, reverse=True)
    assert weights[0] > 0.9 and weights[-1] < NOISE_SD**2 * 1.2


def test_misattributed_prefill_does_not_bend_the_cache_read_learned():
    weighted, plain = observed(weighted=True), observed(weighted=False)
    assert abs(weighted - 1.0) < 0.03
    assert plain < 0.96  # the cache read learned low: its steps beside chunks had less of it
