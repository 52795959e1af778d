"""Background work of a running gateway, owned by the app's lifespan: the policy file watch,
the guardrail tick, and what a policy change sets in motion."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from backends.discovery import resolve
from backends.pool import PoolSpec
from backends.upstream import Timeouts
from gateway.measure.livestats import TICK_EVERY_S
from gateway.services import Services
from gateway.state.policyfile import ReloadResult
from policies.compiled import CompiledPolicy

log = logging.getLogger(__name__)


def pool_specs(policy: CompiledPolicy) -> list[PoolSpec]:
    return [
        PoolSpec(
            name=name,
            model=pool.model,
            endpoints=tuple(pool.endpoints),
            k=pool.num_speculative_tokens,
            timeouts=Timeouts(
                pool.timeouts.connect_s,
                pool.timeouts.first_byte_s,
                pool.timeouts.idle_s,
                pool.timeouts.total_s,
            ),
            discover=pool.discovery == "dns",
            engine=pool.engine.value,
        )
        for name, pool in policy.pools.items()
    ]


def policy_changed(services: Services, policy: CompiledPolicy) -> None:
    services.pools.update(pool_specs(policy))
    services.identity.policy_changed(policy)
    services.flags.policy_changed(policy)
    services.stats.policy_changed(policy)
    services.telemetry.policy_changed(frozenset(rule.name for rule in policy.rules))
    services.telemetry.reload("ok")


async def reload_policy(services: Services) -> ReloadResult:
    result = await services.policy.reload(services.wall())
    if not result.changed:
        services.telemetry.reload("rejected")
    return result


async def watch_policy(services: Services) -> None:
    """Reload when the file changes or a reload is requested (SIGHUP). Outlives any one
    reload: a failure of it is logged, and the watch goes on."""
    holder = services.policy
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(holder.requested.wait(), services.settings.policy_watch_s)
        requested = holder.requested.is_set()
        holder.requested.clear()
        try:
            if requested or holder.changed_on_disk():
                await reload_policy(services)
        except Exception:  # the watch must survive a bug in what a reload sets in motion
            log.exception("policy watch: the reload failed; still watching")


async def tick(services: Services) -> None:
    while True:
        await asyncio.sleep(services.settings.real_s(TICK_EVERY_S))
        services.stats.tick(services.wall())


async def discover(services: Services) -> None:
    """Resolve the endpoints of pools with ``discovery: dns``; at once, then periodically."""
    while True:
        for spec in list(services.pools.specs.values()):
            if spec.discover:
                urls = [u for url in spec.endpoints for u in await resolve(url)]
                services.pools.resolved(spec.name, urls)
        await asyncio.sleep(services.settings.discovery_interval_s)
