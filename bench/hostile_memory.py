"""Whether the gateway gives back the memory of oversized upstream answers: ``speclane
serve`` in front of ``bench/hostile.py`` (a 200 MB whole answer, ``huge``; a stream with one
10 MB event, ``big-event``), each answer cut off at ``SPECLANE_MAX_RESPONSE_BYTES`` with a
502 or a final error event, as designed. The gateway's RSS is read before the first answer,
at its peak, right after the last one and after some idle seconds: after bounded large
answers it should be back within a few MiB of where it started.

    .venv/bin/python -m bench.hostile_memory [--answers 16] [--idle-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.procs import Supervisor, free_port

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")

POLICY = """version: 1
pools:
  huge: {{kind: standard, model: huge, endpoints: ["{hostile}/huge"], {whole}}}
  big: {{kind: standard, model: big, endpoints: ["{hostile}/big-event"]}}
ladders:
  huge: [huge]
  big: [big]
rules:
  - {{name: big, match: {{model: [big]}}, start: big}}
  - {{name: default, start: huge}}
"""
_TIMEOUTS = "timeouts: {connect_s: 1, first_byte_s: 10, idle_s: 10, total_s: 60}"


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def _peak(pid: int, stop: threading.Event) -> float:
    peak = 0.0
    while not stop.is_set():
        peak = max(peak, _rss_mib(pid))
        stop.wait(0.05)
    return peak


async def _answers(url: str, count: int) -> dict[str, int]:
    """``count`` oversized answers, four at a time, over every model route: a 200 MB
    answer (``huge``) asked for whole and streamed, and a stream with one 10 MB event
    (``big-event``); the statuses they got, by kind."""
    got: dict[str, int] = {}
    left = iter(range(count))
    kinds = [(model, stream, route) for route in ROUTES for model, stream in
             (("huge", False), ("huge", True), ("big", True))]  # fmt: skip

    async def one(c: httpx.AsyncClient) -> None:
        for i in left:
            model, stream, route = kinds[i % len(kinds)]
            body = {"model": model, "stream": stream, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hi"}], "input": "hi",
                    "prompt": "hi"}  # fmt: skip
            response = await c.post(url + route, json=body)
            key = f"{model} {'streamed' if stream else 'whole'}: {response.status_code}"
            got[key] = got.get(key, 0) + 1

    async with httpx.AsyncClient(timeout=120) as c:
        await asyncio.gather(*(one(c) for _ in range(4)))
    return got


async def run(answers: int, idle_s: float) -> str:
    with tempfile.TemporaryDirectory() as tmp, Supervisor(Path(tmp)) as sup:
        port = free_port()
        argv = [sys.executable, "-m", "bench.hostile", "--port", str(port)]
        hostile = sup.start("hostile", argv)
        hostile_url = f"http://127.0.0.1:{port}"
        sup.wait_ready(hostile, hostile_url + "/v1/models")
        policy = Path(tmp) / "policy.yaml"
        whole = _TIMEOUTS
        policy.write_text(POLICY.format(hostile=hostile_url, whole=whole))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
        env |= {"SPECLANE_POLICY": str(policy), "SPECLANE_PORT": str(port),
                "SPECLANE_LOG_LEVEL": "error", "SPECLANE_DRAIN_DELAY_S": "0"}  # fmt: skip
        gateway = sup.start("gateway", [sys.executable, "-m", "gateway", "serve"], env)
        sup.wait_ready(gateway, url + "/healthz")
        pid = gateway.popen.pid
        await _answers(url, 2)  # warm: imports, the first connections, the decoders
        before = _rss_mib(pid)
        stop = threading.Event()
        watch = asyncio.create_task(asyncio.to_thread(_peak, pid, stop))
        got = await _answers(url, answers)
        after = _rss_mib(pid)
        stop.set()
        peak = await watch
        time.sleep(idle_s)
        idle = _rss_mib(pid)
        sup.stop(gateway)
        sup.stop(hostile)
    return (
        f"{answers} oversized answers ({got}): gateway RSS {before:.1f} MiB before, "
        f"peak {peak:.1f}, {after:.1f} right after, {idle:.1f} after {idle_s:.0f} s idle "
        f"({idle - before:+.1f} MiB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=16)
    parser.add_argument("--idle-s", type=float, default=5.0)
    args = parser.parse_args()
    print(asyncio.run(run(args.answers, args.idle_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
