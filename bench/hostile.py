"""A hostile upstream: an OpenAI-shaped endpoint that misbehaves on purpose, for the fault
suite (``bench/faults.py``) and the tests of hostile upstreams. Plain ``asyncio`` streams,
no HTTP framework, so that it can lie about lengths and speak HTTP/1.0.

The first segment of the request path picks the behaviour, so one server serves every
mode and a pool's endpoint names its mode (``http://127.0.0.1:PORT/html``). The rest of the
path picks the API its answers are shaped in, valid or not: Anthropic's Messages under
``/v1/messages``, OpenAI's Responses under ``/v1/responses``, chat completions elsewhere.

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


def _named(body: dict[str, object]) -> bytes:
    """One named event, as Messages and Responses streams write them."""
    return f"event: {body['type']}\ndata: ".encode() + json.dumps(body).encode() + b"\n\n"


class Chat:
    """Chat completions: chunks, then ``[DONE]``."""

    def opening(self) -> bytes:
        return b""

    def delta(self, content: str) -> bytes:
        return _chunk(content)

    def ending(self) -> bytes:
        return _chunk(".", "stop") + b"data: [DONE]\n\n"

    def whole(self, content: str) -> bytes:
        return _whole(content)

    def rate_limited(self) -> dict[str, object]:
        return {"error": {"message": "Rate limit reached; try again later.",
                          "type": "rate_limit_error", "param": None,
                          "code": "rate_limit_exceeded"}}  # fmt: skip


class Messages(Chat):
    """Anthropic's Messages: ``message_start`` ... ``message_stop``, no ``[DONE]``."""

    def opening(self) -> bytes:
        usage = {"input_tokens": 1, "output_tokens": 0}
        message: dict[str, object] = {
            "id": "msg_hostile", "type": "message", "role": "assistant", "content": [],
            "model": "hostile", "stop_reason": None, "stop_sequence": None, "usage": usage,
        }  # fmt: skip
        block = {"type": "text", "text": ""}
        return _named({"type": "message_start", "message": message}) + _named(
            {"type": "content_block_start", "index": 0, "content_block": block}
        )

    def delta(self, content: str) -> bytes:
        delta = {"type": "text_delta", "text": content}
        return _named({"type": "content_block_delta", "index": 0, "delta": delta})

    def ending(self) -> bytes:
        stop = {"stop_reason": "end_turn", "stop_sequence": None}
        return (
            self.delta(".")
            + _named({"type": "content_block_stop", "index": 0})
            + _named({"type": "message_delta", "delta": stop, "usage": {"output_tokens": 2}})
            + _named({"type": "message_stop"})
        )

    def whole(self, content: str) -> bytes:
        usage = {"input_tokens": 1, "output_tokens": 1}
        body = {"id": "msg_hostile", "type": "message", "role": "assistant", "model": "hostile",
                "content": [{"type": "text", "text": content}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": usage}  # fmt: skip
        return json.dumps(body).encode()

    def rate_limited(self) -> dict[str, object]:
        error = {"type": "rate_limit_error", "message": "Rate limit reached; try again later."}
        return {"type": "error", "error": error}


class Responses(Chat):
    """OpenAI's Responses: ``response.created`` ... ``response.completed``, no ``[DONE]``."""

    def _response(self, status: str, content: str | None) -> dict[str, object]:
        output = [] if content is None else [
            {"id": "msg_hostile", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": content, "annotations": []}]}
        ]  # fmt: skip
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
        return {"id": "resp_hostile", "object": "response", "created_at": int(time.time()),
                "model": "hostile", "status": status, "output": output,
                "usage": usage if content is not None else None}  # fmt: skip

    def opening(self) -> bytes:
        return _named({"type": "response.created", "response": self._response("in_progress", None)})

    def delta(self, content: str) -> bytes:
        return _named({"type": "response.output_text.delta", "item_id": "msg_hostile",
                       "output_index": 0, "content_index": 0, "delta": content})  # fmt: skip

    def ending(self) -> bytes:
        done = self._response("completed", "Hello.")
        return self.delta(".") + _named({"type": "response.completed", "response": done})

    def whole(self, content: str) -> bytes:
        return json.dumps(self._response("completed", content)).encode()


def api_of(path: str) -> Chat:
    """The API whose shape the answers to ``path`` take."""
    if "/v1/messages" in path:
        return Messages()
    return Responses() if "/v1/responses" in path else Chat()


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
            mode, api, stream, post = await _request(reader)
            if post:  # not a scrape of /metrics
                self.requests[mode] = self.requests.get(mode, 0) + 1
            await getattr(self, "_" + mode.replace("-", "_"), self._ok)(writer, api, stream)
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass  # the peer went, or the server is closing
        finally:
            with contextlib.suppress(OSError):
                writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()  # a reset peer's error is retrieved, not reported

    async def _ok(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        if stream:
            body = api.opening() + api.delta("Hello") + api.ending()
            writer.write(_head("200 OK", "text/event-stream", len(body)) + body)
        else:
            body = api.whole("Hello.")
            writer.write(_head("200 OK", "application/json", len(body)) + body)
        await writer.drain()

    async def _html(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        body = b"<html><body>\n\n<h1>502 Bad Gateway</h1>\n\n</body></html>\n"
        writer.write(_head("200 OK", "text/html", len(body)) + body)
        await writer.drain()

    async def _sse_text(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        body = b"data: hello\n\ndata: world\n\ndata: [DONE]\n\n"
        writer.write(_head("200 OK", "text/event-stream", len(body)) + body)
        await writer.drain()

    async def _endless(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        kind = "text/event-stream" if stream else "application/json"
        writer.write(_head("200 OK", kind, None, "transfer-encoding: chunked"))
        piece = api.opening() + api.delta("x") if stream else b'{"id": "hostile", "pad": "'
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(TRICKLE_S)
            piece = api.delta("x") if stream else b"x"

    async def _huge(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
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

    async def _short(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        body = api.opening() + api.delta("Hel") if stream else api.whole("Hello.")[:40]
        writer.write(_head("200 OK", "application/json", 10 * len(body)) + body)
        await writer.drain()
        await asyncio.sleep(HOLD_S)

    async def _http10(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        kind = "text/event-stream" if stream else "application/json"
        body = api.opening() + api.delta("Hello") + api.ending()
        writer.write(f"HTTP/1.0 200 OK\r\ncontent-type: {kind}\r\n\r\n".encode())
        writer.write(body if stream else api.whole("Hello."))
        await writer.drain()

    async def _big_event(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        big = "y" * BIG_EVENT_BYTES
        if stream:
            body = api.opening() + api.delta("Hello") + api.delta(big) + api.ending()
            writer.write(_head("200 OK", "text/event-stream", len(body)) + body)
        else:
            body = api.whole(big)
            writer.write(_head("200 OK", "application/json", len(body)) + body)
        await writer.drain()

    async def _429(self, writer: asyncio.StreamWriter, api: Chat, stream: bool) -> None:
        body = json.dumps(api.rate_limited()).encode()
        retry = f"retry-after: {RETRY_AFTER_S}"
        writer.write(_head("429 Too Many Requests", "application/json", len(body), retry) + body)
        await writer.drain()


async def _request(reader: asyncio.StreamReader) -> tuple[str, Chat, bool, bool]:
    """The mode the request's path names, the API it speaks, whether it asked for a stream,
    whether a POST."""
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
    post = lines[0].startswith("POST ")
    return (mode if mode in MODES else "ok"), api_of(path), stream, post


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
