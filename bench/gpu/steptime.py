#!/usr/bin/env python3
"""What one speculative step costs on a GPU, against batch, draft length and context.

    python3 bench/gpu/steptime.py --out DIR [--budget-s 330] [--shape 8b,32b]
    python3 bench/gpu/steptime.py --analyse DIR/steptime.csv [--shape 8b,32b]  # no torch
    python3 bench/gpu/steptime.py --plan                          # the grid and a roofline guess

Needs PyTorch and transformers only: no vLLM, no downloads, no network. A Llama-form model
is built from a ``transformers.LlamaConfig`` with random bf16 weights (``--shape``: ``8b``,
Llama-3-8B's dimensions, the default; ``32b``, Qwen2.5-32B's dimensions in Llama form, where
memory permits; ``30b-a3b``, Qwen3-30B-A3B's mixture of 128 experts, 8 active; ``tiny`` and
``tiny-moe`` for CPU tests) beside its draft (``--draft``: by default ``1b``, Llama-3.2-1B's,
for the dense targets and an EAGLE-3 head for the mixture; ``eagle3``, an EAGLE-3 head at the
target's width: one decoder layer fed the target's hidden states, ``stepcurve.Shape``).

A mixture's experts run sorted by expert, through ``torch._grouped_mm`` where it computes on
the device what a loop over the experts does (checked at start, ``summary.json``'s
``experts``; one kernel, no host sync, so under a CUDA graph like vLLM's fused MoE), else
through that loop (eager). A step reads only the experts its tokens chose.

Each cell times one forward of B sequences, q new tokens each (q = 1 is a plain decode
step, q = k + 1 verifies k drafts), against a cache of L tokens per sequence that is already
there: the cache is one pre-allocated arena of random values, so no prefill is timed. The
forward is the whole step from token ids to logits for all q positions (verification needs
every one of them); sampling and the acceptance test are not in it. Grid: B in
{1..256}, q in {1, 2, 3, 5, 8}, L in {2048, 512, 8192} (measured in that order), plus the
draft's q = 1 step at each (B, L). A cell whose cache does not fit the arena is recorded as
``skipped-memory`` and not tried; one that runs out of memory anyway is recorded as ``oom``.
``--budget-s`` stops starting cells when the time is near (``skipped-budget``).

The forward is a thin loop over the model's own modules (its projections, RMSNorms, MLPs,
rotary embedding and LM head), not ``model(...)``. transformers' own call, given any
attention mask, repeats each KV head for its query heads (``repeat_kv``: a 4x copy of the
whole cache per layer per step on an 8B shape) and builds a 4-D mask every call; vLLM does
neither, so that path would measure transformers, not the hardware. The loop writes the q
new keys and values into the cache and calls PyTorch's SDPA with grouped-query attention
kept grouped. Verification attention is causal among the q new tokens and sees all L cached
ones (lower-right causal alignment, as FlashAttention and vLLM use). Two ways to express
that are tried at start on the device, checked against an fp32 reference, timed, and the
faster correct one is used for every cell (``summary.json``'s ``attention``): ``lower_right``
(``torch.nn.attention.bias.causal_lower_right``, no mask tensor) and ``folded`` (a KV head's
query heads folded into the query length, with a small boolean mask). Before timing, the
loop's logits are compared with ``LlamaForCausalLM``'s own on a small batch (``checks``); a
mixture or an EAGLE-3 head, which transformers has no Llama form of, is compared there in
its dense Llama form, and in its own form its cached step against the whole sequence.

On CUDA each cell is captured once as a CUDA graph and its replays are timed with CUDA
events, after warm-ups (vLLM decodes under CUDA graphs; eager Python launches would dominate
the small batches): the median of several replays, with the 10th and 90th percentiles.
Everything runs under ``torch.inference_mode()``.

Writes ``steptime.csv`` (one row per cell, as each finishes) and ``summary.json`` (device,
versions, checks, the analyses, and the fitted parameters of the simulator's GPU cost model:
``speclane sim --cost-model gpu:DIR/summary.json``) to ``--out``; prints progress with
timestamps and, at the end, the verify/plain ratios, where a k=4 step stops paying and its
speed-up at each batch, how a line fitted over B <= 16 misses at B = 64 and 256, and the GPU
cost model's fit with its error over the cells. ``--analyse CSV --shape 8b,32b`` prints the
same for a saved run, fitted by this checkout's code.

Why one module past 600 lines: it is copied alone (with ``stepcurve.py``) to a GPU machine
that has torch and transformers but no checkout and no network, so model building, timing
and reporting must live in these two files.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import json
import math
import platform
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parent))

import stepcurve as sc  # noqa: E402

GIB = 1024**3


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write steptime.csv and summary.json here")
    p.add_argument("--shape", default="8b", help="target shapes, comma-separated, run in order")
    p.add_argument(
        "--draft",
        default="auto",
        help="draft shape (auto: by target; eagle3: an EAGLE-3 head at the target's width; "
        "none: no draft)",
    )
    p.add_argument("--batches", type=_ints, default=sc.BATCHES)
    p.add_argument("--queries", type=_ints, default=sc.QUERIES)
    p.add_argument("--contexts", type=_ints, default=sc.CONTEXTS, help="in measuring order")
    p.add_argument("--budget-s", type=float, default=300.0, help="start no cell after this")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-reps", type=int, default=5)
    p.add_argument("--max-reps", type=int, default=20)
    p.add_argument("--target-ms", type=float, default=150.0, help="timed milliseconds per cell")
    p.add_argument("--no-graphs", action="store_true", help="time eager forwards on CUDA too")
    p.add_argument("--attention", default="auto", choices=("auto", "lower_right", "folded"))
    p.add_argument("--reserve-gib", type=float, default=4.0, help="device memory left free")
    p.add_argument("--arena-gib", type=float, default=1.0, help="KV arena on the CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--analyse", type=Path, help="print the report of a saved steptime.csv")
    p.add_argument("--plan", action="store_true", help="print the grid with a roofline guess")
    p.add_argument("--inject-oom-at-batch", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in args.shape.split(","):
        if name not in sc.SHAPES:
            p.error(f"unknown shape {name!r}; known: {', '.join(sc.SHAPES)}")
    if args.draft not in ("auto", "none", "eagle3") and args.draft not in sc.SHAPES:
        p.error(f"unknown draft shape {args.draft!r}")
    if not (args.analyse or args.plan or args.out):
        p.error("--out is required (or --analyse / --plan)")
    return args


def draft_of(args: argparse.Namespace, target: str) -> str | None:
    if args.draft == "none":
        return None
    if args.draft == "eagle3":
        return sc.EAGLE_FOR.get(target)
    return sc.DRAFT_FOR.get(target) if args.draft == "auto" else args.draft


# --- the model and its thin forward ----------------------------------------------------------


def build_model(shape: sc.Shape, device: Any, dtype: Any, **config: Any) -> Any:
    """``LlamaForCausalLM`` of ``shape`` with random weights, built on ``device``; an EAGLE-3
    head's attention takes ``2 * hidden`` inputs, and it gets its ``fc`` and
    ``hidden_norm`` (``sc.Shape``)."""
    import torch
    import transformers

    llama = transformers.LlamaConfig(**shape.llama_config(), **config)
    torch.manual_seed(zlib.crc32(shape.name.encode()))
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(llama, dtype=dtype)
        if shape.fused:
            for layer in model.model.layers:
                attn = layer.self_attn
                for name in ("q_proj", "k_proj", "v_proj"):
                    old = getattr(attn, name)
                    wide = torch.nn.Linear(2 * shape.hidden, old.out_features, old.bias is not None)
                    setattr(attn, name, wide.to(dtype))
            fc = torch.nn.Linear(shape.fused * shape.hidden, shape.hidden, bias=False)
            model.fc = fc.to(dtype)
            model.hidden_norm = type(model.model.norm)(shape.hidden, eps=1e-5).to(dtype)
    return model.eval()


def build_experts(shape: sc.Shape, device: Any, dtype: Any, grouped: bool) -> list[Experts]:
    """Each layer's experts and router, random (std ``INIT_STD``), for a mixture's MLPs."""
    import torch

    gen = torch.Generator(device=device).manual_seed(zlib.crc32(shape.name.encode()) + 1)
    e, h, i = shape.experts, shape.hidden, shape.intermediate

    def weights(*dims: int) -> Any:
        out = torch.empty(*dims, device=device, dtype=dtype)
        return out.normal_(std=INIT_STD, generator=gen)

    return [
        Experts(weights(e, h), weights(e, 2 * i, h), weights(e, h, i), shape.active, grouped)
        for _ in range(shape.layers)
    ]


INIT_STD = 0.02


@dataclass
class Experts:
    """One layer's mixture (``sc.Shape``): a router [E, H] and E SwiGLU experts, gate and up
    stacked [E, 2I, H], down [E, H, I]. A token's output is its ``active`` chosen experts'
    outputs weighted by their renormalised router probabilities. The tokens are sorted by
    expert and each expert runs once over its rows: by ``torch._grouped_mm`` where
    ``grouped`` (one kernel for all experts, no host sync, so it runs under a CUDA graph, as
    vLLM's fused MoE kernels do), else a loop over the experts chosen (the sizes read on the
    host, so eager)."""

    router: Any
    gate_up: Any
    down: Any
    active: int
    grouped: bool

    def __call__(self, x: Any) -> Any:
        import torch

        b, n, h = x.shape
        flat = x.reshape(b * n, h)
        probs = (flat @ self.router.t()).float().softmax(-1)
        weights, chosen = probs.topk(self.active, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype).flatten()
        picks = chosen.flatten()
        order = picks.argsort(stable=True)
        rows = order // self.active
        counts = torch.zeros(self.router.shape[0], dtype=torch.int64, device=x.device)
        counts.index_add_(0, picks, torch.ones_like(picks))
        ffn = grouped_ffn if self.grouped else looped_ffn
        ys = ffn(flat.index_select(0, rows), counts, self.gate_up, self.down)
        ys = ys * weights.index_select(0, order)[:, None]
        return torch.zeros_like(flat).index_add_(0, rows, ys).view(b, n, h)


def grouped_ffn(xs: Any, counts: Any, gate_up: Any, down: Any) -> Any:
    """Rows sorted by expert (``counts`` of each) through their experts, one grouped kernel
    per projection."""
    import torch
    import torch.nn.functional as F

    offsets = counts.cumsum(0).to(torch.int32)
    gate, up = torch._grouped_mm(xs, gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(gate) * up, down.transpose(-2, -1), offs=offsets)


def looped_ffn(xs: Any, counts: Any, gate_up: Any, down: Any) -> Any:
    """``grouped_ffn`` as a loop over the experts that have rows."""
    import torch.nn.functional as F

    out = xs.new_empty(xs.shape[0], down.shape[1])
    start = 0
    for e, count in enumerate(counts.tolist()):
        if count:
            gate, up = (xs[start : start + count] @ gate_up[e].t()).chunk(2, dim=-1)
            out[start : start + count] = (F.silu(gate) * up) @ down[e].t()
            start += count
    return out


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary embedding, as transformers' ``apply_rotary_pos_emb`` (cos, sin: [B, 1, q, D])."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


Attention = Callable[[Any, Any, Any, int, int], Any]


def attention_lower_right(q: Any, k: Any, v: Any, context: int, n: int) -> Any:
    """q: [B, Hq, n, D]; k, v: [B, Hkv, context + n, D]. Lower-right causal, GQA grouped."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(n, context + n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


_FOLDED_MASKS: dict[tuple[int, int, int, str, str], Any] = {}


def folded_mask(groups: int, context: int, n: int, like: Any) -> Any:
    """An additive mask [groups * n, context + n]: row g * n + t (token t) sees keys
    0 .. context + t. Built once per shape, in ``like``'s dtype, its rows padded to a
    multiple of 16 elements so SDPA neither converts nor pads it on each call (it is
    broadcast over batch and heads, never copied)."""
    import torch

    key = (groups, context, n, str(like.device), str(like.dtype))
    if key not in _FOLDED_MASKS:
        cols = context + n
        padded = -(-cols // 16) * 16
        t = torch.arange(groups * n, device=like.device) % n
        j = torch.arange(cols, device=like.device)
        mask = torch.full((groups * n, padded), float("-inf"), device=like.device, dtype=like.dtype)
        mask[:, :cols].masked_fill_(j[None, :] <= (context + t)[:, None], 0.0)
        _FOLDED_MASKS.clear()
        _FOLDED_MASKS[key] = mask[:, :cols]
    return _FOLDED_MASKS[key]


def attention_folded(q: Any, k: Any, v: Any, context: int, n: int) -> Any:
    """A KV head's query heads folded into the query length: plain MHA shapes, one mask."""
    import torch.nn.functional as F

    b, hq, _, d = q.shape
    hkv = k.shape[1]
    groups = hq // hkv
    qf = q.reshape(b, hkv, groups * n, d)
    mask = folded_mask(groups, context, n, q)
    return F.scaled_dot_product_attention(qf, k, v, attn_mask=mask).reshape(b, hq, n, d)


def attention_reference(q: Any, k: Any, v: Any, context: int, n: int) -> Any:
    """fp32, explicit: what both must compute."""
    import torch

    groups = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(groups, dim=1)
    vf = v.float().repeat_interleave(groups, dim=1)
    scores = (q.float() @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    t = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(context + n, device=q.device)[None, :]
    scores = scores.masked_fill(j > context + t, float("-inf"))
    return (scores.softmax(-1) @ vf).to(q.dtype)


ATTENTIONS: dict[str, Attention] = {
    "lower_right": attention_lower_right,
    "folded": attention_folded,
}


@dataclass
class Loop:
    """The model's modules, run over a cache it does not own; a mixture's MLPs are its
    ``experts``. An EAGLE-3 head's step also takes the target's hidden states from
    ``shape.fused`` layers (``features``: [B, q, fused * hidden]): its one layer attends over
    the token's normalised embedding beside the normalised ``fc`` of those, and adds its
    output to the latter."""

    model: Any
    shape: sc.Shape
    attention: Attention
    experts: list[Experts] | None = None

    def forward(
        self,
        ids: Any,
        cos: Any,
        sin: Any,
        caches: Sequence[tuple[Any, Any]],
        context: int,
        features: Any = None,
    ) -> Any:
        import torch

        inner, shape = self.model.model, self.shape
        b, n = ids.shape
        h = inner.embed_tokens(ids)
        for i, (layer, (kc, vc)) in enumerate(zip(inner.layers, caches, strict=True)):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            if shape.fused and i == 0:
                h = self.model.fc(features)
                x = torch.cat((x, self.model.hidden_norm(h)), dim=-1)
            q = attn.q_proj(x).view(b, n, shape.heads, shape.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(b, n, shape.kv_heads, shape.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(b, n, shape.kv_heads, shape.head_dim).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            kc[:, :, context : context + n].copy_(k)
            vc[:, :, context : context + n].copy_(v)
            o = self.attention(q, kc, vc, context, n)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, n, shape.heads * shape.head_dim))
            mlp = self.experts[i] if self.experts else layer.mlp
            h = h + mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h))

    def features(self, batch: int, n: int, device: Any, gen: Any = None) -> Any:
        """Random target hidden states for an EAGLE-3 head's step (None for other shapes)."""
        import torch

        if not self.shape.fused:
            return None
        dims = (batch, n, self.shape.fused * self.shape.hidden)
        return torch.randn(*dims, device=device, dtype=self.model.dtype, generator=gen)

    def positions(self, batch: int, context: int, n: int, device: Any) -> tuple[Any, Any]:
        """cos, sin for positions context .. context + n - 1 of every sequence: [B, 1, n, D]."""
        import torch

        pos = torch.arange(context, context + n, device=device)[None, :].expand(batch, n)
        probe = torch.empty(1, device=device, dtype=self.model.dtype)
        cos, sin = self.model.model.rotary_emb(probe, pos)
        return cos[:, None], sin[:, None]


def carve(arena: Any, shape: sc.Shape, batch: int, context: int, n: int) -> list[tuple[Any, Any]]:
    """Per layer, K and V caches [B, Hkv, context + n, D] as views of the arena."""
    size = batch * shape.kv_heads * (context + n) * shape.head_dim
    dims = (batch, shape.kv_heads, context + n, shape.head_dim)
    return [
        (
            arena[2 * i * size : (2 * i + 1) * size].view(dims),
            arena[(2 * i + 1) * size : (2 * i + 2) * size].view(dims),
        )
        for i in range(shape.layers)
    ]


# --- timing ---------------------------------------------------------------------------------


@dataclass
class Timing:
    warmup: int
    min_reps: int
    max_reps: int
    target_ms: float
    graphs: bool
    cuda: bool


def _elapsed_ms(step: Callable[[], Any], cuda: bool) -> float:
    import torch

    if not cuda:
        began = time.perf_counter()
        step()
        return (time.perf_counter() - began) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def time_step(step: Callable[[], Any], timing: Timing) -> list[float]:
    """Warm-ups, then back-to-back timed runs (events recorded between them, one sync)."""
    import torch

    estimate = math.inf
    for _ in range(max(timing.warmup, 1)):
        estimate = _elapsed_ms(step, timing.cuda)
    reps = int(min(max(timing.target_ms / max(estimate, 1e-3), timing.min_reps), timing.max_reps))
    if not timing.cuda:
        return [_elapsed_ms(step, False) for _ in range(reps)]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    events[0].record()
    for i in range(reps):
        step()
        events[i + 1].record()
    events[-1].synchronize()
    return [float(events[i].elapsed_time(events[i + 1])) for i in range(reps)]


def graphed(fn: Callable[[], Any], warmup: int = 2) -> tuple[Callable[[], Any], Any]:
    """``fn`` captured as a CUDA graph (warmed on a side stream first); its replay, the graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, (graph, out)  # the output kept while the graph lives


# --- one run ----------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    device: Any
    dtype: Any
    timing: Timing
    writer: Any
    handle: Any
    cells: list[sc.Cell] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    last_cell_s: float = 0.5
    capture_failures: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - STARTED

    def budget_left(self) -> float:
        return float(self.args.budget_s) - self.elapsed()

    def record(self, cell: sc.Cell) -> None:
        self.cells.append(cell)
        self.writer.writerow(sc.cell_row(cell))
        self.handle.flush()
        what = f"{cell.shape:5} {cell.role:6} L={cell.context:5d} B={cell.batch:3d} q={cell.q}"
        if cell.ok:
            log(
                f"{what}: {cell.ms_median:8.3f} ms (p10 {cell.ms_p10:.3f}, p90 {cell.ms_p90:.3f},"
                f" {cell.reps} reps, {cell.mode})"
            )
        elif cell.status != "skipped-budget":
            log(f"{what}: {cell.status} {cell.note}")


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.2f} MiB"


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_cell(run: Run, loop: Loop, arena: Any, spec: sc.Spec) -> sc.Cell:
    """One cell, never raising: memory and other failures become the cell's status."""
    import torch

    shape = sc.SHAPES[spec.shape]
    cell = sc.Cell(spec.shape, spec.role, spec.batch, spec.q, spec.context, "ok")
    need = sc.kv_elements(shape, spec.batch, spec.context, spec.q)
    if need > arena.numel():
        cell.status = "skipped-memory"
        cell.note = f"KV {_size(need * 2)} > arena {_size(arena.numel() * 2)}"
        return cell
    graph = None
    try:
        if run.args.inject_oom_at_batch and spec.batch == run.args.inject_oom_at_batch:
            raise torch.cuda.OutOfMemoryError("injected by --inject-oom-at-batch")
        caches = carve(arena, shape, spec.batch, spec.context, spec.q)
        gen = torch.Generator(device=run.device).manual_seed(spec.batch * 1000 + spec.q)
        ids = torch.randint(0, shape.vocab, (spec.batch, spec.q), device=run.device, generator=gen)
        cos, sin = loop.positions(spec.batch, spec.context, spec.q, run.device)
        features = loop.features(spec.batch, spec.q, run.device, gen)

        def step() -> Any:
            return loop.forward(ids, cos, sin, caches, spec.context, features)

        cell.mode = "eager"
        if run.timing.graphs:
            try:
                step, graph = graphed(step)
                cell.mode = "graph"
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:  # capture failed: time it eagerly, and say so
                cell.note = f"graph capture failed: {type(exc).__name__}: {str(exc)[:120]}"
                graph = None
                run.capture_failures += 1
                if run.capture_failures >= 2:  # eager from here on, for comparable cells
                    run.timing.graphs = False
                    run.summary["graphs_disabled"] = cell.note
                torch.cuda.synchronize()
        times = time_step(step, run.timing)
        cell.ms_median = sc.percentile(times, 50)
        cell.ms_p10, cell.ms_p90 = sc.percentile(times, 10), sc.percentile(times, 90)
        cell.reps = len(times)
    except torch.cuda.OutOfMemoryError as exc:
        cell.status, cell.note = "oom", str(exc).splitlines()[0][:160] if str(exc) else "oom"
    except Exception as exc:
        cell.status, cell.note = "error", f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        del graph
        if cell.status != "ok":
            free_memory()
    return cell


def run_shape(run: Run, target: str, draft: str | None) -> None:
    """Build the target (and draft), size the arena, measure every cell of the grid."""
    specs = sc.grid(target, draft, run.args.batches, run.args.queries, run.args.contexts)
    shapes = [sc.SHAPES[target]] + ([sc.SHAPES[draft]] if draft else [])
    models: dict[str, Loop] = {}
    built = build_shape(run, shapes, specs, models)
    if isinstance(built, str):
        log(f"skipping shape {target}: {built}")
        status = "skipped-budget" if built == "budget" else "skipped-memory"
        for spec in specs:
            run.record(_cell(spec, status, built))
    else:
        measure_grid(run, specs, models, built)
    del built
    models.clear()
    free_memory()


def _cell(spec: sc.Spec, status: str, note: str = "") -> sc.Cell:
    return sc.Cell(spec.shape, spec.role, spec.batch, spec.q, spec.context, status, note=note)


def build_shape(
    run: Run, shapes: Sequence[sc.Shape], specs: Sequence[sc.Spec], models: dict[str, Loop]
) -> Any:
    """The models (into ``models``) and the KV arena; or why not, as a string."""
    import torch

    weights = sum(s.weight_bytes() for s in shapes)
    if run.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        if weights + (run.args.reserve_gib + 1) * GIB > free:
            return f"weights {weights / GIB:.1f} GiB + reserve do not fit {free / GIB:.1f} GiB"
    if run.budget_left() < 20:
        return "budget"
    names = ", ".join(f"{s.name} ({s.params() / 1e9:.2f}B params)" for s in shapes)
    log(f"building {names}")
    try:
        attention = ATTENTIONS[run.summary["attention"]["chosen"]]
        for s in shapes:
            model = build_model(s, run.device, run.dtype)
            experts = build_experts(s, run.device, run.dtype, _grouped(run)) if s.experts else None
            models[s.name] = Loop(model, s, attention, experts)
        arena = make_arena(run, specs)
    except torch.cuda.OutOfMemoryError as exc:
        models.clear()
        return f"out of memory building {names}: {str(exc)[:120]}"
    except Exception as exc:
        models.clear()
        return f"{type(exc).__name__} building {names}: {str(exc)[:200]}"
    log(f"built; KV arena {_size(arena.numel() * 2)}")
    return arena


def measure_grid(run: Run, specs: Sequence[sc.Spec], models: dict[str, Loop], arena: Any) -> None:
    """Every cell in order, within the budget; a batch that ran out of memory at a context
    skips the larger ones there."""
    too_big: dict[int, int] = {}  # context -> the smallest batch that ran out of memory
    for i, spec in enumerate(specs):
        if run.budget_left() < max(2.0 * run.last_cell_s, 3.0):
            cell = _cell(spec, "skipped-budget")
        elif spec.batch > too_big.get(spec.context, spec.batch):
            cell = _cell(spec, "skipped-memory", f"B={too_big[spec.context]} ran out of memory")
        else:
            began = time.monotonic()
            cell = measure_cell(run, models[spec.shape], arena, spec)
            run.last_cell_s = time.monotonic() - began
            if cell.status == "oom" and spec.role == "target":
                too_big[spec.context] = min(spec.batch, too_big.get(spec.context, spec.batch))
        run.record(cell)
        if i + 1 == len(specs) or specs[i + 1].context != spec.context:
            write_summary(run)


def make_arena(run: Run, specs: Sequence[sc.Spec]) -> Any:
    """One flat buffer of random values that every cell's cache is carved from."""
    import torch

    need = max(sc.kv_elements(sc.SHAPES[s.shape], s.batch, s.context, s.q) for s in specs)
    if run.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        room = int((free - run.args.reserve_gib * GIB) // 2)
    else:
        room = int(run.args.arena_gib * GIB // 2)
    elements = max(min(need, room), 1)
    arena = torch.empty(elements, device=run.device, dtype=run.dtype)
    arena.normal_(generator=torch.Generator(device=run.device).manual_seed(run.args.seed))
    return arena


# --- checks at start --------------------------------------------------------------------------


def choose_attention(run: Run) -> dict[str, Any]:
    """Each attention variant checked against the fp32 reference, then timed on a mid-size
    cache of the first target's heads; the fastest correct one wins (or ``--attention``)."""
    import torch

    shape = sc.SHAPES[run.args.shape.split(",")[0]]
    out: dict[str, Any] = {"errors": {}, "ms": {}, "failed": {}}
    gen = torch.Generator(device=run.device).manual_seed(run.args.seed + 1)

    def tensors(b: int, context: int, n: int) -> tuple[Any, Any, Any]:
        def r(*dims: int) -> Any:
            return torch.randn(*dims, device=run.device, dtype=run.dtype, generator=gen)

        q = r(b, shape.heads, n, shape.head_dim)
        k = r(b, shape.kv_heads, context + n, shape.head_dim)
        v = r(b, shape.kv_heads, context + n, shape.head_dim)
        return q, k, v

    big = (16, 2048) if run.device.type == "cuda" else (2, 64)
    for name, fn in ATTENTIONS.items():
        try:
            worst = 0.0
            for n in (1, 3, 8):
                q, k, v = tensors(2, 40, n)
                ref = attention_reference(q, k, v, 40, n).float()
                got = fn(q, k, v, 40, n).float()
                worst = max(worst, float((got - ref).norm() / ref.norm()))
            out["errors"][name] = worst
            if not worst < 2e-2:
                out["failed"][name] = f"relative error {worst:.2e} against the fp32 reference"
                continue
            out["ms"][name] = {}
            for n in (1, 5, 8):
                q, k, v = tensors(big[0], big[1], n)
                times = time_step(
                    lambda f=fn, q=q, k=k, v=v, n=n: f(q, k, v, big[1], n), run.timing
                )
                out["ms"][name][str(n)] = sc.percentile(times, 50)
        except Exception as exc:
            out["failed"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            out["ms"].pop(name, None)
    valid = {name: sum(ms.values()) for name, ms in out["ms"].items()}
    if run.args.attention != "auto":
        out["chosen"] = run.args.attention
    elif valid:
        out["chosen"] = min(valid, key=lambda name: valid[name])
    else:
        out["chosen"] = "lower_right"
    kv_bytes = 2 * big[0] * shape.kv_heads * (big[1] + 1) * shape.head_dim * 2
    out["probe"] = {"batch": big[0], "context": big[1], "kv_bytes_per_call": kv_bytes}
    free_memory()
    where = f"ms at B={big[0]} L={big[1]}"
    log(f"attention: {out['chosen']} ({where}: {out['ms']}; failed: {out['failed']})")
    return out


def check_against_transformers(run: Run, shape: sc.Shape, attention: Attention) -> dict[str, Any]:
    """The thin loop's logits against ``LlamaForCausalLM``'s own forward, on a float32
    two-layer model of ``shape``'s dimensions (a 1024-token vocabulary, weights drawn with
    std 0.1 so that positions and masks move the logits): prefill L tokens through
    transformers, then q more through both, the loop reading transformers' cache. A wrong
    position, mask or head grouping moves the logits by 10% or more; a right loop by ~1e-6."""
    import torch
    import transformers

    small = dataclasses.replace(shape, layers=2, vocab=1024)
    b, context, n = 2, 48, 5
    try:
        config = transformers.LlamaConfig(**small.llama_config(), initializer_range=0.1)
        torch.manual_seed(run.args.seed + 2)
        with torch.device(run.device):
            model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.float32)
        model.eval()
        loop = Loop(model, small, attention)
        gen = torch.Generator(device=run.device).manual_seed(run.args.seed + 2)
        ids = torch.randint(0, small.vocab, (b, context + n), device=run.device, generator=gen)
        cache = model(ids[:, :context], use_cache=True).past_key_values
        arena = torch.empty(
            sc.kv_elements(small, b, context, n), device=run.device, dtype=torch.float32
        )
        caches = carve(arena, small, b, context, n)
        for i, (kc, vc) in enumerate(caches):
            kc[:, :, :context].copy_(cache.layers[i].keys)
            vc[:, :, :context].copy_(cache.layers[i].values)
        ref = model(ids[:, context:], past_key_values=cache, use_cache=True).logits
        cos, sin = loop.positions(b, context, n, run.device)
        got = loop.forward(ids[:, context:], cos, sin, caches, context)
        err = float((got - ref).norm() / ref.norm())
        agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
        result: dict[str, Any] = {
            "relative_error": err,
            "argmax_agreement": agree,
            "ok": err < 1e-2,
        }
        del model, loop, cache, arena, caches
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    free_memory()
    what = f"{shape.name} dimensions, 2 layers, fp32"
    log(f"the loop against transformers' forward ({what}): {result}")
    return result


def check_shape(run: Run, shape: sc.Shape, attention: Attention) -> dict[str, Any]:
    """A Llama shape against transformers (``check_against_transformers``); a mixture or an
    EAGLE-3 head, which transformers has no Llama form of, on its dense Llama form there,
    and in its own form the cached path against the whole (``check_cached_against_whole``)."""
    if not (shape.fused or shape.experts):
        return check_against_transformers(run, shape, attention)
    plain = dataclasses.replace(shape, fused=0, experts=0, active=0)
    dense = check_against_transformers(run, plain, attention)
    own = check_cached_against_whole(run, shape, attention)
    errors = [r.get("relative_error", math.inf) for r in (dense, own)]
    return {
        "ok": bool(dense.get("ok")) and bool(own.get("ok")),
        "relative_error": max(errors),
        "dense_form": dense,
        "cached_against_whole": own,
    }


def check_cached_against_whole(run: Run, shape: sc.Shape, attention: Attention) -> dict[str, Any]:
    """The loop on a float32 two-layer model of ``shape`` (a 1024-token vocabulary, at most
    8 experts): L tokens written to the cache and q more read against it give the logits
    that all L + q tokens at once give for those q. A wrong position, mask, cache write, fused
    input or routing shows as it does against transformers."""
    import torch

    small = dataclasses.replace(
        shape,
        layers=min(shape.layers, 2),
        vocab=1024,
        experts=min(shape.experts, 8),
        active=min(shape.active, 2),
    )
    b, context, n = 2, 48, 5
    try:
        model = build_model(small, run.device, torch.float32, initializer_range=0.1)
        experts = build_experts(small, run.device, torch.float32, _grouped(run))
        loop = Loop(model, small, attention, experts if small.experts else None)
        gen = torch.Generator(device=run.device).manual_seed(run.args.seed + 3)
        ids = torch.randint(0, small.vocab, (b, context + n), device=run.device, generator=gen)
        features = loop.features(b, context + n, run.device, gen)
        whole = _through(loop, ids, features, run.device)[:, context:]
        arena = torch.empty(
            sc.kv_elements(small, b, context, n), device=run.device, dtype=torch.float32
        )
        caches = carve(arena, small, b, context, n)
        first = [(kc[:, :, :context], vc[:, :, :context]) for kc, vc in caches]
        cos, sin = loop.positions(b, 0, context, run.device)
        head = None if features is None else features[:, :context]
        loop.forward(ids[:, :context], cos, sin, first, 0, head)
        cos, sin = loop.positions(b, context, n, run.device)
        tail = None if features is None else features[:, context:]
        got = loop.forward(ids[:, context:], cos, sin, caches, context, tail)
        err = float((got - whole).norm() / whole.norm())
        result: dict[str, Any] = {"relative_error": err, "ok": err < 1e-4}
        del model, loop, arena, caches, first
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    free_memory()
    log(f"the loop, cached against whole ({shape.name} dimensions, fp32): {result}")
    return result


def _through(loop: Loop, ids: Any, features: Any, device: Any) -> Any:
    """All of ``ids`` at once through ``loop``, from position 0, on a cache of its own."""
    import torch

    b, n = ids.shape
    arena = torch.empty(sc.kv_elements(loop.shape, b, 0, n), device=device, dtype=torch.float32)
    cos, sin = loop.positions(b, 0, n, device)
    return loop.forward(ids, cos, sin, carve(arena, loop.shape, b, 0, n), 0, features)


def _grouped(run: Run) -> bool:
    """Whether this run's mixtures use the grouped kernel (``choose_experts``)."""
    return bool(run.summary.get("experts", {}).get("chosen") == "grouped")


def choose_experts(run: Run, names: Sequence[str]) -> dict[str, Any]:
    """For a run with a mixture: whether ``torch._grouped_mm`` computes what the loop over
    experts does, on this device in the run's dtype (a small mixture of the first such
    shape's width, against the loop in float32); grouped where it does (``Experts``)."""
    import torch

    shape = next((sc.SHAPES[n] for n in names if sc.SHAPES[n].experts), None)
    if shape is None:
        return {}
    small = dataclasses.replace(shape, layers=1, experts=min(shape.experts, 16))
    out: dict[str, Any] = {"chosen": "looped", "failed": {}}
    try:
        (layer,) = build_experts(small, run.device, torch.float32, grouped=False)
        gen = torch.Generator(device=run.device).manual_seed(run.args.seed + 4)
        x = torch.randn(3, 5, small.hidden, device=run.device, generator=gen)
        ref = layer(x)
        cast = Experts(
            *(t.to(run.dtype) for t in (layer.router, layer.gate_up, layer.down)),
            small.active,
            grouped=True,
        )
        got = cast(x.to(run.dtype)).float()
        out["relative_error"] = float((got - ref).norm() / ref.norm())
        if out["relative_error"] < 2e-2:
            out["chosen"] = "grouped"
        else:
            out["failed"]["grouped"] = f"relative error {out['relative_error']:.2e}"
    except Exception as exc:
        out["failed"]["grouped"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    free_memory()
    log(f"experts: {out['chosen']} ({out['failed'] or 'grouped agrees with the loop'})")
    return out


def ceilings(run: Run) -> dict[str, Any]:
    """The two ceilings on this card: device-to-device copy (bytes read + written) and a bf16
    matrix product, each the median of a few timed runs."""
    if run.device.type != "cuda":
        return {}
    try:
        out = {"copy_bytes_per_s": _copy_rate(run), "bf16_matmul_flops": _matmul_rate(run)}
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    free_memory()
    log(f"ceilings: {out}")
    return out


def _copy_rate(run: Run) -> float:
    import torch

    src = torch.empty(GIB, device=run.device, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    ms = sc.percentile(time_step(lambda: dst.copy_(src), run.timing), 50)
    return 2 * src.numel() * 2 / (ms / 1e3)


def _matmul_rate(run: Run) -> float:
    import torch

    a = torch.randn(8192, 8192, device=run.device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=run.device, dtype=torch.bfloat16)
    ms = sc.percentile(time_step(lambda: a @ b, run.timing), 50)
    return 2 * 8192**3 / (ms / 1e3)


def device_info(device: Any) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=props.total_memory / GIB,
            multiprocessors=props.multi_processor_count,
        )
        try:
            smi = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=15,
            )
            info["nvidia_smi"] = smi.stdout.strip()
        except Exception as exc:
            info["nvidia_smi"] = f"unavailable: {type(exc).__name__}"
    else:
        info["name"] = platform.processor() or "cpu"
    return info


# --- the report -------------------------------------------------------------------------------


def write_summary(run: Run) -> None:
    out = run.args.out
    targets = run.args.shape.split(",")
    analyses = {t: sc.analysis(run.cells, t, draft_of(run.args, targets[0])) for t in targets}
    counts: dict[str, int] = {}
    for c in run.cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    run.summary["cells"] = counts
    run.summary["elapsed_s"] = round(run.elapsed(), 1)
    run.summary["analysis"] = analyses
    first = analyses[targets[0]]["cost_model"]
    meta = run.summary["meta"]
    run.summary["cost_model"] = {
        **first,
        "source": f"measured: {meta.get('name')}, torch {meta['torch']}, bench/gpu/steptime.py",
    }
    (out / "summary.json").write_text(json.dumps(run.summary, indent=1, default=str))


def print_report(cells: Sequence[sc.Cell], targets: Sequence[str], draft: str | None) -> None:
    for target in targets:
        for line in sc.report(cells, target, draft):
            print(line, flush=True)


def plan(args: argparse.Namespace) -> None:
    """The grid, what fits an H100 (79 GiB less the weights and the reserve), and a roofline
    guess of each cell (3.0 TB/s, 600 TFLOP/s, 1 ms of launches): no torch needed."""
    bandwidth, flops, card = 3.0e12, 6.0e14, 79 * GIB
    total = 0.0
    for i, target in enumerate(args.shape.split(",")):
        draft = draft_of(args, target) if i == 0 else None
        weights = sum(sc.SHAPES[s].weight_bytes() for s in filter(None, (target, draft)))
        arena = card - weights - (args.reserve_gib + 1) * GIB
        for spec in sc.grid(target, draft, args.batches, args.queries, args.contexts):
            shape = sc.SHAPES[spec.shape]
            need = sc.kv_elements(shape, spec.batch, spec.context, spec.q) * 2
            tokens = spec.batch * spec.q
            compute = tokens * shape.flops_per_token() / flops
            weights_s = shape.weight_bytes_read(tokens) / bandwidth
            ms = 1e3 * (max(weights_s + 1e-3, compute) + need / bandwidth)
            fits = need <= arena
            reps = min(max(args.target_ms / ms, args.min_reps), args.max_reps)
            wall = 0.15 + (args.warmup + 2 + reps) * ms / 1e3 if fits else 0.0
            total += wall
            guess = f"~{ms:.2f} ms" if fits else "skip"
            print(
                f"{spec.shape:5} {spec.role:6} L={spec.context:5d} B={spec.batch:3d} q={spec.q}"
                f"  KV {need / GIB:7.2f} GiB  {guess:>10}  wall ~{wall:.2f} s"
            )
    print(f"cells' wall time, roughly: {total:.0f} s (plus ~30 s of start, build and checks)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    targets = args.shape.split(",")
    if args.analyse:
        print_report(sc.read_cells(str(args.analyse)), targets, draft_of(args, targets[0]))
        return 0
    if args.plan:
        plan(args)
        return 0
    import torch

    device = torch.device(
        "cuda"
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )
    dtype = getattr(torch, args.dtype)
    if device.type == "cpu":
        torch.set_num_threads(1)  # the CPU path is for tests, on a shared machine
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"
    timing = Timing(
        args.warmup, args.min_reps, args.max_reps, args.target_ms, cuda and not args.no_graphs, cuda
    )
    with (args.out / "steptime.csv").open("w", newline="") as handle, torch.inference_mode():
        writer = csv.DictWriter(handle, fieldnames=sc.CSV_FIELDS)
        writer.writeheader()
        run = Run(args, device, dtype, timing, writer, handle)
        run.summary = {
            "meta": device_info(device),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "shapes": {
                name: {
                    "like": s.like,
                    "params": s.params(),
                    "active_params": s.active_params(),
                    "weight_bytes": s.weight_bytes(),
                    "kv_bytes_per_token": s.kv_bytes_per_token(),
                }
                for name, s in sc.SHAPES.items()
            },
            "checks": {},
        }
        log(f"device: {run.summary['meta']}")
        try:
            run.summary["ceilings"] = ceilings(run)
            run.summary["attention"] = choose_attention(run)
            chosen = ATTENTIONS[run.summary["attention"]["chosen"]]
            names = list(dict.fromkeys([*targets, *filter(None, [draft_of(args, targets[0])])]))
            run.summary["experts"] = choose_experts(run, names)
            for name in names:
                run.summary["checks"][name] = check_shape(run, sc.SHAPES[name], chosen)
            for i, target in enumerate(targets):
                # the draft's step does not depend on the target: measured once, with the first
                run_shape(run, target, draft_of(args, target) if i == 0 else None)
        finally:
            write_summary(run)
    log(f"done: {run.summary['cells']}")
    print_report(run.cells, targets, draft_of(args, targets[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
