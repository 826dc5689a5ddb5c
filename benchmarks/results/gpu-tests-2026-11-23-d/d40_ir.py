"""TTIR / TTGIR / LLIR / PTX / SASS of both Triton attention kernels for the D40/Dv24/bs24 prefill case
and its variants, compiled for sm_90 by the Triton on PYTHONPATH (no GPU):

    env -u TRITON_INTERPRET PYTHONPATH=/work/triton36:$PWD python benchmarks/results/gpu-tests-2026-11-23-d/d40_ir.py OUTDIR

Writes OUTDIR/<variant>-<kernel>.{ttir,ttgir,llir,ptx,sass} for the failing case (D40_Dv24) and the
passing variants (D40_Dv32, D40_Dv40, D32_Dv24)."""
import math, os, sys
sys.path[:0] = ["benchmarks", "tests"]
import torch
import sass_report
from torch_paged_attn.lowering.triton import paged_attention as tpa, prefill

META = torch.device("meta")
VARIANTS = {"D40_Dv24": (40, 24), "D40_Dv32": (40, 32), "D40_Dv40": (40, 40), "D32_Dv24": (32, 24)}


def plan(d, dv, shared):
    T, Hq, Hkv, bs, nb = 15, 6, 2, 24, 6
    k = torch.empty_strided((nb, bs, Hkv, d), (bs * Hkv * d, Hkv * d, d, 1), dtype=torch.bfloat16, device=META)
    v = torch.empty_strided((nb, bs, Hkv, dv), (bs * Hkv * dv, Hkv * dv, dv, 1), dtype=torch.bfloat16, device=META)
    i32 = dict(dtype=torch.int32, device=META)
    saved = dict(prefill._CONFIGS)
    if shared:
        prefill._CONFIGS.clear()
    try:
        tpa.paged_attention(torch.empty(T, Hq, d, dtype=torch.bfloat16, device=META), k, v,
                            torch.empty(2, 2, **i32), torch.empty(2, **i32), torch.empty(3, **i32),
                            torch.empty(T, Hq, dv, dtype=torch.bfloat16, device=META),
                            torch.empty(T, Hq, device=META), scale=1 / math.sqrt(d), causal=True,
                            window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None,
                            k_scale=None, v_scale=None, attention_chunk_size=0, max_query_len=-1)
    finally:
        prefill._CONFIGS.update(saved)


def compile_launch(kernel, kwargs, arch=90):
    return sass_report.compile_for(kernel, kwargs, arch)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, (d, dv) in VARIANTS.items():
        for shared in (False, True):
            with sass_report.captured_launches(sms=1) as launches:
                plan(d, dv, shared)
            for kernel, kwargs in launches:
                tag = f"{name}-{kernel.__name__}"
                consts = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
                print(tag, consts, flush=True)
                c = compile_launch(kernel, kwargs)
                for ext in ("ttir", "ttgir", "llir", "ptx"):
                    with open(os.path.join(out_dir, f"{tag}.{ext}"), "w") as f:
                        f.write(c.asm[ext])
                sass = sass_report.cuobjdump(c, "-sass")
                with open(os.path.join(out_dir, f"{tag}.sass"), "w") as f:
                    f.write(sass)
                print("  shared", c.metadata.shared, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
