"""The floor for bench/overhead.py: a pass-through proxy on speclane's own stack.

Starlette + uvicorn (uvloop, httptools) in front, one shared aiohttp ``ClientSession``
behind. It forwards the request body and headers as they are, and relays the upstream's
status, headers and body bytes as they arrive: no JSON parsing, no SSE decoding, no policy,
no metrics. Whatever speclane costs on top of this is speclane's own work.

    .venv/bin/python bench/bare_proxy.py --upstream http://127.0.0.1:8101 --port 8090

``--workers N`` runs N processes on the port through uvicorn's own supervisor, which is
how one would give this proxy more cores.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

# Hop-by-hop and framing headers: each side of the proxy sets its own.
_SKIP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "host",
        "server",
        "date",
    }
)


def create_app(upstream: str, max_connections: int = 1024) -> Starlette:
    """The proxy as an ASGI app; ``upstream`` is a base URL such as http://127.0.0.1:8101."""
    base = upstream.rstrip("/")
    session: aiohttp.ClientSession | None = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal session
        connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=30)
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        try:
            yield
        finally:
            await session.close()

    async def relay(request: Request) -> Response:
        assert session is not None
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k not in _SKIP}
        upstream_response = await session.post(base + request.url.path, data=body, headers=headers)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream_response.content.iter_any():
                    yield chunk
            finally:
                upstream_response.release()

        relayed = {k: v for k, v in upstream_response.headers.items() if k.lower() not in _SKIP}
        return StreamingResponse(chunks(), upstream_response.status, relayed)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/{path:path}", relay, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


_UPSTREAM_VAR = "BARE_PROXY_UPSTREAM"


def app_from_environment() -> Starlette:
    """The app of one of several workers: uvicorn imports them by name, so the upstream
    travels in the environment."""
    return create_app(os.environ[_UPSTREAM_VAR])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="base URL to forward to")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    args = parser.parse_args()
    app: Starlette | str = create_app(args.upstream)
    if args.workers > 1:
        os.environ[_UPSTREAM_VAR] = args.upstream
        app = "bare_proxy:app_from_environment"
    uvicorn.run(
        app,
        factory=args.workers > 1,
        workers=args.workers,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
