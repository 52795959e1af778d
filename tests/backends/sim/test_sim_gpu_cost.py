"""The GPU-shaped step-time model: a floor and a shallow slope while a step is memory-bound, a
steeper one past a knee, KV reads per cached token shared by the tokens a sequence verifies
(at the rate of at least ``kv_min_seqs`` sequences); loaded from what ``bench/gpu/steptime.py``
fits; chosen with ``--cost-model``, and driving the engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from backends.sim.cli import build_parser, config_from_args, cost_model_arg
from backends.sim.engine import Scheduler, Sequence
from backends.sim.model import (
    GPU_32B,
    GPU_H200,
    CostModel,
    GpuCostModel,
    RequestProfile,
    measured_for,
    scaled_draft,
)
from backends.sim.workload import Workload

K = 4
GPU = GpuCostModel()
BENCH = Path(__file__).parents[3] / "bench" / "gpu"


def test_a_step_is_a_floor_a_shallow_slope_then_a_steep_one_past_the_knee():
    floor = GPU.target_seconds(0, 0)
    assert floor == pytest.approx(GPU.floor_s)
    below = GPU.target_seconds(200, 0) - GPU.target_seconds(100, 0)
    assert below == pytest.approx(100 * GPU.low_per_token_s)
    past = GPU.target_seconds(1000, 0) - GPU.target_seconds(900, 0)
    assert past == pytest.approx(100 * GPU.per_token_s)
    assert past > 1.5 * below  # memory-bound, then compute-bound
    # verifying k=4 drafts at batch 1 costs the target next to nothing over a plain step
    assert GPU.target_seconds(5, 0, 1) / GPU.target_seconds(1, 0, 1) < 1.02


def test_cached_context_is_read_once_per_sequence_whatever_it_verifies():
    plain = GPU.decode_step_seconds(batch=32, k=K, speculative=False, context=8192)
    bare = GPU.decode_step_seconds(batch=32, k=K, speculative=False)
    assert plain - bare == pytest.approx(32 * 8192 * GPU.kv_per_token_s)
    # a verify step reads the same cache: only its draft passes add reads of their own
    spec = GPU.target_seconds(32 * (K + 1), 32 * 8192, 32)
    assert spec - GPU.target_seconds(32 * (K + 1), 0, 32) == pytest.approx(plain - bare)


def test_below_the_attention_floor_a_sequence_reads_its_cache_slowly():
    # one sequence's attention leaves most of the GPU idle: its cache costs what
    # kv_min_seqs sequences' would; past that, each sequence adds its own share
    one = GPU.target_seconds(1, 8192, 1) - GPU.target_seconds(1, 0, 1)
    assert one == pytest.approx(8192 * GPU.kv_per_token_s * GPU.kv_min_seqs)
    eight = GPU.target_seconds(8, 8 * 8192, 8) - GPU.target_seconds(8, 0, 8)
    assert eight == pytest.approx(one)
    # seqs unknown (0): the cache at its full rate
    assert GPU.target_seconds(1, 8192) - GPU.floor_s == pytest.approx(
        GPU.low_per_token_s + 8192 * GPU.kv_per_token_s
    )


def test_speculation_pays_at_low_batch_and_stops_past_the_knee():
    # four passes of a 1B draft cost more than the 8B verification: 1.5x at a=0.8, not 3.4x
    assert 1.3 < GPU.speedup(0.8, K, batch=1) < 1.7
    assert GPU.speedup(0.8, K, batch=512) < 1.0
    # longer contexts dilute the verify cost: speculation pays up to a larger batch
    assert GPU.speedup(0.7, K, batch=96, context=8192) > GPU.speedup(0.7, K, batch=96)
    # the 32B target makes the same draft relatively cheap
    assert GPU_32B.speedup(0.8, K, batch=1) > 1.3 * GPU.speedup(0.8, K, batch=1)


def test_the_engine_charges_the_context_it_holds():
    def first_decode(prompt: int, seqs: int = 4) -> float:
        # a budget that prefills every prompt in one step
        budget = 1 << 18
        s = Scheduler(
            speculative=False, k=K, max_num_seqs=32, cost=GPU, max_num_batched_tokens=budget
        )
        for i in range(seqs):
            s.submit(Sequence(_profile(prompt, i), K))
        s.step()  # the prefill step
        return s.step().seconds

    # each sequence has prompt + 1 tokens cached at its first decode step; 4 sequences read
    # at the rate of kv_min_seqs, 32 at their own
    four = first_decode(4001) - first_decode(1)
    assert four == pytest.approx(GPU.kv_min_seqs * 4000 * GPU.kv_per_token_s)
    many = first_decode(4001, 32) - first_decode(1, 32)
    assert many == pytest.approx(32 * 4000 * GPU.kv_per_token_s)
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


def test_the_defaults_say_where_they_were_measured_and_bad_numbers_are_refused():
    assert GPU.source == GPU_H200 and "H200" in GPU.source and "steptime.py" in GPU.source
    assert "32B" in GPU_32B.source and GPU_32B.draft_floor_s == GPU.draft_floor_s
    with pytest.raises(ValueError, match="floor_s"):
        GpuCostModel(floor_s=-1.0)
    with pytest.raises(ValueError, match="knee_tokens"):
        GpuCostModel(knee_tokens=float("nan"))
    with pytest.raises(ValueError, match="draft_kv_min_seqs"):
        GpuCostModel(draft_kv_min_seqs=-2.0)


def test_the_benchmark_fit_loads_and_reproduces_the_measured_table():
    sys.path.insert(0, str(BENCH))
    import stepcurve as sc

    truth = sc.Hinge(7.0, 0.03, 200.0, 5e-5, low_per_token_ms=0.01, kv_min_seqs=16.0)
    draft = sc.Hinge(1.4, 0.006, 256.0, 1.2e-5)
    cells = [
        sc.Cell(
            s.shape,
            s.role,
            s.batch,
            s.q,
            s.context,
            "ok",
            (truth if s.role == "target" else draft).ms(
                s.batch * s.q, s.batch * s.context, s.batch
            ),
        )
        for s in sc.grid("8b", "1b", sc.BATCHES, sc.QUERIES, sc.CONTEXTS)
    ]
    summary = {"cost_model": {**sc.fit_cost_model(cells, "8b", "1b"), "source": "measured: X"}}
    model = GpuCostModel.from_summary(json.loads(json.dumps(summary)))
    assert model.source == "measured: X"
    for batch, q, context in ((1, 1, 512), (16, 5, 2048), (256, 8, 512), (4, 3, 8192)):
        expected = truth.ms(batch * q, batch * context, batch) / 1e3
        got = model.step_seconds(
            verified_tokens=batch * q,
            prefill_tokens=0,
            draft_passes=0,
            drafting_seqs=0,
            context_tokens=batch * context,
            seqs=batch,
        )
        assert got == pytest.approx(expected, rel=1e-3)
    assert model.draft_seconds(64, 64 * 2048) == pytest.approx(
        draft.ms(64, 64 * 2048) / 1e3, rel=1e-3
    )


def test_a_summary_without_a_draft_fit_keeps_the_estimated_draft():
    # the older four-parameter form: a flat floor, the cache at its full rate
    target = {"floor_s": 0.01, "per_token_s": 1e-5, "knee_tokens": 100, "kv_per_token_s": 0}
    model = GpuCostModel.from_summary({"target": target, "source": "measured: Y"})
    assert model.floor_s == 0.01 and model.draft_floor_s == GPU.draft_floor_s
    assert model.low_per_token_s == 0.0 and model.kv_min_seqs == 0.0
    assert "draft: the built-in fit" in model.source
    with pytest.raises(ValueError, match="no fitted 'target'"):
        GpuCostModel.from_summary({"cost_model": {"form": "x"}})
    with pytest.raises(ValueError, match="target has no per_token_s"):
        GpuCostModel.from_summary({"target": {"floor_s": 0.01}})


def test_the_command_line_chooses_the_cost_model(tmp_path):
    parser = build_parser(argparse.ArgumentParser())
    # the default is the measured curve for the served model's size (qwen3-32b: the 32B)
    assert config_from_args(parser.parse_args([])).cost == GPU_32B
    assert config_from_args(parser.parse_args(["--model", "llama-3-8b"])).cost == GPU
    assert config_from_args(parser.parse_args(["--cost-model", "measured"])).cost == GPU_32B
    assert isinstance(
        config_from_args(parser.parse_args(["--cost-model", "affine"])).cost, CostModel
    )
    assert config_from_args(parser.parse_args(["--cost-model", "gpu"])).cost == GPU
    assert config_from_args(parser.parse_args(["--cost-model", "gpu-32b"])).cost == GPU_32B
    target = {"floor_s": 0.02, "per_token_s": 2e-5, "knee_tokens": 50, "kv_per_token_s": 1e-8}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"cost_model": {"target": target, "source": "measured: Z"}}))
    chosen = config_from_args(parser.parse_args(["--cost-model", f"gpu:{path}"])).cost
    assert isinstance(chosen, GpuCostModel) and chosen.floor_s == 0.02
    for bad in ("linear", "affine:x", "gpu-32b:x", f"gpu:{tmp_path / 'missing.json'}"):
        with pytest.raises(argparse.ArgumentTypeError):
            cost_model_arg(bad)
    path.write_text("[1, 2]")
    with pytest.raises(argparse.ArgumentTypeError, match="not a JSON object"):
        cost_model_arg(f"gpu:{path}")


@pytest.mark.parametrize(
    ("name", "curve"),
    [
        ("qwen3-32b", GPU_32B),
        ("Qwen/Qwen3-30B-A3B", GPU_32B),
        ("meta-llama/Llama-3.1-70B-Instruct", GPU_32B),
        ("llama-3-8b", GPU),
        ("qwen2.5-14b", GPU),
        ("qwen3-1.7b", GPU),
        ("mistral", GPU),
    ],
)
def test_the_measured_curve_is_the_one_nearest_the_models_size(name, curve):
    assert measured_for(name) == curve


def test_a_lighter_draft_scales_only_the_drafts_parts():
    light = scaled_draft(GPU_32B, 0.3)
    assert isinstance(light, GpuCostModel)
    assert light.floor_s == GPU_32B.floor_s and light.draft_floor_s == pytest.approx(
        0.3 * GPU_32B.draft_floor_s
    )
    plain = GPU_32B.decode_step_seconds(batch=8, k=3, speculative=False)
    assert light.decode_step_seconds(batch=8, k=3, speculative=False) == plain
    assert light.decode_step_seconds(batch=8, k=3, speculative=True) < (
        GPU_32B.decode_step_seconds(batch=8, k=3, speculative=True)
    )
