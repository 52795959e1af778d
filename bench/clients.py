"""Which HTTP client for the upstream: httpx (its own pool), httpx over aiohttp's transport
(httpx-aiohttp), aiohttp, or speclane's own (backends/http1.py), streaming the same 20-event
SSE body from a canned upstream (raw ASGI on uvicorn with uvloop + httptools, in its own
process). CPU is this process's, per request: the client's own cost.

    .venv/bin/python bench/clients.py [--requests 3000] [--concurrency 1 64]

httpx-aiohttp is not a speclane dependency: install it in the venv to include that column
(`.venv/bin/pip install httpx-aiohttp`); without it the column is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import uvloop

from backends.http1 import Client

EVENT = (
    b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"hello"},"finish_reason":null}]}\n\n'
)
BODY = EVENT * 20 + b"data: [DONE]\n\n"
PAYLOAD = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'

SERVER = f"""
import uvicorn
BODY = {BODY!r}
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({{"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]}})
    await send({{"type": "http.response.body", "body": BODY}})
import sys
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error",
            loop="uvloop", http="httptools")
"""

Call = Callable[[], Awaitable[None]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(call: Call, requests: int, concurrency: int) -> tuple[float, float, float, float]:
    latencies: list[float] = []

    async def worker(n: int) -> None:
        for _ in range(n):
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    for _ in range(min(200, requests)):  # warm up: connections, caches
        await call()
    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)]
    n = len(latencies)
    return n / elapsed, statistics.median(latencies) * 1e3, p99 * 1e3, cpu / n * 1e6


async def clients(url: str) -> tuple[dict[str, Call], list[Callable[[], Awaitable[None]]]]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    plain = httpx.AsyncClient(limits=limits)

    async def via_httpx() -> None:
        async with plain.stream("POST", url, content=PAYLOAD) as r:
            async for _ in r.aiter_raw():
                pass

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))

    async def via_aiohttp() -> None:
        async with session.post(url, data=PAYLOAD) as r:
            async for _ in r.content.iter_any():
                pass

    own = Client(max_connections=256)

    async def via_own() -> None:
        response = await own.request(b"POST", url, {}, PAYLOAD, connect_s=2, idle_s=10)
        while await response.chunk():
            pass
        response.release()

    calls: dict[str, Call] = {
        "httpx": via_httpx,
        "aiohttp": via_aiohttp,
        "speclane (backends/http1.py)": via_own,
    }
    closers: list[Callable[[], Awaitable[None]]] = [plain.aclose, session.close, own.close]
    with contextlib.suppress(ImportError):
        from httpx_aiohttp import AiohttpTransport

        bridged = httpx.AsyncClient(
            transport=AiohttpTransport(
                client=lambda: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
            )
        )

        async def via_bridge() -> None:
            async with bridged.stream("POST", url, content=PAYLOAD) as r:
                async for _ in r.aiter_raw():
                    pass

        calls["httpx+aiohttp transport"] = via_bridge
        closers.append(bridged.aclose)
    return calls, closers


async def main(requests: int, concurrencies: list[int]) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("canned upstream did not start")
            time.sleep(0.05)
        calls, closers = await clients(url)
        print("| client | concurrency | req/s | p50 ms | p99 ms | client CPU µs/request |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for concurrency in concurrencies:
            for name, call in calls.items():
                rps, p50, p99, cpu = await measure(call, requests, concurrency)
                print(
                    f"| {name} | {concurrency} | {rps:,.0f} | {p50:.3f} | {p99:.3f} | {cpu:.0f} |"
                )
        for close in closers:
            await close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args()
    uvloop.run(main(args.requests, args.concurrency))
