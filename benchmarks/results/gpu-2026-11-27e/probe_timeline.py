"""Where a narrow MLA program's time goes, from inside: the package's ``mla_sm90_narrow`` built with
``%globaltimer`` stamps (``_STAMPS``' replacements) that each program stores at its entry, after
finding its query block, once its queries are in shared memory, when its first tile has landed,
after its key loop and at its end, with its SM (``%smid``) and its tile count (-1: an empty
program). Each shape's calls are captured back to back in one CUDA graph (inputs rotated as
``mla_probe`` rotates them) and replayed; the stamps read are the last call's, so every program
ran behind the previous call's kernels as in the benchmark. Prints the replay time a call, the
kernel's span (first entry to last end) and, over the working programs, the spread (min / median
/ max, µs) of each phase and of the entries' and ends' offsets within the span.

    python3 probe_timeline.py   # PROBE_SHAPES=name,...
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow  # noqa: E402

SLOTS = 8  # entry, found, queries, first tile, loop end, end, SM, tiles
MAX_PROGRAMS = 8192


def _stamps(addr: int) -> tuple:
    now = 'gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)'
    put = lambda k, v: f"gl.store(_tl + {k}, {v})"  # noqa: E731
    return (
        ("""        split = gl.program_id(2)
""", f"""        split = gl.program_id(2)
        _tl = ((split * gl.num_programs(0) + pid_q).to(gl.int64) * {SLOTS * 8} + {addr}).to(
            gl.pointer_type(gl.int64), bitcast=True)
        {put(0, now)}
        {put(6, 'gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1).to(gl.int64)')}
"""),
        ("""        if skip:
            return

        q_layout""", f"""        {put(1, now)}
        {put(7, "gl.where(skip, -1, n_tiles).to(gl.int64)")}
        if skip:
            return

        q_layout"""),
        ("""        # -- the query rows as the products' columns --
""", f"""        {put(2, now)}
        if n_tiles > 0:
            mbarrier.wait(ready.index(0), 0)
        {put(3, now)}
        # -- the query rows as the products' columns --
"""),
        ("""        if USE_PDL:  # the key loop is done: the kernel after it (a split call's combine) may launch
""", f"""        {put(4, now)}
        if USE_PDL:  # the key loop is done: the kernel after it (a split call's combine) may launch
"""),
        ("""               IS_FP8 and LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, WARPS)
""", f"""               IS_FP8 and LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, WARPS)
        {put(5, now)}
"""),
    )


def _spread(x: torch.Tensor) -> str:
    x = x.double().sort().values
    return f"{x[0]:7.2f} {x[len(x) // 2]:7.2f} {x[-1]:7.2f}"


def stamped_graph(s, device, stamped) -> tuple:
    """``(graph, calls)``: shape ``s``'s calls (inputs rotated as ``mla_probe`` rotates them) on the
    ``stamped`` narrow-kernel module, captured back to back in one CUDA graph and replayed three
    times; the package keeps the stamped module (``P.swap`` back when done)."""
    copies = P.md.input_copies(s, device)
    P.swap("mla_sm90_narrow", stamped)()
    P.pkg.mla_sm90._LAUNCHERS.clear()
    P.lowering._CHOICES.clear()
    fns = [P.runner(s, x, device) for x in copies]
    for f in fns:
        f()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for f in fns * 4:
                f()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        graph.replay()
    return graph, len(fns) * 4


def main():
    device = torch.device("cuda")
    buf = torch.zeros(MAX_PROGRAMS * SLOTS, dtype=torch.int64, device=device)
    stamped = P.module_from_source("mla_sm90_narrow", P.replaced(mla_sm90_narrow, _stamps(buf.data_ptr())))
    named = {s.name: s for s in P.narrow_shapes()}
    shapes = [named[n] for n in ("mtp2_B64_ctx4096_H16", "B64_ctx4096_H16", "mtp2_B128_ctx4096_H16",
                                 "B128_ctx4096_H16", "mtp2_B32_ctx8192_H16", "B32_ctx8192_H16")]
    for s in P.selected(shapes, "PROBE_SHAPES"):
        graph, calls = stamped_graph(s, device, stamped)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        buf.zero_()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call = start.elapsed_time(end) * 1e3 / calls
        t = buf.view(MAX_PROGRAMS, SLOTS).cpu()
        ran = t[:, 0] != 0
        t = t[ran]
        work = t[t[:, 7] >= 0]
        t0 = t[:, 0].min()
        us = lambda a: (a - t0).double() / 1e3  # noqa: E731
        span = us(work[:, 5].max())
        print(f"{s.name}: {per_call:.1f} us a call; kernel span {span:.1f} us; {len(work)} working programs "
              f"({int(work[:, 7].max())} tiles at most) on {len(set(work[:, 6].tolist()))} SMs, "
              f"{len(t) - len(work)} empty", flush=True)
        rows = (("entry offset", us(work[:, 0])), ("search", (work[:, 1] - work[:, 0]) / 1e3),
                ("queries", (work[:, 2] - work[:, 1]) / 1e3), ("first tile", (work[:, 3] - work[:, 2]) / 1e3),
                ("key loop", (work[:, 4] - work[:, 3]) / 1e3), ("epilogue", (work[:, 5] - work[:, 4]) / 1e3),
                ("a tile in the loop", (work[:, 4] - work[:, 3]) / 1e3 / work[:, 7].clamp(min=2).sub(1)),
                ("end offset", us(work[:, 5])))
        for name, x in rows:
            print(f"  {name:20s} min/median/max {_spread(x)}", flush=True)
        if len(t) > len(work):
            empty = t[t[:, 7] < 0]
            print(f"  {'empty: entry offset':20s} min/median/max {_spread(us(empty[:, 0]))}", flush=True)
    P.swap("mla_sm90_narrow", mla_sm90_narrow)()


if __name__ == "__main__":
    main()
