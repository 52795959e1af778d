"""The OpenAI APIs speclane serves, in one table: a short name, the HTTP path, and how the
body parses.

Both explain forms (``speclane policy explain --endpoint`` and ``POST
/admin/policy/explain``'s ``endpoint``) take either the short name (``chat``) or the path
(``/v1/chat/completions``) through ``named``. A new API is one more row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.schema import Kind
from policies.features import Endpoint


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    path: Endpoint
    kind: Kind


APIS = (
    Api("chat", Endpoint.CHAT, "chat"),
    Api("completions", Endpoint.COMPLETIONS, "completion"),
)
CHOICES = tuple(word for api in APIS for word in (api.name, api.path.value))


def named(word: str) -> Api:
    """The API a short name or a path names; ``ValueError`` lists the choices."""
    for api in APIS:
        if word in (api.name, api.path.value):
            return api
    raise ValueError(f"unknown endpoint {word!r}: give one of {', '.join(CHOICES)}")
