"""backends/sim imports neither gateway/ nor policies/, and its pure modules do no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import backends.sim

PACKAGE = Path(backends.sim.__file__).parent
PURE = {
    "model",
    "workload",
    "virtual",
    "text",
    "responses",
    "validation",
    "config",
    "protocol",
    "schema_check",
    "logprobs",
    "pacing",
    "api_messages",
    "api_responses",
    "agents",
}
IO = {"asyncio", "socket", "time", "httpx", "aiohttp", "uvicorn", "starlette", "os"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.stem)
def test_no_upward_imports(path: Path) -> None:
    roots = {name.split(".")[0] for name in imports(path)}
    assert not roots & {"gateway", "policies"}
    if path.stem in PURE:
        assert not roots & IO, f"{path.stem} is pure but imports {roots & IO}"
