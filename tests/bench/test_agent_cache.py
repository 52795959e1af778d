"""``bench/agent_cache.py`` on a tiny agent scenario: the gateway's prefix-aware endpoint
choice keeps more of the conversations' prompts cached than least-outstanding does, the
cache-knowing oracle at least as much, and every strategy serves the same turns."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from agent_cache import POLICY, run  # noqa: E402

TINY = """
version: 1
name: tiny-agents
duration_s: 600
seed: 5
prefix_caching: true
kv_cache_tokens: 120000
traffic:
  - name: claude-code
    api: messages
    workload: tools
    max_tokens: 32
    tools: [{name: Bash, parameters: {command: string}}]
    clients: 6
    think_s: 1
    session: {min_turns: 5, max_turns: 8, first_tokens: 2000, last_tokens: 8000,
              system_tokens: 500, billing: true, sessions: 1}
"""


def test_prefix_placement_keeps_more_cached_than_least_outstanding():
    policy = load_policy(POLICY.read_text())
    least, prefix, oracle = run(policy, load_scenario(TINY), ["least", "prefix", "oracle"])
    assert least.turns == prefix.turns == oracle.turns > 6 * 5
    assert prefix.hit > least.hit
    assert oracle.hit > least.hit
    assert 0 < prefix.gpu_s < least.gpu_s
