"""Token ids and logprobs of simulated answers, in vLLM 0.32's shapes.

A simulated token is a short piece of text (``backends/sim/text.py``); its id is a hash of the
piece, and its logprob and the alternatives ranked below it are drawn from the request's key
and the token's position, so a stream and a whole answer to the same request carry the same
numbers, and a greedy request gets the same ones on every server.

Pure: no I/O, no clock, no global random state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

VOCAB = 32000
_ALTERNATIVES = (" the", " a", ",", ".", " and", " of", "\n", " to", " is", " in")
Json = dict[str, Any]


def _draw(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest())


def token_id(piece: str) -> int:
    return _draw(f"id:{piece}") % VOCAB


def prompt_ids(text: str, count: int) -> list[int]:
    """``count`` token ids standing for a prompt of that many tokens."""
    return [_draw(f"prompt:{text}:{i}") % VOCAB for i in range(count)]


def _logprob(key: str) -> float:
    """The chosen token's logprob, between -2 and 0."""
    return -round((_draw(key) % 2000) / 1000.0, 4)


def _ranked(piece: str, key: str, top: int) -> list[tuple[str, float]]:
    """The chosen piece and ``top - 1`` alternatives, most likely first."""
    chosen = _logprob(key)
    others = [p for p in _ALTERNATIVES if p != piece]
    ranked = [(piece, chosen)]
    for rank, alternative in enumerate(others[: max(top - 1, 0)], start=1):
        ranked.append((alternative, round(chosen - rank - (_draw(f"{key}:{rank}") % 100) / 100, 4)))
    return ranked[:top] if top else []


def _entry(piece: str, logprob: float) -> Json:
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}


def chat_logprobs(pieces: Sequence[str], start: int, top: int, key: str) -> Json:
    """``choice.logprobs`` of a chat answer for tokens ``start..start+len(pieces)``."""
    content = []
    for i, piece in enumerate(pieces, start):
        position = f"{key}:{i}"
        entry = _entry(piece, _logprob(position))
        entry["top_logprobs"] = [_entry(p, lp) for p, lp in _ranked(piece, position, top)]
        content.append(entry)
    return {"content": content}


def completion_logprobs(pieces: Sequence[str], start: int, offset: int, top: int, key: str) -> Json:
    """``choice.logprobs`` of a completion: text offsets continue from ``offset``."""
    out: Json = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for i, piece in enumerate(pieces, start):
        position = f"{key}:{i}"
        out["text_offset"].append(offset)
        out["token_logprobs"].append(_logprob(position))
        out["tokens"].append(piece)
        out["top_logprobs"].append(dict(_ranked(piece, position, top)) if top else None)
        offset += len(piece)
    return out


def prompt_logprobs(ids: Sequence[int], top: int) -> list[dict[str, Json] | None]:
    """vLLM's ``prompt_logprobs``: none for the first prompt token; for each later one the
    ``top`` likeliest tokens by rank, led by the prompt's own token when it ranks below them
    (keyed by token id)."""
    out: list[dict[str, Json] | None] = [None]
    for i, token in enumerate(ids[1:], start=1):
        key = f"prompt:{token}:{i}"
        rank = 1 + _draw(key) % 8
        best = _logprob(key)
        ranked: dict[str, Json] = {}
        if rank > top:
            ranked[str(token)] = _prompt_entry(best - (rank - 1) / 4, rank)
        for r in range(1, top + 1):
            other = token if r == rank else (token + r * 7919) % VOCAB
            ranked[str(other)] = _prompt_entry(best - (r - 1) / 4, r)
        out.append(ranked)
    return out


def _prompt_entry(logprob: float, rank: int) -> Json:
    return {"logprob": round(logprob, 4), "rank": rank, "decoded_token": ""}
