"""``speclane policy``: lint policy files, explain a decision, print the JSON Schema.

    speclane policy lint FILE... [--strict]
    speclane policy explain FILE REQUEST.json [--endpoint NAME|PATH] [--header K=V]... [--json]
        [--stats STATS.json]  (a saved /admin/stats: name the child of a split slice)
    speclane policy explain FILE --features K=V... [--flag NAME=on|off]... [--json]
    ... [--gateway URL [--token T]]   (the live flags; offline, the file's defaults)
    speclane policy schema
    speclane policy hash-key < key.txt

Command-line edge only: reads files, writes to stdout/stderr, and leaves the work to
``policies.lint``, ``policies.explain`` and ``policies.schema``. Each command returns an
exit code (0 fine, 1 problems found or bad input).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from gateway import apis
from gateway.identity import key_hash
from gateway.state.policyfile import load_policy_file, read_policy_file
from policies.compiled import CompiledPolicy
from policies.explain import Explanation, explain, feature_rows
from policies.features import Features, ResponseFormat
from policies.flags import FlagValue, merged
from policies.lint import lint
from policies.model import ANONYMOUS
from policies.problems import PolicyError, did_you_mean
from policies.schema import json_schema_text
from policies.splitting import Split, split_of


class UsageError(Exception):
    """Bad command-line input, said in one line."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policy`` and its sub-commands to the ``speclane`` parser."""
    policy = subparsers.add_parser("policy", help="lint, explain and describe policy files")
    commands = policy.add_subparsers(dest="policy_command", required=True)
    check = commands.add_parser("lint", help="report every problem of policy files")
    check.add_argument("files", nargs="+", type=Path, metavar="FILE")
    check.add_argument("--strict", action="store_true", help="warnings fail too")
    check.set_defaults(run=run_lint)
    why = commands.add_parser("explain", help="which rule, slice and rung a request gets")
    why.add_argument("file", type=Path, metavar="FILE")
    why.add_argument("request", type=Path, nargs="?", metavar="REQUEST.json")
    why.add_argument("--features", nargs="+", default=[], metavar="K=V", help="set features")
    why.add_argument(
        "--endpoint",
        default="chat",
        choices=apis.CHOICES,
        help="the API the request came in on: a short name or its path (default: chat)",
    )
    why.add_argument("--header", action="append", default=[], metavar="K=V")
    why.add_argument("--flag", action="append", default=[], metavar="NAME=on|off")
    why.add_argument(
        "--gateway",
        metavar="URL",
        help="read the live flags (the kill switch, rollouts, tenant lists ops have set) from "
        "this gateway's admin API; without it only the file's flag defaults are known",
    )
    why.add_argument("--token", help="its admin token (default: SPECLANE_ADMIN_TOKEN)")
    why.add_argument(
        "--stats",
        type=Path,
        metavar="STATS.json",
        help="a gateway's /admin/stats, saved: the decision names the child of a slice it "
        "split by application",
    )
    why.add_argument("--json", action="store_true", help="machine-readable output")
    why.set_defaults(run=run_explain)
    schema = commands.add_parser("schema", help="print the policy file's JSON Schema")
    schema.set_defaults(run=run_schema)
    hashed = commands.add_parser(
        "hash-key", help="print how a tenant's api_keys name an API key read from stdin"
    )
    hashed.set_defaults(run=run_hash_key)


def run_lint(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            data = read_policy_file(path)
        except OSError as exc:
            sys.stderr.write(f"{path}: error: cannot read: {exc.strerror or exc}\n")
            failed = True
            continue
        report = lint(data, str(path))
        sys.stdout.writelines(line + "\n" for line in report.lines())
        errors, warnings = len(report.errors), len(report.warnings)
        sys.stdout.write(f"{path}: {errors} error(s), {warnings} warning(s)\n")
        failed = failed or report.failed(strict=args.strict)
    return 1 if failed else 0


def run_schema(args: argparse.Namespace) -> int:
    del args
    sys.stdout.write(json_schema_text())
    return 0


def run_hash_key(args: argparse.Namespace) -> int:
    """The key comes on stdin, so it stays out of the shell's history and the process list."""
    del args
    key = sys.stdin.readline().strip()
    if not key:
        sys.stderr.write("speclane policy hash-key: give the key on stdin\n")
        return 1
    sys.stdout.write(key_hash(key) + "\n")
    return 0


OFFLINE = (
    "the policy file's defaults: live flags (speclane flags) are not read offline; "
    "--gateway URL reads them"
)


def run_explain(args: argparse.Namespace) -> int:
    try:
        policy, _ = load_policy_file(args.file)
        features = _features(args, policy)
        live = _live_flags(args) if args.gateway else {}
        flags = merged(policy.file.flags, {**live, **_flag_overrides(args.flag)})
        splits = _splits(args.stats) if args.stats is not None else {}
    except PolicyError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except (OSError, UsageError) as exc:
        sys.stderr.write(f"speclane policy explain: {exc}\n")
        return 1
    source = f"live, from {args.gateway}" if args.gateway else OFFLINE
    result = explain(features, policy, flags, source, splits)
    if args.json:
        sys.stdout.write(json.dumps(result.as_json(), indent=2) + "\n")
    elif sys.stdout.isatty():
        _rich(result)
    else:
        sys.stdout.writelines(line + "\n" for line in result.lines())
    return 0


def _live_flags(args: argparse.Namespace) -> dict[str, FlagValue]:
    """The values ops have set on the running gateway, from its admin API."""
    from gateway.cli.flags import call

    body = call(args, "GET", "/admin/flags")
    if body is None:  # the reason is on stderr
        raise UsageError(f"cannot read the live flags of {args.gateway}")
    return {
        flag["name"]: FlagValue(
            enabled=bool(flag["enabled"]),
            rollout=flag["rollout"],
            allow=None if flag["tenants"]["allow"] is None else frozenset(flag["tenants"]["allow"]),
            deny=frozenset(flag["tenants"]["deny"]),
        )
        for flag in body["flags"]
        if flag["source"] == "ops"
    }


def _splits(path: Path) -> dict[str, Split]:
    """The ``splits`` of a saved ``/admin/stats``."""
    try:
        data = json.loads(path.read_text())
        return {parent: split_of(d) for parent, d in data.get("splits", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a saved /admin/stats ({exc})") from None


def _features(args: argparse.Namespace, policy: CompiledPolicy) -> Features:
    headers = {k.lower(): v for k, v in _pairs(args.header, "--header").items()}
    if args.request is not None and args.features:
        raise UsageError("give REQUEST.json or --features, not both")
    api = apis.named(args.endpoint)
    if args.request is not None:
        return _classified(args.request, api, headers, policy)
    return features_from(_pairs(args.features, "--features"), policy, api.path, headers)


def _classified(
    path: Path, api: apis.Api, headers: dict[str, str], policy: CompiledPolicy
) -> Features:
    from gateway import schema
    from gateway.classify import Defaults, classify
    from gateway.errors import ApiError

    try:
        request, _ = schema.parse(path.read_bytes(), api.model)
    except ApiError as exc:
        raise UsageError(f"{path}: {exc.message}") from None
    defaults = Defaults().under(policy.file.defaults)
    return classify(request, api.path, headers, "explain", defaults)


_FIELDS = {f.name for f in fields(Features)} - {"headers", "tools_fingerprint", "defaulted"}


def features_from(
    pairs: dict[str, str], policy: CompiledPolicy, endpoint: str, headers: dict[str, str]
) -> Features:
    """Features set directly (``temperature=0.2 tools=a,b context_tokens=20000``)."""
    values: dict[str, Any] = {
        "endpoint": endpoint,
        "api": apis.api_of(endpoint),
        "headers": headers,
    }
    for key, text in pairs.items():
        name = "prompt_tokens" if key == "context_tokens" else key
        if name not in _FIELDS:
            known = _FIELDS | {"context_tokens"}
            hint = did_you_mean(key, known) or "known: " + ", ".join(sorted(known))
            raise UsageError(f"unknown feature {key!r} ({hint})")
        values[name] = _value(name, text)
    if "model" not in values:
        models = sorted(policy.ladders)
        if len(models) != 1:
            raise UsageError(f"give model=... (the policy serves {models})")
        values["model"] = models[0]
    _default_sampling(values, policy)
    tenant = values.get("tenant") or "explain"
    values.setdefault("routing_key", "" if tenant == ANONYMOUS else tenant)
    return Features(**values)


def _default_sampling(values: dict[str, Any], policy: CompiledPolicy) -> None:
    """Sampling fields not given are the policy's defaults (else 1.0), marked as assumed,
    as a served request without them is read."""
    given = policy.file.defaults
    defaulted = []
    for name in ("temperature", "top_p"):
        if name not in values:
            found = getattr(given, name)
            values[name] = 1.0 if found is None else found
            defaulted.append(name)
    values["defaulted"] = tuple(defaulted)


def _value(name: str, text: str) -> Any:
    try:
        if name in ("temperature", "top_p"):
            return float(text)
        if name in ("prompt_tokens", "n"):
            return int(text)
        if name == "max_tokens":
            return None if text.lower() in ("", "none") else int(text)
        if name in ("stream", "thinking"):
            return _boolean(text)
        if name == "tools":
            return tuple(t for t in text.split(",") if t)
        if name == "response_format":
            return ResponseFormat(text)
    except ValueError:
        raise UsageError(f"bad value for {name}: {text!r}") from None
    return text


def _boolean(text: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if text.lower() not in words:
        raise ValueError(text)
    return words[text.lower()]


def _flag_overrides(items: Sequence[str]) -> dict[str, FlagValue]:
    states = {"on": True, "off": False}
    overrides = {}
    for name, state in _pairs(items, "--flag").items():
        if state not in states:
            raise UsageError(f"--flag {name}={state}: use on or off")
        overrides[name] = FlagValue(enabled=states[state])
    return overrides


def _pairs(items: Sequence[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes K=V, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def _rich(result: Explanation) -> None:
    from rich.markup import escape
    from rich.table import Table

    from gateway.cli.output import console as make_console

    console = make_console()
    features = Table(title="features", show_header=False)
    for name, value in feature_rows(result.features):
        features.add_row(escape(name), escape(value))
    rules = Table(title="rules tried, in order")
    for column in ("#", "rule", "result", "why"):
        rules.add_column(column)
    for t in result.trials:
        verdict = "[green]match[/]" if t.matched else "[dim]no[/]"
        rules.add_row(str(t.index), escape(t.rule), verdict, escape(t.why))
    d = result.decision
    decision = Table(title="decision", show_header=False)
    for name, value in [
        ("rule", d.rule),
        ("slice", d.slice),
        *([("split from", d.parent)] if d.parent and d.parent != d.slice else []),
        *([("split keys", ", ".join(f"{k} {v}" for k, v in d.candidates))] if d.candidates else []),
        ("pool", f"{d.pool or '-'} (rung {d.rung}, start {d.start})"),
        ("rungs", " > ".join(d.rungs) or "-"),
        ("reason", d.reason),
        *[(f"flag {n}", v) for n, v in result.flags.items()],
        ("flags from", result.flags_source),
        *([("shadow copy to", d.shadow_to)] if d.shadow_to else []),
    ]:
        decision.add_row(escape(name), escape(value))
    for table in (features, rules, decision):
        console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.cli.policy lint FILE`` works without the ``speclane`` wrapper."""
    parser = argparse.ArgumentParser(prog="speclane")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
