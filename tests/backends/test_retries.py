"""The break budget: how many retries, until when, and which endpoints go last."""

from __future__ import annotations

from backends.retries import BreakBudget

LADDER = ["http://a", "http://b", "http://c"]


def test_retries_stop_at_the_count():
    budget = BreakBudget(retries=2, until=100.0)
    assert [budget.spend("http://a", now=0.0) for _ in range(3)] == [True, True, False]
    assert budget.spent == 2 and len(budget.broke) == 3


def test_no_retry_starts_at_or_after_the_deadline():
    budget = BreakBudget(retries=5, until=10.0)
    assert budget.spend("http://a", now=9.9)
    assert not budget.spend("http://b", now=10.0)
    assert budget.spent == 1


def test_endpoints_that_broke_go_last_until_all_have_then_only_the_last_one():
    budget = BreakBudget(retries=5, until=10.0)
    assert budget.avoid(LADDER) == ()
    budget.spend("http://b", now=0.0)
    assert budget.avoid(LADDER) == ("http://b",)
    budget.spend("http://a", now=0.0)
    assert set(budget.avoid(LADDER)) == {"http://a", "http://b"}
    budget.spend("http://c", now=0.0)
    assert budget.avoid(LADDER) == ("http://c",)
