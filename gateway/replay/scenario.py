"""A traffic scenario: who sends what, how often, and how acceptance drifts. Engine-neutral.

The same file drives ``speclane replay`` (virtual time, ``gateway/replay/run.py``) and can
drive a real-time runner in front of ``speclane sim`` pools: everything in it is expressed
as clients, request bodies and the simulator's own drift schedule (``Scenario.drift_arg``
is the ``speclane sim --drift`` value). The format is documented in ``bench/scenarios/README.md``.

A file is read like a policy file (``policies/load.py``): any bytes give a scenario or
errors that each carry their line and column. Pure: parsing and generation only; no I/O
beyond what the caller hands in, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from backends.sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from backends.sim.model import DriftPoint
from backends.sim.workload import CREATIVE_TEMPERATURE, Workload
from policies.load import explain_errors, read
from policies.problems import Problem, ordered


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tool(_Strict):
    """A function a request offers; ``parameters`` maps argument names to JSON types."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    parameters: dict[str, str] = {"query": "string"}


class Change(_Strict):
    """From ``at_s`` on, the class sends with this many clients or at this rate."""

    at_s: Annotated[float, Field(ge=0)]
    clients: Annotated[int, Field(ge=0)] | None = None
    rate: Annotated[float, Field(ge=0)] | None = None


class Session(_Strict):
    """Multi-turn conversations: each client of the class holds one conversation at a time,
    resending its whole history every turn, and starts the next when it ends.

    Every conversation is drawn from the scenario's seed, its class and its client (so no
    one can tune to it): its number of turns, uniform in ``[min_turns, max_turns]``; its
    prompt, which grows from about ``first_tokens`` on its first turn to about
    ``last_tokens`` on its last (each turn adds the model's tool call or reply and the
    tool's result or the user's next message, of drawn sizes); and its words. The
    class's system prompt (``system_tokens``, with its tools) is the same for all of its
    conversations, as an application's is. ``billing`` puts Claude Code's
    ``x-anthropic-billing-header`` line, a new ``cch`` hash every turn, on top of a
    Messages system prompt. ``sessions``: conversations each client runs before it stops
    (None: until the scenario ends). The bodies are ``gateway/replay/bodies.py``'s.
    """

    min_turns: Annotated[int, Field(ge=1, le=200)] = 10
    max_turns: Annotated[int, Field(ge=1, le=200)] = 40
    first_tokens: Annotated[int, Field(ge=64, le=200_000)] = 8000
    last_tokens: Annotated[int, Field(ge=64, le=200_000)] = 80000
    system_tokens: Annotated[int, Field(ge=0, le=100_000)] = 2000
    billing: bool = False
    sessions: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Session:
        if self.min_turns > self.max_turns:
            raise ValueError("min_turns must not exceed max_turns")
        if not self.system_tokens < self.first_tokens <= self.last_tokens:
            raise ValueError("system_tokens < first_tokens <= last_tokens is required")
        return self


class Traffic(_Strict):
    """One class of requests and the clients that send it.

    Closed loop: ``clients`` each keep one request in flight and wait ``think_s`` between
    answers. Open loop: ``rate`` requests per second arrive as a Poisson process. Keys and
    users: client ``i`` sends ``Authorization: Bearer <key i mod api_keys>`` (keys are shared
    by every class of the scenario) and, when ``users`` > 0, ``user: user-<i mod users>``.
    ``api``: the API the class speaks (``chat``, ``completions``, Anthropic's ``messages``,
    OpenAI's ``responses``); the same workload by another API is the same work upstream.
    ``template``: the application's instructions, which open every prompt of the class (its
    template, as the gateway fingerprints it); with ``templates`` > 1, client ``i`` sends
    variant ``i mod templates`` of it (many small applications alike). ``keys``: the class
    sends keys of its own, ``sk-<keys>-<i mod api_keys>``, rather than the scenario's.
    ``session``: the class's clients hold multi-turn conversations (``Session``; closed
    loop only); without it every request of the class is the same single turn.
    """

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    workload: Workload
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    max_tokens: Annotated[int, Field(ge=2, le=32768)] = 128
    prompt_tokens: Annotated[int, Field(ge=1, le=200_000)] = 200
    tools: list[Tool] = []
    stream: bool = True
    clients: Annotated[int, Field(ge=0)] | None = None
    think_s: Annotated[float, Field(ge=0)] = 0.0
    rate: Annotated[float, Field(ge=0)] | None = None
    schedule: list[Change] = []
    api_keys: Annotated[int, Field(ge=1)] = 1
    users: Annotated[int, Field(ge=0)] = 0
    endpoint: str = ""
    api: Literal["chat", "completions", "messages", "responses"] = "chat"
    template: str = ""
    templates: Annotated[int, Field(ge=1, le=100_000)] = 1
    keys: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]*$")] = ""
    session: Session | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Traffic:
        if self.session is not None and (self.clients is None or self.api == "completions"):
            raise ValueError(f"traffic {self.name}: sessions need clients and a chat-like API")
        if self.session is not None and self.session.billing and self.api != "messages":
            raise ValueError(f"traffic {self.name}: the billing line goes on Messages")
        if self.api == "completions" and (self.tools or self.workload is Workload.JSON):
            raise ValueError(f"traffic {self.name}: completions offer no tools or JSON output")
        if self.api == "messages" and self.workload is Workload.JSON:
            raise ValueError(f"traffic {self.name}: JSON output goes by chat or responses")
        if (self.clients is None) == (self.rate is None):
            raise ValueError(f"traffic {self.name}: give exactly one of clients or rate")
        closed = self.clients is not None
        for change in self.schedule:
            if (change.clients is not None) != closed or (change.rate is not None) == closed:
                raise ValueError(f"traffic {self.name}: schedule changes what the class set")
        if (self.workload is Workload.TOOLS) != bool(self.tools):
            raise ValueError(f"traffic {self.name}: tools go with workload tools, and only there")
        creative = self.temperature >= CREATIVE_TEMPERATURE
        if self.workload is Workload.CHAT and creative:
            raise ValueError(f"traffic {self.name}: chat needs temperature below 0.9")
        if self.workload is Workload.CREATIVE and not creative:
            raise ValueError(f"traffic {self.name}: creative needs temperature 0.9 or more")
        return self

    def level(self, at: float) -> float:
        """Clients (closed loop) or rate (open loop) in force at second ``at``."""
        value = float(self.clients if self.clients is not None else self.rate or 0.0)
        for change in sorted(self.schedule, key=lambda c: c.at_s):
            if change.at_s <= at:
                value = float(change.clients if change.clients is not None else change.rate or 0)
        return value

    def changes(self) -> list[float]:
        return sorted({c.at_s for c in self.schedule})


class Step(_Strict):
    """From ``at_s`` on, base acceptance ``base`` for ``workload`` (or one tool of it)."""

    at_s: Annotated[float, Field(ge=0)]
    workload: Workload
    tool: str = ""
    base: Annotated[float, Field(ge=0, le=1)]


class Ramp(_Strict):
    """A slow drift: base acceptance moves linearly from ``start`` to ``end``."""

    workload: Workload
    tool: str = ""
    from_s: Annotated[float, Field(ge=0)]
    to_s: Annotated[float, Field(gt=0)]
    start: Annotated[float, Field(ge=0, le=1)]
    end: Annotated[float, Field(ge=0, le=1)]
    every_s: Annotated[float, Field(gt=0)] = 10.0


class Flap(_Strict):
    """Acceptance that flaps: ``low`` and ``high`` alternate every ``period_s`` seconds."""

    workload: Workload
    tool: str = ""
    from_s: Annotated[float, Field(ge=0)]
    to_s: Annotated[float, Field(gt=0)]
    period_s: Annotated[float, Field(gt=0)]
    low: Annotated[float, Field(ge=0, le=1)]
    high: Annotated[float, Field(ge=0, le=1)]


class Drift(_Strict):
    """One entry of the acceptance schedule: a step, a ramp or a flap."""

    step: Step | None = None
    ramp: Ramp | None = None
    flap: Flap | None = None

    @model_validator(mode="after")
    def _one(self) -> Drift:
        if sum(x is not None for x in (self.step, self.ramp, self.flap)) != 1:
            raise ValueError("each acceptance entry is exactly one of step, ramp or flap")
        return self

    def points(self) -> Iterator[DriftPoint]:
        if self.step is not None:
            s = self.step
            yield DriftPoint(s.workload, s.at_s, s.base, s.tool)
        elif self.ramp is not None:
            r = self.ramp
            n = max(1, round((r.to_s - r.from_s) / r.every_s))
            for i in range(n + 1):
                value = r.start + (r.end - r.start) * i / n
                yield DriftPoint(r.workload, r.from_s + i * r.every_s, round(value, 4), r.tool)
        elif self.flap is not None:
            f = self.flap
            at, low = f.from_s, True
            while at < f.to_s:
                yield DriftPoint(f.workload, at, f.low if low else f.high, f.tool)
                at += f.period_s
                low = not low


class Scenario(_Strict):
    """A whole scenario file."""

    version: Literal[1]
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    duration_s: Annotated[float, Field(gt=0, le=86_400)]
    seed: int = 1
    model: str | None = None
    phases: dict[str, Annotated[float, Field(ge=0)]] = {"all": 0.0}
    traffic: Annotated[list[Traffic], Field(min_length=1)]
    acceptance: list[Drift] = []
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = DEFAULT_MAX_NUM_BATCHED_TOKENS
    gateways: Annotated[int, Field(ge=1, le=8)] = 1
    # The simulated engines' prefix cache: off unless asked, because every request of a
    # traffic class has the same body, which real traffic never does.
    prefix_caching: bool = False
    kv_cache_tokens: Annotated[int, Field(ge=1)] | None = None
    draft_scale: Annotated[float, Field(gt=0, le=10)] = 1.0
    policy: str | None = None

    @model_validator(mode="after")
    def _names(self) -> Scenario:
        names = [t.name for t in self.traffic]
        if len(set(names)) != len(names):
            raise ValueError("traffic class names must be unique")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        return self

    def drift_points(self) -> tuple[DriftPoint, ...]:
        return tuple(p for entry in self.acceptance for p in entry.points())

    def drift_arg(self) -> str:
        """The schedule as ``speclane sim --drift`` takes it."""
        return ",".join(
            f"{p.workload.value}{'/' + p.tool if p.tool else ''}@{p.at_s:g}={p.acceptance:g}"
            for p in self.drift_points()
        )

    def phase_of(self, at: float) -> str:
        current = next(iter(self.phases))
        for name, start in sorted(self.phases.items(), key=lambda item: item[1]):
            if start <= at:
                current = name
        return current

    def phase_marks(self) -> list[tuple[str, float]]:
        return sorted(self.phases.items(), key=lambda item: item[1])

    def shows_cached(self, traffic: int) -> bool:
        """Whether the answers to traffic class ``traffic`` (-1: a logged request) say what
        the prefix cache held, as the live simulators do (``bench/live_scenarios.py``):
        Messages and Responses always, chat and completions where the scenario has
        conversations (``--enable-prompt-tokens-details``)."""
        if any(t.session is not None for t in self.traffic):
            return True
        return traffic >= 0 and self.traffic[traffic].api in ("messages", "responses")


class ScenarioError(ValueError):
    """A scenario file that cannot be used; one line per problem, each with its place in the
    file (``FILE:LINE:COLUMN: error: PATH: MESSAGE``, as policy lint prints them)."""

    def __init__(self, filename: str, problems: list[Problem]) -> None:
        self.filename = filename
        self.problems = problems
        super().__init__("\n".join(p.render(filename) for p in problems))


def load_scenario(data: str | bytes, filename: str = "<scenario>") -> Scenario:
    """Parse a scenario file (any bytes: the policy file's reader, with its bounds); a
    ``ScenarioError`` lists every problem with its line and column."""
    got = read(data)
    if got.problems or not isinstance(got.raw, dict):
        raise ScenarioError(filename, ordered(got.problems))
    try:
        return Scenario.model_validate(got.raw)
    except ValidationError as exc:
        problems = explain_errors(exc, got.raw, got.positions, Scenario)
        raise ScenarioError(filename, ordered(problems)) from None
