"""A small Llama-style decoder on a paged KV cache: prefill, then greedy decode, timed per mode.

The model is RMSNorm -> attention (RoPE, grouped-query heads, keys and values written into a
``PagedKVCache`` with ``reshape_and_cache`` and read back with ``paged_attention``) -> RMSNorm ->
SwiGLU MLP, with random weights. A ``BlockAllocator`` hands out cache blocks and a
``MetadataBuilder`` rewrites the decode bucket's static metadata buffers in place each step, so a
compiled decode step neither recompiles nor (with CUDA graphs) re-captures as sequences grow.

Modes: ``eager``; ``compile`` (``torch.compile(fullgraph=True)``); ``cudagraphs``
(``torch.compile(mode="reduce-overhead", fullgraph=True)``, CUDA only). Each mode starts from the
same prompts, decodes greedily and prints decode tokens/s.

Each mode is then checked against the same model evaluated in float64 with dense attention on the
tokens that mode fed itself (teacher forcing, so a mode whose greedy path left eager's after a
near-tie is still compared like for like): its logits' largest error against that truth must stay
within what the working precision allows. Eager must be within ``EAGER_ROUNDINGS_PER_LAYER`` unit
roundoffs of the dtype plus ``EAGER_FP32_ROUNDINGS_PER_LAYER`` of float32 a layer (times 1 + the
largest |logit|); every other mode within twice eager's own error plus one unit roundoff, the
rule ``torch_paged_attn.testing.assert_close`` applies. The share of greedy tokens
equal to eager's is printed beside it: in bf16 random-weight models, near-ties flip tokens without
any error (a flipped token changes the rest of that sequence), in float32 they all agree. One
verdict per mode, PASS or FAIL; the exit status is 1 when any mode fails.

    python examples/llama.py [--layers 2] [--batch 4] [--steps 32] [--mode eager compile]
                             [--device cpu|cuda] [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import end_progress, non_negative_int, positive_int, progress, rate, set_cpu_threads  # noqa: E402

from torch_paged_attn.cache import BlockAllocator, PagedKVCache  # noqa: E402
from torch_paged_attn.metadata import MetadataBuilder, StepMetadata, mark_static  # noqa: E402


@dataclass
class LlamaConfig:
    vocab_size: int = 512
    dim: int = 256
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_size: int = 32
    ffn_dim: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_positions: int = 4096
    block_size: int = 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(cfg: LlamaConfig) -> tuple[Tensor, Tensor]:
    """cos/sin ``[max_positions, head_size / 2]`` of rotary embeddings (float32)."""
    half = cfg.head_size // 2
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(cfg.max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [T, H, D]`` by the angles of its tokens (``cos``/``sin`` ``[T, D/2]``), halves layout."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_size = cfg.num_heads, cfg.num_kv_heads, cfg.head_size
        q, kv = cfg.num_heads * cfg.head_size, cfg.num_kv_heads * cfg.head_size
        self.qkv = nn.Linear(cfg.dim, q + 2 * kv, bias=False)
        self.o = nn.Linear(q, cfg.dim, bias=False)
        self.scale = 1.0 / math.sqrt(cfg.head_size)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: PagedKVCache, md: tuple, max_query_len: int
    ) -> Tensor:
        block_table, seq_lens, query_start_loc, slot_mapping = md
        t = x.shape[0]
        q_dim, kv_dim = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        q, k, v = self.qkv(x).split([q_dim, kv_dim, kv_dim], dim=-1)
        q = apply_rope(q.view(t, self.num_heads, self.head_size), cos, sin)
        k = apply_rope(k.view(t, self.num_kv_heads, self.head_size), cos, sin)
        v = v.reshape(t, self.num_kv_heads, self.head_size)
        out = cache(
            self.layer, q, k, v, slot_mapping, block_table, seq_lens, query_start_loc,
            scale=self.scale, max_query_len=max_query_len,
        )
        return self.o(out.reshape(t, q_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: PagedKVCache, md: tuple, max_query_len: int
    ) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, md, max_query_len)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Decoder over a paged cache. ``forward`` takes a step's tokens and metadata and returns the
    logits ``[B, vocab]`` of each sequence's last new token (rows of padding sequences: garbage)."""

    def __init__(self, cfg: LlamaConfig, num_blocks: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.to(device=device, dtype=dtype)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)  # rotary angles stay float32
        self.kv_cache = PagedKVCache(
            cfg.num_layers, num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_size, dtype=dtype, device=device
        )

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        query_start_loc: Tensor,
        slot_mapping: Tensor,
        max_query_len: int = -1,
    ) -> Tensor:
        md = (block_table, seq_lens, query_start_loc, slot_mapping)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.embed(input_ids)
        for block in self.layers:
            x = block(x, cos, sin, self.kv_cache, md, max_query_len)
        last = (query_start_loc[1:].long() - 1).clamp(min=0)  # each sequence's last new token
        return self.lm_head(self.norm(x[last])).float()


def init_weights(model: Llama, seed: int) -> None:
    """Random weights scaled so that activations and logits stay O(1) through the layers."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            w = torch.randn(p.shape, generator=g) / math.sqrt(fan_in)
            p.copy_(w.to(p.dtype))


def step_inputs(input_ids: Tensor, md: StepMetadata) -> tuple[Tensor, ...]:
    """The positional arguments of ``Llama.forward`` for one step."""
    return (input_ids, md.positions, md.block_table, md.seq_lens, md.query_start_loc, md.slot_mapping)


class Generator:
    """Prefill and greedy decode of ``batch`` sequences on one model, through a chosen step
    function (eager, compiled, ...). The decode step uses one static metadata bucket and one
    static token buffer, so every decode step calls the step function on the same tensors."""

    def __init__(self, model: Llama, batch: int, max_len: int):
        cfg = model.cfg
        device = model.embed.weight.device
        self.model, self.batch = model, batch
        self.max_blocks = math.ceil(max_len / cfg.block_size)
        self.allocator = BlockAllocator(model.kv_cache.num_blocks, cfg.block_size)
        self.builder = MetadataBuilder(self.allocator, self.max_blocks, device, batch_buckets=[batch])
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)  # static decode input
        mark_static(self.tokens)

    def prefill(self, prompts: list[list[int]]) -> Tensor:
        """Allocate the sequences, run their prompts (eagerly), return the first generated tokens."""
        for seq in self.allocator.sequences():
            self.allocator.free(seq)
        for i, p in enumerate(prompts):
            self.allocator.allocate(i, len(p))
        lens = [len(p) for p in prompts]
        md = self.builder.build(list(range(len(prompts))), lens, num_tokens=sum(lens))
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=self.tokens.device)
        logits = self.model(*step_inputs(ids, md), max_query_len=md.max_query_len)
        self.tokens.copy_(logits.argmax(-1))
        return self.tokens.clone()

    def decode(self, step, steps: int, progress=None) -> tuple[list[Tensor], list[Tensor]]:
        """``steps`` greedy decode steps through ``step`` (a callable with ``Llama.forward``'s
        signature); returns each step's input tokens and logits."""
        seqs = list(range(self.batch))
        fed, logits_seen = [], []
        for s in range(steps):
            for seq in seqs:
                self.allocator.append(seq)
            md = self.builder.build(seqs)
            fed.append(self.tokens.clone())
            logits = step(*step_inputs(self.tokens, md), max_query_len=1)
            logits_seen.append(logits.clone())
            self.tokens.copy_(logits.argmax(-1))
            if progress is not None:
                progress(s + 1, steps)
        return fed, logits_seen


def random_prompts(batch: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts of different lengths (``prompt_len`` down to about half of it)."""
    g = torch.Generator().manual_seed(seed)
    lens = [max(1, prompt_len - (i * prompt_len) // (2 * max(batch, 1))) for i in range(batch)]
    return [torch.randint(vocab, (n,), generator=g).tolist() for n in lens]


def make_step(model: Llama, mode: str):
    if mode == "eager":
        return model
    if mode == "compile":
        return torch.compile(model, fullgraph=True)
    if mode == "cudagraphs":
        return torch.compile(model, mode="reduce-overhead", fullgraph=True)
    raise ValueError(f"mode: expected eager, compile or cudagraphs, got {mode!r}")


# -- the check: teacher-forced logits against a float64 dense evaluation -------------------------

# Unit roundoff of each working dtype (2^-24, 2^-11, 2^-8).
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# Eager's largest logit error may reach, per layer and times 1 + the largest |logit|, this many
# unit roundoffs of the working dtype (activations stored in it: norms, projections, RoPE,
# attention, MLP) plus this many of float32 (the float32 accumulation of dot products over up to
# 512 terms). Measured on the CPU (reference backend, seed 0, batch 4, 32 steps, 2026-11): float32
# 17 float32 roundoffs with 2 layers, 12 with 1; bf16 2.5 bf16 roundoffs with 2 layers. The budget
# leaves 4x room or more over each.
EAGER_ROUNDINGS_PER_LAYER = 8
EAGER_FP32_ROUNDINGS_PER_LAYER = 32


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@torch.no_grad()
def dense_logits(model: Llama, tokens: list[int]) -> Tensor:
    """The logits ``[len(tokens), vocab]`` of one sequence, every position, in float64 on the CPU,
    with plain causal attention over the whole sequence (no cache, no paged_attn op): the truth."""
    cfg = model.cfg
    w = {name: p.detach().double().cpu() for name, p in model.named_parameters()}
    n = len(tokens)
    # the model's own rotary tables (float32 buffers, part of the model like its weights)
    cos, sin = model.rope_cos[:n].double().cpu()[:, None, :], model.rope_sin[:n].double().cpu()[:, None, :]

    def rope(x: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    q_dim, kv_dim = cfg.num_heads * cfg.head_size, cfg.num_kv_heads * cfg.head_size
    group = cfg.num_heads // cfg.num_kv_heads
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    x = w["embed.weight"][torch.tensor(tokens)]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.norm_eps)
        q, k, v = (h @ w[p + "attn.qkv.weight"].T).split([q_dim, kv_dim, kv_dim], dim=-1)
        q = rope(q.view(n, cfg.num_heads, cfg.head_size))
        k = rope(k.view(n, cfg.num_kv_heads, cfg.head_size)).repeat_interleave(group, dim=1)
        v = v.view(n, cfg.num_kv_heads, cfg.head_size).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(cfg.head_size)
        attn = scores.masked_fill(~causal, -math.inf).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", attn, v).reshape(n, q_dim)
        x = x + out @ w[p + "attn.o.weight"].T
        h = _rms_norm(x, w[p + "mlp_norm.weight"], cfg.norm_eps)
        gate, up = (h @ w[p + "mlp.gate_up.weight"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down.weight"].T
    return _rms_norm(x, w["norm.weight"], cfg.norm_eps) @ w["lm_head.weight"].T


def truth_for(model: Llama, prompts: list[list[int]], fed: Tensor) -> Tensor:
    """The float64 logits ``[steps, B, vocab]`` of the decode steps that fed ``fed [steps, B]``
    (step s feeds ``fed[s, b]`` at position ``len(prompts[b]) + s``)."""
    rows = []
    for b, prompt in enumerate(prompts):
        n = len(prompt)
        rows.append(dense_logits(model, prompt + fed[:, b].tolist())[n:])
    return torch.stack(rows, dim=1)


@dataclass
class Check:
    error: float  # largest |logit - truth| over every step and sequence
    scale: float  # largest |truth|
    budget: float
    agreement: float  # share of greedy tokens equal to eager's

    @property
    def ok(self) -> bool:
        return self.error <= self.budget


def check_mode(model: Llama, prompts, fed: Tensor, logits: Tensor, dtype: torch.dtype, eager: Check | None,
               eager_fed: Tensor | None) -> Check:
    """Teacher-forced logits of one mode against the float64 truth on its own tokens; the budget
    is the dtype's (eager) or twice eager's error plus one unit roundoff (other modes)."""
    truth = truth_for(model, prompts, fed)
    error = float((logits.double().cpu() - truth).abs().max())
    scale = float(truth.abs().max())
    u = UNIT_ROUNDOFF[dtype]
    if eager is None:
        per_layer = EAGER_ROUNDINGS_PER_LAYER * u + EAGER_FP32_ROUNDINGS_PER_LAYER * UNIT_ROUNDOFF[torch.float32]
        budget = model.cfg.num_layers * per_layer * (1 + scale)
        agreement = 1.0
    else:
        budget = 2 * eager.error + u * (1 + scale)
        agreement = float((fed == eager_fed).double().mean())
    return Check(error, scale, budget, agreement)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--steps", type=positive_int, default=32)
    parser.add_argument("--prompt-len", type=positive_int, default=48)
    parser.add_argument("--mode", nargs="+", default=None, choices=["eager", "compile", "cudagraphs"],
                        help="default: eager compile, plus cudagraphs on CUDA; eager always runs first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    set_cpu_threads(device)
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = args.mode or (["eager", "compile"] + (["cudagraphs"] if device.type == "cuda" else []))
    modes = ["eager"] + [m for m in dict.fromkeys(modes) if m != "eager"]  # eager is the baseline
    cfg = LlamaConfig(num_layers=args.layers)
    max_len = args.prompt_len + args.steps + 1
    num_blocks = args.batch * math.ceil(max_len / cfg.block_size) + 1
    model = Llama(cfg, num_blocks, dtype=dtype, device=device).eval()
    init_weights(model, args.seed)
    prompts = random_prompts(args.batch, args.prompt_len, cfg.vocab_size, args.seed)
    print(f"llama-style decoder on {device} ({dtype}, {torch.get_num_threads()} CPU threads): {cfg.num_layers} "
          f"layers, dim {cfg.dim}, {cfg.num_heads} query / {cfg.num_kv_heads} kv heads, batch {args.batch}, "
          f"prompts {[len(p) for p in prompts]}, {args.steps} decode steps")

    eager = eager_fed = None
    ok = True
    for mode in modes:
        if mode == "cudagraphs" and device.type != "cuda":
            print(f"{mode:>10}: skipped (needs CUDA)")
            continue
        torch._dynamo.reset()
        gen = Generator(model, args.batch, max_len)
        step = make_step(model, mode)
        with torch.no_grad():
            gen.prefill(prompts)
            warm = min(3, args.steps)  # compilation (and capture) happen in these steps
            if mode != "eager":
                progress(f"{mode:>10}: compiling the decode step (its first call; up to a few minutes on a CPU)")
            t0 = time.perf_counter()
            fed_warm, logits_warm = gen.decode(step, warm, progress=lambda s, n: progress(f"{mode:>10}: warm-up {s}/{n}"))
            warm_s = time.perf_counter() - t0
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fed, logits = gen.decode(
                step, args.steps - warm, progress=lambda s, n: progress(f"{mode:>10}: step {s}/{n}"),
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
        end_progress()
        timed = args.steps - warm
        fed_all = torch.stack(fed_warm + fed).cpu()
        check = check_mode(model, prompts, fed_all, torch.stack(logits_warm + logits), dtype, eager, eager_fed)
        if eager is None:
            eager, eager_fed = check, fed_all
            against = (f"{cfg.num_layers} layers x ({EAGER_ROUNDINGS_PER_LAYER} unit roundoffs of {dtype} + "
                       f"{EAGER_FP32_ROUNDINGS_PER_LAYER} of float32)")
        else:
            against = "2x eager's error + 1 unit roundoff"
        ok &= check.ok
        print(f"{mode:>10}: {rate(args.batch * timed, 'tokens', timed, elapsed)}; warm-up {warm_s:.1f} s", flush=True)
        print(f"{'':>10}  {'PASS' if check.ok else 'FAIL'}: logits vs float64, max error {check.error:.2e} "
              f"(budget {check.budget:.2e}: {against}; largest |logit| {check.scale:.2f}); greedy tokens "
              f"equal to eager's: {check.agreement:.1%}", flush=True)
    print("PASS: every mode agrees with the float64 truth within its precision" if ok
          else "FAIL: a mode's logits are off by more than its precision allows")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
