"""The outcome of one policy decision: where a request goes and why. Pure data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one request goes.

    ``rungs`` is the failover order, ``pool`` first: down the ladder, then back up it, so a
    request fails only when no pool of its model can serve. ``shadow_to`` names a pool that
    gets a mirrored copy for measurement (the client never sees its answer); ``shadow_tokens``,
    when set, caps the output tokens the copy asks for (a short probe). ``probe`` marks
    a request the guardrail sent one rung up to test whether a fallen-back slice recovered.
    An empty ``rungs`` means no ladder serves the model. ``epoch`` is the version of the
    slice's guardrail state the decision read: outcomes are judged only in their own epoch.
    ``arm`` names the experiment arm a request of an experiment's rule was assigned to.
    ``parent``: the slice ``slice`` was split from (``slice`` itself when not split; empty
    when splitting is off); ``candidates``: the request's value per split key (hashes).
    """

    rule: str
    slice: str
    pool: str
    rungs: tuple[str, ...]
    rung: int
    start: int
    reason: str
    shadow_to: str | None = None
    shadow_tokens: int | None = None
    probe: bool = False
    epoch: int = 0
    arm: str = ""
    parent: str = ""
    candidates: tuple[tuple[str, str], ...] = ()
