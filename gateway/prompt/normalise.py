"""What changes in a prompt without meaning, taken out before hashing. Pure.

Two levels, both documented in docs/policy.md ("Prompt prefixes"):

- ``strip_billing`` (the block chain and the template fingerprint): Claude Code's billing
  line, ``x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli;
  cch=<hash>;``, which it puts at the top of the system prompt (its own text block, or the
  first line of a system string). Its ``cch`` and version suffix change every turn, so
  with it every turn's prompt would differ from the first characters. Only system text is
  touched: the same words in a user message are the user's.
- ``volatile`` (the template fingerprint only): every run of digits and hex letters, with
  ``-``, ``:``, ``.`` or ``/`` inside it, that holds a digit and is 4 or more characters
  long, replaced by ``#``: dates (``2026-11-29``, ``11/29/2026``), times (``10:05:33``),
  UUIDs, request ids and hashes with a digit in them, version numbers, long numbers.
  Shorter numbers stay (``2 of 3``). An engine caches exact tokens, so the block chain
  keeps them all: a prompt that differs in a date is not cached where the other one is.
"""

from __future__ import annotations

import re

BILLING = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)
# one pass that starts only at hex characters: ~10x faster than an alternation of
# uuid/date/time/hex patterns, which tries each at every position; and never at a hex
# character after another (a match never ends before one, and a run of them that fails
# from its first fails from each), or a run of hex letters without a digit is tried from
# each of its letters to its end, in time its length squared
_VOLATILE = re.compile(
    r"(?:(?<![0-9A-Fa-f])|(?![0-9A-Fa-f]))[0-9A-Fa-f]*\d(?:[0-9A-Fa-f:./-]*[0-9A-Fa-f])?"
)
_SHORTEST = 4


def strip_billing(system: str) -> str:
    """System text without Claude Code's billing line."""
    if "x-anthropic-billing-header:" not in system:
        return system
    return BILLING.sub("", system)


def volatile(text: str) -> str:
    """``text`` with ids, dates, times and long numbers as ``#``."""
    return _VOLATILE.sub(_placeholder, text)


def _placeholder(match: re.Match[str]) -> str:
    found = match.group()
    return "#" if len(found) >= _SHORTEST else found
