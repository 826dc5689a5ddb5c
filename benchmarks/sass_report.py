"""Registers, spills, shared memory and MMA instructions of the Triton kernels as the ops launch
them on the benchmark shapes, compiled for a GPU architecture on any machine (no GPU needed).

    python benchmarks/sass_report.py [--shapes decode_B64,mtp2] [--sweeps mla_mtp] [--arch 90] [--out DIR]

Each shape of ``paged_attention.py`` (decode and prefill) and ``mla_decode.py`` is planned by the
op's own Triton lowering on meta tensors, with ``--sms`` streaming multiprocessors (132: H100 /
H200), and its launches are captured instead of run; for ``--arch 90`` the lowering plans the
Gluon sm_90 kernels (``prefill_sm90``, ``mla_sm90``, ``mla_sm90_narrow``) where it would on an sm_90 GPU, and those are
compiled from their Gluon source (their ``regs`` is the kernel's launch figure; each warpgroup's
own comes from ``setmaxnreg``, so spills are the column to read; their ``URundef`` also counts
uniform registers read after a predicated write, which the check does not follow through the
predicates: 21 such reads in the MLA kernel of main ef06909, correct on the GPU, 51 in its
successor, so for them it is a lead, not a verdict). Every captured launch is compiled by
Triton for ``sm_<arch>`` with the specialisation Triton's JIT gives those arguments (integers
equal to 1 become constants, multiples of 16 and tensors are marked 16-divisible, as for aligned
tensors), and the cubin is read with the ``cuobjdump`` bundled with Triton. Columns:

    regs      registers per thread            stack     stack frame bytes (spills live there)
    LDL/STL   local-memory loads / stores     smem      shared memory bytes (static + pipeline)
    HGMMA     wgmma instructions (Hopper)     HMMA      mma.sync instructions
    LDGSTS    cp.async instructions (loads that go to shared memory without registers)
    LDS8      byte-wide shared-memory loads (an fp8 tile read one element per instruction)
    instrs    SASS instructions in the kernel (all paths; a loop body counts once)
    loop      instructions of the shortest loop body that issues MMAs: the inner key loop, one
              key tile (the unmasked tiles' loop where a kernel has several); 0 if none
    URundef   instructions reading a uniform register no instruction wrote on some path
              (``sass_uniform_check.py``: a ptxas defect; must be 0)
    pair      1 where the binary launches as pairs of CTAs (``_cluster.rewrite`` ran on its PTX)

``--sweeps`` compiles every candidate of ``tune.py``'s sweeps on its shape instead. These are the
compiler's figures, not the hardware's: the Triton and ptxas of this machine decide them, which
may differ from the GPU machine's. JSON rows go to ``<out>/sass-sm<arch>-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("sass_report.py compiles kernels: run it with TRITON_INTERPRET unset")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import mla_decode as mla_bench  # noqa: E402
import paged_attention as attn_bench  # noqa: E402
import sass_uniform_check  # noqa: E402
import tune  # noqa: E402

from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import _sm90  # noqa: E402
from torch_paged_attn.lowering.triton import mla as mla_kernel  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90, prefill_sm90  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as attn_kernel  # noqa: E402
from torch_paged_attn.lowering.triton import prefill as prefill_kernel  # noqa: E402
from torch_paged_attn.lowering.triton._launch import _described, split_constants  # noqa: E402

META = torch.device("meta")
COLUMNS = ("regs", "stack", "LDL", "STL", "smem", "HGMMA", "HMMA", "LDGSTS", "LDS8", "instrs", "loop", "URundef")


@contextlib.contextmanager
def captured_launches(sms: int, arch: int = 90) -> Iterator[list]:
    """Inside the block the Triton lowerings plan as on a GPU of ``sms`` SMs and compute capability
    ``arch`` and record each launch as ``(kernel, kwargs)`` in the yielded list instead of running it."""
    launches: list = []
    # the Gluon kernels' plans launch through ``launcher`` too, their TMA descriptors as
    # ``_launch.descriptor`` constants whose bases the calls pass (made into the
    # ``TensorDescriptor`` that Triton specialises on here)
    modules = (attn_kernel, mla_kernel, prefill_sm90, mla_sm90)
    saved = ([m.launcher for m in modules], attn_kernel._num_sms, prefill_kernel._capability, _sm90.unavailable)
    prefill_kernel._capability = lambda device: divmod(arch, 10)

    def capture(kernel, grid, **constants):
        fixed, _, descriptors = split_constants(constants)
        return lambda like, **tensors: launches.append((kernel, {**_described(tensors, descriptors), **fixed}))

    for m in modules:
        m.launcher = capture
    # the Gluon kernels plan on the meta tensors as on an sm_90 GPU (a meta tensor is a plain
    # eager one, so their runners call the launch directly)
    _sm90.unavailable = lambda t, _real=saved[3]: None if arch == 90 and t.device.type == "meta" else _real(t)
    attn_kernel._num_sms = lambda device: sms
    lowering._CHOICES.clear()
    try:
        yield launches
    finally:
        for m, launcher in zip(modules, saved[0]):
            m.launcher = launcher
        attn_kernel._num_sms = saved[1]
        prefill_kernel._capability = saved[2]
        _sm90.unavailable = saved[3]
        lowering._CHOICES.clear()


def plan_attention(s) -> None:
    """The Triton paged attention lowering on meta tensors of benchmark shape ``s``."""
    blocks = math.ceil(s.seq_len / s.block_size)
    T, fp8 = s.batch * s.q_len, s.cache_dtype != s.dtype
    i32 = dict(dtype=torch.int32, device=META)
    cache = lambda: torch.empty(s.batch * blocks, s.block_size, s.num_kv_heads, s.head_size,  # noqa: E731
                                dtype=s.cache_dtype, device=META)
    scale = torch.empty((), device=META) if fp8 else None
    attn_kernel.paged_attention(
        torch.empty(T, s.num_heads, s.head_size, dtype=s.dtype, device=META), cache(), cache(),
        torch.empty(s.batch, blocks, **i32), torch.empty(s.batch, **i32), torch.empty(s.batch + 1, **i32),
        torch.empty(T, s.num_heads, s.head_size, dtype=s.dtype, device=META), None,
        scale=1.0 / math.sqrt(s.head_size), causal=True, window_left=-1, window_right=-1, softcap=0.0,
        alibi_slopes=None, sinks=None, k_scale=scale, v_scale=scale, attention_chunk_size=0,
        max_query_len=s.q_len,
    )


def plan_mla(s) -> None:
    """The Triton MLA decode lowering on meta tensors of benchmark shape ``s``."""
    blocks = math.ceil(s.seq_len / s.block_size)
    T, fp8 = s.batch * s.q_len, s.cache_dtype != s.dtype
    i32 = dict(dtype=torch.int32, device=META)
    mla_kernel.mla_decode(
        torch.empty(T, s.num_heads, s.latent, dtype=s.dtype, device=META),
        torch.empty(T, s.num_heads, s.rope, dtype=s.dtype, device=META),
        torch.empty(s.batch * blocks, s.block_size, s.latent + s.rope, dtype=s.cache_dtype, device=META),
        torch.empty(s.batch, blocks, **i32), torch.empty(s.batch, **i32), torch.empty(s.batch + 1, **i32),
        torch.empty(T, s.num_heads, s.latent, dtype=s.dtype, device=META),
        torch.empty(T, s.num_heads, dtype=torch.float32, device=META),
        scale=mla_bench._scale(s), causal=True, kv_scale=torch.empty((), device=META) if fp8 else None,
    )


def shapes() -> dict[str, tuple]:
    """Benchmark shape name -> (shape, planner), for the shapes with a Triton attention kernel."""
    out = {s.name: (s, plan_attention) for s in attn_bench.SHAPES if s.kind in ("decode", "prefill")}
    out.update({s.name: (s, plan_mla) for s in mla_bench.SHAPES})
    return out


def compile_for(kernel, kwargs: dict, arch: int):
    """One captured launch compiled by Triton for ``sm_<arch>`` with the specialisation Triton's
    JIT gives those arguments (the ``CompiledKernel``: ``.asm`` holds ttir, ttgir, llir, ptx, cubin)."""
    from triton._C.libtriton import native_specialize_impl

    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(kernel.params):
        value = kwargs[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[(i,)] = "constexpr", value
            continue
        kind, spec = native_specialize_impl(CUDABackend, value, False, not p.do_not_specialize,
                                            not p.do_not_specialize_on_alignment)
        signature[p.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = spec
        elif isinstance(spec, str) and spec:
            attrs[(i,)] = CUDABackend.parse_attr(spec)
    source = ASTSource
    if _is_gluon(kernel):
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(kernel, signature, constexprs, attrs),
                          target=GPUTarget("cuda", arch, 32), options=options)


def _is_gluon(kernel) -> bool:
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:  # pragma: no cover - depends on the installed Triton
        return False
    return isinstance(kernel, GluonJITFunction)


def cuobjdump(compiled, flag: str) -> str:
    """``cuobjdump <flag>`` (``-sass``, ``-res-usage``) of a compiled kernel's cubin, with the
    cuobjdump bundled with Triton."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def compile_launch(kernel, kwargs: dict, arch: int) -> dict:
    """Compile one captured launch for ``sm_<arch>`` as Triton's JIT would specialise it, and read
    the cubin's resource usage and instruction mix."""
    compiled = compile_for(kernel, kwargs, arch)
    usage, sass = cuobjdump(compiled, "-res-usage"), cuobjdump(compiled, "-sass")

    def count(pattern: str) -> int:
        return len(re.findall(pattern, sass))

    field = lambda name: int(re.search(rf"{name}:(\d+)", usage).group(1))  # noqa: E731
    # (address, instruction) pairs; a loop is a branch back to a lower address
    code = [(int(a, 16), text) for a, text in re.findall(r"(?m)^\s+/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    back = [(int(m.group(1), 16), addr) for addr, text in code
            if (m := re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)) and int(m.group(1), 16) < addr]
    loops = [[text for a, text in code if top <= a <= bottom] for top, bottom in back]
    mma_loops = [len(body) for body in loops if any(re.search(r"\bHG?MMA\.", t) for t in body)]
    return dict(regs=field("REG"), stack=field("STACK"), LDL=count(r"\bLDL\b"), STL=count(r"\bSTL\b"),
                smem=compiled.metadata.shared, HGMMA=count(r"\bHGMMA\."), HMMA=count(r"\bHMMA\."),
                LDGSTS=count(r"\bLDGSTS\b"), LDS8=count(r"\bLDS\.U8\b"),
                instrs=len(code), loop=min(mma_loops, default=0), URundef=len(sass_uniform_check.check(sass)),
                pair=int(".reqnctapercluster 2, 1, 1" in compiled.asm["ptx"]))


def report(name: str, s, plan, args) -> list[dict]:
    rows = []
    with captured_launches(args.sms, args.arch) as launches:
        plan(s)
    for kernel, kwargs in launches:
        label = f"{name} {kernel.__name__} (warps {kwargs.get('num_warps')}, stages {kwargs.get('num_stages')})"
        print(f"  {label}", file=sys.stderr, flush=True)
        try:
            rows.append(dict(shape=s.name, label=label, **compile_launch(kernel, kwargs, args.arch)))
        except Exception as e:  # noqa: BLE001 - a configuration the compiler refuses is a result
            rows.append(dict(shape=s.name, label=label, error=f"{type(e).__name__}: {str(e)[:200]}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="comma-separated shape names or substrings (default: all)")
    ap.add_argument("--sweeps", help=f"comma-separated tune.py sweeps instead of shapes: {', '.join(tune.SWEEPS)}")
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    ap.add_argument("--sms", type=int, default=132, help="SM count the split-KV plan assumes")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    known = shapes()
    rows: list[dict] = []
    if args.sweeps:
        for sweep_name in args.sweeps.split(","):
            sweep = tune.SWEEPS[sweep_name]
            s, plan = known[sweep.shape]
            for value in sweep.candidates:
                with tune._candidate(sweep, value):
                    rows += report(f"{sweep_name} {value}", s, plan, args)
    else:
        patterns = args.shapes.split(",") if args.shapes else None
        for name, (s, plan) in known.items():
            if patterns is None or any(p in name for p in patterns):
                rows += report(name, s, plan, args)
    print(f"\nTriton {triton.__version__}, sm_{args.arch}, {args.sms} SMs")
    print(f"{'launch':<78}" + "".join(f"{c:>8}" for c in COLUMNS))
    for r in rows:
        cells = r["error"] if "error" in r else "".join(f"{r[c]:>8}" for c in COLUMNS)
        print(f"{r['label']:<78}{cells}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"sass-sm{args.arch}-{datetime.date.today().isoformat()}.json")
    meta = dict(triton=triton.__version__, torch=torch.__version__, arch=args.arch, sms=args.sms, args=vars(args))
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
