"""The simulator's KV memory and prefix cache, in virtual time: what they do to TTFT and to
the prefill work, as ratios.

Two runs of ``backends/sim/virtual.py``, each on a standard server and on a speculative one
whose draft model takes ``--draft-kv-share`` of the card's KV memory:

- pressure: a burst of ``--requests`` distinct prompts on servers of shrinking KV memory,
  TTFT p50 and p90 against the same server with memory to spare, and the preemptions;
- conversations: ``--conversations`` chat conversations of ``--turns`` turns, each turn the
  whole history plus one question (the answers are the simulator's), with the prefix cache
  on and off: the share of prompt tokens found cached, and prefill tokens and TTFT p50 with
  the cache over without it.

    .venv/bin/python bench/kv_memory.py
    .venv/bin/python bench/kv_memory.py --requests 64 --draft-kv-share 0.3
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from backends.sim.config import Mode, SimConfig
from backends.sim.engine import Scheduler, Sequence
from backends.sim.model import build_profile
from backends.sim.prefix import answer_text, prompt_hashes, sequence_hashes
from backends.sim.text import TextBank
from backends.sim.virtual import TimedRequest, simulate

_PROSE = "The committee reviewed the regional figures and agreed to revisit the plan. "
_MODES = (Mode.STANDARD, Mode.SPECULATIVE)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def pressure(args: argparse.Namespace) -> None:
    burst = [
        TimedRequest(
            0.001 * i,
            {"messages": [{"role": "user", "content": f"{i} " + _PROSE * 26}]}
            | {"max_tokens": 300, "temperature": 0},
        )
        for i in range(args.requests)
    ]
    print(f"pressure: {args.requests} requests of ~500 prompt tokens, 300 answer tokens")
    print("| KV tokens | server | TTFT p50 / roomy | TTFT p90 / roomy | preemptions |")
    print("| --- | --- | --- | --- | --- |")
    roomy = {m: simulate(burst, _config(m, None, args)) for m in _MODES}
    for tokens in args.kv_tokens:
        for mode in _MODES:
            got = simulate(burst, _config(mode, tokens, args))
            base = [r.ttft for r in roomy[mode]]
            ttft = [r.ttft for r in got]
            p50 = quantile(ttft, 0.5) / quantile(base, 0.5)
            p90 = quantile(ttft, 0.9) / quantile(base, 0.9)
            preempted = sum(r.preemptions for r in got)
            print(f"| {tokens} | {mode.value} | {p50:.2f} | {p90:.2f} | {preempted} |")


def _config(mode: Mode, tokens: int | None, args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        mode=mode,
        max_model_len=2048,
        max_num_seqs=64,
        seed=2,
        kv_cache_tokens=tokens,
        draft_kv_share=args.draft_kv_share,
    )


def conversations(args: argparse.Namespace) -> None:
    print(f"conversations: {args.conversations} x {args.turns} turns, one turn at a time each")
    print(
        "| server | prompt tokens cached | prefill tokens, cache / none | TTFT p50, cache / none |"
    )
    print("| --- | --- | --- | --- |")
    for mode in _MODES:
        on = _converse(SimConfig(mode=mode, seed=3), args)
        off = _converse(SimConfig(mode=mode, seed=3, enable_prefix_caching=False), args)
        hit = on["cached"] / on["prompt"]
        prefill = on["prefill"] / off["prefill"]
        ttft = statistics.median(on["ttft"]) / statistics.median(off["ttft"])
        print(f"| {mode.value} | {hit:.1%} | {prefill:.3f} | {ttft:.3f} |")


def _converse(config: SimConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Every conversation's turns in lockstep (turn t of all, then turn t + 1), each turn
    resending its history; the real answers' text goes back into the history."""
    scheduler = Scheduler.for_config(config)
    bank = TextBank(config.seed)
    history: list[list[dict[str, str]]] = [
        [{"role": "system", "content": f"You are assistant {c}. " + _PROSE * 40}]
        for c in range(args.conversations)
    ]
    out: dict[str, Any] = {"cached": 0, "prompt": 0, "prefill": 0, "ttft": []}
    index = 0
    for turn in range(args.turns):
        seqs, texts = [], []
        for messages in history:
            messages.append({"role": "user", "content": f"Question {turn}: " + _PROSE * 3})
            body = {"messages": list(messages), "max_tokens": 120, "temperature": 0.5}
            profile = build_profile(body, seed=config.seed, index=index, max_tokens=120)
            index += 1
            pieces = bank.tokens(profile, {})
            hashes = (
                sequence_hashes(body, config.block_size, answer_text(pieces))
                if config.enable_prefix_caching
                else prompt_hashes(body, config.block_size)
            )
            seqs.append(Sequence(profile, config.k, hashes=hashes))
            texts.append("".join(pieces))
            scheduler.submit(seqs[-1])
        now, first = 0.0, {}
        while scheduler.has_work():
            step = scheduler.step()
            now += step.seconds
            out["prefill"] += step.prefill_tokens
            for seq, event in step.events:
                if event.tokens and event.start == 0:
                    first[id(seq)] = now
        for c, seq in enumerate(seqs):
            out["ttft"].append(first[id(seq)])
            out["cached"] += seq.cached
            out["prompt"] += seq.profile.prompt_tokens
            history[c].append({"role": "assistant", "content": texts[c]})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--kv-tokens", type=int, nargs="+", default=[16384, 8192, 4096])
    parser.add_argument("--draft-kv-share", type=float, default=0.3)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    pressure(args)
    print()
    conversations(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
