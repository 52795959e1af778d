"""The multi-pool virtual-time cluster: the same scheduler as ``simulate``, several pools,
and the load a gateway in front would see."""

from __future__ import annotations

from backends.sim.cluster import Cluster
from backends.sim.config import Mode, SimConfig, parse_drift
from backends.sim.model import build_profile
from backends.sim.virtual import TimedRequest, simulate

CODE = {"messages": [{"role": "user", "content": "write python"}], "temperature": 0}


def drain(cluster: Cluster):
    out = []
    while cluster.next_event() is not None:
        out.extend(cluster.advance())
    return sorted(out, key=lambda s: s.key)


def test_one_pool_matches_simulate():
    config = SimConfig(seed=4, max_num_seqs=8)
    requests = [TimedRequest(i * 0.05, CODE | {"max_tokens": 64}) for i in range(12)]
    expected = simulate(requests, config)
    cluster = Cluster({"spec": [config]})
    served = []
    for i, request in enumerate(requests):
        while (at := cluster.next_event()) is not None and at <= request.at:
            served.extend(cluster.advance())
        cluster.submit(i, "spec", request.body, request.at, 64)
    served.extend(drain(cluster))
    served.sort(key=lambda s: s.key)
    for got, want in zip(served, expected, strict=True):
        assert got.completion_tokens == want.completion_tokens
        assert got.first == want.token_times[0] and got.last == want.token_times[-1]
        assert got.num_accepted_draft_tokens == want.num_accepted_draft_tokens
        assert got.chunks == want.steps


def test_pools_run_side_by_side_and_loads_are_time_weighted():
    cluster = Cluster(
        {
            "spec": [SimConfig(seed=1)],
            "standard": [SimConfig(Mode.STANDARD, seed=2), SimConfig(Mode.STANDARD, seed=3)],
        }
    )
    assert cluster.pools == {"spec": 1, "standard": 2}
    for i in range(4):
        cluster.submit(i, "standard", CODE | {"max_tokens": 32}, 0.0, 32)
    assert cluster.outstanding("standard") == [2, 2]  # least outstanding first
    cluster.submit(9, "spec", CODE | {"max_tokens": 32}, 0.0, 32)
    served = drain(cluster)
    assert [s.pool for s in served] == ["standard"] * 4 + ["spec"]
    assert all(s.k is None for s in served[:4]) and served[-1].k == 4
    assert all(1.0 <= s.load <= 2.0 for s in served[:4])  # two per endpoint, then fewer
    assert served[-1].load == 1.0
    assert cluster.outstanding("standard") == [0, 0]


def test_a_tool_drift_point_applies_to_that_tool_only():
    drift = parse_drift("tools/search_v2@0=0.1")
    tool = {"type": "function", "function": {"name": "search_v2", "parameters": {}}}
    other = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    ask = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    low = build_profile(ask | {"tools": [other, tool]}, seed=0, index=0, max_tokens=8, drift=drift)
    high = build_profile(ask | {"tools": [other]}, seed=0, index=0, max_tokens=8, drift=drift)
    assert low.acceptance < 0.11 < 0.8 < high.acceptance
