"""Startup and shutdown as named steps: a gateway's shutdown is the reverse of its startup,
every step stops even when one fails, and a step that fails to start stops those before it."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest

from gateway.lifespan import Steps, running
from gateway.server.app import build_services
from tests.gateways import policy_yaml, settings

pytestmark = pytest.mark.anyio


async def test_a_gateway_stops_in_the_reverse_order_it_started(tmp_path):
    text = policy_yaml(["http://127.0.0.1:9"], ["http://127.0.0.1:9"])
    configured = settings(tmp_path, text, request_log=tmp_path / "requests.jsonl")
    services = build_services(configured)
    async with running(services) as steps:
        assert not steps.stopped
        tasks = {t.get_name() for t in asyncio.all_tasks()}
        assert {"policy-watch", "guardrail-tick", "metrics-push", "request-log-writer"} <= tasks
    assert steps.started[:3] == ["tracing", "upstream", "shared-state"]
    assert steps.started[-1] == "sighup"
    assert {"outcome-log", "checks", "shadow", "request-log", "pool-scrape"} <= set(steps.started)
    assert steps.stopped == steps.started[::-1]
    assert not {t.get_name() for t in asyncio.all_tasks()} & set(steps.started)


async def test_every_step_stops_even_when_one_fails_to():
    stopped: list[str] = []

    def stop(name: str, fails: bool = False):
        def done() -> None:
            stopped.append(name)
            if fails:
                raise RuntimeError(f"{name} failed to stop")

        return done

    with pytest.raises(RuntimeError, match="b failed"):
        async with AsyncExitStack() as stack:
            steps = Steps(stack)
            await steps.open("a", stop("a"))
            await steps.open("b", stop("b", fails=True))
            await steps.open("c", stop("c"))
    assert stopped == ["c", "b", "a"]


async def test_a_step_that_fails_to_start_stops_those_before_it():
    stopped: list[str] = []

    async def fail() -> None:
        raise OSError("cannot start")

    with pytest.raises(OSError):
        async with AsyncExitStack() as stack:
            steps = Steps(stack)
            await steps.open("a", lambda: stopped.append("a"))
            steps.task("loop", asyncio.sleep(3600))
            await steps.open("b", lambda: stopped.append("b"), fail)
    assert stopped == ["a"] and steps.stopped == ["loop", "a"]
    assert steps.started == ["a", "loop"]
