"""How ``local-vllm`` runs a long step: say what it does, run it with its output in a log,
and say how long it took; on failure the error carries the log's tail."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class StepError(RuntimeError):
    """A step failed; the message says which and ends with the tail of its log."""


def say(message: str) -> None:
    sys.stderr.write(f"local-vllm: {message}\n")
    sys.stderr.flush()


@contextmanager
def step(what: str, quiet: bool = False) -> Iterator[None]:
    """Announce ``what`` (unless ``quiet``), then report its duration when it ends."""
    if not quiet:
        say(f"{what} ...")
    started = time.monotonic()
    yield
    say(f"{what}: done in {time.monotonic() - started:.1f} s")


def run(argv: Sequence[str | Path], log: Path, env: dict[str, str] | None = None) -> None:
    """Run ``argv`` with stdout and stderr appended to ``log``; raise ``StepError`` on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"$ {' '.join(str(a) for a in argv)}\n".encode())
        out.flush()
        code = subprocess.call(
            [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env
        )
    if code != 0:
        raise StepError(f"{Path(str(argv[0])).name} exited with {code}\n{tail(log)}")


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
