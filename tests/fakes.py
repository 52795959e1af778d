"""A fake OpenAI-compatible upstream that replays real vLLM 0.32 responses.

It answers a streaming request with the captured SSE bodies in ``tests/vllm_fixtures``, one
event per write, and a non-streaming one with the whole answer those events add up to, in as
many writes; it can be told to fail: a status before the first byte, a delay, or a
connection dropped part way. It records every request body it received.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.forward.assemble import Assembler

FIXTURES = Path(__file__).parent / "vllm_fixtures"


def events(name: str) -> list[bytes]:
    """The data payloads of a captured SSE file."""
    text = (FIXTURES / name).read_bytes()
    return [block[6:] for block in text.split(b"\n\n") if block.startswith(b"data: ")]


@dataclass
class Behaviour:
    status: int = 200
    error_body: bytes = b'{"error":{"message":"boom","type":"InternalServerError","code":500}}'
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    die_after: int | None = None
    hang: bool = False


@dataclass
class FakeUpstream:
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    finished: int = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
            ]
        )

    async def _chat(self, request: Request) -> Response:
        return await self._answer(request, "chat-stream-include-usage.sse")

    async def _completions(self, request: Request) -> Response:
        return await self._answer(request, "completions-stream-include-usage.sse")

    async def _answer(self, request: Request, fixture: str) -> Response:
        body = orjson.loads(await request.body())
        self.received.append(body)
        b = self.behaviour
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        if b.status != 200:
            return Response(b.error_body, b.status, media_type="application/json")
        payloads = events(fixture)
        if not body.get("stream"):  # the whole answer, in as many pieces as the stream
            whole = _whole(payloads, chat=fixture.startswith("chat"))
            cut = max(len(whole) // len(payloads), 1)
            pieces = [whole[i : i + cut] for i in range(0, len(whole), cut)]
            return StreamingResponse(self._stream(pieces, b""), media_type="application/json")
        if not (body.get("stream_options") or {}).get("include_usage"):
            payloads = [p for p in payloads if b'"usage"' not in p]
        return StreamingResponse(self._stream(payloads), media_type="text/event-stream")

    async def _stream(self, payloads: list[bytes], framing: bytes = b"data: ") -> Any:
        try:
            for i, data in enumerate(payloads):
                if self.behaviour.die_after is not None and i == self.behaviour.die_after:
                    raise ConnectionAbortedError("fake upstream dies mid-stream")
                if i and self.behaviour.hang:
                    await asyncio.sleep(3600)
                if i and self.behaviour.chunk_delay_s:
                    await asyncio.sleep(self.behaviour.chunk_delay_s)
                yield framing + data + (b"\n\n" if framing else b"")
            self.finished += 1
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def _whole(payloads: list[bytes], chat: bool) -> bytes:
    """The non-streamed answer the stream's events add up to (as vLLM's would)."""
    assembler = Assembler(chat)
    for data in payloads:
        if data != b"[DONE]":
            assembler.add(orjson.loads(data))
    return orjson.dumps(assembler.body())
