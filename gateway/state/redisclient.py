"""The one way the gateway's Redis-backed state (``redis_store.py``, ``pins.py``) connects:
short timeouts, so that a stalled Redis costs a request at most a second, and bytes back."""

from __future__ import annotations

import redis.asyncio as aioredis

POOL = 64  # connections of a blocking pool


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
