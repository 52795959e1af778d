"""The running policy: loaded from its file, reloaded on change, kept when a new one is bad.

``PolicyHolder.current`` is the compiled policy a new request reads once; a request keeps
the one it started with even if a reload lands while it streams. A file that fails to load
is logged with every lint error (file:line:column), counted in a metric, and ignored.
``text`` and ``version`` (a hash of the text) are what is running; ``last_reload`` is the
result of the last attempt, good or bad, for the admin API. A policy whose pool names an
engine the gateway has no module for (``gateway/engines/``) does not load either.

Reading and compiling run in a worker thread, one reload at a time, and take at most
``MAX_BYTES`` of the file: whatever the file holds, the event loop keeps serving, and a
reload ends with the new policy or with errors, never with an exception.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.engines import ENGINES, Registry
from policies.compiled import CompiledPolicy, load_policy
from policies.load import MAX_BYTES
from policies.problems import PolicyError, Problem

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReloadResult:
    changed: bool
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Attempt:
    """One reload attempt: when (wall-clock seconds), and what came of it."""

    at: float
    result: ReloadResult


def version_of(text: str) -> str:
    """A short content hash naming one policy text (the first 12 hex digits of SHA-256)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_policy_file(path: Path) -> bytes:
    """At most ``MAX_BYTES`` + 1 bytes of a regular file (the loader refuses the rest);
    ``OSError`` at once when it cannot be read, or is a directory, a pipe, a socket or a
    device: it is opened without waiting for a writer, and nothing but a regular file is read,
    so a FIFO in its place is an error, never a reload that waits for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file but {_kind(mode)}")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = MAX_BYTES + 1
        while left and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISSOCK: "a socket",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


def load_policy_file(path: Path, engines: Registry = ENGINES) -> tuple[CompiledPolicy, str]:
    """The compiled policy in ``path`` and its text; ``PolicyError`` or ``OSError``."""
    data = read_policy_file(path)
    policy = load_policy(data, str(path))
    unknown = [
        Problem(
            ("pools", name, "engine"),
            f"engine {pool.engine.value} is not one this gateway has",
            f"give one of {', '.join(engines.names)}",
            code="engine-unregistered",
        )
        for name, pool in policy.pools.items()
        if pool.engine.value not in engines.names
    ]
    if unknown:
        raise PolicyError(str(path), unknown)
    return policy, data.decode("utf-8-sig")  # it loaded, so it decodes


class PolicyHolder:
    """Holds the current compiled policy and the file it came from."""

    def __init__(
        self,
        path: Path | None,
        policy: CompiledPolicy,
        on_change: Callable[[CompiledPolicy], None] | None = None,
        text: str | None = None,
        engines: Registry = ENGINES,
    ) -> None:
        self.path = path
        self.engines = engines
        self.current = policy
        self.text = text
        self.version = version_of(text) if text is not None else None
        self.last_error: tuple[str, ...] = ()
        self.last_reload: Attempt | None = None
        self.requested = asyncio.Event()  # set by SIGHUP: the watch reloads at once
        self._on_change = on_change
        self._stamp = _stamp(path) if path else None
        self._lock = asyncio.Lock()

    @classmethod
    def from_file(cls, path: Path, engines: Registry = ENGINES) -> PolicyHolder:
        """Load the initial policy; a bad file raises ``PolicyError`` (nothing to fall back on).
        ``engines``: those a pool may name."""
        policy, text = load_policy_file(path, engines)
        return cls(path, policy, text=text, engines=engines)

    def get(self) -> CompiledPolicy:
        """The current policy: what those that read it each time they need it are given."""
        return self.current

    def subscribe(self, on_change: Callable[[CompiledPolicy], None]) -> None:
        self._on_change = on_change

    def changed_on_disk(self) -> bool:
        return self.path is not None and _stamp(self.path) != self._stamp

    async def reload(self, now: float = 0.0) -> ReloadResult:
        """Read the file again; keep the running policy if the new one does not load."""
        async with self._lock:
            result = await self._reload()
            self.last_reload = Attempt(now, result)
        return result

    async def _reload(self) -> ReloadResult:
        if self.path is None:
            return ReloadResult(False, ("the policy was not loaded from a file",))
        self._stamp = _stamp(self.path)
        try:
            policy, text = await asyncio.to_thread(load_policy_file, self.path, self.engines)
        except PolicyError as exc:
            return self._rejected(tuple(p.render(exc.filename) for p in exc.problems))
        except OSError as exc:
            return self._rejected((f"{self.path}: cannot read: {exc.strerror or exc}",))
        self.last_error = ()
        before = self.version
        self.current = policy
        self.text, self.version = text, version_of(text)
        if self._on_change is not None:
            self._on_change(policy)
        log.info("%s", reloaded_line(self.path, before, self.version, policy))
        return ReloadResult(True)

    def _rejected(self, errors: tuple[str, ...]) -> ReloadResult:
        self.last_error = errors
        for line in errors:
            log.error("policy reload rejected, keeping the running policy: %s", line)
        return ReloadResult(False, errors)


def reloaded_line(
    path: Path, before: str | None, version: str | None, policy: CompiledPolicy
) -> str:
    """What the log says of a reload: the file, the version it replaced and its own, and the
    rules now in force, in order."""
    rules = ", ".join(rule.name for rule in policy.rules)
    count = len(policy.rules)
    return (
        f"policy reloaded from {path}: version {before} -> {version}; "
        f"{count} rule{'s' if count != 1 else ''} ({rules})"
    )


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        stat_ = path.stat()
    except OSError:
        return None
    return (stat_.st_mtime, stat_.st_size)
