"""What replay reproduces of a running gateway: its load meter and prefills, several
replicas sharing state, and the guardrail's answers that depend on them (the surge among
mixed traffic moves chat, quiet slices come back). Their timings were derived on the affine
cost model, which the scenarios were written against: replay's default is now the measured
curve (``measured_for``), so they name the affine one."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.sim.model import CostModel
from gateway.replay.run import Replay
from gateway.replay.run import replay as replay_on
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

# CPU-bound: one worker runs these one after another (beside the other CPU-bound group),
# at a lower priority, with time to spare (docs/development.md, "Tests in parallel")
pytestmark = [pytest.mark.xdist_group("cpu-replay"), pytest.mark.timeout(600)]

BENCH = Path(__file__).parents[3] / "bench"
BASELINE = load_policy((BENCH / "policies" / "baseline.yaml").read_text())
MIXED = load_policy((BENCH / "policies" / "mixed.yaml").read_text())
CHAT = "default / t0.3-0.9 / ctx<4k"


def replay(policy, scenario):
    return replay_on(policy, scenario, cost=CostModel())


def scenario(name: str, **changes: object):
    loaded = load_scenario((BENCH / "scenarios" / f"{name}.yaml").read_text())
    return loaded.model_copy(update=changes)


def moves(events, key):
    return [
        (round(e.at), e.before.offset, e.after.offset)
        for e in events
        if e.slice == key and e.before.offset != e.after.offset
    ]


@pytest.fixture(scope="session")  # not "module": long tests of other modules run between
def surge_mix() -> Replay:
    """surge-mix through one gateway: replay is deterministic, so the tests that read it
    share one run."""
    return replay(MIXED, scenario("surge-mix"))


def test_chat_leaves_speculation_in_a_surge_beside_long_prompts_on_the_standard_pool(
    surge_mix: Replay,
):
    # the summaries' prefills share the standard pool's steps; judged by its decode step,
    # that pool is cheaper for chat at the surge's load, and chat moves within seconds (the
    # context-aware curve has more parts to pin than a line in the batch, 234 s where the
    # line took up to 230)
    (fall, back) = moves(surge_mix.events, CHAT)
    assert fall[1:] == (0, 1) and 200 <= fall[0] <= 240
    assert back[1:] == (1, 0) and 400 <= back[0] <= 460


@pytest.mark.long(9)
def test_two_replicas_sharing_state_move_the_slice_as_one_does(surge_mix: Replay):
    one = surge_mix
    two = replay(MIXED, scenario("surge-mix", gateways=2))
    ours, theirs = moves(one.events, CHAT), moves(two.events, CHAT)
    assert [m[1:] for m in theirs] == [m[1:] for m in ours]
    # each replica probes on its own share of the requests it sees, so two climb back a
    # little after one (20-31 s later over four seeds of surge-mix)
    assert all(abs(a[0] - b[0]) <= 40 for a, b in zip(ours, theirs, strict=True))
    # every event once: the store applied each proposal for every replica
    assert len({(e.slice, e.after.version) for e in two.events}) == len(two.events)


@pytest.mark.long(15)
def test_quiet_slices_come_back_soon_after_their_healing():
    # probes are drawn at random: the time back varies from run to run; its median over
    # three draws of the traffic is held to the targets (60 s and 5 minutes). The replay
    # stops arriving 5 minutes after the healing: what happens up to then does not depend on
    # what arrives later, and a slice back later, or never, misses both targets alike.
    healed, times = 900.0, {"default": [], "tools": []}
    for seed in (0, 1, 2):
        quiet = scenario("quiet-recovery", duration_s=healed + 300)
        done = replay(BASELINE, quiet.model_copy(update={"seed": quiet.seed + 1000 * seed}))
        back: dict[str, float] = {}
        for e in done.events:
            if e.after.offset < e.before.offset and e.at >= healed:
                back.setdefault(e.slice.split(" / ")[0], e.at - healed)
        for key in times:
            times[key].append(back.get(key, 600.0))
    assert sorted(times["default"])[1] <= 60  # one request every 3 s
    assert sorted(times["tools"])[1] <= 300  # one every 20 s


def test_a_collapse_moves_one_tool_arriving_by_three_apis_as_one_slice():
    # the tool's calls by chat, by Anthropic's Messages and by OpenAI's Responses are one
    # slice (one tool schema) when the policy slices by tool schema and not by endpoint
    sliced = load_policy(
        (BENCH / "policies" / "baseline.yaml").read_text() + "slices: {tool_schemas: 16}\n"
    )
    done = replay(sliced, scenario("three-apis-collapse"))
    doors = ("tools-chat", "tools-messages", "tools-responses")
    (key,) = {row.slice for row in done.rows if row.traffic in doors}
    (fall, back) = moves(done.events, key)
    # within seconds, as the same tool by chat alone does (tool-collapse): the mirrors of
    # every door teach the standard pool's step time alike
    assert fall[1:] == (0, 1) and 300 <= fall[0] <= 330
    assert back[1:] == (1, 0) and 600 <= back[0] <= 660
    for door in doors:
        after_fall = [r for r in done.rows if r.traffic == door and fall[0] < r.arrival < 600]
        healed = [r for r in done.rows if r.traffic == door and r.arrival > back[0] + 30]
        assert sum(r.pool == "standard" for r in after_fall) > 0.9 * len(after_fall)
        assert sum(r.pool == "spec" for r in healed) > 0.95 * len(healed)
