"""Canned traffic for the overhead benchmark: the client's request bodies, the upstream's
vLLM-shaped answers (one SSE stream, one JSON body), and the nginx config that serves them.

The SSE body is 20 events, as vLLM sends them for a short chat answer with
``stream_options.include_usage``: a role chunk, 16 content chunks, a chunk carrying
``finish_reason``, the usage chunk (with vLLM's per-request ``speculative_decoding``
metrics, so the gateway's acceptance fold takes its richest path) and ``data: [DONE]``.
The JSON body is the matching non-streaming ``chat.completion``.

The other routes speclane relays have their canned answers too, the same 16 words in the
shapes vLLM 0.32 writes them (``route``): ``messages`` (Anthropic's Messages:
``message_start``, a text block of 16 ``content_block_delta`` events, ``message_delta``
with the usage, ``message_stop`` and vLLM's ``[DONE]``; 22 events) and ``responses``
(OpenAI's Responses: ``response.created`` ... 16 ``response.output_text.delta`` ...
``response.completed`` with the usage, no ``[DONE]``; 24 events), each event with its
``event:`` line; neither carries per-request speculative metrics, as vLLM's do not.

Which answer the upstream gives is chosen by the ``x-bench-stream`` request header, not by
the body: nginx cannot read JSON. The load generators send it; a pass-through proxy
forwards it; speclane does not, and always asks upstream for a stream (its design).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import orjson

MODEL = "tiny"
STREAM_HEADER = "x-bench-stream"
_ID = "chatcmpl-5f0c2a9d8e1b4c7a"
_CREATED = 1767225600
_WORDS = (
    "Draft",
    " tokens",
    " race",
    " ahead",
    ",",
    " the",
    " target",
    " checks",
    " them",
    " all",
    " at",
    " once",
    ";",
    " most",
    " survive",
    ".",
)
_TEMPLATE = Path(__file__).with_name("nginx.conf.tmpl")
_TOKEN_LIMIT = 3000  # nginx keeps one config token in a 4 KiB buffer; stay well below
_USAGE = {"prompt_tokens": 24, "total_tokens": 40, "completion_tokens": len(_WORDS)}
_SPEC_METRICS = {
    "mean_acceptance_length": 3.2,
    "draft_acceptance_rate": 0.55,
    "acceptance_histogram": [0, 1, 1, 1, 2],
    "num_spec_steps": 5,
    "num_accepted_draft_tokens": 11,
    "num_draft_tokens": 20,
    "num_spec_tokens": 4,
}


ROUTES = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
_SYSTEM = "You are a concise assistant."
_ASK = "Explain speculative decoding in one sentence."


def route_of(url: str) -> str:
    """The route a URL names, by its path's end (``chat`` unless another route's)."""
    return next((name for name, path in ROUTES.items() if url.endswith(path)), "chat")


def request_body(stream: bool, model: str = MODEL, route: str = "chat") -> bytes:
    """The request every load generator sends on ``route`` (temperature 0.7: the default
    rule)."""
    if route == "messages":
        ask = [{"role": "user", "content": _ASK}]
        return orjson.dumps(
            {"model": model, "system": _SYSTEM, "messages": ask, "max_tokens": 32}
            | {"temperature": 0.7, "stream": stream}
        )
    if route == "responses":
        return orjson.dumps(
            {"model": model, "instructions": _SYSTEM, "input": _ASK, "max_output_tokens": 32}
            | {"temperature": 0.7, "stream": stream}
        )
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Explain speculative decoding in one sentence."},
        ],
        "max_tokens": 32,
        "temperature": 0.7,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def request_headers(stream: bool) -> dict[str, str]:
    return {"content-type": "application/json", STREAM_HEADER: "1" if stream else "0"}


def _chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    head = {"id": _ID, "object": "chat.completion.chunk", "created": _CREATED, "model": MODEL}
    return orjson.dumps(head | {"choices": choices} | extra)


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def sse_events() -> list[bytes]:
    """The data payloads of the canned stream, ``[DONE]`` last; 20 in all."""
    events = [_chunk([_choice({"role": "assistant", "content": ""})])]
    events += [_chunk([_choice({"content": word})]) for word in _WORDS]
    events.append(_chunk([_choice({}, "stop")]))
    metrics = {"speculative_decoding": _SPEC_METRICS}
    events.append(_chunk([], usage=_USAGE, metrics=metrics))
    events.append(b"[DONE]")
    return events


def sse_body(route: str = "chat") -> bytes:
    return b"".join(_blocks(route))


def _blocks(route: str) -> list[bytes]:
    """The canned stream of ``route``, event by event, as the upstream writes them."""
    if route == "messages":
        return [*_messages_events(), b"data: [DONE]\n\n"]
    if route == "responses":
        return _responses_events()
    return [b"data: " + event + b"\n\n" for event in sse_events()]


def _event(body: dict[str, Any]) -> bytes:
    return b"event: " + body["type"].encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


def _messages_events() -> list[bytes]:
    message = {"id": _ID, "type": "message", "role": "assistant", "content": [], "model": MODEL}
    message |= {"stop_reason": None, "stop_sequence": None}
    message["usage"] = {"input_tokens": _USAGE["prompt_tokens"], "output_tokens": 0}
    events = [{"type": "message_start", "message": message}]
    events.append(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
        for w in _WORDS
    ]
    events.append({"type": "content_block_stop", "index": 0})
    used = {"input_tokens": _USAGE["prompt_tokens"], "output_tokens": len(_WORDS)}
    delta = {"stop_reason": "end_turn", "stop_sequence": None}
    events.append({"type": "message_delta", "delta": delta, "usage": used})
    events.append({"type": "message_stop"})
    return [_event(e) for e in events]


def _response(status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> Any:
    return {
        "id": "resp_" + _ID[9:],
        "created_at": _CREATED,
        "model": MODEL,
        "object": "response",
        "output": output,
        "status": status,
        "usage": usage,
    }


def _responses_events() -> list[bytes]:
    text = "".join(_WORDS)
    where = {"item_id": "msg_" + _ID[9:], "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": where["item_id"], "type": "message", "role": "assistant"}
    done_item = item | {"status": "completed", "content": [part]}
    used = {
        "input_tokens": _USAGE["prompt_tokens"],
        "output_tokens": len(_WORDS),
        "total_tokens": _USAGE["total_tokens"],
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response("in_progress", [], None)},
        {"type": "response.in_progress", "response": _response("in_progress", [], None)},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added"} | where | {"part": part | {"text": ""}},
        *({"type": "response.output_text.delta"} | where | {"delta": w} for w in _WORDS),
        {"type": "response.output_text.done"} | where | {"text": text},
        {"type": "response.content_part.done"} | where | {"part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": _response("completed", [done_item], used)},
    ]
    return [_event({"type": e["type"], "sequence_number": i} | e) for i, e in enumerate(events)]


def json_body(route: str = "chat") -> bytes:
    text = "".join(_WORDS)
    if route == "messages":
        used = {"input_tokens": _USAGE["prompt_tokens"], "output_tokens": len(_WORDS)}
        return orjson.dumps(
            {"id": _ID, "type": "message", "role": "assistant", "model": MODEL}
            | {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}
            | {"stop_sequence": None, "usage": used}
        )
    if route == "responses":
        completed = orjson.loads(_responses_events()[-1].split(b"data: ", 1)[1])
        return orjson.dumps(completed["response"])
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    return orjson.dumps(
        {
            "id": _ID,
            "object": "chat.completion",
            "created": _CREATED,
            "model": MODEL,
            "choices": [choice],
            "usage": _USAGE,
            "metrics": {"speculative_decoding": _SPEC_METRICS},
        }
    )


def _quoted(text: bytes) -> str:
    """``text`` as an nginx double-quoted string (nginx unescapes \\\\, \\" and \\n)."""
    escaped = text.decode().replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if "$" in escaped:
        raise ValueError("a canned body must not contain '$' (nginx would expand it)")
    return f'"{escaped}"'


def _sse_variables(route: str = "chat") -> tuple[str, str]:
    """``set`` lines holding the SSE body in parts, and the ``return`` text joining them."""
    parts: list[bytes] = [b""]
    for block in _blocks(route):
        if parts[-1] and len(_quoted(parts[-1] + block)) > _TOKEN_LIMIT:
            parts.append(b"")
        parts[-1] += block
    name = "sse" if route == "chat" else route
    sets = "\n".join(f"            set ${name}{i} {_quoted(p)};" for i, p in enumerate(parts))
    joined = '"' + "".join(f"${name}{i}" for i in range(len(parts))) + '"'
    return sets, joined


def _without_modules(nginx: str) -> set[str]:
    """Modules this nginx was built without (their temp-path directives would not parse)."""
    built = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False).stderr
    return set(re.findall(r"--without-http_(\w+?)_module", built))


def nginx_config(nginx: str, port: int, tmp: Path, user: str, workers: int) -> str:
    """The config from ``nginx.conf.tmpl``: canned answers on 127.0.0.1:``port``."""
    sets, joined = _sse_variables()
    messages_sets, messages_joined = _sse_variables("messages")
    responses_sets, responses_joined = _sse_variables("responses")
    missing = _without_modules(nginx)
    temp_paths = "\n".join(
        f"    {module}_temp_path {tmp / module};"
        for module in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        if module not in missing
    )
    values = {
        "USER": user,
        "WORKERS": str(workers),
        "TMP": str(tmp),
        "PORT": str(port),
        "TEMP_PATHS": temp_paths,
        "SSE_SETS": sets.lstrip(),
        "SSE_BODY": joined,
        "JSON_BODY": _quoted(json_body()),
        "MESSAGES_SSE_SETS": messages_sets.lstrip(),
        "MESSAGES_SSE_BODY": messages_joined,
        "MESSAGES_JSON_BODY": _quoted(json_body("messages")),
        "RESPONSES_SSE_SETS": responses_sets.lstrip(),
        "RESPONSES_SSE_BODY": responses_joined,
        "RESPONSES_JSON_BODY": _quoted(json_body("responses")),
    }
    text = _TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    return text
