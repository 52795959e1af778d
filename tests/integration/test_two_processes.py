"""Two real `speclane serve` processes sharing the real Redis: the kill switch set on one
reaches the other within a second, and both agree on the audit log."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes import FakeUpstream
from tests.gateways import policy_yaml
from tests.redis_server import namespace, require_shared_redis
from tests.servers import free_port, serving, wait_healthy

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

TOKEN = "two-processes"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def start(policy: Path, port: int, redis_url: str, ns: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SPECLANE_POLICY": str(policy),
        "SPECLANE_PORT": str(port),
        "SPECLANE_REDIS_URL": redis_url,
        "SPECLANE_NAMESPACE": ns,
        "SPECLANE_ADMIN_TOKEN": TOKEN,
        "SPECLANE_LOG_LEVEL": "warning",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve"], env=env, stderr=subprocess.PIPE
    )


async def test_kill_switch_reaches_the_other_process_within_a_second(tmp_path):
    redis_url = require_shared_redis()
    ns = namespace()
    fake = FakeUpstream()
    async with serving(fake.app()) as spec, serving(fake.app()) as std:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_yaml([spec], [std]))
        ports = free_port(), free_port()
        processes = [start(policy, port, redis_url, ns) for port in ports]
        a, b = (f"http://127.0.0.1:{port}" for port in ports)
        try:
            async with httpx.AsyncClient(timeout=5) as c:
                await wait_healthy(a, processes[0])
                await wait_healthy(b, processes[1])
                before = await c.post(b + "/v1/chat/completions", json=CHAT)
                assert before.headers["x-speclane-pool"] == "spec"
                put = await c.put(
                    a + "/admin/flags/speculation",
                    json={"enabled": False, "reason": "test"},
                    headers=AUTH,
                )
                assert put.status_code == 200
                set_at = time.monotonic()
                while True:
                    r = await c.post(b + "/v1/chat/completions", json=CHAT)
                    if r.headers["x-speclane-pool"] == "standard":
                        took = time.monotonic() - set_at
                        break
                    assert time.monotonic() - set_at < 3, "the flag never reached replica b"
                    await asyncio.sleep(0.02)
                audits = [
                    (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
                    for url in (a, b)
                ]
        finally:
            for process in processes:
                process.terminate()
            errors = [process.communicate(timeout=10)[1].decode() for process in processes]
    assert took < 1.0
    assert audits[0] == audits[1] and [e["flag"] for e in audits[0]] == ["speculation"]
    # a graceful stop on SIGTERM (drain, then the streams in flight finish) exits 0
    assert [p.returncode for p in processes] == [0, 0]
    assert not any("Traceback" in e for e in errors), errors
