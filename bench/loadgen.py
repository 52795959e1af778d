"""A closed-loop HTTP load generator in its own process (bench/overhead.py runs it).

``--concurrency`` workers share one aiohttp session whose pool holds one connection per
worker; each worker sends the canned chat request, reads the whole answer, and sends the
next. After ``--warmup`` seconds it prints ``measuring``; after ``--duration`` more it
prints one JSON line: requests completed in that window, its length, latency percentiles
(request sent to last byte read) and the CPU this process used in the window.

Used when wrk is not installed; wrk costs less CPU per request, which matters on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time

import aiohttp
import canned
import orjson


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (``q`` in 0..100)."""
    if not sorted_values:
        return 0
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


class Window:
    """The measured window: latencies (ns) of requests that completed inside it."""

    def __init__(self, start_ns: int, end_ns: int) -> None:
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.latencies: list[int] = []
        self.errors = 0


async def _worker(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], w: Window
) -> None:
    clock = time.perf_counter_ns
    while True:
        sent = clock()
        if sent >= w.end_ns:
            return
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        done = clock()
        if w.start_ns <= done <= w.end_ns:
            if ok:
                w.latencies.append(done - sent)
            else:
                w.errors += 1


async def run(
    url: str, concurrency: int, duration: float, warmup: float, stream: bool, model: str
) -> None:
    body = canned.request_body(stream, model)
    headers = canned.request_headers(stream)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
    ) as session:
        now = time.perf_counter_ns()
        window = Window(now + int(warmup * 1e9), now + int((warmup + duration) * 1e9))
        workers = [
            asyncio.create_task(_worker(session, url, body, headers, window))
            for _ in range(concurrency)
        ]
        await asyncio.sleep(max(0.0, (window.start_ns - time.perf_counter_ns()) / 1e9))
        cpu = _cpu_s()
        print("measuring", flush=True)
        await asyncio.sleep(max(0.0, (window.end_ns - time.perf_counter_ns()) / 1e9))
        cpu = _cpu_s() - cpu
        await asyncio.gather(*workers)
    latencies = sorted(window.latencies)
    result = {
        "requests": len(latencies),
        "errors": window.errors,
        "window_s": (window.end_ns - window.start_ns) / 1e9,
        "p50_us": percentile(latencies, 50) / 1e3,
        "p99_us": percentile(latencies, 99) / 1e3,
        "mean_us": sum(latencies) / len(latencies) / 1e3 if latencies else 0.0,
        "max_us": latencies[-1] / 1e3 if latencies else 0.0,
        "cpu_s": cpu,
    }
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="full URL of the chat endpoint")
    parser.add_argument("--concurrency", type=int, default=1, help="workers = connections")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--model", default=canned.MODEL, help="the model the requests name")
    args = parser.parse_args()
    load = run(args.url, args.concurrency, args.duration, args.warmup, args.stream, args.model)
    try:
        import uvloop
    except ImportError:
        asyncio.run(load)
    else:
        uvloop.run(load)


if __name__ == "__main__":
    main()
