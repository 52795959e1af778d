"""What ``speclane serve`` says it loaded, before it serves: where it listens, the policy
file and its version, each pool with its endpoints, the ladders, and the routes it answers.

Pure: settings and a compiled policy in, lines out; ``gateway/cli/serve.py`` logs them.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gateway.apis import APIS
from gateway.settings import Settings
from policies.compiled import CompiledPolicy, Ladder
from policies.model import Pool, PoolKind


def loaded_lines(settings: Settings, policy: CompiledPolicy, version: str | None) -> list[str]:
    """One line for the address, one for the policy, one per pool, one for the routes."""
    workers = settings.workers if isinstance(settings.workers, int) else 1
    where = f"listening on http://{settings.host}:{settings.port}"
    lines = [f"{where} ({workers} worker{'s' if workers != 1 else ''})"]
    ladders = [f"{ladder.model}: {' > '.join(ladder.pools)}" for ladder in _ladders(policy)]
    rules = ", ".join(rule.name for rule in policy.rules)
    lines.append(
        f"policy {Path(settings.policy)} (version {version}): "
        f"ladder{'s' if len(ladders) != 1 else ''} {'; '.join(ladders)}; "
        f"{len(policy.rules)} rule{'s' if len(policy.rules) != 1 else ''} ({rules})"
    )
    lines += [f"pool {name}: {_pool(pool)}" for name, pool in policy.pools.items()]
    api = ", ".join(f"POST {api.path}" for api in APIS)
    admin = "/admin" if settings.admin_token is not None else "off (SPECLANE_ADMIN_TOKEN unset)"
    console = " and /console/" if settings.admin_token is not None and settings.console else ""
    state = "Redis" if settings.redis_url else "this process only (no SPECLANE_REDIS_URL)"
    lines.append(f"routes: {api}, GET /v1/models; admin API {admin}{console}; state: {state}")
    return lines


def _ladders(policy: CompiledPolicy) -> list[Ladder]:
    return sorted(policy.ladders.values(), key=lambda ladder: ladder.model)


def _shown(url: str) -> str:
    """An endpoint without any credentials its URL carries."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def _pool(pool: Pool) -> str:
    if pool.kind is PoolKind.SPECULATIVE:
        method = f", {pool.method.value}" if pool.method is not None else ""
        kind = f"speculative k={pool.num_speculative_tokens}{method}"
    else:
        kind = "standard"
    price = f", ${pool.cost_per_hour:g}/h" if pool.cost_per_hour is not None else ""
    endpoints = ", ".join(_shown(url) for url in pool.endpoints)
    return f"{kind} on {pool.engine.value}{price}, model {pool.model}, endpoints {endpoints}"
