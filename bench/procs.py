"""Child processes of the overhead benchmark: start, wait until ready, account CPU, clean up.

Every child runs in its own session (process group), so one signal reaches it and its
workers (nginx forks), and a Ctrl-C in the terminal reaches only the benchmark, which
then stops each group itself: SIGTERM, a grace period, SIGKILL. On Linux each child also
gets SIGTERM should the benchmark die without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds used so far: by the machine, by this process, by each user process."""

    machine: float  # all cores, running processes (user + nice + system in /proc/stat)
    me: float  # this process
    groups: dict[int, int]  # pid -> process group
    own: dict[int, float]  # pid -> its user + system time

    def group_s(self, pgid: int) -> float:
        """Time of the live members of group ``pgid``."""
        return sum(self.own[pid] for pid, group in self.groups.items() if group == pgid)


def cpu_snapshot() -> CpuSnapshot:
    """Read /proc (Linux). Interrupt and softirq time, where loopback traffic is mostly
    processed, is charged to no process, so it is left out of ``machine`` too."""
    with open("/proc/stat") as stat:
        user, nice, system = (int(v) for v in stat.readline().split()[1:4])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    groups, own = {}, {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as file:
                stat_line = file.read()
        except OSError:
            continue  # gone since the listing
        # after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt
        # cmajflt utime stime
        fields = stat_line[stat_line.rindex(")") + 2 :].split()
        pid = int(entry.name)
        groups[pid] = int(fields[2])
        own[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    machine = (user + nice + system) / _CLOCK_TICKS
    return CpuSnapshot(machine, usage.ru_utime + usage.ru_stime, groups, own)


def others_s(before: CpuSnapshot, after: CpuSnapshot, ours: set[int], reaped: float) -> float:
    """CPU seconds the machine spent on processes other than this one, the groups ``ours``
    and children it reaped meanwhile (``reaped`` seconds)."""
    mine = after.me - before.me + reaped
    mine += sum(after.group_s(g) - before.group_s(g) for g in ours)
    return max(0.0, after.machine - before.machine - mine)


class Child:
    """One started process group, its output in ``log``."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path | None) -> None:
        self.name = name
        self.popen = popen
        self.log = log

    def cpu_s(self, snapshot: CpuSnapshot | None = None) -> float:
        return (snapshot or cpu_snapshot()).group_s(self.popen.pid)

    def tail(self, lines: int = 20) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Supervisor:
    """Owns every child; ``close`` (or leaving the ``with`` block) stops them all."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._children: list[Child] = []

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        capture: bool = False,
    ) -> Child:
        """Start ``argv``; its output goes to a log file, or to a pipe with ``capture``."""
        if capture:
            child = Child(name, _popen(argv, env, subprocess.PIPE), None)
        else:
            log = self._logs / f"{name}.log"
            with log.open("wb") as out:
                child = Child(name, _popen(argv, env, out), log)
        self._children.append(child)
        return child

    @property
    def groups(self) -> set[int]:
        """Process groups of the children running now."""
        return {child.popen.pid for child in self._children}

    def stop(self, child: Child) -> None:
        """Stop ``child`` now if it still runs, reap it, and stop tracking it."""
        if child.popen.poll() is None:
            _stop([child])
        self._children.remove(child)

    def wait_ready(self, child: Child, url: str, timeout_s: float = 30.0) -> None:
        """Poll ``url`` (GET) until it answers 200; fail with the child's log if it dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.popen.poll() is not None:
                raise RuntimeError(f"{child.name} exited early:\n{child.tail()}")
            if _answers(url):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{child.name} was not ready in {timeout_s:.0f} s:\n{child.tail()}")

    def close(self) -> None:
        _stop(self._children)
        self._children.clear()


def _stop(children: Sequence[Child]) -> None:
    """SIGTERM every group, a grace period, then SIGKILL (workers too, if a leader left)."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(max(0.0, deadline - time.monotonic()))
        _signal_group(child, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(2.0)


def _popen(
    argv: Sequence[str], env: dict[str, str] | None, out: int | IO[bytes]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def _signal_group(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.popen.pid, sig)


def _answers(url: str) -> bool:
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=1.0)
    try:
        connection.request("GET", "/" + path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt, so cleanup runs on each (SIGINT
    too when the shell started us ignoring it, as it does for background jobs)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {
        sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def busiest_others(sup: Supervisor, seconds: float, top: int = 6) -> list[tuple[str, float]]:
    """What else is running: the processes outside this benchmark that used the most CPU
    over ``seconds``, as (command, % of one core), summed by command name."""
    before = cpu_snapshot()
    time.sleep(seconds)
    after = cpu_snapshot()
    ours = sup.groups | {os.getpgrp()}
    by_name: dict[str, float] = {}
    for pid, used in after.own.items():
        if after.groups.get(pid) in ours:
            continue
        delta = used - before.own.get(pid, used)
        if delta <= 0:
            continue
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        by_name[name] = by_name.get(name, 0.0) + 100 * delta / seconds
    return sorted(by_name.items(), key=lambda item: -item[1])[:top]


def cpu_model() -> str:
    """The CPU's model name (Linux), else the machine type."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
