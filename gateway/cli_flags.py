"""``speclane flags list|get|set|delete``: the admin API's flags from a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table


def add_parser(commands: Any) -> None:
    flags = commands.add_parser("flags", help="read and set feature flags on a running gateway")
    flags.add_argument("--gateway", default="http://127.0.0.1:8080", help="gateway base URL")
    flags.add_argument("--token", help="admin token (or SPECLANE_ADMIN_TOKEN)")
    sub = flags.add_subparsers(dest="flags_command", required=True)
    sub.add_parser("list", help="every flag the policy knows, with its value").set_defaults(
        run=_list
    )
    get = sub.add_parser("get", help="one flag")
    get.add_argument("name")
    get.set_defaults(run=_get)
    put = sub.add_parser("set", help="set a flag (kill switch: set speculation --off)")
    put.add_argument("name")
    state = put.add_mutually_exclusive_group()
    state.add_argument("--on", dest="enabled", action="store_true", default=True)
    state.add_argument("--off", dest="enabled", action="store_false")
    put.add_argument("--rollout", type=float, help="percentage of traffic, 0-100")
    put.add_argument("--allow", action="append", help="tenant allowed (repeatable)")
    put.add_argument("--deny", action="append", default=[], help="tenant denied (repeatable)")
    put.add_argument("--reason", default="", help="why, for the audit log")
    put.add_argument("--actor", default="cli", help="who, for the audit log")
    put.set_defaults(run=_set)
    delete = sub.add_parser("delete", help="drop the ops value; the policy default applies")
    delete.add_argument("name")
    delete.add_argument("--reason", default="")
    delete.add_argument("--actor", default="cli")
    delete.set_defaults(run=_delete)


def _client(args: argparse.Namespace) -> httpx.Client:
    from gateway.settings import Settings

    token = args.token
    if token is None:
        secret = Settings().admin_token
        token = secret.get_secret_value() if secret else ""
    headers = {
        "authorization": f"Bearer {token}",
        "x-speclane-actor": getattr(args, "actor", "cli"),
    }
    return httpx.Client(base_url=args.gateway, headers=headers, timeout=10)


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> dict[str, Any] | None:
    try:
        with _client(args) as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        sys.stderr.write(f"cannot reach {args.gateway}: {exc}\n")
        return None
    body: dict[str, Any] = response.json()
    if response.status_code >= 400:
        sys.stderr.write(f"{response.status_code}: {body.get('error', {}).get('message', body)}\n")
        return None
    return body


def _table(flags: list[dict[str, Any]]) -> Table:
    table = Table("flag", "enabled", "rollout", "tenants", "source", "rules")
    for flag in flags:
        tenants = flag["tenants"]
        who = []
        if tenants["allow"] is not None:
            who.append("allow " + ",".join(tenants["allow"]))
        if tenants["deny"]:
            who.append("deny " + ",".join(tenants["deny"]))
        table.add_row(
            flag["name"],
            "on" if flag["enabled"] else "[red]off[/red]",
            "-" if flag["rollout"] is None else f"{flag['rollout']:g}%",
            "; ".join(who) or "all",
            flag["source"],
            ", ".join(flag["rules"]),
        )
    return table


def _list(args: argparse.Namespace) -> int:
    body = _call(args, "GET", "/admin/flags")
    if body is None:
        return 1
    Console().print(_table(body["flags"]))
    return 0


def _get(args: argparse.Namespace) -> int:
    body = _call(args, "GET", f"/admin/flags/{args.name}")
    if body is None:
        return 1
    Console().print(_table([body]))
    return 0


def _set(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"enabled": args.enabled, "reason": args.reason}
    if args.rollout is not None:
        payload["rollout"] = args.rollout
    if args.allow is not None or args.deny:
        payload["tenants"] = {"allow": args.allow, "deny": args.deny}
    body = _call(args, "PUT", f"/admin/flags/{args.name}", json=payload)
    if body is None:
        return 1
    Console().print(_table([body["flag"]]))
    return 0


def _delete(args: argparse.Namespace) -> int:
    body = _call(args, "DELETE", f"/admin/flags/{args.name}", params={"reason": args.reason})
    if body is None:
        return 1
    Console().print(f"{args.name}: back to the policy's default")
    return 0
