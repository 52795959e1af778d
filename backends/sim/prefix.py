"""What the simulated engine caches a request under: its content, rendered as a chat
template would and cut into block hashes, as vLLM's automatic prefix caching does.

The simulator has no tokenizer: it counts about four characters a token
(``backends/sim/workload.py``), so a block of ``block_size`` tokens is ``4 * block_size``
characters of the rendered text. Each block's hash is a 64-bit BLAKE2b digest of its
parent's hash and its characters (the first block's parent: the request's *root*, a hash of
what a template puts before the messages, i.e. the ``tools``, and vLLM's ``cache_salt``), so
two requests share block ``i`` exactly when everything up to the end of block ``i`` is the
same.

The rendering appends one message after another, each as ``<|role|>`` + its text (its
``tool_calls`` and ``tool_call_id``, if any) + ``<|end|>``, then the generation prompt
``<|assistant|>``; a completions prompt is its text as it is, a prompt of token ids its ids.
So a conversation resent with one more turn (the answer as an ``assistant`` message, then
the next ``user`` or ``tool`` message) starts with the whole previous request and its
answer, on chat, completions, and on Messages and Responses (which become chat requests
first, ``backends/sim/agents.py``). A sequence's chain runs over its prompt *and* its answer
(``sequence_hashes``), so the answer's blocks are cached as the engine computes them, and
the next turn finds them.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import orjson

from backends.sim.workload import CHARS_PER_TOKEN

_END = "<|end|>\n"
_GENERATION_PROMPT = "<|assistant|>"


def _digest(parent: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(parent + data, digest_size=8).digest()


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") for p in content if isinstance(p, Mapping))
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def _message(message: Mapping[str, object]) -> str:
    out = f"<|{message.get('role')}|>{_text(message.get('content'))}"
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out += orjson.dumps(calls, option=orjson.OPT_SORT_KEYS).decode()
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        out += f"<|call {call_id}|>"
    return out + _END


def render(body: Mapping[str, object]) -> str:
    """The request's prompt as the engine would see it (see the module docstring)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = [_message(m) for m in messages if isinstance(m, Mapping)]
        return "".join(parts) + _GENERATION_PROMPT
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(p for p in prompt if isinstance(p, str))
    return ""


def answer_text(pieces: Sequence[str]) -> str:
    """How an answer's tokens continue its rendered prompt (the ``assistant`` message the
    client sends back next turn, when it sends back the text it got)."""
    return "".join(pieces) + _END


def _root(body: Mapping[str, object]) -> bytes:
    tools = body.get("tools")
    salt = body.get("cache_salt")
    key = {"tools": tools if isinstance(tools, list) else None, "salt": salt}
    return _digest(b"", orjson.dumps(key, option=orjson.OPT_SORT_KEYS))


def _ids(body: Mapping[str, object]) -> list[int] | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return [t for t in prompt if type(t) is int]
    return None


def chain(text: str, block_size: int, root: bytes = b"") -> tuple[int, ...]:
    """The hashes of the full blocks of ``text`` (``CHARS_PER_TOKEN * block_size``
    characters each), each block's including its parent's."""
    width = CHARS_PER_TOKEN * block_size
    data = text.encode("utf-8", "surrogatepass")
    # Cut on characters, not bytes, so that a block means the same text in any script.
    if len(data) != len(text):
        return _chain_chars(text, width, root)
    out, parent = [], root
    for start in range(0, len(data) - width + 1, width):
        parent = _digest(parent, data[start : start + width])
        out.append(int.from_bytes(parent, "big"))
    return tuple(out)


def _chain_chars(text: str, width: int, parent: bytes) -> tuple[int, ...]:
    out = []
    for start in range(0, len(text) - width + 1, width):
        parent = _digest(parent, text[start : start + width].encode("utf-8", "surrogatepass"))
        out.append(int.from_bytes(parent, "big"))
    return tuple(out)


def _id_chain(ids: list[int], block_size: int, root: bytes) -> tuple[int, ...]:
    out, parent = [], root
    for start in range(0, len(ids) - block_size + 1, block_size):
        block = b",".join(str(t).encode() for t in ids[start : start + block_size])
        parent = _digest(parent, block)
        out.append(int.from_bytes(parent, "big"))
    return tuple(out)


def prompt_hashes(body: Mapping[str, object], block_size: int) -> tuple[int, ...]:
    """The block hashes of a request's prompt."""
    return sequence_hashes(body, block_size, "")


def sequence_hashes(body: Mapping[str, object], block_size: int, answer: str) -> tuple[int, ...]:
    """The block hashes of a request's prompt followed by ``answer`` (``answer_text``; ""
    for the prompt alone). A prompt of token ids chains its ids, and its answer not."""
    ids = _ids(body)
    if ids is not None:
        return _id_chain(ids, block_size, _root(body))
    return chain(render(body) + answer, block_size, _root(body))
