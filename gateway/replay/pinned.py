"""What each conversation's turns would find cached had one pool served them all: the same
scenario replayed once per pool of its ladder, every request pinned there. Pure.

Where the engines keep a prefix cache, a turn's prefill depends on where it runs: the pool
that served its conversation's turns before holds its history, and one that did not
prefills all of it again. So the load-neutral prices (``pricing.py``) count each turn's
prefill of what its endpoint did not hold, and what always-standard, always-speculative
and the oracle would have paid for it comes from these runs: the same conversations (a
scenario's seed draws every one of them), served on one pool from first turn to last,
through the same simulator and placement. The pool has its own endpoints (``memory``
"pool": the deployment's memory for it, the other pool's idle), or as many as the whole
ladder has ("ladder": the whole ladder's hardware, as the load-neutral decode prices give
it, and its KV memory but for a draft model's share on a speculative pool). Neither is the
truth where a pool's memory cannot hold its conversations: the first makes always-standard
thrash as one pool would, the second gives it memory the deployment does not have for it
(``bench/RESULTS.md``, "Prefill in the price").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from backends.sim.model import StepCost
from gateway.replay.run import Replay, replay
from gateway.replay.scenario import Scenario
from policies.compiled import CompiledPolicy, compile_policy
from policies.model import GuardrailMode

Turn = tuple[str, int]  # a conversation's key and the turn's number
Held = Mapping[str, Mapping[Turn, int]]  # pool -> turn -> prompt tokens it prefilled there
Memory = Literal["pool", "ladder"]


def pinned_policy(policy: CompiledPolicy, pool: str, ladder: Sequence[str]) -> CompiledPolicy:
    """``policy`` with every rule starting on ``pool`` and nothing that would move it: no
    experiment, flag, rollout or shadow mirror, no split, and a guardrail that never falls.
    ``pool`` has as many endpoints as the whole ``ladder`` (load-neutral, as the prices are:
    the same hardware, and the same KV memory but for a draft's share, serving one way)."""
    file = policy.file
    urls = [url for p in ladder for url in file.pools[p].endpoints]
    pools = {**file.pools, pool: file.pools[pool].model_copy(update={"endpoints": urls})}
    rules = [
        rule.model_copy(
            update={
                "start": pool,
                "experiment": None,
                "shadow_fraction": 0.0,
                "shadow_to": None,
                "flag": None,
                "rollout": None,
                "guardrail": None,
            }
        )
        for rule in file.rules
    ]
    guardrail = file.guardrail.model_copy(
        update={"mode": GuardrailMode.THRESHOLD, "min_acceptance": 0.0, "recover_above": 0.0}
    )
    slices = file.slices.model_copy(update={"split": False, "pin": {}})
    update = {"pools": pools, "rules": rules, "guardrail": guardrail, "slices": slices}
    pinned = file.model_copy(update=update)
    return compile_policy(pinned)


def uncached(done: Replay) -> dict[Turn, int]:
    """Each conversation turn's prompt tokens its endpoint did not hold, in one run."""
    return {
        (row.talk, row.turn): max(row.prompt_tokens - row.cached, 0)
        for row in done.rows
        if row.talk and not row.shadow
    }


def held(policy: CompiledPolicy, scenario: Scenario, cost: StepCost, memory: Memory) -> Held:
    """Per pool of the scenario's ladder, each turn's uncached prompt tokens with every
    request served there, on the pool's own endpoints (``memory`` "pool") or on as many as
    the whole ladder has ("ladder"); empty for a scenario without a prefix cache or
    conversations."""
    if not scenario.prefix_caching or not any(t.session for t in scenario.traffic):
        return {}
    model = scenario.model or next(iter(policy.ladders))
    pools = policy.ladders[model].pools
    return {
        p: uncached(
            replay(
                pinned_policy(policy, p, pools if memory == "ladder" else [p]), scenario, cost=cost
            )
        )
        for p in pools
    }
