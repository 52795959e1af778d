"""Where the commands print: a rich ``Console`` for terminals and pipes alike.

A reader that stops early (``speclane report | head -1``) closes the pipe; rich's default is
to exit with status 1 there. ``console()`` hands the ``BrokenPipeError`` on instead, and
``speclane``'s ``main`` ends the command quietly with status 0: what the reader took is
what it asked for, and files the command writes come before its printing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console


class _PipeConsole(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def console(**options: Any) -> Console:
    """A rich console whose closed pipe raises ``BrokenPipeError`` for ``main`` to end."""
    return _PipeConsole(**options)
