"""The one way the gateway's Redis-backed state (``redis_store.py``, ``pins.py``) connects:
short timeouts, so that a stalled Redis costs a request at most a second, and bytes back."""

from __future__ import annotations

import redis.asyncio as aioredis


def connect(url: str, password: str | None = None) -> aioredis.Redis:
    """A client for ``url``; a password in the URL wins over ``password`` (redis-py's rule
    for ``from_url``)."""
    return aioredis.from_url(
        url,
        password=password,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        decode_responses=False,
    )
