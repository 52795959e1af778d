"""The audit log's entries survive the trip through Redis as they are: a flag's change and a
policy applied."""

from __future__ import annotations

from gateway.state.flagstore import POLICY, AuditEntry
from gateway.state.redis_audit import audit_from_json, audit_to_json
from policies.flags import FlagValue


def test_flag_and_policy_entries_round_trip():
    flag = AuditEntry(
        at=1.5,
        who="ana",
        flag="speculation",
        old=None,
        new=FlagValue(enabled=False),
        reason="incident",
    )
    policy = AuditEntry(
        at=2.5,
        who="bo",
        flag=POLICY,
        old=None,
        new=None,
        reason="json to standard",
        policy="3f2a -> 9c1d",
    )
    for entry in (flag, policy):
        assert audit_from_json(audit_to_json(entry)) == entry
