"""Load-neutral prices: what each request of a replay costs on each pool of its ladder.

A request's decode (its tokens after the first, which is prefill) takes ``(T - 1) / E``
engine steps on a pool, ``E`` = 1 on a standard pool and the expected tokens per step of
Leviathan et al. at the request's true per-token acceptance on a speculative pool with k
draft tokens. Each step costs the replay's own step time (``Replay.cost``: the simulator's
``CostModel`` unless another was given) at the load actually carried (the replay's mean
requests in flight per endpoint over the whole ladder while the request ran) and the
request's mean context, shared by that many sequences, times the pool's price per second
(``cost_per_hour``; equal prices when a pool has none). Every way of routing is priced at
the same load, so the comparison is about routing, not about how much hardware each way
had: always-standard, always-speculative (the top rung), the best static pool per traffic
class, the hindsight oracle (the cheapest pool per class and phase), and the adaptive run
(each request on the pool that served it, shadow mirrors included).

Prefill: without a prefix cache a request served pays its prefill once wherever it runs, so
it is left out of every price but a mirror's, which is a cost of its own. Where the engines
keep one and conversations resend their history (``held``: ``pinned.py``), a turn's prefill
depends on where it runs, and every price counts it: the adaptive run's, of what the
endpoint that served it did not hold; each pool's, of what it did not hold when it served
every turn of the scenario (the oracle picks among those per class and phase, and changes
pool between phases without re-prefilling anything).

What exploring cost (``Cell.explored``): every mirror, whole, its prefill included, and for
each request served on another rung than its slice's to learn something there (a probe of
the rung above, a request explored one rung down), what it cost there less what it would
have cost on the slice's own rung (negative where that rung was dearer).

Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from backends.sim.model import CostModel, StepCost, expected_tokens_per_step
from gateway.replay.pinned import Held
from gateway.replay.run import Replay, Row


def step_seconds(cost: StepCost, batch: float, k: int | None, context: float = 0.0) -> float:
    """One steady decode step of ``batch`` sequences (a float: a mean load) of ``context``
    cached tokens each (the GPU model reads them; the affine one ignores them)."""
    return cost.decode_step_seconds(
        batch=batch, k=k or 0, speculative=k is not None, context=context
    )


@dataclass(frozen=True, slots=True)
class Prices:
    """Per pool of the ladder: its k and its price per second."""

    k: Mapping[str, int | None]
    per_second: Mapping[str, float]
    cost: StepCost = field(default_factory=CostModel)

    def of(self, row: Row, pool: str) -> float:
        k = self.k[pool]
        per_step = 1.0 if k is None else expected_tokens_per_step(row.acceptance, k)
        steps = max(row.tokens - 1, 0) / per_step
        step = step_seconds(self.cost, row.load, k, row.context)
        return steps * step / row.load * self.per_second[pool]

    def prefill(self, row: Row, pool: str) -> float:
        """What prefilling ``row``'s uncached prompt on ``pool`` adds to the steps it runs in
        (the target's; module docstring says where it is counted)."""
        return self.prefill_of(max(row.prompt_tokens - row.cached, 0), pool)

    def prefill_of(self, tokens: int, pool: str) -> float:
        """What prefilling ``tokens`` prompt tokens on ``pool`` adds to the steps they run in."""
        if tokens <= 0:
            return 0.0
        with_it, without = (
            self.cost.step_seconds(
                verified_tokens=0, prefill_tokens=p, draft_passes=0, drafting_seqs=0
            )
            for p in (tokens, 0)
        )
        return max(with_it - without, 0.0) * self.per_second[pool]


def prices(replay: Replay, cost_per_hour: Mapping[str, float | None]) -> Prices:
    pools = replay.ladder.pools
    given = [cost_per_hour.get(p) for p in pools]
    per_second = {
        p: (c / 3600.0 if all(g is not None for g in given) and c is not None else 1.0)
        for p, c in zip(pools, given, strict=True)
    }
    return Prices(dict(zip(pools, replay.ladder.k, strict=True)), per_second, replay.cost)


@dataclass(slots=True)
class Cell:
    """Costs of one traffic class in one phase: per pool, and as the adaptive run routed."""

    traffic: str
    phase: str
    requests: int = 0
    mirrors: int = 0
    on_pool: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pools: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    adaptive: float = 0.0
    late_pools: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    late_adaptive: float = 0.0
    late_requests: int = 0
    slices: set[str] = field(default_factory=set)
    explored: float = 0.0

    @property
    def exploration(self) -> float:
        """What exploring added to this cell, as a share of what it cost without."""
        rest = self.adaptive - self.explored
        return self.explored / rest if rest > 0 else 0.0

    @property
    def oracle(self) -> float:
        return min(self.pools.values())

    def oracle_pool(self) -> str:
        return min(self.pools, key=lambda p: self.pools[p])


def cells(replay: Replay, price: Prices, skip_first: int, held: Held | None = None) -> list[Cell]:
    """Per class and phase; ``late_*`` leave out the first ``skip_first`` requests of each
    cell (and mirrors sent meanwhile): what a guardrail can be held to once it has seen
    ``min_samples``. ``held``: each pool's uncached prompt tokens per conversation turn
    with every turn served there (``pinned.py``); with it, every price counts prefill."""
    out: dict[tuple[str, str], Cell] = {}
    ordered = sorted(replay.rows, key=lambda r: (r.arrival, r.index))
    at = _Priced(price, held or {})
    for row in ordered:
        cell = out.setdefault((row.traffic, row.phase), Cell(row.traffic, row.phase))
        served = at.served(row)
        cell.adaptive += served
        late = cell.requests >= skip_first
        if late:
            cell.late_adaptive += served
        if row.shadow:
            cell.mirrors += 1
            cell.explored += served
            continue
        home = _home(replay, row)
        if home is not None:
            cell.explored += served - at.on(row, home)
        cell.requests += 1
        cell.on_pool[row.pool] += 1
        cell.slices.add(row.slice)
        if late:
            cell.late_requests += 1
        for pool in replay.ladder.pools:
            value = at.on(row, pool)
            cell.pools[pool] += value
            if late:
                cell.late_pools[pool] += value
    return list(out.values())


@dataclass(frozen=True, slots=True)
class _Priced:
    """A row's price as served and on each pool, prefill counted where ``held`` says what
    each pool would have held (``cells``)."""

    price: Prices
    held: Held

    def served(self, row: Row) -> float:
        served = self.price.of(row, row.pool)
        if row.shadow or self.held:
            served += self.price.prefill(row, row.pool)
        return served

    def on(self, row: Row, pool: str) -> float:
        value = self.price.of(row, pool)
        if not self.held:
            return value
        turns = self.held.get(pool, {})
        tokens = turns.get((row.talk, row.turn)) if row.talk else None
        if tokens is None:  # not a conversation's turn, or one the pinned run never sent
            tokens = max(row.prompt_tokens - row.cached, 0)
        return value + self.price.prefill_of(tokens, pool)


# the reasons ``policies/decide.py`` gives a request served away from its slice's rung
EXPLORED_LIVE = "to learn its step time"
PROBED_LIVE = "after falling back"


def _home(replay: Replay, row: Row) -> str | None:
    """The slice's own pool for a request served elsewhere to learn (a live probe, one rung
    up; a live exploration, one rung down); None for any other request."""
    pools = replay.ladder.pools
    if row.probe and PROBED_LIVE in row.reason:
        home = row.rung + 1
    elif EXPLORED_LIVE in row.reason and "mirrored to" not in row.reason:
        home = row.rung - 1
    else:
        return None
    return pools[home] if 0 <= home < len(pools) else None


@dataclass(frozen=True, slots=True)
class Totals:
    adaptive: float
    oracle: float
    best_static: float
    pools: Mapping[str, float]


def totals(all_cells: Iterable[Cell], pools: Iterable[str]) -> Totals:
    cells_ = list(all_cells)
    names = list(pools)
    by_pool = {p: sum(c.pools[p] for c in cells_) for p in names}
    per_class: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in cells_:
        for p in names:
            per_class[c.traffic][p] += c.pools[p]
    return Totals(
        adaptive=sum(c.adaptive for c in cells_),
        oracle=sum(c.oracle for c in cells_),
        best_static=sum(min(v.values()) for v in per_class.values()),
        pools=by_pool,
    )
