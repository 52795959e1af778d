"""The simulated server's request path: validate, inject faults, profile, run, answer.

``SimServer`` is the one container of a simulated server's collaborators (engine, text bank,
runtime overrides and faults, counters); ``backends/sim/server.py`` wires its endpoints into
a Starlette app. A streamed answer is the role chunk (chat), one chunk per engine step (with
``stream_interval`` > 1, tokens wait until that many are ready; the first token and the
last chunk always go at once, as in vLLM), an optional usage chunk and ``[DONE]``.
Anthropic's Messages and OpenAI's Responses requests become chat requests and their
answers are the chat answers converted, as vLLM serves them (``backends/sim/agents.py``).
Zero-latency mode renders the whole answer at once, without the batch. Like vLLM, an
answer's id is the client's ``X-Request-Id`` when it sends one.

Must not: read the clock or sleep except through the injected seams; use global state.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial

from starlette.requests import Request
from starlette.responses import Response

from backends.sim import api_messages, dialects
from backends.sim.agents import AgentApi, Converter, MessagesApi, ResponsesApi
from backends.sim.api_responses import Histories
from backends.sim.asgi import SSE_MEDIA_TYPE, DeferredJSON, EventStream
from backends.sim.config import Faults, SimConfig
from backends.sim.engine import (
    Clock,
    Engine,
    Scheduler,
    Sequence,
    Sleep,
    SpecTally,
    Step,
    StepEvent,
)
from backends.sim.engine_pages import ITERATION_QUEUE, LOG_INTERVAL, Iteration
from backends.sim.job import Choice, Job
from backends.sim.logprobs import prompt_ids
from backends.sim.model import base_acceptance, build_profile, draw
from backends.sim.pacing import Chunker, Span, timings
from backends.sim.prefix import answer_text, sequence_hashes
from backends.sim.responses import DONE, Answer, ChunkWriter, Timings, whole_body
from backends.sim.stored import Stored
from backends.sim.text import TextBank
from backends.sim.validation import Ask, SimHTTPError, parse
from backends.sim.workload import (
    Workload,
    estimate_prompt_tokens,
    prompt_text,
    sampled,
    schema_properties,
    tool_parameters,
)


@dataclass(slots=True)
class Outcomes:
    """What the server did with the requests it got (for ``/sim/state``)."""

    requests: int = 0
    streamed: int = 0  # of the requests, those answered as a stream
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    errors_injected: int = 0
    overloaded: int = 0
    spikes: int = 0
    drops: int = 0
    stalls: int = 0
    hangs: int = 0


@dataclass(frozen=True, slots=True)
class _Drawn:
    """The faults one request gets: a delay, a hang, or where its stream stops."""

    spike_s: float = 0.0
    hang: bool = False
    cut_after: int | None = None
    stall: bool = False  # at ``cut_after``: go silent rather than drop the connection


Event = tuple[int, StepEvent]  # a choice's index and one engine step of it


def _short_hash(key: str) -> str:
    return f"{draw(key):016x}"


class SimServer:
    """A simulated vLLM server's state and its generation endpoints."""

    def __init__(self, config: SimConfig, *, clock: Clock, sleep: Sleep, wall_clock: Clock) -> None:
        self.config = config
        self.scheduler = Scheduler.for_config(config)
        self.engine = Engine(self.scheduler, time_scale=config.time_scale, clock=clock, sleep=sleep)
        self.iterations: deque[Iteration] = deque(maxlen=ITERATION_QUEUE)
        self.recent: deque[Iteration] = deque(maxlen=LOG_INTERVAL)
        self.scheduler.on_step = self._stepped
        self.gate: deque[float] = deque(maxlen=max(config.acceptance_rate_window_size, 1))
        self.speculation_off_at: float | None = None
        self.bank = TextBank(config.seed)
        self.overrides: dict[Workload, float] = {}
        self.faults: Faults = config.faults
        self.outcomes = Outcomes()
        self.histories = Histories()  # the conversations of the Responses answers made
        self.stored = Stored()  # and their bodies (GET /v1/responses/{id})
        # vLLM with --otlp-traces-endpoint parents its llm_request span on this header
        self.traceparents: deque[str] = deque(maxlen=64)
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

    def _stepped(self, step: Step, prefill_tokens: int) -> None:
        """One engine step, as the engine's iteration stats count it."""
        scheduler = self.scheduler
        decoding = [e for _, e in step.events if e.start > 0]
        done = Iteration(
            scheduler.counters.steps,
            step.seconds,
            scheduler.num_running,
            scheduler.num_waiting,
            sum(e.finished for _, e in step.events),
            len(step.events) - len(decoding),
            len(decoding),
            prefill_tokens,
            sum(e.drafted for e in decoding),
            sum(e.accepted for e in decoding),
            sum(e.drafted > 0 for e in decoding),
        )
        self.iterations.append(done)
        if decoding:
            self.recent.append(done)

    def _gated(self, job: Job) -> None:
        """TensorRT-LLM's speculation gate: a finished request's draft acceptance joins a
        rolling window; below the threshold over a full window, speculation stops for good."""
        threshold, one = self.config.acceptance_rate_threshold, job.single
        if threshold is None or one is None or not self.scheduler.speculative:
            return
        if one.seq.tally.num_draft_tokens:
            self.gate.append(one.seq.tally.draft_acceptance_rate)
        full = len(self.gate) == self.config.acceptance_rate_window_size
        if full and sum(self.gate) / len(self.gate) < threshold:
            self.scheduler.speculative = False
            self.speculation_off_at = self.model_time_s

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

    async def messages(self, request: Request) -> Response:
        api = MessagesApi(cache_read=self.config.enable_prompt_tokens_details)
        return await self._generate(request, chat=True, api=api)

    async def responses(self, request: Request) -> Response:
        return await self._generate(
            request, chat=True, api=ResponsesApi(self.histories, self.stored, self._now())
        )

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt's tokens, as the chat request the
        Messages request becomes would count them."""
        try:
            chat = api_messages.chat_request(await request.body(), count=True)
            if chat["model"] not in self.config.served_model_names:
                names = ", ".join(self.config.served_model_names)
                message = f"The model `{chat['model']}` does not exist. Valid aliases: {names}."
                raise SimHTTPError(404, message, "NotFoundError", "model")
        except SimHTTPError as err:
            body = api_messages.error_body(err)
            return Response(body, err.status, media_type="application/json")
        tokens = estimate_prompt_tokens(chat)
        return Response(api_messages.count_body(tokens), media_type="application/json")

    def _now(self) -> int:
        return int(self._wall())

    async def _generate(
        self, request: Request, *, chat: bool, api: AgentApi | None = None
    ) -> Response:
        config = self.config
        traceparent = request.headers.get("traceparent")
        if traceparent is not None:
            self.traceparents.append(traceparent)
        try:
            body = await request.body()
            ask = parse(
                body if api is None else api.chat_body(body),
                chat=chat,
                names=config.served_model_names,
                default_max_tokens=config.default_max_tokens,
                max_model_len=config.max_model_len,
                max_logprobs=config.max_logprobs,
            )
            if ask.deferred is not None:
                return self._refused(ask.deferred, ask.stream and api is None)
            drawn = self._draw_faults()
        except SimHTTPError as err:
            self.outcomes.rejected += err.status < 500
            body = err.body if api is None else api.error(err)
            return Response(body, err.status, media_type="application/json")
        job = self._job(ask, request.headers.get("x-request-id"))
        self.outcomes.streamed += ask.stream
        # an agent API's answer is converted from the chat one, which then carries the hits
        job.show_cached = config.enable_prompt_tokens_details or api is not None
        if drawn.spike_s:
            await self._sleep(drawn.spike_s)
        if drawn.hang:
            return _hang(ask.stream, partial(self._close, job))
        if ask.stream:
            return self._stream(job, drawn, None if api is None else api.stream(job.answer))
        if config.zero_latency and drawn.cut_after is None:
            self._run_alone(job)
            self._close(job)
            return Response(self._converted(job, api), media_type="application/json")
        wait = partial(self._wait_body, job, api)
        return DeferredJSON(wait, partial(self._close, job), self._whole_cut(drawn))

    def _converted(self, job: Job, api: AgentApi | None) -> bytes:
        body = self._body(job)
        return body if api is None else api.whole(job.answer, body)

    def _whole_cut(self, drawn: _Drawn) -> str | None:
        """A dying or stalling server breaks a whole answer too: halfway through its body."""
        if drawn.cut_after is None:
            return None
        if drawn.stall:
            self.outcomes.stalls += 1
            return "stall"
        self.outcomes.drops += 1
        return "drop"

    def _refused(self, error: SimHTTPError, stream: bool) -> Response:
        """A request the engine refuses: a stream already answered 200, so vLLM sends the
        error as its first event and then ``[DONE]``; a whole answer gets the status."""
        if not stream:
            raise error
        self.outcomes.rejected += 1
        body = b"data: " + error.event() + b"\n\n" + DONE
        return Response(body, media_type=SSE_MEDIA_TYPE)

    def _draw_faults(self) -> _Drawn:
        """Decide this request's faults; raises for the ones answered before any work."""
        faults, rng, out = self.faults, self._fault_rng, self.outcomes
        error, spike, die, stall, hang = (rng.random() for _ in range(5))
        if faults.overloaded:
            out.overloaded += 1
            raise SimHTTPError(503, "The server is overloaded.", "ServiceUnavailableError")
        if error < faults.error_rate:
            out.errors_injected += 1
            raise SimHTTPError(500, "Injected engine error.", "InternalServerError")
        spike_s = faults.spike_s * self.config.time_scale if spike < faults.spike_rate else 0.0
        out.spikes += spike_s > 0
        if hang < faults.hang_rate:
            out.hangs += 1
            return _Drawn(spike_s, hang=True)
        if stall < faults.stall_rate:
            return _Drawn(spike_s, cut_after=faults.die_after_chunks, stall=True)
        if die < faults.die_rate:
            return _Drawn(spike_s, cut_after=faults.die_after_chunks)
        return _Drawn(spike_s)

    def _job(self, ask: Ask, request_id: str | None = None) -> Job:
        index = self.outcomes.requests
        self.outcomes.requests += 1
        choices = [self._choice(ask, index, i) for i in range(ask.n)]
        profile = choices[0].profile
        prefix = "chatcmpl-" if ask.chat else "cmpl-"
        answer = Answer(
            chat=ask.chat,
            request_id=prefix + (request_id or _short_hash(profile.seed_key)),
            created=int(self._wall()),
            model=ask.model,
            prompt_tokens=profile.prompt_tokens,
            include_usage=ask.include_usage,
            tool_name=profile.tool_name,
            tool_call_id="chatcmpl-tool-" + _short_hash(profile.seed_key + ":tool"),
            logprobs=ask.logprobs,
            token_ids=ask.token_ids,
            prompt_ids=self._prompt_ids(ask, profile.prompt_tokens),
            prompt_logprobs=ask.prompt_logprobs,
            key=profile.text_key,
            continuous_usage=ask.continuous_usage,
        )
        return Job(ask, answer, choices)

    def _choice(self, ask: Ask, index: int, choice: int) -> Choice:
        config = self.config
        profile = build_profile(
            sampled(ask.body, config.default_temperature),
            seed=config.seed,
            index=index,
            max_tokens=ask.max_tokens,
            now_s=self.model_time_s,
            model=config.acceptance,
            drift=config.drift,
            overrides=self.overrides,
            greedy_mismatch=self.faults.greedy_mismatch if config.speculative else 0.0,
            choice=choice,
        )
        if profile.tool_name:
            properties = tool_parameters(ask.body, profile.tool_name)
        else:
            properties = schema_properties(ask.body)
        tokens = self.bank.tokens(profile, properties)
        structured = profile.tool_name is not None or profile.workload is Workload.JSON
        broken = draw(f"{profile.seed_key}:broken") / 2**64 < self.faults.broken_structure
        if structured and broken and tokens and profile.finish_reason != "length":
            tokens[-1] = " "  # the closing brace never comes: the answer does not parse
        hashes = (
            sequence_hashes(ask.body, config.block_size, answer_text(tokens))
            if config.enable_prefix_caching
            else ()
        )
        return Choice(choice, profile, tokens, Sequence(profile, config.k, hashes=hashes))

    @staticmethod
    def _prompt_ids(ask: Ask, count: int) -> tuple[int, ...]:
        """The prompt's token ids, made only when the answer shows them."""
        if not ask.token_ids and ask.prompt_logprobs is None:
            return ()
        return tuple(prompt_ids(prompt_text(ask.body), count))

    def _tally(self, job: Job) -> SpecTally | None:
        """Per-request metrics describe one sequence: none for ``n`` > 1, as in vLLM."""
        one = job.single
        return one.seq.tally if one is not None and self.config.reports_spec else None

    def _timings(self, job: Job) -> Timings | None:
        """vLLM's per-request timing metrics, from the engine's timestamps of ``job``."""
        one = job.single
        if one is None or not self.config.timing_metrics or self.config.engine.value != "vllm":
            return None
        return timings(one.seq.times, one.seq.emitted)

    def _close(self, job: Job) -> None:
        if job.closed:
            return
        job.closed = True
        if job.finished:
            self.outcomes.completed += 1
            self._gated(job)
            return
        for choice in job.choices:
            self.engine.cancel(choice.seq)
        self.outcomes.cancelled += 1

    def _run_alone(self, job: Job) -> list[Event]:
        """Every step of every choice at once, the choices' steps interleaved."""
        runs = [[(c.index, e) for e in self.scheduler.run_alone(c.seq)] for c in job.choices]
        return [event for step in itertools.zip_longest(*runs) for event in step if event]

    def _body(self, job: Job) -> bytes:
        endings = [c.ending() for c in job.choices]
        tally, times = self._tally(job), self._timings(job)
        body = whole_body(job.answer, endings, job.completion_tokens, tally, times, job.cached)
        return dialects.whole(self.config.engine, body, _per_step(job), self._sglang_ext(job))

    async def _wait_body(self, job: Job, api: AgentApi | None = None) -> bytes:
        async for _ in self._events(job):
            pass
        return self._converted(job, api)

    async def _events(self, job: Job) -> AsyncIterator[Event]:
        if self.config.zero_latency:
            for event in self._run_alone(job):
                yield event
            return
        inbox: asyncio.Queue[Event] = asyncio.Queue()
        for choice in job.choices:
            choice.seq.sink = partial(_tagged, inbox, choice.index)
            self.engine.submit(choice.seq)
        running = len(job.choices)
        while running:
            event = await inbox.get()
            yield event
            running -= event[1].finished

    def _stream(self, job: Job, drawn: _Drawn, converter: Converter | None = None) -> Response:
        """``converter``: the chat chunks become another API's events."""
        on_close = partial(self._close, job)
        if converter is not None:
            return self._stream_as(job, drawn, converter)
        if drawn.cut_after is not None:
            head = _first(self._chunks(job), drawn.cut_after)
            if drawn.stall:
                self.outcomes.stalls += 1
                return EventStream(_then_silence(head), on_close)
            self.outcomes.drops += 1
            return EventStream(head, on_close, complete=False)
        engine = self.config.engine
        if self.config.zero_latency:
            events = self._run_alone(job)
            self._close(job)
            rendered = self._render(job, events)
            if not engine.vllm_shaped:
                rendered = [c for e in rendered for c in dialects.chunk(engine, e, _per_step(job))]
            return Response(b"".join(rendered), media_type=SSE_MEDIA_TYPE)
        if engine.vllm_shaped:
            return EventStream(self._chunks(job), on_close)
        return EventStream(_in_dialect(engine, job, self._chunks(job)), on_close)

    def _stream_as(self, job: Job, drawn: _Drawn, converter: Converter) -> Response:
        on_close = partial(self._close, job)
        if self.config.zero_latency and drawn.cut_after is None:
            events = self._run_alone(job)
            self._close(job)
            rendered = self._render(job, events)
            return Response(b"".join(map(converter.feed, rendered)), media_type=SSE_MEDIA_TYPE)
        chunks = _fed(self._chunks(job), converter)
        if drawn.cut_after is None:
            return EventStream(chunks, on_close)
        head = _first(chunks, drawn.cut_after)
        if drawn.stall:
            self.outcomes.stalls += 1
            return EventStream(_then_silence(head), on_close)
        self.outcomes.drops += 1
        return EventStream(head, on_close, complete=False)

    async def _chunks(self, job: Job) -> AsyncGenerator[bytes, None]:
        writers, chunkers = (
            self._writers(job),
            [Chunker(self.config.stream_interval) for _ in job.choices],
        )
        if job.ask.chat:
            for writer in writers:
                yield writer.role()
        async for index, event in self._events(job):
            span = chunkers[index].add(event)
            if span is not None:
                yield self._content(job.choices[index], writers[index], span)
        for chunk in self._tail(job, writers[0]):
            yield chunk

    def _writers(self, job: Job) -> list[ChunkWriter]:
        return [ChunkWriter(job.answer, c.index) for c in job.choices]

    def _render(self, job: Job, events: Iterable[Event]) -> list[bytes]:
        """A whole stream at once (zero-latency mode): role chunks, content, the tail."""
        writers = self._writers(job)
        out = [w.role() for w in writers] if job.ask.chat else []
        chunkers = [Chunker(self.config.stream_interval) for _ in job.choices]
        for index, event in events:
            span = chunkers[index].add(event)
            if span is not None:
                out.append(self._content(job.choices[index], writers[index], span))
        return out + self._tail(job, writers[0])

    @staticmethod
    def _content(choice: Choice, writer: ChunkWriter, span: Span) -> bytes:
        start, end, finished = span
        pieces = choice.pieces(start, end)
        return writer.content(
            "".join(pieces),
            first=start == 0,
            finish_reason=choice.profile.finish_reason if finished else None,
            pieces=pieces,
            start=start,
        )

    def _tail(self, job: Job, writer: ChunkWriter) -> list[bytes]:
        ext = self._sglang_ext(job)
        head = [] if ext is None else [dialects.sglang_ext(_envelope(job), *ext)]
        if not job.ask.include_usage:
            return [*head, DONE]
        tally, times = self._tally(job), self._timings(job)
        usage = writer.usage(job.completion_tokens, tally, times, job.cached)
        return [*head, usage, DONE]

    def _sglang_ext(self, job: Job) -> tuple[int, int, int] | None:
        """SGLang's per-request counts, when asked (``return_spec_tokens_details``)."""
        one = job.single
        asked = job.ask.body.get("return_spec_tokens_details") is True
        if one is None or not asked or self.config.engine is not dialects.SimEngine.SGLANG:
            return None
        tally = one.seq.tally
        return tally.num_spec_steps, tally.num_draft_tokens, tally.num_accepted_draft_tokens


def _envelope(job: Job) -> dict[str, object]:
    answer = job.answer
    kind = "chat.completion.chunk" if answer.chat else "text_completion"
    return {
        "id": answer.request_id,
        "object": kind,
        "created": answer.created,
        "model": answer.model,
    }


def _per_step(job: Job) -> float | None:
    """Tokens over engine iterations so far, prefill's included (TensorRT-LLM's
    ``avg_decoded_tokens_per_iter``), for a one-choice answer."""
    one = job.single
    return one.seq.emitted / one.seq.steps if one is not None and one.seq.steps else None


async def _in_dialect(
    engine: dialects.SimEngine, job: Job, chunks: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(chunks) as source:
        async for event in source:
            for rewritten in dialects.chunk(engine, event, _per_step(job)):
                yield rewritten


async def _fed(
    chunks: AsyncGenerator[bytes, None], converter: Converter
) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(chunks) as source:
        async for chunk in source:
            converted = converter.feed(chunk)
            if converted:
                yield converted


def _tagged(inbox: asyncio.Queue[Event], index: int, event: StepEvent) -> None:
    inbox.put_nowait((index, event))


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


async def _then_silence(chunks: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """``chunks``, then nothing until the client goes away (the ``stall`` fault)."""
    async with contextlib.aclosing(chunks) as source:
        async for chunk in source:
            yield chunk
    await asyncio.Event().wait()
    yield b""  # pragma: no cover - never reached


def _hang(stream: bool, on_close: Callable[[], None]) -> Response:
    """An answer that never comes: headers and silence for a stream, nothing at all else."""
    if stream:
        return EventStream(_then_silence(_nothing()), on_close)

    async def never() -> bytes:
        await asyncio.Event().wait()
        return b""  # pragma: no cover - never reached

    return DeferredJSON(never, on_close)


async def _nothing() -> AsyncGenerator[bytes, None]:
    return
    yield b""  # pragma: no cover - makes this an async generator
