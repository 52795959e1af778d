"""``speclane serve --workers N``: N processes serving one port.

The parent binds the port, forks the workers, and from then on only looks after them:

- SIGTERM or SIGINT: every worker stops gracefully (uvicorn stops accepting and finishes
  what is in flight, for up to ``graceful_shutdown_s``); then the parent exits 0;
- SIGHUP: every worker reloads its policy, as one process does on SIGHUP;
- a worker that dies after running a while is replaced; one that dies within seconds of
  starting stops the server (exit 1), since its replacement would die the same way.

Workers share what replicas share, through the same store (Redis, which ``--workers`` above 1
requires): flags and their audit log, slice windows, guardrail states and events. Each keeps
its own endpoint health and load, shadow budget and pool scrapes, as a replica does. Their
metrics are summed on ``/metrics`` whichever worker answers, through prometheus-client's
multiprocess mode in ``metrics_dir``.

Explained for operators, with its numbers, in docs/operations.md ("Several cores: --workers").
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_WATCHED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
_QUICK_S = 10.0  # a worker that dies sooner than this after starting would die again
_PR_SET_PDEATHSIG = 1


def cpus() -> int:
    """CPUs this process may use: its affinity, bounded by a cgroup v2 CPU quota (a
    container's CPU limit)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    count = count or os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    return count


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every worker accepts on; ``OSError`` if the port is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class Workers:
    """``count`` forked processes each running ``run(sock)``, looked after until a stop."""

    def __init__(
        self,
        count: int,
        sock: socket.socket,
        run: Callable[[socket.socket], int],
        *,
        grace_s: float,
        on_exit: Callable[[int], None] = lambda pid: None,
    ) -> None:
        """``on_exit(pid)`` is called for each worker that has ended (its metrics' bookkeeping)."""
        self._count = count
        self._sock = sock
        self._run = run
        self._grace_s = grace_s
        self._on_exit = on_exit
        self._started: dict[int, float] = {}  # pid -> when
        self._stopping = False
        self._failed = False

    @property
    def pids(self) -> list[int]:
        return sorted(self._started)

    def serve(self) -> int:
        """Run until SIGTERM or SIGINT (0) or a worker that cannot start (1)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
        try:
            for _ in range(self._count):
                self._spawn()
            log.info("%d workers serving, pids %s", self._count, " ".join(map(str, self.pids)))
            while not self._failed:
                info = signal.sigtimedwait(_WATCHED, 1.0)
                self._reap()
                if info is None or info.si_signo == signal.SIGCHLD:
                    continue
                if info.si_signo == signal.SIGHUP:
                    log.info("SIGHUP: every worker reloads its policy")
                    self._signal_all(signal.SIGHUP)
                    continue
                log.info("%s: stopping the workers", signal.Signals(info.si_signo).name)
                break
            self._stop()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
        return 1 if self._failed else 0

    def _spawn(self) -> None:
        for handler in logging.getLogger().handlers:
            handler.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
                _die_with_parent()
                if os.getppid() == parent:  # else the parent died before we could know
                    code = self._run(self._sock)
            except BaseException:
                log.exception("worker %d failed", os.getpid())
            finally:
                logging.shutdown()
                os._exit(code)
        self._started[pid] = time.monotonic()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            started = self._started.pop(pid, None)
            if started is None:
                continue
            self._on_exit(pid)
            if self._stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            if time.monotonic() - started < _QUICK_S:
                log.error("worker %d exited (%d) as it started: stopping the server", pid, code)
                self._failed = True
            else:
                log.error("worker %d exited (%d); starting another", pid, code)
                self._spawn()

    def _signal_all(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _stop(self) -> None:
        """Graceful: SIGTERM, the drain time, then SIGKILL for any worker still running."""
        self._stopping = True
        self._sock.close()  # the workers hold their own copies until they stop accepting
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self._grace_s + 5.0
        while self._started and time.monotonic() < deadline:
            signal.sigtimedwait({signal.SIGCHLD}, 0.2)
            self._reap()
        if self._started:
            log.error("workers %s did not stop in time: killed", self.pids)
            self._signal_all(signal.SIGKILL)
            for pid in self.pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                self._started.pop(pid, None)
                self._on_exit(pid)


def _die_with_parent() -> None:
    """Linux: a worker gets SIGTERM when the parent dies, even by SIGKILL."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
