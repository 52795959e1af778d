"""The admin API under /admin: flags, audit log, guardrail states and events, policy reload.

Every route needs ``Authorization: Bearer <SPECLANE_ADMIN_TOKEN>``, or the token as
``x-api-key`` (compared in constant time). With no token configured the admin API is
disabled, not open. Nothing a client sends to the model endpoints reaches any of this.
"""

from __future__ import annotations

import difflib
import hmac
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import JSON, ApiError, invalid_body
from gateway.identity import api_key
from gateway.lifecycle import reload_policy
from gateway.server.admin_policy import PolicyDrafts, actor
from gateway.server.health import pools_detail
from gateway.services import Services
from gateway.state.flagstore import AuditEntry
from gateway.state.memory import state_json
from policies.engines import describe
from policies.flags import FlagValue

Handler = Callable[[Request], Awaitable[Response]]
_MAX_LIMIT = 1000
_FLAG_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class _Tenants(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow: list[str] | None = None
    deny: list[str] = []


class FlagUpdate(BaseModel):
    """Body of PUT /admin/flags/{name}."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    rollout: Annotated[float, Field(ge=0, le=100)] | None = None
    tenants: _Tenants | None = None
    reason: Annotated[str, Field(max_length=500)] = ""
    create: bool = False

    def value(self) -> FlagValue:
        tenants = self.tenants
        return FlagValue(
            enabled=self.enabled,
            rollout=self.rollout,
            allow=frozenset(tenants.allow) if tenants and tenants.allow is not None else None,
            deny=frozenset(tenants.deny) if tenants else frozenset(),
        )


def _needs_reason(reason: str) -> None:
    """Every change to a flag says why, in the audit log, as the console asks."""
    if not reason.strip():
        raise ApiError(status=400, message="reason: say why, for the audit log", param="reason")


def flag_json(value: FlagValue) -> dict[str, Any]:
    return {
        "enabled": value.enabled,
        "rollout": value.rollout,
        "tenants": {
            "allow": sorted(value.allow) if value.allow is not None else None,
            "deny": sorted(value.deny),
        },
    }


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type=JSON)


class Admin:
    """Handlers bound to one gateway's services."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def routes(self) -> list[Route]:
        guarded = self._guarded
        return [
            Route("/admin/flags", guarded(self.list_flags), methods=["GET"]),
            Route("/admin/flags/{name}", guarded(self.get_flag), methods=["GET"]),
            Route("/admin/flags/{name}", guarded(self.set_flag), methods=["PUT"]),
            Route("/admin/flags/{name}", guarded(self.delete_flag), methods=["DELETE"]),
            Route("/admin/audit", guarded(self.audit), methods=["GET"]),
            Route("/admin/guardrail", guarded(self.guardrail), methods=["GET"]),
            Route("/admin/stats", guarded(self.stats), methods=["GET"]),
            Route("/admin/policy", guarded(self.policy), methods=["GET"]),
            Route("/admin/policy/reload", guarded(self.reload), methods=["POST"]),
            Route("/admin/pools", guarded(self.pools), methods=["GET"]),
            Route("/admin/outcomes", guarded(self.outcomes), methods=["GET"]),
            *PolicyDrafts(self.services).routes(guarded),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            self._authorize(request)
            return await handler(request)

        return guarded

    def _authorize(self, request: Request) -> None:
        token = self.services.settings.admin_token
        if token is None:
            raise ApiError(
                status=403,
                message="the admin API is disabled: set SPECLANE_ADMIN_TOKEN",
                code="admin_disabled",
            )
        given = api_key(request.headers)
        if not given:
            raise ApiError(
                status=401, message="admin API: a bearer token is required", code="unauthorized"
            )
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            raise ApiError(status=403, message="admin API: wrong token", code="forbidden")

    def _flags(self) -> dict[str, dict[str, Any]]:
        policy = self.services.policy.current
        used: dict[str, list[str]] = {}
        for rule in policy.rules:
            if rule.rule.flag:
                used.setdefault(rule.rule.flag, []).append(rule.name)
        out = {}
        for name, (value, source) in self.services.flags.known().items():
            declared = policy.file.flags.get(name)
            out[name] = {
                "name": name,
                **flag_json(value),
                "source": source,
                "description": declared.description if declared else "",
                "rules": used.get(name, []),
            }
        return out

    async def list_flags(self, request: Request) -> Response:
        return _json({"flags": list(self._flags().values())})

    async def get_flag(self, request: Request) -> Response:
        name = request.path_params["name"]
        flag = self._flags().get(name)
        if flag is None:
            raise ApiError(
                status=404, message=f"no flag {name!r}", param="name", code="flag_not_found"
            )
        return _json(flag)

    async def set_flag(self, request: Request) -> Response:
        name = _flag_name(request)
        try:
            update = FlagUpdate.model_validate_json(await request.body())
        except ValidationError as exc:
            raise invalid_body(exc) from None
        known = self._flags()
        if name not in known and not update.create:
            raise _unknown_flag(name, known)
        _needs_reason(update.reason)
        if update.rollout is not None and 0 < update.rollout < 100:
            self._refuse_keyless_rollout(update.rollout)
        entry = await self.services.state.set_flag(
            name, update.value(), actor(request), self.services.wall(), update.reason
        )
        return _json({"flag": self._flags()[name], "audit": audit_json(entry)})

    def _refuse_keyless_rollout(self, rollout: float) -> None:
        """A rollout draws tenants (a hash of the tenant an API key names), never requests,
        and a request without a known key is in no partial rollout: where no request can
        have a tenant, a partial rollout would be off for everyone, so it is refused."""
        if self.services.identity.knows_tenants:
            return
        raise ApiError(
            status=400,
            message=f"rollout: a rollout draws from tenants, and this gateway knows none, so "
            f"every request is anonymous and none would be in a {rollout:g}% rollout. Give "
            "tenants api_keys in the policy (or set SPECLANE_TRUSTED_TENANT_HEADER), or turn "
            "the flag on or off for everyone",
            param="rollout",
        )

    async def delete_flag(self, request: Request) -> Response:
        name = _flag_name(request)
        reason = request.query_params.get("reason", "")
        _needs_reason(reason)
        entry = await self.services.state.delete_flag(
            name, actor(request), self.services.wall(), reason
        )
        if entry is None:
            raise ApiError(
                status=404, message=f"flag {name!r} has no value set by ops", code="flag_not_set"
            )
        return _json({"deleted": name, "audit": audit_json(entry)})

    async def audit(self, request: Request) -> Response:
        limit = _limit(request, 100)
        entries = await self.services.state.audit(limit)
        return _json({"audit": [audit_json(e) for e in entries]})

    async def guardrail(self, request: Request) -> Response:
        limit = _limit(request, 200)
        slices = {key: state_json(s) for key, s in self.services.stats.guards.items()}
        events = await self.services.state.events(limit)
        return _json({"slices": slices, "events": events})

    async def stats(self, request: Request) -> Response:
        views = self.services.stats.views
        pools = views.pool_summary(self.services.clock())
        configured = self.services.policy.current.pools
        for name, entry in pools.items():
            if name in configured:  # which signal the engine offers, and which outcomes gave
                pool = configured[name]
                shows = self.services.engines.of(pool.engine).shows
                entry.update(describe(pool, shows), signals_seen=self.services.signals.of(name))
        kept = self.services.load.kept_shares()
        for name, hits in self.services.feedback.cache.summary().items():
            for url, endpoint in hits["endpoints"].items():
                share, answers = kept.get(url.rstrip("/"), (None, 0))
                endpoint.update(kept=share, kept_answers=answers)
            pools.setdefault(name, {})["prefix_cache"] = hits
        wall = self.services.wall()
        return _json({"slices": views.summary(wall), "pools": pools, "splits": views.splits(wall)})

    async def policy(self, request: Request) -> Response:
        holder = self.services.policy
        current = holder.current
        return _json(
            {
                "path": str(holder.path),
                "rules": [r.name for r in current.rules],
                "pools": {n: p.model_dump(mode="json") for n, p in current.pools.items()},
                "ladders": {m: list(ladder.pools) for m, ladder in current.ladders.items()},
                "warnings": [p.render(str(holder.path)) for p in current.warnings],
                "last_reload_error": list(holder.last_error),
            }
        )

    async def pools(self, request: Request) -> Response:
        return _json({"pools": pools_detail(self.services)})

    async def outcomes(self, request: Request) -> Response:
        """The newest outcome records (``speclane report``): ``?since=`` a wall time in
        seconds, ``?limit=`` the newest that many."""
        since = request.query_params.get("since", "0")
        try:
            after = float(since)
        except ValueError:
            raise ApiError(
                status=400, message="since must be a number of seconds", param="since"
            ) from None
        if after != after or after in (float("inf"), float("-inf")):
            raise ApiError(
                status=400, message="since must be a finite number of seconds", param="since"
            )
        limit = _limit(request, 1) if "limit" in request.query_params else None
        records = self.services.outcomes.recent(after, limit)
        return _json({"outcomes": records, "now": self.services.wall()})

    async def reload(self, request: Request) -> Response:
        result = await reload_policy(self.services)
        status = 200 if result.changed else 422
        return _json({"reloaded": result.changed, "errors": list(result.errors)}, status)


def _limit(request: Request, default: int) -> int:
    """``?limit=``: a whole number of at least 1; more than ``_MAX_LIMIT`` gives that many."""
    given = request.query_params.get("limit")
    if given is None:
        return default
    if not (given.isascii() and given.isdigit()) or not given.strip("0"):
        raise ApiError(
            status=400, message="limit must be a whole number of at least 1", param="limit"
        )
    return _MAX_LIMIT if len(given) > 6 else min(int(given), _MAX_LIMIT)


def _flag_name(request: Request) -> str:
    name: str = request.path_params["name"]
    if not _FLAG_NAME.fullmatch(name):  # $ would take a name ending in a line break
        raise ApiError(
            status=400, message="a flag name is 1-64 letters, digits, or _ . : -", param="name"
        )
    return name


def _unknown_flag(name: str, known: Mapping[str, object]) -> ApiError:
    """A name no rule, policy or earlier ops change knows is most likely a typo: setting it
    would change nothing while the operator believes it did."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ApiError(
        status=404,
        message=f"no flag {name!r}: no rule or policy uses it, so setting it would change nothing."
        f'{hint} Send "create": true (speclane flags set --create) to create it anyway.',
        param="name",
        code="flag_not_found",
    )


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "at": entry.at,
        "who": entry.who,
        "flag": entry.flag,
        "old": flag_json(entry.old) if entry.old else None,
        "new": flag_json(entry.new) if entry.new else None,
        "reason": entry.reason,
        **({"policy": entry.policy} if entry.policy else {}),
    }
