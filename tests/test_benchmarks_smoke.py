"""The benchmark scripts on CPU with tiny stand-in shapes: they run end to end, every contender
either measures or says why not, and the JSON rows are well formed. Timing figures are not
checked (a CPU says nothing about a GPU); their presence and order are."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_paged_attn import lowering

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
# One shape of each kind and code path: decode (GQA, every contender), fp8 cache (contenders that
# decline it), chunked prefill (causal offset, flops), cache update, merge.
SMOKE_SHAPES = "decode_B64_ctx4096,decode_fp8*,chunked_prefill*,cache_update_T256,merge*"
ROW_KEYS = {
    "shape", "provider", "dtype", "status", "reason", "p20_us", "p50_us", "p80_us", "bytes",
    "bytes_formula", "gbps", "pct_copy", "flops", "tflops", "vs_fa4", "vs_flashinfer", "mode", "timing", "rotations",
    "calls_per_sample", "samples", "extra",
}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """One in-process run of ``paged_attention.py --device cpu --tiny --quick`` (a subprocess
    would pay the torch import again: half of this test's time)."""
    out = tmp_path_factory.mktemp("bench")
    argv = ["--device", "cpu", "--tiny", "--quick", "--shapes", SMOKE_SHAPES, "--out", str(out)]
    stdout, stderr = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: more threads only add synchronisation
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            assert _load("paged_attention").main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    files = list(out.glob("paged_attention-*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    doc["_stdout"], doc["_stderr"] = stdout.getvalue(), stderr.getvalue()
    return doc


def test_header(results):
    for key in ("gpu", "torch", "triton", "date", "copy_gbps", "rows"):
        assert key in results, key
    assert results["copy_gbps"] > 0
    assert results["torch"] == torch.__version__
    assert "copy bandwidth" in results["_stdout"]


def test_rows_cover_every_shape_and_contender(results):
    got = {(r["shape"], r["provider"]) for r in results["rows"]}
    attention = {"torch_paged_attn", "torch_paged_attn[flash]", "torch_paged_attn[auto]", "gather+sdpa",
                 "flex_attention(paged)", "flash_attn_4", "vllm_triton"}
    decode = {"torch_paged_attn[batch-inv]", "flashinfer(decode)", "flashinfer(decode,tc)"}
    expected = set()
    for shape in ("decode_B64_ctx4096", "decode_fp8_B64_ctx4096"):
        expected |= {(shape, p) for p in attention | decode}
    expected |= {("chunked_prefill_B4_q512_ctx4096", p)
                 for p in attention | {"flashinfer(prefill)", "torch_paged_attn[triton-prefill]"}}
    expected |= {("cache_update_T256", "torch_paged_attn"), ("cache_update_T256", "torch")}
    expected |= {("merge_T8192_H32_D128", p) for p in ("torch_paged_attn", "flashinfer", "torch")}
    assert got == expected
    assert len(got) == len(results["rows"])  # a CPU run has one timing mode: one row per contender
    for r in results["rows"]:  # a progress line per shape and contender on stderr
        assert f"{r['shape']}: {r['provider']}" in results["_stderr"]


def test_rows_well_formed(results):
    by = {(r["shape"], r["provider"]): r for r in results["rows"]}
    for r in results["rows"]:
        assert set(r) == ROW_KEYS, set(r) ^ ROW_KEYS
        assert r["bytes"] > 0 and r["bytes_formula"]
        if r["status"] != "ok":
            assert r["status"] == "n/a" and r["reason"], r
            continue
        assert 0 < r["p20_us"] <= r["p50_us"] <= r["p80_us"], r
        assert math.isclose(r["gbps"], r["bytes"] / r["p50_us"] / 1e3, rel_tol=1e-9)
        assert math.isclose(r["pct_copy"], 100 * r["gbps"] / results["copy_gbps"], rel_tol=1e-9)
        assert r["timing"] == "wall" and r["samples"] == 5
        assert r["extra"]["max_err"] < 0.05, r  # every contender computes the same attention
        if r["extra"]["kind"] == "prefill":
            assert r["flops"] > 0 and r["tflops"] > 0
    # contenders that cannot run here, and why
    assert by[("decode_B64_ctx4096", "flash_attn_4")]["reason"] == "needs CUDA"
    for shape, p in (("decode_B64_ctx4096", "flashinfer(decode,tc)"), ("merge_T8192_H32_D128", "flashinfer"),
                     ("chunked_prefill_B4_q512_ctx4096", "flashinfer(prefill)")):
        assert by[(shape, p)]["reason"] == "needs CUDA"  # checked before FlashInfer is imported
    assert all(r["mode"] == "" and r["vs_flashinfer"] is None for r in results["rows"])
    assert "fp8" in by[("decode_fp8_B64_ctx4096", "flex_attention(paged)")]["reason"]
    assert by[("decode_B64_ctx4096", "flex_attention(paged)")]["status"] == "ok"
    # the "triton" setting on CPU tensors runs the kernels under the interpreter, else the reference
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    want = "backend: triton.paged_attention" if interpreting else "backend: reference"
    assert by[("decode_B64_ctx4096", "torch_paged_attn")]["extra"]["note"] == want


def test_byte_and_flop_formulas():
    pa = _load("paged_attention")
    s = pa.Shape("decode_B64_ctx4096", "decode", batch=64, seq_len=4096)
    nbytes, _ = pa.attention_bytes(s)
    assert nbytes == 64 * 4096 * 8 * 256 * 2 + 2 * 64 * 32 * 128 * 2
    fp8 = pa.Shape("x", "decode", batch=64, seq_len=4096, cache_dtype=torch.float8_e4m3fn)
    assert pa.attention_bytes(fp8)[0] == 64 * 4096 * 8 * 256 + 2 * 64 * 32 * 128 * 2
    prefill = pa.Shape("p", "prefill", batch=1, q_len=3, seq_len=5)  # rows see 3, 4, 5 keys
    assert pa.attention_flops(prefill) == (3 + 4 + 5) * 32 * 2 * 256
    assert pa.merge_bytes(pa.Shape("m", "merge", tokens=2, num_heads=3))[0] == 3 * 2 * 3 * (128 * 2 + 4)


def test_flashinfer_pages():
    """Our block table and lengths as FlashInfer's CSR page list: each sequence's used table
    entries in order, and the keys in its last page (empty and exact-multiple lengths included)."""
    pa = _load("paged_attention")
    from torch_paged_attn.testing import PagedBatch

    bs = 16
    lens = [0, 1, 15, 16, 17, 48]
    table = torch.randint(0, 1000, (len(lens), 4), dtype=torch.int32)  # garbage past the used part
    b = PagedBatch(query=None, key_cache=None, value_cache=None, block_table=table,
                   seq_lens=torch.tensor(lens, dtype=torch.int32), query_start_loc=None, k_scale=None,
                   v_scale=None, q_lens=[1] * len(lens), kv_lens=lens)
    indptr, indices, last = pa.flashinfer_pages(b, bs)
    assert indptr.tolist() == [0, 0, 1, 2, 3, 5, 8]
    for i, n in enumerate(lens):
        assert indices[indptr[i]:indptr[i + 1]].tolist() == table[i, : -(-n // bs)].tolist()
    assert last.tolist() == [0, 1, 15, 16, 1, 16]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_harness_helpers(tmp_path):
    H = _load("_harness")
    assert H.percentile([4.0, 1.0, 3.0, 2.0, 5.0], 50) == 3.0
    assert H.percentile([1.0, 2.0], 20) == pytest.approx(1.2)
    assert H.rotations(10, torch.device("cpu")) == 1
    t = H.Timing(1.0, 2.0, 4.0, "wall", 5, 1, 1)
    row = H.Row("s", "p", "bfloat16", bytes=2000, flops=4000).fill(t, copy_gbps=2.0)
    assert row.gbps == pytest.approx(1.0) and row.pct_copy == pytest.approx(50.0)
    assert row.tflops == pytest.approx(2e-3)  # 4000 flop in 2 us
    bad = H.Row("s", "q", "bfloat16", p50_us=float("nan"), extra={"x": float("inf")})
    meta = {"gpu": "Some GPU / 80GB"}
    path = H.json_path("bench", meta, str(tmp_path))
    assert os.path.basename(path).startswith("bench-Some-GPU-80GB-")
    H.write_json(path, "bench", [row, bad], meta)
    doc = json.loads(Path(path).read_text())  # strict JSON: NaN and inf became null
    assert doc["rows"][1]["p50_us"] is None and doc["rows"][1]["extra"]["x"] is None
    assert H.json_path("bench", meta, str(tmp_path)) != path  # a second run keeps the first


def test_overhead_cpu(tmp_path, capsys):
    overhead = _load("overhead")
    assert overhead.main(["--device", "cpu", "--quick", "--calls", "5", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("overhead-*.json")).read_text())
    ops = {r["provider"]: r for r in doc["rows"]}
    assert {"paged_attention", "paged_attention via torch.ops", "reshape_and_cache", "merge_attn_states"} <= set(ops)
    for r in ops.values():
        assert r["status"] == "ok", r
        assert r["extra"]["wall_us"] > 0 and r["extra"]["call_us"] > 0


def test_overhead_rows_cpu(tmp_path):
    """--rows measures the rows named (separated by ';') and nothing else; an unknown name stops
    the run with the names there are."""
    overhead = _load("overhead")
    argv = ["--device", "cpu", "--quick", "--calls", "5", "--null-launch", "--out", str(tmp_path)]
    assert overhead.main([*argv, "--rows", "paged_attention_out; mla_decode"]) == 0
    doc = json.loads(next(tmp_path.glob("overhead-*.json")).read_text())
    assert [r["provider"] for r in doc["rows"]] == ["paged_attention_out", "mla_decode"]
    with pytest.raises(SystemExit, match="unknown row.*'paged'.*'paged_attention'"):
        overhead.main([*argv, "--rows", "paged"])


def test_overhead_null_launch_cpu(tmp_path):
    """--null-launch times the Triton host path of every op with no-op kernel binaries, and puts
    the backend selection and the launch helpers back afterwards."""
    from torch_paged_attn import lowering
    from torch_paged_attn.lowering.triton import _launch

    saved = lowering._choose, _launch._fast_launcher, _launch._cached_path_open
    overhead = _load("overhead")
    assert overhead.main(["--device", "cpu", "--quick", "--calls", "5", "--null-launch", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("overhead-*.json")).read_text())
    for r in doc["rows"]:
        assert r["status"] == "ok" and "triton" in r["extra"]["note"], r
        assert r["extra"]["cached_launches"] >= 1, r  # the cached launcher ran, up to the binary
    assert (lowering._choose, _launch._fast_launcher, _launch._cached_path_open) == saved


def test_overhead_null_launch_behind_triton_launcher_cpu(tmp_path):
    """--null-launch --triton-launcher: each no-op binary behind Triton 3.6's CudaLauncher, whose
    C launcher the planned launches call (Triton 3.6 only)."""
    import triton

    if not triton.__version__.startswith("3.6."):
        pytest.skip("Triton 3.6's CudaLauncher only")
    overhead = _load("overhead")
    argv = ["--device", "cpu", "--quick", "--calls", "5", "--null-launch", "--triton-launcher", "--out", str(tmp_path)]
    assert overhead.main(argv) == 0
    doc = json.loads(next(tmp_path.glob("overhead-*.json")).read_text())
    for r in doc["rows"]:
        assert r["status"] == "ok" and r["extra"]["cached_launches"] >= 1, r


def test_plot(results, tmp_path):
    pytest.importorskip("matplotlib")
    plot = _load("plot")
    doc = {k: v for k, v in results.items() if not k.startswith("_")}
    assert set(plot.series(doc)) >= {"torch_paged_attn", "gather+sdpa", "torch_paged_attn fp8"}
    png = tmp_path / "plot.png"
    assert plot.plot(doc, str(png)) and png.stat().st_size > 0


def test_mla_decode_cpu(tmp_path):
    mla = _load("mla_decode")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        argv = ["--device", "cpu", "--tiny", "--quick", "--shapes", "B128*,mtp2*,fp8*", "--out", str(tmp_path)]
        assert mla.main(argv) == 0
    doc = json.loads(next(tmp_path.glob("mla_decode-*.json")).read_text())
    assert doc["copy_gbps"] > 0 and doc["matmul_tflops"] > 0
    for r in doc["rows"]:
        assert set(r) == ROW_KEYS, set(r) ^ ROW_KEYS
        if r["provider"] in ("flash_attn_4(qv)", "flashinfer_mla"):
            assert r["status"] == "n/a" and r["reason"] == "needs CUDA"
        else:
            assert r["status"] == "ok" and r["extra"]["max_err"] < 0.05 and r["tflops"] > 0, r
    # one row per contender and shape on a CPU (wall time; the GPU adds the ", eager" rows)
    providers = [r["provider"] for r in doc["rows"]]
    # B128_ctx4096_H16, mtp2_B64_ctx4096_H16, mtp2_fp8_B64_ctx4096_H16, fp8_B128_ctx4096_H16
    assert providers.count("torch_paged_attn") == 4 and providers.count("flashinfer_mla") == 4


def test_mla_decode_ratio_to_flashinfer():
    """Our rows get our p50 over FlashInfer's of the same timing (graph with graph, eager with eager)."""
    mla = _load("mla_decode")
    rows = [mla.H.Row(shape="s", provider=p, dtype="bfloat16", p50_us=us) for p, us in (
        ("torch_paged_attn", 30.0), ("torch_paged_attn, eager", 60.0),
        ("flashinfer_mla", 20.0), ("flashinfer_mla, eager", 40.0), ("gather+einsum", 90.0))]
    mla._ratios(rows)
    assert [r.extra.get("vs_flashinfer") for r in rows] == [1.5, 1.5, None, None, None]
    rows[2].status = "n/a"  # FlashInfer missing: no ratio for the graph row
    del rows[0].extra["vs_flashinfer"]
    mla._ratios(rows)
    assert "vs_flashinfer" not in rows[0].extra


def test_tune_cpu(tmp_path, monkeypatch):
    """Each candidate of a sweep is timed with its table entry in place and no plan remembered from
    an earlier candidate, and the table is restored."""
    tune = _load("tune")
    before = dict(tune.mla_kernel._CONFIGS), tune.attn_kernel._INVARIANT_SPLIT_TOKENS
    bench, plans_at_start = tune.H.bench, []

    def counting_bench(fns, *args, **kwargs):
        plans_at_start.append(len(lowering._CHOICES))
        return bench(fns, *args, **kwargs)

    monkeypatch.setattr(tune.H, "bench", counting_bench)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert tune.main(["--device", "cpu", "--tiny", "--sweeps", "mla_h16,invariant_B8", "--out", str(tmp_path)]) == 0
    assert (dict(tune.mla_kernel._CONFIGS), tune.attn_kernel._INVARIANT_SPLIT_TOKENS) == before
    n = len(tune.SWEEPS["mla_h16"].candidates) + len(tune.SWEEPS["invariant_B8"].candidates)
    assert len(plans_at_start) >= n and set(plans_at_start[-n:]) == {0}  # (the copy measurement first)
    doc = json.loads(next(tmp_path.glob("tune-*.json")).read_text())
    labels = [r["provider"] for r in doc["rows"]]
    want = [f"mla_h16 {c}" for c in tune.SWEEPS["mla_h16"].candidates]
    want += [f"invariant_B8 {c}" for c in tune.SWEEPS["invariant_B8"].candidates]
    assert labels == want
    assert all(r["status"] == "ok" and r["p50_us"] > 0 for r in doc["rows"])
    assert "mla_h16: B128_ctx4096_H16" in out.getvalue()


def test_tune_mla_candidates_plan_what_they_name(monkeypatch):
    """Every candidate of the MLA sweeps, set in place as ``tune.py`` sets it, plans its shape with
    the tile, score form and grid order its label names (meta tensors, the kernel launch recorded,
    not run), and the H128 sweeps time each grid order "heads" beside its "queries" twin."""
    tune = _load("tune")
    mla = tune.mla_kernel
    launched = []
    monkeypatch.setattr(mla, "launcher", lambda kernel, grid, **constants: lambda like, **tensors: (
        launched.append((grid, constants)) if kernel is mla._mla_kernel else None))
    meta, i32 = torch.device("meta"), dict(dtype=torch.int32, device="meta")
    for name, sweep in tune.SWEEPS.items():
        if sweep.table is not mla._CONFIGS and sweep.table is not mla._FP8_CONFIGS:
            continue
        s = next(s for s in tune.mla_bench.SHAPES if s.name == sweep.shape)
        t, blocks = s.batch * s.q_len, math.ceil(s.seq_len / s.block_size)
        for value in sweep.candidates:
            launched.clear()
            with tune._candidate(sweep, value):
                mla.mla_decode(
                    torch.empty(t, s.num_heads, s.latent, dtype=s.dtype, device=meta),
                    torch.empty(t, s.num_heads, s.rope, dtype=s.dtype, device=meta),
                    torch.empty(s.batch * blocks, s.block_size, s.latent + s.rope, dtype=s.cache_dtype, device=meta),
                    torch.empty(s.batch, blocks, **i32), torch.empty(s.batch, **i32), torch.empty(s.batch + 1, **i32),
                    torch.empty(t, s.num_heads, s.latent, dtype=s.dtype, device=meta), None,
                    scale=0.1, causal=True, kv_scale=torch.empty((), device=meta) if s.cache_dtype != s.dtype else None,
                    max_query_len=s.q_len,
                )
            [(grid, c)] = launched
            tile_n, warps, stages, _, scores, order = value
            assert (c["BLOCK_M"], c["TILE_N"], c["num_warps"], c["num_stages"], c["SCORES"]) == (
                sweep.key, tile_n, warps, stages, scores), (name, value)
            head_groups = math.ceil(s.num_heads / 64)
            assert c["HEAD_GROUP_FASTEST"] == (order == "heads") and grid[0 if order == "heads" else 1] == head_groups
    for name in ("mla_h128", "mla_b1_h128"):
        heads = [c for c in tune.SWEEPS[name].candidates if c[5] == "heads"]
        assert heads and all((*c[:5], "queries") in tune.SWEEPS[name].candidates for c in heads), name


def test_decode_step_cpu(tmp_path):
    step = _load("decode_step")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        argv = ["--device", "cpu", "--quick", "--layers", "1", "--batch", "1", "--modes", "eager", "captured step",
                "graph replay", "--out", str(tmp_path)]
        assert step.main(argv) == 0
    doc = json.loads(next(tmp_path.glob("decode_step-*.json")).read_text())
    rows = {r["provider"]: r for r in doc["rows"]}
    assert rows["eager"]["status"] == "ok" and rows["eager"]["p50_us"] > 0
    for mode in ("captured step", "graph replay"):
        assert rows[mode]["status"] == "n/a" and rows[mode]["reason"] == "needs CUDA"


def test_sass_report_cpu(tmp_path):
    """``sass_report.py`` compiles the launches the ops plan for an H100-sized GPU on a machine
    without one: B1 x 32768 decode plans split-KV (attention kernel, then the combine kernel), the
    attention kernel uses tensor cores and shared memory, and registers stay within the 255 a
    thread can hold."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists() or not (tools / "ptxas").exists():
        pytest.skip("this Triton build has no bundled ptxas / cuobjdump")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(BENCH / "sass_report.py"), "--shapes", "decode_B1_ctx32768", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(next(tmp_path.glob("sass-sm90-*.json")).read_text())["rows"]
    kernels = [r["label"].split()[1] for r in rows]
    assert kernels == ["_attention_kernel", "_combine_kernel"], rows
    attention = rows[0]
    assert 0 < attention["regs"] <= 255 and attention["smem"] > 0, attention
    assert attention["HMMA"] + attention["HGMMA"] > 0, attention
    assert "_attention_kernel" in result.stdout


def test_sass_report_compiles_the_gluon_kernels_cpu(tmp_path):
    """On sm_90 the 128-head MLA shape, the 2-token 16-head one and the causal prefill shape plan
    the Gluon kernels, and ``sass_report.py`` compiles them from their Gluon source with this
    machine's Triton (whose Gluon API may differ from the GPU host's): wgmma instructions, shared
    memory within the 227 KiB a block may have, the narrow kernel's fold as pairs of CTAs (its
    PTX rewritten)."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists() or not (tools / "ptxas").exists():
        pytest.skip("this Triton build has no bundled ptxas / cuobjdump")
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(BENCH / "sass_report.py"), "--shapes", "B64_ctx4096_H128,mtp2_B64_ctx4096_H16,prefill_B4_q2048",
         "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(next(tmp_path.glob("sass-sm90-*.json")).read_text())["rows"]
    by_kernel = {r["label"].split()[1]: r for r in rows}
    assert set(by_kernel) == {"_mla_sm90_kernel", "_mla_narrow_kernel", "_prefill_sm90_kernel"}, rows
    for name, row in by_kernel.items():
        assert "error" not in row, (name, row.get("error"))
        assert row["HGMMA"] > 0 and 0 < row["smem"] <= 232448, (name, row)
        assert row["pair"] == (name == "_mla_narrow_kernel"), (name, row)


def test_serving_cpu(tmp_path):
    """benchmarks/serving.py --tiny: every contender and scenario gives a row; the shared-prefix
    run computes the prefix once."""
    pytest.importorskip("transformers")
    serving = _load("serving")
    assert serving.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("serving-*.json")).read_text())
    rows = {(r["scenario"], r["contender"]): r for r in doc["rows"]}
    assert set(rows) == {("plain", "ours"), ("shared", "ours"), ("plain", "hf_cb"), ("shared", "hf_cb"),
                         ("plain", "static")}
    for (scenario, contender), r in rows.items():
        assert r["status"] == "ok" or (contender == "hf_cb" and r["reason"]), r
    plain, shared = rows[("plain", "ours")], rows[("shared", "ours")]
    assert plain["prompt_tokens_computed"] == plain["prompt_tokens"]
    prefix = doc["args"]["prefix_len"]
    assert shared["prompt_tokens_computed"] == shared["prompt_tokens"] - (doc["args"]["num_requests"] - 1) * prefix
    assert plain["output_tokens"] > 0 and plain["tokens_per_s"] > 0
    assert len(plain["earlier_passes_tokens_per_s"]) == doc["args"]["passes"] - 1 == 1  # the default: 2 passes
    assert (tmp_path / next(tmp_path.glob("serving-*.json")).name.replace(".json", ".txt")).exists()
