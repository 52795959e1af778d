"""The prompt-token estimator: framing, dense characters, and bounded cost on long text."""

from __future__ import annotations

import pytest

from gateway import tokens

PROSE = "The committee reviewed the findings and agreed on the next steps. "


def test_nothing_costs_nothing() -> None:
    assert tokens.estimate(()) == 0
    assert tokens.estimate(("",)) == 0


def test_chat_framing_follows_the_chatml_template() -> None:
    # <|im_start|>role\n ... <|im_end|>\n per message, then <|im_start|>assistant\n
    assert tokens.estimate(("", "", ""), messages=3) == 3 * 5 + 3


def test_prose_runs_near_five_bytes_per_token() -> None:
    text = PROSE * 100
    assert tokens.estimate((text,)) == round(len(text) / tokens.BYTES_PER_TOKEN)


def test_digits_and_quotes_count_about_one_token_each() -> None:
    digits = "1234567890" * 50
    assert tokens.estimate((digits,)) == round(500 * tokens.DENSE_WEIGHT)
    letters = "abcdefghij" * 50
    assert tokens.estimate((digits,)) > 4 * tokens.estimate((letters,))


def test_texts_add_up() -> None:
    parts = (PROSE * 3, '{"a": 12}', "ünïcödé")
    separate = sum(tokens._tokens(p.encode()) for p in parts)
    assert tokens.estimate(parts) == round(separate)


@pytest.mark.parametrize("unit", [PROSE, '{"id": 1234, "sku": "SKU-0042"}, ', "x = 10 ** 3\n"])
def test_long_text_is_sampled_without_losing_accuracy(unit: str) -> None:
    text = unit * (200_000 // len(unit))
    data = text.encode()
    exact = (len(data) - tokens._dense(data)) / tokens.BYTES_PER_TOKEN
    exact += tokens.DENSE_WEIGHT * tokens._dense(data)
    assert len(data) > 16 * 1024
    assert tokens.estimate((text,)) == pytest.approx(exact, rel=0.02)
