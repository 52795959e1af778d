"""Flag values set by ops at run time, merged over the defaults the policy declares.

``values`` is an immutable mapping a decision reads without awaiting; it is rebuilt on
every change. The in-memory store is the embedded default; the Redis store shares the same
overrides between replicas. Every change goes to the audit log.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from policies.compiled import CompiledPolicy
from policies.flags import FlagValue, merged
from policies.model import KILL_SWITCH


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One change by ops: a flag's value (``old`` -> ``new``), or, with ``policy`` set, a
    policy applied through the admin API (``flag`` is then ``POLICY``, ``policy`` says
    which version replaced which)."""

    at: float
    who: str
    flag: str
    old: FlagValue | None
    new: FlagValue | None
    reason: str
    policy: str = ""


POLICY = "(policy)"


class FlagStore:
    """Overrides set through the admin API, and their merge with the policy's defaults."""

    def __init__(self, policy: CompiledPolicy, max_audit: int = 1000) -> None:
        self._policy = policy
        self.overrides: dict[str, FlagValue] = {}
        self.audit: deque[AuditEntry] = deque(maxlen=max_audit)
        self.values: Mapping[str, FlagValue] = MappingProxyType({})
        self._rebuild()

    def policy_changed(self, policy: CompiledPolicy) -> None:
        self._policy = policy
        self._rebuild()

    def set(self, name: str, value: FlagValue, who: str, at: float, reason: str = "") -> AuditEntry:
        entry = AuditEntry(
            at=at, who=who, flag=name, old=self.overrides.get(name), new=value, reason=reason
        )
        self.overrides[name] = value
        self.audit.append(entry)
        self._rebuild()
        return entry

    def delete(self, name: str, who: str, at: float, reason: str = "") -> AuditEntry | None:
        old = self.overrides.pop(name, None)
        if old is None:
            return None
        entry = AuditEntry(at=at, who=who, flag=name, old=old, new=None, reason=reason)
        self.audit.append(entry)
        self._rebuild()
        return entry

    def known(self) -> dict[str, tuple[FlagValue, str]]:
        """Every flag that means something, by name: the kill switch, the policy's, those its
        rules name and those ops set; each with its value and where that comes from
        (``ops``, ``policy``, or ``implicit``: on, as nothing declares it)."""
        policy = self._policy
        declared = policy.file.flags
        used = {rule.rule.flag for rule in policy.rules if rule.rule.flag}
        names = sorted({KILL_SWITCH, *declared, *self.overrides, *used})
        values = self.values
        return {
            name: (
                values.get(name, FlagValue()),
                "ops" if name in self.overrides else "policy" if name in declared else "implicit",
            )
            for name in names
        }

    def note(self, entry: AuditEntry) -> None:
        """A change that is not a flag's (a policy applied) joins the audit log."""
        self.audit.append(entry)

    def replace(self, overrides: Mapping[str, FlagValue]) -> None:
        """Take overrides decided elsewhere (the shared store) as they are."""
        if dict(overrides) != self.overrides:
            self.overrides = dict(overrides)
            self._rebuild()

    def _rebuild(self) -> None:
        self.values = MappingProxyType(merged(self._policy.file.flags, self.overrides))
