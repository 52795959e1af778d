"""``speclane init`` against real simulators on loopback, one per engine shape: it recognises
the engine, whether and how far each endpoint speculates, checks the model and the
per-request metrics, and writes a policy that lints clean and loads. It refuses, and writes
nothing, when an endpoint does not answer, the endpoints share no model, or the file exists."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from backends.sim.config import Method as SimMethod
from backends.sim.config import Mode, SimConfig
from backends.sim.dialects import SimEngine
from backends.sim.server import create_app as sim_app
from gateway.cli.main import main
from policies.compiled import load_policy
from policies.lint import lint
from policies.model import Bands, Guardrail
from tests.servers import serving

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


async def test_an_endpoint_that_does_not_answer_is_named_and_nothing_is_written(
    tmp_path, capsys, closed_port
):
    out = tmp_path / "policy.yaml"
    dead = f"http://127.0.0.1:{closed_port()}"
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


async def test_a_standard_endpoint_that_speculates_is_refused(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    async with serving(sim_app(SimConfig(time_scale=0.01))) as spec:
        assert await init("--spec", spec, "--standard", spec, "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert f"speclane init: {spec} was given as --standard but speculates\n" in err
    assert "give each its own role" in err and not out.exists()


async def test_swapped_roles_are_refused_with_the_command_the_right_way_round(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    async with (
        serving(sim_app(SimConfig(time_scale=0.01))) as spec,
        serving(sim_app(STANDARD)) as std,
    ):
        assert await init("--spec", std, "--standard", spec, "--out", str(out)) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"speclane init: {std} was given as --spec but does not speculate\n"
        f"speclane init: {spec} was given as --standard but speculates\n"
        "speclane init: nothing written; the endpoints the way round their pages say (with "
        f"your other options): speclane init --spec {spec} --standard {std}\n"
    )
    assert not out.exists() and "lints clean" not in captured.out


HELLO = {"model": "qwen3-32b", "messages": [{"role": "user", "content": "Hello"}]}


def explained(policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    request = tmp_path / "hello.json"
    request.write_text(json.dumps(HELLO))
    capsys.readouterr()
    assert main(["policy", "explain", str(policy), str(request), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


async def test_the_models_default_temperature_is_read_from_its_generation_config(tmp_path, capsys):
    """vLLM applies the model's generation_config.json to a request without temperature;
    init finds the file where /v1/models' root leads, writes its temperature, and the
    README's "Hello" (no temperature) is then read at 0.6: not creative."""
    model = tmp_path / "Qwen3"
    model.mkdir()
    (model / "generation_config.json").write_text('{"temperature": 0.6, "top_p": 0.95}')
    out = tmp_path / "policy.yaml"
    spec_sim = sim_app(SimConfig(time_scale=0.01, root=str(model)))
    async with serving(spec_sim) as spec, serving(sim_app(STANDARD)) as std:
        assert await init("--spec", spec, "--standard", std, "--out", str(out)) == 0
    said = capsys.readouterr().out
    text = out.read_text()
    assert lint(text).problems == ()
    assert yaml.safe_load(text)["defaults"] == {"temperature": 0.6, "top_p": 0.95}
    assert f"  # source: {model / 'generation_config.json'}\n" in text
    assert "decide: defaults.temperature" not in said
    answer = explained(out, tmp_path, capsys)
    assert answer["rule"] == "default" and answer["features"]["temperature"] == 0.6
    assert answer["reason"].endswith(
        "; temperature 0.6 assumed (not in the request: the served model's default)"
    )


async def test_without_the_file_the_temperature_is_given_or_marked_to_decide(tmp_path, capsys):
    out = tmp_path / "policy.yaml"
    async with (
        serving(sim_app(SimConfig(time_scale=0.01))) as spec,
        serving(sim_app(STANDARD)) as std,
    ):
        args = ["--spec", spec, "--standard", std, "--out", str(out)]
        assert await init(*args) == 0  # stdin is not a terminal here: nobody to ask
        unknown = out.read_text()
        said = capsys.readouterr().out
        assert await init(*args, "--force", "--default-temperature", "0.7") == 0
        given = out.read_text()
        assert await asyncio.to_thread(
            _exits, ["init", *args, "--force", "--default-temperature", "3"]
        )
    assert "  temperature: 1  # DECIDE" in unknown and lint(unknown).problems == ()
    # where it was looked for, then why 1, as one sentence: "from" led every line of it
    assert (
        "  # source: qwen3-32b/target/generation_config.json was not found here; 1 is vLLM's own\n"
        "  #   default\n  temperature: 1"
    ) in unknown
    assert "decide: defaults.temperature: the temperature qwen3-32b samples at" in said
    assert yaml.safe_load(given)["defaults"] == {"temperature": 0.7}
    assert "  # source: --default-temperature\n" in given
    assert "3: a temperature is 0 to 2" in capsys.readouterr().err


def _exits(argv: list[str]) -> bool:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    return stopped.value.code == 2


async def test_the_default_bands_and_guardrail_are_written_commented(tmp_path):
    """The bands the slice header shows can be found in the file: uncommented, they are the
    defaults and lint clean."""
    out = tmp_path / "policy.yaml"
    async with (
        serving(sim_app(SimConfig(time_scale=0.01))) as spec,
        serving(sim_app(STANDARD)) as std,
    ):
        assert await init("--spec", spec, "--standard", std, "--out", str(out)) == 0
    text = out.read_text()
    assert "# slices:" in text and "#   temperature: [0.3, 0.9]" in text
    assert "# guardrail:" in text and "#   mode: economic" in text
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("# slices:")))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#"))
    opened = "\n".join(lines[:start] + [line[2:] for line in lines[start:end]] + lines[end:])
    raw = yaml.safe_load(opened)
    assert raw["slices"] == Bands().model_dump() and raw["guardrail"]["min_acceptance"] == 0.55
    assert lint(opened).problems == ()
    assert load_policy(opened).file.guardrail == Guardrail()


def _answered_on_a_terminal(argv: list[str], answer: str) -> tuple[int, str]:
    """Run ``speclane init`` with a terminal as its stdin, answering its question."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "init", *argv],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,  # the question is asked on the terminal
        text=True,
    )
    os.close(follower)
    asked = b""
    deadline = time.monotonic() + 60
    try:
        while b"]: " not in asked:  # the question ends with its default in brackets
            assert time.monotonic() < deadline and process.poll() is None, asked
            if select.select([leader], [], [], 1)[0]:
                asked += os.read(leader, 1024)
        os.write(leader, answer.encode() + b"\n")
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        os.close(leader)
    return process.returncode, asked.decode() + out


async def test_on_a_terminal_init_asks_the_models_temperature(tmp_path):
    out = tmp_path / "policy.yaml"
    async with (
        serving(sim_app(SimConfig(time_scale=0.01))) as spec,
        serving(sim_app(STANDARD)) as std,
    ):
        args = ["--spec", spec, "--standard", std, "--out", str(out)]
        code, said = await asyncio.to_thread(_answered_on_a_terminal, args, "0.7")
    assert code == 0, said
    assert "The model's default temperature (qwen3-32b/target)" in said
    assert yaml.safe_load(out.read_text())["defaults"] == {"temperature": 0.7}
    assert "  # source: the operator's answer to speclane init\n" in out.read_text()
