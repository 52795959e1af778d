"""The admin API's policy drafts: the running text and its version, lint, explain, apply.

    GET  /admin/policy/source    running text, version, last reload, the file on disk
    POST /admin/policy/lint      {"text"} -> every problem, placed (line, column)
    POST /admin/policy/explain   {"request", "endpoint", "headers", "draft"} -> the decision
                                 ("endpoint": a short name or a path, gateway/apis/)
                                 under the running policy and under the draft, side by side
    POST /admin/policy/apply     {"text", "base_version", "reason", "dry_run"}

Applying goes through the one reload path: the draft is linted, written over the policy
file in one rename (``gateway/state/policywrite.py``) and reloaded as a changed file is. It
needs ``SPECLANE_POLICY_APPLY=true``, the file on disk still at ``base_version`` (else 409:
somebody changed it since the draft was taken), and a writable file (else 409 with why: a
ConfigMap mount is read-only, so the draft goes through ``kubectl apply`` instead and the
file watch reloads it). A dry run answers what an apply would do (the diff, the problems,
what blocks it) and changes nothing. Lint and explain run in a worker thread: a large draft
must not stall the requests this process is relaying.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway import apis, schema
from gateway.classify import Defaults, classify
from gateway.errors import JSON, ApiError, invalid_body
from gateway.lifecycle import reload_policy
from gateway.services import Services
from gateway.state.flagstore import POLICY, AuditEntry
from gateway.state.policyfile import read_policy_file, version_of
from gateway.state.policywrite import PolicyReadOnly, replace_text, unwritable
from policies.compiled import CompiledPolicy, load_policy
from policies.explain import explain
from policies.flags import FlagValue, merged
from policies.lint import lint
from policies.problems import PolicyError, Problem, dotted

log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]
Model = TypeVar("Model", bound=BaseModel)
MAX_DRAFT_BYTES = 1024 * 1024
Text = Annotated[str, Field(max_length=MAX_DRAFT_BYTES)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LintBody(_Body):
    text: Text


class ExplainBody(_Body):
    request: dict[str, Any]
    endpoint: Annotated[str, Field(max_length=100)] = "chat"  # a short name or a path
    headers: dict[str, Annotated[str, Field(max_length=1000)]] = {}
    draft: Text | None = None


class ApplyBody(_Body):
    text: Text
    base_version: str | None = None
    reason: Annotated[str, Field(max_length=500)] = ""
    dry_run: bool = False


class PolicyDrafts:
    """Handlers bound to one gateway's services; ``routes`` takes the admin API's guard."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def routes(self, guarded: Callable[[Handler], Handler]) -> list[Route]:
        return [
            Route("/admin/policy/source", guarded(self.source), methods=["GET"]),
            Route("/admin/policy/lint", guarded(self.lint), methods=["POST"]),
            Route("/admin/policy/explain", guarded(self.explain), methods=["POST"]),
            Route("/admin/policy/apply", guarded(self.apply), methods=["POST"]),
        ]

    async def source(self, request: Request) -> Response:
        holder = self.services.policy
        attempt = holder.last_reload
        return _json(
            {
                "path": str(holder.path) if holder.path else None,
                "version": holder.version,
                "text": holder.text,
                "last_reload": None
                if attempt is None
                else {
                    "at": attempt.at,
                    "ok": attempt.result.changed,
                    "errors": list(attempt.result.errors),
                },
                "file": _shown(await _on_disk(holder.path, holder.version)),
                "apply": {
                    "enabled": self.services.settings.policy_apply,
                    "blocked": self._blocked(),
                },
            }
        )

    async def lint(self, request: Request) -> Response:
        body = await _parsed(request, LintBody)
        report = await asyncio.to_thread(lint, body.text, "draft")
        return _json(
            {
                "problems": [problem_json(p) for p in report.problems],
                "errors": len(report.errors),
                "warnings": len(report.warnings),
            }
        )

    async def explain(self, request: Request) -> Response:
        body = await _parsed(request, ExplainBody)
        overrides = dict(self.services.flags.overrides)
        running = self.services.policy.current
        answer = await asyncio.to_thread(
            _explained, body, running, overrides, self.services.defaults
        )
        return _json(answer)

    async def apply(self, request: Request) -> Response:
        body = await _parsed(request, ApplyBody)
        holder = self.services.policy
        report = await asyncio.to_thread(lint, body.text, "draft")
        disk = await _on_disk(holder.path, holder.version)
        before = disk["text"] if disk["text"] is not None else holder.text or ""
        answer: dict[str, Any] = {
            "dry_run": body.dry_run,
            "applied": False,
            "version": version_of(body.text),
            "base_version": disk["version"],
            "diff": _diff(before, body.text, str(holder.path)),
            "problems": [problem_json(p) for p in report.problems],
            "blocked": self._blocked(),
        }
        if body.dry_run:
            return _json(answer)
        refusal = self._refusal(body, report.failed(), disk["version"])
        if refusal is not None:
            raise refusal
        assert holder.path is not None  # _refusal checked
        try:
            replace_text(holder.path, body.text)
        except PolicyReadOnly as exc:
            raise _read_only(str(exc)) from None
        result = await reload_policy(self.services)
        who = actor(request)
        change = f"{disk['version']} -> {answer['version']}"
        if not result.changed:
            change += " (written; the reload refused it: " + "; ".join(result.errors)[:300] + ")"
        entry = AuditEntry(
            at=self.services.wall(),
            who=who,
            flag=POLICY,
            old=None,
            new=None,
            reason=body.reason,
            policy=change,
        )
        await self.services.state.note(entry)
        log.warning(
            "policy %s applied by %s (was %s): %s",
            answer["version"],
            who,
            disk["version"],
            body.reason,
        )
        answer.update(applied=True, reloaded=result.changed, errors=list(result.errors))
        return _json(answer, 200 if result.changed else 422)

    def _blocked(self) -> str | None:
        """Why an apply would be refused before looking at the draft, or None."""
        holder = self.services.policy
        if not self.services.settings.policy_apply:
            return "applying drafts is off on this gateway (SPECLANE_POLICY_APPLY=true turns it on)"
        if holder.path is None:
            return "the running policy was not loaded from a file"
        return unwritable(holder.path)

    def _refusal(self, body: ApplyBody, failed: bool, on_disk: str | None) -> ApiError | None:
        blocked = self._blocked()
        if blocked is not None and not self.services.settings.policy_apply:
            return ApiError(status=403, message=blocked, code="policy_apply_disabled")
        if blocked is not None:
            return _read_only(blocked)
        if failed:
            return ApiError(
                status=422,
                message="the draft has errors: lint it",
                param="text",
                code="policy_invalid",
            )
        if body.base_version is not None and body.base_version != on_disk:
            return ApiError(
                status=409,
                message=f"the policy file changed since the draft was taken (now {on_disk}, "
                f"draft based on {body.base_version}): review the difference and apply again",
                param="base_version",
                code="policy_changed",
            )
        if not body.reason.strip():  # as a flag's change, and as the console asks
            return ApiError(
                status=400, message="reason: say why, for the audit log", param="reason"
            )
        return None


def _read_only(why: str) -> ApiError:
    return ApiError(
        status=409,
        message=f"the policy file cannot be written here: {why}. Apply the draft where the file "
        "comes from (for a ConfigMap: kubectl apply); the gateway reloads it when it changes",
        code="policy_read_only",
    )


def _explained(
    body: ExplainBody,
    running: CompiledPolicy,
    overrides: Mapping[str, FlagValue],
    defaults: Defaults,
) -> dict[str, Any]:
    try:
        api = apis.named(body.endpoint)
    except ValueError as exc:
        raise ApiError(status=400, message=str(exc), param="endpoint") from None
    headers = {k.lower(): v for k, v in body.headers.items()}
    try:
        parsed, _ = schema.parse(orjson.dumps(body.request), api.model)
    except ApiError as exc:
        raise ApiError(
            status=400,
            message=f"request: {exc.message}",
            param=f"request.{exc.param or ''}".rstrip("."),
        ) from None
    features = classify(parsed, api.path, headers, "explain", defaults.under(running.file.defaults))
    out: dict[str, Any] = {
        "running": explain(
            features, running, merged(running.file.flags, overrides), "live"
        ).as_json()
    }
    if body.draft is not None:
        try:
            draft = load_policy(body.draft, "draft")
        except PolicyError as exc:
            out["draft"] = {"problems": [problem_json(p) for p in exc.problems]}
        else:
            drafted = classify(
                parsed, api.path, headers, "explain", defaults.under(draft.file.defaults)
            )
            live = merged(draft.file.flags, overrides)
            out["draft"] = explain(drafted, draft, live, "live").as_json()
    return out


def problem_json(problem: Problem) -> dict[str, Any]:
    return {
        "line": problem.line,
        "column": problem.column,
        "severity": problem.severity.value,
        "path": dotted(problem.path),
        "message": problem.message,
        "hint": problem.hint,
        "code": problem.code,
    }


async def _on_disk(path: Path | None, running: str | None) -> dict[str, Any]:
    """The file as it is now, read off the event loop, as a reload reads it."""
    if path is None:
        return {"version": None, "same": False, "text": None, "error": "no file"}
    try:
        text = (await asyncio.to_thread(read_policy_file, path)).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        return {"version": None, "same": False, "text": None, "error": str(exc)}
    version = version_of(text)
    return {"version": version, "same": version == running, "text": text, "error": None}


def _shown(disk: dict[str, Any]) -> dict[str, Any]:
    """The file on disk as the source route shows it: its text only when it differs."""
    return disk if not disk["same"] else {**disk, "text": None}


def _diff(before: str, after: str, name: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), name, "draft"
    )
    return "".join(lines)


async def _parsed(request: Request, model: type[Model]) -> Model:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > 2 * MAX_DRAFT_BYTES:
            raise ApiError(status=413, message="the body is too large", code="body_too_large")
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as exc:
        raise invalid_body(exc) from None


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type=JSON)


def actor(request: Request) -> str:
    """Who the audit log says made a change: the ``x-speclane-actor`` header, its first 100
    printable characters (a line break or an escape code never reaches the log), else
    ``admin``."""
    given = request.headers.get("x-speclane-actor", "")
    return "".join(c for c in given[:100] if c.isprintable()) or "admin"
