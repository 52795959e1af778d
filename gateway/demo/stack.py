"""The demo's processes: two simulated vLLM pools and the gateway, on loopback, as children.

``Stack.start`` picks free ports, writes the policy, starts the three children (each logging
to a file in the work directory) and waits until each answers its health check;
``Stack.stop`` ends them (SIGTERM, then SIGKILL after a grace period) and is safe to call
more than once. Unless the stack is kept (``--keep``), each child also gets SIGTERM from the
kernel if the demo process dies without cleaning up (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.demo.workload import MODEL

_PR_SET_PDEATHSIG = 1
_READY_TIMEOUT_S = 30.0
_STOP_GRACE_S = 5.0

PolicyText = Callable[[str, str], str]


class StackError(RuntimeError):
    """A child did not start; the message ends with the tail of its log."""


@dataclass(frozen=True, slots=True)
class StackOptions:
    """What to start: the sims' seed, time scale and k, and the policy for two pool URLs."""

    policy: PolicyText
    seed: int = 0
    time_scale: float = 1.0
    k: int = 4
    model: str = MODEL
    keep: bool = False
    cost_model: str = "measured"


@dataclass(slots=True)
class Child:
    name: str
    url: str
    health: str
    log: Path
    process: subprocess.Popen[bytes]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


@dataclass(slots=True)
class Stack:
    """The three demo processes; see the module docstring."""

    workdir: Path
    options: StackOptions
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    children: list[Child] = field(default_factory=list)

    @property
    def spec_url(self) -> str:
        return self._url("speculative")

    @property
    def standard_url(self) -> str:
        return self._url("standard")

    @property
    def gateway_url(self) -> str:
        return self._url("gateway")

    def _url(self, name: str) -> str:
        return next(c.url for c in self.children if c.name == name)

    def start(self) -> None:
        """Start every child and wait until all are ready; on failure, stop what started."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the children (call before any thread starts: see ``_die_with_parent``)."""
        try:
            self._spawn_all()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        """Wait until every child answers its health check; on failure, stop them all."""
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _spawn_all(self) -> None:
        o = self.options
        spec, std, gw = _free_ports(3)
        for name, mode, port, seed in (
            ("speculative", "speculative", spec, o.seed),
            ("standard", "standard", std, o.seed + 1),
        ):
            argv = ["sim", "--mode", mode, "--k", str(o.k), "--port", str(port)]
            argv += ["--model", o.model, "--time-scale", f"{o.time_scale:g}", "--seed", str(seed)]
            argv += ["--cost-model", o.cost_model]
            self._spawn(name, argv, port, "/health")
        policy = self.workdir / "policy.yaml"
        policy.write_text(o.policy(self.spec_url, self.standard_url))
        argv = ["serve", "--policy", str(policy), "--host", "127.0.0.1", "--port", str(gw)]
        # A short drain and no delay before it: the demo closes its client before it stops
        # the gateway, and no load balancer needs telling.
        env = {
            "SPECLANE_ADMIN_TOKEN": self.admin_token,
            "SPECLANE_GRACEFUL_SHUTDOWN_S": "2",
            "SPECLANE_DRAIN_DELAY_S": "0",
        }
        self._spawn("gateway", argv, gw, "/readyz", env)

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        port: int,
        health: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        log = self.workdir / f"{name}.log"
        preexec = None if self.options.keep else _die_with_parent()
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "gateway", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_child_env(env) if env else None,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
                preexec_fn=preexec,
            )
        self.children.append(Child(name, f"http://127.0.0.1:{port}", health, log, process))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        with httpx.Client(timeout=1.0) as client:
            for child in self.children:
                while not _healthy(client, child.url + child.health):
                    if child.process.poll() is not None:
                        raise StackError(f"{child.name} exited early\n{_tail(child.log)}")
                    if time.monotonic() > deadline:
                        raise StackError(f"{child.name} is not ready\n{_tail(child.log)}")
                    time.sleep(0.1)

    def stop(self) -> None:
        """Stop the gateway first, then the pools; kill whatever outlives the grace period."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for child in reversed(self.children):
            try:
                child.process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()

    def describe(self) -> dict[str, dict[str, str | int]]:
        return {c.name: {"url": c.url, "pid": c.process.pid} for c in self.children}


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _child_env(extra: Mapping[str, str]) -> dict[str, str]:
    # ``speclane serve`` takes its admin token (and drain time) from the environment only,
    # so the child gets this environment plus those variables; nothing here reads a setting.
    return {**os.environ, **extra}  # noqa: TID251


def _die_with_parent() -> Callable[[], None] | None:
    """What the child runs before exec to get SIGTERM when its parent dies (Linux only).

    libc is looked up here, in the parent, so that the child between fork and exec makes
    one system call and takes no lock; ``preexec_fn`` is still unsafe once threads run
    (rich's spinner is one), so the demo spawns its children before it shows anything.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_death_signal
