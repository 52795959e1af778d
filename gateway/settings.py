"""Gateway settings, from ``SPECLANE_*`` environment variables or arguments.

The only module that reads the environment.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything that is not policy: where to listen, limits, state, telemetry."""

    model_config = SettingsConfigDict(env_prefix="SPECLANE_", extra="ignore", frozen=True)

    policy: Path = Field(Path("policy.yaml"), description="policy file (YAML)")
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="413 above this")
    decision_headers: bool = Field(True, description="send x-speclane-* headers")
    tenant_header: str = "x-speclane-tenant"
    endpoint_header: str = "x-speclane-endpoint"
    default_temperature: float = Field(1.0, description="what backends use when unset")
    default_top_p: float = 1.0
    upstream_max_connections: int = Field(1024, ge=1)
    upstream_keepalive_s: float = 30.0
    breaker_failures: int = Field(3, ge=1, description="failures in a row that open a breaker")
    breaker_reset_s: float = Field(5.0, gt=0)
    tries_per_pool: int = Field(2, ge=1)
    policy_watch_s: float = Field(1.0, gt=0, description="how often the policy file is checked")
    admin_token: SecretStr | None = Field(None, description="bearer token; unset disables /admin")
    redis_url: str | None = None
    namespace: str = "speclane"
    sync_interval_s: float = Field(1.0, gt=0)
    discovery_interval_s: float = Field(10.0, gt=0, description="DNS re-resolve period")
    scrape_interval_s: float = Field(10.0, gt=0, description="pool /metrics scrape period")
    shadow_max_concurrency: int = Field(8, ge=0, description="mirrors in flight at most")
    shadow_tokens_per_minute: float = Field(200_000, ge=0, description="mirror token budget")
    shadow_max_outstanding: int = Field(16, ge=1, description="skip mirrors to busier endpoints")
    shadow_timeout_s: float = Field(120.0, gt=0)
    canary_max_mismatch: float = Field(0.1, ge=0, le=1, description="greedy mismatch alarm")
    canary_min_samples: int = Field(20, ge=1)
    otlp_endpoint: str | None = None
    graceful_shutdown_s: float = Field(30.0, gt=0, description="drain time on SIGTERM")
    log_level: str = "info"
