"""Canned traffic for the overhead benchmark: the client's request bodies, the upstream's
vLLM-shaped answers (one SSE stream, one JSON body), and the nginx config that serves them.

The SSE body is 20 events, as vLLM sends them for a short chat answer with
``stream_options.include_usage``: a role chunk, 16 content chunks, a chunk carrying
``finish_reason``, the usage chunk (with vLLM's per-request ``speculative_decoding``
metrics, so the gateway's acceptance fold takes its richest path) and ``data: [DONE]``.
The JSON body is the matching non-streaming ``chat.completion``.

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


def request_body(stream: bool, model: str = MODEL) -> bytes:
    """The chat request every load generator sends (temperature 0.7: the default rule)."""
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


def sse_body() -> bytes:
    return b"".join(b"data: " + event + b"\n\n" for event in sse_events())


def json_body() -> bytes:
    message = {"role": "assistant", "content": "".join(_WORDS)}
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


def _sse_variables() -> tuple[str, str]:
    """``set`` lines holding the SSE body in parts, and the ``return`` text joining them."""
    parts: list[bytes] = [b""]
    for event in sse_events():
        block = b"data: " + event + b"\n\n"
        if parts[-1] and len(_quoted(parts[-1] + block)) > _TOKEN_LIMIT:
            parts.append(b"")
        parts[-1] += block
    sets = "\n".join(f"            set $sse{i} {_quoted(p)};" for i, p in enumerate(parts))
    joined = '"' + "".join(f"$sse{i}" for i in range(len(parts))) + '"'
    return sets, joined


def _without_modules(nginx: str) -> set[str]:
    """Modules this nginx was built without (their temp-path directives would not parse)."""
    built = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False).stderr
    return set(re.findall(r"--without-http_(\w+?)_module", built))


def nginx_config(nginx: str, port: int, tmp: Path, user: str, workers: int) -> str:
    """The config from ``nginx.conf.tmpl``: canned answers on 127.0.0.1:``port``."""
    sets, joined = _sse_variables()
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
    }
    text = _TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    return text
