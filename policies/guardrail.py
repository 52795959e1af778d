"""The guardrail: the per-slice state machine that moves a slice down and up its ladder.

    on rung r --(judged below the bar, with min_samples)--> fallen back to r+1
    fallen back --(cooldown_s passed)--> probing rung r (probe_fraction of the slice, or mirrors)
    fallen back or probing on r+1 --(r+1 judged below the bar too)--> fallen back to r+2
    probing --(judged above the recovery bar)--> on rung r  (or fallen back, if r is still
                                                            below the rule's start rung)
    probing --(judged not above it)--> fallen back again (and probes again after cooldown)

Only samples taken since the slice entered its phase are judged, so evidence from before a
transition never triggers the next one; with ``cooldown_s`` this is what keeps a slice from
flapping. Pure and clock-free: ``now`` is an argument, and nothing here reads stats itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from policies.model import Guardrail, GuardrailMode
from policies.speedup import draft_rate_to_token_rate, expected_speedup


class Phase(StrEnum):
    ON = "on"
    FALLEN_BACK = "fallen_back"
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class SliceState:
    """Where a slice stands: ``offset`` rungs below its rule's start rung, in ``phase``."""

    offset: int = 0
    phase: Phase = Phase.ON
    since: float = 0.0
    version: int = 0


ON_START = SliceState()


@dataclass(frozen=True, slots=True)
class Evidence:
    """What live statistics say about one pool for one slice since a point in time.

    ``acceptance`` is the draft acceptance rate (accepted / drafted draft tokens) and is
    None when no request reported it. ``speedup`` is a measured time-per-output-token ratio
    (standard / this pool) when both sides have enough samples, else None.
    """

    samples: int = 0
    acceptance: float | None = None
    speedup: float | None = None


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
            after = SliceState(state.offset, Phase.PROBING, now, state.version + 1)
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
    floor = config.min_speedup if config.mode is GuardrailMode.SPEEDUP else config.min_acceptance
    if score >= floor or rungs_below == 0:
        return state, None
    after = SliceState(state.offset + 1, Phase.FALLEN_BACK, now, state.version + 1)
    reason = f"{_what(config)} {score:.3f} < {floor:g} over {numbers['samples']:g} requests"
    return after, Transition(slice_key, now, state, after, reason, numbers)


def _probe_result(
    slice_key: str,
    state: SliceState,
    score: float,
    numbers: dict[str, float],
    config: Guardrail,
    now: float,
) -> tuple[SliceState, Transition | None]:
    bar = config.recover_speedup if config.mode is GuardrailMode.SPEEDUP else config.recover_above
    if score > bar:
        offset = state.offset - 1
        phase = Phase.ON if offset == 0 else Phase.FALLEN_BACK
        after = SliceState(offset, phase, now, state.version + 1)
        reason = f"probe: {_what(config)} {score:.3f} > {bar:g}: recovered one rung"
    else:
        after = SliceState(state.offset, Phase.FALLEN_BACK, now, state.version + 1)
        reason = f"probe: {_what(config)} {score:.3f} <= {bar:g}: staying down"
    return after, Transition(slice_key, now, state, after, reason, numbers)


def _scored(judged: Judged, config: Guardrail) -> tuple[float, dict[str, float]] | None:
    if judged.k is None or judged.evidence.samples < config.min_samples:
        return None
    score, numbers = _score(judged.evidence, judged.k, config)
    return None if score is None else (score, numbers)


def _what(config: Guardrail) -> str:
    return "speed-up" if config.mode is GuardrailMode.SPEEDUP else "acceptance"


def _score(evidence: Evidence, k: int, config: Guardrail) -> tuple[float | None, dict[str, float]]:
    numbers: dict[str, float] = {"samples": float(evidence.samples)}
    if evidence.acceptance is not None:
        numbers["acceptance"] = evidence.acceptance
    if config.mode is GuardrailMode.THRESHOLD:
        return evidence.acceptance, numbers
    if evidence.speedup is not None:
        numbers["measured_speedup"] = evidence.speedup
        return evidence.speedup, numbers
    if evidence.acceptance is None:
        return None, numbers
    a = draft_rate_to_token_rate(evidence.acceptance, k)
    estimate = expected_speedup(a, k, config.draft_cost_ratio)
    numbers["expected_speedup"] = estimate
    return estimate, numbers


def reset_on_reload(state: SliceState, ladder_rungs_below_start: int) -> SliceState:
    """Clip a state to a (possibly shorter) ladder after a policy reload: a slice that sits
    on the last rung stays there, and starts a new epoch."""
    if state.offset <= ladder_rungs_below_start:
        return state
    return replace(state, offset=ladder_rungs_below_start, version=state.version + 1)
