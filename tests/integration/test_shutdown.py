"""SIGTERM to a real ``speclane serve`` with streams from ``speclane sim`` in flight: /readyz
fails first, new requests are refused cleanly, the streams finish, the process exits 0; and
a stream longer than the drain time ends with an error event, not silently."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from tests.gateways import sim_policy
from tests.servers import free_port, serving, wait_healthy

pytestmark = pytest.mark.anyio

STREAM = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "write a story"}],
    "stream": True,
    "max_tokens": 60,
}


def _serve(policy: Path, port: int, drain_s: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    env |= {
        "SPECLANE_POLICY": str(policy),
        "SPECLANE_PORT": str(port),
        "SPECLANE_LOG_LEVEL": "warning",
        "SPECLANE_DRAIN_DELAY_S": "1",
        "SPECLANE_GRACEFUL_SHUTDOWN_S": str(drain_s),
    }
    argv = [sys.executable, "-m", "gateway", "serve"]
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


async def _stream(client: httpx.AsyncClient, started: asyncio.Event) -> bytes:
    async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
        assert response.status_code == 200
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            started.set()
        return body


async def _under_load(tmp_path: Path, drain_s: float, time_scale: float, streams: int) -> Any:
    """Start the gateway, open ``streams`` streams, SIGTERM it once each has a first byte;
    what clients saw while it drained, and how it ended."""
    spec = SimConfig(mode=Mode.SPECULATIVE, time_scale=time_scale)
    std = SimConfig(mode=Mode.STANDARD, time_scale=time_scale)
    async with serving(sim_app(spec)) as spec_url, serving(sim_app(std)) as std_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(sim_policy().format(spec=spec_url, std=std_url))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = _serve(policy, port, drain_s)
        try:
            await wait_healthy(url, process)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                firsts = [asyncio.Event() for _ in range(streams)]
                flows = [asyncio.create_task(_stream(client, e)) for e in firsts]
                await asyncio.gather(*(e.wait() for e in firsts))
                process.send_signal(signal.SIGTERM)
                seen = await _while_draining(url)
                bodies = await asyncio.gather(*flows)
            _, err = await asyncio.to_thread(process.communicate, None, 60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()  # unread when the test failed: not left to the next
    return seen, bodies, process.returncode, err


async def _while_draining(url: str) -> dict[str, Any]:
    """New connections during the drain: /readyz, a new request, and once the port closes,
    that it does."""
    seen: dict[str, Any] = {}
    for _ in range(200):
        async with httpx.AsyncClient(base_url=url, timeout=5) as fresh:
            try:
                ready = await fresh.get("/readyz")
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                # refused, or taken just as the port closed and closed (or reset) unanswered
                seen["closed"] = True
                return seen
            if ready.status_code == 503 and "ready" not in seen:
                seen["ready"] = ready
                seen["new"] = await fresh.post("/v1/chat/completions", json=STREAM)
        await asyncio.sleep(0.05)
    return seen


async def test_sigterm_fails_readyz_refuses_new_requests_and_finishes_streams(tmp_path):
    seen, bodies, code, err = await _under_load(tmp_path, drain_s=30, time_scale=0.05, streams=8)
    assert seen["ready"].json() == {"ready": False, "draining": True}
    new = seen["new"]
    assert new.status_code == 503 and new.headers["retry-after"] == "1"
    assert new.headers["connection"] == "close"
    assert new.json()["error"]["code"] == "shutting_down"
    assert seen["closed"]  # then the port closed
    assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies), [b[-120:] for b in bodies]
    assert code == 0, err
    assert "Traceback" not in err


async def test_a_stream_longer_than_the_drain_time_ends_with_an_error_event(tmp_path):
    seen, bodies, code, err = await _under_load(tmp_path, drain_s=1, time_scale=2.0, streams=2)
    for body in bodies:
        assert body.startswith(b"data: ") and b"[DONE]" not in body
        assert body.endswith(b'"code":"shutting_down"}}\n\n'), body[-200:]
    assert code == 0, err
