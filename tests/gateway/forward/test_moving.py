"""A cached conversation whose slice is now served on another pool: kept where its cache is
when moving costs more than it saves (the decision's pool, rungs and reason say so), moved
when it pays, and left alone when it is new (a first turn, however much of it is cached), a
probe sent up the ladder, an experiment's, or cached on a pool that is out of the ladder or
of service. A request carrying a mirrored probe is priced like the rest."""

from __future__ import annotations

import dataclasses

from backends.placement import Affinity
from backends.pool import Pools, PoolSpec
from backends.upstream import Upstream
from gateway.forward.moving import Moved, keep_or_move
from gateway.measure.conversations import Conversations
from policies.decision import Decision
from policies.features import Features, PromptHashes

SPEC, STD = "http://spec:1", "http://std:1"
POOLS = [PoolSpec("spec", "m", (SPEC,), k=4), PoolSpec("standard", "m", (STD,))]
FALLEN = Decision("default", "default / s", "standard", ("standard", "spec"), 1, 0, "fallen back")
# 120 blocks of 256 bytes: a ~30k-byte, ~7k-token conversation
FEATURES = Features(
    endpoint="/v1/chat/completions",
    model="m",
    prompt_tokens=7_000,
    prompt=PromptHashes(chain=tuple(range(120)), opening=(2_000 << 32) | 5, size=30_720, turn=8),
)


class Priced:
    def __init__(self, decode: dict[str, float], prefill: dict[str, float]) -> None:
        self.decode, self.prefill = decode, prefill

    def seconds_per_token(self, key: str, now: float) -> dict[str, float]:
        return self.decode

    def prefill_seconds_per_token(self, key: str, now: float) -> dict[str, float]:
        return self.prefill


def learned(turns: int) -> Conversations:
    """Ten conversations of ``turns`` turns, one a second, each over (idle long since)."""
    seen = Conversations()
    for opening in range(10):
        for turn in range(1, turns + 1):
            seen.saw("default / s", opening, turn, float(turn))
    seen.saw("default / s", 99, 1, 1000.0)  # a new one, long after: the ten have ended
    seen.answered("default / s", 60)
    return seen


def decide(
    held: dict[str, int],
    decision: Decision = FALLEN,
    prices: Priced | None = None,
    turns: int = 9,
    features: Features = FEATURES,
    kept: dict[str, float] | None = None,
):
    pools = Pools(POOLS, Upstream(), lambda: 0.0)
    prices = prices or Priced({"spec": 0.012, "standard": 0.010}, {"standard": 0.0003})
    past = {url for url, blocks in held.items() if blocks > 7}  # beyond the opening
    affinity = Affinity(5, held, frozenset(past))
    share = (kept or {}).get
    return keep_or_move(
        decision, features, affinity, pools, prices, learned(turns), 0.0, lambda u: share(u, 1.0)
    )


def test_a_conversation_with_little_left_to_save_is_kept_where_it_is_cached():
    decision, how, held_on = decide({SPEC: 120})
    assert how is Moved.KEPT and held_on == "spec"
    assert decision.pool == "spec" and decision.rungs == ("spec", "standard")
    assert decision.reason == (
        "kept on spec: moving would re-prefill 7,000 tokens (~2.1 s) for ~318 ms of decode saving"
    )


def test_a_conversation_with_much_left_to_save_moves():
    decision, how, _ = decide(
        {SPEC: 120}, prices=Priced({"spec": 0.05, "standard": 0.01}, {"standard": 0.0003}), turns=40
    )
    assert how is Moved.MOVED and decision.pool == "standard"
    assert decision.reason.startswith("fallen back; moved from spec: re-prefilling 7,000 tokens")


def test_an_endpoint_that_keeps_little_of_what_it_is_sent_holds_little_to_lose():
    # spec's answers lately found a tenth of what the map believed cached there: moving
    # re-prefills what it would mostly re-prefill on spec anyway
    decision, how, _ = decide({SPEC: 120}, kept={SPEC: 0.1})
    assert how is Moved.MOVED and "re-prefilling 700 tokens" in decision.reason
    assert decide({SPEC: 120}, kept={SPEC: 0.9})[1] is Moved.KEPT


def test_without_prices_it_follows_the_rung():
    decision, how, _ = decide({SPEC: 120}, prices=Priced({}, {}))
    assert how is Moved.UNPRICED and decision.pool == "standard"


def test_what_is_new_probing_or_in_an_experiment_follows_the_decision():
    assert decide({SPEC: 7})[1] is None  # only part of the opening: a new conversation
    assert decide({})[1] is None
    assert decide({SPEC: 120}, dataclasses.replace(FALLEN, probe=True))[1] is None
    assert decide({SPEC: 120}, dataclasses.replace(FALLEN, arm="standard"))[1] is None
    assert decide({STD: 120})[1] is None  # already where its cache is
    off_ladder = dataclasses.replace(FALLEN, rungs=("standard",))
    assert decide({SPEC: 120}, off_ladder)[1] is None


def test_a_first_turn_follows_the_rung_even_where_its_whole_prompt_is_cached():
    """Sent before as it is (a template's opening, a prompt sent again), it is the same on
    every request that opens alike: moved, it is prefilled once on the pool the slice went
    to, and cached there for the rest. Kept, every one of them would be kept."""
    opening = (30_720 << 32) | 5  # the whole prompt is the opening
    first = PromptHashes(chain=tuple(range(120)), opening=opening, size=30_720, turn=1)
    features = dataclasses.replace(FEATURES, prompt=first)
    assert decide({SPEC: 120}, features=features) == (FALLEN, None, "")
    assert decide({SPEC: 120})[1] is Moved.KEPT  # the same prompt at turn 8 is priced


SHORT_PROBE = dataclasses.replace(
    FALLEN, reason="short probe of spec", shadow_to="spec", shadow_tokens=16, probe=True
)


def test_a_request_carrying_a_short_probe_kept_where_it_is_cached_is_the_probe():
    """Not priced, it went to the standard pool cold, re-prefilling its whole history, and
    a mirror prefilled it again on spec beside it."""
    decision, how, _ = decide({SPEC: 120}, SHORT_PROBE)
    assert how is Moved.KEPT and decision.pool == "spec" and decision.probe
    assert decision.shadow_to is None and decision.shadow_tokens is None


def test_a_request_carrying_a_short_probe_that_moves_keeps_its_mirror():
    prices = Priced({"spec": 0.05, "standard": 0.01}, {"standard": 0.0003})
    decision, how, _ = decide({SPEC: 120}, SHORT_PROBE, prices=prices, turns=40)
    assert how is Moved.MOVED and decision.pool == "standard"
    assert (decision.shadow_to, decision.shadow_tokens) == ("spec", 16)
