"""What one serving engine is, in one value, and the registry that looks engines up.

An ``Engine`` carries everything the gateway does differently for one engine, whatever API
a request speaks: the fields a request to it must add to get its per-request figures, how
an answer's own figures of speculation are read (``Evidence``), whether an answer
assembled from its stream is the one it would have given whole, how its pages show
speculation and load (the pool scraper, the load scraper), and how ``speclane init``
recognises it. Everything else (steps 1-8, failover, the guardrail) is the same for every
engine. A pool's ``engine`` names its engine; a new engine is one module that makes its
``Engine`` and one row in ``gateway/engines/__init__.py``.

Pure, but for ``Figures``: the readers it makes fetch pages through the function they are
given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.counters import SpecCounters
from gateway.engines.recognition import Found, Pages
from policies.engines import EngineProfile

Fetch = Callable[[str], Awaitable[str]]  # GET a page (a full URL) as text; BackendError
Drain = Callable[[str, dict[str, float], int | None, int | None], Awaitable[dict[str, float]]]


@dataclass(frozen=True, slots=True)
class Said:
    """What one answer says of its own speculation: draft tokens proposed and accepted, its
    decode steps (None: unknown) and the mean tokens a drafting step emitted."""

    drafted: int
    accepted: int
    steps: int | None
    mean_length: float | None = None


class Evidence(Protocol):
    """An answer's own figures, as its engine gave them, read once its tokens are known."""

    @property
    def tokens_per_step(self) -> float | None:
        """The tokens per step the answer says, where that is all it says of speculation
        (no drafts); None where it says more."""
        ...

    def said(self, tokens: int, k: int, chunk_steps: int) -> Said | None:
        """What they say of an answer of ``tokens`` output tokens from a pool of ``k``;
        ``chunk_steps`` are the decode steps its stream's chunks show (a lower bound, 0 when
        they show none). None when they say nothing."""
        ...


@dataclass(frozen=True, slots=True)
class Timings:
    """An answer's own times, measured in the engine, in seconds (None where not said): to
    its first token from when it was scheduled, queued before that, and per output token
    after the first."""

    first_s: float | None = None
    queue_s: float | None = None
    per_token_s: float | None = None


@dataclass(frozen=True, slots=True)
class Gauges:
    """What an engine without counters says of itself right now."""

    rate: float | None = None
    length: float | None = None
    lifetime_length: float | None = None


class Figures(Protocol):
    """How the pool scraper reads the endpoints of one engine: cumulative counters it
    differences, or (``Engine.gauged``) figures shown as they are. One per scraper: it may
    remember what an endpoint lacks."""

    async def read(self, url: str) -> SpecCounters | Gauges:
        """``url``'s figures now; ``BackendError`` or ``ValueError`` when not read."""
        ...

    @property
    def lost(self) -> Mapping[str, float]:
        """Per endpoint read drained-on-read: iterations the server dropped unread."""
        ...


def _nothing(answer: Mapping[str, Any]) -> Evidence | None:
    return None


def _untimed(answer: Mapping[str, Any]) -> Timings | None:
    return None


def _unrecognised(pages: Pages) -> Found | None:
    return None


def _no_advice(found: Found) -> list[str]:
    return []


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """One serving engine behind a pool.

    ``name`` is what a pool's ``engine`` says. ``asks``: fields a streamed request to a
    speculative pool of it carries, so that its answer says its own figures (they go on the
    gateway's account: ``own`` recognises the chunk they add, which the client gets only
    when it asked for the same itself). ``evidence`` reads one streamed chunk or usage
    chunk of a chat or completions answer, ``whole`` a whole answer's body (both None when
    they say nothing of speculation); ``timings``, the times a usage chunk or a whole answer
    says the engine measured (``gateway/measure/engine_metrics.py``). ``assembles``: an
    answer assembled from its stream is the one it would have given whole, field by field
    (``gateway/forward/passthrough.py``). ``figures`` makes the pool scraper's reader of its
    pages (None: it shows none); ``gauged``: they are gauges, shown as they are, never
    differenced. ``load``: the series of its ``/metrics`` page that count the requests it
    runs and queues (empty: the page is not read, ``gateway/measure/loadscrape.py``).
    ``owners``: the ``owned_by`` of its model cards; ``counters_page``: where ``speclane
    init`` reads its counters before and after the probe; ``info_page``: a page of its own
    ``init`` reads too; ``series``: the prefix of its own series on ``/metrics``, which
    shows it whatever its model cards say; ``recognise``: the engine, speculation and k of
    one endpoint from its pages, None when they are not this engine's
    (``gateway/setup/found.py`` asks each in turn); ``advice``: what the operator of a
    speculative endpoint of it should know or do. ``shows``: what it shows of speculation,
    in the words of the policy lint and of the pools' description on ``/readyz``
    (``policies/engines.py``), for an engine that ``PROFILES`` there does not hold.
    """

    name: str
    asks: Mapping[str, object] = field(default_factory=dict)
    own: Callable[[Mapping[str, Any]], bool] | None = None
    evidence: Callable[[Mapping[str, Any]], Evidence | None] = _nothing
    whole: Callable[[Mapping[str, Any]], Evidence | None] = _nothing
    timings: Callable[[Mapping[str, Any]], Timings | None] = _untimed
    assembles: bool = False
    figures: Callable[[Fetch, Drain], Figures] | None = None
    gauged: bool = False
    load: frozenset[str] = frozenset()
    owners: frozenset[str] = frozenset()
    counters_page: str = "/metrics"
    info_page: str | None = None
    series: str | None = None
    recognise: Callable[[Pages], Found | None] = _unrecognised
    advice: Callable[[Found], list[str]] = _no_advice
    shows: EngineProfile | None = None

    def asked_by(self, payload: Mapping[str, Any]) -> bool:
        """The client asked for everything ``asks`` adds, itself."""
        return bool(self.asks) and all(
            type(payload.get(name)) is type(value) and payload.get(name) == value
            for name, value in self.asks.items()
        )


class Registry:
    """The engines one gateway knows, by name. Immutable."""

    __slots__ = ("_by_name",)

    def __init__(self, engines: Iterable[Engine]) -> None:
        items = tuple(engines)
        self._by_name = {engine.name: engine for engine in items}
        if len(self._by_name) != len(items):
            raise ValueError("two engines share a name")

    def __iter__(self) -> Iterator[Engine]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def plus(self, *engines: Engine) -> Registry:
        """These engines and ``engines``."""
        return Registry((*self._by_name.values(), *engines))

    def of(self, name: str) -> Engine:
        """The engine a pool's ``engine`` names; ``KeyError`` for one not known."""
        return self._by_name[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)
