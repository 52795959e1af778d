"""The prompt's canonical rendering and hashes: one conversation is one rendering through
any of the four APIs, Claude Code's billing line changes no hash, each turn's chain begins
with the turn before's, and the template fingerprint ignores what changes without
meaning."""

from __future__ import annotations

import time

import orjson
import pytest

from gateway.apis import named
from gateway.classify import Defaults, classify
from gateway.prompt.normalise import volatile
from gateway.prompt.prints import BLOCK_BYTES, MAX_BLOCKS, chain
from gateway.prompt.render import segments
from gateway.schema import parse
from policies.features import PromptHashes

SYSTEM = "You are a coding agent working in a repository. " * 12
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli; cch=e5f1c;"


def hashes(body: dict, kind: str) -> PromptHashes:
    request, _ = parse(orjson.dumps(body), named(kind).model)
    return classify(request, named(kind).path, {}, "r", Defaults()).prompt


def chat(turns: int = 2) -> dict:
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": "List the files"}]},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"path": ".", "all": true}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
        {"role": "user", "content": "Open a.py"},
    ]
    for turn in range(turns - 2):
        messages += [
            {"role": "assistant", "content": f"Answer {turn}"},
            {"role": "user", "content": f"Question {turn}"},
        ]
    return {"model": "m", "messages": messages}


def messages(turns: int = 2, billing: str | None = None) -> dict:
    system: list[dict] = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    if billing is not None:
        system.insert(0, {"type": "text", "text": billing})
    said: list[dict] = [
        {"role": "user", "content": "List the files"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "ls",
                    "input": {"all": True, "path": "."},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a.py\nb.py"}],
                },
                {"type": "text", "text": "Open a.py"},
            ],
        },
    ]
    for turn in range(turns - 2):
        said += [
            {"role": "assistant", "content": [{"type": "text", "text": f"Answer {turn}"}]},
            {"role": "user", "content": f"Question {turn}"},
        ]
    return {"model": "m", "max_tokens": 10, "system": system, "messages": said}


def responses(turns: int = 2) -> dict:
    items: list[dict] = [
        {"role": "user", "content": [{"type": "input_text", "text": "List the files"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking."}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "ls",
            "arguments": '{"all":true,"path":"."}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py"},
        {"role": "user", "content": "Open a.py"},
    ]
    for turn in range(turns - 2):
        items += [
            {"role": "assistant", "content": f"Answer {turn}"},
            {"role": "user", "content": f"Question {turn}"},
        ]
    return {"model": "m", "instructions": SYSTEM, "input": items, "store": False}


def test_one_conversation_renders_alike_through_chat_messages_and_responses():
    by_chat = hashes(chat(), "chat")
    assert by_chat.chain, "the conversation is longer than one block"
    assert hashes(messages(), "messages") == by_chat
    assert hashes(responses(), "responses") == by_chat


def test_the_segments_say_who_said_what_in_order():
    request, _ = parse(orjson.dumps(messages()), named("messages").model)
    assert list(segments(request)) == [
        ("system", SYSTEM),
        ("user", "List the files"),
        ("assistant", "Looking."),
        ("call", 'ls({"all":true,"path":"."})'),
        ("tool", "a.py\nb.py"),
        ("user", "Open a.py"),
    ]


def test_a_completion_prompt_renders_as_one_segment_of_its_own():
    one = hashes({"model": "m", "prompt": SYSTEM + "Q"}, "completions")
    assert one.size == len(SYSTEM) + len("Q") + len("\x1eprompt\x1f")
    assert one != hashes(chat(), "chat")


def test_claude_codes_billing_line_changes_no_hash():
    plain = hashes(messages(), "messages")
    for cch in ("e5f1c", "0aaa9", "71fea"):
        line = BILLING.replace("e5f1c", cch)
        assert hashes(messages(billing=line), "messages") == plain
        one_string = messages() | {"system": f"{line}\n{SYSTEM}"}
        assert hashes(one_string, "messages") == plain


def test_the_billing_line_is_only_stripped_from_system_text():
    said = messages()
    said["messages"][0]["content"] = BILLING + "\nList the files"
    kept, plain = hashes(said, "messages"), hashes(messages(), "messages")
    assert kept.size == plain.size + len(BILLING) + 1
    assert kept.opening != plain.opening


def test_each_turns_chain_begins_with_the_turn_befores():
    turns = [hashes(chat(turns), "chat") for turns in range(2, 12)]
    assert [t.turn for t in turns] == list(range(2, 12))
    for before, after in zip(turns, turns[1:], strict=False):
        assert after.chain[: len(before.chain)] == before.chain
        assert after.opening == before.opening
        assert after.template == before.template
    assert len(turns[-1].chain) > len(turns[0].chain)


def test_a_changed_block_changes_every_hash_after_it():
    first = SYSTEM.encode() * 4
    second = bytearray(first)
    second[BLOCK_BYTES + 3] ^= 1
    a, b = chain(first), chain(bytes(second))
    assert a[0] == b[0]
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))
    assert [h >> 32 for h in a] == list(range(len(a)))


def test_a_conversations_opening_tells_it_from_another_with_the_same_template():
    other = chat()
    other["messages"][1] = {"role": "user", "content": "Find the bug"}
    a, b = hashes(chat(), "chat"), hashes(other, "chat")
    assert a.opening != b.opening
    assert a.template == hashes(chat(), "chat").template


def test_the_chain_is_capped():
    long = SYSTEM * (MAX_BLOCKS * BLOCK_BYTES // len(SYSTEM) + 50)
    body = {"model": "m", "messages": [{"role": "user", "content": long}]}
    assert len(hashes(body, "chat").chain) == MAX_BLOCKS


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("on 2026-11-29 at 10:05:33", "on # at #"),
        ("on 11/29/2026.", "on #."),
        ("id 3f2b8c1e-7d4a-4b7e-9a51-0c2d9e8f1a6b.", "id #."),
        ("commit 9fceb02d0ae5 and req_4711", "commit # and req_#"),
        ("cc_version=2.1.37.3a3;", "cc_version=#;"),
        ("version 2 of 3, page 12", "version 2 of 3, page 12"),
        ("a deadline", "a deadline"),
        ("10:05.9\u07c07db6", "##"),  # a digit that is no hex digit may start a match
    ],
)
def test_volatile_parts_become_placeholders(text, normalised):
    assert volatile(text) == normalised


def test_a_run_of_hex_letters_without_a_digit_takes_time_linear_in_its_length():
    # tried from each of its letters to its end, 40,000 of them took seconds; a client's
    # system prompt of 2,048 cost each request 30 ms of the event loop
    text = "deadbeef" * 5_000
    started = time.perf_counter()
    assert volatile(text) == text
    assert time.perf_counter() - started < 1


def test_the_template_ignores_dates_and_ids_but_not_the_instructions():
    def with_system(system: str) -> dict:
        return {
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
        }

    today = hashes(
        with_system("You review code. Today is 2026-11-29, request 9fceb02d0ae5."), "chat"
    )
    later = hashes(
        with_system("You review code. Today is 2026-12-01, request 1a2b3c4d5e6f."), "chat"
    )
    other = hashes(
        with_system("You write reports. Today is 2026-11-29, request 9fceb02d0ae5."), "chat"
    )
    assert today.template == later.template != other.template
    assert today.chain != later.chain or today.opening != later.opening


def test_the_template_reads_the_first_user_message_only_so_far():
    def asking(text: str) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": text}]}

    review = hashes(asking("Review this diff:\n" + "x" * 200 + "1"), "chat").template
    same = hashes(asking("Review this diff:\n" + "x" * 200 + "2"), "chat").template
    report = hashes(asking("Summarise the report below:\n" + "x" * 200), "chat").template
    assert review == same != report


def test_one_template_has_one_fingerprint_through_all_four_apis():
    # a task template without a system prompt: the instruction its first message opens with
    task = "Review this diff:\n" + "- old line\n+ new line\n" * 40
    other = task[:200] + "- other\n+ lines\n" * 40  # differs past the template's lead
    bodies = {
        "chat": {"model": "m", "messages": [{"role": "user", "content": task}]},
        "completions": {"model": "m", "prompt": task},
        "messages": {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": task}],
        },
        "responses": {"model": "m", "input": task},
    }
    prints = {kind: hashes(body, kind).template for kind, body in bodies.items()}
    assert len(set(prints.values())) == 1, prints
    assert hashes({"model": "m", "prompt": other}, "completions").template == prints["chat"]
    summary = {"model": "m", "prompt": "Summarise the report below:\n" + task}
    assert hashes(summary, "completions").template != prints["chat"]


@pytest.mark.parametrize("calls", [1e308, "x", {"a": 1}, [3, {"function": 3}], True])
def test_tool_calls_of_another_shape_render_as_none(calls):
    """An assistant turn whose ``tool_calls`` is no list of calls: the engine refuses it;
    reading its prompt on the way there must not fail first."""
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}]
    request, _ = parse(orjson.dumps({"model": "m", "messages": turns}), named("chat").model)
    assert list(segments(request)) == [("user", "hi")]


@pytest.mark.parametrize("kind", [["text"], {"a": 1}, 3, None])
def test_a_block_or_item_of_no_string_type_renders_without_a_type(kind):
    """The engine answers such a request with its own error; reading its prompt on the way
    there must not fail first."""
    bodies = {
        "chat": {"model": "m", "messages": [{"role": "user", "content": [{"type": kind}]}]},
        "messages": {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": kind, "text": "s"}],
            "messages": [{"role": "user", "content": [{"type": kind, "text": "x"}]}],
        },
        "responses": {
            "model": "m",
            "input": [{"type": kind}, {"role": "user", "content": [{"type": kind}]}],
        },
    }
    for api, body in bodies.items():
        request, _ = parse(orjson.dumps(body), named(api).model)
        assert all(isinstance(text, str) for _, text in segments(request)), api
