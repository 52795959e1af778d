"""What an answer says about how it was served: ``x-request-id`` and the ``x-speclane-*``
headers (step 8). ``x-speclane-pool`` is the pool that served; ``x-speclane-reason`` is the
decision's reason, and when a pool other than the decision's served (failover down or up the
ladder) it says so first, and why: the error of the decision's pool, or that it had no
endpoint in service. An answer no decision chose (the engine's other routes, a call pinned
to the endpoint that stored its response) says in ``x-speclane-reason`` why it went where it
did (``route_headers``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.pool import Attempt
from policies.decision import Decision

_ERROR_CHARS = 160


def decision_headers(
    request_id: str,
    decision: Decision | None,
    served: str,
    attempts: Sequence[Attempt] = (),
) -> dict[str, str]:
    """The headers of one answer; ``decision`` None when decision headers are turned off."""
    if decision is None:
        return {"x-request-id": request_id}
    return {
        "x-request-id": request_id,
        "x-speclane-rule": decision.rule,
        "x-speclane-slice": _ascii(decision.slice),
        "x-speclane-pool": served,
        "x-speclane-reason": _ascii(reason(decision, served, attempts)),
    }


def reason(decision: Decision, served: str, attempts: Sequence[Attempt]) -> str:
    """The decision's reason, led by what happened when another pool or endpoint served."""
    failed = [a for a in attempts if a.pool == decision.pool]
    why = f"failed: {_short(failed[-1].error)}" if failed else "had no endpoint in service"
    if served != decision.pool:
        return f"failover: {decision.pool} {why}; served by {served}; decided: {decision.reason}"
    if failed:
        return f"{decision.reason}; served by another {served} endpoint after one {why}"
    return decision.reason


def route_headers(
    request_id: str, served: str, why: str, first: str, attempts: Sequence[Attempt] = ()
) -> dict[str, str]:
    """The headers of an answer no decision chose: ``why`` it went to pool ``first``, led by
    what happened when another pool or endpoint served."""
    failed = [a for a in attempts if a.pool == first]
    if served != first:
        cause = f"failed: {_short(failed[-1].error)}" if failed else "had no endpoint in service"
        why = f"failover: {first} {cause}; served by {served}; {why}"
    elif failed:
        why = f"{why}; served by another {served} endpoint after one failed: "
        why += _short(failed[-1].error)
    return {
        "x-request-id": request_id,
        "x-speclane-pool": served,
        "x-speclane-reason": _ascii(why),
    }


def _short(error: str) -> str:
    return error if len(error) <= _ERROR_CHARS else error[: _ERROR_CHARS - 3] + "..."


def _ascii(value: str) -> str:
    return value.encode("ascii", "replace").decode().replace("\r", " ").replace("\n", " ")
