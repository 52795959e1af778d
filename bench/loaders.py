"""Load generators for the overhead benchmark, each in its own process.

``wrk`` (Debian's ``wrk``; C, one thread, a generated Lua script for the POST body) when it
is installed, else ``bench/loadgen.py`` (aiohttp). Both are closed loops: ``concurrency``
connections, each sending the next request when the answer's last byte is in. Both report
completed requests, latency p50/p99 (request written to last byte read) and their own CPU;
the benchmark adds the CPU of the servers it watched during the measured window.
"""

from __future__ import annotations

import math
import resource
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import canned
import orjson
from procs import Child, CpuSnapshot, Supervisor, cpu_snapshot, others_s

OTHER = "other"  # processes that are not this benchmark's
_WRK_MARK = "WRKJSON "
_WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"window_us":%d,"errors":%d,'
      .. '"p50_us":%.1f,"p99_us":%.1f,"mean_us":%.1f,"max_us":%.1f}\\n',
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
"""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured window of one configuration."""

    requests: int
    errors: int
    window_s: float
    p50_us: float
    p99_us: float
    mean_us: float
    cpu_s: dict[str, float] = field(default_factory=dict)  # loader, proxy, upstream, other

    @property
    def rps(self) -> float:
        return self.requests / self.window_s if self.window_s else 0.0

    def cpu_percent(self, role: str) -> float | None:
        used = self.cpu_s.get(role)
        return None if used is None else 100 * used / self.window_s


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _used(
    watched: dict[str, Child],
    before: CpuSnapshot,
    after: CpuSnapshot,
    ours: set[int],
    loader: float,
    reaped: float = 0.0,
    scale: float = 1.0,
) -> dict[str, float]:
    """CPU seconds per role in the window; ``other``: processes not of this benchmark.
    ``reaped``: the part of ``loader`` that ended before ``after`` was taken."""
    used = {role: (c.cpu_s(after) - c.cpu_s(before)) * scale for role, c in watched.items()}
    used["loader"] = loader
    used[OTHER] = others_s(before, after, ours, reaped) * scale
    return used


class Wrk:
    name = "wrk"

    def __init__(self, supervisor: Supervisor, scripts: Path, binary: str) -> None:
        self._supervisor = supervisor
        self._scripts = scripts
        self._binary = binary

    @staticmethod
    def find() -> str | None:
        return shutil.which("wrk")

    def script(self, stream: bool, model: str = canned.MODEL, route: str = "chat") -> Path:
        """The Lua script that makes wrk send the canned request of ``route``."""
        path = self._scripts / f"wrk-{route}-{'stream' if stream else 'json'}-{model}.lua"
        lines = [
            'wrk.method = "POST"',
            f"wrk.body = [==[{canned.request_body(stream, model, route).decode()}]==]",
        ]
        lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in canned.request_headers(stream).items()]
        path.write_text("\n".join(lines) + "\n" + _WRK_DONE)
        return path

    def _run(
        self, url: str, concurrency: int, stream: bool, seconds: int, model: str
    ) -> dict[str, float]:
        argv = [self._binary, "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "10s"]
        argv += ["-s", str(self.script(stream, model, canned.route_of(url))), url]
        child = self._supervisor.start("wrk", argv, capture=True)
        try:
            out, _ = child.popen.communicate(timeout=seconds + 30)
        finally:
            self._supervisor.stop(child)
        text = out.decode(errors="replace")
        for line in text.splitlines():
            if line.startswith(_WRK_MARK):
                parsed: dict[str, float] = orjson.loads(line[len(_WRK_MARK) :])
                return parsed
        raise RuntimeError(f"wrk printed no summary (exit {child.popen.returncode}):\n{text}")

    def measure(
        self,
        url: str,
        concurrency: int,
        stream: bool,
        warmup: float,
        duration: float,
        watched: dict[str, Child],
        model: str = canned.MODEL,
    ) -> Measurement:
        if warmup > 0:
            self._run(url, concurrency, stream, max(1, math.ceil(warmup)), model)
        ours = self._supervisor.groups
        before, loader_before, started = cpu_snapshot(), _children_cpu_s(), time.monotonic()
        result = self._run(url, concurrency, stream, max(1, round(duration)), model)
        elapsed = time.monotonic() - started
        after, loader = cpu_snapshot(), _children_cpu_s() - loader_before
        window_s = result["window_us"] / 1e6
        # the servers' CPU was read around the whole wrk process; scale it to wrk's window
        return Measurement(
            requests=int(result["requests"]),
            errors=int(result["errors"]),
            window_s=window_s,
            p50_us=result["p50_us"],
            p99_us=result["p99_us"],
            mean_us=result["mean_us"],
            cpu_s=_used(watched, before, after, ours, loader, loader, window_s / elapsed),
        )


class PythonLoader:
    name = "python"

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self._script = Path(__file__).with_name("loadgen.py")

    def measure(
        self,
        url: str,
        concurrency: int,
        stream: bool,
        warmup: float,
        duration: float,
        watched: dict[str, Child],
        model: str = canned.MODEL,
    ) -> Measurement:
        argv: Sequence[str] = [
            sys.executable,
            str(self._script),
            f"--url={url}",
            f"--model={model}",
            f"--concurrency={concurrency}",
            f"--duration={duration}",
            f"--warmup={warmup}",
            "--stream" if stream else "--no-stream",
        ]
        child = self._supervisor.start("loadgen", argv, capture=True)
        try:
            assert child.popen.stdout is not None
            first = child.popen.stdout.readline()
            if first.strip() != b"measuring":
                child.popen.wait(10)
                raise RuntimeError(f"loadgen failed: {first.decode(errors='replace')}")
            ours = self._supervisor.groups
            before = cpu_snapshot()
            line = child.popen.stdout.readline()
            after = cpu_snapshot()
            child.popen.wait(30)
        finally:
            self._supervisor.stop(child)
        if child.popen.returncode != 0 or not line:
            raise RuntimeError(f"loadgen exited {child.popen.returncode}")
        result = orjson.loads(line)
        return Measurement(
            requests=int(result["requests"]),
            errors=int(result["errors"]),
            window_s=float(result["window_s"]),
            p50_us=float(result["p50_us"]),
            p99_us=float(result["p99_us"]),
            mean_us=float(result["mean_us"]),
            cpu_s=_used(watched, before, after, ours, float(result["cpu_s"])),
        )
