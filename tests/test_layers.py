"""Dependencies point one way: gateway -> policies, backends. policies/ is pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
IO = {"httpx", "aiohttp", "redis", "starlette", "uvicorn", "socket", "asyncio", "subprocess"}
FORBIDDEN = {
    "policies": {"gateway", "backends"} | IO,
    "backends": {"gateway", "policies"},
}
CLOCKS = {"time", "monotonic", "perf_counter", "now", "sleep"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imports(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_policies_never_read_the_clock():
    for path in sorted((ROOT / "policies").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            reads = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"time", "datetime"}
                and node.attr in CLOCKS
            )
            if reads:
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} reads the clock")
