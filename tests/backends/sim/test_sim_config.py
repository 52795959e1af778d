from __future__ import annotations

import argparse

import pytest

from backends.sim.cli import add_parser, build_parser, config_from_args, run
from backends.sim.config import Faults, Mode, SimConfig, parse_drift
from backends.sim.model import GPU_32B, DriftPoint, Method
from backends.sim.workload import Workload


def test_parse_drift() -> None:
    assert parse_drift("code@60=0.1, code@120=0.82,") == (
        DriftPoint(Workload.CODE, 60.0, 0.1),
        DriftPoint(Workload.CODE, 120.0, 0.82),
    )
    assert parse_drift("") == ()


@pytest.mark.parametrize("bad", ["code=0.1", "nope@1=0.1", "code@1=2", "code@-1=0.5", "code@x=1"])
def test_parse_drift_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="bad drift entry"):
        parse_drift(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 0},
        {"served_model_names": ()},
        {"max_num_seqs": 0},
        {"stream_interval": 0},
        {"time_scale": -1.0},
        {"max_num_batched_tokens": 255},  # vLLM: at least one token per seat
        {"max_num_seqs": 1, "max_num_batched_tokens": 1},  # and one beside the draft's slot
        {"stream_cost_s": -1e-6},
    ],
)
def test_config_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SimConfig(**kwargs)  # type: ignore[arg-type]


def test_faults_validation() -> None:
    with pytest.raises(ValueError):
        Faults(error_rate=1.5)
    with pytest.raises(ValueError):
        Faults(spike_s=-1)


def test_config_flags() -> None:
    assert SimConfig().reports_spec
    assert not SimConfig(report_spec_metrics=False).reports_spec
    assert not SimConfig(mode=Mode.STANDARD).reports_spec


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speclane")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["sim", *argv])


def test_cli_builds_the_config() -> None:
    args = _parse(
        [
            "--mode",
            "standard",
            "--k",
            "7",
            "--model",
            "a",
            "--model",
            "b",
            "--seed",
            "3",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "2048",
            "--stream-cost-us",
            "350",
            "--time-scale",
            "0.1",
            "--zero-latency",
            "--drift",
            "code@5=0.2",
            "--error-rate",
            "0.1",
            "--die-rate",
            "0.2",
            "--no-spec-metrics",
            "--stream-interval",
            "2",
            "--method",
            "ngram",
            "--enable-per-request-metrics",
            "--max-logprobs",
            "5",
            "--port",
            "9000",
        ]
    )
    assert args.handler is run and args.port == 9000 and args.host == "127.0.0.1"
    config = config_from_args(args)
    assert config.mode is Mode.STANDARD and config.k == 7
    assert config.served_model_names == ("a", "b") and config.seed == 3
    assert config.max_num_seqs == 16 and config.time_scale == 0.1 and config.zero_latency
    assert config.max_num_batched_tokens == 2048 and config.stream_cost_s == pytest.approx(350e-6)
    assert config.drift == (DriftPoint(Workload.CODE, 5.0, 0.2),)
    assert config.faults.error_rate == 0.1 and config.faults.die_rate == 0.2
    assert not config.report_spec_metrics and config.stream_interval == 2
    assert config.method is Method.NGRAM and config.timing_metrics and config.max_logprobs == 5


def test_cli_defaults_and_bad_config_exit_code() -> None:
    config = config_from_args(_parse([]))
    # the command line's step-time model is the curve measured for its model's size
    # (qwen3-32b: the 32B); a SimConfig built in code keeps the affine one
    assert config == SimConfig(cost=GPU_32B)
    args = build_parser(argparse.ArgumentParser()).parse_args(["--k", "0"])
    assert run(args) == 2
    tight = ["--max-num-seqs", "64", "--max-num-batched-tokens", "63"]
    assert run(build_parser(argparse.ArgumentParser()).parse_args(tight)) == 2
