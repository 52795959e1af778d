"""The guardrail: the per-slice state machine that moves a slice down and up its ladder.

Economic mode (the default; ``step_economic``): a slice on rung r falls to the cheapest rung
below it that is cheaper per output token with confidence (``policies/economics.py``;
usually r+1, further when a lower rung is cheaper still), and comes back one rung when r
is cheaper again: at once after ``cooldown_s`` when its tokens per step on r are still in
the window (a load surge that ended), else through probes. After ``cooldown_s`` a
fallen-back slice probes rung r continuously: a share of its requests (hashed by request
id, never by client) sized by an expected-loss budget (``probe_share``: a slice barely
dearer on r probes more than one three times dearer) and by a longest wait between probes
(``max_cooldown_s``), so recovery after a healing takes bounded time as well as bounded
requests. The probes are judged newest first (1, 2, 4, 8, 16 of them), so probes taken
during a collapse do not hold back a recovery once the newest ones show the healing.

Threshold mode (``step``):

    on rung r --(judged below the bar, with min_samples)--> fallen back to r+1
    fallen back --(cooldown_s passed)--> probing rung r (probe_fraction of the slice, or mirrors)
    fallen back or probing on r+1 --(r+1 judged below the bar too)--> fallen back to r+2
    probing --(judged above the recovery bar)--> on rung r  (or fallen back, if r is still
                                                            below the rule's start rung)
    probing --(judged not above it)--> fallen back again (and probes again after cooldown)

Only samples taken since the slice entered its phase are judged, so evidence from before a
transition never triggers the next one; with ``cooldown_s`` this is what keeps a slice from
flapping.

Latency (economic mode, ``latency_breach``): a slice also falls one rung when its median
time to first token on the serving rung breaks the policy's goal (``ttft_p50_s``) while the
rung below serves it sooner, or, with no goal set, before that median reaches
``ttft_ratio`` times the rung below's for the same slice: at ``LEAVE_SHARE`` of the way
(1.3x for 1.5x), since a queue's wait grows fastest just before it runs over; a gap under
``MIN_EXCESS_S`` never counts (a busy pool answers a little later than an idle one without
any queue). With no goal the rule moves a slice only while the judge is not sure the
serving rung is the cheaper (``_latency_decides``): the rung below's times are mostly a pool
that did not carry the slice, and a pool that computes its tokens in less time would queue
less than the other carrying them; under a goal it holds whatever the cost. Under a goal, a
slice does not climb back while the rung above would break the same rule once it is up
there: judged on that rung's first tokens while it carried the slice and the
rung below's while it did not (``gateway/measure/judging.py``), since a rung the slice left
answers its few probes sooner than it would answer all of it, and the rung it fell to
answers later for carrying it.

In either mode an ``alarm`` (the shadow canary's) moves a slice one rung down at once.

Pure and clock-free: ``now`` is an argument, and nothing here reads stats itself.

Explained for operators, with its numbers, in docs/guardrail.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from policies.economics import Judgement
from policies.model import Guardrail, ProbeMode

MAX_PROBE_SHARE = 0.5
LEAVE_SHARE = 0.6  # of the allowed excess TTFT at which a slice leaves (1.3x for 1.5x)
MIN_EXCESS_S = 0.5  # a smaller gap in TTFT is two pools' loads, not a queue
HEAR_WITHIN = 10  # requests of a fallen-back slice within which one probes the rung above
HEAR_EVERY_S = 30.0  # ... unless probes come at least this often anyway


class Phase(StrEnum):
    ON = "on"
    FALLEN_BACK = "fallen_back"
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class SliceState:
    """Where a slice stands: ``offset`` rungs below its rule's start rung, in ``phase``.
    ``rounds`` counts probe rounds that failed since the fall (the backoff), and
    ``probe_share`` is the share of the slice's requests probing while ``PROBING``, and
    ``mirror_share`` the share mirrored to the rung above as short probes besides.
    ``explore`` is a share of requests sent one rung *down* while the slice's judgement
    hinges on that pool's step time (it has served too little lately to be sure of):
    served there when ``explore_live`` (that rung is at least as cheap on the point
    estimate), else mirrored there while the serving rung answers."""

    offset: int = 0
    phase: Phase = Phase.ON
    since: float = 0.0
    version: int = 0
    rounds: int = 0
    probe_share: float = 0.0
    mirror_share: float = 0.0
    explore: float = 0.0
    explore_live: bool = False


ON_START = SliceState()


@dataclass(frozen=True, slots=True)
class Evidence:
    """What live statistics say about one pool for one slice since a point in time, for
    threshold mode: ``acceptance`` is the draft acceptance rate (accepted / drafted draft
    tokens), None when no request reported it."""

    samples: int = 0
    acceptance: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One guardrail event, kept in the admin log and counted in metrics."""

    slice: str
    at: float
    before: SliceState
    after: SliceState
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Judged:
    """Evidence about one rung, and that rung's k (None for a standard pool)."""

    evidence: Evidence
    k: int | None


NOTHING = Judged(Evidence(), None)


def step(
    slice_key: str,
    state: SliceState,
    serving: Judged,
    above: Judged,
    rungs_below: int,
    config: Guardrail,
    now: float,
) -> tuple[SliceState, Transition | None]:
    """Advance one slice.

    ``serving`` is the evidence for the rung the slice is served on, judged in every phase
    (a slice fallen back to a speculative rung falls further if that rung fails too);
    ``above`` is the evidence for the rung above it, judged while probing. ``rungs_below``
    is how many rungs lie below the serving one (0 on the standard pool).
    """
    scored = _scored(serving, config)
    if scored is not None:
        fell = _maybe_fall(slice_key, state, *scored, rungs_below, config, now)
        if fell[1] is not None:
            return fell
    if state.phase is Phase.FALLEN_BACK:
        if now - state.since >= config.cooldown_s:
            after = SliceState(
                state.offset, Phase.PROBING, now, state.version + 1, 0, config.probe_fraction
            )
            return after, Transition(slice_key, now, state, after, "cooldown over: probing")
        return state, None
    if state.phase is Phase.PROBING:
        scored = _scored(above, config)
        if scored is not None:
            return _probe_result(slice_key, state, *scored, config, now)
    return state, None


def _maybe_fall(
    slice_key: str,
    state: SliceState,
    score: float,
    numbers: dict[str, float],
    rungs_below: int,
    config: Guardrail,
    now: float,
) -> tuple[SliceState, Transition | None]:
    floor = config.min_acceptance
    if score >= floor or rungs_below == 0:
        return state, None
    after = SliceState(state.offset + 1, Phase.FALLEN_BACK, now, state.version + 1)
    reason = f"acceptance {score:.3f} < {floor:g} over {numbers['samples']:g} requests"
    return after, Transition(slice_key, now, state, after, reason, numbers)


def _probe_result(
    slice_key: str,
    state: SliceState,
    score: float,
    numbers: dict[str, float],
    config: Guardrail,
    now: float,
) -> tuple[SliceState, Transition | None]:
    bar = config.recover_above
    if score > bar:
        offset = state.offset - 1
        phase = Phase.ON if offset == 0 else Phase.FALLEN_BACK
        after = SliceState(offset, phase, now, state.version + 1)
        reason = f"probe: acceptance {score:.3f} > {bar:g}: recovered one rung"
    else:
        after = SliceState(state.offset, Phase.FALLEN_BACK, now, state.version + 1)
        reason = f"probe: acceptance {score:.3f} <= {bar:g}: staying down"
    return after, Transition(slice_key, now, state, after, reason, numbers)


def _scored(judged: Judged, config: Guardrail) -> tuple[float, dict[str, float]] | None:
    """The windowed acceptance of a speculative rung with ``min_samples``, and its numbers."""
    evidence = judged.evidence
    if judged.k is None or evidence.samples < config.min_samples or evidence.acceptance is None:
        return None
    return evidence.acceptance, {
        "samples": float(evidence.samples),
        "acceptance": evidence.acceptance,
    }


@dataclass(frozen=True, slots=True)
class Economics:
    """What live statistics say about one slice for the economic step.

    ``below``: the serving rung against a rung ``drop`` rungs below it (None on the last
    rung or without evidence): the cheapest of those it is dearer than with confidence,
    else the next one. ``above``: the rung above against the serving one, from everything
    in the window. ``probes``: the same from the newest probes since probing began alone.
    ``rate``: the slice's requests per second; ``tokens``: its mean output tokens per request
    (None while unknown); ``since_probe``: seconds since its newest probe's outcome (or since
    probing began), while it probes; ``prefill``: what a probe's prefill on the rung above
    costs, in requests served on the serving rung (the prompt tokens the rung above does not
    hold of a probe's prompt, times its seconds per prompt token, over a request's output
    tokens times the serving rung's seconds per output token; None while unknown). A long
    conversation's turn is cached where it is served, and its probe is not: ``reprefill``
    is what a live probe prefills there beyond what the request would at home, in the
    same unit (None while the answers have not said what was cached). ``resent``: its
    requests find part of their prompts cached where they are served, as a conversation's
    turns do; a first turn and a prompt sent once look alike, so a live probe of such a
    slice may take its history away from home for the next turn to prefill there again.
    """

    below: Judgement | None = None
    above: Judgement | None = None
    probes: Judgement | None = None
    rate: float = 0.0
    drop: int = 1
    tokens: float | None = None
    since_probe: float | None = None
    prefill: float | None = None
    reprefill: float | None = None
    latency: Latency | None = None
    latency_above: Latency | None = None
    resent: bool = False


@dataclass(frozen=True, slots=True)
class Latency:
    """A slice's median time to first token on an upper rung and the rung below it (seconds),
    each over at least ``min_samples`` of its newest requests there within the window: on
    the upper rung those it served as the slice's rung (carrying the slice's load), for
    ``Economics.latency`` since the slice entered its phase; on the rung below, for
    ``Economics.latency_above``, those it served without it."""

    upper: float
    lower: float
    n: int


def latency_breach(latency: Latency | None, config: Guardrail) -> str | None:
    """Why the upper rung breaks the slice's latency rule (module docstring), or None."""
    if latency is None or latency.lower <= 0 or latency.upper - latency.lower < MIN_EXCESS_S:
        return None
    ratio = latency.upper / latency.lower
    told = f"TTFT p50 {latency.upper:.2f} s vs {latency.lower:.2f} s below"
    if config.ttft_p50_s is not None:
        if latency.upper > config.ttft_p50_s and ratio > 1.0:
            return f"{told}, above the goal of {config.ttft_p50_s:g} s"
        return None
    leave = 1.0 + LEAVE_SHARE * (config.ttft_ratio - 1.0)
    if ratio >= leave:
        return f"{told} ({ratio:.2f}x; leaves at {leave:.2f}x, before {config.ttft_ratio:g}x)"
    return None


def step_economic(
    slice_key: str, state: SliceState, seen: Economics, config: Guardrail, now: float
) -> tuple[SliceState, Transition | None]:
    """Advance one slice in economic mode (module docstring). A changed state without a
    transition is a new probe share."""
    slow = latency_breach(seen.latency, config) if _latency_decides(seen.below, config) else None
    if slow is not None and seen.latency is not None:
        return _slow(slice_key, state, seen.latency, slow, now)
    if seen.below is not None and seen.below.verdict < 0:
        after = SliceState(state.offset + seen.drop, Phase.FALLEN_BACK, now, state.version + 1)
        return after, _event(slice_key, now, state, after, seen.below, "cheaper below")
    if state.offset == 0:
        return state, None
    ready = now - state.since >= config.cooldown_s or state.phase is Phase.PROBING
    held = config.ttft_p50_s is not None and latency_breach(seen.latency_above, config) is not None
    for judged in (seen.probes, seen.above):
        if ready and not held and judged is not None and judged.verdict > 0:
            offset = state.offset - 1
            after = SliceState(
                offset, Phase.ON if offset == 0 else Phase.FALLEN_BACK, now, state.version + 1
            )
            return after, _event(slice_key, now, state, after, judged, "cheaper above")
    if not ready:
        return state, None
    share, mirror = short_probes(seen, config)
    if state.phase is Phase.PROBING:
        if (share, mirror) == (state.probe_share, state.mirror_share):
            return state, None
        return replace(state, probe_share=share, mirror_share=mirror), None
    after = SliceState(
        state.offset,
        Phase.PROBING,
        now,
        state.version + 1,
        probe_share=share,
        mirror_share=mirror,
    )
    reason = f"probing: {share:.1%} of requests to the rung above"
    reason += f", {mirror:.1%} mirrored there short" if mirror else ""
    numbers = {"probe_share": share, "mirror_share": mirror}
    return after, Transition(slice_key, now, state, after, reason, numbers)


def _latency_decides(below: Judgement | None, config: Guardrail) -> bool:
    """Whether the latency rule may move a slice whose serving rung is judged ``below``
    against the rung below: always under a goal; with none, only where the judge is not
    sure the serving rung is the cheaper (module docstring)."""
    return config.ttft_p50_s is not None or below is None or below.verdict <= 0


def _slow(
    slice_key: str, state: SliceState, latency: Latency, why: str, now: float
) -> tuple[SliceState, Transition]:
    after = SliceState(state.offset + 1, Phase.FALLEN_BACK, now, state.version + 1)
    numbers = {
        "ttft_p50_s": latency.upper,
        "ttft_p50_below_s": latency.lower,
        "requests": float(latency.n),
    }
    return after, Transition(slice_key, now, state, after, f"slow first token: {why}", numbers)


def probe_share(seen: Economics, config: Guardrail) -> float:
    """The share of a fallen-back slice's requests that probe the rung above: what the
    ``probe_budget`` buys at the rung's last known cost ratio r (a live probe loses r - 1 of
    a request, plus what it prefills there beyond what it would at home,
    ``Economics.reprefill``: a conversation's history, cached where its turns go; a mirrored
    one loses r, its prefill there the recovery budget's to count, ``recovery_share``), but
    at least one probe every ``max_cooldown_s`` so that a quiet slice recovers in bounded
    time, and at most ``MAX_PROBE_SHARE``. Rounded to two
    significant digits, so that it does not change with every request. The last known
    ratio is the one on the newest requests: a window that mixes healthy requests from
    before a collapse with the collapsed ones would say ~1 and probe a collapsed rung at
    the largest share."""
    ratio = _last_ratio(seen)
    loss = ratio if config.probe is ProbeMode.SHADOW else ratio - 1.0 + (seen.reprefill or 0.0)
    share = config.probe_budget / max(loss, config.probe_budget / MAX_PROBE_SHARE)
    if config.max_cooldown_s > 0:
        share = max(share, 1.0 / (max(seen.rate, 1e-9) * config.max_cooldown_s))
    share = min(share, MAX_PROBE_SHARE)
    return float(f"{share:.2g}")


def short_probes(seen: Economics, config: Guardrail) -> tuple[float, float]:
    """The shares of a fallen-back slice's requests that probe the rung above live and that
    are mirrored there short: the live probes the probe budget buys (``probe_share``), and
    what the recovery budget buys besides (``recovery_share``), mirrored short, or live
    where a live probe costs the slice less than a short mirror of the same request would
    (``_costs``). A prompt prefilled whole wherever it goes, a summary's, makes a mirror a
    cold prefill for a few tokens, where a live probe only pays the rung's dearer decode;
    and where answers are short, a short mirror is most of a request at the dearer price."""
    live = probe_share(seen, config)
    if _live_cheaper(seen, config):
        return live + recovery_share(seen, config, live, mirrored=False), 0.0
    return live, recovery_share(seen, config, live)


def _live_cheaper(seen: Economics, config: Guardrail) -> bool:
    """Whether a live probe costs less than a short mirror (``_costs``); never under
    ``probe: shadow``, nor while the mirror's prefill or the slice's answers are unknown."""
    if config.probe is ProbeMode.SHADOW or seen.prefill is None or not seen.tokens:
        return False
    _, mirror, whole = _costs(seen, config)
    return whole < mirror


def _costs(seen: Economics, config: Guardrail) -> tuple[float, float, float]:
    """In requests served on the serving rung: a short mirror's decode (its part of a
    request, ``probe_tokens`` of the slice's mean, times the rung above's cost ratio r) and
    its whole cost (that plus its prefill up there, ``Economics.prefill``), and a live
    probe's (r - 1 plus what it prefills up there beyond what it would at home,
    ``Economics.reprefill``, as ``probe_share`` counts it; its whole prefill up there, as
    the mirror's, where the slice's prompts are ``resent``)."""
    ratio = _last_ratio(seen)
    part = min(config.probe_tokens / seen.tokens, 1.0) if seen.tokens else 1.0
    decode, prefill = part * ratio, seen.prefill or 0.0
    again = prefill if seen.resent else (seen.reprefill or 0.0)
    return decode, decode + prefill, ratio - 1.0 + again


def recovery_share(
    seen: Economics, config: Guardrail, live: float, *, mirrored: bool = True
) -> float:
    """The share of a fallen-back slice's requests mirrored to the rung above as short probes
    (``probe_tokens`` output tokens each), besides the ``live`` share of probes: enough for
    one probe in ``HEAR_WITHIN`` of the slice's requests, but none where that would come more
    than once in ``HEAR_EVERY_S`` (a busy slice's own probes tell a healing soon enough), and
    at most what ``recovery_budget`` buys at a short probe's cost (its part of a request, f,
    times the last known cost ratio r, plus its prefill on the rung above,
    ``Economics.prefill``: a long conversation's probe prefills what its turns find
    cached). So a quiet slice hears of a healing within about ten of its requests, for a
    few percent of its cost while the rung above stays dear, where its live probes alone
    would take a hundred. Requests are drawn at random, so the gaps between
    probes vary; a probe overdue (``since_probe`` past the gap of the share it is owed)
    raises the share in proportion until one comes. It is owed what the budget buys, or
    more where the probe is cheap for its prefill: the wanted share times the decode's part
    of the probe's cost. A short prompt's probe is owed the whole wanted share, beyond the
    budget, which holds on average; a long prompt's, whose probe is mostly a cold prefill,
    little more than the budget buys. Two significant digits, as ``probe_share``.

    Not ``mirrored``: the share of further live probes the budget buys (``short_probes``),
    each costing what a live probe loses (r - 1, plus its prefill up there beyond what it
    would at home), owed what the budget buys and no more: a whole request on a dearer rung
    is never cheap."""
    if config.recovery_budget <= 0 or seen.rate <= 0:
        return 0.0
    wanted = min(1.0 / HEAR_WITHIN, 1.0 / (seen.rate * HEAR_EVERY_S))
    if wanted <= live:
        return 0.0
    decode, mirror, whole = _costs(seen, config)
    if not mirrored:
        decode, mirror = 0.0, whole
    cost = max(mirror, 1e-9)
    share = min(wanted - live, config.recovery_budget / cost, MAX_PROBE_SHARE - live)
    owed = min(max(live + share, wanted * min(decode / cost, 1.0)), wanted)
    gap = 1.0 / (seen.rate * owed)
    if seen.since_probe is not None and seen.since_probe > gap:
        overdue = min(owed * seen.since_probe / gap, MAX_PROBE_SHARE) - live
        return max(float(f"{overdue:.2g}"), 0.0)
    return max(float(f"{share:.2g}"), 0.0)


def _last_ratio(seen: Economics) -> float:
    """The rung above's cost ratio on the newest requests judged (2 before any is)."""
    judged = seen.probes if seen.probes is not None else seen.above
    if judged is None:
        return 2.0
    return judged.newest_ratio if judged.newest_ratio is not None else judged.ratio


def _event(
    slice_key: str,
    now: float,
    before: SliceState,
    after: SliceState,
    judged: Judgement,
    why: str,
) -> Transition:
    return Transition(slice_key, now, before, after, f"{why}: {judged.reason}", judged.numbers)


def alarm(
    slice_key: str,
    state: SliceState,
    rungs_below: int,
    reason: str,
    numbers: dict[str, float],
    now: float,
) -> tuple[SliceState, Transition]:
    """An outside signal that speculation is wrong for a slice (the shadow canary's greedy
    mismatches), in any mode: the slice falls one rung when there is one below the rung it
    is served on; else the event is only logged, and the state returned is ``state``."""
    after = state
    if rungs_below > 0:
        after = SliceState(state.offset + 1, Phase.FALLEN_BACK, now, state.version + 1)
    return after, Transition(slice_key, now, state, after, reason, numbers)


def reset_on_reload(state: SliceState, ladder_rungs_below_start: int) -> SliceState:
    """Clip a state to a (possibly shorter) ladder after a policy reload: a slice that sits
    on the last rung stays there, and starts a new epoch."""
    if state.offset <= ladder_rungs_below_start:
        return state
    return replace(state, offset=ladder_rungs_below_start, version=state.version + 1)
