"""Giving memory back to the system after large upstream answers.

A large answer is read in pieces of up to about 1 MiB. Once glibc's malloc has freed a
piece that large, its mmap threshold grows past it, so the next pieces come from the heap,
and what they leave when freed stays with the process for reuse: the gateway's RSS stays
where its largest answers took it (tens of MiB after a few 32 MiB answers cut off at
``max_response_bytes``), though nothing holds the memory. ``malloc_trim(0)`` gives the free
pages of every arena back. ``Trimmer`` calls it once, ``delay_s`` after an answer of at
least ``large`` bytes was done with (its buffers are freed when its request is), and no
more often than that; elsewhere than on glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

LARGE = 4 * 1024 * 1024
DELAY_S = 1.0


def libc_trim() -> Callable[[int], object] | None:
    """glibc's ``malloc_trim``, or None where there is none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], object] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class Trimmer:
    """Trims the heap a moment after large answers (see the module's docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        trim: Callable[[int], object] | None,
        *,
        large: int = LARGE,
        delay_s: float = DELAY_S,
    ) -> None:
        self._loop = loop
        self._trim = trim
        self._large = large
        self._delay_s = delay_s
        self._pending: asyncio.TimerHandle | None = None

    def freed(self, size: int) -> None:
        """An answer of ``size`` body bytes is done with."""
        if size >= self._large and self._trim is not None and self._pending is None:
            self._pending = self._loop.call_later(self._delay_s, self._run)

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def _run(self) -> None:
        self._pending = None
        if self._trim is not None:
            self._trim(0)
