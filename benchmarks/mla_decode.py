"""MLA decode against the copy bandwidth and the bf16 matmul rate: one command, one process.

    python benchmarks/mla_decode.py [--shapes B128,H128] [--quick] [--out DIR]
    python benchmarks/mla_decode.py --device cpu --tiny --quick      # smoke run, no GPU

Measures the device's copy bandwidth and its bf16 matmul rate first (8192^3 ``torch.matmul``,
median), then for each shape of the table (DeepSeek-V2/V3 decode: latent 512 + rope 64, bf16
queries, block 64, cache bf16 unless the name says fp8) times every contender:

    torch_paged_attn        this project (mla_decode: absorbed queries, one read of each cache row)
    torch_paged_attn[triton] the same with the Gluon sm_90 kernel switched off (``mla.SM90_GLUON``):
                            the Triton MLA kernel for every call
    flashinfer_mla          flashinfer.mla.BatchMLAPagedAttentionWrapper (FA3-style kernel on
                            Hopper; bf16 and fp8 e4m3 caches), planned outside timing, reading our
                            cache through [..., :L] / [..., L:] views
    gather+einsum           torch ops: gather every sequence's pages, scores by einsum, softmax,
                            einsum with the latent (padded batch, eager)
    flash_attn_4(qv)        flash_attn.cute.flash_attn_varlen_func with page_table and ``qv`` (the
                            latent query), where the installed FlashAttention-4 accepts it

and prints microseconds (p50, p20-p80) twice per contender on CUDA: CUDA-graph replays (the
provider's name) and eager calls with the L2 cache flushed before each (", eager"); GB/s and % of
the copy bandwidth on the cache bytes (``cache_bytes``: ``B * ctx * (L + R) * cache_bytes``, the
figure the targets use; queries and outputs, < 1 %, in ``extra``), and TFLOP/s with % of the
measured matmul rate (``mla_flops``). Targets on an H100 (issue 18): every shape >= 1.0x
FlashInfer, MTP >= 90 % and fp8 >= 85 % of copy (2 tokens on an fp8 cache and 4 tokens, two
programs a sequence: no target). A contender that cannot run prints n/a with the
reason. Every output is checked against an fp32 gather of two sequences (``max_err``),
FlashInfer's also against ours (``max_err_vs_ours``); our rows carry ``vs_flashinfer``, our p50
over FlashInfer's of the same timing. Those two medians are timed one after the other, and the
GPU's clocks drift between them by about as much as the two differ on some shapes; so on CUDA
``torch_paged_attn`` and ``flashinfer_mla`` are also timed side by side in each timing, their
samples alternating (``_harness.bench_pair``): ``paired_vs_flashinfer`` on our row, the median
per-round ratio of our time over FlashInfer's (below 1: ours is faster) with its 20th-80th
percentiles, also in the row's note. JSON rows go to ``<out>/mla_decode-<gpu>-<date>.json``.
"""

from __future__ import annotations

import gc
import inspect
import math
import os
import sys
from dataclasses import dataclass, replace
from typing import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the harness, and the checkout (also when not pip-installed)
import _harness as H  # noqa: E402
from paged_attention import Contender, Unavailable, _max_err, _reason, gluon_kernel_context  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402

RESULTS = os.path.join(HERE, "results")
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Shape:
    """``batch`` sequences of ``seq_len`` visible keys; the last ``q_len`` tokens of each query."""

    name: str
    batch: int
    seq_len: int
    num_heads: int
    q_len: int = 1
    latent: int = 512
    rope: int = 64
    block_size: int = 64
    cache_dtype: torch.dtype = torch.bfloat16
    dtype: torch.dtype = torch.bfloat16


SHAPES = [
    Shape("B128_ctx4096_H16", 128, 4096, 16),
    Shape("B32_ctx8192_H16", 32, 8192, 16),
    Shape("B64_ctx4096_H128", 64, 4096, 128),
    Shape("B1_ctx32768_H128", 1, 32768, 128),
    Shape("mtp2_B64_ctx4096_H16", 64, 4096, 16, q_len=2),
    Shape("mtp4_B32_ctx4096_H16", 32, 4096, 16, q_len=4),
    Shape("fp8_B128_ctx4096_H16", 128, 4096, 16, cache_dtype=FP8),
    Shape("mtp2_fp8_B64_ctx4096_H16", 64, 4096, 16, q_len=2, cache_dtype=FP8),
]


def tiny(s: Shape) -> Shape:
    """A stand-in of the same name and kind, small enough for the reference backend on a CPU."""
    return replace(s, batch=min(s.batch, 3), seq_len=max(s.seq_len // 128, 8), num_heads=4 if s.num_heads <= 16 else 8,
                   latent=64, rope=16, block_size=16)


def _esize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def cache_bytes(s: Shape) -> tuple[int, str]:
    """Every visible cache row read once: ``B * ctx * (L + R) * cache_bytes``."""
    c = _esize(s.cache_dtype)
    return s.batch * s.seq_len * (s.latent + s.rope) * c, f"{s.batch}*{s.seq_len}*({s.latent}+{s.rope})*{c}"


def mla_flops(s: Shape) -> int:
    """``2 * (L + R)`` (scores) + ``2 * L`` (latent output) per visible (query, key, head); query
    ``t`` of ``q_len`` sees ``ctx - q_len + t + 1`` keys."""
    pairs = s.batch * sum(s.seq_len - s.q_len + t + 1 for t in range(s.q_len))
    return pairs * s.num_heads * 2 * (2 * s.latent + s.rope)


@dataclass
class Inputs:
    q_latent: torch.Tensor  # [T, H, L]
    q_rope: torch.Tensor  # [T, H, R]
    kv_cache: torch.Tensor  # [NB, BS, L + R]
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_scale: torch.Tensor | None

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q_latent, self.q_rope, self.kv_cache, self.block_table, self.seq_lens, self.query_start_loc)


def make_inputs(s: Shape, device: torch.device, seed: int) -> Inputs:
    """A uniform batch whose blocks sit in shuffled order in a cache that holds exactly them."""
    blocks = math.ceil(s.seq_len / s.block_size)
    nb = s.batch * blocks
    g = torch.Generator(device=device).manual_seed(0)
    table = torch.randperm(nb, device=device, generator=g).view(s.batch, blocks).to(torch.int32)
    g.manual_seed(1 + seed)
    width = s.latent + s.rope
    cache = torch.randn(nb, s.block_size, width, device=device, dtype=s.dtype, generator=g).to(s.cache_dtype)
    T = s.batch * s.q_len
    return Inputs(
        q_latent=torch.randn(T, s.num_heads, s.latent, device=device, dtype=s.dtype, generator=g),
        q_rope=torch.randn(T, s.num_heads, s.rope, device=device, dtype=s.dtype, generator=g),
        kv_cache=cache,
        block_table=table,
        seq_lens=torch.full((s.batch,), s.seq_len, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(s.batch + 1, dtype=torch.int32, device=device) * s.q_len,
        kv_scale=torch.ones((), device=device) if s.cache_dtype == FP8 else None,
    )


def copy_bytes(s: Shape) -> int:
    """The bytes one call touches: the cache's (``cache_bytes``), the queries' and the output's."""
    return cache_bytes(s)[0] + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)


def input_copies(s: Shape, device: torch.device) -> list[Inputs]:
    """Enough copies of ``make_inputs`` (seeds 0, 1, ..) that rotating through them keeps every
    call's bytes out of the L2 (``_harness.rotations``)."""
    return [make_inputs(s, device, seed) for seed in range(H.rotations(copy_bytes(s), device))]


def _scale(s: Shape) -> float:
    return 1.0 / math.sqrt(s.latent // 4 + s.rope)  # DeepSeek: 1 / sqrt(qk_nope 128 + rope 64)


def _pages(s: Shape, x: Inputs, seqs: torch.Tensor | slice) -> torch.Tensor:
    """``[B', ctx, L + R]`` rows of the sequences ``seqs``, dequantised to the query dtype."""
    blocks = math.ceil(s.seq_len / s.block_size)
    rows = x.kv_cache[x.block_table[seqs, :blocks].long()]
    rows = rows.flatten(1, 2)[:, : s.seq_len]
    if x.kv_scale is not None:
        rows = rows.to(s.dtype) * x.kv_scale.to(s.dtype)
    return rows


def gather_einsum_call(s: Shape, x: Inputs, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Naive absorbed MLA: gather, einsum scores, softmax, einsum with the latent. ``[T, H, L]``."""
    dtype = dtype or s.dtype
    kv = _pages(s, x, slice(None)).to(dtype)  # [B, ctx, L + R]
    q = torch.cat([x.q_latent, x.q_rope], -1).to(dtype).view(s.batch, s.q_len, s.num_heads, -1)
    scores = torch.einsum("bqhd,bnd->bhqn", q, kv).float() * _scale(s)
    if s.q_len > 1:  # causal, bottom-right aligned
        pos = torch.arange(s.q_len, device=q.device)[:, None] + (s.seq_len - s.q_len)
        scores = scores.masked_fill(torch.arange(s.seq_len, device=q.device)[None, :] > pos, float("-inf"))
    p = scores.softmax(-1).to(dtype)
    out = torch.einsum("bhqn,bnl->bqhl", p, kv[..., : s.latent])
    return out.reshape(-1, s.num_heads, s.latent)


def ours(s: Shape, copies: list[Inputs], device: torch.device, gluon: bool | None = None) -> Contender:
    """This project's op; ``gluon``: the MLA kernel (``paged_attention.gluon_kernel_context``)."""
    kernel = gluon_kernel_context("mla", gluon)

    def make(x: Inputs):
        def run():
            with kernel():
                return tpa.mla_decode(*x.args(), scale=_scale(s), causal=True, kv_scale=x.kv_scale)[0]

        return run

    fns = [make(x) for x in copies]
    _, note = H.backend_of(fns[0])
    return Contender(fns, lambda out: out, note)


def gather_einsum(s: Shape, copies: list[Inputs], device: torch.device) -> Contender:
    return Contender([(lambda x=x: gather_einsum_call(s, x)) for x in copies], lambda out: out)


def flash_attn_4_qv(s: Shape, copies: list[Inputs], device: torch.device) -> Contender:
    if device.type != "cuda":
        raise Unavailable("needs CUDA")
    if s.cache_dtype != s.dtype:
        raise Unavailable("no fp8 KV cache in flash_attn.cute")
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as e:  # ImportError, or a CuTe DSL that fails to load
        raise Unavailable(f"flash_attn.cute not importable ({type(e).__name__}: {str(e)[:80]})") from e
    if "qv" not in inspect.signature(flash_attn_varlen_func).parameters:
        raise Unavailable("flash_attn.cute.flash_attn_varlen_func has no qv argument")

    def make(x: Inputs):
        # q = the rope query against k = the rope part; qv = the latent query against v = the latent
        k = x.kv_cache[..., s.latent :].unsqueeze(2)
        v = x.kv_cache[..., : s.latent].unsqueeze(2)

        def run():
            out = flash_attn_varlen_func(
                x.q_rope, k, v, qv=x.q_latent,
                cu_seqlens_q=x.query_start_loc, seqused_k=x.seq_lens,
                max_seqlen_q=s.q_len, max_seqlen_k=s.seq_len, page_table=x.block_table,
                softmax_scale=_scale(s), causal=True,
            )
            return out[0] if isinstance(out, tuple) else out

        return run

    return Contender([make(x) for x in copies], lambda out: out)


# FlashInfer's float workspace (split-KV partial outputs), the size its documentation suggests.
FLASHINFER_WORKSPACE_BYTES = 128 * 2**20


def flashinfer_mla(s: Shape, copies: list[Inputs], device: torch.device) -> Contender:
    """``flashinfer.mla.BatchMLAPagedAttentionWrapper``, planned once (outside timing) with the
    batch's CSR page metadata; ``run`` reads the latent and rope parts of our one cache as two
    strided views (``[..., :L]``, ``[..., L:]``), or, when the installed FlashInfer refuses views,
    separate contiguous caches copied from ours before timing (said in the note)."""
    if device.type != "cuda":
        raise Unavailable("needs CUDA")
    try:
        import flashinfer.mla as fi_mla
    except Exception as e:  # ImportError, or a JIT toolchain that fails to load
        raise Unavailable(f"flashinfer not importable ({type(e).__name__}: {str(e)[:80]})") from e
    x0 = copies[0]  # every copy has the same table and lengths (make_inputs): one plan serves all
    blocks = math.ceil(s.seq_len / s.block_size)
    kv_indptr = torch.arange(s.batch + 1, dtype=torch.int32, device=device) * blocks
    kv_indices = x0.block_table[:, :blocks].reshape(-1).contiguous()
    options = dict(num_heads=s.num_heads, head_dim_ckv=s.latent, head_dim_kpe=s.rope, page_size=s.block_size,
                   causal=True, sm_scale=_scale(s), q_data_type=s.dtype, kv_data_type=s.cache_dtype)
    wrapper = fi_mla.BatchMLAPagedAttentionWrapper(
        torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device))
    csr = (x0.query_start_loc, kv_indptr, kv_indices, x0.seq_lens)
    metadata = getattr(fi_mla, "MLAPlanMetadata", None)
    if metadata is not None:  # 0.7 and later: metadata object, declared split layouts
        wrapper.plan(metadata=metadata.csr(*csr), query_layout="split", kv_cache_layout="split", **options)
    else:  # earlier releases: flat CSR arguments, split tensors
        wrapper.plan(*csr, **options)
    backend = getattr(wrapper, "_planned_backend_name", None) or getattr(wrapper, "_backend", "")
    scales = {}
    if x0.kv_scale is not None:  # per-tensor scale, read on the host once (outside timing)
        scales = dict(ckv_scale=float(x0.kv_scale), kpe_scale=float(x0.kv_scale))

    def make(x: Inputs, ckv: torch.Tensor, kpe: torch.Tensor):
        out = torch.empty_like(x.q_latent)
        if metadata is not None:
            return lambda: wrapper.run(query=(x.q_latent, x.q_rope), kv_cache=(ckv, kpe), out=out, **scales)
        return lambda: wrapper.run(x.q_latent, x.q_rope, ckv, kpe, out=out, **scales)

    def views(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
        return x.kv_cache[..., : s.latent], x.kv_cache[..., s.latent :]

    note = f"flashinfer {H.package_version('flashinfer', 'flashinfer-python')}, backend {backend}"
    try:  # the first call compiles (JIT, about a minute) and tells whether views are accepted
        make(x0, *views(x0))()
        torch.cuda.synchronize(device)
        fns = [make(x, *views(x)) for x in copies]
        note += ", strided views of our cache"
    except Exception as e:
        refused = _reason(e)
        split = [tuple(v.contiguous() for v in views(x)) for x in copies]
        fns = [make(x, ckv, kpe) for x, (ckv, kpe) in zip(copies, split)]
        note += f", separate caches copied from ours (views refused: {refused[:60]})"
    return Contender(fns, lambda out: out, note)


CONTENDERS: dict[str, Callable[[Shape, list[Inputs], torch.device], Contender]] = {
    "torch_paged_attn": ours,
    "torch_paged_attn[triton]": lambda s, c, d: ours(s, c, d, gluon=False),
    "flashinfer_mla": flashinfer_mla,
    "gather+einsum": gather_einsum,
    "flash_attn_4(qv)": flash_attn_4_qv,
}
# Timings of each contender, each its own row: CUDA-graph replays (the provider's name; host launch
# cost out, as in a serving engine) and, with ", eager" appended, plain calls timed by CUDA events
# with the L2 cache flushed (256 MiB memset) before each. CPU smoke runs: wall time, one row.
TIMINGS = (("", True), (", eager", False))


def matmul_rate(device: torch.device, quick: bool) -> tuple[float, H.Timing]:
    """TFLOP/s of one square matmul (bf16 8192^3 on CUDA; fp32 256^3 on a CPU smoke run)."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (256, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    t = H.bench([lambda: torch.matmul(a, b, out=out)], device, quick=quick)
    del a, b, out
    return 2 * n**3 / (t.p50_us * 1e-6) / 1e12, t


def _ratios(rows: list[H.Row]) -> None:
    """``extra["vs_flashinfer"]`` on our rows: our p50 over FlashInfer's of the same timing
    (graph replays against graph replays, eager against eager); < 1 means faster."""
    theirs = {r.provider[len("flashinfer_mla"):]: r.p50_us for r in rows
              if r.status == "ok" and r.provider.startswith("flashinfer_mla")}
    for r in rows:
        suffix = r.provider[len("torch_paged_attn"):]
        if r.status == "ok" and r.provider.startswith("torch_paged_attn") and theirs.get(suffix):
            r.extra["vs_flashinfer"] = r.p50_us / theirs[suffix]


def _paired(rows: list[H.Row], kept: dict[str, "Contender"], device: torch.device, quick: bool) -> None:
    """``torch_paged_attn`` and ``flashinfer_mla`` timed side by side in each timing
    (``_harness.bench_pair``): ``extra["paired_vs_flashinfer"]`` on our row of that timing (the
    median per-round ratio, ours over FlashInfer's, with its 20th-80th percentiles) and a note."""
    for suffix, use_graph in TIMINGS:
        ours = next((r for r in rows if r.provider == "torch_paged_attn" + suffix and r.status == "ok"), None)
        if ours is None or not any(r.provider == "flashinfer_mla" + suffix and r.status == "ok" for r in rows):
            continue
        H.progress(f"  paired{suffix or ' (graph)'}: torch_paged_attn vs flashinfer_mla")
        H.paired_into(ours, "paired_vs_flashinfer", "ours / FlashInfer", kept["flashinfer_mla"].fns,
                      kept["torch_paged_attn"].fns, device, quick=quick, use_graph=use_graph)


def run_shape(s: Shape, device: torch.device, copy_gbps: float, matmul_tflops: float, quick: bool,
              providers: list[str] | None) -> list[H.Row]:
    nbytes, formula = cache_bytes(s)
    flops = mla_flops(s)
    per_copy = copy_bytes(s)
    copies = input_copies(s, device)
    seqs = sorted({0, s.batch - 1})
    picked = [t for i in seqs for t in range(i * s.q_len, (i + 1) * s.q_len)]
    want = gather_einsum_call(s, copies[0], torch.float32)[picked]
    rows = []
    ours_out = None  # our first output, the FlashInfer rows' second check
    kept: dict[str, Contender] = {}  # the contenders of the paired timings (_paired)
    for name, build in CONTENDERS.items():
        if not H.selected(name, providers):
            continue

        def new_row(suffix: str) -> H.Row:
            row = H.Row(shape=s.name, provider=name + suffix, dtype=str(s.cache_dtype).replace("torch.", ""),
                        bytes=nbytes, bytes_formula=formula, flops=flops)
            row.extra.update(batch=s.batch, q_len=s.q_len, seq_len=s.seq_len, num_heads=s.num_heads,
                             latent=s.latent, rope=s.rope, block_size=s.block_size,
                             query_output_bytes=per_copy - nbytes)
            return row

        dead = H.cuda_alive(device)
        if dead:
            row = new_row("")
            row.status, row.reason = "n/a", dead
            rows.append(row)
            continue
        H.progress(f"  {s.name}: {name}")
        suffix = ""
        try:
            c = build(s, copies, device)
            got = c.tokens(c.fns[0]())[picked]
            notes = [c.note] if c.note else []
            err = _max_err(got, want)
            if not err < 0.05:  # bf16 outputs over 576-wide dot products: ~1e-2 when right
                notes.append(f"WRONG RESULT: max rel err {err:.2g}")
            checks = {"max_err": err}
            if name == "torch_paged_attn":
                ours_out = got
            elif name == "flashinfer_mla" and ours_out is not None:
                checks["max_err_vs_ours"] = _max_err(got, ours_out)
            for suffix, use_graph in TIMINGS if device.type == "cuda" else (("", True),):
                row = new_row(suffix)
                row.extra.update(checks)
                row.fill(H.bench(c.fns, device, quick=quick, use_graph=use_graph), copy_gbps)
                if row.tflops is not None and matmul_tflops > 0:
                    row.extra["pct_matmul"] = 100.0 * row.tflops / matmul_tflops
                row.extra["note"] = "; ".join(notes)
                rows.append(row)
            if device.type == "cuda" and name in ("torch_paged_attn", "flashinfer_mla"):
                kept[name] = c
        except Exception as e:  # one contender's failure never stops the run
            row = new_row(suffix)
            row.status, row.reason = "n/a", _reason(e)
            rows.append(row)
        c = None
    _ratios(rows)
    if len(kept) == 2:
        _paired(rows, kept, device, quick)
    kept.clear()
    del copies
    gc.collect()
    if device.type == "cuda" and H.cuda_alive(device) is None:
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args, device, shapes = H.parse_cli(
        __doc__.splitlines()[0], SHAPES, tiny, "H16,B1*", RESULTS, argv
    )

    meta = H.device_info(device)
    meta["flash_attn_4"] = H.package_version("flash_attn", "flash-attn-4") if device.type == "cuda" else None
    meta["flashinfer"] = H.package_version("flashinfer", "flashinfer-python") if device.type == "cuda" else None
    meta["args"] = vars(args)
    H.progress(f"device: {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}")
    copy_gbps, copy_t = H.copy_bandwidth(device, quick=args.quick)
    matmul_tflops, matmul_t = matmul_rate(device, args.quick)
    meta.update(copy_gbps=copy_gbps, copy_us=copy_t.p50_us, matmul_tflops=matmul_tflops, matmul_us=matmul_t.p50_us)
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s (read + write, median of {copy_t.samples})")
    print(f"matmul rate: {matmul_tflops:.1f} TFLOP/s ({'bf16 8192^3' if device.type == 'cuda' else 'fp32 256^3'})")
    path = H.json_path("mla_decode", meta, args.out)

    rows: list[H.Row] = []
    for s in shapes:
        H.progress(f"{s.name} ...")
        try:
            shape_rows = run_shape(s, device, copy_gbps, matmul_tflops, args.quick, H.split_patterns(args.providers))
        except Exception as e:  # building the inputs failed (out of memory, say): the run goes on
            shape_rows = [H.Row(shape=s.name, provider="*", dtype=str(s.cache_dtype).replace("torch.", ""),
                                status="n/a", reason=f"inputs: {_reason(e)}")]
        rows.extend(shape_rows)
        H.write_json(path, "mla_decode", rows, meta)
    H.print_table(rows, f"MLA decode ({meta['gpu']}, copy {copy_gbps:.0f} GB/s, matmul {matmul_tflops:.1f} TFLOP/s)")
    for r in rows:
        if r.status == "ok" and "pct_matmul" in r.extra:
            ratio, paired = r.extra.get("vs_flashinfer"), r.extra.get("paired_vs_flashinfer")
            vs = f"   ours / FlashInfer {ratio:.3f}x" if ratio is not None else ""
            vs += f" (paired {paired['ratio_p50']:.3f}x)" if paired else ""
            print(f"{r.shape:24s} {r.provider:26s} {r.extra['pct_matmul']:5.1f} % of matmul rate"
                  f"  {r.pct_copy or 0:5.1f} % of copy{vs}")
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
