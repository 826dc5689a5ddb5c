"""Host time of one eager call of each op, against a null kernel launch.

    python benchmarks/overhead.py [--calls 1000] [--out DIR]
    python benchmarks/overhead.py --device cpu --quick          # smoke run, no GPU
    python benchmarks/overhead.py --rows "paged_attention;paged_attention_out"   # those rows only

Every op runs on the smallest inputs of its kind (one token, one block), so the GPU finishes each
kernel long before the host has issued the next call, and the time per call is the host's:

    call us    perf_counter around one call with the GPU idle (synchronised before it; median of
               ``--calls`` calls): the host wall time of one eager call, as FlashInfer's run() is
               measured (``--null-launch``: the package's host code alone)
    host us    perf_counter over 100 calls issued while the GPU is held busy by a sleep kernel
               (nothing waits on the device: the Python, dispatch and launch cost alone)
    events us  CUDA events around ``--calls`` back-to-back calls, divided by their number
               (= host time per call whenever the kernels are shorter than the host work: the
               end-to-end figure of a stream of eager calls)
    wall us    perf_counter over ``--calls`` calls plus the final synchronisation

``paged_attention_out`` passes an lse (pinned with it since the eighteenth run);
``paged_attention_out (no lse)`` leaves it out. Rows besides the public functions: ``... via torch.ops`` calls the
registered op through the dispatcher (``torch.ops.paged_attn.<op>``: what torch.compile, export and
modes see; the public functions skip it on plain eager calls, ``ops/_library.declare``), so the
difference is the custom-op dispatcher's own cost; and, when FlashInfer imports (CUDA), ``flashinfer decode run()``
(CUDA cores and tensor cores, planned once outside the timing, on the same one-token inputs) and
``flashinfer merge_state``, measured the same way; and, when FlashAttention-4 imports (CUDA),
``paged_attention (flash backend)`` (the public op under ``backend("flash")``, set once outside
the timing) beside ``flash_attn_4 direct`` (``flash_attn.cute.flash_attn_varlen_func`` on the
same decode inputs): the host cost the ``flash`` backend adds to FlashAttention-4's own.

The baselines are a null Triton kernel (an empty @triton.jit function) launched by
``kernel[grid]`` (Triton's ``JITFunction.run``) and by the package's cached launcher
(``lowering/triton/_launch.py``), and a one-element ``torch.add_``; ``over null us`` is an op's
events figure minus the cached null launch's. Every op is measured twice in the same run: as
shipped, and with ``TORCH_PAGED_ATTN_FAST_LAUNCH=0`` (columns ``... slow``: every launch through
``kernel[grid]``). Medians of 5 repetitions. JSON rows go to ``<out>/overhead-<gpu>-<date>.json``.

``--null-launch`` (any device, CPU included) measures the package's host code alone: the ops take
the Triton backend's host path (validation, planning, argument building, the cached launcher's key
and lookup) with every kernel binary replaced by a no-op, on CPU tensors when ``--device cpu``;
``wall us`` is then the whole figure. What it leaves out is Triton's C launcher and the driver.
With ``--triton-launcher`` (Triton 3.6) each binary's launcher is Triton's own Python
``CudaLauncher`` around the no-op, so the figure also counts whatever of Triton's Python a
cached launch still goes through (``_launch.FastLauncher._plain_entry``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import statistics
import sys
import time
import types
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the harness, and the checkout (also when not pip-installed)
import _harness as H  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402

RESULTS = os.path.join(HERE, "results")
# A sleep this long (cycles, ~20 ms at 1.7 GHz) outlasts the issue of 100 calls of any op here.
SLEEP_CYCLES = 35_000_000


def null_kernel(cached: bool = False) -> Callable[[], Any]:
    """A launch of an empty Triton kernel (grid 1) by ``kernel[grid]`` or (``cached``) by the
    package's launch helper, as the ops launch; an exception when Triton is unusable."""
    import triton

    from torch_paged_attn.lowering.triton._launch import launch

    @triton.jit
    def _null(x_ptr):
        pass

    x = torch.empty(1, device="cuda")
    if cached:
        return lambda: launch(_null, (1,), x)(x_ptr=x)
    return lambda: _null[(1,)](x)


@contextlib.contextmanager
def _env(name: str, value: str | None):
    previous = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextlib.contextmanager
def null_launch(triton_launcher: bool = False):
    """Route every op to the Triton backend's host code, whatever the device, with each kernel
    binary a no-op (``--null-launch``): validation, planning, argument building and the cached
    launcher (``lowering/triton/_launch.py``: its per-call key and cache lookup) run as on a GPU,
    and the call stops where the binary's C launcher would be called. ``triton_launcher``: each
    binary's ``run`` is Triton 3.6's ``CudaLauncher`` around the no-op (``_cuda_launcher``), as a
    compiled binary's is. Restored on exit."""
    from triton.runtime.jit import JITFunction

    from torch_paged_attn import lowering
    from torch_paged_attn.lowering.triton import _launch

    binary_calls = [0]  # yielded: how many times a stand-in binary was launched
    kernels: set[str] = set()  # the kernels given a stand-in binary (the rows' notes name them)

    def no_binary(kernel: str, *arguments) -> None:
        binary_calls[0] += 1
        kernels.add(kernel)

    class StandIn(_launch.FastLauncher):
        """A cached launcher whose every new key gets a binary that does nothing."""

        def _miss(self, grid, kwargs):
            binary = functools.partial(no_binary, self.kernel.fn.__name__)
            if triton_launcher:
                run = _cuda_launcher(binary)
                entry = (run, None, None, types.SimpleNamespace(run=run, function=None, packed_metadata=None))
            else:
                entry = (binary, None, None, None)
            self.cache[self.current_device(), self._key(kwargs)] = entry

        def _plain_entry(self, entry):
            # a planned launch: the stand-in binary as its C launcher (13 leading arguments, launch
            # flags False), as _plain_entry makes it of a real binary's CudaLauncher
            if triton_launcher:
                return super()._plain_entry(entry)
            return (entry[0], None, None, None, False, False)

        def _descriptor_entry(self, entry, descriptors, tensors):
            # a Gluon kernel's launch with pre-encoded descriptors: the stand-in binary as its C
            # launcher, each descriptor "encoded" as [an object, *shape, *strides] (no driver to
            # encode with here; the real encoding too runs once per cache address)
            caches = tuple(_launch.DescriptorCache.of(descriptors[p.name], tensors[p.name].dtype, {}, stand_in_encode)
                           for p in self.params if p.name in descriptors)
            binary = entry[0].launch if triton_launcher else entry[0]
            return (binary, None, None, None, False, False, *caches)

    def stand_in_encode(desc, meta) -> list:
        return [object(), *desc.shape, *desc.strides]

    stand_ins: dict[int, StandIn] = {}

    def fast_launcher(kernel):
        fast = stand_ins.get(id(kernel))
        if fast is None:  # JITFunction(kernel.fn): the interpreter's kernels have no parameter list
            jit = kernel if type(kernel) is JITFunction else JITFunction(kernel.fn)
            fast = stand_ins[id(kernel)] = StandIn(jit, current_device=lambda: 0, current_stream=lambda device: 0)
        return fast

    def open_on_any_device(like) -> str | None:  # _launch._cached_path_open without its CUDA test
        return _launch._untraced_mode() if type(like) is torch.Tensor else None

    saved = lowering._choose, _launch._fast_launcher, _launch._cached_path_open
    lowering._choose = lambda op, facts: saved[0](op, {**facts, "device": "cuda"})
    _launch._fast_launcher, _launch._cached_path_open = fast_launcher, open_on_any_device
    # the Gluon sm_90 MLA kernel's host path too (its device test passed, and 132 SMs to split
    # over, as on an H100), where this Triton has Gluon
    gluon = _gluon_mla_module()
    if gluon is not None:
        from torch_paged_attn.lowering.triton import paged_attention

        saved_gluon = gluon.declines, paged_attention._num_sms
        gluon.declines = lambda q_latent, q_rope, kv_cache: None
        paged_attention._num_sms = lambda device: 132 if device.type != "cuda" else saved_gluon[1](device)
    lowering._CHOICES.clear()
    try:
        yield binary_calls, kernels
    finally:
        lowering._choose, _launch._fast_launcher, _launch._cached_path_open = saved
        if gluon is not None:
            gluon.declines, paged_attention._num_sms = saved_gluon
        lowering._CHOICES.clear()


def _triton_36() -> bool:
    import triton

    return triton.__version__.startswith("3.6.")


def _cuda_launcher(binary: Callable) -> Any:
    """Triton 3.6's ``CudaLauncher`` (backends/nvidia/driver.py) with ``binary`` as its C launcher,
    no scratch memory and no launch flags, as ``CompiledKernel.run`` is for a compiled binary."""
    from triton.backends.nvidia import driver

    run = driver.CudaLauncher.__new__(driver.CudaLauncher)
    run.num_ctas, run.launch = 1, binary
    run.global_scratch_size = run.profile_scratch_size = 0
    run.global_scratch_align = run.profile_scratch_align = 1
    run.launch_cooperative_grid = run.launch_pdl = False
    return run


def _gluon_mla_module():
    """``lowering.triton.mla_sm90`` where this Triton has Gluon, else None."""
    from torch_paged_attn.lowering.triton import _sm90, mla_sm90

    return mla_sm90 if _sm90.gl is not None else None


def _decode_inputs(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The decode rows' inputs, one token over one 16-key block, Hq 32 / Hkv 8, D 128, bf16:
    ``(query [1, Hq, D], key_cache, value_cache [2, 16, Hkv, D], block_table [[0]], seq_lens [16],
    query_start_loc [0, 1])``."""
    dt, Hq, Hkv, D, BS = torch.bfloat16, 32, 8, 128, 16
    q = torch.randn(1, Hq, D, device=device, dtype=dt)
    kc, vc = (torch.randn(2, BS, Hkv, D, device=device, dtype=dt) for _ in range(2))
    i32 = dict(dtype=torch.int32, device=device)
    return q, kc, vc, torch.zeros(1, 1, **i32), torch.tensor([BS], **i32), torch.tensor([0, 1], **i32)


def op_calls(device: torch.device) -> dict[str, Callable[[], Any]]:
    """One smallest call of each public op (decode of one token over one block, one-token writes)."""
    dt, Hq, Hkv, D, BS = torch.bfloat16, 32, 8, 128, 16
    L, R, W = 512, 64, 576  # MLA latent, rope, cache row

    def t(*shape, dtype=dt):
        return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)

    def i32(*values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    q, kc, vc, table, lens, qsl = _decode_inputs(device)
    out, lse = torch.empty(1, Hq, D, device=device, dtype=dt), torch.empty(1, Hq, device=device)
    k, v, slots = t(1, Hkv, D), t(1, Hkv, D), torch.tensor([3], device=device)
    po, so, pl, sl = t(1, Hq, D), t(1, Hq, D), t(1, Hq, dtype=torch.float32), t(1, Hq, dtype=torch.float32)
    ql, qr, mla_cache = t(1, 16, L), t(1, 16, R), t(2, BS, W)
    # B1 x 32768 keys, 128 heads, block size 64 (the Gluon sm_90 kernel's eager case in
    # benchmarks/RESULTS.md, split 132 ways on an H100): the table's width decides the plan,
    # its two blocks' contents nothing
    gl_l, gl_r = t(1, 128, L), t(1, 128, R)
    gl_cache, gl_table = torch.zeros(2, 64, W, device=device, dtype=dt), torch.zeros(1, 512, dtype=torch.int32,
                                                                                     device=device)
    kv_c, k_pe, gathered = t(1, L), t(1, R), torch.empty(BS, W, device=device, dtype=dt)
    cu = i32(0, BS)
    scale = 1.0 / math.sqrt(D)
    ops = torch.ops.paged_attn
    return {
        "paged_attention": lambda: tpa.paged_attention(q, kc, vc, table, lens, qsl, scale=scale, max_query_len=1),
        "paged_attention via torch.ops": lambda: ops.paged_attention(
            q, kc, vc, table, lens, qsl, scale=scale, max_query_len=1
        ),
        "paged_attention_out": lambda: tpa.paged_attention_out(
            q, kc, vc, table, lens, qsl, out, lse, scale=scale, max_query_len=1
        ),
        # without the lse (the pinned launch serves both, lowering/triton/_native.py)
        "paged_attention_out (no lse)": lambda: tpa.paged_attention_out(
            q, kc, vc, table, lens, qsl, out, None, scale=scale, max_query_len=1
        ),
        "paged_attention_out via torch.ops": lambda: ops.paged_attention_out(
            q, kc, vc, table, lens, qsl, out, lse, scale=scale, max_query_len=1
        ),
        "reshape_and_cache": lambda: tpa.reshape_and_cache(k, v, kc, vc, slots),
        "merge_attn_states": lambda: tpa.merge_attn_states(po, pl, so, sl),
        "merge_attn_states_out": lambda: tpa.merge_attn_states_out(po, pl, so, sl, out, lse),
        "mla_decode": lambda: tpa.mla_decode(ql, qr, mla_cache, table, lens, qsl, scale=0.07),
        "mla_decode B1x32768 H128": lambda: tpa.mla_decode(gl_l, gl_r, gl_cache, gl_table, lens, qsl, scale=0.07),
        "concat_and_cache_mla": lambda: tpa.concat_and_cache_mla(kv_c, k_pe, mla_cache, slots),
        "gather_cache": lambda: tpa.gather_cache(mla_cache, table, cu, None, gathered),
    }


def flashinfer_calls(device: torch.device) -> dict[str, Callable[[], Callable[[], Any]]]:
    """FlashInfer's decode ``run()`` (CUDA cores, tensor cores) and ``merge_state`` on the inputs
    of ``op_calls`` (one token over one 16-key block, Hq 32 / Hkv 8, D 128, bf16), each wrapper
    planned once before timing, as a FlashInfer user calls them; factories (FlashInfer JIT-compiles
    at the first plan), an exception when FlashInfer does not import."""
    import flashinfer

    dt, Hq, Hkv, D, BS = torch.bfloat16, 32, 8, 128, 16
    q, kc, vc = _decode_inputs(device)[:3]
    po, so = (torch.randn(1, Hq, D, device=device, dtype=dt) for _ in range(2))
    pl, sl = (torch.randn(1, Hq, device=device) for _ in range(2))

    def decode(tensor_cores: bool) -> Callable[[], Any]:
        ws = torch.zeros(128 * 2**20, dtype=torch.uint8, device=device)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
        i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731  (plan takes host tensors)
        w.plan(i32(0, 1), i32(0), i32(BS), Hq, Hkv, D, BS, q_data_type=dt, kv_data_type=dt,
               sm_scale=1.0 / math.sqrt(D))
        return lambda: w.run(q, (kc, vc))

    return {
        "flashinfer decode run()": lambda: decode(False),
        "flashinfer decode run() (tensor cores)": lambda: decode(True),
        "flashinfer merge_state": lambda: (lambda: flashinfer.merge_state(po, pl, so, sl)),
    }


# rows measured with the flash backend set around them: op_calls' paged_attention call again
FLASH_BACKEND_ROWS = ("paged_attention (flash backend)",)


def flash_calls(device: torch.device) -> dict[str, Callable[[], Callable[[], Any]]]:
    """FlashAttention-4 called directly on the decode rows' inputs (``_decode_inputs``); factories;
    an exception when FlashAttention-4 does not import or the ``flash`` backend cannot run."""
    from flash_attn.cute import flash_attn_varlen_func

    from torch_paged_attn.lowering import flash

    missing = flash.available()
    if missing is not None:
        raise RuntimeError(missing)
    q, kc, vc, table, lens, qsl = _decode_inputs(device)
    return {
        "flash_attn_4 direct": lambda: (lambda: flash_attn_varlen_func(
            q, kc, vc, cu_seqlens_q=qsl, seqused_k=lens, max_seqlen_q=1, max_seqlen_k=kc.shape[1], page_table=table,
            softmax_scale=1.0 / math.sqrt(q.shape[-1]), causal=True)),
    }


def _median(f: Callable[[], float], reps: int) -> float:
    return statistics.median(f() for _ in range(reps))


def events_us(fn: Callable[[], Any], calls: int) -> float:
    """CUDA events around ``calls`` back-to-back calls of ``fn``, us a call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def host_us(fn: Callable[[], Any], device: torch.device, n: int = 100) -> float:
    """perf_counter over ``n`` calls of ``fn`` issued while a sleep kernel holds the GPU, us a call."""
    torch.cuda._sleep(SLEEP_CYCLES)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize(device)
    return elapsed * 1e6 / n


def interleaved(fns: dict[str, Callable[[], Any]], device: torch.device, rounds: int, calls: int,
                before: Callable[[str], None] = lambda name: None) -> dict[str, dict[str, list[float]]]:
    """Each row of ``fns`` timed once a round (``events_us`` over ``calls`` calls, then ``host_us``),
    the rows in turn, for ``rounds`` rounds, so that a slow stretch of the host lands on every row
    alike; ``before(name)`` runs before each row's timing. ``{row: {"events": [...], "host": [...]}}``."""
    got = {name: {"events": [], "host": []} for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            before(name)
            got[name]["events"].append(events_us(fn, calls))
            got[name]["host"].append(host_us(fn, device))
    return got


def print_interleaved(got: dict[str, dict[str, list[float]]], width: int = 28) -> None:
    """``interleaved``'s figures: per row and figure the median, quartiles and minimum over the
    rounds and the median of its paired difference to the first row's (the null launch), then each
    row's events figure round by round."""
    print(f"{'row':{width}s} {'figure':7s} {'median':>7s} {'q1':>6s} {'q3':>6s} {'min':>6s}  {'- null, paired median':>22s}")
    null = next(iter(got.values()))
    for name, figures in got.items():
        for fig in ("events", "host"):
            v = figures[fig]
            q1, _, q3 = statistics.quantiles(v, n=4)
            paired = statistics.median(a - b for a, b in zip(v, null[fig]))
            print(f"{name:{width}s} {fig:7s} {statistics.median(v):7.1f} {q1:6.1f} {q3:6.1f} {min(v):6.1f}  {paired:22.1f}")
    for name, figures in got.items():
        print(f"{name} events each round: " + " ".join(f"{x:.1f}" for x in figures["events"]))


def measure(fn: Callable[[], Any], device: torch.device, calls: int, reps: int) -> dict[str, float | None]:
    for _ in range(20):  # JIT compilation, allocator growth
        fn()
    H.synchronize(device)

    def wall() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        H.synchronize(device)
        return (time.perf_counter() - t0) * 1e6 / calls

    def call() -> float:  # one call, the GPU idle before it
        times = []
        for _ in range(calls):
            H.synchronize(device)
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
        return statistics.median(times) / 1e3

    result: dict[str, float | None] = {"call_us": _median(call, reps), "host_us": None, "events_us": None,
                                       "wall_us": _median(wall, reps)}
    if device.type != "cuda":
        return result

    result["events_us"] = _median(lambda: events_us(fn, calls), reps)
    if hasattr(torch.cuda, "_sleep"):  # private, present in every torch since 1.x
        result["host_us"] = _median(lambda: host_us(fn, device), reps)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=1000, help="calls per timed repetition")
    ap.add_argument("--quick", action="store_true", help="100 calls, 3 repetitions")
    ap.add_argument("--out", default=RESULTS, help="directory of the JSON results")
    ap.add_argument("--null-launch", action="store_true", help="package host code only: kernel binaries are no-ops")
    ap.add_argument("--triton-launcher", action="store_true",
                    help="with --null-launch: each no-op behind Triton 3.6's CudaLauncher")
    ap.add_argument("--rows", default="",
                    help="the rows to measure, by name, separated by ';' (default: every row)")
    args = ap.parse_args(argv)
    if args.triton_launcher and not (args.null_launch and _triton_36()):
        ap.error("--triton-launcher needs --null-launch and Triton 3.6 (its CudaLauncher)")
    device = H.resolve_device(args.device)
    calls, reps = (min(args.calls, 100), 3) if args.quick else (args.calls, 5)

    meta = H.device_info(device)
    meta["args"] = vars(args)
    path = H.json_path("overhead", meta, args.out)
    with (null_launch(args.triton_launcher) if args.null_launch
          else contextlib.nullcontext((None, None))) as (binary_calls, kernels):
        rows = _measure_all(args, device, calls, reps, binary_calls, kernels)
    null = next((r.extra.get("events_us") for r in rows if r.provider == "null kernel, cached launch"), None)
    for r in rows:
        if r.status == "ok" and null is not None and r.extra.get("events_us") is not None:
            r.extra["over_null_us"] = r.extra["events_us"] - null
    H.write_json(path, "overhead", rows, meta)
    _print(rows, meta, calls)
    print(f"\nJSON: {path}")
    return 0


def _raiser(reason: str) -> Callable[[], Callable[[], Any]]:
    def make():
        raise RuntimeError(reason)

    return make


def _measure_all(args, device: torch.device, calls: int, reps: int, binary_calls: list[int] | None,
                 kernels: set[str] | None) -> list[H.Row]:
    targets: dict[str, Callable[[], Callable[[], Any]]] = {}
    if device.type == "cuda" and not args.null_launch:
        targets["null triton kernel"] = null_kernel
        targets["null kernel, cached launch"] = lambda: null_kernel(cached=True)
        one = torch.zeros(1, device=device)
        targets["torch add_ (1 element)"] = lambda: (lambda: one.add_(1))
    ops = op_calls(device)
    targets.update({name: (lambda f=f: f) for name, f in ops.items()})
    if device.type == "cuda" and not args.null_launch:
        try:
            targets.update(flashinfer_calls(device))
        except Exception as e:  # not installed, or failing to load: one row says so
            H.progress(f"  flashinfer: {type(e).__name__}: {str(e)[:120]}")
            targets["flashinfer decode run()"] = _raiser(f"flashinfer not importable ({type(e).__name__}: {str(e)[:80]})")
        try:
            targets.update(flash_calls(device))
            targets[FLASH_BACKEND_ROWS[0]] = targets["paged_attention"]
        except Exception as e:  # FlashAttention-4 not installed or not loading: one row says so
            H.progress(f"  flash_attn_4: {type(e).__name__}: {str(e)[:120]}")
            targets["flash_attn_4 direct"] = _raiser(f"flash_attn.cute not importable ({type(e).__name__}: {str(e)[:80]})")

    if args.rows:
        wanted = [w.strip() for w in args.rows.split(";")]
        unknown = [w for w in wanted if w not in targets]
        if unknown:
            raise SystemExit(f"--rows: unknown row(s) {unknown}; rows here: {list(targets)}")
        targets = {name: make for name, make in targets.items() if name in wanted}
    rows: list[H.Row] = []
    for name, make in targets.items():
        H.progress(f"  {name}")
        row = H.Row(shape="1 token", provider=name, dtype="bfloat16")
        dead = H.cuda_alive(device)
        try:
            if dead:
                raise RuntimeError(dead)
            fn = make()
            note = ""
            backend = tpa.backend("flash") if name in FLASH_BACKEND_ROWS else contextlib.nullcontext()
            with backend:
                if name in ops or name in FLASH_BACKEND_ROWS:
                    from torch_paged_attn import lowering

                    lowering._CHOICES.clear()  # the note names the backend a fresh plan selects
                    note = H.backend_of(fn)[1]
                row.extra.update(measure(fn, device, calls, reps), note=note)
            if binary_calls is not None:  # --null-launch: kernels one call launches on the cached path
                binary_calls[0] = 0
                kernels.clear()
                fn()
                row.extra["cached_launches"] = binary_calls[0]
                row.extra["kernels"] = sorted(kernels)
                row.extra["note"] = "; ".join(x for x in (note, f"{binary_calls[0]} cached launch(es) a call",
                                                          "+".join(sorted(kernels))) if x)
            if name in ops and "torch.ops" not in name and device.type == "cuda" and not args.null_launch:
                with _env("TORCH_PAGED_ATTN_FAST_LAUNCH", "0"):
                    slow = measure(fn, device, calls, reps)
                row.extra.update({f"{k.removesuffix('_us')}_slow_us": v for k, v in slow.items()})
        except Exception as e:  # one op's failure never stops the run
            row.status, row.reason = "n/a", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        rows.append(row)
    return rows


def _print(rows: list[H.Row], meta: dict, calls: int) -> None:
    cols = ("call_us", "host_us", "events_us", "over_null_us", "wall_us", "host_slow_us", "events_slow_us")
    print(f"\neager overhead per call ({meta['gpu']}, {calls} calls, median of repetitions)")
    print(f"{'op':<40}" + "".join(f"{c.replace('_us', ' us').replace('_', ' '):>16}" for c in cols) + "  note")
    for r in rows:
        if r.status != "ok":
            print(f"{r.provider:<40}{'n/a':>16}  {r.reason}")
            continue
        cells = "".join(
            f"{r.extra[c]:>16.1f}" if r.extra.get(c) is not None else f"{'':>16}" for c in cols
        )
        print(f"{r.provider:<40}{cells}  {r.extra.get('note', '')}")


if __name__ == "__main__":
    sys.exit(main())
