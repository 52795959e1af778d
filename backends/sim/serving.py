"""The simulated server's request path: validate, inject faults, profile, run, answer.

``SimServer`` is the one container of a simulated server's collaborators (engine, text bank,
runtime overrides and faults, counters); ``backends/sim/server.py`` wires its endpoints into
a Starlette app. A streamed answer is the role chunk (chat), one chunk per engine step (or per
``stream_interval`` steps; the first token always goes alone), an optional usage chunk and
``[DONE]``. Zero-latency mode renders the whole answer at once, without the batch.

Must not: read the clock or sleep except through the injected seams; use global state.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass, field
from functools import partial

from starlette.requests import Request
from starlette.responses import Response

from backends.sim.asgi import SSE_MEDIA_TYPE, DeferredJSON, EventStream
from backends.sim.config import Faults, SimConfig
from backends.sim.engine import Clock, Engine, Scheduler, Sequence, Sleep, SpecTally, StepEvent
from backends.sim.model import RequestProfile, base_acceptance, build_profile, draw
from backends.sim.responses import DONE, Answer, ChunkWriter, full_body
from backends.sim.text import TextBank
from backends.sim.validation import Ask, SimHTTPError, parse
from backends.sim.workload import Workload, tool_parameters

Span = tuple[int, int, bool]  # first token, end token, finished


@dataclass(slots=True)
class Outcomes:
    """What the server did with the requests it got (for ``/sim/state``)."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    errors_injected: int = 0
    overloaded: int = 0
    spikes: int = 0
    drops: int = 0


@dataclass(slots=True)
class _Job:
    ask: Ask
    profile: RequestProfile
    answer: Answer
    tokens: list[str]
    seq: Sequence
    closed: bool = field(default=False)

    def text(self, start: int, end: int) -> str:
        if self.profile.tool_name is not None:  # token 0 is the function name
            return "".join(self.tokens[max(start - 1, 0) : end - 1])
        return "".join(self.tokens[start:end])


def _short_hash(key: str) -> str:
    return f"{draw(key):016x}"


class SimServer:
    """A simulated vLLM server's state and its generation endpoints."""

    def __init__(self, config: SimConfig, *, clock: Clock, sleep: Sleep, wall_clock: Clock) -> None:
        self.config = config
        self.scheduler = Scheduler(
            speculative=config.speculative,
            k=config.k,
            max_num_seqs=config.max_num_seqs,
            cost=config.cost,
        )
        self.engine = Engine(self.scheduler, time_scale=config.time_scale, clock=clock, sleep=sleep)
        self.bank = TextBank(config.seed)
        self.overrides: dict[Workload, float] = {}
        self.faults: Faults = config.faults
        self.outcomes = Outcomes()
        self._fault_rng = random.Random(f"{config.seed}:faults")
        self._clock = clock
        self._sleep = sleep
        self._wall = wall_clock
        self._started = clock()

    @property
    def uptime_s(self) -> float:
        return self._clock() - self._started

    @property
    def model_time_s(self) -> float:
        """Seconds of model time since start: what drift schedules count, here as in
        ``virtual.simulate`` (wall seconds / ``time_scale``)."""
        scale = self.config.time_scale
        return (
            self.uptime_s / scale if scale > 0 and not self.config.zero_latency else self.uptime_s
        )

    def base_acceptance(self, workload: Workload) -> float:
        return base_acceptance(
            workload,
            now_s=self.model_time_s,
            model=self.config.acceptance,
            drift=self.config.drift,
            overrides=self.overrides,
        )

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        config = self.config
        try:
            ask = parse(
                await request.body(),
                chat=chat,
                names=config.served_model_names,
                default_max_tokens=config.default_max_tokens,
                max_model_len=config.max_model_len,
            )
            spike_s, drop_after = self._draw_faults()
        except SimHTTPError as err:
            self.outcomes.rejected += err.status < 500
            return Response(err.body, err.status, media_type="application/json")
        job = self._job(ask)
        if spike_s:
            await self._sleep(spike_s)
        if ask.stream:
            return self._stream(job, drop_after)
        if config.zero_latency:
            self._run_alone(job)
            self._close(job)
            return Response(self._body(job), media_type="application/json")
        return DeferredJSON(partial(self._wait_body, job), partial(self._close, job))

    def _draw_faults(self) -> tuple[float, int | None]:
        """Decide this request's faults; raises for the ones answered before any work."""
        faults, rng, out = self.faults, self._fault_rng, self.outcomes
        error, spike, die = rng.random(), rng.random(), rng.random()
        if faults.overloaded:
            out.overloaded += 1
            raise SimHTTPError(503, "The server is overloaded.", "ServiceUnavailableError")
        if error < faults.error_rate:
            out.errors_injected += 1
            raise SimHTTPError(500, "Injected engine error.", "InternalServerError")
        spike_s = faults.spike_s * self.config.time_scale if spike < faults.spike_rate else 0.0
        out.spikes += spike_s > 0
        return spike_s, faults.die_after_chunks if die < faults.die_rate else None

    def _job(self, ask: Ask) -> _Job:
        config = self.config
        index = self.outcomes.requests
        self.outcomes.requests += 1
        profile = build_profile(
            ask.body,
            seed=config.seed,
            index=index,
            max_tokens=ask.max_tokens,
            now_s=self.model_time_s,
            model=config.acceptance,
            drift=config.drift,
            overrides=self.overrides,
            greedy_mismatch=self.faults.greedy_mismatch if config.speculative else 0.0,
        )
        prefix = "chatcmpl-" if ask.chat else "cmpl-"
        answer = Answer(
            chat=ask.chat,
            request_id=prefix + _short_hash(profile.seed_key),
            created=int(self._wall()),
            model=ask.model,
            prompt_tokens=profile.prompt_tokens,
            include_usage=ask.include_usage,
            tool_name=profile.tool_name,
            tool_call_id="chatcmpl-tool-" + _short_hash(profile.seed_key + ":tool"),
        )
        properties = tool_parameters(ask.body, profile.tool_name) if profile.tool_name else {}
        tokens = self.bank.tokens(profile, properties)
        return _Job(ask, profile, answer, tokens, Sequence(profile, config.k))

    def _tally(self, job: _Job) -> SpecTally | None:
        return job.seq.tally if self.config.reports_spec else None

    def _close(self, job: _Job) -> None:
        if job.closed:
            return
        job.closed = True
        if job.seq.finished:
            self.outcomes.completed += 1
        else:
            self.engine.cancel(job.seq)
            self.outcomes.cancelled += 1

    def _run_alone(self, job: _Job) -> list[StepEvent]:
        return self.scheduler.run_alone(job.seq)

    def _body(self, job: _Job) -> bytes:
        p = job.profile
        text = job.text(0, p.output_tokens)
        return full_body(job.answer, text, p.finish_reason, p.output_tokens, self._tally(job))

    async def _wait_body(self, job: _Job) -> bytes:
        async for _ in self._events(job):
            pass
        return self._body(job)

    async def _events(self, job: _Job) -> AsyncIterator[StepEvent]:
        if self.config.zero_latency:
            for event in self._run_alone(job):
                yield event
            return
        inbox: asyncio.Queue[StepEvent] = asyncio.Queue()
        job.seq.sink = inbox.put_nowait
        self.engine.submit(job.seq)
        while True:
            event = await inbox.get()
            yield event
            if event.finished:
                return

    def _stream(self, job: _Job, drop_after: int | None) -> Response:
        on_close = partial(self._close, job)
        if drop_after is not None:
            self.outcomes.drops += 1
            return EventStream(_first(self._chunks(job), drop_after), on_close, complete=False)
        if self.config.zero_latency:
            events = self._run_alone(job)
            self._close(job)
            chunks = self._render(job, _spans(events, self.config.stream_interval))
            return Response(b"".join(chunks), media_type=SSE_MEDIA_TYPE)
        return EventStream(self._chunks(job), on_close)

    async def _chunks(self, job: _Job) -> AsyncGenerator[bytes, None]:
        interval = self.config.stream_interval
        pending: list[StepEvent] = []
        writer = ChunkWriter(job.answer)
        if job.ask.chat:
            yield writer.role()
        async for event in self._events(job):
            pending.append(event)
            if len(pending) == interval or event.finished or event.start == 0:
                for chunk in self._render(job, _spans(pending, interval), writer, tail=False):
                    yield chunk
                pending.clear()
        for chunk in self._tail(job, writer):
            yield chunk

    def _render(
        self,
        job: _Job,
        spans: Iterable[Span],
        writer: ChunkWriter | None = None,
        *,
        tail: bool = True,
    ) -> list[bytes]:
        """SSE chunks for ``spans``; a fresh writer means a whole answer (role chunk first)."""
        out: list[bytes] = []
        if writer is None:
            writer = ChunkWriter(job.answer)
            if job.ask.chat:
                out.append(writer.role())
        reason = job.profile.finish_reason
        for start, end, finished in spans:
            text = job.text(start, end)
            out.append(
                writer.content(text, first=start == 0, finish_reason=reason if finished else None)
            )
        if tail:
            out.extend(self._tail(job, writer))
        return out

    def _tail(self, job: _Job, writer: ChunkWriter) -> list[bytes]:
        if not job.ask.include_usage:
            return [DONE]
        return [writer.usage(job.profile.output_tokens, self._tally(job)), DONE]


def _spans(events: Iterable[StepEvent], interval: int) -> list[Span]:
    """Group steps into chunks: the first token alone, then ``interval`` steps per chunk."""
    spans: list[Span] = []
    group: list[StepEvent] = []
    for event in events:
        group.append(event)
        if len(group) == interval or event.finished or event.start == 0:
            last = group[-1]
            spans.append((group[0].start, last.start + last.tokens, last.finished))
            group = []
    return spans


async def _first(chunks: AsyncGenerator[bytes, None], n: int) -> AsyncGenerator[bytes, None]:
    """The first ``n`` chunks, then stop (the ``die`` fault)."""
    async with contextlib.aclosing(chunks) as source:
        sent = 0
        async for chunk in source:
            if sent >= n:
                return
            yield chunk
            sent += 1
            if sent >= n:
                return
