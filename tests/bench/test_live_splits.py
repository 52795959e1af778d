"""Live as in replay: code review (speculation gains) and long reports (speculation loses)
share one policy slice; through the real gateway, in front of real simulators on loopback
(``bench/live_scenarios.py``'s clients and pricing, the servers in this process to start in
a moment), the slice splits by template and the reports' child leaves speculation, as
``speclane replay`` decides on the same traffic (``bench/parity.py``'s comparison, its live
requests carrying the replay's ids)."""

from __future__ import annotations

import argparse
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from backends.sim.cli import build_parser, config_from_args, cost_for, cost_model_arg
from backends.sim.server import create_app as sim_app
from backends.sim.workload import Workload
from gateway.replay.report import summarise
from gateway.replay.run import replay
from gateway.replay.scenario import Scenario, Traffic, load_scenario
from gateway.settings import Settings
from policies.compiled import load_policy
from tests.gateways import gateway
from tests.servers import serving

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from live_scenarios import TOKEN, Ids, Run, drive, priced, sim_specs, stack_policy  # noqa: E402
from parity import replayed_ids  # noqa: E402

pytestmark = pytest.mark.anyio

SLICE = "default / t<=0.3 / ctx4k-16k"
# the README's first policy, with JSON extraction served on the standard pool: that pool's
# step time at long contexts is then measured, not explored for (explored requests come at
# random, a few a minute, and would make the reports' fall as random in both runs)
POLICY = (
    (BENCH / "policies" / "baseline.yaml")
    .read_text()
    .replace(
        "    match: {response_format: [json_object, json_schema]}\n    start: spec",
        "    match: {response_format: [json_object, json_schema]}\n    start: standard",
    )
)
COST_MODEL = "gpu"
SCALE = 0.3  # sixty scenario seconds in eighteen


def scenario() -> Scenario:
    """The first minute of ``two-apps-one-slice``: its two applications at steady load,
    beside long-prompt JSON extraction on the standard pool."""
    loaded = load_scenario((BENCH / "scenarios" / "two-apps-one-slice.yaml").read_text())
    apps = [t for t in loaded.traffic if t.name in ("review", "reports")]
    extract = Traffic(
        name="extract",
        workload=Workload.JSON,
        max_tokens=128,
        prompt_tokens=9000,
        clients=2,
        think_s=0.5,
        api_keys=4,
    )
    return loaded.model_copy(update={"duration_s": 60.0, "traffic": [*apps, extract]})


async def live(chosen: Scenario, tmp: Path, ids: Ids) -> tuple[dict[str, Any], Run]:
    policy = load_policy(POLICY)
    args = argparse.Namespace(time_scale=SCALE, method="draft_model", cost_model=COST_MODEL)
    specs = sim_specs(policy, chosen, args, lead_s=0.0)
    async with AsyncExitStack() as stack:
        urls: dict[str, list[str]] = {}
        for spec in specs:
            config = config_from_args(build_parser(argparse.ArgumentParser()).parse_args(spec.argv))
            url = await stack.enter_async_context(serving(sim_app(config)))
            urls.setdefault(spec.pool, []).append(url)
        path, log = tmp / "policy.yaml", tmp / "outcomes-0.jsonl"
        path.write_text(stack_policy(policy, urls))
        settings = Settings(policy=path, time_scale=SCALE, admin_token=TOKEN, outcome_log=log)
        url, _ = await stack.enter_async_context(gateway(settings))
        run = Run(chosen, policy, [url], SCALE, len(specs), ids=ids)
        events = await drive(run)
    return priced(run, events, [log], args), run


def split_at(events: list[dict[str, Any]]) -> float:
    (at,) = [float(e["at"]) for e in events if e["slice"] == SLICE and "split by" in e["reason"]]
    return at


def late(rows: Any, traffic: str) -> tuple[str, str]:
    """Where the newest few requests of ``traffic`` were decided and served (one place)."""
    mine = sorted(
        (r for r in rows if r.traffic == traffic and not r.shadow), key=lambda r: r.arrival
    )
    (where,) = {(r.slice, r.pool) for r in mine[-3:]}
    return where


@pytest.mark.paced
@pytest.mark.timeout(120)
async def test_two_applications_in_one_slice_split_live_as_in_replay(tmp_path: Path) -> None:
    chosen, policy = scenario(), load_policy(POLICY)
    done = replay(policy, chosen, cost=cost_for(cost_model_arg(COST_MODEL), "qwen3-32b"))
    replayed = summarise(done, policy)
    summary, run = await live(chosen, tmp_path, replayed_ids(done))
    assert abs(split_at(summary["events"]) - split_at(replayed["events"])) <= 10.0
    children = {f"{SLICE} / app:1", f"{SLICE} / app:2"}
    for rows in (done.rows, run.rows):
        (review, on), (reports, under) = late(rows, "review"), late(rows, "reports")
        assert review != reports and {review, reports} == children
        assert (on, under) == ("spec", "standard")
