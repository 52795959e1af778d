"""Writing a policy draft to the file the gateway reloads from, all at once or not at all.

The draft goes to a temporary file beside the target and is renamed over it
(``os.replace``), so the file watch and other replicas sharing the file never read half a
policy. A symlinked file (a Kubernetes ConfigMap mount links ``policy.yaml`` into
``..data/``) is resolved first, so the link stays a link. Where the file or its directory
cannot be written (a ConfigMap or Secret mount is read-only; a file owned by another user),
``PolicyReadOnly`` says why and nothing changes: the draft then has to reach the file where
it comes from (``kubectl apply``, GitOps), and the gateway reloads it when the mount updates.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


class PolicyReadOnly(Exception):
    """The policy file cannot be replaced here; the message says why."""


def unwritable(path: Path) -> str | None:
    """Why ``path`` could not be replaced, or None when it looks writable (a guess: the
    write itself is the only proof)."""
    target = path.resolve()
    folder = target.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is read-only (a ConfigMap or Secret mount is)"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{target} is read-only"
    return None


def replace_text(path: Path, text: str) -> None:
    """Replace the file's content with ``text`` in one rename, keeping its permissions."""
    target = path.resolve()
    why = unwritable(path)
    if why is not None:
        raise PolicyReadOnly(why)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise PolicyReadOnly(f"cannot write beside {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise PolicyReadOnly(f"cannot replace {target}: {exc.strerror or exc}") from None
