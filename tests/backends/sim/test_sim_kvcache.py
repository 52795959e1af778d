"""The simulator's KV memory and prefix cache: block hashes, LRU eviction, what running
sequences hold, and the scheduler's waits and preemptions when blocks run short."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from backends.sim import api_messages, api_responses
from backends.sim.cluster import Cluster
from backends.sim.config import Mode, SimConfig
from backends.sim.engine import Scheduler, Sequence
from backends.sim.kvcache import BlockTable, KVCache
from backends.sim.model import Method, build_profile
from backends.sim.prefix import answer_text, prompt_hashes, render, sequence_hashes
from backends.sim.virtual import RequestResult, TimedRequest, simulate

BS = 16
LONG = "the engine keeps every block of this conversation for later turns. " * 40


def chain(n: int, salt: str) -> tuple[int, ...]:
    """``n`` made-up block hashes of one content (distinct per ``salt``)."""
    return tuple(hash((salt, i)) for i in range(n))


def filled(cache: KVCache, hashes: tuple[int, ...]) -> BlockTable:
    """A sequence that computed all of ``hashes``' blocks and still runs."""
    table = BlockTable(hashes)
    tokens = len(hashes) * BS + 1
    assert cache.start(table, tokens, None) is not None
    cache.commit(table, tokens)
    return table


# --- prompts rendered into block hashes -------------------------------------------------


def chat_turns() -> tuple[dict[str, Any], dict[str, Any], str]:
    first = {"messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]}
    answer = "Sure, here is what the engine does with its cache."
    second = {
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "and then?"},
        ]
    }
    return first, second, answer


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_a_conversation_resent_one_turn_longer_starts_with_the_whole_previous_turn() -> None:
    first, second, answer = chat_turns()
    turn1 = sequence_hashes(first, BS, answer_text([answer]))
    turn2 = prompt_hashes(second, BS)
    assert render(second).startswith(render(first) + answer_text([answer]))
    assert shared_blocks(turn1, turn2) == len(turn1)  # every full block of turn 1, answer too
    assert len(turn2) > len(turn1)


def test_completions_and_token_id_prompts_share_their_prefix() -> None:
    assert shared_blocks(
        prompt_hashes({"prompt": LONG}, BS), prompt_hashes({"prompt": LONG + " more"}, BS)
    ) == len(LONG) // (4 * BS)
    ids = list(range(100))
    assert shared_blocks(
        prompt_hashes({"prompt": ids}, BS), prompt_hashes({"prompt": [*ids, 7, 8]}, BS)
    ) == (100 // BS)


def test_tools_and_cache_salt_change_every_block() -> None:
    body = {"messages": [{"role": "user", "content": LONG}]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    plain = prompt_hashes(body, BS)
    assert shared_blocks(plain, prompt_hashes(body | {"tools": tools}, BS)) == 0
    assert shared_blocks(plain, prompt_hashes(body | {"cache_salt": "tenant-a"}, BS)) == 0


def test_messages_and_responses_conversations_share_their_prefix() -> None:
    system = [{"type": "text", "text": LONG}]
    turn = {"model": "m", "max_tokens": 8, "system": system}
    one = turn | {"messages": [{"role": "user", "content": "hi"}]}
    two = turn | {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": "more"},
        ]
    }
    a = api_messages.chat_request(orjson.dumps(one))
    b = api_messages.chat_request(orjson.dumps(two))
    assert render(b).startswith(render(a) + answer_text(["hello"]))

    histories = api_responses.Histories()
    r1 = api_responses.chat_request(orjson.dumps({"model": "m", "input": LONG}), histories)
    histories.keep("resp_1", [*r1["messages"], {"role": "assistant", "content": "ok"}])
    follow = {"model": "m", "input": "next", "previous_response_id": "resp_1"}
    r2 = api_responses.chat_request(orjson.dumps(follow), histories)
    assert render(r2).startswith(render(r1) + answer_text(["ok"]))


# --- the block cache ----------------------------------------------------------------------


def test_a_resent_prefix_hits_and_is_counted_in_tokens() -> None:
    cache = KVCache(64)
    hashes = chain(4, "a")
    cache.release(filled(cache, hashes))
    again = BlockTable((*hashes, *chain(2, "b")))
    assert cache.cached_prefix(again.hashes, 6 * BS) == 4 * BS
    assert cache.start(again, 6 * BS, None) == 4 * BS
    assert (cache.stats.queries, cache.stats.hits) == (4 * BS + 1 + 6 * BS, 4 * BS)
    assert again.held == 6


def test_the_last_token_is_always_computed() -> None:
    cache = KVCache(64)
    hashes = chain(4, "a")
    cache.release(filled(cache, hashes))
    # a prompt of exactly those four blocks finds three: its last token must be computed
    assert cache.cached_prefix(hashes, 4 * BS) == 3 * BS


def test_lru_eviction_takes_the_oldest_released_blocks_first() -> None:
    cache = KVCache(8)
    a, b = chain(4, "a"), chain(3, "b")
    cache.release(filled(cache, a))
    cache.release(filled(cache, b))
    assert cache.cached_blocks == 7 and cache.free_blocks == 8
    newcomer = BlockTable(chain(3, "c"))
    assert cache.start(newcomer, 3 * BS, None) == 0  # 1 empty block, then 2 evicted
    # a's blocks went first, its tail before its head (released last block first)
    assert cache.cached_prefix(a, 5 * BS) == 2 * BS
    assert cache.cached_prefix(b, 4 * BS) == 3 * BS


def test_blocks_running_sequences_hold_are_never_evicted() -> None:
    cache = KVCache(8)
    running = filled(cache, chain(5, "a"))
    big = BlockTable(chain(4, "b"))
    assert cache.start(big, 4 * BS, None) is None  # 3 blocks free, 4 needed: it waits
    assert big.held == 0 and cache.stats.queries == 5 * BS + 1  # nothing taken, not counted
    assert cache.cached_prefix(running.hashes, 6 * BS) == 5 * BS
    assert not cache.grow(running, 9 * BS)
    cache.release(running)
    assert cache.start(big, 4 * BS, None) == 0


def test_a_shared_block_is_held_once_and_freed_by_its_last_holder() -> None:
    cache = KVCache(16)
    hashes = chain(4, "a")
    one = filled(cache, hashes)
    two = BlockTable(hashes)
    assert cache.start(two, 4 * BS + 1, None) == 4 * BS
    assert cache.used_blocks == 6  # 4 shared, and each its own partial last block
    cache.release(one)
    assert cache.used_blocks == 5 and cache.free_blocks == 11
    cache.release(two)
    assert cache.used_blocks == 0 and cache.cached_blocks == 4
    assert cache.usage == 0.0


def test_caching_off_holds_memory_but_never_hits() -> None:
    cache = KVCache(8, caching=False)
    hashes = chain(4, "a")
    cache.release(filled(cache, hashes))
    assert cache.cached_prefix(hashes, 6 * BS) == 0 and cache.cached_blocks == 0
    assert cache.start(BlockTable(hashes), 8 * BS, None) == 0
    assert cache.usage == 1.0


# --- settings -----------------------------------------------------------------------------


def test_a_draft_model_takes_its_share_of_the_kv_memory() -> None:
    card = {"kv_cache_tokens": 160_000, "max_model_len": 4096}
    standard = SimConfig(mode=Mode.STANDARD, **card)  # type: ignore[arg-type]
    draft = SimConfig(mode=Mode.SPECULATIVE, draft_kv_share=0.3, **card)  # type: ignore[arg-type]
    ngram = SimConfig(mode=Mode.SPECULATIVE, method=Method.NGRAM, **card)  # type: ignore[arg-type]
    assert standard.kv_blocks == 10_000 == ngram.kv_blocks
    assert draft.kv_blocks == 7_000
    assert SimConfig(num_gpu_blocks_override=3000).kv_blocks == 3000
    assert SimConfig().kv_blocks * 16 >= 256 * SimConfig().max_model_len  # never binds


def test_a_cache_smaller_than_one_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="kv-cache-tokens"):
        SimConfig(kv_cache_tokens=1000, max_model_len=2048)
    with pytest.raises(ValueError, match="draft_kv_share"):
        SimConfig(draft_kv_share=1.0)


# --- the scheduler under memory pressure ----------------------------------------------------


def seq_for(body: dict[str, Any], i: int, *, max_tokens: int, block_size: int = BS) -> Sequence:
    profile = build_profile(body, seed=1, index=i, max_tokens=max_tokens)
    return Sequence(profile, 4, hashes=prompt_hashes(body, block_size))


def run(scheduler: Scheduler, seqs: list[Sequence]) -> tuple[list[int], list[int]]:
    """Steps until done; the waiting count and the prefill tokens of each step."""
    for seq in seqs:
        scheduler.submit(seq)
    waiting, prefill = [], []
    while scheduler.has_work():
        step = scheduler.step()
        waiting.append(scheduler.num_waiting)
        prefill.append(step.prefill_tokens)
    return waiting, prefill


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    config = SimConfig(max_model_len=4096, kv_cache_tokens=65_536)
    body = {"messages": [{"role": "user", "content": LONG}]}
    scheduler = Scheduler.for_config(config)
    first = seq_for(body, 0, max_tokens=8)
    _, cold = run(scheduler, [first])
    second = seq_for(body, 1, max_tokens=8)
    _, warm = run(scheduler, [second])
    prompt = first.profile.prompt_tokens
    assert sum(cold) == prompt and first.cached == 0
    assert second.cached == (prompt - 1) // BS * BS > 0
    assert sum(warm) == prompt - second.cached
    assert scheduler.counters.cached_prompt_tokens == second.cached
    assert scheduler.kv is not None and scheduler.kv.stats.hits == second.cached


def test_short_memory_preempts_the_newest_and_every_answer_still_completes() -> None:
    config = SimConfig(
        max_model_len=1024, kv_cache_tokens=2048, draft_kv_share=0.0, max_num_seqs=16
    )
    scheduler = Scheduler.for_config(config)
    bodies = [{"messages": [{"role": "user", "content": f"{i} " + LONG[:1600]}]} for i in range(8)]
    seqs = [seq_for(b, i, max_tokens=200) for i, b in enumerate(bodies)]
    waiting, _ = run(scheduler, seqs)
    assert scheduler.kv is not None
    assert scheduler.kv.stats.preemptions > 0
    assert sum(s.preemptions for s in seqs) == scheduler.kv.stats.preemptions
    assert max(waiting) > 0
    assert all(s.finished and s.emitted == 200 for s in seqs)
    assert seqs[0].preemptions == 0  # the oldest keeps running; the newest make way
    assert scheduler.kv.used_blocks == 0


def test_a_cancelled_sequence_gives_its_blocks_back() -> None:
    config = SimConfig(max_model_len=2048, kv_cache_tokens=8192)
    scheduler = Scheduler.for_config(config)
    seq = seq_for({"messages": [{"role": "user", "content": LONG}]}, 0, max_tokens=50)
    scheduler.submit(seq)
    scheduler.step()
    assert scheduler.kv is not None and scheduler.kv.used_blocks > 0
    scheduler.cancel(seq)
    assert scheduler.kv.used_blocks == 0


def burst(n: int, words: int) -> list[TimedRequest]:
    return [
        TimedRequest(
            0.001 * i,
            {"messages": [{"role": "user", "content": f"{i} " + LONG[: words * 4]}]}
            | {"max_tokens": 300, "temperature": 0},
        )
        for i in range(n)
    ]


def mean_ttft(results: list[RequestResult]) -> float:
    return sum(r.ttft for r in results) / len(results)


def test_ttft_grows_with_memory_pressure_in_virtual_time() -> None:
    requests = burst(24, 500)
    roomy = SimConfig(max_model_len=2048, max_num_seqs=64, seed=2)
    tight = SimConfig(max_model_len=2048, max_num_seqs=64, seed=2, kv_cache_tokens=4096)
    easy, pressed = simulate(requests, roomy), simulate(requests, tight)
    assert sum(r.preemptions for r in easy) == 0
    assert sum(r.preemptions for r in pressed) > 0
    assert mean_ttft(pressed) > 1.5 * mean_ttft(easy)
    assert [r.completion_tokens for r in pressed] == [r.completion_tokens for r in easy]


def test_the_replay_cluster_knows_each_endpoints_cache_and_takes_a_chosen_endpoint() -> None:
    pool = [SimConfig(seed=i, enable_prefix_caching=True) for i in range(2)]
    cluster = Cluster({"spec": pool})
    first, second, _ = chat_turns()
    assert cluster.submit(0, "spec", first, 0.0, 16, endpoint_name="spec#1") == "spec#1"
    while cluster.next_event() is not None:
        cluster.advance()
    seen = cluster.cached_tokens("spec", second)
    assert seen["spec#0"] == 0 and seen["spec#1"] > 0
    cluster.submit(1, "spec", second, 10.0, 16, endpoint_name="spec#1")
    served = []
    while cluster.next_event() is not None:
        served += cluster.advance()
    assert served[0].endpoint == "spec#1" and served[0].cached_tokens == seen["spec#1"]


def test_a_responses_conversation_resent_whole_shares_its_prefix() -> None:
    histories = api_responses.Histories()
    first = {"model": "m", "input": [{"role": "user", "content": LONG}], "store": False}
    r1 = api_responses.chat_request(orjson.dumps(first), histories)
    said = {"type": "output_text", "text": "ok", "annotations": []}
    again = first | {
        "input": [
            *first["input"],  # type: ignore[list-item]
            {"type": "message", "role": "assistant", "content": [said]},
            {"role": "user", "content": "next"},
        ]
    }
    r2 = api_responses.chat_request(orjson.dumps(again), histories)
    assert render(r2).startswith(render(r1) + answer_text(["ok"]))


def test_a_preempted_restart_is_not_counted_as_a_query() -> None:
    config = SimConfig(
        max_model_len=1024, kv_cache_tokens=2048, draft_kv_share=0.0, max_num_seqs=16
    )
    scheduler = Scheduler.for_config(config)
    bodies = [{"messages": [{"role": "user", "content": f"{i} " + LONG[:1600]}]} for i in range(8)]
    seqs = [seq_for(b, i, max_tokens=200) for i, b in enumerate(bodies)]
    run(scheduler, seqs)
    assert scheduler.kv is not None and scheduler.kv.stats.preemptions > 0
    assert scheduler.kv.stats.queries == sum(s.profile.prompt_tokens for s in seqs)


def test_claude_codes_billing_line_does_not_break_the_prefix() -> None:
    def turn(cch: str) -> dict[str, Any]:
        billing = f"x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch={cch};"
        system = [{"type": "text", "text": billing}, {"type": "text", "text": LONG}]
        body = {"model": "m", "max_tokens": 8, "system": system}
        return api_messages.chat_request(
            orjson.dumps(body | {"messages": [{"role": "user", "content": "hi"}]})
        )

    assert prompt_hashes(turn("0f3a9"), BS) == prompt_hashes(turn("77c21"), BS)
    assert "x-anthropic-billing-header" not in render(turn("0f3a9"))


def test_a_request_larger_than_the_whole_cache_fails_loudly_rather_than_waiting() -> None:
    config = SimConfig(max_model_len=1024, kv_cache_tokens=1100, draft_kv_share=0.0)
    huge = [TimedRequest(0.0, {"prompt": LONG * 2, "max_tokens": 10})]  # 1360 tokens
    with pytest.raises(RuntimeError, match="kv_cache_tokens"):
        simulate(huge, config)
    growing = [TimedRequest(0.0, {"prompt": LONG, "max_tokens": 500})]  # 680 + 500
    with pytest.raises(RuntimeError, match="kv_cache_tokens"):
        simulate(growing, config)
