"""The pilot report names the parent of a slice split by application, right after it."""

from __future__ import annotations

from rich.console import Console

from gateway.report.render import show
from gateway.report.stats import build

PARENT = "default / t<=0.3 / ctx4k-16k"


def record(slice_key: str, pool: str) -> dict[str, object]:
    return {
        "slice": slice_key,
        "pool": pool,
        "status": "ok",
        "completion_tokens": 10,
        "duration_s": 1.0,
    }


def test_children_follow_their_parent_and_name_it() -> None:
    records = [record(f"{PARENT} / app:2", "standard"), record(PARENT, "spec")]
    records += [record(f"{PARENT} / app:1", "spec"), record("other / t*", "spec")]
    console = Console(record=True, width=200)
    show(console, build(records))
    text = console.export_text()
    keys = (PARENT, f"{PARENT} / app:1", f"{PARENT} / app:2", "other / t*")
    at = [text.index(key + " ") for key in keys]
    assert at == sorted(at)
    assert text.count(f"split by application from {PARENT}\n") == 2
