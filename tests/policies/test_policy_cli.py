"""``speclane policy lint | explain | schema`` through the parser ``add_parser`` builds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from gateway.cli.policy import add_parser
from policies.compiled import load_policy
from policies.explain import explain
from policies.features import Features
from policies.flags import merged

EXAMPLES = Path(__file__).parents[2] / "policies" / "examples"
TRAINIUM = EXAMPLES / "trainium-k7-k3.yaml"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="speclane")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *argv])
    code: int = args.run(args)
    return code


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_lint_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str
) -> None:
    good = write(tmp_path, "good.yaml", policy_text)
    assert run("lint", good) == 0
    assert capsys.readouterr().out == f"{good}: 0 error(s), 0 warning(s)\n"  # on stdout
    bad = write(tmp_path, "bad.yaml", policy_text.replace("start: standard", "start: nowhere"))
    assert run("lint", good, bad) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{good}: 0 error(s), 0 warning(s)",
        f"{bad}:12:10: error: rules.1.start: start 'nowhere' is not a pool "
        "(hint: use one of ['shadow', 'spec', 'standard'])",
        f"{bad}: 1 error(s), 0 warning(s)",
    ]


def test_warnings_fail_only_when_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str
) -> None:
    warned = write(
        tmp_path, "w.yaml", policy_text.replace("start: standard", "start: standard\n  flag: x")
    )
    assert run("lint", warned) == 0
    assert "warning: rules.1.flag: flag 'x' is not declared under flags" in capsys.readouterr().out
    assert run("lint", "--strict", warned) == 1


def test_lint_an_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("lint", str(tmp_path / "missing.yaml")) == 1
    assert "missing.yaml: error: cannot read" in capsys.readouterr().err


REQUEST = {
    "model": "qwen3-32b",
    "temperature": 0.2,
    "messages": [{"role": "user", "content": "The weather in Paris, as JSON."}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": {}}},
}


def test_explain_a_request_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = write(tmp_path, "request.json", json.dumps(REQUEST))
    assert run("explain", str(TRAINIUM), request) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  response_format: json_schema" in out
    assert (
        "  0. structured-json: MATCH - response_format json_schema in "
        "[json_object, json_schema]; temperature 0.2 <= 0.3"
    ) in out
    assert out[-4:] == [
        "slice: structured-json / t<=0.3 / ctx<4k",
        "pool: spec-k7 (rung 0, start 0)",
        "rungs: spec-k7 > spec-k3 > standard",
        "reason: rule structured-json: on spec-k7",
    ]


def test_explain_features_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--features", "temperature=0.5", "tools=get_weather", "prompt_tokens=20000", "--json"]
    assert run("explain", str(TRAINIUM), *argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["rule"], r["matched"]) for r in out["rules"]] == [
        ("structured-json", False),
        ("tool-calls", True),
    ]
    assert out["rules"][0]["why"] == (
        "response_format: wanted in [json_object, json_schema], got text"
    )
    assert (out["pool"], out["rung"], out["rungs"]) == (
        "spec-k3",
        1,
        ["spec-k3", "standard", "spec-k7"],
    )
    assert out["slice"] == "tool-calls / t0.3-0.9 / ctx>=16k"
    assert out["features"]["model"] == "qwen3-32b"  # the policy's only model


def test_explain_with_a_flag_off(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--features", "temperature=0.1", "response_format=json_object", "--flag"]
    assert run("explain", str(TRAINIUM), *argv, "spec-structured=off", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pool"] == "standard"
    assert out["reason"] == "rule structured-json: flag spec-structured is off for this request"
    assert out["flags"] == {"speculation": "on", "spec-structured": "off"}


def test_explain_headers_reach_classification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = write(tmp_path, "request.json", json.dumps({**REQUEST, "model": "other"}))
    argv = ["--header", "X-Speclane-Tenant=acme", "--json"]
    assert run("explain", str(TRAINIUM), request, *argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["features"]["tenant"] == "acme"
    assert (out["pool"], out["rungs"]) == ("", [])
    assert out["reason"] == "no ladder serves model other"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--features", "temprature=1"],
            "unknown feature 'temprature' (did you mean 'temperature'?)",
        ),
        (["--features", "temperature=hot"], "bad value for temperature: 'hot'"),
        (["--features", "stream"], "--features takes K=V, got 'stream'"),
        (["--features", "stream=1", "--flag", "x=maybe"], "--flag x=maybe: use on or off"),
    ],
)
def test_explain_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("explain", str(TRAINIUM), *argv) == 1
    assert capsys.readouterr().err == f"speclane policy explain: {message}\n"


def test_explain_names_the_features_when_none_is_close(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("explain", str(TRAINIUM), "--features", "colour=red") == 1
    said = capsys.readouterr().err
    assert said.startswith("speclane policy explain: unknown feature 'colour' (known: api, ")
    assert "temperature" in said and "()" not in said


def test_explain_a_bad_request_or_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str
) -> None:
    request = write(tmp_path, "request.json", '{"model": "m"}')
    assert run("explain", str(TRAINIUM), request) == 1
    assert "'messages' is required" in capsys.readouterr().err
    bad = write(tmp_path, "bad.yaml", policy_text.replace("start: standard", "start: nowhere"))
    assert run("explain", bad, "--features", "model=m") == 1
    assert "rules.1.start: start 'nowhere' is not a pool" in capsys.readouterr().err


def test_explain_matches_the_policy_decision() -> None:
    policy = load_policy(TRAINIUM.read_text())
    features = Features("/v1/chat/completions", "qwen3-32b", temperature=0.95)
    result = explain(features, policy, merged(policy.file.flags, {}))
    assert [t.rule for t in result.trials] == [r.name for r in policy.rules[:4]]
    assert result.trials[-1].matched and result.decision.rule == "creative"
    assert policy.first_match(features).name == "creative"


def test_schema_prints_the_shipped_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("schema") == 0
    shipped = (Path(__file__).parents[2] / "policies" / "policy.schema.json").read_text()
    assert capsys.readouterr().out == shipped


def test_explain_draws_tables_on_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "160")
    argv = ["--features", "temperature=0.2", "response_format=json_schema"]
    assert run("explain", str(TRAINIUM), *argv) == 0
    out = capsys.readouterr().out
    assert "rules tried, in order" in out
    assert "response_format json_schema in [json_object, json_schema]" in out  # not markup


@pytest.mark.parametrize("endpoint", ["/v1/completions", "completions"])
def test_explain_a_completions_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], endpoint: str
) -> None:
    """The endpoint is a short name or a path, as in POST /admin/policy/explain."""
    body = {"model": "qwen3-32b", "prompt": "word " * 20000, "temperature": 0.5}
    request = write(tmp_path, "request.json", json.dumps(body))
    argv = ["--endpoint", endpoint, "--json"]
    assert run("explain", str(TRAINIUM), request, *argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["features"]["endpoint"] == "/v1/completions"
    assert out["features"]["prompt_tokens"] > 16000
    assert (out["rule"], out["pool"]) == ("long-context", "standard")


def test_explain_names_the_child_of_a_split_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = write(tmp_path, "request.json", json.dumps(REQUEST))
    assert run("explain", str(TRAINIUM), request, "--json") == 0
    decided = json.loads(capsys.readouterr().out)
    template = dict(decided["candidates"])["template"]
    parent = decided["slice"]
    split = {"parent": parent, "key": "template", "values": ["0" * 16, template]}
    stats = {"splits": {parent: {**split, "since": 1.0, "version": 1, "why": "split"}}}
    saved = write(tmp_path, "stats.json", json.dumps(stats))
    assert run("explain", str(TRAINIUM), request, "--stats", saved) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"slice: {parent} / app:2" in out
    assert f"  split by application from: {parent}" in out
    assert any(
        line.startswith("split keys (what its slice may split by): template ") for line in out
    )
    bad = write(tmp_path, "bad.json", json.dumps({"splits": {parent: {"key": 1}}}))
    assert run("explain", str(TRAINIUM), request, "--stats", bad) == 1
