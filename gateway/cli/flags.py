"""``speclane flags list|get|set|delete``: the admin API's flags from a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx
import orjson
from rich.markup import escape
from rich.table import Table

from gateway.cli.admin_client import admin_token, gateway_url, refused
from gateway.cli.output import console


def _connection(defaults: bool) -> argparse.ArgumentParser:
    """``--gateway`` and ``--token``, accepted before and after the sub-command: the copy on
    each sub-command has no defaults of its own, so it never hides a value given earlier."""
    parent = argparse.ArgumentParser(add_help=False)
    gateway_default: object = None if defaults else argparse.SUPPRESS
    token_default: object = None if defaults else argparse.SUPPRESS
    parent.add_argument(
        "--gateway",
        default=gateway_default,
        help="gateway base URL (default: SPECLANE_GATEWAY, else http://127.0.0.1:8080)",
    )
    parent.add_argument(
        "--token", default=token_default, help="admin token (or SPECLANE_ADMIN_TOKEN)"
    )
    return parent


def add_parser(commands: Any) -> None:
    flags = commands.add_parser(
        "flags",
        help="read and set feature flags on a running gateway",
        parents=[_connection(defaults=True)],
    )
    common = [_connection(defaults=False)]
    sub = flags.add_subparsers(dest="flags_command", required=True)
    listing = sub.add_parser(
        "list", help="every flag the policy knows, with its value", parents=common
    )
    listing.add_argument("--json", action="store_true", help="print the admin API's JSON")
    listing.set_defaults(run=_list)
    get = sub.add_parser("get", help="one flag", parents=common)
    get.add_argument("name")
    get.add_argument("--json", action="store_true", help="print the admin API's JSON")
    get.set_defaults(run=_get)
    put = sub.add_parser(
        "set", help="set a flag (kill switch: set speculation --off)", parents=common
    )
    put.add_argument("name")
    put.add_argument(
        "--create",
        action="store_true",
        help="create a flag no rule or policy declares (otherwise an unknown name is refused)",
    )
    state = put.add_mutually_exclusive_group()
    state.add_argument("--on", dest="enabled", action="store_true", default=True)
    state.add_argument("--off", dest="enabled", action="store_false")
    put.add_argument(
        "--rollout",
        type=float,
        help="percentage of tenants, 0-100: a rollout draws a hash of the tenant an API key "
        "names (stable per tenant), never of requests, and a request without a known key is "
        "in no partial rollout; refused where the policy names no tenants",
    )
    put.add_argument("--allow", action="append", help="tenant allowed (repeatable)")
    put.add_argument("--deny", action="append", default=[], help="tenant denied (repeatable)")
    put.add_argument("--reason", required=True, type=_reason, help="why, for the audit log")
    put.add_argument("--actor", default="cli", help="who, for the audit log")
    put.set_defaults(run=_set)
    delete = sub.add_parser(
        "delete", help="drop the ops value; the policy default applies", parents=common
    )
    delete.add_argument("name")
    delete.add_argument("--reason", required=True, type=_reason, help="why, for the audit log")
    delete.add_argument("--actor", default="cli")
    delete.set_defaults(run=_delete)


def _reason(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("say why, for the audit log (the console asks too)")
    return text.strip()


class _NoToken(Exception):
    pass


def _client(args: argparse.Namespace, url: str) -> httpx.Client:
    token = admin_token(args)
    if not token:
        raise _NoToken
    headers = {
        "authorization": f"Bearer {token}",
        "x-speclane-actor": getattr(args, "actor", "cli"),
    }
    return httpx.Client(base_url=url, headers=headers, timeout=10)


def call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> dict[str, Any] | None:
    """The admin API's JSON answer, or None once the reason is on stderr."""
    url = gateway_url(args)
    try:
        with _client(args, url) as client:
            response = client.request(method, path, **kwargs)
    except _NoToken:
        sys.stderr.write("no admin token: pass --token or set SPECLANE_ADMIN_TOKEN\n")
        return None
    except (httpx.HTTPError, ValueError) as exc:
        sys.stderr.write(f"cannot reach {url}: {exc}\n")
        return None
    told = refused(response.status_code, url, response.content)
    if told is not None:
        sys.stderr.write(told + "\n")
        return None
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        sys.stderr.write(f"{response.status_code}: {response.text[:200]}\n")
        return None
    if response.status_code >= 400:
        sys.stderr.write(f"{response.status_code}: {body.get('error', {}).get('message', body)}\n")
        return None
    return body


COLUMNS = ("flag", "enabled", "rollout", "tenants", "source", "rules")


def _rows(flags: list[dict[str, Any]]) -> list[list[str]]:
    """One row per flag, the fields of ``COLUMNS``, for the table and the piped lines alike."""
    rows = []
    for flag in flags:
        tenants = flag["tenants"]
        who = []
        if tenants["allow"] is not None:
            who.append("allow " + ",".join(tenants["allow"]))
        if tenants["deny"]:
            who.append("deny " + ",".join(tenants["deny"]))
        rows.append(
            [
                flag["name"],
                "on" if flag["enabled"] else "off",
                "-" if flag["rollout"] is None else f"{flag['rollout']:g}% of tenants",
                "; ".join(who) or "all",
                flag["source"],
                ",".join(flag["rules"]) or "-",
            ]
        )
    return rows


def _table(flags: list[dict[str, Any]]) -> Table:
    table = Table(*COLUMNS)
    for row in _rows(flags):
        enabled = "on" if row[1] == "on" else "[red]off[/red]"
        table.add_row(escape(row[0]), enabled, *(escape(field) for field in row[2:]))
    return table


def _show(flags: list[dict[str, Any]]) -> None:
    """A table on a terminal; piped, the same columns as tab-separated lines under a header
    line, never truncated."""
    if sys.stdout.isatty():
        console().print(_table(flags))
        return
    for row in [list(COLUMNS), *_rows(flags)]:
        sys.stdout.write("\t".join(row) + "\n")


def _list(args: argparse.Namespace) -> int:
    body = call(args, "GET", "/admin/flags")
    if body is None:
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _show(body["flags"])
    return 0


def _get(args: argparse.Namespace) -> int:
    body = call(args, "GET", f"/admin/flags/{args.name}")
    if body is None:
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _show([body])
    return 0


def _set(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"enabled": args.enabled, "reason": args.reason}
    if args.create:
        payload["create"] = True
    if args.rollout is not None:
        payload["rollout"] = args.rollout
    if args.allow is not None or args.deny:
        payload["tenants"] = {"allow": args.allow, "deny": args.deny}
    body = call(args, "PUT", f"/admin/flags/{args.name}", json=payload)
    if body is None:
        return 1
    _show([body["flag"]])
    return 0


def _delete(args: argparse.Namespace) -> int:
    body = call(args, "DELETE", f"/admin/flags/{args.name}", params={"reason": args.reason})
    if body is None:
        return 1
    console().print(f"{args.name}: back to the policy's default")
    return 0
