"""``bench/live_scenarios.py`` with conversations: each client draws the conversations replay
draws for it and stops after its sessions, and an answer's usage and first generated
content are read in every API's words, streamed or whole."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.replay.bodies import Talk
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from agent_cache import POLICY  # noqa: E402
from live_scenarios import Answered, Run, _generated, _turn  # noqa: E402

SCENARIO = load_scenario(
    """
version: 1
name: two-sessions
duration_s: 60
seed: 9
prefix_caching: true
traffic:
  - name: claude-code
    api: messages
    workload: tools
    max_tokens: 16
    tools: [{name: Bash, parameters: {command: string}}]
    clients: 1
    session: {min_turns: 2, max_turns: 3, first_tokens: 600, last_tokens: 900,
              system_tokens: 100, billing: true, sessions: 2}
"""
)


def test_a_client_sends_replays_conversations_turn_by_turn_then_stops():
    run = Run(SCENARIO, load_policy(POLICY.read_text()), ["http://gw"], 1.0, 5)
    traffic = SCENARIO.traffic[0]
    keys, turns = [], []
    while (talk := _turn(run, 0, traffic, 0)) is not None:
        drawn = Talk.draw(SCENARIO.name, SCENARIO.seed, traffic, 0, talk.number)
        assert (talk.key, talk.turns, talk.opening) == (drawn.key, drawn.turns, drawn.opening)
        keys.append(talk.key)
        turns.append(talk.turn)
        talk.answered()
    assert len(set(keys)) == 2  # its two sessions, then none
    assert len(turns) == sum(Talk.draw(SCENARIO.name, 9, traffic, 0, n).turns for n in (0, 1))
    assert _turn(run, 0, traffic, 0) is None


def test_usage_is_read_in_every_apis_words():
    chat = Answered()
    chat.read({"prompt_tokens": 900, "completion_tokens": 12})
    chat.read({"prompt_tokens_details": {"cached_tokens": 640}})
    assert (chat.prompt, chat.tokens, chat.cached) == (900, 12, 640)
    messages = Answered()
    messages.read({"input_tokens": 900, "output_tokens": 0})  # message_start
    messages.read({"input_tokens": 900, "output_tokens": 12, "cache_read_input_tokens": 640})
    assert (messages.prompt, messages.tokens, messages.cached) == (900, 12, 640)
    responses = Answered()
    responses.read(
        {"input_tokens": 900, "output_tokens": 12, "input_tokens_details": {"cached_tokens": 640}}
    )
    assert (responses.prompt, responses.tokens, responses.cached) == (900, 12, 640)
    responses.read(None)
    assert responses.cached == 640


def test_opening_events_are_not_the_first_token():
    assert not _generated({"type": "message_start", "message": {}})
    assert not _generated({"type": "response.created", "response": {}})
    assert not _generated({"choices": [], "usage": {"prompt_tokens": 3}})
    assert _generated({"type": "content_block_start", "index": 0})
    assert _generated({"type": "response.output_item.added"})
    assert _generated({"choices": [{"delta": {"role": "assistant"}}]})
