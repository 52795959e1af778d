"""What real vLLM's API server spends on one streamed output (one request, one engine step),
the figure behind ``speclane sim --stream-cost-us``.

    .venv/bin/speclane local-vllm up      # or any vLLM CPU venv and a model directory
    .venv/bin/python bench/vllm_stream_cost.py --python VENV/bin/python --model DIR \\
        [--clients 8] [--rounds 5]

One vLLM OpenAI server (standard decoding, ``--enforce-eager``, its engine pinned to
``--core``) serves rounds of ``--clients`` concurrent chat streams of ``--long`` tokens and
of ``--short`` tokens (``ignore_eos``), alternately. The API server process is the one
started here; vLLM V1 runs the engine core in a child process, so the parent's own CPU time
(``/proc/PID/stat``) is the request path: HTTP, the output processor (detokenizing,
building each request's output, the per-request collector) and the OpenAI chunk building,
JSON and SSE. Its CPU per round, long minus short over content chunks long minus short, is
the marginal cost of one more streamed output, with per-request costs (parsing, the chat
template, tokenizing the prompt) cancelled. Chunks equal to tokens show that no outputs
merged, i.e. each chunk is one engine step's output for one request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from procs import Supervisor, cpu_snapshot, free_port

from gateway.cli.localvllm.install import default_cache, python_of, venv_path

ENTRY = "vllm.entrypoints.openai.api_server"
PROMPT = "Write a long story about a lighthouse keeper and the sea."


async def one(client: httpx.AsyncClient, url: str, tokens: int) -> tuple[int, int]:
    """Stream one answer: its content chunks and completion tokens."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = used = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                used = int(event["usage"]["completion_tokens"])
            if any("content" in (c.get("delta") or {}) for c in event["choices"]):
                chunks += 1
    return chunks, used


async def batch(url: str, clients: int, tokens: int) -> tuple[int, int]:
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        done = await asyncio.gather(*(one(client, url, tokens) for _ in range(clients)))
    return sum(c for c, _ in done), sum(t for _, t in done)


def measured(pid: int, url: str, clients: int, tokens: int) -> tuple[dict[str, float], int, int]:
    """One round: the API server's CPU and the wall time, the chunks and tokens streamed."""
    before, started = cpu_snapshot().own[pid], time.monotonic()
    chunks, used = asyncio.run(batch(url, clients, tokens))
    after = cpu_snapshot().own[pid]
    return {"cpu_s": after - before, "wall_s": time.monotonic() - started}, chunks, used


def run(args: argparse.Namespace, pid: int, url: str) -> dict[str, Any]:
    measured(pid, url, args.clients, args.short)  # warm-up: first requests compile paths
    rounds = []
    for _ in range(args.rounds):
        long, long_chunks, long_tokens = measured(pid, url, args.clients, args.long)
        short, short_chunks, short_tokens = measured(pid, url, args.clients, args.short)
        extra = long_chunks - short_chunks
        rounds.append(
            {
                "per_chunk_us": (long["cpu_s"] - short["cpu_s"]) / extra * 1e6,
                "chunks": [long_chunks, short_chunks],
                "tokens": [long_tokens, short_tokens],
                "cpu_s": [round(long["cpu_s"], 3), round(short["cpu_s"], 3)],
                "wall_s": [round(long["wall_s"], 2), round(short["wall_s"], 2)],
            }
        )
        print(json.dumps(rounds[-1]), flush=True)
    per_chunk = [r["per_chunk_us"] for r in rounds]
    return {"median_us": statistics.median(per_chunk), "rounds": rounds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", type=Path, default=python_of(venv_path(default_cache())))
    parser.add_argument("--model", type=Path, required=True, help="a model directory")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--long", type=int, default=320)
    parser.add_argument("--short", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--core", type=int, default=0, help="the engine's CPU core")
    args = parser.parse_args()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(args.core),
    }
    port = free_port()
    argv = [str(args.python), "-m", ENTRY, "--model", str(args.model)]
    argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--enforce-eager", "--max-model-len", "2048"]
    with tempfile.TemporaryDirectory() as tmp, Supervisor(Path(tmp)) as sup:
        server = sup.start("vllm", argv, env)
        url = f"http://127.0.0.1:{port}"
        sup.wait_ready(server, url + "/health", timeout_s=600)
        result = run(args, server.popen.pid, url)
    print(f"API server CPU per streamed output: {result['median_us']:.0f} us (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
