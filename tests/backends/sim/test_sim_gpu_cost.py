"""The GPU-shaped step-time model: flat while a step is memory-bound, compute per token past
a knee, KV reads per cached token shared by the tokens a sequence verifies; loaded from what
``bench/gpu/steptime.py`` fits; chosen with ``--cost-model``, and driving the engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from backends.sim.cli import build_parser, config_from_args, cost_model_arg
from backends.sim.engine import Scheduler, Sequence
from backends.sim.model import GPU_ESTIMATE, CostModel, GpuCostModel, RequestProfile
from backends.sim.workload import Workload

K = 4
GPU = GpuCostModel()
BENCH = Path(__file__).parents[3] / "bench" / "gpu"


def test_a_step_is_flat_until_the_knee_then_linear_in_tokens():
    flat = [GPU.decode_step_seconds(batch=b, k=K, speculative=False) for b in (1, 8, 32)]
    assert flat == pytest.approx([GPU.floor_s] * 3)
    # verifying k=4 drafts at batch 1 costs the target about nothing over a plain step
    spec1 = GPU.target_seconds(5, 0)
    assert spec1 == pytest.approx(GPU.floor_s)
    # past the knee every token costs per_token_s
    assert GPU.target_seconds(1000, 0) - GPU.target_seconds(900, 0) == pytest.approx(
        100 * GPU.per_token_s
    )


def test_cached_context_is_read_once_per_sequence_whatever_it_verifies():
    plain = GPU.decode_step_seconds(batch=16, k=K, speculative=False, context=8192)
    bare = GPU.decode_step_seconds(batch=16, k=K, speculative=False)
    assert plain - bare == pytest.approx(16 * 8192 * GPU.kv_per_token_s)
    # a verify step reads the same cache: only its draft passes add reads of their own
    spec = GPU.target_seconds(16 * (K + 1), 16 * 8192)
    assert spec - GPU.target_seconds(16 * (K + 1), 0) == pytest.approx(plain - bare)


def test_speculation_pays_at_low_batch_and_stops_past_the_knee():
    # a 1B draft costs a fifth of an 8B step, four times over: 1.9x at a=0.8, not 3.4x
    assert 1.5 < GPU.speedup(0.8, K, batch=1) < 2.0
    assert GPU.speedup(0.8, K, batch=512) < 1.0
    # longer contexts dilute the verify cost: speculation pays up to a larger batch
    assert GPU.speedup(0.7, K, batch=96, context=8192) > GPU.speedup(0.7, K, batch=96)


def test_the_engine_charges_the_context_it_holds():
    def first_decode(prompt: int) -> float:
        s = Scheduler(speculative=False, k=K, max_num_seqs=8, cost=GPU)
        for i in range(4):
            s.submit(Sequence(_profile(prompt, i), K))
        s.step()  # the prefill step
        return s.step().seconds

    # each of the 4 sequences has prompt + 1 tokens cached at its first decode step
    assert first_decode(4001) - first_decode(1) == pytest.approx(4 * 4000 * GPU.kv_per_token_s)
    affine = Scheduler(speculative=False, k=K, max_num_seqs=8)
    affine.submit(Sequence(_profile(4001, 0), K))
    affine.step()
    assert affine.step().seconds == pytest.approx(0.025 + 0.0008)


def _profile(prompt: int, index: int) -> RequestProfile:
    return RequestProfile(
        workload=Workload.CODE,
        prompt_tokens=prompt,
        max_tokens=20,
        output_tokens=20,
        finish_reason="length",
        acceptance=0.8,
        seed_key=f"gpu:{index}",
    )


def test_the_defaults_say_they_are_an_estimate_and_bad_numbers_are_refused():
    assert GPU.source == GPU_ESTIMATE and "estimate" in GPU.source
    with pytest.raises(ValueError, match="floor_s"):
        GpuCostModel(floor_s=-1.0)
    with pytest.raises(ValueError, match="knee_tokens"):
        GpuCostModel(knee_tokens=float("nan"))


def test_the_benchmark_fit_loads_and_reproduces_the_measured_table():
    sys.path.insert(0, str(BENCH))
    import stepcurve as sc

    truth = sc.Hinge(7.0, 0.03, 200.0, 5e-5)
    draft = sc.Hinge(1.4, 0.006, 256.0, 1.2e-5)
    cells = [
        sc.Cell(
            s.shape,
            s.role,
            s.batch,
            s.q,
            s.context,
            "ok",
            (truth if s.role == "target" else draft).ms(s.batch * s.q, s.batch * s.context),
        )
        for s in sc.grid("8b", "1b", sc.BATCHES, sc.QUERIES, sc.CONTEXTS)
    ]
    summary = {"cost_model": {**sc.fit_cost_model(cells, "8b", "1b"), "source": "measured: X"}}
    model = GpuCostModel.from_summary(json.loads(json.dumps(summary)))
    assert model.source == "measured: X"
    for batch, q, context in ((1, 1, 512), (16, 5, 2048), (256, 8, 512), (32, 3, 8192)):
        expected = truth.ms(batch * q, batch * context) / 1e3
        got = model.step_seconds(
            verified_tokens=batch * q,
            prefill_tokens=0,
            draft_passes=0,
            drafting_seqs=0,
            context_tokens=batch * context,
        )
        assert got == pytest.approx(expected, rel=1e-3)
    assert model.draft_seconds(64, 64 * 2048) == pytest.approx(
        draft.ms(64, 64 * 2048) / 1e3, rel=1e-3
    )


def test_a_summary_without_a_draft_fit_keeps_the_estimated_draft():
    target = {"floor_s": 0.01, "per_token_s": 1e-5, "knee_tokens": 100, "kv_per_token_s": 0}
    model = GpuCostModel.from_summary({"target": target, "source": "measured: Y"})
    assert model.floor_s == 0.01 and model.draft_floor_s == GPU.draft_floor_s
    assert "draft: estimate" in model.source
    with pytest.raises(ValueError, match="no fitted 'target'"):
        GpuCostModel.from_summary({"cost_model": {"form": "x"}})
    with pytest.raises(ValueError, match="target has no per_token_s"):
        GpuCostModel.from_summary({"target": {"floor_s": 0.01}})


def test_the_command_line_chooses_the_cost_model(tmp_path):
    parser = build_parser(argparse.ArgumentParser())
    assert isinstance(config_from_args(parser.parse_args([])).cost, CostModel)
    assert config_from_args(parser.parse_args(["--cost-model", "gpu"])).cost == GPU
    target = {"floor_s": 0.02, "per_token_s": 2e-5, "knee_tokens": 50, "kv_per_token_s": 1e-8}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"cost_model": {"target": target, "source": "measured: Z"}}))
    chosen = config_from_args(parser.parse_args(["--cost-model", f"gpu:{path}"])).cost
    assert isinstance(chosen, GpuCostModel) and chosen.floor_s == 0.02
    for bad in ("linear", "affine:x", f"gpu:{tmp_path / 'missing.json'}"):
        with pytest.raises(argparse.ArgumentTypeError):
            cost_model_arg(bad)
    path.write_text("[1, 2]")
    with pytest.raises(argparse.ArgumentTypeError, match="not a JSON object"):
        cost_model_arg(f"gpu:{path}")
