"""Step 4 of a request: the policy decision. Pure, synchronous, clock-free.

The same ``decide`` serves live traffic, ``speclane policy explain`` and the replay
simulator. It reads one snapshot of flags and guardrail states and never waits for anything.
Probes and shadow mirrors sample *requests* (a hash of the request id), never clients, so
one client with one API key probes like ten thousand. Rollouts are stable per tenant and
never follow the body (``anonymous`` is outside every partial one); experiment arms are
stable per user (an arm hashes the tenant with the body's ``user``, so one user id in two
tenants is two users, or with the tenant, or the request id when neither says who).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from policies.compiled import CompiledPolicy, CompiledRule, Ladder
from policies.decision import Decision
from policies.features import Features
from policies.flags import ALWAYS_ON, FlagValue, bucket, in_rollout, rollout_words
from policies.guardrail import ON_START, Phase, SliceState
from policies.model import KILL_SWITCH, SHADOW, ProbeMode
from policies.splitting import Split, candidates, route

NO_SPLITS: Mapping[str, Split] = MappingProxyType({})


def decide(
    features: Features,
    policy: CompiledPolicy,
    flags: Mapping[str, FlagValue],
    guards: Mapping[str, SliceState],
    now: float,
    splits: Mapping[str, Split] = NO_SPLITS,
) -> Decision:
    """Which pool serves ``features``, on which rung, under which rule, and why.

    ``now`` is accepted for time-dependent policy features and keeps callers honest about
    time being an input; today's rules depend only on the snapshot. ``splits``: the slices
    split by application (``policies/splitting.py``); a request of a split slice is decided
    as its child, and the decision names the child, its parent and the request's candidate
    values (what live statistics judge the split by).
    """
    del now
    decision = _decided(features, policy, flags, guards, splits)
    assumed = assumed_words(features, policy)
    return replace(decision, reason=f"{decision.reason}; {assumed}") if assumed else decision


def assumed_words(features: Features, policy: CompiledPolicy) -> str:
    """What the decision assumed for fields the request left out, or "" (the reason
    header and ``policy explain`` say it: a request without ``temperature`` is read as the
    served model's default, which a rule or a slice band may turn on)."""
    said = []
    if "temperature" in features.defaulted:
        said.append(f"temperature {features.temperature:g}")
    if "top_p" in features.defaulted and policy.reads_top_p:
        said.append(f"top_p {features.top_p:g}")
    if not said:
        return ""
    return f"{' and '.join(said)} assumed (not in the request: the served model's default)"


def _decided(
    features: Features,
    policy: CompiledPolicy,
    flags: Mapping[str, FlagValue],
    guards: Mapping[str, SliceState],
    splits: Mapping[str, Split],
) -> Decision:
    rule = policy.first_match(features)
    slice_key = policy.slicer.key(rule.name, features)
    if not policy.splitting.on:
        return _decide(features, policy, flags, guards, rule, slice_key)
    found = candidates(features, policy.splitting.watched())
    child = route(slice_key, found, splits)
    decision = _decide(features, policy, flags, guards, rule, child)
    reason = decision.reason
    if child != slice_key:
        reason += f" (as {child[len(slice_key) + 3 :]} of its slice, split by application)"
    return replace(decision, parent=slice_key, candidates=found, reason=reason)


def _decide(
    features: Features,
    policy: CompiledPolicy,
    flags: Mapping[str, FlagValue],
    guards: Mapping[str, SliceState],
    rule: CompiledRule,
    slice_key: str,
) -> Decision:
    ladder = policy.ladders.get(features.model)
    if ladder is None:
        reason = f"no ladder serves model {features.model}"
        return Decision(rule.name, slice_key, "", (), 0, 0, reason)
    start = ladder.index(rule.rule.start)
    if rule.rule.start == SHADOW:
        return _shadow(features, rule, ladder, slice_key, start)
    arm = _arm(features, rule)
    if arm is None:
        return _guarded(features, rule, ladder, slice_key, start, flags, guards)
    if ladder.index(arm) > start:  # the control arm is served where it says, as it is
        reason = f"rule {rule.name}: experiment arm {arm}"
        return replace(_serve(ladder, rule, slice_key, ladder.index(arm), start, reason), arm=arm)
    decision = _guarded(features, rule, ladder, slice_key, start, flags, guards)
    return replace(decision, arm=arm, reason=f"{decision.reason} (experiment arm {arm})")


def _arm(features: Features, rule: CompiledRule) -> str | None:
    experiment = rule.rule.experiment
    if experiment is None:
        return None
    key = f"{features.tenant}\x00{features.user or features.routing_key or features.request_id}"
    first = bucket(f"{rule.name}\x00arm", key) < experiment.split / 100
    return experiment.arms[0] if first else experiment.arms[1]


def _guarded(
    features: Features,
    rule: CompiledRule,
    ladder: Ladder,
    slice_key: str,
    start: int,
    flags: Mapping[str, FlagValue],
    guards: Mapping[str, SliceState],
) -> Decision:
    """The rung the guardrail has the slice on, unless a flag keeps speculation off."""
    standard = len(ladder.pools) - 1
    gate = _gate(features, rule, flags)
    if gate is not None:
        return _serve(ladder, rule, slice_key, standard, start, gate)
    state = guards.get(slice_key, ON_START)
    rung = min(start + state.offset, standard)
    if state.phase is Phase.PROBING and rung > start:
        return _probe(features, rule, ladder, slice_key, rung, start, state)
    reason = f"rule {rule.name}: {_ladder_word(state, ladder, rung)}"
    explore = state.explore and rung < standard
    if explore and bucket("explore", features.request_id + slice_key) < state.explore:
        down = ladder.pools[rung + 1]
        if state.explore_live:
            reason += f", served by {down} to learn its step time"
            return _serve(ladder, rule, slice_key, rung + 1, start, reason, epoch=state.version)
        # a mirror that learns a step time needs only steps to time: a short one
        reason += f", mirrored to {down} to learn its step time"
        tokens = rule.guardrail.probe_tokens
        return _serve(
            ladder,
            rule,
            slice_key,
            rung,
            start,
            reason,
            down,
            epoch=state.version,
            shadow_tokens=tokens,
        )
    return _serve(ladder, rule, slice_key, rung, start, reason, epoch=state.version)


def _gate(features: Features, rule: CompiledRule, flags: Mapping[str, FlagValue]) -> str | None:
    """Why speculation is off for this request, or None when it may be used."""
    refused = flags.get(KILL_SWITCH, ALWAYS_ON).refusal(KILL_SWITCH, features)
    if refused == "off":
        return "kill switch: speculation is off"
    if refused is not None:
        return f"flag {KILL_SWITCH}: {refused}"
    flag = rule.rule.flag
    refused = None if flag is None else flags.get(flag, ALWAYS_ON).refusal(flag, features)
    if refused == "off":
        return f"rule {rule.name}: flag {flag} is off for this request"
    if refused is not None:
        return f"rule {rule.name}: flag {flag} {refused}"
    rollout = rule.rule.rollout
    if not in_rollout(rule.name, features, rollout):
        return f"rule {rule.name}: outside its {rollout_words(rollout)}"
    return None


def _shadow(
    features: Features, rule: CompiledRule, ladder: Ladder, slice_key: str, start: int
) -> Decision:
    target = rule.rule.shadow_to or ladder.first_speculative()
    mirrored = (
        target is not None
        and bucket("shadow", features.request_id + slice_key) < rule.rule.shadow_fraction
    )
    reason = f"rule {rule.name}: shadow, standard answers" + (
        f", mirrored to {target}" if mirrored else ""
    )
    return _serve(ladder, rule, slice_key, start, start, reason, target if mirrored else None)


def _probe(
    features: Features,
    rule: CompiledRule,
    ladder: Ladder,
    slice_key: str,
    rung: int,
    start: int,
    state: SliceState,
) -> Decision:
    up = ladder.pools[rung - 1]
    share = state.probe_share or rule.guardrail.probe_fraction
    drawn = bucket("probe", features.request_id + slice_key)
    if drawn >= share + state.mirror_share:
        reason = f"rule {rule.name}: fallen back to {ladder.pools[rung]}, probing {up} elsewhere"
        return _serve(ladder, rule, slice_key, rung, start, reason, epoch=state.version)
    if drawn >= share:
        tokens = rule.guardrail.probe_tokens
        reason = f"rule {rule.name}: fallen back to {ladder.pools[rung]}, short probe of {up}"
        return _serve(
            ladder,
            rule,
            slice_key,
            rung,
            start,
            reason,
            up,
            probe=True,
            epoch=state.version,
            shadow_tokens=tokens,
        )
    if rule.guardrail.probe is ProbeMode.SHADOW:
        reason = f"rule {rule.name}: fallen back to {ladder.pools[rung]}, mirrored probe of {up}"
        return _serve(
            ladder, rule, slice_key, rung, start, reason, up, probe=True, epoch=state.version
        )
    reason = f"rule {rule.name}: probe of {up} after falling back (offset {state.offset})"
    return _serve(ladder, rule, slice_key, rung - 1, start, reason, probe=True, epoch=state.version)


def _ladder_word(state: SliceState, ladder: Ladder, rung: int) -> str:
    if state.offset == 0:
        return f"on {ladder.pools[rung]}"
    return f"fallen back {state.offset} rung(s) to {ladder.pools[rung]}"


def _serve(
    ladder: Ladder,
    rule: CompiledRule,
    slice_key: str,
    rung: int,
    start: int,
    reason: str,
    shadow_to: str | None = None,
    *,
    probe: bool = False,
    epoch: int = 0,
    shadow_tokens: int | None = None,
) -> Decision:
    rungs = ladder.pools[rung:] + ladder.pools[:rung][::-1]
    return Decision(
        rule=rule.name,
        slice=slice_key,
        pool=ladder.pools[rung],
        rungs=rungs,
        rung=rung,
        start=start,
        reason=reason,
        shadow_to=shadow_to,
        shadow_tokens=shadow_tokens,
        probe=probe,
        epoch=epoch,
    )
