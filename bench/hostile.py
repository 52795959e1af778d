"""A hostile upstream: an OpenAI-shaped endpoint that misbehaves on purpose, for the fault
suite (``bench/faults.py``) and the tests of hostile upstreams. Plain ``asyncio`` streams,
no HTTP framework, so that it can lie about lengths and speak HTTP/1.0.

The first segment of the request path picks the behaviour, so one server serves every
mode and a pool's endpoint names its mode (``http://127.0.0.1:PORT/html``):

    html        200 ``text/html``: an error page where an answer should be
    sse-text    200 ``text/event-stream`` of events that are not JSON, streaming or not
    endless     a stream (or a whole body, for a non-streaming request) that trickles one
                piece every ``TRICKLE_S`` and never ends
    huge        200 ``application/json`` of ``HUGE_BYTES`` (200 MB), sent as fast as read
    short       200 whose ``Content-Length`` promises ten times the body it sends, then
                holds the connection open for ``HOLD_S``
    http10      an HTTP/1.0 answer without a length, ended by closing: a valid answer
    big-event   a valid stream with one event of ``BIG_EVENT_BYTES`` (10 MB) of content
    429         429 with ``Retry-After: RETRY_AFTER_S`` and an OpenAI error body
    ok          a valid answer, the way the others should have been

Every answer closes its connection (HTTP/1.0's by its nature). ``Hostile.requests`` counts
POST requests per mode. Run alone: ``python -m bench.hostile --port 8199``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

TRICKLE_S = 0.2
HUGE_BYTES = 200 * 1000 * 1000
BIG_EVENT_BYTES = 10 * 1000 * 1000
HOLD_S = 5.0
RETRY_AFTER_S = 7
MODES = ("html", "sse-text", "endless", "huge", "short", "http10", "big-event", "429", "ok")
_HEAD_LIMIT = 64 * 1024


def _chunk(content: str, finish: str | None = None) -> bytes:
    delta = {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "hostile", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": "hostile", "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _whole(content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    body = {"id": "hostile", "object": "chat.completion", "created": int(time.time()),
            "model": "hostile", "choices": [{"index": 0, "message": message,
            "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
            "total_tokens": 2}}  # fmt: skip
    return json.dumps(body).encode()


def _head(status: str, kind: str, length: int | None = None, *extra: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"content-type: {kind}", "connection: close", *extra]
    if length is not None:
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Hostile:
    """The server's behaviours, one coroutine per mode; ``requests`` counts them."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            mode, stream, post = await _request(reader)
            if post:  # not a scrape of /metrics
                self.requests[mode] = self.requests.get(mode, 0) + 1
            await getattr(self, "_" + mode.replace("-", "_"), self._ok)(writer, stream)
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass  # the peer went, or the server is closing
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    async def _ok(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        if stream:
            body = _chunk("Hello") + _chunk(".", "stop") + b"data: [DONE]\n\n"
            writer.write(_head("200 OK", "text/event-stream", len(body)) + body)
        else:
            body = _whole("Hello.")
            writer.write(_head("200 OK", "application/json", len(body)) + body)
        await writer.drain()

    async def _html(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        body = b"<html><body>\n\n<h1>502 Bad Gateway</h1>\n\n</body></html>\n"
        writer.write(_head("200 OK", "text/html", len(body)) + body)
        await writer.drain()

    async def _sse_text(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        body = b"data: hello\n\ndata: world\n\ndata: [DONE]\n\n"
        writer.write(_head("200 OK", "text/event-stream", len(body)) + body)
        await writer.drain()

    async def _endless(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        kind = "text/event-stream" if stream else "application/json"
        writer.write(_head("200 OK", kind, None, "transfer-encoding: chunked"))
        piece = _chunk("x") if stream else b'{"id": "hostile", "pad": "'
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(TRICKLE_S)
            piece = _chunk("x") if stream else b"x"

    async def _huge(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        writer.write(_head("200 OK", "application/json", HUGE_BYTES))
        block = b'{"pad": "' + b"a" * ((1 << 20) - 9)
        sent = 0
        while sent < HUGE_BYTES - 2:
            part = block[: HUGE_BYTES - 2 - sent]
            writer.write(part)
            sent += len(part)
            block = b"a" * (1 << 20)
            await writer.drain()
        writer.write(b'"}')
        await writer.drain()

    async def _short(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        body = _chunk("Hel") if stream else _whole("Hello.")[:40]
        writer.write(_head("200 OK", "application/json", 10 * len(body)) + body)
        await writer.drain()
        await asyncio.sleep(HOLD_S)

    async def _http10(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        kind = "text/event-stream" if stream else "application/json"
        body = _chunk("Hello") + _chunk(".", "stop") + b"data: [DONE]\n\n"
        writer.write(f"HTTP/1.0 200 OK\r\ncontent-type: {kind}\r\n\r\n".encode())
        writer.write(body if stream else _whole("Hello."))
        await writer.drain()

    async def _big_event(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        big = "y" * BIG_EVENT_BYTES
        if stream:
            body = _chunk("Hello") + _chunk(big) + _chunk(".", "stop") + b"data: [DONE]\n\n"
            writer.write(_head("200 OK", "text/event-stream", len(body)) + body)
        else:
            body = _whole(big)
            writer.write(_head("200 OK", "application/json", len(body)) + body)
        await writer.drain()

    async def _429(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        error = {"message": "Rate limit reached; try again later.", "type": "rate_limit_error",
                 "param": None, "code": "rate_limit_exceeded"}  # fmt: skip
        body = json.dumps({"error": error}).encode()
        retry = f"retry-after: {RETRY_AFTER_S}"
        writer.write(_head("429 Too Many Requests", "application/json", len(body), retry) + body)
        await writer.drain()


async def _request(reader: asyncio.StreamReader) -> tuple[str, bool, bool]:
    """The mode the request's path names, whether it asked for a stream, whether a POST."""
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > _HEAD_LIMIT:
        raise ValueError("head too large")
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    try:
        stream = json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        stream = False
    mode = path.strip("/").split("/")[0]
    return (mode if mode in MODES else "ok"), stream, lines[0].startswith("POST ")


async def serve(host: str = "127.0.0.1", port: int = 0) -> tuple[asyncio.Server, Hostile]:
    """Start the server; its port is ``server.sockets[0].getsockname()[1]``."""
    hostile = Hostile()
    server = await asyncio.start_server(hostile.handle, host, port, limit=_HEAD_LIMIT * 2)
    return server, hostile


async def _main(port: int) -> None:
    server, _ = await serve(port=port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8199)
    asyncio.run(_main(parser.parse_args().port))


if __name__ == "__main__":
    main()
