"""The one typed container of a gateway's collaborators, built by ``gateway/server/app.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from backends.pool import Pools
from backends.upstream import Upstream
from gateway.classify import Defaults
from gateway.engines import ENGINES, Registry
from gateway.forward.passthrough import PerRequestReports
from gateway.forward.shadow import ShadowRunner
from gateway.gate import Gate
from gateway.identity import Identity
from gateway.measure.checks import Checks
from gateway.measure.feedback import Feedback
from gateway.measure.livestats import LiveStats
from gateway.measure.load import LoadMeter
from gateway.measure.loadscrape import LoadScraper
from gateway.measure.outcomelog import OutcomeLog
from gateway.measure.requestlog import RequestLog
from gateway.measure.scrape import PoolScraper
from gateway.measure.signals import SignalsSeen
from gateway.measure.telemetry import Telemetry
from gateway.settings import Settings
from gateway.state.flagstore import FlagStore
from gateway.state.memory import SharedState
from gateway.state.pins import MemoryPins, ResponsePins
from gateway.state.policyfile import PolicyHolder
from gateway.state.prefixes import MemoryPrefixes, PrefixMap


@dataclass(slots=True)
class Services:
    """Everything a running gateway is made of; ``outcomes`` and ``signals`` are where its
    feedback goes.

    ``pins`` learns, once per answer of the Responses API (``POST /v1/responses``), the id
    the upstream stored it under, the base URL of the endpoint that stored it and the tenant
    that asked (``ResponsePins.keep``, from the answer's measurement); a request of that
    tenant that continues a stored response goes where ``pins`` says (``Ask.pinned``,
    ``gateway/pipeline.py``). ``engines``: the engines a pool's ``engine`` may name
    (``gateway/engines/``)."""

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
    feedback: Feedback
    scraper: PoolScraper
    defaults: Defaults
    reports: PerRequestReports
    load: LoadMeter
    identity: Identity
    gate: Gate
    checks: Checks
    load_scraper: LoadScraper | None = None
    request_log: RequestLog | None = None
    pins: ResponsePins = field(default_factory=MemoryPins)
    prefixes: PrefixMap = field(default_factory=MemoryPrefixes)
    engines: Registry = ENGINES

    @property
    def outcomes(self) -> OutcomeLog:
        return self.feedback.outcomes

    @property
    def signals(self) -> SignalsSeen:
        return self.feedback.signals
