"""The simulated server's routes beside generation, small and deterministic, in vLLM's
shapes: ``POST /tokenize`` and ``/detokenize`` (one token per UTF-8 byte, ids 0-255, as a
byte-level tokenizer's base vocabulary), ``POST /v1/embeddings`` (a unit vector of
``DIMENSIONS`` floats from a hash of each input), ``GET /v1/models/{id}`` (the model's card),
and vLLM's 404 (``{"detail": "Not Found"}``) for a path it does not serve.

Must not: keep state or read the clock itself (the app's wall clock is passed in).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.sim.config import SimConfig
from backends.sim.validation import SimHTTPError, bad_request

DIMENSIONS = 16
_JSON = "application/json"
_DETAIL = {404: "Not Found", 405: "Method Not Allowed"}

Card = Callable[[str], dict[str, Any]]


class OtherRoutes:
    """The routes above, for one simulated server; ``card`` makes a model's card."""

    def __init__(self, config: SimConfig, card: Card, wall_clock: Callable[[], float]) -> None:
        self._config = config
        self._card = card
        self._wall = wall_clock

    def routes(self) -> list[Route]:
        return [
            Route("/tokenize", self._answering(self._tokenize), methods=["POST"]),
            Route("/detokenize", self._answering(self._detokenize), methods=["POST"]),
            Route("/v1/embeddings", self._answering(self._embeddings), methods=["POST"]),
            Route("/v1/models/{model:path}", self._model_card, methods=["GET"]),
        ]

    def _answering(
        self, answer: Callable[[dict[str, Any], str], dict[str, Any]]
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                payload = _object(await request.body())
                model = self._model(payload.get("model"))
                return _json(answer(payload, model))
            except SimHTTPError as exc:
                return Response(exc.body, exc.status, media_type=_JSON)

        return endpoint

    async def _model_card(self, request: Request) -> Response:
        try:
            model = self._model(request.path_params["model"])
        except SimHTTPError as exc:
            return Response(exc.body, exc.status, media_type=_JSON)
        return _json(self._card(model))

    def _model(self, model: object) -> str:
        names = self._config.served_model_names
        if model is None:
            return names[0]
        if model not in names:
            message = f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}."
            raise SimHTTPError(404, message, "NotFoundError", "model")
        assert isinstance(model, str)
        return model

    def _tokenize(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        tokens = list(_prompt(payload).encode())
        return {
            "count": len(tokens),
            "max_model_len": self._config.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }

    def _detokenize(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        tokens = payload.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and 0 <= t < 256 for t in tokens
        ):
            raise bad_request("tokens must be a list of token ids in the vocabulary", "tokens")
        return {"prompt": bytes(tokens).decode(errors="replace")}

    def _embeddings(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        inputs = _inputs(payload.get("input"))
        data = [
            {"index": i, "object": "embedding", "embedding": _vector(text)}
            for i, text in enumerate(inputs)
        ]
        tokens = sum(len(text) for text in inputs)
        digest = hashlib.blake2b(orjson.dumps(payload), digest_size=16).hexdigest()
        return {
            "id": f"embd-{digest}",
            "object": "list",
            "created": int(self._wall()),
            "model": model,
            "data": data,
            "usage": {
                "prompt_tokens": tokens,
                "total_tokens": tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }


async def not_found(request: Request, exc: Exception) -> Response:
    """vLLM's (FastAPI's) answer for a path it does not serve, or a method it lacks."""
    assert isinstance(exc, HTTPException)
    detail = _DETAIL.get(exc.status_code, exc.detail)
    body = orjson.dumps({"detail": detail})
    return Response(body, exc.status_code, exc.headers, media_type=_JSON)  # 405: its Allow


def _json(value: object) -> Response:
    return Response(orjson.dumps(value), media_type=_JSON)


def _object(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad_request("the body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise bad_request("the body must be a JSON object")
    return payload


def _prompt(payload: dict[str, Any]) -> str:
    """A completion-style ``prompt``, or a chat-style ``messages`` list's text contents."""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "\n".join(
            m["content"]
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        )
    raise bad_request("give a prompt (a string) or messages", "prompt")


def _inputs(value: object) -> list[bytes]:
    """Each input as bytes: a string, a list of strings, token ids or lists of token ids."""
    if isinstance(value, str):
        return [value.encode()]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return [v.encode() for v in value]
        if all(isinstance(v, int) for v in value):
            return [orjson.dumps(value)]
        if all(isinstance(v, list) for v in value):
            return [orjson.dumps(v) for v in value]
    raise bad_request("input must be a string, a list of strings or of token ids", "input")


def _vector(text: bytes) -> list[float]:
    """A unit vector of ``DIMENSIONS`` floats, the same for the same input."""
    digest = hashlib.blake2b(text, digest_size=DIMENSIONS * 2).digest()
    raw = [
        int.from_bytes(digest[i : i + 2], "big") / 32767.5 - 1.0 for i in range(0, len(digest), 2)
    ]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]
