"""Gateway settings, from ``SPECLANE_*`` environment variables or arguments.

The only module that reads the environment. The settings come in groups, one class per
concern (``GROUPS``, in the order the reference lists them); ``Settings`` is all of them
at once, each field still read from ``SPECLANE_`` and its own name, whatever its group.
Every field has a description: ``speclane settings --markdown`` makes the tables of
``docs/configuration.md`` from them, a section per group (a test keeps the page current).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Serving(BaseModel):
    """Where it listens, the policy it serves, its clock and its logs."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    policy: Path = Field(
        Path("policy.yaml"),
        description="the policy file (`--policy`); reloaded when it changes, on SIGHUP and on "
        "POST /admin/policy/reload",
    )
    host: str = Field("127.0.0.1", description="address to listen on (`--host`)")
    port: int = Field(8080, description="port to listen on (`--port`)")
    policy_watch_s: float = Field(1.0, gt=0, description="how often the policy file is checked")
    time_scale: float = Field(
        1.0,
        gt=0,
        le=1,
        description="model seconds per wall second, for benchmarks against time-scaled "
        "simulators (speclane sim --time-scale): the clocks the gateway judges by run "
        "1/time_scale times as fast, and its periodic work (the guardrail's tick, load "
        "sampling, metrics scrapes, the shared-state sync) comes time_scale times as often; "
        "1 in production",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info",
        description="log level (`--log-level`): trace, debug, info, warning, error or critical; "
        "every line carries a timestamp",
    )
    access_log: bool = Field(False, description="one log line per request (`--access-log`)")


class ClientLimits(BaseModel):
    """Client connections and requests: sizes, timeouts, caps, and the drain on SIGTERM."""

    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="larger request bodies get 413 (default 4 MiB)"
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="request line and headers; larger heads get 431, read no further "
        "(default 64 KiB)",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request's headers must arrive within this of the connection opening (or "
        "of their first byte, on a kept-alive connection); else 408 and the connection closes",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="a request's body must arrive within this of its headers; else 408 and the "
        "connection closes",
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="open client connections per process; one more is answered 503 with "
        "Retry-After and closed, outside the count (default: half the file descriptors the "
        "process may open, `ulimit -n`, after 64 and SPECLANE_UPSTREAM_MAX_CONNECTIONS: 360 for "
        "1024, 32,224 for 65,536)",
    )
    max_connections_per_peer: int | None = Field(
        None,
        ge=1,
        description="open client connections per process from one client address; one more "
        "is answered 503 with Retry-After and closed, outside the count (default: half of "
        "SPECLANE_MAX_CONNECTIONS); behind a proxy every client has the proxy's address, so "
        "set both to the same number there",
    )
    keepalive_timeout_s: float = Field(
        5.0,
        gt=0,
        description="an idle keep-alive client connection is closed after this; behind a load "
        "balancer, set it above the balancer's idle timeout",
    )
    max_requests: int = Field(
        1024, ge=1, description="requests in flight at once; 429 with Retry-After above"
    )
    max_requests_per_tenant: int | None = Field(
        None,
        ge=1,
        description="requests in flight per tenant, unless the policy gives the tenant its own "
        "cap; 429 with Retry-After above",
    )
    graceful_shutdown_s: float = Field(
        30.0, gt=0, description="on SIGTERM, how long answers in flight have to finish"
    )
    drain_delay_s: float = Field(
        2.0,
        ge=0,
        description="on SIGTERM, /readyz fails and new requests get 503 for this long before "
        "the port closes and the drain time starts (SIGINT skips it)",
    )


class Requests(BaseModel):
    """What a request is read for (tenant, API key, endpoint, sampling defaults), and the
    headers its answer carries."""

    decision_headers: bool = Field(
        True,
        description="send the x-speclane-rule, -slice, -pool and -reason headers (x-request-id "
        "is always sent)",
    )
    trusted_tenant_header: str | None = Field(
        None,
        description="a header an authenticating proxy in front sets to the tenant; unset, the "
        "tenant comes from the API key",
    )
    require_api_key: bool = Field(
        False, description="401 for a request without an API key the policy knows"
    )
    endpoint_header: str = Field(
        "x-speclane-endpoint",
        description="a request header whose value names a product endpoint, which rules match "
        "with match.endpoint",
    )
    default_temperature: float = Field(
        1.0,
        description="the temperature the backends use when a request leaves it out, where "
        "the policy's defaults.temperature does not say; rules match on it",
    )
    default_top_p: float = Field(
        1.0,
        description="the top_p the backends use when a request leaves it out, where the "
        "policy's defaults.top_p does not say; rules match on it",
    )


class Upstreams(BaseModel):
    """The pools' endpoints: connections, answer sizes, tries and retries, discovery and scrapes."""

    upstream_max_connections: int | None = Field(
        None,
        ge=1,
        description="connections to the pools' endpoints open at once, over all endpoints; a "
        "request waits for one above (default: a quarter of the file descriptors the process "
        "may open, `ulimit -n`, after 64, at most 1024); keep it plus SPECLANE_MAX_CONNECTIONS "
        "below ulimit -n",
    )
    upstream_keepalive_s: float = Field(
        30.0,
        description="an idle connection to an endpoint is reused for this long, then opened "
        "anew; keep it below the servers' own keep-alive timeout",
    )
    max_response_bytes: int = Field(
        32 * 1024 * 1024,
        ge=64 * 1024,
        description="an upstream's whole answer, or one event of its stream, larger than this "
        "is given up as it is read: another endpoint is tried, else 502 (a final error event "
        "once a stream has started); bounds the memory one answer takes (default 32 MiB)",
    )
    tries_per_pool: int = Field(
        2, ge=1, description="endpoints in service a request tries per rung, down the ladder"
    )
    break_retries: int = Field(
        5,
        ge=0,
        description="a non-streaming answer that broke before any of it reached the client is "
        "tried again at most this often, on endpoints whose answers have not broken first",
    )
    break_retry_window_s: float = Field(
        60.0, gt=0, description="no such retry starts later than this after the request came"
    )
    prefix_affinity: bool = Field(
        True,
        description="within a pool, send a request to the endpoint most likely to hold its "
        "prompt's prefix in cache, under the load bound; off: the least loaded",
    )
    prefix_load_epsilon: float = Field(
        0.25,
        ge=0,
        description="the load bound of prefix affinity: no endpoint above (1 + this) x its "
        "pool's mean outstanding requests, but for a conversation its endpoint keeps because "
        "re-prefilling it elsewhere would cost more than that endpoint's load",
    )
    prefix_map_entries: int = Field(
        100_000,
        ge=1,
        description="prompt-prefix checkpoints each replica remembers (hashes and endpoints "
        "only, ~2 KiB of prompt each, ~200 bytes of memory each)",
    )
    prefix_ttl_s: float = Field(
        1800.0,
        gt=0,
        description="how long the gateway remembers where it sent a prompt prefix; in Redis "
        "when SPECLANE_REDIS_URL is set",
    )
    discovery_interval_s: float = Field(
        10.0,
        gt=0,
        description="how often a pool with discovery: dns re-resolves its endpoints' hosts",
    )
    scrape_interval_s: float = Field(
        10.0,
        gt=0,
        description="how often each endpoint's metrics page is read (speculation counters, "
        "load, health)",
    )


class Outliers(BaseModel):
    """Ejecting failing endpoints, and bringing them back."""

    outlier_consecutive_failures: int = Field(
        5, ge=1, description="an endpoint is ejected after this many failures in a row"
    )
    outlier_interval_s: float = Field(
        10.0,
        gt=0,
        description="the period over which an endpoint's failure share is judged (and one "
        "ejection forgiven when clean)",
    )
    outlier_base_ejection_s: float = Field(
        30.0, gt=0, description="an ejection lasts this times the number of recent ejections"
    )
    outlier_max_ejection_s: float = Field(300.0, gt=0, description="the longest ejection")
    outlier_max_ejection_percent: float = Field(
        50.0, ge=0, le=100, description="at most this share of a pool's endpoints is ejected"
    )
    outlier_failure_percentage: float = Field(
        85.0,
        gt=0,
        le=100,
        description="an endpoint with at least this share of at least 20 requests failed in "
        "one interval is ejected",
    )
    outlier_slow_start_s: float = Field(
        30.0,
        ge=0,
        description="a returning endpoint's share of the load grows from a tenth to all of it "
        "over this",
    )


class Admin(BaseModel):
    """The admin API and the ops console."""

    admin_token: SecretStr | None = Field(
        None, description="bearer token for /admin; unset disables the admin API and the console"
    )
    gateway: str = Field(
        "http://127.0.0.1:8080",
        description="the gateway `speclane flags` and `speclane report` talk to, when "
        "`--gateway` does not say",
    )
    console: bool = Field(
        True, description="serve the ops console at /console when the admin API is on"
    )
    policy_apply: bool = Field(
        False, description="let POST /admin/policy/apply (and the console) write the policy file"
    )


class SharedState(BaseModel):
    """Workers and replicas, and the state they share through Redis."""

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

    redis_url: str | None = Field(
        None,
        description="share flags, audit, windows and guardrail states with other replicas and "
        "workers through this Redis (`--redis-url`)",
    )
    redis_password: SecretStr | None = Field(
        None, description="Redis AUTH password, when the URL carries none (from a Secret)"
    )
    namespace: str = Field(
        "speclane", description="prefix of every Redis key; deployments sharing a Redis differ"
    )
    workers: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        1,
        description="processes serving the port (`--workers`); more than one needs "
        "SPECLANE_REDIS_URL; auto: one per CPU the container may use when Redis is set, else "
        "one (the container image's default)",
    )
    sync_interval_s: float = Field(
        1.0,
        gt=0,
        description="how often a replica pulls flags and states from Redis, beside pub/sub",
    )
    response_pin_ttl_s: float = Field(
        86_400.0,
        gt=0,
        description="how long the gateway remembers which endpoint stored a Responses API "
        "response, so that calls naming it (previous_response_id, GET, DELETE, cancel) go "
        "there; in Redis when SPECLANE_REDIS_URL is set",
    )
    response_pins_per_tenant: int = Field(
        10_000,
        ge=1,
        description="stored Responses API ids the gateway remembers per tenant (in this "
        "process and in Redis), the tenant's oldest forgotten first; a call naming a "
        "forgotten id gets vLLM's 404",
    )


class Shadow(BaseModel):
    """Shadow mirrors and the canary that compares their answers."""

    shadow_max_concurrency: int = Field(
        8, ge=0, description="shadow mirrors in flight at once, per process; more are dropped"
    )
    shadow_tokens_per_minute: float = Field(
        200_000,
        ge=0,
        description="tokens mirrors may spend per minute, per process (each counts its prompt's "
        "estimated tokens plus its max_tokens); mirrors beyond the budget are dropped",
    )
    shadow_max_outstanding: int = Field(
        16,
        ge=1,
        description="no mirror goes to a pool whose least busy endpoint has this many requests "
        "in flight",
    )
    shadow_timeout_s: float = Field(
        120.0, gt=0, description="a mirror that has not finished within this is given up"
    )
    canary_max_mismatch: float = Field(
        0.1,
        ge=0,
        le=1,
        description="share of temperature-0 mirrors whose text differs from the client's "
        "answer above which a slice gets a guardrail event",
    )
    canary_min_samples: int = Field(
        20, ge=1, description="mirrors compared before that share is judged"
    )


class Telemetry(BaseModel):
    """Metrics, traces, and the request and outcome records."""

    metrics_dir: Path | None = Field(
        None,
        description="where several workers keep their metrics for /metrics to sum; emptied at "
        "start; default: a temporary directory",
    )
    metrics_max_slices: int = Field(
        200, ge=0, description="slices with their own metric label; later ones are 'other'"
    )
    otlp_endpoint: str | None = Field(
        None, description="export one trace per request over OTLP/HTTP to this URL"
    )
    request_log: Path | None = Field(
        None,
        description="append every request (time, body, routing headers and tenant; never the "
        "API key) to this JSONL file, for speclane replay --log",
    )
    outcome_log: Path | None = Field(
        None,
        description="write what each request came to (numbers and labels, no prompts or keys) "
        "here, a JSON line each, for speclane report",
    )
    outcome_log_max_mb: float = Field(
        100.0, gt=0, description="rotate the outcome log to FILE.1 above this size"
    )
    outcome_records: int = Field(
        10_000, ge=0, description="newest outcome records kept for GET /admin/outcomes"
    )


# pydantic lists the fields of the last base first: the groups are named here in reverse, so
# that ``Settings.model_fields`` keeps ``GROUPS``' order
class Settings(
    Telemetry,
    Shadow,
    SharedState,
    Admin,
    Outliers,
    Upstreams,
    Requests,
    ClientLimits,
    Serving,
    BaseSettings,
):
    """Everything that is not policy: where to listen, limits, state, telemetry."""

    model_config = SettingsConfigDict(env_prefix="SPECLANE_", extra="ignore", frozen=True)

    def real_s(self, seconds: float) -> float:
        """Wall seconds for a period of the gateway's own clock (``time_scale``)."""
        return seconds * self.time_scale

    @property
    def redis_secret(self) -> str | None:
        """The Redis AUTH password in clear, for the clients that send it."""
        return self.redis_password.get_secret_value() if self.redis_password else None

    @property
    def client_connections(self) -> int:
        """``max_connections``, or its default for this process's file limit."""
        return self.max_connections or client_cap(file_limit(), self.upstream_connections)

    @property
    def upstream_connections(self) -> int:
        """``upstream_max_connections``, or its default for this process's file limit."""
        return self.upstream_max_connections or upstream_cap(file_limit())

    @property
    def connections_per_peer(self) -> int:
        """``max_connections_per_peer``, or its default: half of ``client_connections``."""
        return self.max_connections_per_peer or max(1, self.client_connections // 2)

    @property
    def several_workers(self) -> bool:
        return isinstance(self.workers, int) and self.workers > 1


GROUPS: tuple[type[BaseModel], ...] = (
    Serving,
    ClientLimits,
    Requests,
    Upstreams,
    Outliers,
    Admin,
    SharedState,
    Shadow,
    Telemetry,
)


def huggingface_cache() -> Path:
    """Where the Hugging Face libraries (and so vLLM) keep downloaded models: ``HF_HUB_CACHE``,
    else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return Path(hub)
    home = os.environ.get("HF_HOME")
    return Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub"


def export_metrics_dir(path: Path) -> None:
    """Tell prometheus-client, in the worker processes that inherit this environment, where
    their metrics files go (its multiprocess mode reads ``PROMETHEUS_MULTIPROC_DIR``)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


# File descriptors kept for what is neither a client's nor an upstream's connection: the
# event loop, Redis, log files, the policy file, a connection being turned away.
RESERVED_FILES = 64
_UNLIMITED_FILES = 1 << 20  # what an unlimited RLIMIT_NOFILE is taken for


def file_limit() -> int:
    """How many file descriptors this process may have open (the soft ``RLIMIT_NOFILE``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _UNLIMITED_FILES if soft == resource.RLIM_INFINITY else soft


def upstream_cap(files: int) -> int:
    """The default cap on upstream connections for ``files`` descriptors: a quarter of
    those past ``RESERVED_FILES``, at most 1024 (a few servers need no more)."""
    return max(4, min(1024, (files - RESERVED_FILES) // 4))


def client_cap(files: int, upstream: int) -> int:
    """The default cap on client connections for ``files`` descriptors, ``upstream`` of
    them for upstream connections: half of the rest past ``RESERVED_FILES``. The other half
    stays free for connections over the cap, each of which takes a descriptor until it is
    turned away, and for answers refused part way, which linger before closing."""
    return max(8, (files - RESERVED_FILES - upstream) // 2)
