"""Lint: each kind of problem, with its exact message, position and hint."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import pytest
import yaml

from policies.compiled import load_policy
from policies.lint import lint
from policies.load import parse
from policies.problems import PolicyError, Severity

EXAMPLES = Path(__file__).parents[2] / "policies" / "examples"
HEAD = """\
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ['http://s:8000']}
  standard: {kind: standard, model: m, endpoints: ['http://d:8000']}
ladder: [spec, standard]
rules:
"""
DEFAULT = "- {name: default, start: spec}\n"


def rules(text: str, *, default: bool = True) -> str:
    """The one-model head (rules: on line 6) with these rules from line 7."""
    return HEAD + textwrap.dedent(text).strip("\n") + "\n" + (DEFAULT if default else "")


def lines(text: str) -> list[str]:
    return lint(text, "p.yaml").lines()


CASES = {
    "unknown key, did you mean": (
        rules("- {name: a, start: spec, match: {temperatur: {max: 0.3}}}"),
        [
            "p.yaml:7:34: error: rules.0.match.temperatur: unknown key 'temperatur' "
            "(hint: did you mean 'temperature'?)"
        ],
    ),
    "unknown key, no close match": (
        rules("- {name: a, start: spec, priority: 3}"),
        [
            "p.yaml:7:26: error: rules.0.priority: unknown key 'priority' (hint: allowed keys: "
            "description, experiment, flag, guardrail, match, name, rollout, shadow_fraction, "
            "shadow_to, start)"
        ],
    ),
    "union collapsed to one message": (
        rules("- {name: a, start: spec, match: {tools: sometimes}}"),
        [
            "p.yaml:7:41: error: rules.0.match.tools: expected 'present', 'absent' or "
            "{names: [...]}, got 'sometimes'"
        ],
    ),
    "union member chosen by shape": (
        rules("- {name: a, start: spec, match: {tools: {nams: [x]}}}"),
        [
            "p.yaml:7:42: error: rules.0.match.tools.nams: unknown key 'nams' "
            "(hint: did you mean 'names'?)"
        ],
    ),
    "wrong type": (
        rules("- {name: a, start: spec, match: {temperature: hot}}"),
        ["p.yaml:7:47: error: rules.0.match.temperature: expected {min: ..., max: ...}, got 'hot'"],
    ),
    "bad enum value": (
        rules("- {name: a, start: spec, match: {response_format: [jsonschema]}}"),
        [
            "p.yaml:7:52: error: rules.0.match.response_format.0: expected 'text', "
            "'json_object' or 'json_schema', got 'jsonschema' (hint: did you mean 'json_schema'?)"
        ],
    ),
    "out of bounds": (
        rules("- {name: a, start: spec, guardrail: {min_acceptance: 1.5}}"),
        ["p.yaml:7:54: error: rules.0.guardrail.min_acceptance: must be <= 1.0, got 1.5"],
    ),
    "missing key": (
        rules("- {name: a}"),
        [
            "p.yaml:7:3: error: rules.0.start: missing required key 'start' (hint: the ladder "
            "rung this traffic starts on: a pool, 'standard' or 'shadow')"
        ],
    ),
    "misspelt required key is one problem": (
        rules("- {name: a, strat: spec}"),
        ["p.yaml:7:13: error: rules.0.strat: unknown key 'strat' (hint: did you mean 'start'?)"],
    ),
    "empty range": (
        rules("- {name: a, start: spec, match: {temperature: {min: 0.9, max: 0.3}}}"),
        [
            "p.yaml:7:47: error: rules.0.match.temperature: empty range: min 0.9 > max 0.3 "
            "(hint: swap min and max)"
        ],
    ),
    "a range no request reaches": (
        rules("- {name: a, start: spec, match: {temperature: {min: 9}, top_p: {max: 1.5}}}"),
        [
            "p.yaml:7:53: error: rules.0.match.temperature.min: temperature min 9 is out of "
            "range: a request's temperature is 0 to 2 (hint: give a value 0 to 2)",
            "p.yaml:7:70: error: rules.0.match.top_p.max: top_p max 1.5 is out of range: a "
            "request's top_p is 0 to 1 (hint: give a value 0 to 1)",
        ],
    ),
    "a band edge no request reaches": (
        HEAD.replace("rules:\n", "slices: {temperature: [0.3, 9]}\nrules:\n") + DEFAULT,
        [
            "p.yaml:6:29: error: slices.temperature.1: band edge 9 is out of range: a "
            "temperature edge is 0 to 2 (hint: give edges 0 to 2)"
        ],
    ),
    "a partial rollout where no tenant has a key": (
        rules("- {name: a, start: spec, rollout: 50, match: {stream: true}}"),
        [
            "p.yaml:7:35: warning: rules.0.rollout: a 50% rollout draws from tenants, and no "
            "tenant here has api_keys: every request is anonymous and outside it (hint: give "
            "tenants api_keys, or set SPECLANE_TRUSTED_TENANT_HEADER where a proxy names them)"
        ],
    ),
    "start is not a pool": (
        rules("- {name: a, start: spec-k9, match: {stream: true}}"),
        [
            "p.yaml:7:20: error: rules.0.start: start 'spec-k9' is not a pool "
            "(hint: use one of ['shadow', 'spec', 'standard'])"
        ],
    ),
    "start pool is not on the ladder": (
        rules("- {name: a, start: spare, match: {stream: true}}").replace(
            "ladder:", "  spare: {kind: standard, model: m, endpoints: ['http://e:1']}\nladder:"
        ),
        [
            "p.yaml:8:20: error: rules.0.start: start 'spare' is not a pool on a ladder "
            "(hint: use one of ['shadow', 'spec', 'standard'])"
        ],
    ),
    "a guardrail that would flap": (
        rules("- {name: a, start: spec, guardrail: {recover_above: 0.5}, match: {stream: true}}"),
        [
            "p.yaml:7:37: error: rules.0.guardrail: recover_above 0.5 is below min_acceptance "
            "0.55: the slice would flap (hint: set recover_above a little above min_acceptance)"
        ],
    ),
    "undeclared flag is a warning": (
        rules("- {name: a, start: spec, flag: spec-json, match: {stream: true}}"),
        [
            "p.yaml:7:32: warning: rules.0.flag: flag 'spec-json' is not declared under flags "
            "(hint: declare it with a default, or it starts enabled)"
        ],
    ),
    "an endpoint path no API is served at": (
        rules("- {name: a, start: spec, match: {endpoint: [messages, /v1/message, code]}}"),
        [
            "p.yaml:7:55: warning: rules.0.match.endpoint.1: no API is served at '/v1/message': "
            "this value matches nothing (hint: name an API: chat, completions, messages, "
            "responses (or its path))"
        ],
    ),
    "duplicate rule names": (
        rules("- {name: default, start: spec, match: {stream: true}}"),
        [
            "p.yaml:8:10: error: rules.1.name: rule name 'default' is used twice "
            "(hint: rule names must be unique)"
        ],
    ),
    "duplicate YAML key": (
        rules("- {name: a, start: spec, start: standard, match: {stream: true}}"),
        [
            "p.yaml:7:26: error: rules.0.start: duplicate key 'start' (first at line 7) "
            "(hint: keep one)"
        ],
    ),
    "no default rule": (
        rules("- {name: a, start: spec, match: {stream: true}}", default=False),
        [
            "p.yaml:7:3: error: rules.0: the last rule must match everything (a default) "
            "(hint: add a rule with no 'match', e.g. {name: default, start: standard})"
        ],
    ),
    "shadowed rule": (
        rules(
            """
            - {name: tools, start: spec, match: {tools: present}}
            - {name: weather, start: standard, match: {tools: {names: [get_weather]}}}
            """
        ),
        [
            "p.yaml:8:3: error: rules.1: rule 'weather' can never match: the earlier rule "
            "'tools' matches every request it would (hint: move 'weather' above 'tools', "
            "or narrow 'tools')"
        ],
    ),
    "rule after a catch-all": (
        rules("- {name: all, start: spec}\n- {name: late, start: spec, match: {stream: true}}"),
        [
            "p.yaml:8:3: error: rules.1: rule 'late' can never match: the earlier rule 'all' "
            "matches every request it would (hint: 'all' has no match and takes everything; "
            "move it last)",
            "p.yaml:9:3: error: rules.2: rule 'default' can never match: the earlier rule 'all' "
            "matches every request it would (hint: 'all' has no match and takes everything; "
            "move it last)",
        ],
    ),
    "not YAML": (
        HEAD + "- {name: a, start: spec\n",
        ["p.yaml:8:1: error: <file>: not valid YAML: did not find expected ',' or '}'"],
    ),
    "a key given to two tenants, and keys for anonymous": (
        rules("")
        + "tenants:\n  a: {api_keys: [%s]}\n  b: {api_keys: [%s]}\n  anonymous: {api_keys: [%s]}\n"
        % (("sha256:" + "0" * 64,) * 3),
        [
            "p.yaml:11:18: error: tenants.b.api_keys.0: this key is already 'a''s: a key names "
            "one tenant",
            "p.yaml:12:25: error: tenants.anonymous.api_keys: 'anonymous' is every request "
            "without a known key: it has no keys",
        ],
    ),
    "an API key given in the clear": (
        rules("") + "tenants:\n  a: {api_keys: [sk-live-123]}\n",
        [
            "p.yaml:10:18: error: tenants.a.api_keys.0: this value does not match "
            "^sha256:[0-9a-f]{64}$ (hint: give the key's hash, never the key: speclane policy "
            "hash-key)"
        ],
    ),
    "a character YAML never allows": (
        HEAD + "rules:\n  - {name: a\x00}\n",
        ["p.yaml:8:13: error: <file>: not valid YAML: character '\\x00' is not allowed"],
    ),
}


@pytest.mark.parametrize(("text", "expected"), CASES.values(), ids=CASES.keys())
def test_each_problem_kind_is_reported_in_place(text: str, expected: list[str]) -> None:
    assert lines(text) == expected


LADDER_CASES = {
    "ladder names a missing pool": (
        "ladder: [spec, std]",
        [
            "p.yaml:5:16: error: ladder.1: no pool named 'std' (hint: known pools: spec, standard)",
        ],
    ),
    "ladder ends on a speculative pool": (
        "ladder: [standard, spec]",
        [
            "p.yaml:5:20: error: ladder.1: the ladder must end on a standard pool, not 'spec' "
            "(hint: falling back needs somewhere without speculation to land)"
        ],
    ),
}


@pytest.mark.parametrize(("ladder", "expected"), LADDER_CASES.values(), ids=LADDER_CASES.keys())
def test_ladder_problems(ladder: str, expected: list[str]) -> None:
    text = rules("").replace("ladder: [spec, standard]", ladder)
    assert lines(text) == expected


MULTI = """\
version: 1
pools:
  a-spec: {kind: speculative, model: a, num_speculative_tokens: 4, endpoints: ['http://a:1']}
  a-std: {kind: standard, model: a, endpoints: ['http://a:2']}
  b-std: {kind: standard, model: b, endpoints: ['http://b:2']}
ladders:
  a: [a-spec, a-std]
  b: [a-spec, b-std]
rules:
  - {name: b-fast, match: {model: [b]}, start: a-spec}
  - {name: default, start: standard}
"""


def test_multi_model_problems() -> None:
    assert lines(MULTI) == [
        "p.yaml:8:7: error: ladders.b.0: pool 'a-spec' serves 'a', not 'b', and is on the "
        "ladder of 'a' too (hint: a pool serves one model; give each model its own pools)",
        "p.yaml:10:48: error: rules.0.start: start 'a-spec' serves 'a', but the rule matches "
        "only ['b'] (hint: start on a pool of 'b', or add 'a' to match.model)",
    ]


def test_a_rule_for_two_models_starting_on_one_models_pool_is_a_warning() -> None:
    text = MULTI.replace("b: [a-spec, b-std]", "b: [b-std]")
    text = text.replace("{model: [b]}, start: a-spec", "{model: [a, b, c]}, start: a-spec")
    assert lines(text) == [
        "p.yaml:10:35: warning: rules.0.match.model: no ladder serves model 'c' "
        "(hint: ladders serve ['a', 'b'])",
        "p.yaml:10:54: warning: rules.0.start: start 'a-spec' serves only 'a': ['b'] start on "
        "standard (hint: give each model its own rule)",
    ]


def test_unused_flag_is_a_warning() -> None:
    text = rules("").replace("rules:\n", "flags:\n  spec-jsn: {enabled: true}\nrules:\n")
    assert lines(text) == [
        "p.yaml:7:3: warning: flags.spec-jsn: flag 'spec-jsn' is declared but no rule uses it "
        "(hint: refer to it with flag: NAME)"
    ]


def test_every_problem_at_once_even_when_a_rule_fails_the_schema() -> None:
    text = rules(
        """
        - {name: a, start: spec, match: {temperatur: {max: 0.3}}}
        - {name: b, start: spec-k9, match: {stream: true}}
        """
    )
    assert [line.split(": ")[2] for line in lines(text)] == [
        "rules.0.match.temperatur",
        "rules.1.start",
    ]


def test_a_broken_last_rule_does_not_invent_a_missing_default() -> None:
    text = rules("- {name: a, start: spec, match: {stream: true}}\n- {name: b}", default=False)
    assert [line.split(": ")[2] for line in lines(text)] == ["rules.1.start"]


def test_problems_come_in_file_order() -> None:
    text = rules(
        """
        - {name: b, start: nowhere, match: {stream: maybe}}
        - {name: c, start: spec, match: {temperature: {min: 2, max: 1}}}
        """
    )
    found = lint(text, "p.yaml").problems
    assert [(p.line, p.column) for p in found] == sorted((p.line, p.column) for p in found)


def test_load_policy_raises_the_errors_lint_prints_and_keeps_warnings() -> None:
    bad = rules("- {name: a, start: spec, match: {temperatur: {max: 0.3}}}")
    with pytest.raises(PolicyError) as caught:
        load_policy(bad, "p.yaml")
    assert str(caught.value).splitlines() == lines(bad)
    warned = rules("- {name: a, start: spec, flag: spec-json, match: {stream: true}}")
    policy = load_policy(warned, "p.yaml")
    assert [p.severity for p in policy.warnings] == [Severity.WARNING]
    assert policy.warnings[0].render("p.yaml") == lines(warned)[0]


def test_an_empty_file_and_a_list_are_not_policies() -> None:
    assert lines("") == ["p.yaml:1:1: error: <file>: the file is empty"]
    assert lines("- a\n") == [
        "p.yaml:1:1: error: <file>: the file must be a mapping (version, pools, rules, ...)"
    ]


def test_parse_keeps_positions_and_raises_errors_only() -> None:
    loaded = parse(rules(""), "p.yaml")
    assert loaded.policy.rules[0].name == "default"
    assert loaded.positions.of(("rules", 0, "start")) == (8, 26)
    with pytest.raises(PolicyError) as caught:
        parse(rules("- {name: a}"), "p.yaml")
    assert [p.code for p in caught.value.problems] == ["missing"]


def test_speedup_is_read_as_economic_and_lint_says_it_is_an_older_name():
    text = (
        HEAD.replace("rules:\n", "guardrail: {mode: speedup}\nrules:\n")
        + textwrap.dedent(
            """\
        - {name: a, match: {tools: present}, start: spec, guardrail: {mode: speedup}}
        - {name: b, match: {stream: true}, start: spec, guardrail: {mode: threshold}}
        """
        )
        + DEFAULT
    )
    policy = load_policy(text)
    modes = [rule.guardrail.mode for rule in policy.rules]
    assert modes == ["economic", "threshold", "economic"]
    assert [rule.guardrail.economic for rule in policy.rules] == [True, False, True]
    assert lines(text) == [
        "p.yaml:6:19: warning: guardrail.mode: mode 'speedup' is an older name for 'economic' "
        "(hint: write mode: economic)",
        "p.yaml:8:69: warning: rules.0.guardrail.mode: mode 'speedup' is an older name for "
        "'economic' (hint: write mode: economic)",
    ]
    assert len(policy.warnings) == 2 and not lint(text).errors


def test_type_errors_misspelt_keys_and_cross_file_problems_in_one_pass() -> None:
    text = """\
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ['http://s:8000'],
         cost_per_hr: 3}
  standard: {kind: standard, model: m, endpoints: ['http://d:8000']}
ladder: [spec, standard]
guardrail: {confidence: high, cooldwn_s: 10}
rules:
  - {name: json, start: spec-k7, match: {response_format: [json_object]}}
  - {name: default, start: spec}
"""
    assert [line.split(": error: ")[0] + ": " + line.split(": ")[2] for line in lines(text)] == [
        "p.yaml:4:10: pools.spec.cost_per_hr",
        "p.yaml:7:25: guardrail.confidence",
        "p.yaml:7:31: guardrail.cooldwn_s",
        "p.yaml:9:25: rules.0.start",
    ]
    assert "start 'spec-k7' is not a pool" in lines(text)[-1]


POOLS_ONLY = HEAD.removesuffix("rules:\n")
NO_FALSE_LINES = {
    # a broken pool: rules and the ladder that name it are not "unknown pool"
    "pool without kind": (
        POOLS_ONLY.replace("kind: speculative, ", "kind: fast, ")
        + "rules:\n- {name: a, start: spec, match: {stream: true}}\n"
        + DEFAULT,
        ["pools.spec.kind"],
    ),
    # a misspelt key of the guardrail: its default must not make recover_above look wrong
    "guardrail key misspelt": (
        POOLS_ONLY + "guardrail: {min_acceptance: 0.7, recover_abov: 0.8}\nrules:\n" + DEFAULT,
        ["guardrail.recover_abov"],
    ),
    # the ladder misspelt: no rule is "not on a ladder" for it
    "ladder misspelt": (
        POOLS_ONLY.replace("ladder:", "ladderz:") + "rules:\n" + DEFAULT,
        ["ladderz"],
    ),
    # a broken rule that used a flag does not make the flag unused
    "broken rule with a flag": (
        POOLS_ONLY + "flags:\n  f: {enabled: true}\nrules:\n- {name: a, start: spec, flag: f, "
        "match: {stream: maybe}}\n" + DEFAULT,
        ["rules.0.match.stream"],
    ),
    # and a real problem elsewhere still shows beside them
    "broken flag and a shadowed rule": (
        POOLS_ONLY
        + "flags:\n  f: {enabled: maybe}\nrules:\n- {name: a, start: spec}\n"
        + "- {name: b, start: standard, match: {stream: true}}\n"
        + DEFAULT,
        ["flags.f.enabled", "rules.1", "rules.2"],
    ),
}


@pytest.mark.parametrize("name", NO_FALSE_LINES)
def test_what_a_broken_part_could_cause_is_not_reported(name: str) -> None:
    text, paths = NO_FALSE_LINES[name]
    assert [line.split(": ")[2] for line in lines(text)] == paths


def _mappings(value: object, path: tuple[object, ...] = ()):
    if isinstance(value, dict):
        yield path
        for key, child in value.items():
            yield from _mappings(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _mappings(child, (*path, i))


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_one_unknown_key_anywhere_is_one_line(example) -> None:
    """Whatever mapping a stray key lands in (an unknown key, or a pool, flag or tenant that
    is not one), lint says that and nothing else: removing it to check the rest never
    invents a problem."""
    raw = yaml.safe_load(example.read_text())
    assert lint(example.read_text()).problems == ()
    for path in _mappings(raw):
        broken = copy.deepcopy(raw)
        target = broken
        for part in path:
            target = target[part]
        target["zzz_unknown"] = 1
        found = lint(yaml.safe_dump(broken), "p.yaml").problems
        assert [p.path[: len(path) + 1] for p in found] == [(*path, "zzz_unknown")], found


def _leaves(value: object, path: tuple[object, ...] = ()):
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _leaves(child, (*path, i))
    else:
        yield path


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_one_value_of_the_wrong_type_anywhere_is_reported_there_alone(example) -> None:
    raw = yaml.safe_load(example.read_text())
    for path in _leaves(raw):
        broken = copy.deepcopy(raw)
        target = broken
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = [[]]
        found = lint(yaml.safe_dump(broken), "p.yaml").problems
        assert found, path
        assert all(p.path[: len(path)] == path for p in found), (path, found)


PASSTHROUGH_CASES = {
    "an unknown pool": (
        "passthrough_pool: std",
        [
            "p.yaml:6:19: error: passthrough_pool: no pool named 'std' (hint: known pools: spec, "
            "standard)"
        ],
    ),
    "a pool of another model": (
        "passthrough_pool: {n: spec}",
        ["p.yaml:6:23: error: passthrough_pool.n: pool 'spec' serves 'm', not 'n'"],
    ),
    "a pool of a model no ladder serves": (
        "passthrough_pool: other",
        [
            "p.yaml:7:19: error: passthrough_pool: no ladder serves 'n' (hint: a model's other "
            "routes go where its ladder is)"
        ],
    ),
}


@pytest.mark.parametrize(
    ("setting", "expected"), PASSTHROUGH_CASES.values(), ids=PASSTHROUGH_CASES.keys()
)
def test_passthrough_pool_problems(setting: str, expected: list[str]) -> None:
    text = rules("").replace("ladder: [spec, standard]\n", f"ladder: [spec, standard]\n{setting}\n")
    other = "  other: {kind: standard, model: n, endpoints: ['http://o:8000']}\n"
    text = text.replace("ladder:", other + "ladder:", 1) if "other" in setting else text
    assert lines(text) == expected


def test_the_passthrough_pool_leads_the_other_routes_then_the_ladder_from_the_bottom() -> None:
    text = rules("").replace("ladder: [spec, standard]\n", "ladder: [spec, standard]\n")
    assert load_policy(text).ladders["m"].other_routes == ("standard", "spec")
    named = text.replace(
        "ladder: [spec, standard]\n", "ladder: [spec, standard]\npassthrough_pool: {m: spec}\n"
    )
    assert load_policy(named).ladders["m"].other_routes == ("spec", "standard")
