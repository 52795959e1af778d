"""Feature flags as frozen values, and how one is evaluated for one request. Pure.

A flag is on or off, optionally limited to a percentage of tenants (a rollout draws a hash
of the tenant, the routing key, never of the request: the same tenant always lands on the
same side) and to tenants (deny wins over allow). The ``speculation`` flag is the global
kill switch; the reason header says "kill switch" only when it is off, and names the
rollout or the tenant list otherwise.

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
        return self.refusal(name, features) is None

    def refusal(self, name: str, features: Features) -> str | None:
        """Why the flag is off for ``features`` (words for the reason header), or None."""
        if not self.enabled:
            return "off"
        if features.tenant in self.deny:
            return f"off for tenant {features.tenant} (deny list)"
        if self.allow is not None and features.tenant not in self.allow:
            return f"off for tenant {features.tenant or ANONYMOUS} (not on the allow list)"
        if features.tenant == ANONYMOUS and self.deny and self.allow is None:
            return "off for requests without a known API key (the flag has a deny list)"
        if not in_rollout(name, features, self.rollout):
            return f"outside its {rollout_words(self.rollout)}" + (
                "; a request without a known API key is in no partial rollout"
                if not features.routing_key
                else ""
            )
        return None

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


def rollout_words(percent: float | None) -> str:
    """What a rollout draws from, said where it shows (the reason header, ``flags list``):
    a share of tenants, by a hash of the tenant, never of requests."""
    return "rollout to all" if percent is None else f"{percent:g}% rollout of tenants"


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
