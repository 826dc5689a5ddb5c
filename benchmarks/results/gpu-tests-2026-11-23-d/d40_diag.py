"""The D40/Dv24/bs24 prefill case on CUDA, one path (argv[2]: ref, default, sm1, shared, shared_sm1) against the
float64 loop. Run from the project root: python benchmarks/results/gpu-tests-2026-11-23-d/d40_diag.py cuda sm1"""
import sys, zlib, dataclasses
sys.path.insert(0, "tests")
import torch
import _loop as loop
from test_triton_paged_attention import Case, make_inputs, run_triton
from torch_paged_attn import lowering
from torch_paged_attn.lowering import reference
from torch_paged_attn.lowering.triton import paged_attention as tpa, prefill

device, path = sys.argv[1], sys.argv[2]
import os
kw = dict(head_size=40, head_size_v=24, block_size=24, num_heads=6, num_kv_heads=2)
kw.update(eval(os.environ.get("OVERRIDE", "{}")))
case = Case((12, 3), (30, 17), **kw)
print("case", case.id)
batch, options = make_inputs(case, device, zlib.crc32(case.id.encode()))
print("bt", batch.block_table.tolist(), "sl", batch.seq_lens.tolist(), "qsl", batch.query_start_loc.tolist(),
      "k", tuple(batch.key_cache.shape), batch.key_cache.stride(), "v", tuple(batch.value_cache.shape))
cpu = dataclasses.replace(batch, **{f: getattr(batch, f).cpu() for f in ("query", "key_cache", "value_cache",
      "block_table", "seq_lens", "query_start_loc")})
opts_cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in options.items()}
truth = loop.paged_attention(*cpu.args(), **opts_cpu)
lowering._CHOICES.clear()
seen = []
real_config = prefill.config
prefill.config = lambda *a: seen.append(real_config(*a)) or seen[-1]
if path == "ref":
    res = reference.attention(batch.query.float(), *batch.args()[1:], **options)
elif path == "default":
    res = run_triton(batch, options)
elif path == "sm1":
    tpa._num_sms = lambda d: 1
    res = run_triton(batch, options)
elif path == "shared":
    prefill._CONFIGS.clear()
    res = run_triton(batch, options)
elif path == "shared_sm1":
    prefill._CONFIGS.clear()
    tpa._num_sms = lambda d: 1
    res = run_triton(batch, options)
torch.cuda.synchronize() if device == "cuda" else None
print(path, "prefill plans seen:", seen)
d = torch.nan_to_num((res[0].float().cpu() - truth[0].float()).abs(), nan=99.0)
i = d.argmax().item()
print(f"{path} {os.environ.get('OVERRIDE', '')} fast={os.environ.get('TORCH_PAGED_ATTN_FAST_LAUNCH', '1')}: out max err {d.max().item():.4f}")
print("bad (token, head):", (d.amax(-1) > 0.05).nonzero().tolist()[:8])
if res[1] is not None:
    dl = torch.nan_to_num((res[1].float().cpu() - truth[1].float()).abs(), nan=99.0)
    print(f"{path}: lse max err {dl.max().item():.4f}")
