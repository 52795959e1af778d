"""``speclane replay``: scenarios parse, replays are deterministic and priced consistently,
and the shipped suite covers what it says."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim.config import parse_drift
from backends.sim.model import CostModel
from gateway.cli.main import main
from gateway.replay.pricing import cells, prices, totals
from gateway.replay.report import summarise
from gateway.replay.run import replay
from gateway.replay.scenario import ScenarioError, load_scenario
from policies.compiled import load_policy

# CPU-bound: one worker runs these one after another, at a lower priority, with time to
# spare (docs/development.md, "Tests in parallel")
pytestmark = [pytest.mark.xdist_group("cpu"), pytest.mark.timeout(600)]

ROOT = Path(__file__).parents[3]
BENCH = ROOT / "bench"
POLICY = load_policy((BENCH / "policies" / "baseline.yaml").read_text())
SMALL = """
version: 1
name: small
duration_s: 120
seed: 3
phases: {healthy: 0, collapsed: 40}
traffic:
  - {name: code, workload: code, max_tokens: 48, clients: 3, think_s: 0.2}
  - {name: chat, workload: chat, temperature: 0.7, max_tokens: 64, rate: 1.0, users: 5,
     schedule: [{at_s: 60, rate: 0}]}
acceptance:
  - step: {at_s: 40, workload: code, base: 0.02}
"""


def test_shipped_scenarios_parse_and_cover_the_issue():
    paths = sorted((BENCH / "scenarios").glob("*.yaml"))
    assert len(paths) >= 8
    for path in paths:
        scenario = load_scenario(path.read_text())
        assert scenario.name == path.stem
        parse_drift(scenario.drift_arg())  # the live runner's sim flag


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nname: x\nduration_s: 1\ntraffic: []", "at least 1"),
        ("[", "not valid YAML"),
        (SMALL.replace("clients: 3", "clients: 3, rate: 1"), "exactly one of clients or rate"),
        (SMALL.replace("temperature: 0.7", "temperature: 1.2"), "chat needs temperature"),
        (SMALL + "max_num_batched_tokens: 255\n", "at least max_num_seqs"),
        (SMALL.replace("workload: chat,", "workload: chat, api: grpc,"), "api"),
        (
            SMALL.replace("workload: code,", "workload: json, api: completions,"),
            "completions offer no tools or JSON output",
        ),
        (SMALL.replace("workload: code,", "workload: json, api: messages,"), "chat or responses"),
    ],
)
def test_bad_scenarios_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        load_scenario(text)


def test_a_wrong_key_is_placed_in_the_file_like_policy_lint():
    text = SMALL.replace("duration_s: 120", "duraton_s: 120").replace("think_s", "thnik_s")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(text, "s.yaml")
    assert str(caught.value).splitlines() == [
        "s.yaml:4:1: error: duraton_s: unknown key 'duraton_s' (hint: did you mean 'duration_s'?)",
        "s.yaml:8:62: error: traffic.0.thnik_s: unknown key 'thnik_s' "
        "(hint: did you mean 'think_s'?)",
    ]


def test_the_cli_prints_placed_errors_and_no_traceback(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SMALL.replace("max_tokens: 48", "max_tokens: many"))
    policy = BENCH / "policies" / "baseline.yaml"
    assert main(["replay", "--policy", str(policy), "--scenario", str(scenario)]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == f"{scenario}:8:46: error: traffic.0.max_tokens: expected a whole number, got 'many'\n"
    )


VOCABULARY = ["version", "name", "duration_s", "traffic", "workload", "clients", "rate", "1"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(VOCABULARY)),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.sampled_from(VOCABULARY), inner, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda v: yaml.safe_dump(v)),
    )
)
def test_any_bytes_give_a_scenario_or_placed_errors(data):
    try:
        load_scenario(data, "s.yaml")
    except ScenarioError as exc:
        assert exc.problems
        assert all(p.line >= 1 and p.column >= 1 for p in exc.problems)
        assert all(line.startswith("s.yaml:") for line in str(exc).splitlines())


def test_replay_is_deterministic_and_prices_consistently():
    scenario = load_scenario(SMALL)
    first, second = replay(POLICY, scenario), replay(POLICY, scenario)
    assert [(r.arrival, r.pool, r.tokens) for r in first.rows] == [
        (r.arrival, r.pool, r.tokens) for r in second.rows
    ]
    assert {r.traffic for r in first.rows} == {"code", "chat"}
    assert max(r.arrival for r in first.rows if r.traffic == "chat") <= 60.0
    price = prices(first, {"spec": None, "standard": None})
    table = cells(first, price, skip_first=3)
    total = totals(table, first.ladder.pools)
    assert total.oracle <= total.best_static <= min(total.pools.values()) + 1e-9
    for cell in table:
        assert cell.oracle <= min(cell.pools.values())
    code = {c.phase: c for c in table if c.traffic == "code"}
    assert code["healthy"].oracle_pool() == "spec"
    assert code["collapsed"].oracle_pool() == "standard"
    summary = summarise(first, POLICY)
    assert summary["requests"] == sum(1 for r in first.rows if not r.shadow)


def test_the_scenarios_token_budget_reaches_the_simulated_endpoints():
    """A prompt of about 1,000 tokens in 100-token chunks takes about ten steps to its first
    token, each adding a step's fixed cost."""
    long = """
version: 1
name: long
duration_s: 20
max_num_seqs: 8
traffic:
  - {name: code, workload: code, max_tokens: 8, prompt_tokens: 1000, clients: 1}
"""
    # on the affine model, whose fixed cost per step is what is counted (replay's default
    # is the measured curve, whose floor depends on the tokens in the step)
    roomy = replay(POLICY, load_scenario(long), cost=CostModel())
    tight = replay(POLICY, load_scenario(long + "max_num_batched_tokens: 101\n"), cost=CostModel())
    one, chunked = roomy.rows[0], tight.rows[0]
    assert (one.pool, one.tokens) == (chunked.pool, chunked.tokens) == ("spec", 8)
    steps = (
        (chunked.done - chunked.arrival) - (one.done - one.arrival)
    ) / CostModel().target_fixed_s
    assert 9 <= round(steps) <= 11 and steps == pytest.approx(round(steps))  # one more per chunk


def test_a_scenario_turns_the_simulated_prefix_cache_on():
    """A class's requests are byte-identical: with ``prefix_caching`` every request after
    the first finds its prompt cached and skips most of its prefill."""
    text = """
version: 1
name: cached
duration_s: 20
traffic:
  - {name: code, workload: code, max_tokens: 8, prompt_tokens: 4000, clients: 1}
"""
    cold = replay(POLICY, load_scenario(text))
    warm = replay(POLICY, load_scenario(text + "prefix_caching: true\n"))

    def latency(run, i):
        return run.rows[i].done - run.rows[i].arrival

    assert latency(warm, 0) == pytest.approx(latency(cold, 0))
    assert latency(warm, 2) < 0.7 * latency(cold, 2)


def test_cli_writes_a_summary_per_scenario(tmp_path, capsys):
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    policy = BENCH / "policies" / "baseline.yaml"
    code = main(
        [
            "replay",
            "--policy",
            str(policy),
            "--scenario",
            str(scenario),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    assert "| small |" in capsys.readouterr().out
    assert (tmp_path / "out" / "small.json").exists()
    assert main(["replay", "--policy", str(policy), "--scenario", str(tmp_path / "nope")]) == 1
