"""Incremental Server-Sent Events decoding: bytes as they arrive -> each event's data.

Only the ``data`` field matters to an OpenAI-style stream; comments, ``event``, ``id`` and
``retry`` are skipped. Payloads stay bytes, so the relay can pass them on without decoding
and re-encoding text. Hand-written because every SSE library we know of decodes to ``str``
per line on top of a particular HTTP client, which costs more than the parse itself.
"""

from __future__ import annotations


class EventDecoder:
    """Feed it chunks; it returns every event completed so far whole, as its bytes came
    (``event:`` line and all, without the blank line that ends it), for a relay that
    passes events on as they are; an event whose data is ``[DONE]`` comes as ``[DONE]``."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\r" in chunk or self._buffer.endswith(b"\r"):
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + chunk if self._buffer else chunk
        *blocks, self._buffer = buffer.split(b"\n\n")
        return [b"[DONE]" if block == b"data: [DONE]" else block for block in blocks if block]

    @property
    def pending(self) -> bytes:
        """Bytes of an event that has not been completed by a blank line yet."""
        return self._buffer


def data_of(block: bytes) -> bytes | None:
    """The data of one whole event (``EventDecoder``); None when it has none."""
    return _data(block)


class SSEDecoder:
    """Feed it chunks; it returns the data payloads of every event completed so far."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\r" in chunk or self._buffer.endswith(b"\r"):
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + chunk if self._buffer else chunk
        *blocks, self._buffer = buffer.split(b"\n\n")
        return [data for block in blocks if (data := _data(block)) is not None]

    @property
    def pending(self) -> bytes:
        """Bytes of an event that has not been completed by a blank line yet."""
        return self._buffer


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
