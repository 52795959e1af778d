"""Step 7 of a request: where every finished outcome goes, and where the canary's alarm goes.

``Feedback.record`` is the one sink of outcomes: the client's answers after their checks
(``checks.py``), shadow mirrors, and answers that failed or were cancelled. It gives the
outcome its mean load (the requests in flight on its endpoint over its life, and the prompt
tokens prefilled beside it per step, ``load.py``), then hands it, at one wall-clock time, to
live statistics (the guardrail's evidence, ``livestats.py``), the metrics
(``telemetry.py``), the per-pool count of acceptance signals (``signals.py``), the
prefix-cache tally (``cachehits.py``), the slice's conversations (output tokens per turn,
``conversations.py``) and the outcome log (``outcomelog.py``). O(1) and
never awaits. ``Feedback.prefilled`` tells the load meter that an endpoint prefilled a
prompt (a stream opened, a whole answer came).

``Feedback.canary_failed`` turns the canary's verdict on a slice (greedy output differs on
speculation, ``canary.py``) into a guardrail alarm on that slice.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.measure.acceptance import Outcome, Status
from gateway.measure.cachehits import CacheHits
from gateway.measure.canary import CanaryCounts
from gateway.measure.conversations import Conversations
from gateway.measure.livestats import LiveStats
from gateway.measure.load import LoadMeter, loaded_outcome
from gateway.measure.outcomelog import OutcomeLog
from gateway.measure.signals import SignalsSeen
from gateway.measure.telemetry import Telemetry


class Feedback:
    """Fans each outcome out to everything that learns from it."""

    __slots__ = (
        "_load",
        "_stats",
        "_telemetry",
        "_wall",
        "cache",
        "conversations",
        "outcomes",
        "signals",
    )

    def __init__(
        self,
        stats: LiveStats,
        telemetry: Telemetry,
        signals: SignalsSeen,
        outcomes: OutcomeLog,
        load: LoadMeter,
        wall: Callable[[], float],
    ) -> None:
        self._stats = stats
        self._telemetry = telemetry
        self.signals = signals
        self.outcomes = outcomes
        self._load = load
        self._wall = wall
        self.cache = CacheHits()
        self.conversations = Conversations()

    def record(self, outcome: Outcome) -> None:
        loaded = loaded_outcome(self._load, outcome)
        now = self._wall()
        self._stats.record(loaded, now)
        self._telemetry.observe(loaded)
        self.signals.record(loaded)
        self.cache.add(loaded)
        if not loaded.labels.shadow and loaded.status is Status.OK:
            self.conversations.answered(loaded.labels.slice, loaded.completion_tokens)
        self.outcomes.add(loaded, now)

    def prefilled(
        self,
        url: str,
        prompt_tokens: int,
        now: float,
        request_id: str = "",
        computed: int | None = None,
    ) -> None:
        """An endpoint prefilled a prompt by ``now`` (a stream opened, or a whole answer
        came), computing ``computed`` of its tokens (None: all): the load meter counts
        those against the requests decoding beside it, and holds the prompt in the
        endpoint's cache until the request's outcome."""
        self._load.prefill(url, prompt_tokens, now, request_id, computed)

    def canary_failed(self, slice_key: str, counts: CanaryCounts) -> None:
        rate = counts.matched / counts.compared
        numbers = {"compared": float(counts.compared), "exact_match_rate": rate}
        reason = f"canary: greedy output differs on speculation (exact match {rate:.1%})"
        self._stats.alarm(slice_key, reason, numbers, self._wall())
