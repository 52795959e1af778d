"""Upstreams that misbehave, through a real gateway on loopback: every endpoint answering
503 under concurrency, answers that trickle past the pool's ``total_s``, answers larger than
``max_response_bytes``, a 200 that is not JSON, and a 429 with ``Retry-After``. The
misbehaving upstream is ``bench/hostile.py``, served by uvicorn beside a real simulator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.server import create_app as sim_app
from tests.gateways import gateway, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def policy(spec: Sequence[str], standard: Sequence[str], *, whole: bool, total_s: float) -> str:
    timeouts = f"{{connect_s: 1, first_byte_s: 2, idle_s: 2, total_s: {total_s}}}"
    return f"""
version: 1
pools:
  spec:
    kind: speculative
    model: {MODEL}
    num_speculative_tokens: 4
    endpoints: [{", ".join(spec)}]
    timeouts: {timeouts}
    passthrough_non_streaming: {str(whole).lower()}
  standard:
    kind: standard
    model: {MODEL}
    endpoints: [{", ".join(standard)}]
    timeouts: {timeouts}
    passthrough_non_streaming: {str(whole).lower()}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""


@asynccontextmanager
async def stack(
    tmp: Path,
    spec: Sequence[Any],
    standard: Sequence[Any],
    *,
    whole: bool = True,
    total_s: float = 30.0,
    **overrides: Any,
) -> AsyncIterator[tuple[str, Any]]:
    """A gateway in front of one server per ASGI app; yields its URL and services."""
    async with AsyncExitStack() as servers:
        spec_urls = [await servers.enter_async_context(serving(app)) for app in spec]
        std_urls = [await servers.enter_async_context(serving(app)) for app in standard]
        text = policy(spec_urls, std_urls, whole=whole, total_s=total_s)
        async with gateway(settings(tmp, text, **overrides)) as (url, services):
            yield url, services


def sim(seed: int, mode: Mode = Mode.STANDARD, **faults: Any) -> Any:
    return sim_app(SimConfig(mode=mode, seed=seed, zero_latency=True, faults=Faults(**faults)))


def errors_counted(metrics: str, status: int) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("speclane_request_errors_total{") and f'status="{status}"' in line
    )


@pytest.mark.parametrize("whole", [True, False], ids=["passed-through", "assembled"])
async def test_every_endpoint_answering_503_gives_clean_503s_never_500(tmp_path, whole):
    """Endpoints ejected while other requests await whole answers from them: those give up
    and go on, and no request meets the ejection half-way (no 500)."""
    spec = [sim(1, Mode.SPECULATIVE, overloaded=True), sim(2, Mode.SPECULATIVE, overloaded=True)]
    standard = [sim(3, overloaded=True), sim(4, overloaded=True)]
    async with (
        stack(tmp_path, spec, standard, whole=whole) as (url, _),
        httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c,
    ):

        async def one(i: int) -> httpx.Response:
            return await c.post(url + "/v1/chat/completions", json={**CHAT, "stream": i % 3 == 0})

        answers: list[httpx.Response] = []
        for _ in range(6):
            answers += await asyncio.gather(*(one(i) for i in range(64)))
        metrics = (await c.get(url + "/metrics")).text
    assert {r.status_code for r in answers} == {503}
    assert all(r.headers.get("retry-after") for r in answers)
    assert all(r.json()["error"]["code"] == "no_healthy_upstream" for r in answers)
    assert errors_counted(metrics, 500) == 0


async def test_an_unexpected_error_is_a_counted_500_without_detail(tmp_path, monkeypatch):
    """A bug on the request path (here, one planted in the pools) answers 500 in OpenAI's
    shape with no traceback, and counts in ``speclane_request_errors_total``."""
    async with stack(tmp_path, [sim(1, Mode.SPECULATIVE)], [sim(2)]) as (url, services):

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a planted bug")

        monkeypatch.setattr(services.pools, "open", broken)
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(url + "/v1/chat/completions", json={**CHAT, "stream": True})
            metrics = (await c.get(url + "/metrics")).text
    assert r.status_code == 500
    assert r.json()["error"] == {
        "message": "internal error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert "planted" not in r.text
    assert errors_counted(metrics, 500) == 1
