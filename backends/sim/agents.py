"""The APIs a simulated vLLM serves by way of its chat engine, as vLLM does: Anthropic's
Messages (``api_messages.py``) and OpenAI's Responses (``api_responses.py``). One object
per request says how its body becomes a chat request, and how the chat answer, streamed
(``Converter.feed`` per chat chunk) or whole, becomes its own. Pure.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from backends.sim import api_messages, api_responses
from backends.sim.responses import Answer
from backends.sim.stored import Stored
from backends.sim.validation import SimHTTPError


class Converter(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...


class AgentApi(Protocol):
    def chat_body(self, body: bytes) -> bytes:
        """The chat request; ``SimHTTPError`` for a body the API refuses."""
        ...

    def error(self, error: SimHTTPError) -> bytes: ...

    def stream(self, answer: Answer) -> Converter: ...

    def whole(self, answer: Answer, chat_body: bytes) -> bytes: ...


class MessagesApi:
    """``POST /v1/messages``; ``cache_read``: report prefix-cache hits as
    ``cache_read_input_tokens``."""

    def __init__(self, *, cache_read: bool = False) -> None:
        self._cache_read = cache_read

    def chat_body(self, body: bytes) -> bytes:
        return orjson.dumps(api_messages.chat_request(body))

    def error(self, error: SimHTTPError) -> bytes:
        return api_messages.error_body(error)

    def stream(self, answer: Answer) -> Converter:
        return api_messages.MessagesStream(answer.prompt_tokens, cache_read=self._cache_read)

    def whole(self, answer: Answer, chat_body: bytes) -> bytes:
        return api_messages.whole(chat_body, cache_read=self._cache_read)


class ResponsesApi:
    """``POST /v1/responses``; the answers made are kept: their conversations in
    ``histories`` (what ``previous_response_id`` continues), their bodies in ``bodies``
    (what ``GET /v1/responses/{id}`` reads). An answer's id is the body's ``request_id``
    when it names one, as vLLM's (whatever was kept under that id before is replaced),
    else one made from the request's."""

    def __init__(self, histories: api_responses.Histories, bodies: Stored, created: int) -> None:
        self._stored = histories
        self._bodies = bodies
        self._created = created
        self._request: dict[str, Any] = {}
        self._messages: list[dict[str, Any]] = []

    def chat_body(self, body: bytes) -> bytes:
        chat = api_responses.chat_request(body, self._stored)
        self._request = orjson.loads(body)
        self._messages = chat["messages"]
        return orjson.dumps(chat)

    def error(self, error: SimHTTPError) -> bytes:
        return error.body

    def stream(self, answer: Answer) -> Converter:
        stream = api_responses.ResponsesStream(self._id(answer), self._request, self._created)
        return _Kept(self, stream)

    def whole(self, answer: Answer, chat_body: bytes) -> bytes:
        response_id = self._id(answer)
        body = api_responses.whole(chat_body, response_id, self._request, self._created)
        message = orjson.loads(chat_body)["choices"][0].get("message") or {}
        self.keep(response_id, {k: v for k, v in message.items() if v is not None}, body)
        return orjson.dumps(body)

    def keep(self, response_id: str, message: dict[str, Any], body: dict[str, Any]) -> None:
        if self._request.get("store", True) is not False:
            self._stored.keep(response_id, [*self._messages, message])
            self._bodies.store(response_id, body)

    def _id(self, answer: Answer) -> str:
        named = self._request.get("request_id")
        if isinstance(named, str) and named:
            return named
        return "resp_" + answer.request_id.removeprefix("chatcmpl-")


class _Kept:
    """A Responses stream whose answer is kept once it completes."""

    def __init__(self, api: ResponsesApi, stream: api_responses.ResponsesStream) -> None:
        self._api = api
        self._stream = stream
        self._kept = False

    def feed(self, chunk: bytes) -> bytes:
        out = self._stream.feed(chunk)
        final = self._stream.final
        if final is not None and not self._kept:
            self._kept = True
            self._api.keep(self._stream.response_id, self._stream.message, final)
        return out


def chat_of(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The chat request a request of the API at ``path`` becomes on a simulated server,
    whatever it would continue (no stored responses): what decides its workload and its
    acceptance. A chat or completions body is itself."""
    if path == "/v1/messages":
        return api_messages.chat_request(orjson.dumps(body))
    if path == "/v1/responses":
        alone = {k: v for k, v in body.items() if k != "previous_response_id"}
        return api_responses.chat_request(orjson.dumps(alone), api_responses.Histories())
    return body
