"""Dependencies point one way: gateway -> policies, backends, and inside gateway/ from the
HTTP surface down to what it stands on. policies/ is pure."""

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


def _module_graph(package: str) -> dict[str, set[str]]:
    """Every module of ``package`` and the package modules it imports, anywhere in its body
    (imports inside functions count: a deferred import is still a dependency)."""
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


@pytest.mark.parametrize("package", ["gateway", "policies", "backends"])
def test_no_import_cycles(package):
    graph = _module_graph(package)
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = trail[trail.index(name) :] + [name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


# gateway/'s own layers, top first. A unit (a sub-package, or a module directly under
# gateway/) imports its own modules and units of lower layers only; the units of the last
# layer, the foundation, may import each other (test_no_import_cycles keeps them acyclic).
GATEWAY_LAYERS: list[set[str]] = [
    {"__main__"},  # the entry point
    {"cli"},  # nothing but the entry point imports the cli
    {"demo"},
    {"replay", "report", "setup"},
    {"server"},  # the HTTP surface: app, routes, admin API
    {"lifespan"},  # startup and shutdown as named steps
    {"pipeline", "lifecycle"},  # the request path; the background work
    {"services"},  # the container of collaborators
    {"forward", "state"},  # to and from the pools; what outlives a request
    {"classify"},  # step 3: a request's features, its API named by the registry
    {"apis"},  # one module per API served, and their registry
    {"measure"},  # outcomes, live stats, metrics, traces
    {"engines"},  # one module per serving engine, and their registry
    {
        "errors",
        "gate",
        "identity",
        "plotting",
        "prompt",
        "schema",
        "settings",
        "tokens",
    },
]
_LAYER = {unit: i for i, layer in enumerate(GATEWAY_LAYERS) for unit in layer}


def _unit(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def test_every_gateway_unit_has_a_layer():
    units = {_unit(name) for name in _module_graph("gateway")} - {"__init__"}
    assert units <= set(_LAYER), f"put {sorted(units - set(_LAYER))} in GATEWAY_LAYERS"


def test_gateway_imports_point_down():
    bottom = len(GATEWAY_LAYERS) - 1
    for name, deps in sorted(_module_graph("gateway").items()):
        src = _unit(name)
        for dep in sorted(deps):
            dst = _unit(dep)
            if dst in (src, "__init__"):
                continue
            down = _LAYER[dst] > _LAYER[src] or _LAYER[src] == _LAYER[dst] == bottom
            assert down, f"{name} imports {dep}: {src} may not import {dst}"
