"""Step 1's admission: who is asking, and whether they may ask now.

Every request to the OpenAI routes passes the gate before its body is read: its caller is
found (``gateway/identity.py``; 401 for an unknown key where keys are required), and it
takes a place among the requests in flight, at most ``max_total`` in all and at most its
tenant's cap (the policy's ``tenants.<name>.max_concurrent_requests``, else
``max_per_tenant``). No place: 429 with ``Retry-After``. A draining gateway (SIGTERM) refuses
new requests with 503 and ``Connection: close``. The place is given back when the answer is
sent, streamed or not, or fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.errors import ApiError, shutting_down
from gateway.identity import Caller, Identity
from policies.compiled import CompiledPolicy

_RETRY_S = 1.0
_CLOSE = {"connection": "close"}  # the next try should open a connection elsewhere


class Gate:
    """Counts of requests in flight, in all and per tenant."""

    def __init__(
        self,
        identity: Identity,
        policy: Callable[[], CompiledPolicy],
        max_total: int,
        max_per_tenant: int | None,
    ) -> None:
        self._identity = identity
        self._policy = policy
        self._max_total = max_total
        self._max_per_tenant = max_per_tenant
        self._in_flight: dict[str, int] = {}
        self.total = 0
        self.draining = False

    def enter(self, headers: Mapping[str, str]) -> Caller:
        """Admit one request, or raise the ``ApiError`` that refuses it."""
        if self.draining:
            message = "the gateway is shutting down"
            raise shutting_down(message, _RETRY_S, _CLOSE)
        caller = self._identity.caller(headers)
        tenant = caller.tenant
        held = self._in_flight.get(tenant, 0)
        cap = self._cap(tenant)
        if self.total >= self._max_total or (cap is not None and held >= cap):
            whose = "the gateway's" if self.total >= self._max_total else f"tenant {tenant}'s"
            message = f"too many requests in flight: {whose} limit is reached"
            raise ApiError(
                status=429,
                message=message,
                type="rate_limit_error",
                code="too_many_requests",
                retry_after_s=_RETRY_S,
            )
        self._in_flight[tenant] = held + 1
        self.total += 1
        return caller

    def leave(self, caller: Caller) -> None:
        self.total -= 1
        left = self._in_flight[caller.tenant] - 1
        if left:
            self._in_flight[caller.tenant] = left
        else:
            del self._in_flight[caller.tenant]

    def in_flight(self, tenant: str) -> int:
        return self._in_flight.get(tenant, 0)

    def _cap(self, tenant: str) -> int | None:
        declared = self._policy().file.tenants.get(tenant)
        if declared is not None and declared.max_concurrent_requests is not None:
            return declared.max_concurrent_requests
        return self._max_per_tenant
