"""What classification and the policy decision cost per request (steps 3 and 4).

    .venv/bin/python bench/decide.py [--iterations 200000]

1. ``classify`` + ``decide`` per request for a realistic 50-rule policy (45 tenant- and
   product-specific rules, then five general rules), over a mix of chat requests:
   JSON output, tool calls, long prompts, creative text, plain chat. Parsing (step 2) is
   measured on its own and not included.
2. The matcher curve: the bitset ``Matcher.first`` and the linear reference loop, for 10,
   100 and 1,000 rules, over the same request mix.

Each call is timed alone with ``time.perf_counter_ns`` (the timer's own cost, measured and
printed, is included); the report gives the median and the 99th percentile in microseconds.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gateway import schema
from gateway.classify import Defaults, classify
from policies.compiled import CompiledPolicy, compile_policy, load_policy
from policies.decide import decide
from policies.features import Features
from policies.flags import merged
from policies.model import PolicyFile

HEAD = """\
version: 1
pools:
  spec-k7: {kind: speculative, model: qwen3-32b, num_speculative_tokens: 7, endpoints: ['http://a:1']}
  spec-k3: {kind: speculative, model: qwen3-32b, num_speculative_tokens: 3, endpoints: ['http://b:1']}
  standard: {kind: standard, model: qwen3-32b, endpoints: ['http://c:1', 'http://d:1']}
ladder: [spec-k7, spec-k3, standard]
flags:
  spec-structured: {enabled: true, rollout: 50}
rules:
"""
DESIGN_RULES = """\
  - {name: structured-json, match: {response_format: [json_object, json_schema], temperature: {max: 0.3}}, start: spec-k7, flag: spec-structured}
  - {name: tool-calls, match: {tools: present}, start: spec-k3, guardrail: {min_acceptance: 0.6, recover_above: 0.66}}
  - {name: long-context, match: {context_tokens: {min: 16000}}, start: standard}
  - {name: creative, match: {temperature: {min: 0.9}}, start: shadow, shadow_fraction: 0.05}
  - {name: default, start: spec-k3}
"""  # noqa: E501


def specific_rule(i: int) -> str:
    """One of four shapes of tenant- or product-specific rule, unique by ``i``."""
    shape = i % 4
    if shape == 0:
        match = f"{{tenant: [tenant-{i}], response_format: [json_schema]}}"
    elif shape == 1:
        match = f"{{tools: {{names: [tool_{i}, lookup_{i}]}}, temperature: {{max: 0.7}}}}"
    elif shape == 2:
        match = f"{{headers: {{x-speclane-product: product-{i}}}, stream: true}}"
    else:
        match = f"{{tenant: [tenant-{i}], context_tokens: {{min: 1000, max: 8000}}}}"
    start = ("spec-k7", "spec-k3", "standard")[i % 3]
    return f"  - {{name: rule-{i}, match: {match}, start: {start}}}\n"


def policy_text(rules: int) -> str:
    return HEAD + "".join(specific_rule(i) for i in range(rules - 5)) + DESIGN_RULES


def requests(rules: int) -> list[tuple[schema.AnyRequest, dict[str, str]]]:
    """A request mix: about a third hit a specific rule, the rest the five generic ones."""
    prose = "Summarise the quarterly report in three bullet points. " * 6
    long_doc = "The committee reviewed the findings and agreed on next steps. " * 1200
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    bodies: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"temperature": 0.1, "response_format": {"type": "json_object"}}, {}),
        ({"temperature": 0.2, "tools": [tool]}, {}),
        ({"temperature": 0.7}, {}),
        ({"temperature": 1.0, "stream": True}, {}),
        ({"temperature": 0.3, "messages": [{"role": "user", "content": long_doc}]}, {}),
    ]
    for i in range(0, rules - 5, max(1, (rules - 5) // 8)):
        bodies.append(
            (
                {"temperature": 0.2, "response_format": {"type": "json_schema"}, "stream": True},
                {"x-speclane-tenant": f"tenant-{i}", "x-speclane-product": f"product-{i}"},
            )
        )
    out = []
    for extra, headers in bodies:
        body = {"model": "qwen3-32b", "messages": [{"role": "user", "content": prose}], **extra}
        parsed, _ = schema.parse(orjson.dumps(body), "chat")
        out.append((parsed, headers))
    return out


def timed(call: Callable[[int], object], n: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = [0] * n
    gc.disable()
    try:
        for i in range(n):
            start = clock()
            call(i)
            samples[i] = clock() - start
    finally:
        gc.enable()
    return samples


def summary(samples: Sequence[int]) -> str:
    ordered = sorted(samples)
    median = statistics.median(ordered) / 1000
    p99 = ordered[int(len(ordered) * 0.99)] / 1000
    return f"median {median:6.2f} µs   p99 {p99:6.2f} µs"


def pipeline(policy: CompiledPolicy, n: int) -> None:
    mix = requests(len(policy.rules))
    defaults = Defaults()
    flags = merged(policy.file.flags, {})
    path = "/v1/chat/completions"

    def both(i: int) -> object:
        parsed, headers = mix[i % len(mix)]
        features = classify(parsed, path, headers, f"req-{i}", defaults)
        return decide(features, policy, flags, {}, 0.0)

    def only_classify(i: int) -> object:
        parsed, headers = mix[i % len(mix)]
        return classify(parsed, path, headers, f"req-{i}", defaults)

    features = [classify(p, path, h, f"req-{i}", defaults) for i, (p, h) in enumerate(mix)]

    def only_decide(i: int) -> object:
        return decide(features[i % len(features)], policy, flags, {}, 0.0)

    bodies = [orjson.dumps(p.model_dump(exclude_none=True)) for p, _ in mix]

    def only_parse(i: int) -> object:
        return schema.parse(bodies[i % len(bodies)], "chat")

    print(f"{len(policy.rules)}-rule policy, {len(mix)} request shapes, {n} calls each")
    for name, call in [
        ("classify + decide", both),
        ("  classify", only_classify),
        ("  decide", only_decide),
        ("parse (step 2, not included above)", only_parse),
    ]:
        timed(call, n // 10)  # warm up
        print(f"  {name:36s} {summary(timed(call, n))}")


def matcher_curve(n: int) -> None:
    print(f"matcher, {n} calls each (first matching rule; linear loop vs bitset)")
    defaults = Defaults()
    for size in (10, 100, 1000):
        policy = compile_policy(PolicyFile.model_validate(_yaml(policy_text(size))))
        mix = requests(size)
        features: list[Features] = [
            classify(p, "/v1/chat/completions", h, f"r{i}", defaults)
            for i, (p, h) in enumerate(mix)
        ]
        matcher = policy.matcher
        assert all(matcher.first(f) == matcher.first_linear(f) for f in features)
        linear = timed(_cycle(matcher.first_linear, features), n)
        bitset = timed(_cycle(matcher.first, features), n)
        print(f"  {size:5d} rules  linear {summary(linear)}   bitset {summary(bitset)}")


def _cycle(find: Callable[[Features], int], features: list[Features]) -> Callable[[int], int]:
    return lambda i: find(features[i % len(features)])


def _yaml(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200_000)
    n = parser.parse_args().iterations
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"timer overhead: {summary(timed(lambda i: None, n))}")
    policy = load_policy(policy_text(50), "bench-50-rules.yaml")  # lints clean
    pipeline(policy, n)
    matcher_curve(n // 4)


if __name__ == "__main__":
    main()
