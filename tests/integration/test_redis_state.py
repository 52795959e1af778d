"""Replicas sharing state through a real Redis: flags and the kill switch propagate within a
second, windows add up, a guardrail transition happens once, and Redis dying (and coming
back empty) costs clients nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.livestats import LiveStats
from gateway.measure.replica import Replica
from gateway.measure.telemetry import Telemetry
from gateway.services import Services
from gateway.state.flagstore import FlagStore
from gateway.state.redis_store import RedisState
from policies.compiled import load_policy
from policies.flags import FlagValue
from tests.fakes import FakeUpstream
from tests.gateways import gateway, policy_yaml, settings
from tests.redis_server import namespace, private_redis, require_shared_redis
from tests.servers import serving

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}
Running = tuple[str, Services]
RULES = """
guardrail:
  {mode: threshold, min_acceptance: 0.5, recover_above: 0.6, min_samples: 10, cooldown_s: 30}
rules:
  - {name: default, start: spec}
"""


async def wait_for(predicate, timeout: float = 3.0) -> float:
    """Seconds until ``predicate()`` (async) holds; fails after ``timeout``."""
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def drop(url: str, ns: str) -> None:
    client = aioredis.from_url(url)
    keys = [k async for k in client.scan_iter(f"{ns}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def outcome(acceptance: float, epoch: int = 0) -> Outcome:
    labels = Labels("tiny", "default", "default / t>0.9 / ctx<4k", "spec", 4, epoch=epoch)
    drafted = 100
    return Outcome(
        labels,
        Status.OK,
        0.0,
        1.0,
        0.1,
        0.02,
        10,
        50,
        20,
        Signal.PER_REQUEST,
        drafted=drafted,
        accepted=int(drafted * acceptance),
        steps=30,
    )


@asynccontextmanager
async def replicas(tmp_path: Path, **common: Any) -> AsyncIterator[tuple[Running, Running]]:
    """Two gateways on one policy and one store, in front of the same fake upstreams."""
    fake = FakeUpstream()
    async with serving(fake.app()) as spec, serving(fake.app()) as std:
        text = policy_yaml([spec], [std], rules=RULES)
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        async with (
            gateway(settings(tmp_path / "a", text, **common)) as a,
            gateway(settings(tmp_path / "b", text, **common)) as b,
        ):
            yield a, b


async def test_two_replicas_share_flags_within_a_second(tmp_path):
    url = require_shared_redis()
    ns = namespace()
    try:
        async with (
            replicas(tmp_path, redis_url=url, namespace=ns, admin_token=TOKEN) as ((a, _), (b, _)),
            httpx.AsyncClient() as c,
        ):

            async def b_pool() -> str:
                r = await c.post(b + "/v1/chat/completions", json=CHAT)
                return r.headers["x-speclane-pool"]

            assert await b_pool() == "spec"
            await c.put(
                a + "/admin/flags/speculation",
                json={"enabled": False, "reason": "test"},
                headers=AUTH,
            )

            async def b_is_standard() -> bool:
                return await b_pool() == "standard"

            took = await wait_for(b_is_standard, timeout=2.0)
            flags_b = (await c.get(b + "/admin/flags/speculation", headers=AUTH)).json()
            audit_b = (await c.get(b + "/admin/audit", headers=AUTH)).json()["audit"]
    finally:
        await drop(url, ns)
    assert took < 1.0
    assert flags_b["enabled"] is False and flags_b["source"] == "ops"
    assert [a["flag"] for a in audit_b] == ["speculation"]


async def test_windows_add_up_and_a_transition_happens_once(tmp_path):
    url = require_shared_redis()
    ns = namespace()
    try:
        async with replicas(tmp_path, redis_url=url, namespace=ns, sync_interval_s=30) as (
            (_, a),
            (_, b),
        ):
            now = time.time()
            for _ in range(6):  # 6 + 6 >= min_samples only when added up
                a.stats.record(outcome(0.2), now)
                b.stats.record(outcome(0.2), now)
            assert not a.stats.guards and not b.stats.guards
            await a.state.sync()
            await b.state.sync()
            await a.state.sync()
            key = "default / t>0.9 / ctx<4k"
            merged = a.stats.views.summary(now)[key]["pools"]["spec"]
            assert merged["measured"] == 12
            # the economic guardrail's tallies add up across replicas too
            assert merged["stepped"] == 12 and merged["tokens_per_step"] == 49 / 30
            # one more sample on each makes both propose the same fall-back
            a.stats.record(outcome(0.2), now)
            b.stats.record(outcome(0.2), now)
            assert a.stats.slices.proposals and b.stats.slices.proposals
            await a.state.sync()
            await b.state.sync()
            await a.state.sync()
            events = await a.state.events(10)
            assert a.stats.guards[key] == b.stats.guards[key]
            assert a.stats.guards[key].offset == 1
    finally:
        await drop(url, ns)
    assert len(events) == 1
    assert "acceptance 0.200 < 0.5" in events[0]["reason"]


async def test_redis_down_and_back_empty_costs_clients_nothing(tmp_path):
    fake = FakeUpstream()
    with private_redis() as server:
        async with serving(fake.app()) as spec, serving(fake.app()) as std:
            text = policy_yaml([spec], [std], rules=RULES)
            cfg = settings(
                tmp_path,
                text,
                redis_url=server.url,
                namespace="ns",
                admin_token=TOKEN,
                sync_interval_s=0.2,
            )
            async with gateway(cfg) as (url, services), httpx.AsyncClient() as c:
                put = await c.put(
                    url + "/admin/flags/speculation",
                    json={"enabled": False, "reason": "test"},
                    headers=AUTH,
                )
                assert put.status_code == 200
                statuses = []

                async def traffic(n: int) -> None:
                    for _ in range(n):
                        r = await c.post(url + "/v1/chat/completions", json=CHAT)
                        statuses.append((r.status_code, r.headers.get("x-speclane-pool")))

                await traffic(5)
                await asyncio.sleep(0.5)  # a sync round takes the audit's copy
                server.stop()
                await traffic(10)
                await asyncio.sleep(0.5)
                ready = (await c.get(url + "/readyz")).json()
                assert ready["ready"] is True and ready["state"]["degraded"] is True
                later = {"enabled": False, "reason": "while Redis was away", "create": True}
                put = await c.put(url + "/admin/flags/spec-late", json=later, headers=AUTH)
                assert put.status_code == 200
                while_down = (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
                server.start()  # empty: it keeps nothing on disk

                async def healed() -> bool:
                    return not services.state.status()["degraded"]

                await wait_for(healed, timeout=5)
                await traffic(5)
                audit = (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
                restored = aioredis.from_url(server.url)
                flags = await restored.hgetall("ns:flags")
                await restored.aclose()
    assert statuses and all(s == (200, "standard") for s in statuses), statuses
    assert set(flags) == {b"speculation", b"spec-late"}  # re-seeded from the replica's copy
    assert [e["flag"] for e in while_down] == ["speculation", "spec-late"]
    assert [e["flag"] for e in audit] == ["speculation", "spec-late"]  # nothing lost, in order


class FlushedMidRound(Replica):
    """A replica whose Redis is emptied (``FLUSHALL`` of ``flush``, when set) in the middle
    of its next sync round: after the round looked for the re-seed marker, before it pulls."""

    __slots__ = ("flush",)

    def __init__(self, stats: LiveStats) -> None:
        super().__init__(stats.slices)
        self.flush: str | None = None

    def take_proposals(self) -> dict[str, Any]:
        if self.flush is not None:
            client = redis.Redis.from_url(self.flush)
            client.flushall()
            client.close()
            self.flush = None
        return super().take_proposals()


async def test_a_flushall_mid_round_loses_no_flag() -> None:
    """A replica whose pull lands just after a FLUSHALL found no flags there; it took that
    for the truth, re-seeded the emptied Redis from its now empty copy, and the other
    replica then pulled the emptiness too: the kill switch was gone everywhere, for good
    (two real replicas lost it in about one FLUSHALL in ten). A pull that finds no re-seed
    marker keeps its flags, so the next round restores them."""
    compiled = load_policy(policy_yaml(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]))
    flushed = FlushedMidRound(LiveStats(lambda: compiled))
    flags = [FlagStore(compiled), FlagStore(compiled)]
    off = FlagValue(enabled=False)
    with private_redis() as server:
        a, b = (
            RedisState(
                server.url, "ns", kept, replica, lambda: compiled, Telemetry.build(), time.time
            )
            for kept, replica in zip(
                flags, (LiveStats(lambda: compiled).replica, flushed), strict=True
            )
        )
        try:
            await a.set_flag("speculation", off, "ops", time.time(), "incident")
            await b.sync()
            assert b.status()["degraded"] is False and flags[1].overrides == {"speculation": off}
            flushed.flush = server.url
            await b.sync()  # FLUSHALL lands in this round, before its pull
            await b.sync()  # the first to notice re-seeds from its own copy
            await a.sync()
            stored = aioredis.from_url(server.url)
            in_redis = await stored.hgetall("ns:flags")
            await stored.aclose()
        finally:
            await a.close()
            await b.close()
    assert flushed.flush is None  # the flush did land mid-round
    assert set(in_redis) == {b"speculation"}
    assert flags[0].overrides == flags[1].overrides == {"speculation": off}


async def test_a_redis_with_a_password(tmp_path):
    """SPECLANE_REDIS_PASSWORD authenticates against a Redis that requires one (the
    Kubernetes base runs Redis with a password from a Secret); without it the gateway serves
    on local state and says it is degraded."""
    fake = FakeUpstream()
    with private_redis(password="hunter2-but-longer") as server:
        async with serving(fake.app()) as spec, serving(fake.app()) as std:
            text = policy_yaml([spec], [std], rules=RULES)
            common = {"redis_url": server.url, "namespace": "pw", "admin_token": TOKEN}
            (tmp_path / "a").mkdir()
            (tmp_path / "b").mkdir()
            good = settings(tmp_path / "a", text, redis_password="hunter2-but-longer", **common)
            bad = settings(tmp_path / "b", text, **common)
            async with gateway(good) as (a, _), gateway(bad) as (b, _), httpx.AsyncClient() as c:
                put = await c.put(
                    a + "/admin/flags/speculation",
                    json={"enabled": False, "reason": "test"},
                    headers=AUTH,
                )
                assert put.status_code == 200
                ready_a = (await c.get(a + "/readyz")).json()
                ready_b = (await c.get(b + "/readyz")).json()
                served = await c.post(b + "/v1/chat/completions", json=CHAT)
                stored = aioredis.from_url(server.url, password="hunter2-but-longer")
                flags = await stored.hgetall("pw:flags")
                await stored.aclose()
    assert ready_a["state"]["degraded"] is False
    assert ready_b["state"]["degraded"] is True and served.status_code == 200
    assert set(flags) == {b"speculation"}
