"""``speclane sim`` from the command line: its help shows the defaults, and it says what it
serves, and where, when it starts."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from backends.sim.cli import build_parser, config_from_args, run
from gateway.cli.main import main
from tests.servers import free_port


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for shown in ("(default: 8101)", "(default: speculative)", "(default: 4)", "(default: vllm)"):
        assert shown in text
    assert "--zero-latency answer at once (overhead benchmarks) --drift" in text  # off: no default


def test_it_says_what_it_serves_when_it_starts() -> None:
    port = free_port()
    argv = ["sim", "--port", str(port), "--model", "tiny", "--k", "3", "--time-scale", "0.5"]
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", *argv], stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line == (
            f"speclane sim: serving tiny on http://127.0.0.1:{port} "
            "(simulated vllm, speculative decoding: draft_model, k=3, time scale 0.5)\n"
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.stderr is not None
        process.stderr.close()


def test_memory_flags_reach_the_config() -> None:
    parser = build_parser(argparse.ArgumentParser())
    args = parser.parse_args(
        ["--kv-cache-tokens", "100000", "--draft-kv-share", "0.25", "--block-size", "32"]
        + ["--no-enable-prefix-caching", "--enable-prompt-tokens-details"]
    )
    config = config_from_args(args)
    assert config.kv_blocks == 75_000 // 32
    assert not config.enable_prefix_caching and config.enable_prompt_tokens_details
    defaults = config_from_args(parser.parse_args([]))
    assert defaults.enable_prefix_caching and not defaults.enable_prompt_tokens_details


def test_a_kv_cache_too_small_for_one_sequence_is_a_bad_configuration() -> None:
    args = build_parser(argparse.ArgumentParser()).parse_args(["--kv-cache-tokens", "1000"])
    assert run(args) == 2


def test_help_names_the_cost_model_and_root(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "measured (the default: the curve measured on one H200" in text
    assert "CostModel(" not in text
    assert "--root ROOT" in text


def test_root_s_generation_config_sets_the_default_temperature(tmp_path) -> None:
    import argparse

    from backends.sim.cli import build_parser, config_from_args

    (tmp_path / "generation_config.json").write_text('{"temperature": 0.6, "top_p": 0.95}')
    parser = build_parser(argparse.ArgumentParser())
    config = config_from_args(parser.parse_args(["--root", str(tmp_path)]))
    assert (config.root, config.default_temperature) == (str(tmp_path), 0.6)
    plain = config_from_args(parser.parse_args(["--root", "Qwen/Qwen3-8B"]))
    assert (plain.root, plain.default_temperature) == ("Qwen/Qwen3-8B", None)
