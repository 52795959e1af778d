"""Incremental Server-Sent Events decoding: bytes as they arrive -> each event's data.

Only the ``data`` field matters to an OpenAI-style stream; comments, ``event``, ``id`` and
``retry`` are skipped. Payloads stay bytes, so the relay can pass them on without decoding
and re-encoding text. Hand-written because every SSE library we know of decodes to ``str``
per line on top of a particular HTTP client, which costs more than the parse itself.
"""

from __future__ import annotations


class _Blocks:
    """Chunks in, whole event blocks out. An event that arrives in many chunks is kept as its
    chunks until one can end it, so a large event costs its size once, not once per chunk;
    ``buffered`` says how large it has grown."""

    __slots__ = ("_parts", "buffered")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # an event not completed by a blank line yet
        self.buffered = 0

    def _blocks(self, chunk: bytes) -> list[bytes]:
        parts = self._parts
        if b"\r" in chunk or (parts and parts[-1].endswith(b"\r")):
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if parts and b"\n\n" not in chunk and not (chunk[:1] == b"\n" == parts[-1][-1:]):
            parts.append(chunk)  # ends no event
            self.buffered += len(chunk)
            return []
        buffer = b"".join((*parts, chunk)) if parts else chunk
        *blocks, rest = buffer.split(b"\n\n")
        self._parts = [rest] if rest else []
        self.buffered = len(rest)
        return blocks

    @property
    def pending(self) -> bytes:
        """Bytes of an event that has not been completed by a blank line yet."""
        return b"".join(self._parts)


class EventDecoder(_Blocks):
    """Feed it chunks; it returns every event completed so far whole, as its bytes came
    (``event:`` line and all, without the blank line that ends it), for a relay that
    passes events on as they are; an event whose data is ``[DONE]`` comes as ``[DONE]``."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> list[bytes]:
        blocks = self._blocks(chunk)
        return [b"[DONE]" if block == b"data: [DONE]" else block for block in blocks if block]


def data_of(block: bytes) -> bytes | None:
    """The data of one whole event (``EventDecoder``); None when it has none."""
    return _data(block)


class SSEDecoder(_Blocks):
    """Feed it chunks; it returns the data payloads of every event completed so far."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> list[bytes]:
        return [data for block in self._blocks(chunk) if (data := _data(block)) is not None]


def _data(block: bytes) -> bytes | None:
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:]  # the common case: one data line per event
    lines = [_field(line) for line in block.split(b"\n") if line.startswith(b"data")]
    parts = [value for value in lines if value is not None]
    return b"\n".join(parts) if parts else None


def _field(line: bytes) -> bytes | None:
    if line == b"data":
        return b""
    if not line.startswith(b"data:"):
        return None  # a field named e.g. "database" is not "data"
    value = line[5:]
    return value[1:] if value.startswith(b" ") else value
