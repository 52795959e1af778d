"""Real servers on loopback for tests: uvicorn in the test's own event loop."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serving(app: ASGIApp, port: int | None = None, **options: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 until the block ends; yields the base URL.
    ``options`` replace uvicorn's (``http``, ``timeout_keep_alive``, ...)."""
    sock = None
    if port is None:  # bound here, so no other process can take the port in between
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    defaults: dict[str, Any] = {
        "log_level": "warning",
        "lifespan": "on",
        "loop": "none",
        "http": "httptools",
        "timeout_graceful_shutdown": 1,
    }
    config = uvicorn.Config(app, host="127.0.0.1", port=port, **{**defaults, **options})
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=None if sock is None else [sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("server did not start")
        await asyncio.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await task
        finally:
            if sock is not None:
                sock.close()


async def wait_healthy(url: str, process: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    """Poll ``url``/healthz until it answers 200; fail at once if ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            assert process.poll() is None, f"the server exited ({process.returncode})"
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} was not healthy within {timeout_s:.0f} s")
