"""Multi-turn sessions in scenarios (``Traffic.session``, ``bodies.Talk``) and the replay's
endpoint choice over them (``gateway/replay/placing.py``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from backends.sim.agents import chat_of
from backends.sim.cluster import Served
from backends.sim.prefix import prompt_hashes
from backends.sim.workload import Workload, estimate_prompt_tokens
from gateway import schema
from gateway.apis import named
from gateway.classify import Defaults, classify
from gateway.measure.acceptance import Labels
from gateway.replay.bodies import Talk
from gateway.replay.run import _outcome, replay
from gateway.replay.scenario import Session, Traffic, load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).parents[3] / "bench"


def _traffic(api: str, **session: object) -> Traffic:
    return Traffic(
        name="agent",
        api=api,
        workload="tools",
        tools=[{"name": "Bash"}],
        clients=1,
        session=Session(**{"billing": api == "messages", **session}),
    )


def _turns(talk: Talk) -> list[tuple[dict[str, object], dict[str, object]]]:
    """Every turn's body as sent and as the simulated engine runs it."""
    out = []
    while not talk.done:
        built = talk.body("s", 0, "qwen3-32b")
        out.append((built.body, chat_of(built.path, built.body)))
        talk.answered()
    return out


@pytest.mark.parametrize("api", ["messages", "responses", "chat"])
def test_each_turn_resends_the_whole_conversation_before_it(api):
    traffic = _traffic(
        api, min_turns=6, max_turns=6, first_tokens=2000, last_tokens=9000, system_tokens=500
    )
    turns = _turns(Talk.draw("s", 1, traffic, 0, 0))
    assert len(turns) == 6
    sizes = [estimate_prompt_tokens(engine) for _, engine in turns]
    assert 1700 < sizes[0] < 2400 and 6500 < sizes[-1] < 10000
    assert sizes == sorted(sizes)
    openings = set()
    for (_, before), (body, after) in zip(turns, turns[1:], strict=False):
        old = prompt_hashes(before, 16)
        assert prompt_hashes(after, 16)[: len(old)] == old  # the engine's cache finds it
        parsed, _ = schema.parse(orjson.dumps(body), named(api).model)
        features = classify(parsed, "/v1/" + api, {}, "r", Defaults())
        openings.add(features.prompt.opening)
    assert len(openings) == 1  # one conversation to the gateway, turn after turn


def test_claude_codes_billing_line_changes_every_turn():
    turns = _turns(Talk.draw("s", 1, _traffic("messages", min_turns=3, max_turns=3), 0, 0))
    lines = [body["system"][0]["text"] for body, _ in turns]  # type: ignore[index]
    assert all(line.startswith("x-anthropic-billing-header: cc_version=") for line in lines)
    assert len(set(lines)) == 3


def test_conversations_are_drawn_from_the_seed():
    traffic = _traffic("chat")
    one = Talk.draw("s", 1, traffic, 0, 0)
    assert Talk.draw("s", 1, traffic, 0, 0) == one
    others = [Talk.draw("s", 2, traffic, 0, 0), Talk.draw("s", 1, traffic, 1, 0)]
    assert all(o.opening != one.opening for o in others)
    assert Talk.draw("s", 1, traffic, 0, 1).system == one.system  # the class's template


@pytest.mark.parametrize(
    ("session", "extra", "message"),
    [
        ("{min_turns: 5, max_turns: 2}", "clients: 1", "min_turns"),
        ("{first_tokens: 900, system_tokens: 1000}", "clients: 1", "system_tokens <"),
        ("{}", "rate: 1", "sessions need clients"),
        ("{billing: true}", "clients: 1, api: responses", "billing line goes on Messages"),
    ],
)
def test_bad_sessions_say_what_is_wrong(session, extra, message):
    text = f"""
version: 1
name: x
duration_s: 10
traffic:
  - {{name: a, workload: chat, {extra}, session: {session}}}
"""
    with pytest.raises(ValueError, match=message):
        load_scenario(text)


SESSIONS = """
version: 1
name: sessions
duration_s: 300
seed: 9
prefix_caching: true
traffic:
  - name: agent
    api: messages
    workload: tools
    max_tokens: 16
    tools: [{name: Bash}]
    clients: 2
    think_s: 0.5
    session: {min_turns: 3, max_turns: 5, first_tokens: 1000, last_tokens: 3000,
              system_tokens: 200, billing: true, sessions: 2}
"""


def test_replayed_sessions_run_to_their_end_each_turn_where_its_cache_is():
    policy = load_policy((BENCH / "policies" / "agents.yaml").read_text())
    result = replay(policy, load_scenario(SESSIONS))
    talks: dict[str, list[tuple[float, int, str, int]]] = defaultdict(list)
    for row in result.rows:
        if not row.shadow:
            talks[row.talk].append((row.arrival, row.turn, row.endpoint, row.cached))
    assert len(talks) == 4  # two clients, two conversations each, then they stop
    for turns in talks.values():
        turns.sort()
        assert [t for _, t, _, _ in turns] == list(range(1, len(turns) + 1))
        assert 3 <= len(turns) <= 5
        on_spec = [(e, cached) for _, _, e, cached in turns if e.startswith("spec#")]
        assert len({e for e, _ in on_spec}) == 1  # light load: one endpoint throughout
        assert all(cached > 0 for _, cached in on_spec[1:])


def test_a_replayed_answer_says_what_was_cached_where_the_live_simulator_would():
    """The guardrail prices a probe's prefill by what its answers said was cached, live; a
    replay that left it out never learned it."""
    served = Served(1, "spec", "spec#0", 0.0, Workload.TOOLS, 0.8, 9000, 4, cached_tokens=8800)
    served.first, served.last, served.done = 1.0, 2.0, 2.0
    served.completion_tokens, served.chunks, served.steps = 40, 20, 20
    labels = Labels("m", "agents", "agents / s", "spec", 4, probe=True)
    assert _outcome(labels, served, cached=True).cached_tokens == 8800
    assert _outcome(labels, served, cached=False).cached_tokens is None
