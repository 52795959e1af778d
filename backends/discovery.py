"""Endpoint discovery by DNS: one URL naming a headless Service becomes one endpoint per
address it resolves to, so outlier ejection and least-outstanding choice act per server, not per
Service (behind a ClusterIP, kube-proxy picks the pod and keep-alive pins connections).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit, urlunsplit


def with_host(url: str, address: str) -> str:
    """``url`` with its host replaced by ``address`` (bracketed when IPv6)."""
    parts = urlsplit(url)
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def resolve(url: str) -> list[str]:
    """Every address ``url``'s host resolves to, as URLs, sorted; [] when it does not."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return []
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            parts.hostname, parts.port, type=socket.SOCK_STREAM
        )
    except OSError:
        return []
    addresses = sorted({str(info[4][0]) for info in infos})
    return [with_host(url, address) for address in addresses]
