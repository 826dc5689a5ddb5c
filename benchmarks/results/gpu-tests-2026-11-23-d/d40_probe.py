"""D40/Dv24/bs24 on CUDA: the prefill kernel on variants of the same data (not yet run on a GPU).
Run from the project root: python benchmarks/results/gpu-tests-2026-11-23-d/d40_probe.py cuda"""
import sys, zlib, dataclasses
sys.path.insert(0, "tests")
import torch
import _loop as loop
from test_triton_paged_attention import Case, make_inputs, run_triton
from torch_paged_attn import lowering
from torch_paged_attn.lowering import reference
from torch_paged_attn.lowering.triton import paged_attention as tpa
from torch_paged_attn.testing import make_paged_batch

device = sys.argv[1]
tpa._num_sms = lambda d: 1
case = Case((12, 3), (30, 17), head_size=40, head_size_v=24, block_size=24, num_heads=6, num_kv_heads=2)
batch, options = make_inputs(case, device, zlib.crc32(case.id.encode()))


def check(name, b):
    cpu = dataclasses.replace(b, **{f: getattr(b, f).cpu() for f in ("query", "key_cache", "value_cache",
                                                                      "block_table", "seq_lens", "query_start_loc")})
    opts_cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in options.items()}
    truth = loop.paged_attention(*cpu.args(), **opts_cpu)[0].float()
    lowering._CHOICES.clear()
    out, lse = run_triton(b, options)
    d = torch.nan_to_num((out.float().cpu() - truth).abs(), nan=99.0)
    ref16 = reference.attention(*b.args(), **options)[0].float().cpu()
    dr = torch.nan_to_num((ref16 - truth).abs(), nan=99.0)
    bad = (d.amax(-1) > 0.05).nonzero()[:, 0].unique().tolist()
    print(f"{name:28s} triton err {d.max().item():.4f}  bf16-ref err {dr.max().item():.4f}  bad tokens {bad}", flush=True)


check("as in the test", batch)
vc = torch.full((*batch.value_cache.shape[:-1], 32), float("nan"), dtype=batch.value_cache.dtype, device=device)
vc[..., :24] = batch.value_cache
check("value cache row pitch 32", dataclasses.replace(batch, value_cache=vc[..., :24]))
kc = torch.full((*batch.key_cache.shape[:-1], 64), float("nan"), dtype=batch.key_cache.dtype, device=device)
kc[..., :40] = batch.key_cache
check("key cache row pitch 64", dataclasses.replace(batch, key_cache=kc[..., :40]))
check("no NaN in the caches", dataclasses.replace(batch, key_cache=torch.nan_to_num(batch.key_cache),
                                                  value_cache=torch.nan_to_num(batch.value_cache)))
bt = batch.block_table.clone()
bt[1, 1] = 5
check("no garbage block id", dataclasses.replace(batch, block_table=bt))
q2 = batch.query.clone()
check("query cloned", dataclasses.replace(batch, query=q2))
for seed in (1, 2):
    b = make_paged_batch([12, 3], [30, 17], num_heads=6, num_kv_heads=2, head_size=40, head_size_v=24,
                         block_size=24, dtype=torch.bfloat16, device=device, seed=seed)
    check(f"fresh data seed {seed}", b)
b = make_paged_batch([12], [30], num_heads=6, num_kv_heads=2, head_size=40, head_size_v=24,
                     block_size=24, dtype=torch.bfloat16, device=device, seed=3)
check("one sequence", b)
b = make_paged_batch([20], [20], num_heads=2, num_kv_heads=2, head_size=40, head_size_v=24,
                     block_size=24, dtype=torch.bfloat16, device=device, seed=4)
check("one sequence MHA 20 tokens", b)
