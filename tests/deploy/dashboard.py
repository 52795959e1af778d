"""Read deploy/grafana/speclane.json: its PromQL, and the metric and label names in it.

PromQL is not parsed in full; the dashboard's queries are simple enough that removing
strings, label matchers, ranges and grouping clauses leaves only function names, numbers and
metric names. Anything left that is neither a known function nor a speclane, vLLM or
prometheus-client process metric is reported, so a query this reading does not understand
fails loudly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "speclane.json"

PREFIXES = ("speclane_", "vllm:", "process_", "python_")
_FUNCTIONS = """
    sum min max avg count stddev topk bottomk quantile by without on ignoring group_left
    group_right and or unless bool offset rate irate increase delta histogram_quantile
    clamp_min clamp_max abs sort sort_desc label_values vector scalar
    avg_over_time max_over_time min_over_time sum_over_time
"""
FUNCTIONS = frozenset(_FUNCTIONS.split())
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*([^,{]+)(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)")
_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*")


@dataclass(frozen=True, slots=True)
class Query:
    where: str
    expr: str
    metrics: frozenset[str]
    labels: frozenset[str]
    unknown: frozenset[str]


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(PATH.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def read(where: str, expr: str) -> Query:
    labels = {name for block in _MATCHERS.findall(expr) for name in _MATCHER_LABEL.findall(block)}
    rest = _RANGE.sub(" ", _MATCHERS.sub(" ", expr))
    for group in _GROUPING.findall(rest):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    rest = _GROUPING.sub(" ", rest)
    names = set(_IDENTIFIER.findall(rest)) - FUNCTIONS
    metrics = {n for n in names if n.startswith(PREFIXES)}
    return Query(where, expr, frozenset(metrics), frozenset(labels), frozenset(names - metrics))


def queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every panel target and every template variable query."""
    found = [
        read(f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            text = variable["query"]["query"]
            match = _LABEL_VALUES.fullmatch(text.strip())
            assert match, f"variable {variable['name']}: not a label_values() query"
            series = text[text.index("(") + 1 : text.rindex(",")]
            query = read(f"variable {variable['name']}", series)
            found.append(
                Query(query.where, text, query.metrics, query.labels | {match[2]}, query.unknown)
            )
    return found
