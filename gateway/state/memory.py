"""Shared state: flags (with their audit log) and guardrail states, as one seam.

``MemoryState`` is the embedded default: one process, nothing to set up. ``RedisState``
(``gateway/state/redis_store.py``) shares the same things between replicas. The request path
never calls these: it reads ``FlagStore.values`` and ``LiveStats.guards``, which the state
keeps current through the replica protocol (``gateway/measure/replica.py``). Only the admin
API and the background sync call in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gateway.measure.engine_scrape import tallied
from gateway.measure.replica import Replica
from gateway.state.flagstore import AuditEntry, FlagStore
from policies.flags import FlagValue
from policies.guardrail import SliceState, Transition


def state_json(state: SliceState) -> dict[str, Any]:
    return {
        "offset": state.offset,
        "phase": state.phase.value,
        "since": state.since,
        "version": state.version,
    }


def transition_json(t: Transition) -> dict[str, Any]:
    return {
        "slice": t.slice,
        "rule": t.slice.split(" / ", 1)[0],
        "at": t.at,
        "from": state_json(t.before),
        "to": state_json(t.after),
        "reason": t.reason,
        "numbers": t.numbers,
    }


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

    async def note(self, entry: AuditEntry) -> None:
        """Add a change that is not a flag's (a policy applied) to the audit log."""
        ...

    async def events(self, limit: int) -> list[dict[str, Any]]: ...

    def status(self) -> dict[str, object]: ...

    async def drained(
        self, key: str, add: dict[str, float], first: int | None, last: int | None
    ) -> dict[str, float]:
        """Add one drained read of ``key`` (an endpoint whose stats vanish on read) to its
        running totals shared by every replica, and return them with ``lost``: iterations
        between the first and last ``iter`` seen that nobody read."""
        ...


class MemoryState:
    """Flags and audit kept in this process only."""

    def __init__(self, flags: FlagStore, replica: Replica) -> None:
        self._flags = flags
        self._replica = replica
        self._drained: dict[str, dict[str, float]] = {}

    async def drained(
        self, key: str, add: dict[str, float], first: int | None, last: int | None
    ) -> dict[str, float]:
        self._drained[key] = tallied(self._drained.get(key, {}), add, first, last)
        return dict(self._drained[key])

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

    async def note(self, entry: AuditEntry) -> None:
        self._flags.note(entry)

    async def events(self, limit: int) -> list[dict[str, Any]]:
        return [transition_json(t) for t in list(self._replica.events)[-limit:]]

    def status(self) -> dict[str, object]:
        return {"store": "memory", "degraded": False}
