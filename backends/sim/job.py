"""One request inside the simulated server: one choice per answer it asks for (``n``), each
a sequence in the engine with its answer's tokens, and the request's rendering options.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.sim.engine import Sequence
from backends.sim.model import RequestProfile
from backends.sim.responses import Answer, Ending
from backends.sim.validation import Ask


@dataclass(slots=True)
class Choice:
    """One answer of a request: its profile, its tokens' text and its engine sequence."""

    index: int
    profile: RequestProfile
    tokens: list[str]
    seq: Sequence

    def pieces(self, start: int, end: int) -> list[str]:
        """The text of tokens ``start..end``; a tool call's token 0, its name, has none."""
        if self.profile.tool_name is not None:
            return ([""] if start == 0 < end else []) + self.tokens[max(start - 1, 0) : end - 1]
        return self.tokens[start:end]

    def ending(self) -> Ending:
        return Ending(self.pieces(0, self.profile.output_tokens), self.profile.finish_reason)


@dataclass(slots=True)
class Job:
    """A request's choices; per-request metrics describe it only when there is one."""

    ask: Ask
    answer: Answer
    choices: list[Choice]
    closed: bool = field(default=False)
    show_cached: bool = False  # usage reports prefix-cache hits

    @property
    def cached(self) -> int | None:
        """Prompt tokens the request found in the prefix cache, when its usage shows them
        (vLLM counts them once per request: its first choice's admission)."""
        found = self.choices[0].seq.cached
        return found if self.show_cached and found > 0 else None

    @property
    def single(self) -> Choice | None:
        return self.choices[0] if len(self.choices) == 1 else None

    @property
    def finished(self) -> bool:
        return all(c.seq.finished for c in self.choices)

    @property
    def completion_tokens(self) -> int:
        return sum(c.profile.output_tokens for c in self.choices)
