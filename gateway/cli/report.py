"""``speclane report``: the pilot report, per slice and arm, from a running gateway's
outcome records or from outcome logs (``SPECLANE_OUTCOME_LOG``).

    speclane report [--gateway URL] [--token T] [--since S]
    speclane report --log FILE [FILE...]
    ... [--chart report.png] [--json report.json] [--confidence 0.95]

Without ``--log``, the records come from ``--gateway``, else ``SPECLANE_GATEWAY``, with
``--token`` or ``SPECLANE_ADMIN_TOKEN``. ``--chart`` without matplotlib fails at once, before
any record is read, naming the extra that adds it. Command-line edge only: reads records,
prints and writes; the numbers are in ``gateway/report/stats.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.cli.admin_client import admin_token, gateway_url, refused
from gateway.cli.output import console
from gateway.plotting import pyplot
from gateway.report import chart, render
from gateway.report.stats import build


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report", help="the pilot report: speculation against standard, per slice and arm"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--gateway",
        help="a running gateway's URL, for its GET /admin/outcomes (default: SPECLANE_GATEWAY, "
        "else http://127.0.0.1:8080)",
    )
    source.add_argument("--log", type=Path, nargs="+", help="outcome logs (JSON lines)")
    parser.add_argument("--token", help="the admin token (default: SPECLANE_ADMIN_TOKEN)")
    parser.add_argument(
        "--since", type=float, default=0.0, help="records after this wall time, in Unix seconds"
    )
    parser.add_argument("--confidence", type=float, default=0.95, help="of the intervals")
    parser.add_argument("--min-requests", type=int, default=10, help="per arm, for a verdict")
    parser.add_argument(
        "--chart",
        type=Path,
        help="write the chart here (PNG; needs matplotlib: pip install 'speclane[charts]')",
    )
    parser.add_argument("--json", type=Path, help="write the report here as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0.5 <= args.confidence < 1:
        sys.stderr.write("--confidence must be at least 0.5 and below 1\n")
        return 2
    if args.chart and pyplot() is None:
        sys.stderr.write(
            f"--chart {args.chart}: the chart needs matplotlib: pip install 'speclane[charts]'\n"
        )
        return 1
    try:
        records = _from_logs(args.log) if args.log else _from_gateway(args)
    except (OSError, ValueError, httpx.HTTPError) as exc:
        sys.stderr.write(f"cannot read the records: {exc}\n")
        return 1
    records = [r for r in records if float(r.get("at") or 0) > args.since]
    report = build(records, args.confidence, args.min_requests)
    if args.json:  # the files first: a reader that stops early (| head) must not lose them
        args.json.write_text(json.dumps(render.as_json(report), indent=1))
    if args.chart:
        chart.draw(report, args.chart)
    render.show(console(), report)
    return 0


def _from_logs(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if isinstance(value, dict):
                out.append(value)
    return out


def _from_gateway(args: argparse.Namespace) -> list[dict[str, Any]]:
    token = admin_token(args)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    gateway = gateway_url(args)
    url = gateway.rstrip("/") + "/admin/outcomes"
    response = httpx.get(url, headers=headers, params={"since": args.since}, timeout=30)
    told = refused(response.status_code, gateway, response.content)
    if told is not None:
        raise ValueError(told)
    if response.status_code != 200:
        raise ValueError(f"{url} answered {response.status_code}: {response.text[:300]}")
    records: list[dict[str, Any]] = response.json()["outcomes"]
    return records
