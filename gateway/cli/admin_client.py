"""What the commands that talk to a running gateway's admin API share: where it is
(``--gateway``, else ``SPECLANE_GATEWAY``), the token (``--token``, else
``SPECLANE_ADMIN_TOKEN``), and one line for an answer that refuses the token.

Command-line edge only.
"""

from __future__ import annotations

import argparse

import orjson


def gateway_url(args: argparse.Namespace) -> str:
    """``--gateway``, else ``SPECLANE_GATEWAY`` (default ``http://127.0.0.1:8080``)."""
    given: str | None = getattr(args, "gateway", None)
    if given:
        return given
    from gateway.settings import Settings

    return Settings().gateway


def admin_token(args: argparse.Namespace) -> str:
    """``--token``, else ``SPECLANE_ADMIN_TOKEN``; "" when neither says."""
    given: str | None = getattr(args, "token", None)
    if given is not None:
        return given.strip()
    from gateway.settings import Settings

    secret = Settings().admin_token
    return secret.get_secret_value().strip() if secret else ""


def refused(status: int, url: str, body: bytes = b"") -> str | None:
    """One line when the admin API refuses the token: the gateway's own words (``wrong
    token``, ``disabled``) and how to give the token; None for other answers."""
    if status not in (401, 403):
        return None
    said = _message(body) or ("no admin token" if status == 401 else "the token is refused")
    return (
        f"{url}: {said} ({status}): pass the gateway's SPECLANE_ADMIN_TOKEN with --token, or "
        "set SPECLANE_ADMIN_TOKEN"
    )


def _message(body: bytes) -> str:
    try:
        error = orjson.loads(body).get("error", {})
        message = error.get("message") if isinstance(error, dict) else None
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return message if isinstance(message, str) else ""
