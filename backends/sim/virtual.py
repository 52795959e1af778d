"""The simulated engine in virtual time: a discrete-event run over timed requests.

The same ``Scheduler`` as the HTTP server steps through a list of requests that arrive at
given (virtual) seconds; nothing sleeps, and the result is the same for the same inputs.
It keeps the server's KV memory and prefix cache too (a request is cached under its prompt:
a later request that resends it, one turn longer, prefills only the rest), and waits or
preempts when blocks run short.
Used for fast benchmarks, policy replay and the speed-up table.

Pure: no I/O, no clock reads, no global random state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from backends.sim.config import SimConfig
from backends.sim.engine import Scheduler, Sequence
from backends.sim.model import RequestProfile, build_profile
from backends.sim.prefix import prompt_hashes
from backends.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """An OpenAI request body that arrives ``at`` virtual seconds after the start."""

    at: float
    body: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request saw. ``token_times`` holds the time each token became visible (when
    the API server handed it over: merged outputs make several steps' tokens visible at
    once); ``steps`` the engine steps that gave it tokens; ``cached_tokens`` the prompt
    tokens the prefix cache held when it was admitted; ``preemptions`` the times it lost its
    KV blocks and went back to the queue."""

    index: int
    workload: Workload
    acceptance: float
    arrival: float
    token_times: tuple[float, ...]
    steps: int
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    finish_reason: str
    cached_tokens: int = 0
    preemptions: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (0 for one-token answers)."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        steps = self.num_spec_steps
        return 1.0 + self.num_accepted_draft_tokens / steps if steps else 1.0


def _max_tokens(body: Mapping[str, object], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def simulate(requests: Iterable[TimedRequest], config: SimConfig) -> list[RequestResult]:
    """Run every request to completion; results come back in the input's order."""
    pending = sorted(enumerate(requests), key=lambda item: (item[1].at, item[0]))
    scheduler = Scheduler.for_config(config)
    seqs: dict[int, tuple[float, Sequence]] = {}
    times: dict[int, list[float]] = {}
    order: dict[int, int] = {}
    now = 0.0
    cursor = 0
    while cursor < len(pending) or scheduler.has_work():
        if not scheduler.has_work():
            now = max(now, pending[cursor][1].at)
        while cursor < len(pending) and pending[cursor][1].at <= now:
            index, request = pending[cursor]
            profile = _profile(request, config, seq_no=cursor)
            caching = config.enable_prefix_caching
            hashes = prompt_hashes(request.body, config.block_size) if caching else ()
            seq = Sequence(profile, config.k, hashes=hashes)
            seqs[index] = (request.at, seq)
            times[index] = []
            order[id(seq)] = index
            scheduler.submit(seq)
            cursor += 1
        step = scheduler.step()
        now += step.seconds
        for seq, event in step.outputs:
            times[order[id(seq)]].extend([now] * event.tokens)
    return [_result(i, *seqs[i], times[i]) for i in sorted(seqs)]


def _profile(request: TimedRequest, config: SimConfig, *, seq_no: int) -> RequestProfile:
    return build_profile(
        request.body,
        seed=config.seed,
        index=seq_no,
        max_tokens=_max_tokens(request.body, config.default_max_tokens),
        now_s=request.at,
        model=config.acceptance,
        drift=config.drift,
    )


def _result(index: int, arrival: float, seq: Sequence, times: list[float]) -> RequestResult:
    tally = seq.tally
    return RequestResult(
        index=index,
        workload=seq.profile.workload,
        acceptance=seq.profile.acceptance,
        arrival=arrival,
        token_times=tuple(times),
        steps=seq.steps,
        num_spec_steps=tally.num_spec_steps,
        num_draft_tokens=tally.num_draft_tokens,
        num_accepted_draft_tokens=tally.num_accepted_draft_tokens,
        finish_reason=seq.profile.finish_reason,
        cached_tokens=max(seq.cached, 0),
        preemptions=seq.preemptions,
    )
