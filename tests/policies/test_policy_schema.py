"""The shipped JSON Schema and examples stay in step with the models and with lint."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from policies import model
from policies.lint import lint
from policies.schema import DESCRIPTIONS, describe, json_schema, json_schema_text, walk

POLICIES = Path(__file__).parents[2] / "policies"
EXAMPLES = sorted((POLICIES / "examples").glob("*.yaml"))


def test_shipped_schema_is_current() -> None:
    shipped = (POLICIES / "policy.schema.json").read_text()
    assert shipped == json_schema_text(), (
        "policies/policy.schema.json is out of date with policies/model.py; regenerate it with\n"
        "  .venv/bin/python -m gateway.cli.policy schema > policies/policy.schema.json"
    )


def _models() -> list[type[BaseModel]]:
    return [
        value
        for value in vars(model).values()
        if isinstance(value, type)
        and issubclass(value, BaseModel)
        and value.__module__ == model.__name__
        and not value.__name__.startswith("_")
    ]


@pytest.mark.parametrize("cls", _models(), ids=lambda cls: cls.__name__)
def test_every_key_has_a_description(cls: type[BaseModel]) -> None:
    table = DESCRIPTIONS.get(cls, {})
    bare = [k for k, f in cls.model_fields.items() if not (f.description or k in table)]
    assert bare == [], f"give {cls.__name__}.{bare} a Field(description=...) or a line in schema.py"
    assert set(table) <= set(cls.model_fields), "schema.py describes keys the model lacks"


def test_schema_names_the_dialect_and_describes_keys() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    rule = schema["$defs"]["Rule"]["properties"]["start"]
    assert rule["description"].startswith("the ladder rung this traffic starts on")


@pytest.mark.parametrize(
    ("loc", "words"),
    [
        (("rules", 0, "match", "tools"), "'present', 'absent' or {names: [...]}"),
        (("pools", "x", "kind"), "'speculative' or 'standard'"),
        (("rules", 0, "match", "endpoint"), "a list of a string"),
        (("version",), "1"),
        (("slices",), "{temperature: [...], context_tokens: [...], tool_schemas: ..., ...}"),
    ],
)
def test_expected_values_in_words(loc: tuple[str | int, ...], words: str) -> None:
    assert describe(walk(loc).expected) == words


def test_walk_follows_union_members() -> None:
    place = walk(("rules", 3, "match", "tools", "ToolNames", "names"))
    assert place.path == ("rules", 3, "match", "tools", "names")
    assert place.union_at == ("rules", 3, "match", "tools")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_lint_clean(path: Path) -> None:
    text = path.read_text()
    assert lint(text, path.name).lines() == []
    assert text.startswith("# yaml-language-server: $schema=../policy.schema.json\n")


def test_there_are_four_examples() -> None:
    assert [p.name for p in EXAMPLES] == [
        "conservative-rollout.yaml",
        "pilot.yaml",
        "starter.yaml",
        "trainium-k7-k3.yaml",
        "trainium2-qwen3-32b-k7.yaml",
    ]
