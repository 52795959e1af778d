"""The simulated server's answers in the shape of the engine it plays (``--engine``).

The serving path writes vLLM 0.32's bytes (``backends/sim/responses.py``); an engine other
than vLLM rewrites each SSE event and each whole answer into its own shape, as read in the
engines' sources (``policies/engines.py`` names files and commits):

- ``vllm-neuron``: vLLM's own shapes (the plugin runs inside vLLM 0.11); the server decides
  what is missing (no per-request metrics, draft counters at 0).
- ``sglang``: ``serving_chat.py``: a role chunk; content chunks with ``finish_reason`` and
  ``matched_stop`` null; then one chunk per finished choice with an empty delta, its
  ``finish_reason`` and ``matched_stop``; with ``return_spec_tokens_details`` a chunk with
  ``sglext.spec_tokens_details``; the usage chunk (empty ``choices``). Whole answers add
  ``matched_stop`` per choice, ``metadata`` and, when asked, ``sglext``.
- ``trtllm``: ``postprocess_handlers.py``: chunks written without null fields, the role
  chunk's line ending in a space; every choice carries ``avg_decoded_tokens_per_iter`` (the
  request's tokens over its iterations so far) and ``stop_reason``; no ``metrics``.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson

Json = dict[str, Any]
_DONE = b"data: [DONE]\n\n"
_SGLANG_DELTA = ("role", "content", "tool_calls")


class SimEngine(StrEnum):
    VLLM = "vllm"
    VLLM_NEURON = "vllm-neuron"
    SGLANG = "sglang"
    TRTLLM = "trtllm"

    @property
    def vllm_shaped(self) -> bool:
        return self in (SimEngine.VLLM, SimEngine.VLLM_NEURON)


def chunk(engine: SimEngine, event: bytes, per_step: float | None = None) -> list[bytes]:
    """One vLLM SSE event as ``engine`` writes it (several events for SGLang's finish)."""
    if engine.vllm_shaped or event == _DONE or not event.startswith(b"data: "):
        return [event]
    body = orjson.loads(event[6:])
    if not isinstance(body, dict) or "error" in body or "sglext" in body:
        return [event]
    if engine is SimEngine.SGLANG:
        return [_sse(c) for c in _sglang_chunks(body)]
    return [_trtllm_chunk(body, per_step)]


def whole(
    engine: SimEngine,
    body: bytes,
    per_step: float | None = None,
    ext: tuple[int, int, int] | None = None,
) -> bytes:
    """A vLLM non-streaming answer as ``engine`` writes it (``ext``: SGLang's verify steps,
    proposed and correct drafts, for a request that asked for them)."""
    if engine.vllm_shaped:
        return body
    answer = orjson.loads(body)
    if not isinstance(answer, dict) or "choices" not in answer:
        return body
    for key in ("metrics", "kv_transfer_params", "ec_transfer_params", "service_tier"):
        answer.pop(key, None)
    for key in ("prompt_logprobs", "prompt_token_ids", "prompt_text"):
        answer.pop(key, None)
    for choice in answer["choices"]:
        for key in ("token_ids", "routed_experts"):
            choice.pop(key, None)
        if engine is SimEngine.SGLANG:
            choice.pop("stop_reason", None)
            choice["matched_stop"] = None
        elif per_step is not None:
            choice["avg_decoded_tokens_per_iter"] = per_step
    if engine is SimEngine.SGLANG:
        answer.pop("system_fingerprint", None)
        answer["metadata"] = {"weight_version": "default"}
        if ext is not None:
            answer["sglext"] = sglang_details(*ext)
    return orjson.dumps(answer)


def _sse(body: Json, tail: bytes = b"\n\n") -> bytes:
    return b"data: " + orjson.dumps(body) + tail


def _sglang_envelope(body: Json, choices: list[Json]) -> Json:
    return {
        "id": body.get("id"),
        "object": body.get("object"),
        "created": body.get("created"),
        "model": body.get("model"),
        "choices": choices,
        "usage": None,
    }


def _sglang_chunks(body: Json) -> list[Json]:
    choices = body.get("choices") or []
    if not choices:  # the usage chunk: usage only, nothing speculative
        usage = body.get("usage")
        return [_sglang_envelope(body, []) | {"usage": usage}]
    out: list[Json] = []
    finishing: list[Json] = []
    for choice in choices:
        delta = choice.get("delta")
        kept: Json = {"index": choice.get("index", 0)}
        if delta is not None:
            kept["delta"] = {
                k: v for k, v in delta.items() if k in ("role", "content", "tool_calls")
            }
        else:
            kept["text"] = choice.get("text", "")
        kept.update(logprobs=choice.get("logprobs"), finish_reason=None, matched_stop=None)
        out.append(_sglang_envelope(body, [kept]))
        if choice.get("finish_reason") is not None:
            ending: Json = {"index": kept["index"]}
            ending["delta" if delta is not None else "text"] = {} if delta is not None else ""
            ending.update(finish_reason=choice["finish_reason"], matched_stop=None)
            finishing.append(_sglang_envelope(body, [ending]))
    return out + finishing


def _trtllm_chunk(body: Json, per_step: float | None) -> bytes:
    choices = body.get("choices") or []
    role = any((c.get("delta") or {}).get("role") for c in choices)
    kept: Json = {k: v for k, v in body.items() if k in ("id", "object", "created", "model")}
    if not choices:
        kept.update(choices=[], usage=body.get("usage"))
        return _sse(kept)
    out = []
    for choice in choices:
        slim: Json = {k: v for k, v in choice.items() if v is not None and k != "token_ids"}
        if "delta" in slim:
            slim["delta"] = {k: v for k, v in slim["delta"].items() if v not in (None, "")}
            if role:
                slim["delta"] = {"role": "assistant"}
        if not role and per_step is not None:
            slim["avg_decoded_tokens_per_iter"] = per_step
        out.append(slim)
    kept["choices"] = out
    return _sse(kept, b" \n\n" if role else b"\n\n")


def sglang_ext(envelope: Json, steps: int, drafted: int, accepted: int) -> bytes:
    """SGLang's ``sglext`` chunk (``return_spec_tokens_details``) for one answer."""
    body = {k: envelope.get(k) for k in ("id", "object", "created", "model")}
    body.update(choices=[], usage=None, sglext=sglang_details(steps, drafted, accepted))
    return _sse(body)


def sglang_details(steps: int, drafted: int, accepted: int) -> Json:
    return {
        "spec_tokens_details": {
            "spec_accept_rate": accepted / drafted if drafted else 0.0,
            "spec_accept_length": (accepted + steps) / steps if steps else 0.0,
            "spec_num_correct_drafts": accepted,
            "spec_num_proposed_drafts": drafted,
            "spec_verify_ct": steps,
        }
    }
