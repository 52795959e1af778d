"""The floor for bench/overhead.py: a pass-through proxy on speclane's own stack.

Starlette + uvicorn (uvloop, httptools) in front, one shared aiohttp ``ClientSession``
behind. It forwards the request body and headers as they are, and relays the upstream's
status, headers and body bytes as they arrive: no JSON parsing, no SSE decoding, no policy,
no metrics. Whatever speclane costs on top of this is speclane's own work.

    .venv/bin/python bench/bare_proxy.py --upstream http://127.0.0.1:8101 --port 8090
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="base URL to forward to")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
