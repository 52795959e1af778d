"""Upstreams that misbehave, through a real gateway on loopback: every endpoint answering
503 under concurrency, answers that trickle past the pool's ``total_s``, answers larger than
``max_response_bytes``, a 200 that is not JSON, and a 429 with ``Retry-After``. The
misbehaving upstream is ``bench/hostile.py``, served by uvicorn beside a real simulator."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import bench.hostile as hostile_module
from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.server import create_app as sim_app
from bench.hostile import RETRY_AFTER_S, Hostile, serve
from tests.gateways import gateway, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
CHAT_ROUTE = "/v1/chat/completions"
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
    """A gateway in front of one server per ASGI app (or the endpoint a URL names); yields
    its URL and services."""
    async with AsyncExitStack() as servers:

        async def url(app: Any) -> str:
            return app if isinstance(app, str) else await servers.enter_async_context(serving(app))

        spec_urls = [await url(app) for app in spec]
        std_urls = [await url(app) for app in standard]
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
        httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c,
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


@asynccontextmanager
async def hostile() -> AsyncIterator[tuple[str, Hostile]]:
    """``bench/hostile.py`` on loopback: its base URL (a mode is its first path segment)."""
    server, state = await serve()
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", state
        server.close()


async def ask(url: str, *, stream: bool) -> tuple[httpx.Response, bytes]:
    async with (
        httpx.AsyncClient(timeout=60) as c,
        c.stream("POST", url + "/v1/chat/completions", json={**CHAT, "stream": stream}) as r,
    ):
        return r, b"".join([chunk async for chunk in r.aiter_bytes()])


def last_event(body: bytes) -> dict[str, Any]:
    last = body.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: {"), last[:200]
    return dict(json.loads(last[6:]))


@pytest.mark.parametrize("mode", ["html", "sse-text", "huge"])
@pytest.mark.parametrize("whole", [True, False], ids=["passed-through", "assembled"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_answer_that_is_no_answer_fails_over_before_any_byte(
    tmp_path, mode, whole, stream
):
    """A 200 carrying HTML, SSE text or more than ``max_response_bytes``: the client gets
    the next rung's answer, not the upstream's page as a success."""
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/{mode}"], [sim(2)], whole=whole, max_response_bytes=1 << 20) as (
            url,
            _,
        ),
    ):
        r, body = await ask(url, stream=stream)
    assert r.status_code == 200
    assert r.headers["x-speclane-pool"] == "standard"
    if stream:
        assert body.endswith(b"data: [DONE]\n\n")
    else:
        assert json.loads(body)["choices"][0]["message"]["content"]


@pytest.mark.parametrize("mode", ["html", "sse-text", "huge"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_no_answer_anywhere_is_a_502(tmp_path, mode, stream):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/{mode}"], [f"{bad}/{mode}"], max_response_bytes=1 << 20) as (
            url,
            _,
        ),
    ):
        r, body = await ask(url, stream=stream)
    assert r.status_code == 502
    assert json.loads(body)["error"]["code"] == "upstream_bad_answer"


@pytest.mark.parametrize(
    ("whole", "stream", "route"),
    [(True, False, CHAT_ROUTE), (False, False, CHAT_ROUTE), (False, True, CHAT_ROUTE),
     (False, True, "/v1/messages")],
    ids=["passed-through", "assembled", "streamed", "messages-streamed"],
)  # fmt: skip
async def test_an_oversized_answer_leaves_nothing_behind(tmp_path, whole, stream, route):
    """What was read of an answer given up at ``max_response_bytes`` is freed with the
    request, not kept by a reference cycle (an error's traceback holding the frames that
    hold it) until a rare full collection: with the collector off, the memory Python holds
    after three such answers is what it held before them (each read 2 x 4 MiB)."""
    limit = 4 << 20
    body = {**CHAT, "stream": stream, "max_tokens": 8}
    async with (
        hostile() as (bad, _),
        stack(
            tmp_path, [f"{bad}/huge"], [f"{bad}/huge"], whole=whole, max_response_bytes=limit
        ) as (url, _),
        httpx.AsyncClient(timeout=60) as c,
    ):
        assert (await c.post(url + route, json=body)).status_code == 502  # warm
        gc.collect()
        gc.disable()
        tracemalloc.start(16)
        try:
            before = _gateways_memory()
            for _ in range(3):
                assert (await c.post(url + route, json=body)).status_code == 502
            await asyncio.sleep(0.1)  # the closed connections' callbacks
            grown = _gateways_memory() - before
        finally:
            tracemalloc.stop()
            gc.enable()
    assert grown < limit / 2, f"{grown / (1 << 20):.1f} MiB still held"


def _gateways_memory() -> int:
    """Bytes Python holds now, but for the hostile server's (it runs in this process)."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, hostile_module.__file__, all_frames=True)]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def test_an_event_over_the_bound_mid_stream_ends_it_with_an_error_event(tmp_path):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/big-event"], [sim(2)], max_response_bytes=1 << 20) as (url, _),
    ):
        r, body = await ask(url, stream=True)
    assert r.status_code == 200
    assert last_event(body)["error"]["code"] == "upstream_stream_broken"
    assert len(body) < 1 << 20


@pytest.mark.parametrize(
    ("whole", "stream"),
    [(True, False), (False, False), (False, True)],
    ids=["passed-through", "assembled", "streamed"],
)
async def test_an_answer_that_never_ends_ends_at_the_pools_total_s(tmp_path, whole, stream):
    """Tried once, not once per retry: ``total_s`` bounds the request, all tries included.
    A stream ends with an error event, never a truncated stream that looks complete."""
    async with (
        hostile() as (bad, state),
        stack(tmp_path, [f"{bad}/endless"], [sim(2)], whole=whole, total_s=1.5) as (url, _),
    ):
        r, body = await ask(url, stream=stream)
    assert state.requests == {"endless": 1}
    if stream:
        assert r.status_code == 200
        assert last_event(body)["error"]["code"] == "upstream_timeout"
    else:
        assert r.status_code == 504
        assert json.loads(body)["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize("whole", [True, False], ids=["passed-through", "assembled"])
async def test_a_body_that_stalls_under_a_long_content_length_is_tried_elsewhere(tmp_path, whole):
    async with (
        hostile() as (bad, state),
        stack(tmp_path, [f"{bad}/short"], [sim(2)], whole=whole) as (url, _),
    ):
        r, body = await ask(url, stream=False)
    assert r.status_code == 200
    assert r.headers["x-speclane-pool"] == "standard"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_http10_answer_without_a_length_is_served(tmp_path, stream):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/http10"], [sim(2)]) as (url, _),
    ):
        r, body = await ask(url, stream=stream)
    assert r.status_code == 200
    assert r.headers["x-speclane-pool"] == "spec"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_upstream_429_reaches_the_client_with_its_retry_after(tmp_path, stream):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/429"], [f"{bad}/429"]) as (url, _),
    ):
        r, body = await ask(url, stream=stream)
    assert r.status_code == 429
    assert r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert json.loads(body)["error"]["code"] == "upstream_rate_limited"


async def test_a_503_keeps_the_largest_retry_after_an_upstream_sent(tmp_path):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/429"], [sim(2, overloaded=True)]) as (url, _),
    ):
        r, body = await ask(url, stream=False)
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= RETRY_AFTER_S


async def relay(url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as c:
        return await c.request(method, url + path, **kwargs)


TOKENIZE = {"model": MODEL, "prompt": "Say hello."}
COUNT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}]}


async def test_an_html_page_on_a_json_route_fails_over_like_chat(tmp_path):
    # the passthrough pool (the ladder's last rung, standard) answers HTML 200: the next
    # rung serves, as a chat request's would be
    async with (
        hostile() as (bad, state),
        stack(tmp_path, [sim(2)], [f"{bad}/html"]) as (url, _),
    ):
        tokenized = await relay(url, "POST", "/tokenize", json=TOKENIZE)
        counted = await relay(url, "POST", "/v1/messages/count_tokens", json=COUNT)
    assert state.requests["html"] == 2
    assert tokenized.status_code == 200 and tokenized.json()["count"] > 0
    assert tokenized.headers["x-speclane-pool"] == "spec"
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


async def test_an_html_page_on_every_endpoint_is_a_502_in_the_routes_shape(tmp_path):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/html"], [f"{bad}/html"]) as (url, services),
    ):
        tokenized = await relay(url, "POST", "/tokenize", json=TOKENIZE)
        counted = await relay(url, "POST", "/v1/messages/count_tokens", json=COUNT)
        card = await relay(url, "GET", f"/v1/models/{MODEL}")
        await services.pins.remember("anonymous", "resp_1", f"{bad}/html")
        stored = await relay(url, "GET", "/v1/responses/resp_1")
        form = {"model": (None, MODEL), "file": ("a.wav", b"RIFF....", "audio/wav")}
        audio = await relay(url, "POST", "/v1/audio/transcriptions", files=form)
    for answer in (tokenized, card, stored):
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "upstream_bad_answer"
    assert counted.status_code == 502
    assert counted.json()["type"] == "error"  # Anthropic's shape on its route
    # audio answers text, SRT or VTT as well as JSON: passed on as it came
    assert audio.status_code == 200 and audio.headers["content-type"].startswith("text/html")
