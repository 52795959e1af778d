"""Steps 6 and 7 for one answer: measured once, whatever way it came and whatever API it
speaks.

A ``Measurement`` is made for each upstream answer, streamed or whole: it folds what the
answer says (usage and the engine's metrics, output chunks and their times, the finish
reason, the text the shadow canary compares, the shape the validity checks read), and
``finish`` is the one place where the answer ends. There, exactly once: the outcome is
made (``Fold.finish``; for a whole answer, the engine's own timings stand in for the ones
the gateway could not see, ``engine_metrics.py``), ``Checks.finish`` checks the answer and
records the outcome (step 7), the trace is told, and ended when the answer outlives the
handler (a stream), and the canary gets the answer's text, or is cancelled when the answer
failed.

How an answer is read is its dialect's (``Dialect``): the streamed relay
(``gateway/forward/relay.py``) parses each event as JSON and hands it to
``Dialect.event``, the whole-answer path (``gateway/pipeline.py``) hands the body to
``Dialect.whole``. ``completions.py`` is OpenAI's chat and text completions;
``messages.py`` Anthropic's Messages and ``responses.py`` OpenAI's Responses, each a
class with the methods of ``Dialect`` that reads its own events and calls the
measurement's methods below
(``content`` per output event, ``usage`` with the usage in OpenAI's names
``prompt_tokens``/``completion_tokens``, ``finished``, ``answered`` for a whole body,
``response_id`` for the id of a stored answer). A new API is one more such module. What a
relay does to the bytes themselves is the completions API's (the usage chunk it drops when
the client did not ask for usage, the body ``Relay.collect`` assembles); the other APIs'
streams are relayed event by event as they came (``gateway/forward/events.py``, which
ends them at their ``EventDialect.last`` events), and their whole answers pass through.

No I/O: time comes from the clock it is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from gateway.measure.acceptance import Fold, Outcome, Status
from gateway.measure.checks import Checks
from gateway.measure.engine_metrics import engine_timed
from gateway.measure.tracing import Trace
from gateway.measure.validity import Collected, Expectation


class Dialect(Protocol):
    """How one API's answers are read into a ``Measurement``."""

    def event(
        self, measurement: Measurement, event: dict[str, Any], now: float
    ) -> tuple[str, int | None] | None:
        """One streamed event, parsed, that arrived at ``now``: measured, or, when it is an
        error event, its message and HTTP status (None when its code is none) returned."""
        ...

    def whole(self, measurement: Measurement, body: dict[str, Any]) -> None:
        """A whole (non-streamed) answer's body."""
        ...


class EventDialect(Dialect, Protocol):
    """The dialect of an API whose stream is relayed event by event: ``last`` are the types
    of the events that end its answer."""

    last: frozenset[str]


class Measurement:
    """One answer, from its first event (or its whole body) to its outcome.

    ``fold`` and ``structure`` are for the dialect: the engine's own signals go to the
    fold, and the answer's text and tool calls, in the dialect's shape, to ``structure``
    (None when the request asked for nothing to check). ``checks`` records the outcome
    (through the validity checks); ``trace`` is the request's (None for a shadow mirror),
    ended at ``finish`` when ``ends_trace``; ``capture`` receives the answer's text (the
    canary's comparison); ``on_metrics`` the engine's per-request ``metrics`` (whether the
    pool reports them)."""

    __slots__ = (
        "_capture",
        "_checks",
        "_clock",
        "_ends_trace",
        "_expect",
        "_finished",
        "_metrics",
        "_on_metrics",
        "_on_response_id",
        "_text",
        "_trace",
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
        on_metrics: Callable[[object], None] | None = None,
        on_response_id: Callable[[str], None] | None = None,
    ) -> None:
        self.fold = fold
        self.structure = Collected() if expect is not None else None
        self._clock = clock
        self._checks = checks
        self._expect = expect
        self._trace = trace
        self._ends_trace = ends_trace
        self._capture = capture
        self._text: list[str] | None = [] if capture is not None else None
        self._on_metrics = on_metrics
        self._on_response_id = on_response_id
        self._metrics: object = None
        self._finished = False
        if trace is not None:
            trace.relaying()

    def content(self, now: float, finish: str | None, text: str | None = None) -> None:
        """An event that carried output tokens arrived at ``now``; ``text``: what it adds
        to the first choice's text (None for another choice)."""
        self.fold.content(now, finish)
        if self._text is not None and text is not None:
            self._text.append(text)

    def finished(self, reason: str) -> None:
        self.fold.finished(reason)

    def usage(self, usage: dict[str, Any], metrics: object) -> None:
        """The answer's usage (OpenAI's names) and the engine's per-request ``metrics``."""
        self.fold.usage(usage, metrics if isinstance(metrics, dict) else None)
        if self._on_metrics is not None:
            self._on_metrics(metrics)

    def response_id(self, response_id: str) -> None:
        """The id the upstream stored this answer under."""
        if self._on_response_id is not None:
            self._on_response_id(response_id)

    def answered(self, text: str, metrics: object) -> None:
        """A whole answer: the first choice's text, and the engine's ``metrics``, whose
        timings stand in for the token times the gateway did not see."""
        if self._text is not None:
            self._text.append(text)
        self._metrics = metrics

    def finish(self, status: Status, error: str = "") -> Outcome | None:
        """The end of the answer, told to everyone once; None when it had ended already."""
        if self._finished:
            return None
        self._finished = True
        outcome = self.fold.finish(status, self._clock(), error)
        if self._metrics is not None:
            outcome = engine_timed(outcome, self._metrics)
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
