"""Which tensors Inductor believes each Triton kernel of the package writes: run as a script.

Under torch.compile Inductor reads every user Triton kernel's TTIR to find the pointer arguments
it stores through; a tensor it counts as written is cloned before the launch and copied back
after, and a graph input so counted makes CUDA graphs skip the whole graph ("mutated inputs").
This script calls each Triton backend function on small CPU tensors with the launches captured
instead of run, analyses every captured launch as Inductor does (TTIR for a CUDA target, no GPU
needed), and prints one JSON line per launch: the op, the kernel, and the op inputs (by name)
that the analysis counts as written although the op only reads them. ``tests/test_kernel_writes.py``
runs it in a subprocess without ``TRITON_INTERPRET`` (the analysis needs compiled, not
interpreted, kernels) and expects every list to be empty.
"""

from __future__ import annotations

import json
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget

try:  # torch >= 2.12
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors as _analyse
except ImportError:  # torch 2.11
    from torch._higher_order_ops.triton_kernel_wrap import identify_mutated_tensors as _analyse


class _CudaTarget:
    """A driver stand-in that names an sm_90 target: TTIR generation needs one, not a GPU."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)


def _written(kernel, kwargs: dict) -> list[str]:
    result = _analyse(kernel, kwargs, {})
    if isinstance(result, list):
        return result
    return [dep.name for dep in result.read_writes.writes]


def main() -> int:
    triton.runtime.driver.set_active(_CudaTarget())
    from torch_paged_attn.lowering.triton import kv_cache, merge, mla, paged_attention
    from torch_paged_attn.lowering.triton._launch import without_hints

    captured: list[tuple] = []

    def capture(kernel, grid, **constants):
        constants = without_hints(constants)
        return lambda like, **tensors: captured.append((kernel, {**tensors, **constants}))

    for module in (kv_cache, merge, mla, paged_attention):  # each module's own name for the launch helper
        module.launcher = capture

    g = torch.Generator().manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16)

    def randn(*shape, **kw):
        return torch.randn(*shape, generator=g).to(**kw) if kw else torch.randn(*shape, generator=g)

    i32 = dict(dtype=torch.int32)
    calls = []  # (op, read-only inputs by name, thunk)

    q = randn(6, 4, 32, **bf16)
    kc, vc = randn(10, 16, 2, 32, **bf16), randn(10, 16, 2, 32, **bf16)
    bt = torch.randperm(10, generator=g).to(torch.int32)[:9].view(3, 3)
    lens = torch.tensor([40, 20, 33], **i32)
    qsl = torch.tensor([0, 1, 5, 6], **i32)
    sinks, slopes = randn(4), randn(4)
    attn_inputs = dict(query=q, key_cache=kc, value_cache=vc, block_table=bt, seq_lens=lens, query_start_loc=qsl,
                       sinks=sinks, alibi_slopes=slopes)
    for split in (None, 16):
        out, lse = torch.empty(6, 4, 32, **bf16), torch.empty(6, 4)
        calls.append(("paged_attention", attn_inputs, lambda out=out, lse=lse, split=split: paged_attention.paged_attention(
            q, kc, vc, bt, lens, qsl, out, lse, scale=0.2, causal=True, window_left=-1, window_right=-1, softcap=0.0,
            alibi_slopes=slopes, sinks=sinks, k_scale=None, v_scale=None, attention_chunk_size=0, split_tokens=split)))

    kc8, vc8, unit_scale = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn), torch.tensor(0.5)
    fp8_inputs = dict(attn_inputs, key_cache=kc8, value_cache=vc8, k_scale=unit_scale, v_scale=unit_scale)
    out, lse = torch.empty(6, 4, 32, **bf16), torch.empty(6, 4)
    calls.append(("paged_attention fp8", fp8_inputs, lambda out=out, lse=lse: paged_attention.paged_attention(
        q, kc8, vc8, bt, lens, qsl, out, lse, scale=0.2, causal=True, window_left=-1, window_right=-1, softcap=0.0,
        alibi_slopes=None, sinks=None, k_scale=unit_scale, v_scale=unit_scale, attention_chunk_size=0)))

    ql, qr, kv = randn(3, 16, 64, **bf16), randn(3, 16, 16, **bf16), randn(10, 16, 80, **bf16)
    dec_qsl = torch.tensor([0, 1, 2, 3], **i32)
    mla_inputs = dict(q_latent=ql, q_rope=qr, kv_cache=kv, block_table=bt, seq_lens=lens, query_start_loc=dec_qsl)
    for split in (None, 16):
        out, lse = torch.empty(3, 16, 64, **bf16), torch.empty(3, 16)
        calls.append(("mla_decode", mla_inputs, lambda out=out, lse=lse, split=split: mla.mla_decode(
            ql, qr, kv, bt, lens, dec_qsl, out, lse, scale=0.1, causal=True, kv_scale=None, split_tokens=split)))

    kv8 = kv.to(torch.float8_e4m3fn)
    out, lse = torch.empty(3, 16, 64, **bf16), torch.empty(3, 16)
    calls.append(("mla_decode fp8", dict(mla_inputs, kv_cache=kv8, kv_scale=unit_scale),
                  lambda out=out, lse=lse: mla.mla_decode(ql, qr, kv8, bt, lens, dec_qsl, out, lse, scale=0.1,
                                                          causal=True, kv_scale=unit_scale)))

    k, v, slots = randn(5, 2, 32, **bf16), randn(5, 2, 32, **bf16), torch.tensor([3, -1, 40, 77, 12])
    calls.append(("reshape_and_cache", dict(key=k, value=v, slot_mapping=slots),
                  lambda: kv_cache.reshape_and_cache(k, v, kc, vc, slots, None, None)))
    c, pe = randn(5, 64, **bf16), randn(5, 16, **bf16)
    calls.append(("concat_and_cache_mla", dict(kv_c=c, k_pe=pe, slot_mapping=slots),
                  lambda: kv_cache.concat_and_cache_mla(c, pe, kv, slots, None)))
    cu, starts = torch.tensor([0, 10, 30, 45], **i32), torch.tensor([0, 5, 2], **i32)
    gathered = torch.empty(45, 80, **bf16)
    calls.append(("gather_cache", dict(kv_cache=kv, block_table=bt, cu_seq_lens=cu, seq_starts=starts),
                  lambda: kv_cache.gather_cache(kv, bt, cu, starts, gathered, None)))
    po, pl, so, sl = randn(6, 4, 32, **bf16), randn(6, 4), randn(6, 4, 32, **bf16), randn(6, 4)
    merged, merged_lse = torch.empty(6, 4, 32, **bf16), torch.empty(6, 4)
    calls.append(("merge_attn_states", dict(prefix_output=po, prefix_lse=pl, suffix_output=so, suffix_lse=sl),
                  lambda: merge.merge_attn_states(po, pl, so, sl, merged, merged_lse)))

    parts, part_lses = randn(3, 6, 4, 32, **bf16), randn(3, 6, 4)
    merged_n, merged_n_lse = torch.empty(6, 4, 32, **bf16), torch.empty(6, 4)
    calls.append(("merge_attn_states_n", dict(outs=parts, lses=part_lses),
                  lambda: merge.merge_attn_states_n(parts, part_lses, merged_n, merged_n_lse)))

    for op, inputs, thunk in calls:
        captured.clear()
        thunk()
        for kernel, kwargs in captured:
            kwargs = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")}
            wrongly = []
            for name in _written(kernel, kwargs):
                t = kwargs[name]
                wrongly += [n for n, x in inputs.items()
                            if isinstance(t, torch.Tensor) and x.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()]
            print(json.dumps({"op": op, "kernel": kernel.fn.__name__, "reads_counted_as_writes": sorted(set(wrongly))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
