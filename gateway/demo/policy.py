"""The demo's policy file: one rule per workload and a guardrail tuned to react within a run.

The guardrail's times (window, cooldown) scale with the run's length, so that a 6-second
test run and a 60-second demo go through the same story: collapse, fall back, probe,
recover. Pure: builds YAML text; the stack writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SPEC_POOL = "spec"
STANDARD_POOL = "standard"
LADDER = (SPEC_POOL, STANDARD_POOL)
# The rung each rule starts on, as an index into LADDER (shadow serves from standard).
RULE_START = {
    "structured-json": 0,
    "tool-calls": 0,
    "code": 0,
    "long-context": 1,
    "creative": 1,
    "chat": 0,
}
LONG_CONTEXT_TOKENS = 8000
SHADOW_FRACTION = 0.3


@dataclass(frozen=True, slots=True)
class Tuning:
    """Guardrail settings (the ``guardrail`` block of the policy), for a 60-second run: the
    default, economic guardrail, its times compressed so that a run sees a fall and a
    recovery (cooldown and the longest wait between probes)."""

    window_s: float = 20.0
    cooldown_s: float = 6.0
    max_cooldown_s: float = 6.0
    probe_fraction: float = 0.3

    def scaled(self, factor: float) -> Tuning:
        """The same settings with every time multiplied by ``factor``."""
        return replace(
            self,
            window_s=self.window_s * factor,
            cooldown_s=self.cooldown_s * factor,
            max_cooldown_s=self.max_cooldown_s * factor,
        )

    def yaml(self) -> str:
        return (
            f"{{window_s: {self.window_s:.3f}, cooldown_s: {self.cooldown_s:.3f}, "
            f"max_cooldown_s: {self.max_cooldown_s:.3f}, probe_fraction: {self.probe_fraction}}}"
        )


def for_duration(duration_s: float) -> Tuning:
    """The demo tuning, its times scaled to a run of ``duration_s`` seconds."""
    return Tuning().scaled(duration_s / 60.0)


def demo_policy(spec_url: str, standard_url: str, tuning: Tuning, model: str) -> str:
    """The policy YAML for a speculative pool (k=4) and a standard pool of ``model``."""
    return f"""# written by `speclane demo`
version: 1
pools:
  {SPEC_POOL}: {{kind: speculative, model: {model}, num_speculative_tokens: 4,
         endpoints: ["{spec_url}"]}}
  {STANDARD_POOL}: {{kind: standard, model: {model}, endpoints: ["{standard_url}"]}}
ladder: [{", ".join(LADDER)}]
guardrail: {tuning.yaml()}
rules:
  - name: structured-json
    match: {{response_format: [json_object, json_schema], temperature: {{max: 0.3}}}}
    start: {SPEC_POOL}
  - name: tool-calls
    match: {{tools: present}}
    start: {SPEC_POOL}
  - name: code
    match: {{endpoint: [code-assist]}}
    start: {SPEC_POOL}
  - name: long-context
    match: {{context_tokens: {{min: {LONG_CONTEXT_TOKENS}}}}}
    start: {STANDARD_POOL}
  - name: creative
    match: {{temperature: {{min: 0.9}}}}
    start: shadow
    shadow_fraction: {SHADOW_FRACTION}
  - name: chat
    experiment: {{arms: [{SPEC_POOL}, {STANDARD_POOL}], split: 50}}
    description: >-
      a pilot: half the chat users on speculation, half on standard, judged by the report
      at the end
"""


def rung_name(rule: str, offset: int, phase: str) -> str:
    """Where a slice of ``rule`` stands, in pool names: ``on spec``, ``fallen back to
    standard``, ``probing spec``."""
    start = RULE_START.get(rule, 0)
    serving = LADDER[min(start + offset, len(LADDER) - 1)]
    if phase == "probing" and start + offset > 0:
        return f"probing {LADDER[start + offset - 1]}"
    if phase == "fallen_back":
        return f"fallen back to {serving}"
    return f"on {serving}"
