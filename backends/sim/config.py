"""Settings of one simulated vLLM server, as a frozen value.

Built by the CLI, by tests, or by the gateway's demo; read by the server, the real-time
engine and the virtual-time simulator. Must not read the environment or files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from backends.sim.dialects import SimEngine
from backends.sim.model import AcceptanceModel, CostModel, DriftPoint, Method, StepCost
from backends.sim.workload import Workload

# vLLM's --max-num-batched-tokens for its OpenAI server on a card of 70 GiB or more other than
# an A100 (H100, H200, MI300X: the cards a 32B target fits on alone); 2048 on smaller cards
# and CPUs (vllm/engine/arg_utils.py, EngineArgs._set_default_args).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# The API server's output processing per request and engine step, in microseconds (see
# SimConfig): vLLM 0.32's API server process spent a median 208 us of CPU per streamed chat
# output (148-252 us over 9 rounds) on this project's 2-core machine (bench/RESULTS.md,
# "vLLM's output processing"; bench/vllm_stream_cost.py).
DEFAULT_STREAM_COST_US = 200.0
# vLLM's block size on GPUs (--block-size): tokens per KV block and per prefix-cache hash.
DEFAULT_BLOCK_SIZE = 16
# The share of a card's KV memory that a draft model takes on a speculative server (its
# weights and its own KV for every token): a small draft such as an EAGLE head or a ~1B model
# beside a 32B target. A separate 0.6B draft model beside Qwen3-32B keeps about 0.44 KV
# bytes per token for each of the target's (28 against 64 layers, both 8 KV heads of 128):
# a share near 0.3. An n-gram proposer takes none.
DEFAULT_DRAFT_KV_SHARE = 0.1


class Mode(StrEnum):
    """How the simulated server decodes."""

    SPECULATIVE = "speculative"
    STANDARD = "standard"


@dataclass(frozen=True, slots=True)
class Faults:
    """Failure injection; every rate is the chance per request, decided when it arrives.

    ``error_rate``: answer 500 before the first byte. ``spike_rate`` / ``spike_s``: wait
    ``spike_s`` (scaled by ``time_scale``) before the first byte. ``die_rate`` /
    ``die_after_chunks``: a streamed answer's connection drops after that many SSE chunks,
    with no ``[DONE]``, a whole answer's halfway through its body. ``stall_rate``: a
    streamed answer goes silent after ``die_after_chunks`` chunks, a whole one halfway
    through its body, the connection open. ``hang_rate``: no answer at all until
    the client gives up. ``overloaded``: every request gets 503. ``greedy_mismatch``: the
    fraction of greedy (temperature 0) answers whose text diverges from a standard server's.
    ``broken_structure``: the fraction of structured answers (JSON output, tool calls) whose
    closing brace never comes, as from a server whose guided decoding misbehaves.
    Each server draws from its own generator seeded by its ``seed``: give servers different
    seeds for independent faults.
    """

    error_rate: float = 0.0
    spike_rate: float = 0.0
    spike_s: float = 1.0
    die_rate: float = 0.0
    die_after_chunks: int = 3
    stall_rate: float = 0.0
    hang_rate: float = 0.0
    overloaded: bool = False
    greedy_mismatch: float = 0.0
    broken_structure: float = 0.0

    def __post_init__(self) -> None:
        rates = ("error_rate", "spike_rate", "die_rate", "stall_rate", "hang_rate")
        for name in (*rates, "greedy_mismatch", "broken_structure"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.spike_s < 0 or self.die_after_chunks < 0:
            raise ValueError("spike_s and die_after_chunks must not be negative")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated server. ``k`` is ``num_speculative_tokens``; times are model seconds
    that ``time_scale`` multiplies into wall seconds (``zero_latency`` skips all waiting).

    ``drift`` times are seconds of model time since the server started: wall seconds divided
    by ``time_scale`` for the HTTP server, virtual seconds for ``backends/sim/virtual.py``.
    ``report_spec_metrics=False`` emulates vllm-neuron: no per-request
    ``speculative_decoding`` and draft counters that stay at 0.
    ``per_request_metrics=False`` emulates vLLM started without
    ``--per-request-spec-decode-metrics``: counters on /metrics, nothing per request.
    ``timing_metrics`` emulates ``--enable-per-request-metrics``: TTFT, decode time, queue
    time, mean inter-token latency and tokens per second in the answer's ``metrics``.
    ``stream_interval`` > 1 holds tokens back until that many are ready, as vLLM's flag
    does (the first token and the last chunk always go at once). ``method`` is the proposer
    (``backends/sim/engine.py``); ``max_logprobs`` is vLLM's ``--max-logprobs``.

    ``max_num_batched_tokens`` is vLLM's per-step token budget: decodes first, prefill
    chunks in what is left, so long prompts are prefilled over several steps.
    ``stream_cost_s`` is the API server's output processing per request and step: when a
    step's requests need more of it than the step lasts, each request's consecutive step
    outputs reach it as one chunk (0 turns merging off; ``backends/sim/engine.py``).

    ``engine`` is the server it plays (``backends/sim/dialects.py``): ``vllm-neuron`` reports
    nothing per request and counts no drafts (a fused step); ``sglang`` and ``trtllm``
    answer in their shapes and show their own pages (``backends/sim/engine_pages.py``).
    TensorRT-LLM's gate: once ``acceptance_rate_window_size`` requests have finished, a
    rolling draft acceptance below ``acceptance_rate_threshold`` turns speculation off for
    good. ``prometheus=False`` is a TensorRT-LLM server without ``/prometheus/metrics``.
    ``root`` is what ``/v1/models`` shows as each card's ``root``, as vLLM shows its
    ``--model`` (a directory or a Hugging Face id): ``speclane init`` reads the model's
    ``generation_config.json`` from there (default: ``<first name>/target``). Its
    temperature, as ``default_temperature``, is what a request without one is sampled at,
    as vLLM's ``--generation-config auto`` does (None: 1.0).
    """

    mode: Mode = Mode.SPECULATIVE
    k: int = 4
    served_model_names: tuple[str, ...] = ("qwen3-32b",)
    seed: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    stream_cost_s: float = DEFAULT_STREAM_COST_US / 1e6
    time_scale: float = 1.0
    zero_latency: bool = False
    cost: StepCost = field(default_factory=CostModel)
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    drift: tuple[DriftPoint, ...] = ()
    faults: Faults = field(default_factory=Faults)
    report_spec_metrics: bool = True
    per_request_metrics: bool = True
    timing_metrics: bool = False
    stream_interval: int = 1
    default_max_tokens: int = 256
    max_model_len: int = 32768
    max_logprobs: int = 20
    method: Method = Method.DRAFT_MODEL
    engine: SimEngine = SimEngine.VLLM
    acceptance_rate_threshold: float | None = None
    acceptance_rate_window_size: int = 0
    prometheus: bool = True
    kv_cache_tokens: int | None = None
    num_gpu_blocks_override: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    draft_kv_share: float = DEFAULT_DRAFT_KV_SHARE
    enable_prefix_caching: bool = True
    enable_prompt_tokens_details: bool = False
    root: str | None = None  # /v1/models' root: vLLM's --model (a path or a Hub id)
    default_temperature: float | None = None  # the model's generation_config.json says

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError("k (num_speculative_tokens) must be at least 1")
        if not self.served_model_names:
            raise ValueError("at least one served model name is needed")
        if self.max_num_seqs < 1 or self.stream_interval < 1 or self.default_max_tokens < 1:
            raise ValueError("max_num_seqs, stream_interval and default_max_tokens must be >= 1")
        if self.time_scale < 0:
            raise ValueError("time_scale must not be negative")
        if self.stream_cost_s < 0:
            raise ValueError("stream_cost_s must not be negative")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than "
                f"or equal to max_num_seqs ({self.max_num_seqs})"
            )
        if (
            self.speculative
            and self.method is Method.DRAFT_MODEL
            and self.max_num_batched_tokens < 2
        ):
            raise ValueError("max_num_batched_tokens must leave room beside a draft slot")
        self._check_kv()

    def _check_kv(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if not 0.0 <= self.draft_kv_share < 1.0:
            raise ValueError(f"draft_kv_share must be in [0, 1), got {self.draft_kv_share}")
        for name in ("kv_cache_tokens", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        needed = self.max_model_len + self.k
        if self.kv_blocks * self.block_size < needed:
            raise ValueError(
                f"the KV cache holds {self.kv_blocks * self.block_size} tokens, fewer than "
                f"one sequence of max_model_len ({self.max_model_len}) and its {self.k} "
                "lookahead tokens need: raise --kv-cache-tokens or lower --max-model-len"
            )

    @property
    def kv_blocks(self) -> int:
        """KV blocks this server has (see the class docstring)."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        if self.kv_cache_tokens is None:
            return self.max_num_seqs * -(-(self.max_model_len + self.k) // self.block_size)
        tokens = self.kv_cache_tokens
        if self.speculative and self.method is Method.DRAFT_MODEL:
            tokens = int(tokens * (1.0 - self.draft_kv_share))
        return tokens // self.block_size

    @property
    def speculative(self) -> bool:
        return self.mode is Mode.SPECULATIVE

    @property
    def reports_spec(self) -> bool:
        """Whether responses carry ``metrics.speculative_decoding``."""
        return (
            self.speculative
            and self.report_spec_metrics
            and self.per_request_metrics
            and self.engine is SimEngine.VLLM
        )

    @property
    def counts_drafts(self) -> bool:
        """Whether the engine's counters see drafts (a fused Neuron step shows none)."""
        return self.report_spec_metrics and self.engine is not SimEngine.VLLM_NEURON


def parse_drift(text: str) -> tuple[DriftPoint, ...]:
    """Parse ``"code@60=0.1,code@120=0.82"`` (workload@seconds=base acceptance); a workload
    written ``tools/NAME`` applies to requests offering the tool NAME only."""
    points = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            head, value = item.split("=", 1)
            name, at = head.split("@", 1)
            workload, _, tool = name.strip().partition("/")
            point = DriftPoint(Workload(workload), float(at), float(value), tool)
        except ValueError as exc:
            raise ValueError(f"bad drift entry {item!r}: want workload@seconds=acceptance") from exc
        if not 0.0 <= point.acceptance <= 1.0 or point.at_s < 0:
            raise ValueError(f"bad drift entry {item!r}: acceptance in [0, 1], seconds >= 0")
        points.append(point)
    return tuple(points)
