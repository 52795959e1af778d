"""Where one speclane process spends its CPU on one path, by py-spy (a dev dependency).

The canned nginx upstream of bench/canned.py, one ``speclane serve`` (JSON streamed upstream
and assembled, by default), wrk holding --concurrency requests in flight, and py-spy sampling
the gateway for --duration seconds meanwhile. Prints the top functions by inclusive share
(time in them and what they call) and by own share, with the request rate it ran at.

    .venv/bin/python bench/hotspots.py                          # assembled JSON, c=64, 10 s
    .venv/bin/python bench/hotspots.py --path passthrough      # or stream
    .venv/bin/python bench/hotspots.py --speclane /other/checkout/.venv/bin/speclane

Samples are wall-clock while the thread runs or waits for the CPU; on a machine shared with
other work, shares are steadier than the rate.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loaders import Wrk
from overhead import SKIPPED, start_nginx
from procs import Supervisor, signals_interrupt
from proxies import CHAT, speclane_bin, start_speclane

_LINE = re.compile(r":\d+\)$")


def _frame(frame: str) -> str:
    """``function (file)`` as py-spy names it, without the line number."""
    return _LINE.sub(")", frame)


def top(raw: Path, count: int) -> tuple[int, list[tuple[float, str]], list[tuple[float, str]]]:
    """py-spy's raw (collapsed) stacks as the ``count`` biggest inclusive and own shares."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        samples = int(n)
        total += samples
        frames = [_frame(frame) for frame in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] += samples
        own[frames[-1]] += samples
    share = 100.0 / max(total, 1)
    root = max(inclusive.values(), default=0)  # the frames above the event loop: every sample
    below = collections.Counter({f: n for f, n in inclusive.items() if n < root})
    return (
        total,
        [(n * share, f) for f, n in below.most_common(count)],
        [(n * share, f) for f, n in own.most_common(count)],
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/hotspots.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--path", choices=("assembled", "passthrough", "stream"), default="assembled"
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=int, default=10, help="seconds sampled (default 10)")
    parser.add_argument("--top", type=int, default=25, help="entries per list (default 25)")
    parser.add_argument("--speclane", default=None, help="the speclane executable to profile")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw stacks here")
    args = parser.parse_args()
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    wrk = Wrk.find()
    if nginx is None or wrk is None or not Path(spy).exists():
        print("SKIPPED: needs nginx, wrk (apt-get install nginx-light wrk) and py-spy (pip)")
        return SKIPPED
    tmp = Path(tempfile.mkdtemp(prefix="speclane-profile-"))
    raw = args.raw or tmp / "stacks.txt"
    try:
        out = _sample(args, tmp, raw, nginx, spy, wrk)
        total, inclusive, own = top(raw, args.top)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rate = re.search(rb"Requests/sec:\s+([\d.]+)", out)
    print(
        f"{args.path}, c={args.concurrency}: {float(rate.group(1)) if rate else 0:,.0f} req/s "
        f"under py-spy, {total} samples"
    )
    for title, rows in (("inclusive", inclusive), ("own", own)):
        print(f"\n| {title} | function (file) |\n| ---: | --- |")
        for share, frame in rows:
            print(f"| {share:.1f} % | `{frame}` |")
    return 0


def _sample(
    args: argparse.Namespace, tmp: Path, raw: Path, nginx: str, spy: str, wrk: str
) -> bytes:
    """Load the gateway with wrk and sample it with py-spy; wrk's report."""
    with signals_interrupt(), Supervisor(tmp) as sup:
        upstream, _ = start_nginx(sup, tmp, nginx, 1)
        url, child = start_speclane(
            sup,
            tmp,
            upstream,
            name="speclane",
            binary=args.speclane or speclane_bin(),
            passthrough=args.path != "assembled",
        )
        loader = Wrk(sup, tmp, wrk)
        stream = args.path == "stream"
        loader.measure(url + CHAT, 16, stream, 0, 2, {})  # warm up, not sampled
        argv = [wrk, "-t1", f"-c{args.concurrency}", f"-d{args.duration + 3}s"]
        argv += ["-s", str(loader.script(stream)), url + CHAT]
        load = sup.start("wrk", argv, capture=True)
        time.sleep(1.5)
        spy_argv = [spy, "record", "--pid", str(child.popen.pid), "--duration"]
        spy_argv += [str(args.duration), "--rate", "250", "--format", "raw", "--nonblocking"]
        subprocess.run([*spy_argv, "-o", str(raw)], check=True, capture_output=True)
        out, _ = load.popen.communicate(timeout=30)
    return out


if __name__ == "__main__":
    sys.exit(main())
