"""Splitting a slice by the applications inside it, and merging it back. Pure; time is an
argument.

A policy's slices are drawn by its author (rule, temperature and context bands, tool
schema); the applications inside one slice may still have opposite economics: a code
reviewer that gains from speculation beside a report writer that loses. Each request
therefore carries *candidate* values, one per split key (``candidates``):

- ``template``: the fingerprint of its prompt template (``Features.prompt.template``);
- ``tenant``: the tenant (from a trusted source, never the body);
- ``tools``: its tool-schema fingerprint;
- ``api``: the API it came in on (chat, completions, messages, responses);
- ``header:<name>``: any header the policy names (its value hashed).

Live statistics keep, per slice, bounded evidence per candidate value
(``gateway/measure/children.py``) and judge each value as the guardrail judges a slice
(``policies/economics.py``: cost per output token on the serving rung against its
neighbours, with ``min_samples``). ``propose`` splits a slice by the first key with two
values whose point estimates lean to different rungs and whose tokens per step differ at
the guardrail's ``confidence`` (``differ``): each judged value becomes a child (at most
``max_children``, busiest first; every other value stays pooled in the parent). A child
starts from its parent's guardrail state and from its own evidence gathered while it was
pooled: no cold start. ``merge_due`` merges the children back once every child has served
on its parent's rung, with no confident difference left between them, for
``merge_after_s`` (hysteresis: a split needs a confident difference, a merge a long
agreement, so the two cannot alternate on noise).

A child's key is its parent's plus a slot, ``<parent> / app:3``: slots 1..max_children,
never a raw hash, so metric labels stay bounded.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.economics import Tally, log_tokens_per_step, summed
from policies.features import Features

KEYS = ("template", "tenant", "tools", "api")
_SLOT_WORDS = {"template": "app", "tenant": "tenant", "tools": "toolset", "api": "api"}
_CHILD = re.compile(r"^(?P<parent>.+) / (?:app|tenant|toolset|api|hdr):\d+$")
HEADER = "header:"


def valid_key(key: str) -> bool:
    """Whether ``key`` names something a slice can split by."""
    return key in KEYS or (key.startswith(HEADER) and len(key) > len(HEADER))


def slot_word(key: str) -> str:
    """The word a child's slot is labelled with (``app`` for templates)."""
    return _SLOT_WORDS.get(key, "hdr")


def parent_of(key: str) -> str | None:
    """The slice a child's key was split from (None for a slice that is no child)."""
    found = _CHILD.match(key)
    return found.group("parent") if found else None


def candidates(features: Features, keys: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The request's value for each split key (empty values are left out): hashes, names
    and short words only, never prompt text."""
    out = []
    for key in keys:
        value = _value(features, key)
        if value:
            out.append((key, value))
    return tuple(out)


def _value(features: Features, key: str) -> str:
    if key == "template":
        return features.prompt.template
    if key == "tenant":
        return features.tenant
    if key == "tools":
        return features.tools_fingerprint
    if key == "api":
        return features.api
    raw = features.headers.get(key[len(HEADER) :].lower(), "")
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest() if raw else ""


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """The policy's ``slices:`` settings for splitting: ``keys`` empty when it is off."""

    keys: tuple[str, ...] = ()
    max_children: int = 8
    merge_after_s: float = 600.0
    pins: Mapping[str, str] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return bool(self.keys or self.pins)

    def watched(self) -> tuple[str, ...]:
        """Every key a request's candidate values are read for."""
        return tuple(dict.fromkeys((*self.keys, *self.pins.values())))


@dataclass(frozen=True, slots=True)
class Split:
    """One slice split by ``key``: child ``i`` (1-based slot) serves requests whose value is
    ``values[i-1]``; every other value stays in the parent. ``values`` empty: merged back
    (kept so that the version goes on rising). ``why``: the evidence it split on."""

    parent: str
    key: str
    values: tuple[str, ...]
    since: float
    version: int
    why: str = ""
    pinned: bool = False

    @property
    def live(self) -> bool:
        return bool(self.values)

    def child(self, slot: int) -> str:
        return f"{self.parent} / {slot_word(self.key)}:{slot}"

    def children(self) -> tuple[str, ...]:
        return tuple(self.child(i + 1) for i in range(len(self.values)))

    def route(self, found: Mapping[str, str]) -> str | None:
        """The child a request with candidate values ``found`` belongs to, or None."""
        value = found.get(self.key)
        if value is None or value not in self.values:
            return None
        return self.child(self.values.index(value) + 1)


def route(parent: str, found: tuple[tuple[str, str], ...], splits: Mapping[str, Split]) -> str:
    """The slice a request of ``parent`` with candidate values ``found`` is kept in."""
    split = splits.get(parent)
    if split is None or not split.live:
        return parent
    return split.route(dict(found)) or parent


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the judge says of one candidate value of a slice: ``wants`` -1 a rung down, 0
    its serving rung, +1 a rung up, each with the guardrail's confidence; None: not sure.
    ``ratio`` and ``z``: the deciding judgement's cost ratio and z. ``leans``: the same
    direction on the point estimate alone; ``tallies``: its tokens per step on the
    speculative rung judged, bucket by bucket of its window (by the bucket's start), and
    ``reach``: its requests' mean decode, in seconds."""

    value: str
    requests: int
    wants: int | None
    ratio: float = 1.0
    z: float = 0.0
    leans: int = 0
    tallies: Mapping[float, Tally] = field(default_factory=dict)
    reach: float = 0.0


def differ(a: Verdict, b: Verdict) -> float:
    """How many standard deviations apart two values' tokens per step lie on the same
    speculative rung, where their point estimates lean to different rungs (0 otherwise),
    over the times both were served at: each value's buckets no farther from one of the
    other's than the longer ``reach`` (a request counts in the bucket it ended in, and
    was being served for its decode before that). The values share the rung's step time
    and price, so its doubt cancels: only their tokens per step can tell them apart, and
    only at the same times. A slice's economics change with time (a collapse, a healing,
    a surge): one value's requests from before a change and another's from after it
    differ by the change, not by what the values are (an agent's conversations, each a
    template of its own, come and go at different times)."""
    if a.leans == b.leans:
        return 0.0
    reach = max(a.reach, b.reach)
    mine = log_tokens_per_step(summed(_beside(a.tallies, b.tallies, reach)))
    theirs = log_tokens_per_step(summed(_beside(b.tallies, a.tallies, reach)))
    if mine is None or theirs is None:
        return 0.0
    return abs(mine[0] - theirs[0]) / math.sqrt(max(mine[1] + theirs[1], 1e-12))


def _beside(
    mine: Mapping[float, Tally], theirs: Mapping[float, Tally], reach: float
) -> Iterator[Tally]:
    """The tallies of ``mine`` in buckets no farther than ``reach`` from one of
    ``theirs``."""
    times = sorted(theirs)
    for at, tally in mine.items():
        i = bisect.bisect_left(times, at - reach)
        if i < len(times) and times[i] <= at + reach:
            yield tally


def wants(below_verdict: int | None, above_verdict: int | None) -> int | None:
    """A value's confident direction from its judgements against the rung below and the
    rung above (each +1: the upper rung cheaper, -1: the lower, 0 or None: unsure)."""
    if below_verdict is not None and below_verdict < 0:
        return -1
    if above_verdict is not None and above_verdict > 0:
        return 1
    if below_verdict or above_verdict:
        return 0
    return None


_WORDS = {-1: "cheaper a rung down", 0: "cheapest where it is", 1: "cheaper a rung up"}


def propose(
    parent: str,
    verdicts: Mapping[str, Sequence[Verdict]],
    keys: Sequence[str],
    *,
    max_children: int,
    min_samples: int,
    version: int,
    now: float,
    z_needed: float = 3.09,
) -> Split | None:
    """A split of ``parent`` by the first of ``keys`` with two values, each with
    ``min_samples`` requests, whose point estimates lean to different rungs and whose
    tokens per step differ with the guardrail's confidence (``z_needed`` standard
    deviations, ``differ``), over the times both were served at: a window's newest
    requests alone differ between values whenever the slice's economics just changed (one
    value's newest request came after a healing, another's before), and so do two whole
    windows that hold different minutes. None when no key does."""
    for key in keys:
        judged = [v for v in verdicts.get(key, ()) if v.requests >= min_samples]
        apart = max(
            (differ(a, b) for i, a in enumerate(judged) for b in judged[i + 1 :]), default=0.0
        )
        if apart < z_needed:
            continue
        chosen = sorted(judged, key=lambda v: (-v.requests, v.value))[:max_children]
        parts = [
            f"{slot_word(key)}:{i + 1} {_WORDS[v.leans if v.wants is None else v.wants]} "
            f"({v.ratio:.2f}x, z {v.z:+.1f}, {v.requests} requests)"
            for i, v in enumerate(chosen)
        ]
        parts.append(f"tokens per step {apart:.1f} standard deviations apart")
        why = f"split by {key}: " + "; ".join(parts)
        values = tuple(v.value for v in chosen)
        return Split(parent, key, values, now, version + 1, why)
    return None


def pin(
    parent: str,
    key: str,
    counts: Mapping[str, int],
    *,
    max_children: int,
    min_samples: int,
    version: int,
    now: float,
) -> Split | None:
    """A split the policy pins: by ``key``, its busiest values with ``min_samples`` requests
    (``counts``) as children, whatever their economics."""
    busy = sorted((v for v, n in counts.items() if n >= min_samples), key=lambda v: -counts[v])
    if not busy:
        return None
    values = tuple(busy[:max_children])
    return Split(
        parent, key, values, now, version + 1, f"split by {key}: pinned by the policy", pinned=True
    )


def agree(parent_offset: int, child_offsets: Sequence[int]) -> bool:
    """Every child serves on its parent's rung: the split no longer changes a decision."""
    return all(offset == parent_offset for offset in child_offsets)


def merge_due(agreeing_since: float | None, now: float, merge_after_s: float) -> bool:
    """Merge back once the children have agreed with their parent for ``merge_after_s``."""
    return agreeing_since is not None and now - agreeing_since >= merge_after_s


def merged(split: Split, now: float, why: str) -> Split:
    """``split`` merged back: no children, the next version."""
    return Split(split.parent, split.key, (), now, split.version + 1, why)


def split_json(split: Split) -> dict[str, Any]:
    """A split as JSON (the shared store, ``/admin/stats``)."""
    return {
        "parent": split.parent,
        "key": split.key,
        "values": list(split.values),
        "since": split.since,
        "version": split.version,
        "why": split.why,
        "pinned": split.pinned,
    }


def split_of(d: Mapping[str, Any]) -> Split:
    """A split from ``split_json``'s JSON; ``KeyError``/``ValueError``/``TypeError`` when
    it is not one."""
    return Split(
        str(d["parent"]),
        str(d["key"]),
        tuple(str(v) for v in d["values"]),
        float(d["since"]),
        int(d["version"]),
        str(d.get("why", "")),
        bool(d.get("pinned", False)),
    )
