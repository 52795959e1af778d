"""``speclane local-vllm`` without vLLM: the state file, the policy it writes, the builder's
cache key, and the sub-commands' answers when no stack runs. (The real stack is exercised by
the ``vllm`` tier, ``make test-vllm``.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gateway.cli.localvllm import models, servers
from gateway.cli.localvllm.stackfile import StackState, policy_text
from gateway.cli.main import main
from policies.lint import lint


def state(*names: str) -> StackState:
    running = [
        servers.Server(n, servers.KINDS[n].k, 1000 + i, 8000 + i, i % 2, f"/logs/{n}.log")
        for i, n in enumerate(names)
    ]
    return StackState("tiny", "/venv", "/m/target", "/m/draft", "/run/policy.yaml", running)


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    saved = state("standard", "ngram", "draft")
    saved.save(tmp_path)
    assert StackState.load(tmp_path) == saved
    assert StackState.load(tmp_path / "nothing") is None
    (tmp_path / "state.json").write_text("{broken")
    assert StackState.load(tmp_path) is None


@pytest.mark.parametrize("names", [("standard", "ngram", "draft"), ("standard", "draft")])
def test_the_written_policy_lints_clean_and_routes_by_endpoint(names: tuple[str, ...]) -> None:
    text = policy_text(state(*names))
    report = lint(text, "policy.yaml")
    assert not report.errors, report.errors
    speculative = [n for n in names if n != "standard"]
    assert f"ladder: [{', '.join([*speculative, 'standard'])}]" in text
    for name in names:
        assert f"match: {{endpoint: [{name}]}}, start: {name}" in text


def test_server_flags() -> None:
    pair = models.Models(Path("/m"))
    assert servers.KINDS["standard"].flags(pair) == []
    ngram = servers.KINDS["ngram"].flags(pair)
    assert '"method": "ngram"' in ngram[1] and '"num_speculative_tokens": 4' in ngram[1]
    assert ngram[2:] == [
        "--enable-per-request-metrics",
        "--per-request-spec-decode-metrics",
        "summary",
    ]
    assert '"model": "/m/draft"' in servers.KINDS["draft"].flags(pair)[1]
    env = servers.server_env({"PATH": "/bin"}, 1)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["PATH"] == "/bin"
    assert env["VLLM_ENABLE_RESPONSES_API_STORE"] == "1"


def test_the_model_cache_key_follows_the_parameters(tmp_path: Path) -> None:
    python = Path(sys.executable)
    one = models.models_path(tmp_path, python, models.ModelParams())
    assert one == models.models_path(tmp_path, python, models.ModelParams())
    assert one != models.models_path(tmp_path, python, models.ModelParams(seed=1))
    assert models.ModelParams(train_steps=5).argv()[1] == "--train-steps=5"


def test_a_pid_that_runs_something_else_is_never_stopped() -> None:
    gone = servers.Server("ngram", 4, os.getpid(), 1, 0, "")
    assert not servers.is_vllm(os.getpid())
    assert servers.stop(gone) == "not running"


def test_commands_without_a_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local-vllm", "status", "--run-dir", str(tmp_path)]) == 3
    assert main(["local-vllm", "down", "--run-dir", str(tmp_path)]) == 0
    assert main(["local-vllm", "record", "--run-dir", str(tmp_path), "--out", "x"]) == 3
    assert main(["local-vllm", "up", "--run-dir", str(tmp_path), "--servers", "ngram"]) == 2
    assert "standard included" in capsys.readouterr().err


def test_the_run_directory_follows_the_cache_directory(tmp_path: Path) -> None:
    assert main(["local-vllm", "status", "--cache-dir", str(tmp_path)]) == 3
    state("standard").save(tmp_path)
    (tmp_path / "local-vllm").mkdir()
    state("standard", "ngram").save(tmp_path / "local-vllm")
    assert main(["local-vllm", "down", "--cache-dir", str(tmp_path)]) == 0
    assert not (tmp_path / "local-vllm" / "state.json").exists()
    assert (tmp_path / "state.json").exists()
