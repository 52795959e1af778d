"""The APIs speclane routes, in one table: a short name, the HTTP path, and how the body
parses. OpenAI's chat and text completions and Responses, and Anthropic's Messages.

Both explain forms (``speclane policy explain --endpoint`` and ``POST
/admin/policy/explain``'s ``endpoint``) take either the short name (``chat``) or the path
(``/v1/chat/completions``) through ``named``. A new API is one more row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.schema import Kind
from policies.features import API_NAMES, Endpoint


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    path: Endpoint
    kind: Kind


_KINDS: dict[Endpoint, Kind] = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "completion",
    Endpoint.MESSAGES: "messages",
    Endpoint.RESPONSES: "responses",
}
APIS = tuple(Api(name, path, _KINDS[path]) for name, path in API_NAMES.items())
CHOICES = tuple(word for api in APIS for word in (api.name, api.path.value))
_BY_PATH = {api.path.value: api.name for api in APIS}


def api_of(path: str) -> str:
    """The short name of the API served at ``path``; empty for any other path."""
    return _BY_PATH.get(path, "")


def named(word: str) -> Api:
    """The API a short name or a path names; ``ValueError`` lists the choices."""
    for api in APIS:
        if word in (api.name, api.path.value):
            return api
    raise ValueError(f"unknown endpoint {word!r}: give one of {', '.join(CHOICES)}")
