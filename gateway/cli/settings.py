"""``speclane settings``: the gateway's settings, from ``gateway/settings.py``.

    speclane settings                        each setting's value here (environment, defaults)
    speclane settings --markdown             the reference, as Markdown: a table per group
    speclane settings --markdown --update F  that reference spliced into F between its markers

The tables are made from the groups' docstrings and the fields' descriptions and defaults,
so the page and the code say the same; ``tests/gateway/cli/test_settings_cli.py`` checks
that the committed page is current. Command-line edge only.
"""

from __future__ import annotations

import argparse
import re
import sys
from enum import Enum
from pathlib import Path

from pydantic import SecretStr, ValidationError

from gateway.settings import GROUPS, Settings

PREFIX = "SPECLANE_"
BEGIN = "<!-- begin: speclane settings --markdown -->"
END = "<!-- end: speclane settings --markdown -->"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "settings", help="the gateway's settings: their values here, or the reference table"
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print every setting's reference as Markdown"
    )
    parser.add_argument(
        "--update",
        type=Path,
        metavar="FILE",
        help=f"with --markdown: replace the table between {BEGIN} and {END} in FILE "
        "(docs/configuration.md)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.markdown and args.update:
        try:
            args.update.write_text(spliced(args.update.read_text()))
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"speclane settings: cannot update {args.update}: {exc}\n")
            return 1
        return 0
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    from gateway.cli.serve import settings_errors

    try:
        settings = Settings()
    except ValidationError as exc:
        sys.stderr.write(settings_errors(exc).replace("speclane serve: ", "speclane settings: "))
        return 2
    width = max(len(PREFIX + name) for name in Settings.model_fields)
    for name in Settings.model_fields:
        value = shown(getattr(settings, name))
        sys.stdout.write(f"{(PREFIX + name.upper()).ljust(width)}  {value}\n")
    return 0


def markdown_table() -> str:
    """A section per group of settings (``GROUPS``): its name, what it is for, and one row
    per setting: its variable, its default and what it does."""
    sections = []
    for group in GROUPS:
        lines = [f"### {_title(group.__name__)}", "", " ".join((group.__doc__ or "").split()), ""]
        lines += ["| setting | default | meaning |", "| --- | --- | --- |"]
        for name in group.model_fields:
            field = Settings.model_fields[name]
            meaning = (field.description or "").replace("|", "\\|")
            lines.append(f"| `{PREFIX}{name.upper()}` | {_default(field.default)} | {meaning} |")
        sections.append("\n".join(lines) + "\n")
    return "\n".join(sections)


def _title(name: str) -> str:
    """``ClientLimits`` as ``Client limits``."""
    words = re.findall(r"[A-Z][a-z]*", name)
    return " ".join([words[0], *(word.lower() for word in words[1:])])


def spliced(page: str) -> str:
    """``page`` with the text between its two markers replaced by the current table;
    ``ValueError`` when it lacks them."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"the page has no {BEGIN} ... {END} markers")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"


def shown(value: object) -> str:
    """A value as an operator writes it; a secret only as set or unset."""
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, Path):
        return str(value)
    return str(value)


def _default(value: object) -> str:
    return "unset" if value is None else f"`{shown(value)}`"
