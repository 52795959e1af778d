"""What live statistics keep per slice (``livestats.py`` records it, ``judging.py`` judges it): its
windows per pool, local and pulled from other replicas, its newest requests one by one for
the short spans of the economic judge, its newest times to first token per pool (those the
pool served as the slice's rung apart from its probes, mirrors and explorations), the floor
its evidence starts at, and the counts one outcome adds. Pure data and arithmetic; time is
an argument.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import median

from gateway.measure.acceptance import Outcome, Status
from gateway.measure.windows import BUCKETS, Counts, Window, total_since
from policies.compiled import Placement
from policies.economics import Tally
from policies.guardrail import ON_START, Phase, SliceState

RECENT = 16  # per slice and pool, the newest requests kept one by one for the short spans
TTFT_KEPT = 32  # per slice, pool and kind, the newest times to first token (the latency rule)


@dataclass(slots=True)
class SliceRecord:
    """One slice's evidence and guardrail state: its windows per pool (local, and pulled
    from other replicas), its newest requests one by one, and where its evidence starts."""

    model: str
    rule: str
    state: SliceState = ON_START
    windows: dict[str, Window] = field(default_factory=dict)
    remote: dict[str, dict[float, Counts]] = field(default_factory=dict)
    proposed: bool = False
    seen: float = 0.0
    window_s: float = 300.0
    economic: bool = False
    probes: int = 0
    probed_at: float | None = None  # the newest probe's outcome, while probing
    recent: dict[str, deque[tuple[float, int, int]]] = field(default_factory=dict)
    judged: float = float("-inf")
    fresh: dict[str, float] = field(default_factory=dict)
    context: float | None = None  # its requests' mean cached tokens (judged at its context)
    probe_prefill: float | None = None  # its probes' mean uncached prompt tokens, above
    home_prefill: float | None = None  # its requests' mean uncached prompt tokens at home
    home_fresh: float | None = None  # ... and the mean share of their prompts uncached
    ttft: dict[tuple[str, bool], deque[tuple[float, float]]] = field(default_factory=dict)
    split_at: float = float("-inf")  # it split then: first tokens before mixed in children

    @property
    def window_epoch(self) -> int:
        """The epoch shared windows are kept under: one for good in economic mode."""
        return 0 if self.economic else self.state.version

    def buckets(self, pool: str, now: float) -> list[tuple[float, Counts]]:
        """Local and pulled buckets of ``pool`` still in the window, and not older than the
        pool's evidence floor (``fresh``: a bucket begun before it may hold stale requests)."""
        window = self.windows.get(pool)
        out = window.buckets(now) if window else []
        floor = self.fresh.get(pool)
        if floor is not None:
            out = [(t, c) for t, c in out if t >= floor]
        oldest, first = now - self.window_s, float("-inf") if floor is None else floor
        out += [(t, c) for t, c in self.remote.get(pool, {}).items() if t > oldest and t >= first]
        return out

    def first_token(self, pool: str, seconds: float, now: float, carried: bool = True) -> None:
        """One of the slice's requests on ``pool`` had its first token after ``seconds``;
        ``carried``: the pool served it as the slice's rung (it carried the slice's load),
        not as a probe, a mirror or an exploration."""
        kept = self.ttft.get((pool, carried))
        if kept is None:
            kept = self.ttft[pool, carried] = deque(maxlen=TTFT_KEPT)
        kept.append((now, seconds))

    def ttft_p50(
        self,
        pool: str,
        now: float,
        min_samples: int,
        carried: bool | None = None,
        since: float = float("-inf"),
    ) -> tuple[float, int] | None:
        """The median time to first token of the slice's newest requests on ``pool`` within
        the window and from ``since`` on (at most ``TTFT_KEPT``), and how many; None under
        ``min_samples``. With ``carried`` set, only the requests the pool served as the
        slice's rung (True) or only the others (False); without it, the newest of both.
        Never from before the slice split (``split_at``): those mixed in its children's."""
        oldest = max(now - self.window_s, since, self.split_at)
        kinds = (True, False) if carried is None else (carried,)
        kept = [x for kind in kinds for x in self.ttft.get((pool, kind), ())]
        newest = sorted(kept, reverse=True)[:TTFT_KEPT]
        seen = sorted(s for at, s in newest if at >= oldest)
        if len(seen) < max(min_samples, 1):
            return None
        return median(seen), len(seen)

    def newest(self, pool: str) -> list[tuple[int, int]]:
        """(tokens, steps) of the newest requests of ``pool`` one by one, oldest first,
        from the pool's evidence floor on."""
        floor = self.fresh.get(pool, float("-inf"))
        return [(t, s) for at, t, s in self.recent.get(pool, ()) if at >= floor]

    def counts(self, pool: str, now: float) -> Counts:
        """Evidence for ``pool``: the sliding window, except while probing, when everything
        since the phase began counts (a probe round at low traffic must be able to finish)."""
        window = self.windows.get(pool)
        buckets = self.remote.get(pool)
        out = Counts()
        if self.state.phase is Phase.PROBING:
            if window:
                out.add(window.since_start)
            if buckets:
                out.add(total_since(buckets, float("-inf")))
            return out
        if window:
            out.add(window.total(now))
        if buckets:
            out.add(total_since(buckets, now - self.window_s))
        return out

    def mean_tokens(self, now: float) -> float | None:
        """Output tokens per request on every pool in the window (this replica's), where the
        steps were known: decode tokens, and the first."""
        tokens = stepped = 0
        for window in self.windows.values():
            counts = window.total(now)
            tokens, stepped = tokens + counts.tokens, stepped + counts.stepped
        return tokens / stepped + 1.0 if stepped else None

    def requests_per_s(self, now: float) -> float:
        """Requests of every pool in the sliding window (all replicas), over the time the
        window has covered: since its oldest bucket, at least one bucket wide."""
        oldest = now
        requests = 0
        for window in self.windows.values():
            requests += window.total(now).requests
            start = window.oldest(now)
            oldest = min(oldest, now if start is None else start)
        for buckets in self.remote.values():
            for start, counts in buckets.items():
                if start > now - self.window_s:
                    requests += counts.requests
                    oldest = min(oldest, start)
        span = max(now - oldest, self.window_s / BUCKETS)
        return requests / span

    def view(self, now: float, place: Placement | None) -> dict[str, object]:
        """The slice's state and per-pool window for the admin API; ``place``: its rule on
        its ladder (None when either is gone from the policy)."""
        pools = {}
        for pool in self.windows.keys() | self.remote.keys():
            c = self.counts(pool, now)
            pools[pool] = {
                "requests": c.requests,
                "measured": c.measured,
                "acceptance": c.acceptance,
                "acceptance_margin95": c.margin,
                "tokens_per_step": c.tokens_per_step,
                "stepped": c.stepped,
                "tpot_s": c.tpot,
                "errors": c.errors,
            }
        return {
            "rule": self.rule,
            "model": self.model,
            "offset": self.state.offset,
            "phase": self.state.phase.value,
            "since": self.state.since,
            **self.rungs(place),
            "requests_per_s": self.requests_per_s(now),
            "window_s": self.window_s,
            "pools": pools,
        }

    def rungs(self, place: Placement | None) -> dict[str, str | None]:
        """The rule's start rung, the pool the slice is served on, and the one it probes."""
        if place is None:
            return {"start": None, "rung": None, "probing": None}
        serving = place.serving(self.state.offset)
        probing = self.state.phase is Phase.PROBING and serving > place.start
        pools = place.ladder.pools
        return {
            "start": place.rule.rule.start,
            "rung": pools[serving],
            "probing": pools[serving - 1] if probing else None,
        }

    def add(self, pool: str, counts: Counts, now: float) -> None:
        """One outcome's ``counts`` on ``pool``: its window, and its newest requests."""
        window = self.windows.get(pool)
        if window is None or window.window_s != self.window_s:
            window = self.windows[pool] = Window(self.window_s)
        window.add(now, counts)
        if counts.stepped:
            recent = self.recent.get(pool)
            if recent is None:
                recent = self.recent[pool] = deque(maxlen=RECENT)
            recent.append((now, counts.tokens, counts.steps))

    def note_context(self, own: float) -> None:
        """One request's cached tokens (``steptimes.context_of``) into the slice's context,
        a moving mean weighing the newest a tenth."""
        self.context = own if self.context is None else self.context + 0.1 * (own - self.context)

    def home_saving(self) -> float | None:
        """The prompt tokens one of the slice's requests served on another rung (a live
        probe) saves its home, on average; None while the answers have not said what was
        cached. A prompt sent once is prefilled there instead of at home, and saves what it
        would have prefilled at home; a conversation's turn, whose prompt its home mostly
        held, saves nothing, since its next turn prefills at home what this one brought. So
        the requests' uncached tokens at home, times the share of their prompts they found
        uncached."""
        if self.home_prefill is None:
            return None
        return self.home_prefill * (1.0 if self.home_fresh is None else self.home_fresh)

    def requests(self, now: float) -> int:
        """Requests of every pool in this replica's window."""
        return sum(window.total(now).requests for window in self.windows.values())

    def restart(self, state: SliceState) -> None:
        self.state = state
        if not self.economic:
            self.windows.clear()
            self.remote.clear()
        self.proposed = False
        self.probes = 0
        self.probed_at = None


@dataclass(frozen=True, slots=True)
class Increment:
    """Counts of one bucket of one (slice, epoch, pool), for the shared store."""

    slice: str
    model: str
    rule: str
    epoch: int
    pool: str
    start: float
    counts: Counts
    window_s: float


def newest_tallies(recent: Iterable[tuple[int, int]], targets: list[int]) -> tuple[Tally, ...]:
    """Tallies of the newest ``t`` requests for each target ``t`` (request-granular)."""
    out = []
    n = tokens = steps = tok_sq = step_sq = tok_step = 0
    wanted = sorted(targets)
    for t, s in reversed(list(recent)):
        if not wanted:
            break
        n, tokens, steps = n + 1, tokens + t, steps + s
        tok_sq, step_sq, tok_step = tok_sq + t * t, step_sq + s * s, tok_step + t * s
        if n == wanted[0]:
            wanted.pop(0)
            out.append(Tally(n, tokens, steps, tok_sq, step_sq, tok_step))
    return tuple(out)


def counts_of(outcome: Outcome) -> Counts:
    """One finished request as window counts."""
    counts = Counts(requests=1)
    if outcome.status is not Status.OK:
        counts.errors = 1
        return counts
    steps = outcome.steps
    if steps:
        tokens = outcome.completion_tokens - 1
        counts.stepped = 1
        counts.tokens = tokens
        counts.steps = steps
        counts.tok_sq = tokens * tokens
        counts.step_sq = steps * steps
        counts.tok_step = tokens * steps
    if outcome.drafted:
        rate = outcome.accepted / outcome.drafted
        counts.measured = 1
        counts.drafted = outcome.drafted
        counts.accepted = outcome.accepted
        counts.rate_sum = rate
        counts.rate_sq = rate * rate
    if outcome.tpot_s is not None:
        counts.tpot_sum = outcome.tpot_s
        counts.tpot_n = 1
    return counts
