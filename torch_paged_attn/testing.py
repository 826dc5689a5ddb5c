"""Input factories and the tolerance helper shared by the tests and the benchmarks.

``make_paged_batch`` builds a ragged batch over a paged cache the way a serving engine leaves
it: block ids shuffled across the cache, garbage in the unused tail of the block table, NaN in
every cache slot no sequence covers (kernels must mask loads, not only scores), and optional
padding query rows past ``query_start_loc[-1]``.

``assert_close`` derives its budget from the reference's own error in the working precision
(``2 * |ref_lowp - truth| + floor``, as flash-attention's tests do) and checks that finite and
infinite entries agree; there is no per-test ``atol``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

# Relative rounding error of one value in each dtype (half an ulp, rounded up).
_EPS = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
}


@dataclass
class PagedBatch:
    """Tensors of one paged attention call (see ``paged_attention``'s docstring)."""

    query: Tensor
    key_cache: Tensor
    value_cache: Tensor
    block_table: Tensor
    seq_lens: Tensor
    query_start_loc: Tensor
    k_scale: Tensor | None = None
    v_scale: Tensor | None = None
    q_lens: list[int] = field(default_factory=list)
    kv_lens: list[int] = field(default_factory=list)

    def args(self) -> tuple[Tensor, ...]:
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_table,
            self.seq_lens,
            self.query_start_loc,
        )


def random_cache(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device | str,
    generator: torch.Generator,
    scale: float = 1.0,
) -> Tensor:
    """A cache tensor of random values; fp8 caches hold ``randn / scale`` quantised."""
    x = torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
    if dtype in FP8_DTYPES:
        finfo = torch.finfo(dtype)
        return (x / scale).clamp(finfo.min, finfo.max).to(dtype)
    return x.to(dtype)


def make_block_table(
    kv_lens: list[int],
    block_size: int,
    num_blocks: int,
    generator: torch.Generator,
    max_blocks: int | None = None,
) -> tuple[Tensor, Tensor]:
    """A block table ``[B, MB]`` int32 over a shuffled pool of ``num_blocks`` blocks, with garbage
    (ids out of range, negative ids, repeats) past each sequence's used blocks; and the mask
    ``[num_blocks, block_size]`` of cache slots some sequence covers."""
    used = [math.ceil(n / block_size) for n in kv_lens]
    if max_blocks is None:
        max_blocks = max(used + [1])
    if sum(used) > num_blocks:
        raise ValueError(f"num_blocks: expected at least {sum(used)}, got {num_blocks}")
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    garbage = torch.randint(-(2**31), 2**31 - 1, (len(kv_lens), max_blocks), generator=generator)
    table = garbage.to(torch.int32)
    covered = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    k = 0
    for i, (n, u) in enumerate(zip(kv_lens, used)):
        for b in range(u):
            block = perm[k]
            k += 1
            table[i, b] = block
            covered[block, : min(block_size, n - b * block_size)] = True
    return table, covered


def make_paged_batch(
    q_lens: list[int],
    kv_lens: list[int],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_size: int = 32,
    head_size_v: int | None = None,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    pad_tokens: int = 0,
    extra_blocks: int = 3,
    max_blocks: int | None = None,
    nan_uncovered: bool = True,
    seed: int = 0,
) -> PagedBatch:
    """A ragged batch: sequence ``i`` has ``q_lens[i]`` new tokens and ``kv_lens[i]`` visible keys."""
    g = torch.Generator().manual_seed(seed)
    head_size_v = head_size if head_size_v is None else head_size_v
    cache_dtype = dtype if cache_dtype is None else cache_dtype
    used = sum(math.ceil(n / block_size) for n in kv_lens)
    num_blocks = used + extra_blocks
    table, covered = make_block_table(kv_lens, block_size, num_blocks, g, max_blocks)
    k_scale = v_scale = None
    ks = vs = 1.0
    if cache_dtype in FP8_DTYPES:
        ks = 0.5 + float(torch.rand(1, generator=g))
        vs = 0.25 + float(torch.rand(1, generator=g))
        k_scale = torch.tensor([ks], dtype=torch.float32, device=device)
        v_scale = torch.tensor(vs, dtype=torch.float32, device=device)
    kc = random_cache((num_blocks, block_size, num_kv_heads, head_size), cache_dtype, "cpu", g, ks)
    vc = random_cache((num_blocks, block_size, num_kv_heads, head_size_v), cache_dtype, "cpu", g, vs)
    if nan_uncovered and cache_dtype not in FP8_DTYPES:
        kc[~covered] = float("nan")
        vc[~covered] = float("nan")
    elif nan_uncovered:  # fp8 NaN bit patterns: 0x7f for e4m3fn, 0x7f (a NaN) for e5m2
        kc.view(torch.uint8)[~covered] = 0x7F
        vc.view(torch.uint8)[~covered] = 0x7F
    num_tokens = sum(q_lens) + pad_tokens
    query = torch.randn(num_tokens, num_heads, head_size, generator=g).to(dtype)
    if pad_tokens:
        query[sum(q_lens) :] = float("nan")  # padding rows must not leak into anything
    qsl = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return PagedBatch(
        query=query.to(device),
        key_cache=kc.to(device),
        value_cache=vc.to(device),
        block_table=table.to(device),
        seq_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device),
        k_scale=k_scale,
        v_scale=v_scale,
        q_lens=list(q_lens),
        kv_lens=list(kv_lens),
    )


def assert_close(
    actual: Tensor,
    truth: Tensor,
    *,
    dtype: torch.dtype | None = None,
    reference: Tensor | None = None,
    name: str = "output",
) -> None:
    """Check ``actual`` against the float64 ``truth``.

    Budget: ``2 * max|reference - truth| + floor`` when the low-precision ``reference`` is given
    (the error the specification itself makes in that precision), else ``eps(dtype) * (1 + |truth|)``
    elementwise. Infinite entries (an LSE of -inf) must match exactly, NaN never passes.
    """
    dtype = actual.dtype if dtype is None else dtype
    a = actual.double().cpu()
    t = truth.double().cpu()
    if a.shape != t.shape:
        raise AssertionError(f"{name}: shape {tuple(a.shape)} != expected {tuple(t.shape)}")
    if torch.isnan(a).any():
        bad = torch.isnan(a).nonzero()[0].tolist()
        raise AssertionError(f"{name}: NaN at {bad}")
    inf_t = torch.isinf(t)
    if not torch.equal(torch.isinf(a), inf_t) or not torch.equal(a[inf_t], t[inf_t]):
        diff = (torch.isinf(a) != inf_t) | (inf_t & (a != t))
        bad = diff.nonzero()[0].tolist()
        raise AssertionError(f"{name}: infinite entries differ at {bad}: got {a[tuple(bad)]}, expected {t[tuple(bad)]}")
    fin = ~inf_t
    err = (a - t)[fin].abs()
    if err.numel() == 0:
        return
    eps = _EPS.get(dtype, 1e-1)
    scale = t[fin].abs()
    if reference is not None:
        r = reference.double().cpu()[fin]
        budget = 2 * (r - t[fin]).abs().max() + eps * (1 + scale.max())
        worst = err.max()
        if worst > budget:
            at = (a - t).abs().nan_to_num(0, 0, 0).argmax()
            raise AssertionError(f"{name}: max error {worst:.3e} > budget {budget:.3e} (at flat index {at})")
        return
    limit = eps * (1 + scale) * 4
    if (err > limit).any():
        i = (err - limit).argmax()
        raise AssertionError(
            f"{name}: error {err[i]:.3e} > {limit[i]:.3e} at a value of {t[fin][i]:.4g} ({dtype})"
        )
