"""The simulated engine: a continuous-batching scheduler and the loop that runs it in real time.

``Scheduler`` is the step logic and knows nothing of time: each ``step()`` admits waiting
sequences up to ``max_num_seqs``, prefills them (one token each), advances every other
running sequence by one decode step (standard: 1 token; speculative: k drafts, accepted + 1
tokens, cut at the answer's length), and returns the step's cost in model seconds with one
``StepEvent`` per sequence. ``Engine`` drives it in real time through an injected clock and
sleep; ``backends/sim/virtual.py`` drives the same scheduler in virtual time.

Two proposers, as vLLM's ``--speculative-config`` ``method``:

- ``draft_model``: every decode step drafts k tokens, so ``num_draft_tokens == k *
  num_spec_steps``.
- ``ngram``: a step drafts only when the last tokens recur in the context (chance
  ``profile.ngram_match``), and then at most k: the copied span may end sooner. A step that
  drafts nothing emits one token and is no speculative step: no draft counter, no
  ``num_spec_steps``, no histogram entry (vLLM counts only steps with scheduled drafts).

Either way accepted tokens are counted before the answer's length cuts the emitted ones, and
the first token (from prefill) is never a speculative step.

Must not: read the clock or global random state (time and randomness come in), know HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from backends.sim.model import CostModel, Method, RequestProfile, StepCost, sample_accepted

logger = logging.getLogger(__name__)

# A real-time engine that falls this far behind its schedule stops trying to catch up.
_MAX_LAG_S = 0.05
# An n-gram match copies the context after it; the copy runs out before k tokens when the
# match sits near the end of the context. Its length is drawn uniformly from 1..3k, capped
# at k, so about three matches in four propose all k tokens.
_NGRAM_SPAN = 3


class StepEvent(NamedTuple):
    """What one engine step gave one sequence: tokens ``[start, start + tokens)``.

    A named tuple, not a dataclass: the zero-latency path makes one per step and tuples are
    several times cheaper to build.
    """

    start: int
    tokens: int
    drafted: int
    accepted: int
    finished: bool


@dataclass(slots=True)
class SpecTally:
    """Per-request speculative counts, as vLLM's ``metrics.speculative_decoding`` reports them."""

    k: int
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    histogram: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.histogram = [0] * (self.k + 1)

    def add(self, drafted: int, accepted: int) -> None:
        self.num_spec_steps += 1
        self.num_draft_tokens += drafted
        self.num_accepted_draft_tokens += accepted
        self.histogram[accepted] += 1

    @property
    def mean_acceptance_length(self) -> float:
        if not self.num_spec_steps:
            return 1.0
        return 1.0 + self.num_accepted_draft_tokens / self.num_spec_steps

    @property
    def draft_acceptance_rate(self) -> float:
        if not self.num_draft_tokens:
            return 0.0
        return self.num_accepted_draft_tokens / self.num_draft_tokens


@dataclass(slots=True)
class EngineCounters:
    """Server-wide totals, the source of the vLLM Prometheus counters."""

    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.k

    def count_spec(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        per_pos = self.accepted_per_pos
        for pos in range(accepted):
            per_pos[pos] += 1


Sink = Callable[[StepEvent], None]


@dataclass(slots=True)
class Timestamps:
    """When one request was queued, scheduled, and got its first and last token (seconds of
    the engine's clock; 0 = not yet), for vLLM's per-request timing metrics."""

    queued: float = 0.0
    scheduled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine; mutable, owned by the scheduler while it runs."""

    profile: RequestProfile
    k: int
    sink: Sink | None = None
    emitted: int = 0
    steps: int = 0
    finished: bool = False
    cancelled: bool = False
    tally: SpecTally = field(init=False)
    rng: random.Random = field(init=False)
    times: Timestamps = field(default_factory=lambda: Timestamps())

    def __post_init__(self) -> None:
        self.tally = SpecTally(self.k)
        self.rng = self.profile.rng("steps")


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step: its cost in model seconds and what each sequence got from it."""

    seconds: float
    events: tuple[tuple[Sequence, StepEvent], ...]


class Scheduler:
    """Continuous batching over sequences; pure step logic (see the module docstring)."""

    def __init__(
        self,
        *,
        speculative: bool,
        k: int,
        max_num_seqs: int,
        cost: StepCost | None = None,
        method: Method = Method.DRAFT_MODEL,
    ) -> None:
        self.speculative = speculative
        self.k = k
        self.method = method
        self.max_num_seqs = max_num_seqs
        self.cost: StepCost = cost or CostModel()
        self.counters = EngineCounters(k)
        # told of every step and its prefill tokens (engines' iteration stats are built on it)
        self.on_step: Callable[[Step, int], None] | None = None
        self._running: list[Sequence] = []
        self._waiting: deque[Sequence] = deque()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def submit(self, seq: Sequence) -> None:
        self._waiting.append(seq)

    def cancel(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is (client went away); no-op once it finished."""
        seq.cancelled = True
        if seq in self._running:
            self._running.remove(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)

    def advance(self, seq: Sequence) -> StepEvent:
        """One step of one sequence: prefill (first token) or one decode step."""
        start = seq.emitted
        counters = self.counters
        drafted = accepted = 0
        if start == 0:
            tokens = 1
            counters.prompt_tokens += seq.profile.prompt_tokens
        elif self.speculative and (drafted := self._draft_length(seq)):
            accepted = sample_accepted(seq.rng, seq.profile.draft_acceptance(self.method), drafted)
            tokens = min(accepted + 1, seq.profile.output_tokens - start)
            seq.tally.add(drafted, accepted)
            counters.count_spec(drafted, accepted)
        else:
            tokens = 1
        counters.generation_tokens += tokens
        seq.emitted += tokens
        seq.steps += 1
        seq.finished = seq.emitted >= seq.profile.output_tokens
        return StepEvent(start, tokens, drafted, accepted, seq.finished)

    def _draft_length(self, seq: Sequence) -> int:
        """Draft tokens proposed for this step of ``seq`` (0: nothing to propose)."""
        if self.method is Method.DRAFT_MODEL:
            return self.k
        if seq.rng.random() >= seq.profile.ngram_match:
            return 0
        return min(self.k, seq.rng.randint(1, _NGRAM_SPAN * self.k))

    def step(self) -> Step:
        """Admit, advance every running sequence once, and price the step."""
        decoding = len(self._running)
        prefill_tokens = 0
        while self._waiting and len(self._running) < self.max_num_seqs:
            seq = self._waiting.popleft()
            prefill_tokens += seq.profile.prompt_tokens
            self._running.append(seq)
        events = tuple((seq, self.advance(seq)) for seq in self._running)
        self._running = [seq for seq in self._running if not seq.finished]
        self.counters.steps += 1
        # The target verifies each decoding sequence's token plus its drafts, and (on a GPU)
        # reads what each has cached; a draft model runs k passes over the batch, an n-gram
        # lookup costs next to nothing.
        decoders = [(seq, e) for seq, e in events if e.start > 0]
        verified = sum(1 + e.drafted for _, e in decoders)
        context = sum(seq.profile.prompt_tokens + e.start for seq, e in decoders)
        drafting = self.speculative and self.method is Method.DRAFT_MODEL and decoding > 0
        seconds = self.cost.step_seconds(
            verified_tokens=verified,
            prefill_tokens=prefill_tokens,
            draft_passes=self.k if drafting else 0,
            drafting_seqs=decoding if drafting else 0,
            context_tokens=context,
            seqs=len(decoders),
        )
        step = Step(seconds, events)
        if self.on_step is not None:
            self.on_step(step, prefill_tokens)
        return step

    def run_alone(self, seq: Sequence) -> list[StepEvent]:
        """Every step of one sequence at once, outside the batch (zero-latency mode)."""
        events = []
        while not seq.finished:
            events.append(self.advance(seq))
        return events


Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Engine:
    """Runs a ``Scheduler`` in real time: one step, then sleep for its scaled cost, then deliver.

    Tokens become visible when their step ends, so each sequence's tokens of one step reach
    its sink as one event. The loop task exists only while there is work.
    """

    def __init__(
        self, scheduler: Scheduler, *, time_scale: float, clock: Clock, sleep: Sleep
    ) -> None:
        self.scheduler = scheduler
        self._scale = time_scale
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    def submit(self, seq: Sequence) -> None:
        seq.times.queued = self._clock()
        self.scheduler.submit(seq)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self, seq: Sequence) -> None:
        self.scheduler.cancel(seq)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        deadline = self._clock()
        while self.scheduler.has_work():
            began = self._clock()
            step = self.scheduler.step()
            deadline += step.seconds * self._scale
            delay = deadline - self._clock()
            if delay < -_MAX_LAG_S:
                deadline -= delay
            await self._sleep(max(delay, 0.0))
            ended = self._clock()
            for seq, event in step.events:
                if event.start == 0:
                    seq.times.scheduled, seq.times.first_token = began, ended
                seq.times.last_token = ended
                if seq.sink is not None and not seq.cancelled:
                    seq.sink(event)
