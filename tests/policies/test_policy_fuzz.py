"""Any bytes give a policy or lint errors, never an exception: the hostile files that used
to raise, and hypothesis feeding the loader bytes, text, random YAML and broken policies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.compiled import CompiledPolicy, load_policy
from policies.lint import lint
from policies.load import MAX_BYTES, MAX_DEPTH, MAX_VALUES
from policies.problems import PolicyError

# CPU-bound: one worker runs these one after another, at a lower priority, with time to
# spare (docs/development.md, "Tests in parallel")
pytestmark = [pytest.mark.xdist_group("cpu"), pytest.mark.timeout(600)]

EXAMPLES = sorted((Path(__file__).parents[2] / "policies" / "examples").glob("*.yaml"))
FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VOCABULARY = [
    "version", "pools", "ladder", "ladders", "rules", "name", "start", "match", "kind",
    "model", "endpoints", "num_speculative_tokens", "guardrail", "flags", "slices",
    "temperature", "min", "max", "tools", "tenant", "rollout", "speculative", "standard",
    "spec", "shadow", "timeouts", "discovery", "headers", "response_format", "1", "",
]  # fmt: skip


def outcome(data: str | bytes) -> CompiledPolicy | list[str]:
    """What loading gives: a policy, or the lines of its errors. Anything else fails."""
    report = lint(data, "p.yaml")
    try:
        return load_policy(data, "p.yaml")
    except PolicyError as exc:
        assert report.errors, "load_policy refused a file lint found no error in"
        return [p.render("p.yaml") for p in exc.problems]


def only_error(data: str | bytes) -> str:
    result = outcome(data)
    assert isinstance(result, list) and len(result) == 1, result
    return result[0]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"version: 1\x00\n", "p.yaml:1:11: error: <file>: not valid YAML: character '\\x00'"),
        ("rules:\n  - \x07\n", "p.yaml:2:5: error: <file>: not valid YAML: character '\\x07'"),
        (b"version: 1\npools: \xff\xfe\n", "p.yaml:2:8: error: <file>: not UTF-8 text: byte 0xff"),
        (b"a: " + b"[" * 100_000, f"p.yaml:1:{MAX_DEPTH + 3}: error: <file>: nested deeper"),
        ("a:\n" + "".join("  " * i + "- \n" for i in range(1, 200)), "nested deeper"),
        (b"a: [" + b"1," * (MAX_VALUES + 1) + b"]", f"more than {MAX_VALUES} values"),
        (b"#" * (MAX_BYTES + 1), "the file is larger than"),
    ],
)
def test_hostile_files_are_lint_errors(data: str | bytes, expected: str) -> None:
    assert expected in only_error(data)


def test_an_alias_bomb_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    error = only_error("\n".join(lines))  # ~500 bytes that would expand to 10^9 values
    assert f"expands to more than {MAX_VALUES} values" in error


@pytest.mark.parametrize(
    "value",
    [
        "!!python/object:os.system x",  # a tag a safe loader has no constructor for
        "2020-13-45",  # looks like a date, is not one
        "1" + "0" * 5000,  # an integer Python refuses to convert
    ],
)
def test_values_yaml_cannot_construct_are_placed_errors(value: str) -> None:
    errors = outcome(f"version: {value}\n")
    assert isinstance(errors, list)
    assert any(e.startswith("p.yaml:1:10: error: version: cannot read this value") for e in errors)


def test_a_byte_order_mark_is_fine() -> None:
    assert isinstance(outcome(b"\xef\xbb\xbf" + EXAMPLES[0].read_bytes()), CompiledPolicy)


@FUZZ
@given(st.binary(max_size=2048))
def test_any_bytes(data: bytes) -> None:
    outcome(data)


@FUZZ
@given(st.text(max_size=1024))
def test_any_text(text: str) -> None:
    outcome(text)


def _documents() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(VOCABULARY),
        st.text(max_size=20),
    )
    keys = st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=10), st.integers())
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=6)
        ),
        max_leaves=40,
    )


@FUZZ
@given(_documents())
def test_any_yaml_document(document: Any) -> None:
    outcome(yaml.safe_dump(document, allow_unicode=True))


@FUZZ
@given(
    st.sampled_from(EXAMPLES),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=40),
    st.binary(max_size=40),
)
def test_broken_examples(example: Path, at: int, cut: int, insert: bytes) -> None:
    data = example.read_bytes()
    at %= len(data)
    outcome(data[:at] + insert + data[at + cut :])


@FUZZ
@given(st.sampled_from(EXAMPLES), st.data())
def test_examples_with_a_value_replaced(example: Path, data: st.DataObject) -> None:
    raw = yaml.safe_load(example.read_text())
    node = raw
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node, key=str)))
            if not isinstance(node[key], dict | list) or not node[key]:
                node[key] = data.draw(_documents())
                break
            node = node[key]
        elif isinstance(node, list) and node:
            i = data.draw(st.integers(min_value=0, max_value=len(node) - 1))
            if not isinstance(node[i], dict | list) or not node[i]:
                node[i] = data.draw(_documents())
                break
            node = node[i]
    outcome(yaml.safe_dump(raw, allow_unicode=True))
