"""Where one HTTP/1.1 request ends in the bytes a connection reads. Pure, no I/O.

The parser (httptools) is told the bytes only after these have said where a head, a body and
a chunked body's trailer end, so that the connection bounds in ``connections.py`` count every
byte that is not body against the head limit exactly, also when one read holds the end of one
request and the start of the next. These scanners do not validate: the parser does, and a
request it rejects is a 400 whatever they found.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

CRLF = b"\r\n"
BLANK_LINE = b"\r\n\r\n"
# What a chunk's size line may take without counting against the head limit: 16 hex digits
# (any size the parser takes) and its line end; extensions beyond that count.
SIZE_LINE = 16 + len(CRLF)
_PLAIN_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})\r\n")  # no extension: all of it allowed


def _tiny_chunks() -> re.Pattern[bytes]:
    """A run of whole chunks of 1 to 15 bytes with plain size lines, matched in one call:
    their framing is most of their bytes, so they are skipped at C speed, and a chunk the
    scanner steps over in Python carries at least 16 bytes of data."""
    sizes = (f"{f'[{n:x}{n:X}]' if n > 9 else n}\r\n.{{{n}}}\r\n" for n in range(1, 16))
    return re.compile(f"(?:{'|'.join(sizes)})+".encode(), re.DOTALL)


_TINY_CHUNKS = _tiny_chunks()


class HeadEnd:
    """Finds the blank line that ends a head, across reads."""

    def __init__(self) -> None:
        self._tail = b""

    def end(self, data: bytes) -> int | None:
        """The offset just past the head's end in ``data``, or None when it is not there."""
        tail, keep = self._tail, len(BLANK_LINE) - 1
        found = (tail + data[:keep]).find(BLANK_LINE) if tail else -1
        if found >= 0:  # the blank line began in an earlier read
            self._tail = b""
            return found + len(BLANK_LINE) - len(tail)
        found = data.find(BLANK_LINE)
        if found >= 0:
            self._tail = b""
            return found + len(BLANK_LINE)
        self._tail = (tail + data)[-keep:] if len(data) < keep else data[-keep:]
        return None


class Body:
    """Where a body ends, and how many of its bytes are not data (``extra``): chunk
    extensions and framing beyond ``CHUNK_FRAMING``, and a chunked body's trailer."""

    extra = 0

    def take(self, data: bytes) -> tuple[int, bool]:
        """How many bytes of ``data`` belong to this body, and whether it ended there."""
        raise NotImplementedError


class Sized(Body):
    """A body of ``Content-Length`` bytes."""

    def __init__(self, length: int) -> None:
        self._left = length

    def take(self, data: bytes) -> tuple[int, bool]:
        taken = min(len(data), self._left)
        self._left -= taken
        return taken, self._left == 0


class Chunked(Body):
    """A ``Transfer-Encoding: chunked`` body: chunks, the last (size 0) one, a trailer."""

    def __init__(self) -> None:
        self.extra = 0
        self._line = b""  # the start of the size line read so far (enough for its size)
        self._line_len = 0  # and its length
        self._data = 0  # data bytes of the current chunk still to come
        self._crlf = 0  # line-end bytes after the current chunk's data still to come
        self._trailer: HeadEnd | None = None  # set once the last chunk's size line is read

    def take(self, data: bytes) -> tuple[int, bool]:
        at, end = 0, len(data)
        while at < end:
            if self._trailer is not None:
                return self._take_trailer(data, at)
            if self._data or self._crlf:
                step = min(self._data + self._crlf, end - at)
                from_data = min(step, self._data)
                self._data -= from_data
                self._crlf -= step - from_data
                at += step
            elif not self._line and (tiny := _TINY_CHUNKS.match(data, at)) is not None:
                at = tiny.end()
            elif not self._line and (plain := _PLAIN_SIZE_LINE.match(data, at)) is not None:
                # the usual size line, whole in this read: one match, nothing extra to count
                size, at = int(plain.group(1), 16), plain.end()
                if size and at + size + len(CRLF) <= end:
                    at += size + len(CRLF)  # and the chunk's data with it
                elif size:
                    self._data, self._crlf = size, len(CRLF)
                else:
                    self._last_chunk()
            else:
                at = self._take_size_line(data, at)
        return at, False

    def _take_size_line(self, data: bytes, at: int) -> int:
        if self._line.endswith(b"\r") and data[at : at + 1] == b"\n":
            stop = at + 1  # the line end came split over two reads
        else:
            end = data.find(CRLF, at)
            stop = len(data) if end < 0 else end + len(CRLF)
        self._grow(data[at:stop])
        if not self._line.endswith(CRLF):
            return stop
        size = _chunk_size(self._line)
        self._line, self._line_len = b"", 0
        if size == 0:
            self._last_chunk()
        else:
            self._data, self._crlf = size, len(CRLF)
        return stop

    def _last_chunk(self) -> None:
        self._trailer = HeadEnd()
        self._trailer.end(CRLF)  # the size line's own line end may end an empty trailer

    def _grow(self, part: bytes) -> None:
        before = max(0, self._line_len - SIZE_LINE)
        self._line_len += len(part)
        self.extra += max(0, self._line_len - SIZE_LINE) - before
        if len(self._line) + len(part) <= SIZE_LINE:
            self._line += part
        else:  # enough of its start for the size, and how it ends
            self._line = (self._line + part[: SIZE_LINE - 2])[: SIZE_LINE - 2] + part[-2:]

    def _take_trailer(self, data: bytes, at: int) -> tuple[int, bool]:
        assert self._trailer is not None
        end = self._trailer.end(data[at:])
        taken = len(data) - at if end is None else end
        self.extra += taken
        return at + taken, end is not None


def _chunk_size(line: bytes) -> int:
    """The size a chunk's size line gives; one the parser will reject counts as the last."""
    digits = line.split(b";", 1)[0].strip()
    try:
        return int(digits, 16)
    except ValueError:
        return 0


def body_of(headers: Iterable[tuple[bytes, bytes]]) -> Body | None:
    """The framing of a request body by its (lower-cased) headers; None when it has none."""
    length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return Chunked()
        if name == b"content-length":
            length = int(value) if value.strip().isdigit() else None
    return Sized(length) if length else None
