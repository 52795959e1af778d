"""How often an answer that broke before it reached the client may be tried again.

A non-streaming request's answer is read whole before the client sees a byte, so an
upstream that breaks mid-answer can be retried like a failure before the first byte. The
budget bounds those retries: a number of them and a time after which none starts. Retries
go to endpoints whose answers have not broken yet; when every endpoint of the ladder has
broken once, only the last one is set aside. Pure: time is an argument.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass(slots=True)
class BreakBudget:
    """Retries left after broken answers, and the time after which none starts."""

    retries: int
    until: float
    broke: list[str] = field(default_factory=list)
    spent: int = 0

    def spend(self, url: str, now: float) -> bool:
        """Note that ``url``'s answer broke; whether one more try may start."""
        self.broke.append(url)
        if self.retries <= 0 or now >= self.until:
            return False
        self.retries -= 1
        self.spent += 1
        return True

    @property
    def ran_out(self) -> bool:
        """An answer broke when no retry was left."""
        return len(self.broke) > self.spent

    def avoid(self, ladder: Collection[str]) -> tuple[str, ...]:
        """Endpoints to try only as a last resort: those whose answers broke, unless that is
        every endpoint of the ladder; then the one that broke last."""
        broke = set(self.broke)
        if not broke:
            return ()
        if set(ladder) <= broke:
            return (self.broke[-1],)
        return tuple(broke)
