"""Who a request comes from: its tenant, from a source the operator trusts. Part of step 1.

By default the API key: the bearer token of ``Authorization``, or else ``x-api-key`` (what
Anthropic's clients send), is hashed (SHA-256) and looked
up among the keys the policy file gives its tenants (``tenants: {acme: {api_keys:
[sha256:...]}}``); the key itself is never kept, logged, forwarded or compared in the clear.
A request with no key the policy knows is the tenant ``anonymous`` (which the policy may
give a concurrency cap, allow in a flag, or match in a rule): it is denied by every flag that
lists tenants unless that flag allows ``anonymous`` by name, and it is outside every partial
rollout (``policies/flags.py``), so that dropping a key never gets a client more than its
key does; with ``SPECLANE_REQUIRE_API_KEY=true`` it is refused with 401 instead. A header names the
tenant only when the operator sets ``SPECLANE_TRUSTED_TENANT_HEADER``, declaring that an
authenticating proxy in front sets it and drops whatever clients sent.

Nothing in the body picks a tenant or a rollout arm: rollouts hash the tenant. The body's
``user`` only keeps one user in one experiment arm, and is scoped by tenant: the same
``user`` in two tenants is two users.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import ApiError
from policies.compiled import CompiledPolicy
from policies.model import ANONYMOUS

_TENANT = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
_SCOPE_KEY = "speclane.caller"


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's tenant, and what rollouts hash for it: the tenant when it is known, nothing
    for ``anonymous`` (which is outside every partial rollout)."""

    tenant: str
    sticky: str = ""


def key_hash(key: str) -> str:
    """How the policy file names an API key: ``sha256:`` and the hex digest."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def caller_from(
    headers: Mapping[str, str], trusted_header: str | None, keys: Mapping[str, str]
) -> Caller:
    """The caller by the rules above."""
    if trusted_header is not None:
        named = headers.get(trusted_header)
        if named is not None and _TENANT.fullmatch(named):
            return Caller(named, named)
    key = api_key(headers)
    if not key:
        return Caller(ANONYMOUS)
    hashed = key_hash(key)
    tenant = keys.get(hashed)
    if tenant is not None:
        return Caller(tenant, tenant)
    return Caller(ANONYMOUS)


def api_key(headers: Mapping[str, str]) -> str:
    """The key a request presents: ``Authorization: Bearer <key>`` (OpenAI's clients), else
    ``x-api-key: <key>`` (Anthropic's); empty when neither."""
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        key = authorization[7:].strip()
        if key:
            return key
    return headers.get("x-api-key", "").strip()


class Identity:
    """The gateway's view of callers: the policy's keys, and the operator's settings."""

    def __init__(self, trusted_header: str | None, require_key: bool) -> None:
        self._header = trusted_header.lower() if trusted_header else None
        self._require = require_key
        self._keys: dict[str, str] = {}

    def policy_changed(self, policy: CompiledPolicy) -> None:
        self._keys = {
            key: name for name, tenant in policy.file.tenants.items() for key in tenant.api_keys
        }

    @property
    def knows_tenants(self) -> bool:
        """Whether any request can have a tenant (a key the policy names, or the trusted
        header): without, every request is ``anonymous``, outside every partial rollout."""
        return self._header is not None or bool(self._keys)

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The request's caller; ``ApiError`` 401 for an unknown key when keys are required."""
        found = caller_from(headers, self._header, self._keys)
        if self._require and found.tenant == ANONYMOUS:
            raise ApiError(
                status=401,
                message="a valid API key is required (Authorization: Bearer <key>, or x-api-key)",
                code="invalid_api_key",
            )
        return found


def remember(scope: MutableMapping[str, Any], caller: Caller) -> None:
    """Keep the caller step 1 found on the request, for step 3 to read."""
    scope[_SCOPE_KEY] = caller


def remembered(scope: Mapping[str, Any]) -> Caller | None:
    found = scope.get(_SCOPE_KEY)
    return found if isinstance(found, Caller) else None
