"""The ``sim`` sub-command: run a simulated vLLM server from the command line.

``add_parser(subparsers)`` adds ``sim`` to the ``speclane`` console script's parser;
``run(args)`` serves it with uvicorn (uvloop, httptools, log level warning) and returns the
exit code. ``python -m backends.sim`` uses the same two functions.

Must not: read the environment; the command line is the only input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from backends.sim.config import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_STREAM_COST_US,
    Faults,
    Mode,
    SimConfig,
    parse_drift,
)
from backends.sim.dialects import SimEngine
from backends.sim.model import GPU_32B, CostModel, GpuCostModel, Method, StepCost
from backends.sim.server import create_app, uvicorn_config

logger = logging.getLogger(__name__)

_HELP = "run a simulated vLLM server (speculative or standard decoding)"


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default (flags that are off say nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        off = action.default is None or action.default is False or action.default == ""
        if off or isinstance(action, argparse._StoreFalseAction):
            return action.help
        return super()._get_help_string(action)


COST_MODEL_HELP = (
    "the step-time model: affine (25 ms + 0.8 ms per verified token, the default), gpu (a "
    "memory floor, a slope per token that steepens past a knee, KV reads per cached token: "
    "fitted to an 8B target and a 1B draft measured on one H200), gpu-32b (the same card's "
    "32B target) or gpu:PATH (the parameters bench/gpu/steptime.py fitted on another card, "
    "its summary.json)"
)


def cost_model_arg(text: str) -> StepCost:
    """``affine``, ``gpu``, ``gpu-32b`` or ``gpu:PATH``, as ``argparse`` type: a bad value or
    an unreadable summary is a usage error, not a traceback."""
    kind, _, path = text.partition(":")
    if kind == "affine" and not path:
        return CostModel()
    if kind == "gpu" and not path:
        return GpuCostModel()
    if kind == "gpu-32b" and not path:
        return GPU_32B
    if kind == "gpu":
        try:
            summary = json.loads(Path(path).read_text())
            if not isinstance(summary, dict):
                raise ValueError("not a JSON object")
            return GpuCostModel.from_summary(summary)
        except (OSError, ValueError) as exc:
            raise argparse.ArgumentTypeError(
                f"cannot read a GPU cost model from {path}: {exc}"
            ) from None
    raise argparse.ArgumentTypeError(f"{text!r}: want affine, gpu, gpu-32b or gpu:PATH")


def _fault_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("faults (chance per request)")
    group.add_argument("--error-rate", type=float, default=0.0, help="answer 500 before any byte")
    group.add_argument("--spike-rate", type=float, default=0.0, help="delay the first byte")
    group.add_argument("--spike-s", type=float, default=1.0, help="length of a spike (seconds)")
    group.add_argument("--die-rate", type=float, default=0.0, help="drop a stream mid-way")
    group.add_argument("--die-after-chunks", type=int, default=3, help="chunks before a drop")
    group.add_argument("--stall-rate", type=float, default=0.0, help="go silent mid-stream")
    group.add_argument("--hang-rate", type=float, default=0.0, help="never answer")
    group.add_argument("--overloaded", action="store_true", help="answer every request 503")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sim`` sub-command to ``subparsers`` (from ``add_subparsers()``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help=_HELP, description=_HELP, formatter_class=_Defaults
    )
    build_parser(parser)
    return parser


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Put every ``sim`` option on ``parser`` and make ``run`` its handler."""
    _model_options(parser.add_argument)
    _server_options(parser.add_argument)
    _fault_options(parser)
    parser.set_defaults(handler=run)
    return parser


def _model_options(add: Callable[..., object]) -> None:
    """What is simulated: decoding, proposer, models, scheduling, time and cost."""
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=8101, help="port to listen on")
    add(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.SPECULATIVE.value,
        help="speculative or standard decoding",
    )
    add("--k", type=int, default=4, help="num_speculative_tokens (speculative mode)")
    add(
        "--method",
        choices=[m.value for m in Method],
        default=Method.DRAFT_MODEL.value,
        help="proposer: a draft model drafts k every step; ngram only where the context "
        "repeats, and a step without a match drafts nothing",
    )
    add(
        "--model",
        action="append",
        dest="models",
        help="served model name (repeatable; default: qwen3-32b)",
    )
    add("--seed", type=int, default=0, help="seed of the simulated answers and acceptance")
    add("--max-num-seqs", type=int, default=256, help="sequences in one batch, like vLLM's")
    add(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="tokens one engine step may schedule (decodes first, then prefill chunks); "
        "vLLM's default for its API server on an H100-class card",
    )
    add(
        "--stream-cost-us",
        type=float,
        default=DEFAULT_STREAM_COST_US,
        help="the API server's output processing per request and step (model microseconds; "
        "the default is what vLLM's took on one CPU core): a request's step outputs merge "
        "into one SSE chunk when its step's requests need more than the step lasts; 0 never "
        "merges",
    )
    add("--time-scale", type=float, default=1.0, help="multiplies every simulated duration")
    add("--zero-latency", action="store_true", help="answer at once (overhead benchmarks)")
    add(
        "--drift",
        default="",
        help="e.g. code@60=0.1,code@120=0.82 (workload@model seconds=acceptance)",
    )
    add("--cost-model", type=cost_model_arg, default=CostModel(), help=COST_MODEL_HELP)


def _server_options(add: Callable[..., object]) -> None:
    """What the server reports and the engine it plays, and its request limits."""
    add("--no-spec-metrics", action="store_true", help="report no draft tokens (vllm-neuron)")
    add(
        "--no-per-request-metrics",
        action="store_true",
        help="counters only, like vLLM without --per-request-spec-decode-metrics",
    )
    add(
        "--enable-per-request-metrics",
        action="store_true",
        dest="timing_metrics",
        help="TTFT, decode time and inter-token latency in every answer's metrics",
    )
    add("--stream-interval", type=int, default=1, help="tokens held back per SSE chunk")
    add(
        "--engine",
        choices=[e.value for e in SimEngine],
        default=SimEngine.VLLM.value,
        help="the server to play: vllm, vllm-neuron (no drafts counted, nothing per request), "
        "sglang or trtllm (their stream shapes and metrics pages)",
    )
    add(
        "--acceptance-rate-threshold",
        type=float,
        default=None,
        help="trtllm: turn speculation off for good when the rolling draft acceptance of the "
        "last --acceptance-rate-window-size finished requests falls below this",
    )
    add(
        "--acceptance-rate-window-size",
        type=int,
        default=0,
        help="trtllm: finished requests the threshold above looks at",
    )
    add(
        "--no-prometheus",
        action="store_false",
        dest="prometheus",
        help="trtllm: no /prometheus/metrics (a server without return_perf_metrics)",
    )
    add("--default-max-tokens", type=int, default=256, help="max_tokens when a request has none")
    add("--max-model-len", type=int, default=32768, help="prompt plus answer, in tokens")
    add("--max-logprobs", type=int, default=20, help="the most top_logprobs a request may ask")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    faults = Faults(
        error_rate=args.error_rate,
        spike_rate=args.spike_rate,
        spike_s=args.spike_s,
        die_rate=args.die_rate,
        die_after_chunks=args.die_after_chunks,
        stall_rate=args.stall_rate,
        hang_rate=args.hang_rate,
        overloaded=args.overloaded,
    )
    return SimConfig(
        mode=Mode(args.mode),
        k=args.k,
        method=Method(args.method),
        served_model_names=tuple(args.models or ("qwen3-32b",)),
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        stream_cost_s=args.stream_cost_us / 1e6,
        time_scale=args.time_scale,
        zero_latency=args.zero_latency,
        cost=args.cost_model,
        drift=parse_drift(args.drift),
        faults=faults,
        report_spec_metrics=not args.no_spec_metrics,
        per_request_metrics=not args.no_per_request_metrics,
        timing_metrics=args.timing_metrics,
        stream_interval=args.stream_interval,
        default_max_tokens=args.default_max_tokens,
        max_model_len=args.max_model_len,
        max_logprobs=args.max_logprobs,
        engine=SimEngine(args.engine),
        acceptance_rate_threshold=args.acceptance_rate_threshold,
        acceptance_rate_window_size=args.acceptance_rate_window_size,
        prometheus=args.prometheus,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 for a bad configuration, else 0."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        logger.error("bad sim configuration: %s", exc)
        return 2
    where = f"http://{args.host}:{args.port}"
    sys.stderr.write(f"speclane sim: serving {describe(config, where)}\n")
    sys.stderr.flush()
    server = uvicorn.Server(uvicorn_config(create_app(config), args.host, args.port, loop="uvloop"))
    server.run()
    return 0


def describe(config: SimConfig, where: str) -> str:
    """One line: what it serves, where, the engine played and how it decodes."""
    if config.mode is Mode.SPECULATIVE:
        decoding = f"speculative decoding: {config.method.value}, k={config.k}"
    else:
        decoding = "standard decoding"
    models = ", ".join(config.served_model_names)
    scale = f", time scale {config.time_scale:g}" if config.time_scale != 1 else ""
    return f"{models} on {where} (simulated {config.engine.value}, {decoding}{scale})"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(
        argparse.ArgumentParser(prog="python -m backends.sim", formatter_class=_Defaults)
    )
    return run(parser.parse_args(argv))
