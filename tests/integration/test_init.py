"""``speclane init`` against real simulators on loopback, one per engine shape: it recognises
the engine, whether and how far each endpoint speculates, checks the model and the
per-request metrics, and writes a policy that lints clean and loads. It refuses, and writes
nothing, when an endpoint does not answer, the endpoints share no model, or the file exists."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from backends.sim.config import Method as SimMethod
from backends.sim.config import Mode, SimConfig
from backends.sim.dialects import SimEngine
from backends.sim.server import create_app as sim_app
from gateway.cli.main import main
from policies.compiled import load_policy
from policies.lint import lint
from tests.servers import free_port, serving

pytestmark = pytest.mark.anyio

STANDARD = SimConfig(mode=Mode.STANDARD, time_scale=0.01)
SHAPES = {
    "vllm": (SimConfig(k=4, time_scale=0.01), "vllm", 4, None),
    "vllm-ngram-k3": (SimConfig(k=3, method=SimMethod.NGRAM, time_scale=0.01), "vllm", 3, None),
    "vllm-neuron": (
        SimConfig(k=5, engine=SimEngine.VLLM_NEURON, report_spec_metrics=False, time_scale=0.01),
        "vllm-neuron", 5, None,
    ),
    "sglang": (SimConfig(k=3, engine=SimEngine.SGLANG, time_scale=0.01), "sglang", 3, "eagle"),
    "trtllm": (SimConfig(k=4, engine=SimEngine.TRTLLM, time_scale=0.01), "trtllm", None, None),
}  # fmt: skip


async def init(*args: str) -> int:
    return await asyncio.to_thread(main, ["init", *args])


@pytest.mark.parametrize("shape", SHAPES)
async def test_each_engine_shape_gives_a_policy_that_lints_clean(tmp_path, capsys, shape):
    config, engine, k, method = SHAPES[shape]
    out = tmp_path / "policy.yaml"
    async with serving(sim_app(config)) as spec, serving(sim_app(STANDARD)) as std:
        assert await init("--spec", spec, "--standard", std, "--out", str(out)) == 0
    said = capsys.readouterr().out
    text = out.read_text()
    assert lint(text).problems == ()
    pools = load_policy(text).pools
    assert (pools["spec"].engine.value, pools["standard"].engine.value) == (engine, "vllm")
    assert pools["spec"].num_speculative_tokens == (k or 4)
    assert (pools["spec"].method.value if pools["spec"].method else None) == method
    assert pools["spec"].endpoints == [spec] and pools["standard"].endpoints == [std]
    assert f"{spec} (spec): {engine}, speculative" in said
    assert f"{std} (standard): vllm, standard" in said
    assert f"wrote {out} (it lints clean); next: speclane serve --policy {out}" in said
    if k is None:  # TensorRT-LLM does not show its k: written, and marked to decide
        assert "num_speculative_tokens: 4  # DECIDE" in text
        assert "decide: num_speculative_tokens of pool spec" in said
    assert "check:" not in said  # every shape here reports per request where it can


async def test_the_starter_rules_and_what_is_left_to_decide(tmp_path, capsys):
    out = tmp_path / "policy.yaml"
    spec_sim, std_sim = sim_app(SimConfig(time_scale=0.01)), sim_app(STANDARD)
    async with serving(spec_sim) as spec, serving(std_sim) as std:
        assert await init("--spec", spec, "--standard", std, "--out", str(out)) == 0
    raw = yaml.safe_load(out.read_text())
    starts = {rule["name"]: rule["start"] for rule in raw["rules"]}
    assert starts == {
        "structured-json": "spec",
        "tool-calls": "spec",
        "code": "spec",
        "long-context": "standard",
        "creative": "shadow",
        "default": "spec",
    }
    assert raw["ladder"] == ["spec", "standard"]
    assert out.read_text().count("# cost_per_hour: 0.0  # DECIDE") == 2
    assert "decide: cost_per_hour of each pool" in capsys.readouterr().out


async def test_missing_per_request_metrics_are_named_with_the_flag(tmp_path, capsys):
    config = SimConfig(per_request_metrics=False, time_scale=0.01)
    async with serving(sim_app(config)) as spec, serving(sim_app(STANDARD)) as std:
        args = ["--spec", spec, "--standard", std, "--out", str(tmp_path / "p.yaml")]
        assert await init(*args) == 0
        assert await init(*args, "--force", "--no-probe") == 0
    probed, unprobed = capsys.readouterr().out.split("model: ")[1:]
    assert f"check: {spec}: answers carry no metrics.speculative_decoding: start vLLM with " in (
        probed
    )
    assert "--per-request-spec-decode-metrics summary" in probed
    assert f"check: {spec}: per-request metrics not checked (no probe)" in unprobed


async def test_several_speculative_pools_stand_on_the_ladder_by_k(tmp_path):
    out = tmp_path / "policy.yaml"
    async with (
        serving(sim_app(SimConfig(k=3, time_scale=0.01))) as k3,
        serving(sim_app(SimConfig(k=7, time_scale=0.01))) as k7a,
        serving(sim_app(SimConfig(k=7, seed=1, time_scale=0.01))) as k7b,
        serving(sim_app(STANDARD)) as std,
    ):
        spec = ["--spec", k3, "--spec", k7a, "--spec", k7b]
        assert await init(*spec, "--standard", std, "--out", str(out)) == 0
    policy = load_policy(out.read_text())
    assert policy.ladders["qwen3-32b"].pools == ("spec-k7", "spec-k3", "standard")
    assert policy.pools["spec-k7"].endpoints == [k7a, k7b]
    assert {r.name: r.rule.start for r in policy.rules}["default"] == "spec-k3"


async def test_an_endpoint_that_does_not_answer_is_named_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "policy.yaml"
    dead = f"http://127.0.0.1:{free_port()}"
    async with serving(sim_app(STANDARD)) as std:
        assert await init("--spec", dead, "--standard", std, "--out", str(out)) == 1
    assert capsys.readouterr().err == f"speclane init: cannot reach {dead}: cannot connect " + (
        "(All connection attempts failed)\n"
    )
    assert not out.exists()


async def test_endpoints_without_a_common_model_or_an_existing_file_are_refused(tmp_path, capsys):
    out = tmp_path / "policy.yaml"
    other = SimConfig(served_model_names=("llama-3-8b",), time_scale=0.01)
    async with serving(sim_app(other)) as spec, serving(sim_app(STANDARD)) as std:
        assert await init("--spec", spec, "--standard", std, "--out", str(out)) == 1
        err = capsys.readouterr().err
        assert "the endpoints serve no model in common" in err
        assert f"{spec} serves llama-3-8b" in err and f"{std} serves qwen3-32b" in err
        out.write_text("# mine\n")
        assert await init("--spec", std, "--standard", std, "--out", str(out)) == 1
    assert out.read_text() == "# mine\n"
    assert capsys.readouterr().err == f"speclane init: {out} exists; --force overwrites it\n"


async def test_a_standard_endpoint_that_speculates_is_flagged(tmp_path, capsys):
    async with serving(sim_app(SimConfig(time_scale=0.01))) as spec:
        out = str(tmp_path / "p.yaml")
        assert await init("--spec", spec, "--standard", spec, "--out", out) == 0
    assert f"check: {spec} was given as standard but speculates" in capsys.readouterr().out
