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
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DRAFT_KV_SHARE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_STREAM_COST_US,
    Faults,
    Mode,
    SimConfig,
    parse_drift,
)
from backends.sim.dialects import SimEngine
from backends.sim.model import (
    GPU_32B,
    CostModel,
    GpuCostModel,
    Method,
    StepCost,
    measured_for,
)
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
    "the step-time model: measured (the default: the curve measured on one H200 for the "
    "served model's size, gpu-32b for a 32B name such as qwen3-32b, gpu otherwise), gpu (a "
    "memory floor, a slope per token that steepens past a knee, KV reads per cached token: "
    "fitted to an 8B target and a 1B draft measured on one H200), gpu-32b (the same card's "
    "32B target), gpu:PATH (the parameters bench/gpu/steptime.py fitted on another card, "
    "its summary.json) or affine (25 ms + 0.8 ms per verified token)"
)


def cost_model_arg(text: str) -> StepCost | None:
    """``measured``, ``affine``, ``gpu``, ``gpu-32b`` or ``gpu:PATH``, as ``argparse`` type
    (None: ``measured``, resolved by ``cost_for`` once the model is known): a bad value or
    an unreadable summary is a usage error, not a traceback."""
    kind, _, path = text.partition(":")
    if kind == "measured" and not path:
        return None
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
    raise argparse.ArgumentTypeError(f"{text!r}: want measured, affine, gpu, gpu-32b or gpu:PATH")


def cost_for(chosen: StepCost | None, model: str) -> StepCost:
    """The cost model ``cost_model_arg`` chose, or the measured curve for ``model``."""
    return chosen if chosen is not None else measured_for(model)


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
    _memory_options(parser.add_argument_group("KV memory and prefix cache").add_argument)
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
    add(
        "--root",
        help="what /v1/models shows as root, as vLLM shows its --model (a directory or a "
        "Hugging Face id; speclane init reads the model's generation_config.json there, and "
        "its temperature is what a request without one is sampled at) (default: MODEL/target)",
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
    add("--cost-model", type=cost_model_arg, default=None, help=COST_MODEL_HELP)


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


def _memory_options(add: Callable[..., object]) -> None:
    """KV memory, the prefix cache and preemption (``backends/sim/kvcache.py``)."""
    add(
        "--kv-cache-tokens",
        type=int,
        default=None,
        help="KV memory of a standard server on this card, in tokens; a speculative server "
        "with a draft model keeps 1 - --draft-kv-share of it. Short of blocks, requests wait "
        "and the newest running one is preempted (recomputed later). Default: every seat "
        "holds a --max-model-len sequence, so memory never binds",
    )
    add(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        help="KV blocks outright (vLLM's flag); overrides --kv-cache-tokens and the draft's share",
    )
    add("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV block")
    add(
        "--draft-kv-share",
        type=float,
        default=DEFAULT_DRAFT_KV_SHARE,
        help="share of --kv-cache-tokens a draft model's weights and KV take (method "
        "draft_model; about 0.3 for a 0.6B draft beside a 32B target, less for an EAGLE head)",
    )
    add(
        "--no-enable-prefix-caching",
        action="store_false",
        dest="enable_prefix_caching",
        help="no prefix cache: every prompt is prefilled whole (vLLM's flag)",
    )
    add(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage.prompt_tokens_details.cached_tokens on chat and completions, and "
        "cache_read_input_tokens on Messages, when the prompt hit the cache (vLLM's flag; "
        "Responses always report input_tokens_details.cached_tokens)",
    )


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
    models = tuple(args.models or ("qwen3-32b",))
    return SimConfig(
        mode=Mode(args.mode),
        k=args.k,
        method=Method(args.method),
        served_model_names=models,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        stream_cost_s=args.stream_cost_us / 1e6,
        time_scale=args.time_scale,
        zero_latency=args.zero_latency,
        cost=cost_for(args.cost_model, models[0]),
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
        kv_cache_tokens=args.kv_cache_tokens,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        block_size=args.block_size,
        draft_kv_share=args.draft_kv_share,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        root=args.root,
        default_temperature=generation_temperature(args.root),
    )


def generation_temperature(root: str | None) -> float | None:
    """The temperature of ``root``'s ``generation_config.json``, where ``root`` is a
    directory holding one that sets it (vLLM's ``--generation-config auto``)."""
    if not root:
        return None
    try:
        config = json.loads((Path(root) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("temperature") if isinstance(config, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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
