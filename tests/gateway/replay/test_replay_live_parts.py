"""What replay reproduces of a running gateway: its load meter and prefills, several
replicas sharing state, and the guardrail's answers that depend on them (the surge among
mixed traffic moves chat, quiet slices come back)."""

from __future__ import annotations

from pathlib import Path

from gateway.replay.run import replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).parents[3] / "bench"
BASELINE = load_policy((BENCH / "policies" / "baseline.yaml").read_text())
MIXED = load_policy((BENCH / "policies" / "mixed.yaml").read_text())
CHAT = "default / t0.3-0.9 / ctx<4k"


def scenario(name: str, **changes: object):
    loaded = load_scenario((BENCH / "scenarios" / f"{name}.yaml").read_text())
    return loaded.model_copy(update=changes)


def moves(events, key):
    return [
        (round(e.at), e.before.offset, e.after.offset)
        for e in events
        if e.slice == key and e.before.offset != e.after.offset
    ]


def test_chat_leaves_speculation_in_a_surge_beside_long_prompts_on_the_standard_pool():
    # the summaries' prefills share the standard pool's steps; judged by its decode step,
    # that pool is cheaper for chat at the surge's load, and chat moves within seconds
    done = replay(MIXED, scenario("surge-mix"))
    (fall, back) = moves(done.events, CHAT)
    assert fall[1:] == (0, 1) and 200 <= fall[0] <= 230
    assert back[1:] == (1, 0) and 400 <= back[0] <= 460


def test_two_replicas_sharing_state_move_the_slice_as_one_does():
    one = replay(MIXED, scenario("surge-mix"))
    two = replay(MIXED, scenario("surge-mix", gateways=2))
    ours, theirs = moves(one.events, CHAT), moves(two.events, CHAT)
    assert [m[1:] for m in theirs] == [m[1:] for m in ours]
    assert all(abs(a[0] - b[0]) <= 30 for a, b in zip(ours, theirs, strict=True))
    # every event once: the store applied each proposal for every replica
    assert len({(e.slice, e.after.version) for e in two.events}) == len(two.events)


def test_quiet_slices_come_back_soon_after_their_healing():
    # probes are drawn at random: the time back varies from run to run; its median over
    # three draws of the traffic is held to the targets (60 s and 5 minutes)
    healed, times = 900.0, {"default": [], "tools": []}
    for seed in (0, 1, 2):
        quiet = scenario("quiet-recovery")
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
