"""A small Llama-style decoder on a paged KV cache: prefill, then greedy decode, timed per mode.

The model is RMSNorm -> attention (RoPE, grouped-query heads, keys and values written into a
``PagedKVCache`` with ``reshape_and_cache`` and read back with ``paged_attention``) -> RMSNorm ->
SwiGLU MLP, with random weights. A ``BlockAllocator`` hands out cache blocks and a
``MetadataBuilder`` rewrites the decode bucket's static metadata buffers in place each step, so a
compiled decode step neither recompiles nor (with CUDA graphs) re-captures as sequences grow.

Modes: ``eager``; ``compile`` (``torch.compile(fullgraph=True)``); ``cudagraphs``
(``torch.compile(mode="reduce-overhead", fullgraph=True)``, CUDA only). Each mode starts from the
same prompts and prints decode tokens/s; greedy tokens are compared across modes.

    python examples/llama.py [--layers 2] [--batch 4] [--steps 32] [--mode eager compile]
                             [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torch_paged_attn.cache import BlockAllocator, PagedKVCache
from torch_paged_attn.metadata import MetadataBuilder, StepMetadata, mark_static


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


def _progress(line: str) -> None:
    """Rewrite the progress line on stderr in place (stdout carries only the results)."""
    print(f"\r{line}", end="", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--mode", nargs="+", default=None, choices=["eager", "compile", "cudagraphs"],
                        help="default: eager compile, plus cudagraphs on CUDA")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = args.mode or (["eager", "compile"] + (["cudagraphs"] if device.type == "cuda" else []))
    cfg = LlamaConfig(num_layers=args.layers)
    max_len = args.prompt_len + args.steps + 1
    num_blocks = args.batch * math.ceil(max_len / cfg.block_size) + 1
    model = Llama(cfg, num_blocks, dtype=dtype, device=device).eval()
    init_weights(model, args.seed)
    prompts = random_prompts(args.batch, args.prompt_len, cfg.vocab_size, args.seed)
    print(f"llama-style decoder on {device} ({dtype}): {cfg.num_layers} layers, dim {cfg.dim}, "
          f"{cfg.num_heads} query / {cfg.num_kv_heads} kv heads, batch {args.batch}, "
          f"prompts {[len(p) for p in prompts]}, {args.steps} decode steps")

    reference = None
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
            t0 = time.perf_counter()
            gen.decode(step, warm, progress=lambda s, n: _progress(f"{mode:>10}: warm-up {s}/{n}"))
            warm_s = time.perf_counter() - t0
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fed, _ = gen.decode(
                step, args.steps - warm,
                progress=lambda s, n: _progress(f"{mode:>10}: step {s}/{n}"),
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
        print("", file=sys.stderr)
        timed = max(args.steps - warm, 1)
        tokens = torch.stack(fed).cpu() if fed else torch.empty(0)
        same = ""
        if reference is None:
            reference = tokens
        else:
            match = torch.equal(tokens, reference)
            ok &= match or dtype != torch.float32  # low precision may flip a near-tie
            same = f", tokens {'equal to' if match else 'differ from'} {modes[0]}'s"
        print(f"{mode:>10}: {args.batch * timed / max(elapsed, 1e-9):9.1f} tokens/s "
              f"({elapsed / timed * 1e3:.2f} ms/step; warm-up {warm_s:.1f} s){same}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
