"""`speclane serve --workers 2` for real: one process with two workers on one port sharing
the real Redis; a flag set through one worker reaches the other, /metrics counts the requests
of both whichever answers, and SIGTERM stops both gracefully, a stream in flight finished."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import FakeUpstream
from tests.gateways import policy_yaml
from tests.redis_server import namespace, require_shared_redis
from tests.servers import free_port, serving, wait_healthy

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

TOKEN = "workers"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def serve(
    policy: Path, port: int, *args: str, redis_url: str | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    env |= {
        "SPECLANE_POLICY": str(policy),
        "SPECLANE_PORT": str(port),
        "SPECLANE_NAMESPACE": namespace(),
        "SPECLANE_ADMIN_TOKEN": TOKEN,
        "SPECLANE_LOG_LEVEL": "warning",
    }
    if redis_url:
        env["SPECLANE_REDIS_URL"] = redis_url
    argv = [sys.executable, "-m", "gateway", "serve", *args]
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


async def worker_of(url: str) -> tuple[int, httpx.AsyncClient]:
    """A new connection, and the pid of the worker that took it (a connection stays with it)."""
    client = httpx.AsyncClient(base_url=url, timeout=5)
    detail = (await client.get("/readyz")).json()
    assert detail["process"]["workers"] == 2
    return detail["process"]["pid"], client


async def each_worker(url: str, pids: set[int]) -> dict[int, httpx.AsyncClient]:
    """A connection to each worker: new connections until every one of ``pids`` took one."""
    found: dict[int, httpx.AsyncClient] = {}
    for _ in range(400):
        pid, client = await worker_of(url)
        if pid in found or pid not in pids:
            await client.aclose()
        else:
            found[pid] = client
        if len(found) == len(pids):
            return found
    raise AssertionError(f"only workers {sorted(found)} of {sorted(pids)} took connections")


def requests_counted(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "speclane_requests_total"
    )


async def test_two_workers_share_flags_and_metrics_and_stop_gracefully(tmp_path: Path) -> None:
    redis_url = require_shared_redis()
    fake = FakeUpstream()
    async with serving(fake.app()) as spec, serving(fake.app()) as std:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_yaml([spec], [std]))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = serve(policy, port, "--workers", "2", redis_url=redis_url)
        try:
            await wait_healthy(url, process)
            pids = children(process.pid)
            assert len(pids) == 2, pids
            workers = await each_worker(url, pids)
            sent = await _flag_reaches_both(workers)
            sent += await _metrics_count_both(url, workers)
            await _graceful_stop(fake, process, workers, sent)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids), "a worker outlived its parent"


async def _flag_reaches_both(workers: dict[int, httpx.AsyncClient]) -> int:
    """Kill switch through one worker; both serve from standard and say so within seconds."""
    sent = 0
    for client in workers.values():
        r = await client.post("/v1/chat/completions", json=CHAT)
        sent += 1
        assert r.headers["x-speclane-pool"] == "spec"
    first = next(iter(workers.values()))
    put = await first.put(
        "/admin/flags/speculation", json={"enabled": False, "reason": "test"}, headers=AUTH
    )
    assert put.status_code == 200, put.text
    for pid, client in workers.items():
        deadline = time.monotonic() + 5
        while True:
            flags = (await client.get("/admin/flags", headers=AUTH)).json()["flags"]
            off = {f["name"]: f for f in flags}["speculation"]["enabled"] is False
            r = await client.post("/v1/chat/completions", json=CHAT)
            sent += 1
            if off and r.headers["x-speclane-pool"] == "standard":
                break
            assert time.monotonic() < deadline, f"worker {pid} never saw the kill switch"
            await asyncio.sleep(0.1)
    return sent


async def _metrics_count_both(url: str, workers: dict[int, httpx.AsyncClient]) -> int:
    """Requests spread over new connections are all counted on either worker's /metrics."""
    for _ in range(20):
        async with httpx.AsyncClient(base_url=url, timeout=5) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
    return 20


async def _graceful_stop(
    fake: FakeUpstream,
    process: subprocess.Popen[str],
    workers: dict[int, httpx.AsyncClient],
    sent: int,
) -> None:
    for client in workers.values():  # each worker pushes its records at least once a second
        deadline = time.monotonic() + 5
        while (counted := requests_counted((await client.get("/metrics")).text)) != sent:
            assert time.monotonic() < deadline, f"{counted} of {sent} requests counted"
            await asyncio.sleep(0.1)
    fake.behaviour.chunk_delay_s = 0.05  # the stream takes most of a second
    client = next(iter(workers.values()))
    body: dict[str, Any] = CHAT | {"stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        chunks = response.aiter_bytes()
        first = await anext(chunks)
        assert first.startswith(b"data: ")
        process.send_signal(signal.SIGTERM)
        rest = b"".join([c async for c in chunks])
    assert rest.endswith(b"data: [DONE]\n\n"), rest[-200:]
    for c in workers.values():
        await c.aclose()
    _, err = await asyncio.to_thread(process.communicate, None, 30)
    assert process.returncode == 0, err


async def test_several_workers_without_redis_are_refused(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]))
    process = serve(policy, free_port(), "--workers", "2")
    _, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "SPECLANE_WORKERS" in err and "SPECLANE_REDIS_URL" in err
    assert "Traceback" not in err
