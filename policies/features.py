"""What classification extracts from one request: the input of every policy decision.

Policies own this contract; ``gateway/classify.py`` produces the values. Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class ResponseFormat(StrEnum):
    """The kind of output the client asked for (`response_format.type`)."""

    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"


class Endpoint(StrEnum):
    """The API the request came in on: OpenAI's chat and text completions and Responses,
    Anthropic's Messages."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    MESSAGES = "/v1/messages"
    RESPONSES = "/v1/responses"


# the short name of each API: what a rule's ``endpoint`` may say instead of the path
API_NAMES = {
    "chat": Endpoint.CHAT,
    "completions": Endpoint.COMPLETIONS,
    "messages": Endpoint.MESSAGES,
    "responses": Endpoint.RESPONSES,
}


@dataclass(frozen=True, slots=True)
class PromptHashes:
    """What a request's prompt is known by, hashes only (``gateway/prompt/prints.py``):
    ``chain``, one hash per block of its canonical rendering, each including its parent's;
    ``opening``, the hash of its conversation's opening (system prompt and first user
    message), the same for every turn of one conversation; ``size``, the rendering's
    bytes; ``template``, the fingerprint of its prompt template (hex); ``turn``, which turn
    of its conversation the request is (the model's replies in it, plus one)."""

    chain: tuple[int, ...] = ()
    opening: int = 0
    size: int = 0
    template: str = ""
    turn: int = 1


@dataclass(frozen=True, slots=True)
class Features:
    """One request as the policy sees it.

    ``endpoint`` is the HTTP path, or the product endpoint a caller names in the
    ``x-speclane-endpoint`` header; ``api`` is the short name of the API the request came
    in on (``API_NAMES``), whatever the header says: a rule's ``endpoint`` matches either.
    ``temperature`` and ``top_p`` already hold the backend's defaults when the request left
    them out. ``tenant`` comes from a source the operator trusts (``gateway/identity.py``),
    never from the body. ``routing_key`` is what percentage rollouts hash: who the request
    comes from by that source (the tenant), and empty for ``anonymous``, which is outside
    every partial rollout; nothing in the body changes it. ``user`` is the body's ``user``
    (Anthropic's ``metadata.user_id``), which only keeps one user in one experiment arm.
    ``thinking``: the request asks for reasoning before its answer (Anthropic's
    ``thinking``, OpenAI's ``reasoning``). ``defaulted`` names the features the request
    left out, read as the served model's defaults (``temperature``, ``top_p``).
    ``prompt``: the prompt's hashes, computed once here for the pool's choice of
    endpoint and for whatever reads the template.
    """

    endpoint: str
    model: str
    api: str = ""
    temperature: float = 1.0
    top_p: float = 1.0
    tools: tuple[str, ...] = ()
    tools_fingerprint: str = ""
    response_format: ResponseFormat = ResponseFormat.TEXT
    schema_name: str = ""
    prompt_tokens: int = 0
    max_tokens: int | None = None
    stream: bool = False
    n: int = 1
    tenant: str = ""
    routing_key: str = ""
    user: str = ""
    request_id: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    thinking: bool = False
    defaulted: tuple[str, ...] = ()
    prompt: PromptHashes = field(default_factory=PromptHashes)

    @property
    def has_tools(self) -> bool:
        return bool(self.tools)
