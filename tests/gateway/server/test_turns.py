"""A connection's body is given to the request in turns of the event loop: one read of
many tiny chunks does not hold the loop until it is all framed and parsed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.server.connections import ConnectionLimits, protocol

pytestmark = pytest.mark.anyio

HEAD = b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"


class Transport(asyncio.Transport):
    """What the protocol writes, and whether it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.written = b""
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 80)}.get(name)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return False


async def test_one_read_of_tiny_chunks_is_parsed_over_several_turns():
    got: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        got.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % len(body)})

    config = uvicorn.Config(app, lifespan="off", log_level="error")
    config.load()
    limits = ConnectionLimits(65536, 10.0, 10.0, 100, 100)
    loop = asyncio.get_running_loop()
    bounded = protocol(limits)(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = Transport()
    bounded.connection_made(transport)
    body = bytes(range(256)) * 1000  # 256,000 one-byte chunks: 1.5 MB in one read
    wire = b"".join(b"1\r\n%c\r\n" % byte for byte in body)
    bounded.data_received(HEAD + wire + b"0\r\n\r\n")
    first_turn = len(bounded.cycle.body)
    assert 0 < first_turn < len(body) // 10  # the rest waits for later turns
    assert not transport.reading  # and nothing more is read meanwhile
    for _ in range(1000):
        if got:
            break
        await asyncio.sleep(0)
    assert got == [body]  # every byte, in order
    assert transport.written.startswith(b"HTTP/1.1 200") and b"\r\n256000\r\n" in transport.written
    bounded.connection_lost(None)
