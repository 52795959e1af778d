"""/metrics stays bounded however many tenants and tool schemas clients bring: 10,000
tenants, each with tools of its own, through the real classify, decide and record path and
the app's registry, read back with prometheus-client's parser."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway import schema
from gateway.classify import classify
from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.server.app import build_services
from policies.decide import decide
from tests.gateways import policy_yaml, settings

RULES = """
slices: {tool_schemas: 64}
rules:
  - name: tools
    match: {tools: present}
    start: spec
  - name: cold
    match: {temperature: {max: 0.3}}
    start: spec
  - name: default
    start: standard
"""
TENANTS = 10_000
CAP = 40


def request(i: int) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "x" * (i % 7000)}],
        "temperature": (i % 11) / 10,
    }
    if i % 2:
        name = f"tool_{i}"
        parameters = {"type": "object", "properties": {f"field_{i}": {"type": "string"}}}
        body["tools"] = [{"type": "function", "function": {"name": name, "parameters": parameters}}]
    return body


def test_labels_stay_bounded_under_10000_tenants_and_tool_schemas(tmp_path: Path) -> None:
    text = policy_yaml(["http://127.0.0.1:9"], ["http://127.0.0.1:9"], rules=RULES)
    services = build_services(settings(tmp_path, text, metrics_max_slices=CAP))
    policy = services.policy.current
    slices = set()
    for i in range(TENANTS):
        tenant = f"tenant-{i:05d}"
        headers = {"x-speclane-tenant": tenant, "authorization": f"Bearer key-{tenant}"}
        parsed, _ = schema.parse(orjson.dumps(request(i)), schema.ChatRequest)
        features = classify(parsed, "/v1/chat/completions", headers, f"r{i}", services.defaults)
        decision = decide(features, policy, services.flags.values, services.stats.guards, 0.0)
        slices.add(decision.slice)
        labels = Labels(
            "tiny", decision.rule, decision.slice, decision.pool, 4, tenant=features.tenant
        )
        services.feedback.record(
            Outcome(
                labels,
                Status.OK,
                0.0,
                0.5,
                0.05,
                0.01,
                10,
                40,
                20,
                Signal.PER_REQUEST,
                drafted=60,
                accepted=30,
                steps=20,
                admission_s=0.001,
            )
        )
    assert len(slices) > 3 * CAP  # the traffic really has more slices than the cap

    services.telemetry.push()
    exposed = generate_latest(services.telemetry.registry).decode()
    values: dict[str, set[str]] = defaultdict(set)
    series = 0
    for family in text_string_to_metric_families(exposed):
        for sample in family.samples:
            series += 1
            for name, value in sample.labels.items():
                values[name].add(value)
    assert not set(values) & {"tenant", "user", "api_key"}
    assert not any("tenant-" in v or "key-" in v for vs in values.values() for v in vs)
    assert "other" in values["slice"] and len(values["slice"]) <= CAP + 1
    assert values["rule"] <= {"tools", "cold", "default"}
    assert series < 3000, series
