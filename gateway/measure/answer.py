"""Steps 6 and 7 for one answer: measured once, whatever way it came and whatever API it
speaks.

A ``Measurement`` is made for each upstream answer, streamed or whole: it folds what the
answer says (usage and the engine's own figures, output chunks and their times, the finish
reason, the text the shadow canary compares, the shape the validity checks read), and
``finish`` is the one place where the answer ends. There, exactly once: the outcome is
made (``Fold.finish``; for a whole answer, the engine's own timings stand in for the ones
the gateway could not see, ``engine_metrics.py``), ``Checks.finish`` checks the answer and
records the outcome (step 7), the trace is told, and ended when the answer outlives the
handler (a stream), and the canary gets the answer's text, or is cancelled when the answer
failed.

How an answer is read is its dialect's (``Dialect``), and what it says of its own
speculation its engine's (``gateway/engines/``: the completions dialect hands each chunk and
whole body to ``said`` and ``said_whole``, and the engine reads them). The streamed relay
(``gateway/forward/relay.py``) parses each event as JSON and hands it to
``Dialect.event``, the whole-answer path (``gateway/pipeline.py``) hands the body to
``Dialect.whole``. ``completions.py`` is OpenAI's chat and text completions;
``messages.py`` Anthropic's Messages and ``responses.py`` OpenAI's Responses, each a
class with the methods of ``Dialect`` that reads its own events and calls the
measurement's methods below
(``content`` per output event, ``usage`` with the usage in OpenAI's names
``prompt_tokens``/``completion_tokens``, ``finished``, ``answered`` for a whole body,
``response_id`` for the id of a stored answer). A new API brings its own (its module in
``gateway/apis/`` names it). What a relay does to the bytes themselves is the completions
API's (the usage chunk it drops when the client did not ask for usage, the body
``Relay.collect`` assembles); the other APIs' streams are relayed event by event as they
came, ended at their dialect's ``last`` events, and their whole answers pass through.

No I/O: time comes from the clock it is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gateway.engines import ENGINES, Engine, Timings
from gateway.measure.acceptance import Fold, Outcome, Status
from gateway.measure.checks import Checks
from gateway.measure.engine_metrics import engine_timed
from gateway.measure.tracing import Trace
from gateway.measure.validity import Collected, Expectation


class Dialect(Protocol):
    """How one API's answers are read into a ``Measurement``, and how its stream is
    relayed: ``last`` are the types of the events that end an answer relayed event by event
    as it came (Messages, Responses), None for a stream of data chunks ended by ``[DONE]``
    (chat and text completions)."""

    @property
    def last(self) -> frozenset[str] | None: ...

    def event(
        self, measurement: Measurement, event: dict[str, Any], now: float
    ) -> tuple[str, int | None] | None:
        """One streamed event, parsed, that arrived at ``now``: measured, or, when it is an
        error event, its message and HTTP status (None when its code is none) returned."""
        ...

    def whole(self, measurement: Measurement, body: dict[str, Any]) -> None:
        """A whole (non-streamed) answer's body."""
        ...


class Measurement:
    """One answer, from its first event (or its whole body) to its outcome.

    ``fold`` and ``structure`` are for the dialect: the engine's own signals go to the
    fold (those of its speculation through ``said``, read by ``engine``, by default the
    engine the fold's labels name), and the answer's text and tool calls, in the
    dialect's shape, to ``structure`` (None when the request asked for nothing to check).
    ``checks`` records the outcome (through the validity checks); ``trace`` is the
    request's (None for a shadow mirror), ended at ``finish`` when ``ends_trace``;
    ``capture`` receives the answer's text (the canary's comparison); ``on_reported``
    whether each usage chunk or whole answer said its speculation per request (whether the
    pool reports it)."""

    __slots__ = (
        "_capture",
        "_checks",
        "_clock",
        "_ends_trace",
        "_expect",
        "_finished",
        "_on_reported",
        "_on_response_id",
        "_text",
        "_timings",
        "_trace",
        "engine",
        "fold",
        "structure",
    )

    def __init__(
        self,
        fold: Fold,
        clock: Callable[[], float],
        checks: Checks,
        *,
        expect: Expectation | None = None,
        trace: Trace | None = None,
        ends_trace: bool = False,
        capture: asyncio.Future[str] | None = None,
        on_reported: Callable[[bool], None] | None = None,
        on_response_id: Callable[[str], None] | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.fold = fold
        self.engine = engine if engine is not None else ENGINES.of(fold.labels.engine)
        self.structure = Collected() if expect is not None else None
        self._clock = clock
        self._checks = checks
        self._expect = expect
        self._trace = trace
        self._ends_trace = ends_trace
        self._capture = capture
        self._text: list[str] | None = [] if capture is not None else None
        self._on_reported = on_reported
        self._on_response_id = on_response_id
        self._timings: Timings | None = None
        self._finished = False
        if trace is not None:
            trace.relaying()

    def content(self, now: float, finish: str | None, text: str | None = None) -> None:
        """An event that carried output tokens arrived at ``now``; ``text``: what it adds
        to the first choice's text (None for another choice)."""
        self.fold.content(now, finish, len(text) if text else 0)
        if self._text is not None and text is not None:
            self._text.append(text)

    def finished(self, reason: str) -> None:
        self.fold.finished(reason)

    def usage(self, usage: dict[str, Any], answer: Mapping[str, Any] | None = None) -> None:
        """The answer's usage (OpenAI's names), and the usage chunk or whole body that
        carried it, whose per-request figures the engine reads (its times, and whether it
        said its speculation)."""
        timings = self.engine.timings(answer) if answer is not None else None
        self.fold.usage(usage, timings.queue_s if timings is not None else None)
        if self._on_reported is not None:
            self._on_reported(answer is not None and self.engine.evidence(answer) is not None)

    def said(self, chunk: Mapping[str, Any]) -> None:
        """One streamed chunk: what its engine reads there of the answer's speculation."""
        evidence = self.engine.evidence(chunk)
        if evidence is not None:
            self.fold.evidence(evidence)

    def said_whole(self, body: Mapping[str, Any]) -> None:
        """A whole answer's body: what its engine reads there of its speculation."""
        evidence = self.engine.whole(body)
        if evidence is not None:
            self.fold.evidence(evidence)

    def own(self, chunk: Mapping[str, Any]) -> bool:
        """The chunk is one the engine adds of its own (``Engine.own``), with no output."""
        return self.engine.own is not None and self.engine.own(chunk)

    def response_id(self, response_id: str) -> None:
        """The id the upstream stored this answer under."""
        if self._on_response_id is not None:
            self._on_response_id(response_id)

    def answered(self, text: str, body: Mapping[str, Any] | None = None) -> None:
        """A whole answer: the first choice's text, and the body, whose times the engine
        measured (``Engine.timings``) stand in for the token times the gateway did not see."""
        if self._text is not None:
            self._text.append(text)
        self._timings = self.engine.timings(body) if body is not None else None

    def finish(self, status: Status, error: str = "") -> Outcome | None:
        """The end of the answer, told to everyone once; None when it had ended already."""
        if self._finished:
            return None
        self._finished = True
        outcome = self.fold.finish(status, self._clock(), error)
        if self._timings is not None:
            outcome = engine_timed(outcome, self._timings)
        self._checks.finish(outcome, self._expect, self.structure)
        if self._trace is not None:
            self._trace.finished(outcome)
            if self._ends_trace:
                self._trace.end(200)
        capture = self._capture
        if capture is not None and not capture.done():
            if status is Status.OK and self._text is not None:
                capture.set_result("".join(self._text))
            else:
                capture.cancel()
        return outcome
