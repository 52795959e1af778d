"""Shared state: flags (with their audit log) and guardrail states, as one seam.

``MemoryState`` is the embedded default: one process, nothing to set up. ``RedisState``
(``gateway/state_redis.py``) shares the same things between replicas. The request path never
calls these: it reads ``FlagStore.values`` and ``LiveStats.guards``, which the state keeps
current. Only the admin API and the background sync call in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.flagstore import AuditEntry, FlagStore
from policies.flags import FlagValue


class SharedState(Protocol):
    """Where flag changes go, and what the admin API and /readyz read."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def set_flag(
        self, name: str, value: FlagValue, who: str, at: float, reason: str
    ) -> AuditEntry: ...

    async def delete_flag(
        self, name: str, who: str, at: float, reason: str
    ) -> AuditEntry | None: ...

    async def audit(self, limit: int) -> Sequence[AuditEntry]: ...

    def status(self) -> dict[str, object]: ...


class MemoryState:
    """Flags and audit kept in this process only."""

    def __init__(self, flags: FlagStore) -> None:
        self._flags = flags

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def set_flag(
        self, name: str, value: FlagValue, who: str, at: float, reason: str
    ) -> AuditEntry:
        return self._flags.set(name, value, who, at, reason)

    async def delete_flag(self, name: str, who: str, at: float, reason: str) -> AuditEntry | None:
        return self._flags.delete(name, who, at, reason)

    async def audit(self, limit: int) -> Sequence[AuditEntry]:
        return list(self._flags.audit)[-limit:]

    def status(self) -> dict[str, object]:
        return {"store": "memory", "degraded": False}
