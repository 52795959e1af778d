"""The one typed container of a gateway's collaborators, built by ``gateway/app.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.pool import Pools
from backends.upstream import Upstream
from gateway.acceptance import Outcome
from gateway.classify import Defaults
from gateway.flagstore import FlagStore
from gateway.livestats import LiveStats
from gateway.policyfile import PolicyHolder
from gateway.scrape import PoolScraper
from gateway.settings import Settings
from gateway.shadow import ShadowRunner
from gateway.state import SharedState
from gateway.telemetry import Telemetry


@dataclass(slots=True)
class Services:
    settings: Settings
    clock: Callable[[], float]
    wall: Callable[[], float]
    policy: PolicyHolder
    flags: FlagStore
    stats: LiveStats
    state: SharedState
    upstream: Upstream
    pools: Pools
    telemetry: Telemetry
    shadow: ShadowRunner
    record: Callable[[Outcome], None]
    scraper: PoolScraper
    defaults: Defaults
