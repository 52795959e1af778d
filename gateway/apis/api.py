"""What one API is, in one value, and the registry that looks APIs up.

An ``Api`` carries everything the gateway does differently for one API: where it is served
and what it is called, how its body parses, how its answers read, how its stream opens and
is relayed, how its errors look and whether its answers are stored upstream. Everything
else (steps 1-8, failover, measurement, the guardrail) is the same for every API. The
routes, the fast lane and every lookup by path are made from a ``Registry`` of them
(``gateway/apis/__init__.py``); a new API is one module that makes its ``Api`` and one row
there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from backends.upstream import DATA, Opening
from gateway.errors import Shape
from gateway.measure.answer import Dialect
from gateway.schema import AnyRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Api:
    """One API the gateway serves.

    ``name`` is its short name (a policy rule's ``endpoint`` may say it; ``Features.api``),
    ``path`` the HTTP path it is served at (``POST``), ``operation`` its GenAI semantic
    conventions' operation name (the trace's), and ``shape`` the shape of its errors
    (``gateway/errors.py``), also of every route under its path. ``model`` validates its
    body (step 2) and ``dialect`` reads its answers, streamed and whole (step 6,
    ``gateway/measure/answer.py``); the dialect also says how its stream is relayed: data
    payloads ended by ``[DONE]`` (``last`` None) or whole events as they came, ended by one
    of ``last`` (``gateway/forward/relay.py``). ``opening`` is how its stream opens and
    where an opening event carries an error (``backends/upstream.py``; it must agree with
    the dialect). ``assemble``: how a whole answer is assembled from the stream of a pool
    that streams only (``gateway/forward/assemble.py``), or None when a non-streaming
    request always goes upstream whole. ``limit``: the body field that bounds its output
    (the guardrail's short probes). ``stores``: its answers are stored upstream and may be
    continued (``previous_response_id``), so each is pinned to the endpoint that made it
    (``gateway/state/pins.py``).
    """

    name: str
    path: str
    operation: str
    shape: Shape
    model: type[AnyRequest]
    dialect: Dialect
    opening: Opening = DATA
    assemble: Literal["chat", "text"] | None = None
    limit: str = "max_tokens"
    stores: bool = False

    def __post_init__(self) -> None:
        if self.events != self.opening.events:
            raise ValueError(f"{self.name}: the dialect and the opening disagree on events")
        if self.events and self.assemble is not None:
            raise ValueError(f"{self.name}: a stream of whole events is never assembled")

    @property
    def events(self) -> bool:
        """Its stream is relayed event by event as it came, not chunk by chunk."""
        return self.dialect.last is not None


class Registry:
    """The APIs one gateway serves, and every lookup by path or name. Immutable."""

    __slots__ = ("_by_path", "_items")

    def __init__(self, apis: Iterable[Api]) -> None:
        self._items = tuple(apis)
        self._by_path = {api.path: api for api in self._items}
        names = {api.name for api in self._items}
        if len(self._by_path) != len(self._items) or len(names) != len(self._items):
            raise ValueError("two APIs share a path or a name")

    def __iter__(self) -> Iterator[Api]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def plus(self, *apis: Api) -> Registry:
        """These APIs and ``apis``."""
        return Registry((*self._items, *apis))

    def at(self, path: str) -> Api | None:
        """The API served at ``path``; None for any other path."""
        return self._by_path.get(path)

    def name_of(self, path: str) -> str:
        """The short name of the API served at ``path``; empty for any other path."""
        api = self._by_path.get(path)
        return "" if api is None else api.name

    def shape_of(self, path: str) -> Shape:
        """The error shape of ``path``: its API's, or that of the API it is under
        (``/v1/messages/count_tokens`` is Anthropic's, ``/v1/responses/{id}`` the Responses
        API's); OpenAI's for every other path."""
        api = self._by_path.get(path)
        if api is not None:
            return api.shape
        for api in self._items:
            if path.startswith(api.path + "/"):
                return api.shape
        return "openai"

    @property
    def choices(self) -> tuple[str, ...]:
        """Every word that names an API: its short name and its path."""
        return tuple(word for api in self._items for word in (api.name, api.path))

    def named(self, word: str) -> Api:
        """The API a short name or a path names; ``ValueError`` lists the choices."""
        for api in self._items:
            if word in (api.name, api.path):
                return api
        raise ValueError(f"unknown endpoint {word!r}: give one of {', '.join(self.choices)}")
