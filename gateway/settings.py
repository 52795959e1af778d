"""Gateway settings, from ``SPECLANE_*`` environment variables or arguments.

The only module that reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything that is not policy: where to listen, limits, state, telemetry."""

    model_config = SettingsConfigDict(env_prefix="SPECLANE_", extra="ignore", frozen=True)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("workers")
    @classmethod
    def _workers_share_state(cls, value: int | str, info: ValidationInfo) -> int | str:
        if isinstance(value, int) and value > 1 and not info.data.get("redis_url"):
            raise ValueError(
                f"{value} workers need SPECLANE_REDIS_URL (--redis-url): workers share flags, "
                "windows and guardrail states through Redis, as replicas do; without it each "
                "would keep its own, and a flag set through one would not reach the others"
            )
        return value

    @property
    def several_workers(self) -> bool:
        return isinstance(self.workers, int) and self.workers > 1

    policy: Path = Field(Path("policy.yaml"), description="policy file (YAML)")
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="413 above this")
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="request line and headers; 431 above this"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="a request's headers must arrive within this; else 408, closed"
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="a request's body must arrive within this after its headers"
    )
    max_connections: int = Field(
        4096, ge=1, description="open client connections per process; 503 + Retry-After above"
    )
    keepalive_timeout_s: float = Field(
        5.0, gt=0, description="an idle keep-alive connection is closed after this"
    )
    decision_headers: bool = Field(True, description="send x-speclane-* headers")
    trusted_tenant_header: str | None = Field(
        None, description="a header an authenticating proxy in front sets to the tenant"
    )
    require_api_key: bool = Field(False, description="401 for requests without a known key")
    max_requests: int = Field(1024, ge=1, description="requests in flight at once; 429 above")
    max_requests_per_tenant: int | None = Field(
        None, ge=1, description="per tenant, unless the policy gives the tenant its own cap"
    )
    endpoint_header: str = "x-speclane-endpoint"
    default_temperature: float = Field(1.0, description="what backends use when unset")
    default_top_p: float = 1.0
    upstream_max_connections: int = Field(1024, ge=1)
    upstream_keepalive_s: float = 30.0
    outlier_consecutive_failures: int = Field(5, ge=1, description="failures in a row: eject")
    outlier_interval_s: float = Field(10.0, gt=0, description="failure-share analysis period")
    outlier_base_ejection_s: float = Field(30.0, gt=0, description="first ejection's length")
    outlier_max_ejection_s: float = Field(300.0, gt=0, description="longest ejection")
    outlier_max_ejection_percent: float = Field(50.0, ge=0, le=100, description="of a pool")
    outlier_failure_percentage: float = Field(85.0, gt=0, le=100, description="eject above")
    outlier_slow_start_s: float = Field(30.0, ge=0, description="ramp-up after return")
    tries_per_pool: int = Field(2, ge=1)
    break_retries: int = Field(
        5,
        ge=0,
        description="a non-streaming answer that broke before any of it reached the client is "
        "tried again at most this often, on endpoints whose answers have not broken first",
    )
    break_retry_window_s: float = Field(
        60.0, gt=0, description="no such retry starts later than this after the request came"
    )
    policy_watch_s: float = Field(1.0, gt=0, description="how often the policy file is checked")
    admin_token: SecretStr | None = Field(None, description="bearer token; unset disables /admin")
    console: bool = Field(True, description="serve the ops console at /console (needs /admin)")
    policy_apply: bool = Field(False, description="let the admin API write the policy file")
    redis_url: str | None = None
    redis_password: SecretStr | None = Field(
        None, description="Redis AUTH password, when the URL carries none (from a Secret)"
    )
    namespace: str = "speclane"
    workers: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        1,
        description="processes serving the port; auto: one per CPU the container may use "
        "when Redis is set, else one (workers share state through Redis, as replicas do)",
    )
    metrics_dir: Path | None = Field(
        None, description="where several workers keep their metrics; default: a temp dir"
    )
    sync_interval_s: float = Field(1.0, gt=0)
    discovery_interval_s: float = Field(10.0, gt=0, description="DNS re-resolve period")
    scrape_interval_s: float = Field(10.0, gt=0, description="pool /metrics scrape period")
    request_log: Path | None = Field(
        None,
        description="append every request (time, body, routing headers; no API key) to this "
        "JSONL file, for speclane replay --log",
    )
    shadow_max_concurrency: int = Field(8, ge=0, description="mirrors in flight at most")
    shadow_tokens_per_minute: float = Field(200_000, ge=0, description="mirror token budget")
    shadow_max_outstanding: int = Field(16, ge=1, description="skip mirrors to busier endpoints")
    shadow_timeout_s: float = Field(120.0, gt=0)
    canary_max_mismatch: float = Field(0.1, ge=0, le=1, description="greedy mismatch alarm")
    canary_min_samples: int = Field(20, ge=1)
    otlp_endpoint: str | None = Field(None, description="export traces over OTLP/HTTP")
    outcome_log: Path | None = Field(
        None, description="write what each request came to here, a JSON line each (report)"
    )
    outcome_log_max_mb: float = Field(100.0, gt=0, description="rotate the outcome log above")
    outcome_records: int = Field(
        10_000, ge=0, description="newest outcome records kept for GET /admin/outcomes"
    )
    metrics_max_slices: int = Field(
        200, ge=0, description="slices with their own metric label; later ones are 'other'"
    )
    graceful_shutdown_s: float = Field(30.0, gt=0, description="drain time on SIGTERM")
    drain_delay_s: float = Field(
        2.0,
        ge=0,
        description="on SIGTERM, /readyz fails and new requests get 503 for this long before "
        "the port closes and the drain time starts (SIGINT skips it)",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    access_log: bool = Field(False, description="one log line per request")


def export_metrics_dir(path: Path) -> None:
    """Tell prometheus-client, in the worker processes that inherit this environment, where
    their metrics files go (its multiprocess mode reads ``PROMETHEUS_MULTIPROC_DIR``)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
