"""Hostile clients against ``speclane serve`` in front of ``speclane sim``, as processes:
what each gets, how long it took, the gateway's memory, and what a normal client saw
meanwhile (the slowest of its requests during the attack, and without one).

- a valid chunked body followed by a 128 MiB trailer, sent as fast as the gateway reads;
- a request followed, in the same write, by a 70 KB pipelined head;
- one address holding more connections than its share (``SPECLANE_MAX_CONNECTIONS=64``,
  so a share of 32), and a client from another address (127.0.0.2).

    .venv/bin/python bench/hostile_clients.py [--trailer-mib 128]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from procs import free_port

CHAT = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
POLICY = """version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{sim}"]}}
  standard: {{kind: standard, model: tiny, endpoints: ["{sim}"]}}
ladder: [spec, standard]
rules:
  - {{name: default, start: spec}}
"""


def _rss_mib(pid: int) -> tuple[float, float]:
    """The process's resident memory now and at its peak, in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def _answer(reader: asyncio.StreamReader) -> list[int]:
    """The statuses of every answer until the gateway closes the connection."""
    raw = await asyncio.wait_for(reader.read(), 120)
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]


async def _normal(url: str, until: asyncio.Event) -> tuple[float, int, int]:
    """A normal client's requests, one after another until ``until``: the slowest, how many
    were sent and how many were not answered 200."""
    slowest, sent, failed = 0.0, 0, 0
    async with httpx.AsyncClient(timeout=60) as c:
        while not until.is_set():
            start = time.perf_counter()
            try:
                status = (await c.post(url + "/v1/chat/completions", content=CHAT)).status_code
            except httpx.HTTPError:
                status = 0
            slowest = max(slowest, time.perf_counter() - start)
            sent, failed = sent + 1, failed + (status != 200)
    return slowest, sent, failed


async def _trailer(host: str, port: int, mib: int) -> list[int]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        HEAD + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nx-t: " % (len(CHAT), CHAT)
    )
    with contextlib.suppress(ConnectionError):
        for _ in range(mib * 16):
            writer.write(b"t" * 65536)
            await writer.drain()
    statuses = await _answer(reader)
    writer.close()
    return statuses


async def _pipelined(host: str, port: int) -> list[int]:
    reader, writer = await asyncio.open_connection(host, port)
    first = HEAD + b"content-length: %d\r\n\r\n%s" % (len(CHAT), CHAT)
    writer.write(first + HEAD + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n")
    statuses = await _answer(reader)
    writer.close()
    return statuses


async def _attack(name: str, url: str, pid: int, attack: object) -> None:
    host, port = url.removeprefix("http://").split(":")
    async with httpx.AsyncClient() as c:  # warm: the first request's set-up is no one's
        await c.post(url + "/v1/chat/completions", content=CHAT)
    done = asyncio.Event()
    quiet = asyncio.create_task(_normal(url, done))
    await asyncio.sleep(1)
    done.set()
    baseline = (await quiet)[0]
    done = asyncio.Event()
    normal = asyncio.create_task(_normal(url, done))
    before = _rss_mib(pid)[0]
    start = time.perf_counter()
    statuses = await attack(host, int(port))  # type: ignore[operator]
    took = time.perf_counter() - start
    done.set()
    slowest, sent, failed = await normal
    now, peak = _rss_mib(pid)
    print(
        f"{name}: {statuses} in {took:.2f} s; gateway RSS {before:.0f} -> {now:.0f} MiB "
        f"(peak {peak:.0f}); a normal client's slowest request {slowest * 1000:.0f} ms "
        f"during it ({failed} of {sent} not 200), {baseline * 1000:.0f} ms without"
    )


async def _peers(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(40):
        held.append(await asyncio.open_connection(host, int(port)))
        await asyncio.sleep(0.01)
    other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(timeout=10) as c, httpx.AsyncClient(transport=other) as d:
        mine = await c.post(url + "/v1/chat/completions", content=CHAT)
        theirs = await d.post(url + "/v1/chat/completions", content=CHAT)
    refused = 0
    for reader, writer in held:
        with contextlib.suppress(TimeoutError):
            refused += b"503" in await asyncio.wait_for(reader.read(64), 0.5)
        writer.close()
    print(
        f"one address holding 40 connections (share 32 of 64): {refused} refused with 503; "
        f"its next request {mine.status_code} ({mine.json().get('error', {}).get('code')}), "
        f"another address's {theirs.status_code}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trailer-mib", type=int, default=128, help="trailer size")
    mib = parser.parse_args().trailer_mib
    sim_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(POLICY.format(sim=f"http://127.0.0.1:{sim_port}"))
        exe = str(Path(sys.executable).parent / "speclane")
        env = {**os.environ, "SPECLANE_MAX_CONNECTIONS": "64", "SPECLANE_LOG_LEVEL": "error"}
        sim = subprocess.Popen(
            [exe, "sim", "--port", str(sim_port), "--model", "tiny", "--zero-latency"]
        )
        gateway = subprocess.Popen(
            [exe, "serve", "--policy", str(policy), "--port", str(port)], env=env
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/readyz").status_code == 200:
                        break
                time.sleep(0.1)
            trailer = functools.partial(_trailer, mib=mib)
            asyncio.run(_attack(f"{mib} MiB chunked trailer", url, gateway.pid, trailer))
            asyncio.run(_attack("70 KB pipelined head", url, gateway.pid, _pipelined))
            asyncio.run(_peers(url))
        finally:
            for child in (gateway, sim):
                child.terminate()
                child.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
