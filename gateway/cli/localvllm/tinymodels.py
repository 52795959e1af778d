"""Build a tiny Llama target and a 1-layer draft, offline, in seconds.

Run by the vLLM venv's Python (it needs torch, transformers and tokenizers, which speclane
itself does not): ``python tinymodels.py --out DIR [--seed 0 --train-steps N ...]``. Nothing
is downloaded. The tokenizer is a byte-level BPE trained on this Python's standard library;
the target is trained for a fixed number of steps on the same text, and the draft is
distilled from it (KL to the target's logits plus a little cross-entropy), so that the
target writes code-like text and the draft agrees with it part of the time. A fixed seed and
fixed step counts make the output the same for the same parameters on the same machine.

Writes ``DIR/target`` and ``DIR/draft`` (config, safetensors weights, tokenizer with a
ChatML-style chat template, generation config), then ``DIR/built.json`` last.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

Batch = tuple[Any, Any]


def corpus() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(stdlib.glob("*.py")) if p.stat().st_size > 0]


def tokenizer(files: list[Path], vocab: int) -> Any:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=2048,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def config(vocab: int, layers: int, hidden: int, eos: int) -> Any:
    heads = max(1, hidden // 64)
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def batches(ids: Any, seq: int, size: int, rng: random.Random) -> Iterator[Batch]:
    last = int(ids.numel()) - seq - 1
    while True:
        starts = [rng.randrange(0, last) for _ in range(size)]
        yield (
            torch.stack([ids[s : s + seq] for s in starts]),
            torch.stack([ids[s + 1 : s + seq + 1] for s in starts]),
        )


def train(model: Any, data: Iterator[Batch], steps: int, teacher: Any = None) -> float:
    """``steps`` AdamW steps (distilling from ``teacher`` when given); the last loss."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.95))
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x, y = next(data)
        logits = model(input_ids=x).logits.reshape(-1, model.config.vocab_size)
        loss = F.cross_entropy(logits, y.reshape(-1))
        if teacher is not None:
            with torch.no_grad():
                target = teacher(input_ids=x).logits.reshape(-1, model.config.vocab_size)
            kl = F.kl_div(
                F.log_softmax(logits, -1),
                F.log_softmax(target, -1),
                log_target=True,
                reduction="batchmean",
            )
            loss = 0.8 * kl + 0.2 * loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return float(loss.item())


def agreement(target: Any, draft: Any, data: Iterator[Batch]) -> float:
    """How often the draft's greedy next token is the target's, on one batch."""
    x, _ = next(data)
    with torch.no_grad():
        same = target(input_ids=x).logits.argmax(-1) == draft(input_ids=x).logits.argmax(-1)
    return float(same.float().mean().item())


def save(model: Any, tok: Any, out: Path, dtype: str, eos: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    ids = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    (out / "generation_config.json").write_text(json.dumps(ids, indent=2))


def build(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    files = corpus()
    tok = tokenizer(files, args.vocab)
    eos = int(tok.convert_tokens_to_ids(EOS))
    ids: list[int] = []
    for path in files:
        ids += tok(path.read_text(encoding="utf-8", errors="replace"))["input_ids"] + [eos]
    data = batches(torch.tensor(ids, dtype=torch.long), args.seq, args.batch, rng)
    target = LlamaForCausalLM(config(len(tok), args.target_layers, args.hidden, eos))
    draft = LlamaForCausalLM(config(len(tok), args.draft_layers, args.hidden, eos))
    target_loss = train(target, data, args.train_steps)
    target.requires_grad_(False)
    draft_loss = train(draft, data, args.distill_steps, teacher=target)
    report = {
        "corpus_files": len(files),
        "corpus_tokens": len(ids),
        "target_loss": round(target_loss, 3),
        "draft_loss": round(draft_loss, 3),
        "greedy_agreement": round(agreement(target, draft, data), 3),
    }
    save(target, tok, args.out / "target", args.dtype, eos)
    save(draft, tok, args.out / "draft", args.dtype, eos)
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--out", type=Path, required=True)
    add("--seed", type=int, default=0)
    add("--vocab", type=int, default=4096)
    add("--hidden", type=int, default=256)
    add("--target-layers", type=int, default=4)
    add("--draft-layers", type=int, default=1)
    add("--train-steps", type=int, default=60)
    add("--distill-steps", type=int, default=30)
    add("--seq", type=int, default=64)
    add("--batch", type=int, default=8)
    add("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    report = build(args)
    (args.out / "built.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
