"""The running policy: loaded from its file, reloaded on change, kept when a new one is bad.

``PolicyHolder.current`` is the compiled policy a new request reads once; a request keeps
the one it started with even if a reload lands while it streams. A file that fails to load
is logged with every lint error (file:line:column), counted in a metric, and ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from policies.compiled import CompiledPolicy, load_policy
from policies.problems import PolicyError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReloadResult:
    changed: bool
    errors: tuple[str, ...] = ()


class PolicyHolder:
    """Holds the current compiled policy and the file it came from."""

    def __init__(
        self,
        path: Path | None,
        policy: CompiledPolicy,
        on_change: Callable[[CompiledPolicy], None] | None = None,
    ) -> None:
        self.path = path
        self.current = policy
        self.last_error: tuple[str, ...] = ()
        self._on_change = on_change
        self._stamp = _stamp(path) if path else None

    @classmethod
    def from_file(cls, path: Path) -> PolicyHolder:
        """Load the initial policy; a bad file raises ``PolicyError`` (nothing to fall back on)."""
        return cls(path, load_policy(path.read_text(), str(path)))

    def subscribe(self, on_change: Callable[[CompiledPolicy], None]) -> None:
        self._on_change = on_change

    def changed_on_disk(self) -> bool:
        return self.path is not None and _stamp(self.path) != self._stamp

    def reload(self) -> ReloadResult:
        """Read the file again; keep the running policy if the new one does not load."""
        if self.path is None:
            return ReloadResult(False, ("the policy was not loaded from a file",))
        self._stamp = _stamp(self.path)
        try:
            policy = load_policy(self.path.read_text(), str(self.path))
        except PolicyError as exc:
            self.last_error = tuple(p.render(exc.filename) for p in exc.problems)
            for line in self.last_error:
                log.error("policy reload rejected, keeping the running policy: %s", line)
            return ReloadResult(False, self.last_error)
        except OSError as exc:
            self.last_error = (f"{self.path}: cannot read: {exc}",)
            log.error("policy reload failed, keeping the running policy: %s", exc)
            return ReloadResult(False, self.last_error)
        self.last_error = ()
        self.current = policy
        if self._on_change is not None:
            self._on_change(policy)
        log.info("policy reloaded from %s", self.path)
        return ReloadResult(True)


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime, stat.st_size)
