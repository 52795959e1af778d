"""What checking a stream's first events costs, against what relaying the stream costs.

Since an error event that opens a stream is the upstream's answer, and one that is not a
JSON object no answer at all, ``backends/upstream.py`` parses the first event (and, after a
chat role chunk, the next) before the stream counts as open. This measures that check on
real vLLM 0.32 streams (``tests/vllm_fixtures``), side by side with the parse of every event
the relay does anyway, interleaved in one process; the figure that matters is the ratio, not
the microseconds.

    .venv/bin/python bench/first_event.py
"""

from __future__ import annotations

import statistics
import timeit
from pathlib import Path

import orjson

from backends.upstream import _check_event, _is_prelude

ROOT = Path(__file__).resolve().parent.parent

FIXTURES = ROOT / "tests" / "vllm_fixtures"
STREAMS = ("chat-stream-include-usage.sse", "completions-stream-include-usage.sse")


def events(name: str) -> list[bytes]:
    raw = (FIXTURES / name).read_bytes()
    return [b[6:] for b in raw.split(b"\n\n") if b.startswith(b"data: ") and b[6:] != b"[DONE]"]


def check(stream: list[bytes]) -> None:
    _check_event(stream[0])
    if _is_prelude(stream[0]):
        _check_event(stream[1])


def relay(stream: list[bytes]) -> None:
    for data in stream:
        orjson.loads(data)


def main() -> None:
    rounds, number = 15, 2000
    print(f"{'stream':<40} {'events':>6} {'relay µs':>9} {'check µs':>9} {'check/relay':>11}")
    for name in STREAMS:
        stream = events(name)
        relayed, checked = [], []
        for _ in range(rounds):  # interleaved, so load from elsewhere hits both alike
            relayed.append(timeit.timeit(lambda s=stream: relay(s), number=number) / number)
            checked.append(timeit.timeit(lambda s=stream: check(s), number=number) / number)
        r, c = statistics.median(relayed) * 1e6, statistics.median(checked) * 1e6
        print(f"{name:<40} {len(stream):>6} {r:>9.2f} {c:>9.2f} {c / r:>10.1%}")


if __name__ == "__main__":
    main()
