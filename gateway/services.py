"""The one typed container of a gateway's collaborators, built by ``gateway/server/app.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.pool import Pools
from backends.upstream import Upstream
from gateway.classify import Defaults
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
from gateway.state.policyfile import PolicyHolder


def _not_kept(response_id: str, endpoint: str) -> None:
    """Where stored responses are remembered when nothing remembers them."""


@dataclass(slots=True)
class Services:
    """Everything a running gateway is made of; ``outcomes`` and ``signals`` are where its
    feedback goes.

    ``on_response_id(response_id, endpoint)`` is told, once per answer of the Responses API
    (``POST /v1/responses``), the id the upstream stored the answer under and the base URL
    of the endpoint that stored it: the one point where a store of stored responses learns
    where each lives. It is called on the request path, so it must not block (a store that
    writes elsewhere schedules the write). A request that must go where its state is sets
    ``Ask.pinned`` (``gateway/pipeline.py``)."""

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
    on_response_id: Callable[[str, str], None] = _not_kept

    @property
    def outcomes(self) -> OutcomeLog:
        return self.feedback.outcomes

    @property
    def signals(self) -> SignalsSeen:
        return self.feedback.signals
