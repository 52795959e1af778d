"""Engines in the policy: what each lets speclane see, and the guardrail modes lint refuses."""

from __future__ import annotations

import pytest

from policies.engines import describe, signals
from policies.lint import lint
from policies.model import Pool

POLICY = """\
version: 1
pools:
  spec:
    kind: speculative
    model: qwen3-32b
    num_speculative_tokens: 7
    endpoints: [http://spec:8000]
    engine: {engine}
    method: {method}
  standard: {{kind: standard, model: qwen3-32b, endpoints: [http://std:8000], engine: {engine}}}
ladder: [spec, standard]
guardrail: {{mode: {mode}, min_samples: 30}}
rules:
  - name: default
    start: spec
"""


def report(engine: str, mode: str = "economic", method: str = "draft_model"):  # type: ignore[no-untyped-def]
    return lint(POLICY.format(engine=engine, mode=mode, method=method), "p.yaml")


@pytest.mark.parametrize("engine", ["vllm-neuron"])
def test_threshold_mode_is_refused_where_the_engine_reports_no_drafts(engine: str) -> None:
    found = report(engine, mode="threshold", method="eagle")
    (problem,) = [p for p in found.errors if p.code == "engine-threshold"]
    assert (problem.line, problem.column) == (12, 19)  # the mode's own place
    assert f"pool 'spec' (engine {engine}) never reports" in problem.message
    assert "economic" in problem.hint
    assert found.policy is not None  # the file parses; it just cannot run


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_threshold_mode_stays_where_drafts_are_visible(engine: str) -> None:
    assert not report(engine, mode="threshold").errors


def test_a_rule_override_is_blamed_at_the_rule() -> None:
    text = POLICY.format(engine="vllm-neuron", mode="economic", method="eagle")
    text += "    guardrail: {mode: threshold}\n"
    (problem,) = lint(text, "p.yaml").errors
    assert problem.path == ("rules", 0, "guardrail", "mode")
    assert problem.line == 16


def test_a_method_the_engine_does_not_run_is_a_warning() -> None:
    found = report("vllm-neuron", method="ngram")
    assert not found.errors
    (warning,) = found.warnings
    assert warning.path == ("pools", "spec", "method")
    assert "draft_model, eagle" in warning.hint


def test_a_standard_pool_has_no_method() -> None:
    text = POLICY.format(engine="vllm", mode="economic", method="ngram")
    text = text.replace("engine: vllm}", "engine: vllm, method: ngram}")
    assert any("no speculation method" in p.message for p in lint(text, "p.yaml").errors)


def pool(engine: str, **extra: object) -> Pool:
    return Pool.model_validate(
        {
            "kind": "speculative",
            "model": "m",
            "num_speculative_tokens": 4,
            "endpoints": ["http://a"],
            "engine": engine,
            **extra,
        }
    )


def test_each_engine_says_which_signal_it_gives() -> None:
    assert signals(pool("vllm")) == ("per_request", "chunks", "speed")
    assert signals(pool("vllm-neuron")) == ("chunks", "speed")
    assert signals(pool("sglang")) == ("per_request", "chunks", "speed")
    assert signals(pool("trtllm")) == ("per_request", "chunks", "speed")
    assert signals(pool("vllm-neuron", chunk_acceptance=False)) == ("speed",)
    shown = describe(pool("trtllm", method="eagle3"))
    assert shown["signal"] == "per_request"
    assert shown["per_request_field"] == "choices[].avg_decoded_tokens_per_iter"
    assert shown["method"] == "eagle3" and shown["drafts_visible"] is True
    assert describe(pool("vllm-neuron"))["drafts_visible"] is False


def test_an_engine_of_a_gateways_own_is_taken_with_a_warning() -> None:
    found = report("tiny", mode="threshold")
    assert not found.errors  # nothing known of its drafts: nothing to refuse
    unknown = [w for w in found.warnings if w.code == "engine-unknown"]
    assert [w.path for w in unknown] == [
        ("pools", "spec", "engine"),
        ("pools", "standard", "engine"),
    ]
    assert "registered" in unknown[0].hint
    assert describe(pool("tiny"))["per_request_field"] is None


@pytest.mark.parametrize("name", ["Tiny", "ti ny", "", "-x"])
def test_an_engine_name_is_lowercase_and_one_word(name: str) -> None:
    assert report(name).policy is None
