"""Hostile clients against ``speclane serve`` in front of ``speclane sim``, as processes:
what each gets, how long it took, the gateway's memory, and what a normal client saw
meanwhile (the slowest of its requests during the attack, and without one).

- a valid chunked body followed by a 128 MiB trailer, sent as fast as the gateway reads;
- a valid 4 MB body in 4 million one-byte chunks (24 MB on the wire), as fast as read;
- a request followed, in the same write, by a 70 KB pipelined head;
- one address holding more connections than its share (``SPECLANE_MAX_CONNECTIONS=200``,
  so a share of 100), and a client from another address (127.0.0.2);
- one address (127.0.0.1) opening connections as fast as it can for ``--flood-s`` and never
  reading them (each sends a request, none is read, all are held to the end, at most
  ``--flood-connections``), while a client from 127.0.0.2 sends one request per new
  connection: how many of its requests were answered 200 within 5 s.

    .venv/bin/python bench/hostile_clients.py [--trailer-mib 128] [--chunks 4000000]
        [--only trailer,chunks,pipelined,peers,flood] [--flood-s 10]
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


async def _tiny_chunks(host: str, port: int, n: int) -> list[int]:
    """A chat body padded with spaces to ``n`` bytes, one byte a chunk."""
    body = CHAT[:-1] + b" " * (n - len(CHAT)) + CHAT[-1:]
    wire = bytearray(6 * n)  # "1\r\nX\r\n" per byte, laid out at C speed
    for offset, fill in enumerate((b"1", b"\r", b"\n", body, b"\r", b"\n")):
        wire[offset::6] = fill * (n // len(fill))
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(HEAD + b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        for at in range(0, len(wire), 65536):
            writer.write(wire[at : at + 65536])
            await writer.drain()
        writer.write(b"0\r\n\r\n")
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


async def _flood(url: str, seconds: float, most: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    request = HEAD + b"content-length: %d\r\n\r\n%s" % (len(CHAT), CHAT)
    held: list[asyncio.StreamWriter] = []
    end = time.monotonic() + seconds

    async def opener() -> None:
        while time.monotonic() < end and len(held) < most:
            try:
                _, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                await asyncio.sleep(0.01)
                continue
            with contextlib.suppress(OSError):
                writer.write(request)  # and never read what comes back
            held.append(writer)

    async def other() -> tuple[int, int, float]:
        answered = sent = 0
        slowest = 0.0
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each time
        async with httpx.AsyncClient(transport=transport, timeout=5, limits=limits) as c:
            await asyncio.sleep(0.5)  # the flood is on
            while time.monotonic() < end:
                start = time.perf_counter()
                try:
                    status = (await c.post(url + "/v1/chat/completions", content=CHAT)).status_code
                except httpx.HTTPError:
                    status = 0
                slowest = max(slowest, time.perf_counter() - start)
                sent, answered = sent + 1, answered + (status == 200)
                await asyncio.sleep(0.05)
        return answered, sent, slowest

    *_, (answered, sent, slowest) = await asyncio.gather(*(opener() for _ in range(32)), other())
    for writer in held:
        writer.close()
    print(
        f"one address opening {len(held)} connections in {seconds:.0f} s and reading none: "
        f"another address's requests answered {answered} of {sent} (slowest "
        f"{slowest * 1000:.0f} ms)"
    )


async def _peers(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(110):
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
        f"one address holding 110 connections (share 100 of 200): {refused} refused with 503; "
        f"its next request {mine.status_code} ({mine.json().get('error', {}).get('code')}), "
        f"another address's {theirs.status_code}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trailer-mib", type=int, default=128, help="trailer size")
    parser.add_argument("--chunks", type=int, default=4_000_000, help="one-byte chunks")
    parser.add_argument("--only", default="trailer,chunks,pipelined,peers,flood", help="attacks")
    parser.add_argument("--flood-s", type=float, default=10.0, help="how long the flood lasts")
    parser.add_argument(
        "--flood-connections", type=int, default=12000, help="most connections the flood opens"
    )
    parser.add_argument("--only-flood", action="store_true", help="the flood alone")
    args = parser.parse_args()
    mib, only = args.trailer_mib, set(args.only.split(","))
    if args.only_flood:
        only = {"flood"}
    sim_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(POLICY.format(sim=f"http://127.0.0.1:{sim_port}"))
        exe = str(Path(sys.executable).parent / "speclane")
        env = {**os.environ, "SPECLANE_MAX_CONNECTIONS": "200", "SPECLANE_LOG_LEVEL": "error"}
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
            if "trailer" in only:
                trailer = functools.partial(_trailer, mib=mib)
                asyncio.run(_attack(f"{mib} MiB chunked trailer", url, gateway.pid, trailer))
            if "chunks" in only:
                tiny = functools.partial(_tiny_chunks, n=args.chunks)
                asyncio.run(_attack(f"{args.chunks} one-byte chunks", url, gateway.pid, tiny))
            if "pipelined" in only:
                asyncio.run(_attack("70 KB pipelined head", url, gateway.pid, _pipelined))
            if "peers" in only:
                asyncio.run(_peers(url))
            if "flood" in only:
                asyncio.run(_flood(url, args.flood_s, args.flood_connections))
        finally:
            for child in (gateway, sim):
                child.terminate()
                child.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
