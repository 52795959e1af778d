"""The one way the gateway's Redis-backed state (``redis_store.py``, ``pins.py``,
``prefixes.py``) connects: short timeouts, so that a stalled Redis costs a request at most a
second, and bytes back; and what reading Redis may raise (``FAILURES``)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError

POOL = 64  # connections of a blocking pool

# What a call to Redis and the reading of its reply may raise when Redis is not there, or
# when what answers is no Redis (another protocol on the port, a proxy's error page, a reply
# of another type than the command's): redis-py's own errors and a lost connection, the
# ValueError of its parser for a malformed length, and the errors of reading a reply whose
# shape is not the command's (bytes where a hash was due, JSON that is no state). Each is
# Redis failing: the state falls back on this process's own, never fails a request.
FAILURES: tuple[type[Exception], ...] = (
    RedisError,
    OSError,
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
)


def connect(url: str, password: str | None = None, *, blocking: bool = False) -> aioredis.Redis:
    """A client for ``url``; a password in the URL wins over ``password`` (redis-py's rule
    for ``from_url``). ``blocking``: a burst of callers waits (up to the socket timeout) for
    one of ``POOL`` connections, rather than failing with "Too many connections" past
    redis-py's own bound (100 by default)."""
    options = {
        "password": password,
        "socket_timeout": 1.0,
        "socket_connect_timeout": 1.0,
        "decode_responses": False,
    }
    if not blocking:
        return aioredis.from_url(url, **options)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=POOL, timeout=1.0, **options
    )
    return aioredis.Redis.from_pool(pool)
