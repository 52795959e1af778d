"""What the scrape-time gauges say of a flag: on, limited or off."""

from __future__ import annotations

import pytest

from gateway.measure.collectors import flag_state
from policies.flags import FlagValue


@pytest.mark.parametrize(
    ("value", "state"),
    [
        (FlagValue(), "on"),
        (FlagValue(enabled=False), "off"),
        (FlagValue(rollout=0), "off"),
        (FlagValue(rollout=100), "on"),
        (FlagValue(rollout=50), "limited"),
        (FlagValue(allow=frozenset({"acme"})), "limited"),
        (FlagValue(deny=frozenset({"acme"})), "limited"),
        (FlagValue(allow=frozenset()), "off"),
    ],
)
def test_a_flags_state_is_how_much_traffic_it_admits(value, state):
    assert flag_state(value) == state
