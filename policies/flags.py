"""Feature flags as frozen values, and how one is evaluated for one request. Pure.

A flag is on or off, optionally limited to a percentage of traffic (stable per routing key:
the same tenant always lands in the same arm) and to tenants (deny wins over allow). The
``speculation`` flag is the global kill switch.

``anonymous`` (a request with no key the policy knows) inherits nothing: a flag that lists
tenants admits it only when its allow list names it, and a partial rollout never does, so a
client that drops its key never gets more than with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from policies.features import Features
from policies.model import ANONYMOUS, FlagDefault


@dataclass(frozen=True, slots=True)
class FlagValue:
    """One flag's setting. ``rollout`` is a percentage; ``allow`` None means every tenant."""

    enabled: bool = True
    rollout: float | None = None
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()

    def admits(self, name: str, features: Features) -> bool:
        if not self.enabled or features.tenant in self.deny:
            return False
        if self.allow is not None and features.tenant not in self.allow:
            return False
        if features.tenant == ANONYMOUS and self.deny and self.allow is None:
            return False  # a deny list is not escaped by sending no key
        return in_rollout(name, features, self.rollout)

    @classmethod
    def from_default(cls, default: FlagDefault) -> FlagValue:
        tenants = default.tenants
        return cls(
            enabled=default.enabled,
            rollout=default.rollout,
            allow=frozenset(tenants.allow) if tenants and tenants.allow is not None else None,
            deny=frozenset(tenants.deny) if tenants else frozenset(),
        )


ALWAYS_ON = FlagValue()


def in_rollout(salt: str, features: Features, percent: float | None) -> bool:
    """Whether ``features`` is inside a rollout of ``percent`` (None: everything); stable per
    routing key, and a request with none (``anonymous``) is inside only a rollout of 100."""
    if percent is None or percent >= 100:
        return True
    return bool(features.routing_key) and bucket(salt, features.routing_key) < percent / 100


def bucket(salt: str, key: str) -> float:
    """A stable number in [0, 1) for ``key``; the salt decorrelates flags and rules."""
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def merged(
    defaults: Mapping[str, FlagDefault], overrides: Mapping[str, FlagValue]
) -> dict[str, FlagValue]:
    """The policy's flag defaults with the values ops have set on top."""
    values = {name: FlagValue.from_default(default) for name, default in defaults.items()}
    values.update(overrides)
    return values
