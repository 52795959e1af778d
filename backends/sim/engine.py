"""The simulated engine: a continuous-batching scheduler and the loop that runs it in real time.

``Scheduler`` is the step logic and knows nothing of time. Each ``step()`` schedules as
vLLM V1 does, within a budget of ``max_num_batched_tokens`` tokens per step: the running
sequences first, in the order they were admitted (a decoding one takes 1 token plus its
draft tokens, one still in prefill the rest of its prompt, as much as the budget leaves),
then waiting ones while budget and ``max_num_seqs`` seats last, each taking as much of its
prompt as the budget leaves (on a draft-model server every scheduled sequence also takes a
slot for the draft's input). So a long prompt is prefilled in chunks over several steps,
sharing them with the decodes, and its first token comes out of the step that finishes its
prefill. A step's cost prices its prefill-chunk tokens and its verified tokens
(``CostModel``), and the step returns one ``StepEvent`` per scheduled sequence (a prefill
chunk that does not finish the prompt gives no token). ``Engine`` drives it in real time
through an injected clock and sleep; ``backends/sim/cluster.py`` and
``backends/sim/virtual.py`` drive the same scheduler in virtual time.

Each step also says what the API server hands each request (``Step.outputs``): one output
per step and request, unless processing them takes longer than the step. With
``stream_cost_s`` seconds of output processing per request and step, a step of ``n``
requests with new tokens that lasts ``t`` seconds has merge factor ``ceil(n * cost / t)``:
a request's consecutive step outputs are held until that many have queued up, then go as
one (vLLM's ``RequestOutputCollector`` merges the outputs its consumer has not taken yet).
The first token and the last output always go at once.

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
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from backends.sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, SimConfig
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
    """One request inside the engine; mutable, owned by the scheduler while it runs.

    ``prefilled`` counts the prompt tokens computed so far; ``steps`` the steps that gave it
    tokens (the one that finished its prefill and each decode step).
    """

    profile: RequestProfile
    k: int
    sink: Sink | None = None
    emitted: int = 0
    prefilled: int = 0
    steps: int = 0
    finished: bool = False
    cancelled: bool = False
    tally: SpecTally = field(init=False)
    rng: random.Random = field(init=False)
    times: Timestamps = field(default_factory=lambda: Timestamps())
    held: StepEvent | None = None  # outputs the API server has not handed over yet
    held_steps: int = 0

    def __post_init__(self) -> None:
        self.tally = SpecTally(self.k)
        self.rng = self.profile.rng("steps")


Scheduled = tuple[tuple[Sequence, StepEvent], ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step: its cost in model seconds and what each sequence got from it.

    ``events`` has one entry per scheduled sequence (a prefill chunk that does not finish
    its prompt: no tokens); ``outputs`` what the API server hands each request after this
    step, merged per ``merge`` (1: each request's tokens of this step, as they came);
    ``admitted`` the sequences this step took from the queue; ``prefill_tokens`` the prompt
    tokens it computed.
    """

    seconds: float
    events: Scheduled
    outputs: Scheduled
    admitted: tuple[Sequence, ...]
    prefill_tokens: int
    merge: int


def merge_factor(outputs: int, seconds: float, cost_s: float) -> int:
    """Consecutive step outputs of a request that reach it as one: the steps the API server
    needs to process one step's ``outputs`` at ``cost_s`` each, at least 1."""
    if cost_s <= 0 or seconds <= 0:
        return 1
    return max(1, math.ceil(outputs * cost_s / seconds - 1e-9))


def _joined(held: StepEvent, event: StepEvent) -> StepEvent:
    return StepEvent(
        held.start,
        held.tokens + event.tokens,
        held.drafted + event.drafted,
        held.accepted + event.accepted,
        event.finished,
    )


class Scheduler:
    """Continuous batching over sequences; pure step logic (see the module docstring).

    ``max_num_batched_tokens`` is vLLM's per-step token budget. On a draft-model server each
    scheduled sequence also takes one slot of it for the draft model's input, as in vLLM
    (``draft_slots``). ``stream_cost_s`` is the API server's output processing per request
    and step (0: every step's output goes at once).
    """

    def __init__(
        self,
        *,
        speculative: bool,
        k: int,
        max_num_seqs: int,
        cost: StepCost | None = None,
        method: Method = Method.DRAFT_MODEL,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        stream_cost_s: float = 0.0,
    ) -> None:
        self.speculative = speculative
        self.k = k
        self.method = method
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.stream_cost_s = stream_cost_s
        if max_num_batched_tokens <= 1:
            raise ValueError("max_num_batched_tokens must leave room beside a draft slot")
        self.cost: StepCost = cost or CostModel()
        self.counters = EngineCounters(k)
        # told of every step and its prefill tokens (engines' iteration stats are built on it)
        self.on_step: Callable[[Step, int], None] | None = None
        self._running: list[Sequence] = []
        self._waiting: deque[Sequence] = deque()
        self._holding = 0  # sequences with outputs held back

    @classmethod
    def for_config(cls, config: SimConfig) -> Scheduler:
        """The scheduler of a simulated server with these settings."""
        return cls(
            speculative=config.speculative,
            k=config.k,
            max_num_seqs=config.max_num_seqs,
            cost=config.cost,
            method=config.method,
            max_num_batched_tokens=config.max_num_batched_tokens,
            stream_cost_s=config.stream_cost_s,
        )

    @property
    def draft_slots(self) -> int:
        """Budget each scheduled sequence takes beside its own tokens: 1 for a draft model's
        input, none for an n-gram lookup or a standard server."""
        return int(self.speculative and self.method is Method.DRAFT_MODEL)

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
        if seq.held is not None:
            self._holding -= 1
            seq.held = None
        if seq in self._running:
            self._running.remove(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)

    def advance(self, seq: Sequence, budget: int | None = None) -> tuple[StepEvent, int]:
        """One step of one sequence within ``budget`` tokens (None: no limit): a chunk of its
        prompt (the first token once the prompt is done) or one decode step. Returns the
        event and the tokens it took from the budget."""
        if seq.emitted == 0:
            return self._prefill(seq, budget)
        drafted = accepted = 0
        if self.speculative:
            drafted = self._draft_length(seq)
            if budget is not None and drafted >= budget:
                drafted = budget - 1
            if drafted:
                a = seq.profile.draft_acceptance(self.method)
                accepted = sample_accepted(seq.rng, a, drafted)
                seq.tally.add(drafted, accepted)
                self.counters.count_spec(drafted, accepted)
        return self._emit(seq, accepted + 1, drafted, accepted), 1 + drafted

    def _prefill(self, seq: Sequence, budget: int | None) -> tuple[StepEvent, int]:
        prompt = seq.profile.prompt_tokens
        chunk = prompt - seq.prefilled
        if budget is not None:
            chunk = min(chunk, budget)
        seq.prefilled += chunk
        if seq.prefilled < prompt:
            return StepEvent(0, 0, 0, 0, False), chunk
        self.counters.prompt_tokens += prompt
        return self._emit(seq, 1, 0, 0), chunk

    def _emit(self, seq: Sequence, tokens: int, drafted: int, accepted: int) -> StepEvent:
        """``tokens`` more of ``seq``'s answer, cut at its length."""
        start = seq.emitted
        left = seq.profile.output_tokens - start
        finished = tokens >= left
        if finished:
            tokens = left
        self.counters.generation_tokens += tokens
        seq.emitted = start + tokens
        seq.steps += 1
        seq.finished = finished
        return StepEvent(start, tokens, drafted, accepted, finished)

    def _draft_length(self, seq: Sequence) -> int:
        """Draft tokens proposed for this step of ``seq`` (0: nothing to propose)."""
        if self.method is Method.DRAFT_MODEL:
            return self.k
        if seq.rng.random() >= seq.profile.ngram_match:
            return 0
        return min(self.k, seq.rng.randint(1, _NGRAM_SPAN * self.k))

    def _schedule(self) -> tuple[list[tuple[Sequence, StepEvent]], list[Sequence], int]:
        """Run the running sequences, then admit waiting ones, within the token budget;
        the events, the admitted sequences and the prompt tokens computed."""
        budget, slots = self.max_num_batched_tokens, self.draft_slots
        events: list[tuple[Sequence, StepEvent]] = []
        prefill = 0
        for seq in self._running:
            if budget <= slots:
                break
            in_prefill = seq.emitted == 0
            event, used = self.advance(seq, budget - slots)
            prefill += used if in_prefill else 0
            budget -= used + slots
            events.append((seq, event))
        admitted = []
        while self._waiting and budget > slots and len(self._running) < self.max_num_seqs:
            seq = self._waiting.popleft()
            self._running.append(seq)
            admitted.append(seq)
            event, used = self.advance(seq, budget - slots)
            prefill += used
            budget -= used + slots
            events.append((seq, event))
        return events, admitted, prefill

    def step(self) -> Step:
        """Schedule one step within the budget, advance what it scheduled, and price it."""
        scheduled, admitted, prefill_tokens = self._schedule()
        events = tuple(scheduled)
        self._running = [seq for seq in self._running if not seq.finished]
        self.counters.steps += 1
        # The target verifies each decoding sequence's token plus its drafts, and (on a GPU)
        # reads what each has cached; a draft model runs k passes over the sequences it
        # drafted for, an n-gram lookup costs next to nothing.
        verified = drafting = with_tokens = decoders = context = 0
        for seq, e in events:
            with_tokens += e.tokens > 0
            if e.start:
                verified += 1 + e.drafted
                drafting += e.drafted > 0
                decoders += 1
                context += seq.profile.prompt_tokens + e.start
        if not self.draft_slots:
            drafting = 0
        seconds = self.cost.step_seconds(
            verified_tokens=verified,
            prefill_tokens=prefill_tokens,
            draft_passes=self.k if drafting else 0,
            drafting_seqs=drafting,
            context_tokens=context,
            seqs=decoders,
        )
        merge = merge_factor(with_tokens, seconds, self.stream_cost_s)
        if merge == 1 and not self._holding and with_tokens == len(events):
            outputs = events  # the usual case: every request gets its step's tokens at once
        else:
            outputs = self._deliver(events, merge)
        step = Step(seconds, events, outputs, tuple(admitted), prefill_tokens, merge)
        if self.on_step is not None:
            self.on_step(step, prefill_tokens)
        return step

    def _deliver(self, events: Scheduled, merge: int) -> Scheduled:
        """What each request receives after a step whose merge factor is ``merge``: its first
        token and its last output at once, other outputs held until ``merge`` steps' worth
        have queued up (the holding state lives on each ``Sequence``)."""
        out = []
        for seq, event in events:
            if not event.tokens:
                continue
            held = seq.held
            joined = event if held is None else _joined(held, event)
            seq.held_steps += 1
            if event.start == 0 or event.finished or seq.held_steps >= merge:
                self._holding -= held is not None
                seq.held, seq.held_steps = None, 0
                out.append((seq, joined))
            else:
                self._holding += held is None
                seq.held = joined
        return tuple(out)

    def run_alone(self, seq: Sequence) -> list[StepEvent]:
        """Every step of one sequence at once, outside the batch (zero-latency mode)."""
        events = []
        while not seq.finished:
            events.append(self.advance(seq)[0])
        return events


Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Engine:
    """Runs a ``Scheduler`` in real time: one step, then sleep for its scaled cost, then deliver.

    Tokens become visible when their step ends: each of the step's ``outputs`` (a request's
    tokens of this step, or of the last few when outputs merge) reaches its sink as one
    event. The loop task exists only while there is work.
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
            for seq in step.admitted:
                seq.times.scheduled = began
            for seq, event in step.events:
                if event.tokens:
                    if event.start == 0:
                        seq.times.first_token = ended
                    seq.times.last_token = ended
            for seq, event in step.outputs:
                if seq.sink is not None and not seq.cancelled:
                    seq.sink(event)
