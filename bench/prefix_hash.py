"""What hashing a prompt's prefix costs per request (part of step 3, classification).

    .venv/bin/python bench/prefix_hash.py [--iterations 200] [--block-bytes 256]

Times ``segments`` + ``prints`` (``gateway/prompt/``: the canonical rendering, the block
chain, the conversation's opening and the template fingerprint) on Claude-Code-like
Messages requests of about 8k and 80k tokens (a system prompt with the billing line, tool
calls and results, a growing history), and ``classify`` as a whole beside it.
``--block-bytes`` reruns the chain with another block size (16 tokens is ~64 bytes), to
show what the block size costs. Each call is timed alone with ``time.perf_counter_ns``;
the report gives the median and the 99th percentile in microseconds. Last, the memory a
replica's prefix map (``gateway/state/prefixes.py``) takes when full at its default bound
of 100,000 entries, measured with ``tracemalloc``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from gateway import schema, tokens
from gateway.classify import Defaults, classify
from gateway.prompt import prints as prints_module
from gateway.prompt.prints import prints
from gateway.prompt.render import segments
from gateway.state.prefixes import MemoryPrefixes

BILLING = "x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli; cch=e5f1c;"
PROSE = "The function reads the configuration file and returns the parsed settings. "
CODE = "def load(path):\n    with open(path) as f:\n        return json.load(f)\n"


def conversation(target_tokens: int) -> dict[str, Any]:
    """A Messages request of about ``target_tokens`` prompt tokens."""
    system = [{"type": "text", "text": BILLING}, {"type": "text", "text": PROSE * 60}]
    said: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test"}]
    turn = 0
    body = {"model": "m", "max_tokens": 100, "system": system, "messages": said}
    while _tokens(body) < target_tokens:
        turn += 1
        call = {"type": "tool_use", "id": f"toolu_{turn}", "name": "read", "input": {"n": turn}}
        said.append(
            {"role": "assistant", "content": [{"type": "text", "text": PROSE}, call]},
        )
        result = {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": CODE * 20}
        said.append({"role": "user", "content": [result]})
    return body


def _tokens(body: dict[str, Any]) -> int:
    return tokens.estimate([orjson.dumps(body).decode()])


def timed(call: Callable[[], object], iterations: int) -> tuple[float, float]:
    samples = []
    gc.disable()
    try:
        for _ in range(iterations):
            start = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - start)
    finally:
        gc.enable()
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--block-bytes", type=int, default=prints_module.BLOCK_BYTES)
    args = parser.parse_args()
    prints_module.BLOCK_BYTES = args.block_bytes
    print(f"block {args.block_bytes} bytes, at most {prints_module.MAX_BLOCKS} blocks")
    print("| prompt | bytes | blocks | render+hash p50 / p99 µs | classify p50 / p99 µs |")
    print("| --- | --- | --- | --- | --- |")
    for target in (8_000, 80_000):
        body = conversation(target)
        request, _ = schema.parse(orjson.dumps(body), "messages")
        hashed = prints(segments(request))
        mid, p99 = timed(lambda r=request: prints(segments(r)), args.iterations)  # type: ignore[misc]
        whole = timed(
            lambda r=request: classify(r, "/v1/messages", {}, "r", Defaults()),  # type: ignore[misc]
            args.iterations,
        )
        print(
            f"| ~{target // 1000}k tokens | {hashed.size:,} | {len(hashed.chain)} "
            f"| {mid:.0f} / {p99:.0f} | {whole[0]:.0f} / {whole[1]:.0f} |"
        )
    print(f"prefix map, 100,000 entries: {map_memory():.1f} MiB")


def map_memory(entries: int = 100_000) -> float:
    """MiB a full prefix map of ``entries`` takes (four endpoints, 128-block prompts)."""
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    tracemalloc.start()
    try:
        prefixes = MemoryPrefixes(max_entries=entries)
        for n in range(entries // 17 + 1):  # 16 checkpoints and an opening each
            chain = tuple(i << 32 | random.getrandbits(32) for i in range(128))
            prefixes.keep(chain, n, urls[n % 4])
        return tracemalloc.get_traced_memory()[0] / 2**20
    finally:
        tracemalloc.stop()


if __name__ == "__main__":
    main()
