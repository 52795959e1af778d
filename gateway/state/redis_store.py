"""Shared state in Redis: flags, audit log, guardrail states and slice windows for every
replica of a deployment. Keys live under ``<namespace>:``; nothing here runs on the request
path (decisions read the local snapshots this module keeps current).

One background loop, about once a second or at once when another replica publishes a
change, does in order:

1. *Re-seed* when the marker key is gone (Redis restarted empty, or flushed): write back this
   replica's flags and guardrail states, only where absent (``HSETNX``/``SET NX``), so the
   first replica to notice restores them and nobody overwrites a newer value, and its copy of
   the audit log (``gateway/state/redis_audit.py``). The marker is written in the same
   transaction as what it marks, and a pull reads it with the flags: one that finds no marker
   (Redis emptied after this round's check) keeps this replica's flags rather than taking the
   emptiness for deletions, which it would then have re-seeded everywhere. Flags and the audit
   therefore survive a Redis wipe as long as one replica runs; run Redis with AOF to survive
   losing every replica too. Window counts are not re-seeded: the guardrail gathers fresh
   samples.
2. Push flag changes made while Redis was unreachable.
3. *Agree on guardrail transitions.* A replica never applies a transition itself while
   connected; it proposes it, and a Lua script applies it only if the slice's stored version
   is still the one the proposal started from (compare-and-set), logs the event once and
   publishes it. The losers of a race adopt the winner's state on the next pull. So two
   replicas cannot both move a slice, and they disagree at most until their next pull (one
   interval, or a pub/sub round trip). Splits of slices by application (``split:<slice>``)
   are agreed the same way, on their own version.
4. Push window increments (``HINCRBY`` per bucket field, one pipeline) and pull the merged
   windows, flags and states.

Redis down, or answering what Redis never would (``redisclient.FAILURES``): every failure
marks the store degraded (``/readyz`` detail, a metric), the
replica keeps serving on its last snapshot and local windows, applies its own transitions,
and keeps trying; when Redis answers again, it pushes what it holds and pulls the rest.
Keys expire: windows after twice their span, guardrail states after ``guard_ttl_s`` idle.

Explained for operators, with its numbers, in docs/operations.md ("Several replicas: Redis").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from redis.exceptions import WatchError

from gateway.measure.engine_scrape import tallied
from gateway.measure.replica import Replica
from gateway.measure.slicerecord import Increment
from gateway.measure.telemetry import Telemetry
from gateway.measure.windows import Counts
from gateway.state.flagstore import AuditEntry, FlagStore
from gateway.state.memory import transition_json
from gateway.state.redis_audit import SharedAudit, flag_from_json, flag_to_json
from gateway.state.redisclient import FAILURES, connect
from policies.compiled import CompiledPolicy
from policies.flags import FlagValue
from policies.guardrail import Phase, SliceState, Transition
from policies.splitting import Split, split_json, split_of

log = logging.getLogger(__name__)

_FIELDS = (
    "requests",
    "measured",
    "drafted",
    "accepted",
    "tpot_sum",
    "tpot_n",
    "errors",
    "rate_sum",
    "rate_sq",
    "stepped",
    "tokens",
    "steps",
    "tok_sq",
    "step_sq",
    "tok_step",
)
_FLOATS = {"tpot_sum", "rate_sum", "rate_sq"}
# one drained read of an endpoint: what it took, and the first and last ``iter`` it held
_Drained = tuple[dict[str, float], int | None, int | None]

# Compare-and-set of one slice's guardrail state (or split): placed when the stored version is
# the one the proposal started from, or when none is stored (a child split from its parent
# starts at its parent's version; an expired state); logs the event and publishes it once.
_CAS = """
local current = redis.call('GET', KEYS[1])
if current and tonumber(cjson.decode(current)['version']) ~= tonumber(ARGV[1]) then
  return current
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('LPUSH', KEYS[3], ARGV[6])
redis.call('LTRIM', KEYS[3], 0, 999)
redis.call('PUBLISH', ARGV[7], 'guard')
return 'ok'
"""


def _state_json(model: str, rule: str, state: SliceState) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "rule": rule,
            "offset": state.offset,
            "phase": state.phase.value,
            "since": state.since,
            "version": state.version,
            "rounds": state.rounds,
            "probe_share": state.probe_share,
        }
    )


def _state_from(raw: bytes | str) -> tuple[str, str, SliceState]:
    d = orjson.loads(raw)
    state = SliceState(
        int(d["offset"]),
        Phase(d["phase"]),
        float(d["since"]),
        int(d["version"]),
        int(d.get("rounds", 0)),
        float(d.get("probe_share", 0.0)),
    )
    return str(d["model"]), str(d["rule"]), state


def _split_json(split: Split) -> bytes:
    return orjson.dumps(split_json(split))


def _split_from(raw: bytes | str) -> Split:
    return split_of(orjson.loads(raw))


def _event_json(t: Transition) -> bytes:
    return orjson.dumps(transition_json(t))


class RedisState:
    """The ``SharedState`` of replicas that share one Redis."""

    def __init__(
        self,
        url: str,
        namespace: str,
        flags: FlagStore,
        replica: Replica,
        policy: Callable[[], CompiledPolicy],
        telemetry: Telemetry,
        wall: Callable[[], float],
        *,
        interval_s: float = 1.0,
        guard_ttl_s: float = 86_400.0,
        password: str | None = None,
    ) -> None:
        self._redis = connect(url, password)
        self._ns = namespace
        self._flags = flags
        self._replica = replica
        self._policy = policy
        self._telemetry = telemetry
        self._wall = wall
        self._interval_s = interval_s
        self._guard_ttl_s = guard_ttl_s
        self._cas = self._redis.register_script(_CAS)
        self._wake = asyncio.Event()
        self._pending_flags: dict[str, FlagValue | None] = {}
        self._flag_pushes = 0  # pushes of flag changes under way
        self._audit = SharedAudit(self._key("audit"))
        self._tasks: list[asyncio.Task[None]] = []
        self._undrained: dict[str, _Drained] = {}  # drained reads Redis has not taken
        self._drained_seen: dict[str, dict[str, float]] = {}  # the totals Redis last gave
        self.degraded = True
        self.last_error = "not connected yet"
        self.last_sync = 0.0

    def _key(self, *parts: str | int) -> str:
        return ":".join((self._ns, *map(str, parts)))

    @property
    def channel(self) -> str:
        return self._key("changes")

    async def start(self) -> None:
        await self.sync()
        self._tasks = [
            asyncio.create_task(self._loop(), name="redis-sync"),
            asyncio.create_task(self._listen(), name="redis-listen"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()

    def status(self) -> dict[str, object]:
        return {
            "store": "redis",
            "namespace": self._ns,
            "degraded": self.degraded,
            "last_error": self.last_error if self.degraded else "",
            "last_sync": self.last_sync,
        }

    # --- flags -----------------------------------------------------------------------------

    async def set_flag(
        self, name: str, value: FlagValue, who: str, at: float, reason: str
    ) -> AuditEntry:
        entry = self._flags.set(name, value, who, at, reason)
        await self._write_flag(name, value, entry)
        return entry

    async def delete_flag(self, name: str, who: str, at: float, reason: str) -> AuditEntry | None:
        entry = self._flags.delete(name, who, at, reason)
        if entry is not None:
            await self._write_flag(name, None, entry)
        return entry

    async def note(self, entry: AuditEntry) -> None:
        self._flags.note(entry)
        self._audit.pending.append(entry)
        try:
            await self._push_flags()
        except FAILURES as exc:
            self._failed(exc)

    async def _write_flag(self, name: str, value: FlagValue | None, entry: AuditEntry) -> None:
        self._pending_flags[name] = value
        self._audit.pending.append(entry)
        try:
            await self._push_flags()
        except FAILURES as exc:
            self._failed(exc)

    async def _push_flags(self) -> None:
        """Push what changed; taken out first, so a push running concurrently (the admin
        API's and the loop's) never sends the same change twice, and put back on failure."""
        if not self._pending_flags and not self._audit.pending:
            return
        flags, self._pending_flags = self._pending_flags, {}
        self._flag_pushes += 1
        pipe = self._redis.pipeline(transaction=True)
        for name, value in flags.items():
            if value is None:
                pipe.hdel(self._key("flags"), name)
            else:
                pipe.hset(self._key("flags"), name, flag_to_json(value))
        batch = self._audit.push(pipe)
        pipe.publish(self.channel, "flags")
        try:
            await pipe.execute()
        except BaseException:
            self._pending_flags = flags | self._pending_flags
            self._audit.unpushed(batch)
            raise
        finally:
            self._flag_pushes -= 1
        self._audit.pushed(batch)

    async def audit(self, limit: int) -> Sequence[AuditEntry]:
        if limit <= 0:
            return []
        if self.degraded:
            return self._audit.local(limit)
        try:
            return await self._audit.read(self._redis, limit)
        except FAILURES as exc:
            self._failed(exc)
            return self._audit.local(limit)

    # --- the loop --------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            self._wake.clear()
            try:
                await self.sync()
            except Exception:  # the loop must outlive any one bad round
                log.exception("shared state: sync round failed")
                self._telemetry.sync_error()

    async def _listen(self) -> None:
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self._wake.set()
            except FAILURES:
                await asyncio.sleep(self._interval_s)

    async def sync(self) -> None:
        """One round: re-seed if needed, push, agree on transitions, pull."""
        increments = self._replica.drain()
        try:
            await self._reseed_if_empty()
            await self._push_flags()
            await self._commit_proposals()
            await self._commit_splits()
            await self._push_increments(increments)
            await self._pull()
        except FAILURES as exc:
            self._replica.restore(increments)
            self._failed(exc)
            return
        if self.degraded:
            log.info("shared state: Redis is back")
        self.degraded = False
        self._replica.reachable(True)
        self._telemetry.set_degraded(False)
        self.last_sync = self._wall()

    def _failed(self, exc: BaseException) -> None:
        if not self.degraded:
            log.warning("shared state: Redis unreachable, serving on local state: %s", exc)
        self.degraded = True
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._replica.reachable(False)
        self._telemetry.set_degraded(True)
        self._telemetry.sync_error()

    async def _reseed_if_empty(self) -> None:
        """Write back this replica's copy when the marker is gone, in one transaction with
        the marker: a replica that finds the marker finds what it marks, and only one
        replica re-seeds (a second one's ``WATCH`` sees the first's marker and stops)."""
        alive = self._key("alive")
        if await self._redis.exists(alive):
            return  # nothing was lost
        async with self._redis.pipeline(transaction=True) as pipe:
            await pipe.watch(alive)
            if await pipe.exists(alive):
                return  # another replica re-seeded since
            pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            pipe.set(alive, b"1")
            for name, value in self._flags.overrides.items():
                pipe.hsetnx(self._key("flags"), name, flag_to_json(value))
            now = self._wall()
            for kept in self._replica.states():
                pipe.set(
                    self._key("guard", kept.slice),
                    _state_json(kept.model, kept.rule, kept.state),
                    nx=True,
                    ex=int(self._guard_ttl_s),
                )
                pipe.zadd(self._key("guards"), {kept.slice: now})
            for split in self._replica.splits():
                raw = _split_json(split)
                pipe.set(self._key("split", split.parent), raw, nx=True, ex=int(self._guard_ttl_s))
                pipe.zadd(self._key("splits"), {split.parent: now})
            self._audit.reseed(pipe)
            with contextlib.suppress(WatchError):  # another replica re-seeded first
                await pipe.execute()

    async def _commit_proposals(self) -> None:
        for key, t in self._replica.take_proposals().items():
            kept = self._replica.kept(key)
            if kept is None:
                continue
            result = await self._cas(
                keys=[self._key("guard", key), self._key("guards"), self._key("events")],
                args=[
                    t.before.version,
                    _state_json(kept.model, kept.rule, t.after),
                    int(self._guard_ttl_s),
                    self._wall(),
                    key,
                    _event_json(t),
                    self.channel,
                ],
            )
            if result == b"ok":
                self._replica.apply(key, t)
            elif result:
                remote_model, remote_rule, state = _state_from(result)
                self._replica.adopt(key, remote_model, remote_rule, state, self._wall())
            else:
                self._replica.abandon(key)

    async def _commit_splits(self) -> None:
        for parent, split in self._replica.take_split_proposals().items():
            event = {"slice": parent, "at": split.since, "reason": split.why}
            result = await self._cas(
                keys=[self._key("split", parent), self._key("splits"), self._key("split-events")],
                args=[
                    split.version - 1,
                    _split_json(split),
                    int(self._guard_ttl_s),
                    self._wall(),
                    parent,
                    orjson.dumps(event),
                    self.channel,
                ],
            )
            if result == b"ok":
                self._replica.apply_split(split, self._wall())
            elif result:
                self._replica.adopt_split(_split_from(result), self._wall())

    async def _pull_splits(self, now: float) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.zremrangebyscore(self._key("splits"), "-inf", now - self._guard_ttl_s)
        pipe.zrange(self._key("splits"), 0, -1)
        _, parents = await pipe.execute()
        if parents:
            raw = await self._redis.mget([self._key("split", p.decode()) for p in parents])
            for value in raw:
                if value:
                    self._replica.adopt_split(_split_from(value), now)

    async def _push_increments(self, increments: list[Increment]) -> None:
        if not increments:
            return
        pipe = self._redis.pipeline(transaction=False)
        for inc in increments:
            key = self._key("w", inc.slice, inc.epoch, inc.pool)
            for name in _FIELDS:
                value = getattr(inc.counts, name)
                if value:
                    field = f"{inc.start:.3f}|{name}"
                    if isinstance(value, float):
                        pipe.hincrbyfloat(key, field, value)
                    else:
                        pipe.hincrby(key, field, value)
            pipe.expire(key, int(inc.window_s * 2 + 60))
        await pipe.execute()

    async def _pull(self) -> None:
        now = self._wall()
        policy = self._policy()
        pipe = self._redis.pipeline(transaction=True)  # the marker with what it marks
        pipe.exists(self._key("alive"))
        pipe.hgetall(self._key("flags"))
        pipe.zremrangebyscore(self._key("guards"), "-inf", now - self._guard_ttl_s)
        pipe.zrange(self._key("guards"), 0, -1)
        alive, flags, _, guard_keys = await pipe.execute()
        # Redis emptied since this round's re-seed check: its empty flags are no news, and
        # this replica's copy re-seeds it next round
        if alive and not self._pending_flags and not self._flag_pushes:  # else Redis is behind
            self._flags.replace({k.decode(): flag_from_json(v) for k, v in flags.items()})
        if guard_keys:
            raw = await self._redis.mget([self._key("guard", k.decode()) for k in guard_keys])
            for key, value in zip(guard_keys, raw, strict=True):
                if value:
                    model, rule, state = _state_from(value)
                    self._replica.adopt(key.decode(), model, rule, state, now)
        await self._pull_splits(now)
        await self._audit.refresh(self._redis)
        await self._pull_windows(policy, now)

    async def _pull_windows(self, policy: CompiledPolicy, now: float) -> None:
        wanted: list[tuple[str, int, str]] = []
        for active in self._replica.active(now - 300):
            ladder = policy.ladders.get(active.model)
            for pool in ladder.pools if ladder else ():
                wanted.append((active.slice, active.epoch, pool))
        if not wanted:
            return
        pipe = self._redis.pipeline(transaction=False)
        for key, epoch, pool in wanted:
            pipe.hgetall(self._key("w", key, epoch, pool))
        for (key, epoch, pool), fields in zip(wanted, await pipe.execute(), strict=True):
            self._replica.merge_remote(key, epoch, pool, _buckets(fields))

    async def drained(
        self, key: str, add: dict[str, float], first: int | None, last: int | None
    ) -> dict[str, float]:
        """Each replica adds what its read took to one hash; the first and last ``iter``
        ever drained are kept as the least and greatest seen (atomic in Redis), so the
        totals count every iteration once whichever replica read it. While Redis fails, a
        read waits here to be added with the key's next one, and the totals are the last
        Redis gave with what waits added: what the server drained is not lost, and its
        reader goes on."""
        waiting = self._undrained.pop(key, None)
        read: _Drained = (add, first, last)
        if waiting is not None:
            read = _joined(waiting, read)
        try:
            totals = await self._add_drained(key, *read)
        except FAILURES as exc:
            self._failed(exc)
            self._undrained[key] = read
            return tallied(self._drained_seen.get(key, {}), *read)
        self._drained_seen[key] = totals
        return totals

    async def _add_drained(
        self, key: str, add: dict[str, float], first: int | None, last: int | None
    ) -> dict[str, float]:
        name = self._key("drained", key)
        async with self._redis.pipeline(transaction=True) as pipe:
            for field, value in add.items():
                pipe.hincrbyfloat(name, field, value)
            if first is not None:
                pipe.zadd(self._key("drained-first"), {key: first}, lt=True)
            if last is not None:
                pipe.zadd(self._key("drained-last"), {key: last}, gt=True)
            pipe.hgetall(name)
            pipe.zscore(self._key("drained-first"), key)
            pipe.zscore(self._key("drained-last"), key)
            *_, fields, low, high = await pipe.execute()
        totals = {k.decode(): float(v) for k, v in fields.items()}
        return tallied(totals, {}, None if low is None else int(low), _int(high))

    async def events(self, limit: int) -> list[dict[str, Any]]:
        """The guardrail events every replica agreed on, oldest first."""
        if self.degraded:
            return [transition_json(t) for t in list(self._replica.events)[-limit:]]
        try:
            raw = await self._redis.lrange(self._key("events"), 0, limit - 1)
            return [_event_from(r) for r in reversed(raw)]
        except FAILURES as exc:
            self._failed(exc)
            return [transition_json(t) for t in list(self._replica.events)[-limit:]]


def _joined(a: _Drained, b: _Drained) -> _Drained:
    """Two drained reads of one key as one."""
    add = dict(a[0])
    for name, value in b[0].items():
        add[name] = add.get(name, 0.0) + value
    firsts = [n for n in (a[1], b[1]) if n is not None]
    lasts = [n for n in (a[2], b[2]) if n is not None]
    return add, min(firsts, default=None), max(lasts, default=None)


def _event_from(raw: bytes | str) -> dict[str, Any]:
    """A guardrail event as the events list keeps it; ``TypeError`` for anything else."""
    event = orjson.loads(raw)
    if not isinstance(event, dict):
        raise TypeError(f"a guardrail event that is no JSON object: {raw[:80]!r}")
    return event


def _buckets(fields: dict[bytes, bytes]) -> dict[float, Counts]:
    out: dict[float, Counts] = {}
    for field, value in fields.items():
        start, name = field.decode().split("|", 1)
        counts = out.setdefault(float(start), Counts())
        current = getattr(counts, name, None)
        if current is None:
            continue
        setattr(counts, name, float(value) if name in _FLOATS else int(value))
    return out


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
