"""The flag audit log in Redis, with a local copy that outlives Redis.

The log is one Redis list, newest first, at most ``MAX_ENTRIES`` long. Every replica keeps
a copy of it: refreshed when the newest entry changes (one ``LINDEX`` a sync round), and
written back by the replica that re-seeds an emptied Redis (``RPUSH`` of the older entries
behind anything written since, so the order holds). So the audit survives a Redis restart
that lost its data, as flags do, as long as one replica runs. Entries made while Redis is
unreachable wait here and are pushed when it answers. Part of ``RedisState``; no I/O of its
own beyond the pipeline and client it is handed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.state.flagstore import AuditEntry
from policies.flags import FlagValue

MAX_ENTRIES = 1000


def flag_to_json(value: FlagValue) -> bytes:
    return orjson.dumps(
        {
            "enabled": value.enabled,
            "rollout": value.rollout,
            "allow": sorted(value.allow) if value.allow is not None else None,
            "deny": sorted(value.deny),
        }
    )


def flag_from_json(raw: bytes | str) -> FlagValue:
    data = orjson.loads(raw)
    allow = data.get("allow")
    return FlagValue(
        enabled=bool(data.get("enabled", True)),
        rollout=data.get("rollout"),
        allow=frozenset(allow) if allow is not None else None,
        deny=frozenset(data.get("deny") or ()),
    )


def audit_to_json(entry: AuditEntry) -> bytes:
    return orjson.dumps(
        {
            "at": entry.at,
            "who": entry.who,
            "flag": entry.flag,
            "old": orjson.loads(flag_to_json(entry.old)) if entry.old else None,
            "new": orjson.loads(flag_to_json(entry.new)) if entry.new else None,
            "reason": entry.reason,
            **({"policy": entry.policy} if entry.policy else {}),
        }
    )


def audit_from_json(raw: bytes | str) -> AuditEntry:
    d = orjson.loads(raw)
    old = flag_from_json(orjson.dumps(d["old"])) if d.get("old") else None
    new = flag_from_json(orjson.dumps(d["new"])) if d.get("new") else None
    policy = str(d.get("policy") or "")
    return AuditEntry(
        at=d["at"],
        who=d["who"],
        flag=d["flag"],
        old=old,
        new=new,
        reason=d.get("reason", ""),
        policy=policy,
    )


class SharedAudit:
    """This replica's view of the shared audit log: the copy, and entries not yet pushed."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.pending: list[AuditEntry] = []
        self._pushing: list[list[AuditEntry]] = []  # batches whose push is under way
        self._copy: list[bytes] = []  # newest first, as in Redis

    def push(self, pipe: Any) -> list[AuditEntry]:
        """Queue the pending entries on ``pipe`` and return them: they are being pushed, and a
        concurrent push does not take them again. ``pushed`` or ``unpushed`` them after."""
        batch, self.pending = self.pending, []
        self._pushing.append(batch)
        for entry in batch:
            pipe.lpush(self.key, audit_to_json(entry))
        pipe.ltrim(self.key, 0, MAX_ENTRIES - 1)
        return batch

    def pushed(self, batch: list[AuditEntry]) -> None:
        self._pushing = [b for b in self._pushing if b is not batch]

    def unpushed(self, batch: list[AuditEntry]) -> None:
        self.pushed(batch)
        self.pending = batch + self.pending

    def reseed(self, pipe: Any) -> None:
        """Queue the copy's entries behind whatever the emptied list holds by now."""
        if self._copy:
            pipe.rpush(self.key, *self._copy)

    async def refresh(self, redis: aioredis.Redis) -> None:
        """Take the list again when its newest entry is not the copy's; a list holding
        anything that is no audit entry raises, and the copy stays as it was."""
        newest = await redis.lindex(self.key, 0)
        if newest is None or (self._copy and self._copy[0] == newest):
            return
        found = await redis.lrange(self.key, 0, MAX_ENTRIES - 1)
        copy = [r if isinstance(r, bytes) else r.encode() for r in found]
        for raw in copy:
            audit_from_json(raw)
        self._copy = copy

    async def read(self, redis: aioredis.Redis, limit: int) -> list[AuditEntry]:
        """The newest ``limit`` entries, oldest first, from Redis."""
        if limit <= 0:
            return []
        raw = await redis.lrange(self.key, 0, limit - 1)
        return [audit_from_json(r) for r in reversed(raw)]

    def local(self, limit: int) -> Sequence[AuditEntry]:
        """The newest ``limit`` entries as this replica knows them, oldest first: the copy,
        then what waits to be pushed."""
        if limit <= 0:
            return []
        known = [audit_from_json(r) for r in reversed(self._copy)]
        pushing = [entry for batch in self._pushing for entry in batch]
        return [*known, *pushing, *self.pending][-limit:]
