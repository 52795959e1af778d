"""matplotlib for the PNG charts of ``speclane report`` and ``speclane replay``, loaded only
when a chart is drawn (the gateway never imports it), with the file-only Agg backend."""

from __future__ import annotations

import importlib
from typing import Any


def pyplot() -> Any | None:
    """``matplotlib.pyplot``, or None when matplotlib is not installed."""
    try:
        mpl: Any = importlib.import_module("matplotlib")
    except ImportError:
        return None
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
