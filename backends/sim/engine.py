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

KV memory (``backends/sim/kvcache.py``), as vLLM V1's scheduler keeps it: a sequence is
admitted only when the blocks of its cached prefix and its first chunk fit, and it starts
past its cached prefix (only the rest is prefilled and priced); every step a running
sequence first takes the blocks its chunk or its token and lookahead (k drafts) need, and
when none are left the newest running sequence is preempted (blocks freed, back to the head
of the queue, to compute its prompt and answer so far again: vLLM's recompute preemption,
whose last step gives one token and no drafts); a step that preempted admits nobody, and
admission stops at the first waiting sequence that does not fit. Computed blocks are hashed
into the prefix cache as they fill; a finished, cancelled or preempted sequence releases its
blocks.

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

Why one module past 600 lines: the scheduler's admission, chunked prefill, KV blocks and
preemption decide together, in one step, which sequences run; the cache itself
(``kvcache.py``), the prompt's block hashes (``prefix.py``) and the cost model
(``model.py``) live apart.
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
from backends.sim.kvcache import BlockTable, KVCache
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
    cached_prompt_tokens: int = 0  # of prompt_tokens, found in the prefix cache
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

    ``prefilled`` counts the prompt tokens computed so far (after a preemption: the tokens
    of ``refill``, its prompt and answer so far, that it computed again); ``steps`` the steps
    that gave it tokens (the one that finished its prefill and each decode step).
    ``blocks`` is its share of the KV memory (``hashes``: its content's block hashes,
    ``backends/sim/prefix.py``); ``cached`` the prompt tokens its first admission found in
    the prefix cache (-1: not admitted yet), what vLLM reports as ``cached_tokens``.
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
    hashes: tuple[int, ...] = ()
    blocks: BlockTable = field(init=False)
    cached: int = -1
    refill: int = 0  # tokens to compute again after a preemption (0: none)
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.tally = SpecTally(self.k)
        self.rng = self.profile.rng("steps")
        self.blocks = BlockTable(self.hashes)

    @property
    def in_prefill(self) -> bool:
        """Whether its next step computes context (its prompt, or again after a preemption)
        rather than decoding."""
        return self.emitted == 0 or self.refill > 0

    @property
    def computed(self) -> int:
        """Tokens whose KV it holds: its prefill's progress, else its prompt and every
        answer token but the last sampled one."""
        if self.in_prefill:
            return self.prefilled
        return self.profile.prompt_tokens + self.emitted - 1

    @property
    def target(self) -> int:
        """Tokens its (re)prefill computes before it samples again."""
        return self.refill or self.profile.prompt_tokens


Scheduled = tuple[tuple[Sequence, StepEvent], ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step: its cost in model seconds and what each sequence got from it.

    ``events`` has one entry per scheduled sequence (a prefill chunk that does not finish
    its prompt: no tokens); ``outputs`` what the API server hands each request after this
    step, merged per ``merge`` (1: each request's tokens of this step, as they came);
    ``admitted`` the sequences this step took from the queue; ``prefill_tokens`` the prompt
    tokens it computed (cached ones not); ``preempted`` the sequences it sent back to the
    queue for want of KV blocks.
    """

    seconds: float
    events: Scheduled
    outputs: Scheduled
    admitted: tuple[Sequence, ...]
    prefill_tokens: int
    merge: int
    preempted: tuple[Sequence, ...] = ()


def _too_long(seq: Sequence, tokens: int, kv: KVCache) -> RuntimeError:
    """A sequence that does not fit in the whole KV cache alone: it would wait forever (a
    server refuses such a request first: its prompt and answer fit ``max_model_len``, and
    ``SimConfig`` keeps the cache above that)."""
    return RuntimeError(
        f"a request of {seq.profile.prompt_tokens} prompt and {seq.profile.output_tokens} "
        f"answer tokens needs {tokens} tokens of KV at once, more than the cache's "
        f"{kv.num_blocks * kv.block_size}: raise kv_cache_tokens"
    )


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
    and step (0: every step's output goes at once). ``kv`` is the KV memory and prefix cache
    (``backends/sim/kvcache.py``; None: memory without bound and no cache).
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
        kv: KVCache | None = None,
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
        self.kv = kv
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
            kv=KVCache(
                config.kv_blocks,
                block_size=config.block_size,
                caching=config.enable_prefix_caching,
            ),
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
            self._release(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)

    def advance(self, seq: Sequence, budget: int | None = None) -> tuple[StepEvent, int]:
        """One step of one sequence within ``budget`` tokens (None: no limit): a chunk of its
        prompt (the first token once the prompt is done), a chunk of what a preemption made
        it compute again (a token once that is done), or one decode step. Returns the event
        and the tokens it took from the budget."""
        if seq.in_prefill:
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
        target = seq.target
        chunk = target - seq.prefilled
        if budget is not None:
            chunk = min(chunk, budget)
        seq.prefilled += chunk
        if seq.prefilled < target:
            return StepEvent(0, 0, 0, 0, False), chunk
        if seq.refill:
            seq.refill = 0
        else:
            self.counters.prompt_tokens += target
            self.counters.cached_prompt_tokens += max(seq.cached, 0)
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

    def _needs(self, seq: Sequence, budget: int) -> int:
        """Tokens whose KV ``seq`` needs by the end of its step within ``budget``: its next
        prefill chunk, or its next token and the drafts it may verify (vLLM's lookahead)."""
        if seq.in_prefill:
            return seq.prefilled + min(seq.target - seq.prefilled, budget)
        lookahead = self.k if self.speculative else 0
        return seq.profile.prompt_tokens + seq.emitted + lookahead

    def _preempt(self) -> Sequence:
        """Send the newest running sequence back to the head of the queue, its blocks freed:
        it computes its prompt and answer so far again when it comes back (vLLM V1's
        recompute preemption)."""
        seq = self._running.pop()
        self._release(seq)
        seq.preemptions += 1
        if self.kv is not None:
            self.kv.stats.preemptions += 1
        if seq.emitted:
            seq.refill = seq.profile.prompt_tokens + seq.emitted
        seq.prefilled = 0
        self._waiting.appendleft(seq)
        return seq

    def _release(self, seq: Sequence) -> None:
        if self.kv is not None:
            self.kv.commit(seq.blocks, seq.computed)
            self.kv.release(seq.blocks)

    def _admit(self, seq: Sequence, budget: int) -> bool:
        """Take ``seq`` from the queue if memory holds its cached prefix and first chunk."""
        if self.kv is None:
            seq.cached = max(seq.cached, 0)
            return True
        cached = self.kv.start(seq.blocks, seq.target, budget, count=not seq.preemptions)
        if cached is None:
            return False
        seq.prefilled = cached
        if seq.cached < 0:
            seq.cached = cached
        return True

    def _schedule(
        self,
    ) -> tuple[list[tuple[Sequence, StepEvent]], list[Sequence], int, list[Sequence]]:
        """Run the running sequences, then admit waiting ones, within the token budget and
        the KV memory; the events, the admitted and preempted sequences and the prompt
        tokens computed. A running sequence that finds no block for its step preempts the
        newest running one (itself, last); a step that preempted admits nothing, and
        admission stops at the first waiting sequence memory cannot hold, as in vLLM V1."""
        budget, slots, kv = self.max_num_batched_tokens, self.draft_slots, self.kv
        events: list[tuple[Sequence, StepEvent]] = []
        preempted: list[Sequence] = []
        prefill = 0
        index = 0
        while index < len(self._running) and budget > slots:
            seq = self._running[index]
            if kv is not None:
                need = self._needs(seq, budget - slots)
                while not kv.grow(seq.blocks, need) and seq in self._running:
                    preempted.append(self._preempt())
                if seq in preempted:
                    if not self._running:
                        raise _too_long(seq, need, kv)
                    break
            in_prefill = seq.in_prefill
            event, used = self.advance(seq, budget - slots)
            prefill += used if in_prefill else 0
            budget -= used + slots
            events.append((seq, event))
            index += 1
        admitted = []
        while (
            not preempted
            and self._waiting
            and budget > slots
            and len(self._running) < self.max_num_seqs
        ):
            seq = self._waiting[0]
            if not self._admit(seq, budget - slots):
                if not self._running and kv is not None:
                    raise _too_long(seq, seq.target, kv)
                break
            self._waiting.popleft()
            self._running.append(seq)
            admitted.append(seq)
            event, used = self.advance(seq, budget - slots)
            prefill += used
            budget -= used + slots
            events.append((seq, event))
        if kv is not None:
            for seq, _ in events:
                kv.commit(seq.blocks, seq.computed)
        return events, admitted, prefill, preempted

    def step(self) -> Step:
        """Schedule one step within the budget, advance what it scheduled, and price it."""
        scheduled, admitted, prefill_tokens, preempted = self._schedule()
        events = tuple(scheduled)
        if any(e.finished for _, e in events):
            for seq, e in events:
                if e.finished:
                    self._release(seq)
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
        step = Step(
            seconds, events, outputs, tuple(admitted), prefill_tokens, merge, tuple(preempted)
        )
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
        """Every step of one sequence at once, outside the batch (zero-latency mode): its
        prefix is looked up and its blocks cached as in the batch, memory permitting."""
        kv = self.kv
        cached = kv.start(seq.blocks, seq.target, None) if kv is not None else None
        seq.prefilled = cached or 0
        if seq.cached < 0:
            seq.cached = cached or 0
        events = []
        while not seq.finished:
            events.append(self.advance(seq)[0])
        if cached is not None and kv is not None:
            kv.grow(seq.blocks, seq.computed)
            self._release(seq)
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
                seq.times.scheduled = seq.times.scheduled or began
            for seq, event in step.events:
                if event.tokens:
                    if event.start == 0:
                        seq.times.first_token = ended
                    seq.times.last_token = ended
            for seq, event in step.outputs:
                if seq.sink is not None and not seq.cancelled:
                    seq.sink(event)
