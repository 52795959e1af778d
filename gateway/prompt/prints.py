"""The hashes a request's prompt is known by: its block chain, its conversation's opening
and its template. Pure; computed once per request, at classification (step 3).

The rendered prompt is the UTF-8 of its segments (``render.segments``), each as
``\\x1e<role>\\x1f<text>``: a separator before each segment, none after the last, so a
turn's rendering begins with the whole rendering of the turn before (every turn resends
the history and adds to its end).

**The chain.** The rendering is cut into blocks of ``BLOCK_BYTES`` (256) bytes, and block
*i*'s hash is the CRC-32 of the whole rendering up to the end of block *i*, carried on
from block *i-1*'s (``zlib.crc32(block, parent)``): each hash includes its parent's, as
an engine's block hashes do, so two prompts share a hash only where they share all of
the prompt before it. A chain entry packs the block's index above the CRC (``index << 32
| crc``), so two prompts collide only at the same length. The last partial block is not
hashed. At most ``MAX_BLOCKS`` (1,024: 256 KiB, ~55k tokens) are hashed; a longer prompt's
chain stops there.

Why 256 bytes (~55-64 tokens) and not vLLM's 16 tokens: the gateway sees characters, not
the engine's tokens, so it cannot line its blocks up with an engine's anyway; its chain
only has to tell which endpoint holds the longest part of a prompt, for which 64 tokens
either way changes nothing, while the cost is per block (one C call each): 16-token
blocks cost ~4x as much per request (``bench/prefix_hash.py``). Why CRC-32 and not a
cryptographic hash: it runs at memory speed in C and chains by construction; a
collision can only place one request on a colder endpoint.

**The opening** (``opening``): the hash of the rendering up to the end of the first user
segment (the system prompt and the first user message), which every turn of a
conversation repeats unchanged: what recognises a conversation, with no help from the
client.

**The template** (``template_fingerprint``): see its docstring.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable

from gateway.prompt.normalise import volatile
from gateway.prompt.render import Segment
from policies.features import PromptHashes

BLOCK_BYTES = 256
MAX_BLOCKS = 1024
SYSTEM_CHARS = 2048
USER_CHARS = 160
_REPLY = ("assistant", "call")
_READ = BLOCK_BYTES * MAX_BLOCKS  # segments past this change no hash: not rendered


def prints(parts: Iterable[Segment]) -> PromptHashes:
    """Every hash of the prompt made of ``parts``, read only as far as the chain's cap."""
    rendered, opening, system, user, replies = _rendering(parts)
    blocks = chain(rendered)
    return PromptHashes(
        chain=blocks,
        opening=opening << 32 | _crc_to(rendered, opening, blocks),
        size=len(rendered),
        template=template_fingerprint(system, user),
        turn=replies + 1,
    )


def opening_blocks(hashes: PromptHashes) -> int:
    """The blocks of the chain that lie wholly within the conversation's opening."""
    return (hashes.opening >> 32) // BLOCK_BYTES


def chain(rendered: bytes) -> tuple[int, ...]:
    """The block-hash chain of a rendering (the module docstring)."""
    view = memoryview(rendered)
    end = min(len(rendered) // BLOCK_BYTES, MAX_BLOCKS) * BLOCK_BYTES
    out: list[int] = []
    crc = 0
    for index, at in enumerate(range(0, end, BLOCK_BYTES)):
        crc = zlib.crc32(view[at : at + BLOCK_BYTES], crc)
        out.append(index << 32 | crc)
    return tuple(out)


def _crc_to(rendered: bytes, end: int, blocks: tuple[int, ...]) -> int:
    """The CRC of ``rendered[:end]``, carried on from the chain's last block before
    ``end`` rather than hashed again."""
    whole = min(end // BLOCK_BYTES, len(blocks))
    parent = blocks[whole - 1] & 0xFFFFFFFF if whole else 0
    return zlib.crc32(memoryview(rendered)[whole * BLOCK_BYTES : end], parent)


def template_fingerprint(system: str, user: str) -> str:
    """The hash (16 hex digits) of a prompt's template: the leading ``SYSTEM_CHARS``
    (2,048, ~450 tokens) of its ``system`` text and the leading ``USER_CHARS`` (160, ~35
    tokens) of its first ``user`` message, each with ids, dates, times and long numbers
    as placeholders (``normalise.volatile``) and Claude Code's billing line gone.

    Why these lengths: an application's template shows in its first tokens (the identity
    and task paragraph of a system prompt: "You are Claude Code...", a reviewer's rubric),
    while what differs between its users comes later (Claude Code's environment block,
    the pasted document, the user's question), so a longer lead would split one
    application by user and a shorter one would merge applications whose prompts open
    alike ("You are a helpful assistant."). Without a system prompt, the instruction a
    task template opens its first message with ("Review this diff:", "Summarise the
    report below") is within 160 characters, and little of the pasted material after it.
    """
    lead = volatile(system[:SYSTEM_CHARS])
    first = volatile(user[:USER_CHARS])
    data = f"{lead}\x1e{first}".encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _rendering(parts: Iterable[Segment]) -> tuple[bytes, int, str, str, int]:
    """The rendering, as far as the chain reads it; how many of its bytes open the
    conversation (up to the end of the first user segment, or all of it when there is
    none); the system text and the first user text, as far as the template reads them; the
    model's replies in it (runs of assistant and call segments), as far as it is read."""
    pieces: list[bytes] = []
    opening = -1
    size = 0
    system: list[str] = []
    user = ""
    replies = 0
    before = ""
    for role, text in parts:
        if role in _REPLY and before not in _REPLY:
            replies += 1
        before = role
        if role == "system":
            system.append(text[:SYSTEM_CHARS])
        elif opening < 0 and role in ("user", "prompt"):
            user = text[:USER_CHARS]
        piece = f"\x1e{role}\x1f{text}".encode()
        pieces.append(piece)
        size += len(piece)
        if opening < 0 and role in ("user", "prompt"):
            opening = size
        if size >= _READ and opening >= 0:
            break
    opened = size if opening < 0 else opening
    return b"".join(pieces), opened, "\n".join(system), user, replies
