"""Where a split MLA call's time goes outside its attention kernel: the narrow kernel with
``probe_timeline.py``'s stamps and the combine kernel with three of its own a program (at its
entry, once its wait for the attention kernel returns, after its output store: ``%globaltimer``),
the calls captured back to back in one CUDA graph (``probe_timeline.stamped_graph``) and replayed;
after each replay the last call's stamps are read. Per replay, µs from the attention kernel's
first program entry: its last program's end, the combine's first entry, first return from its
wait and last end, against the replay's time a call.

    python3 probe_boundary.py   # PROBE_SHAPES=name,...  REPLAYS=6  COMBINE_TILE=512 (the combine's
                                # blocking, paged_attention._COMBINE_TILE; default the package's)
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow, paged_attention  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "gpu-2026-11-27e"))
import probe_timeline as T  # noqa: E402  (its stamps and stamped_graph)

SLOTS = 3  # the combine's: entry, wait returned, end
MAX_COMBINE = 16384
NOW = 'tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)'


def _combine_stamps(addr: int) -> tuple:
    put = lambda k: f"tl.store(_cb + {k}, {NOW})"  # noqa: E731
    return (
        ('''    column block 0. Rows past ``qsl[-1]`` get 0 and -inf."""
    tok = tl.program_id(0)
''', f'''    column block 0. Rows past ``qsl[-1]`` get 0 and -inf."""
    _cb = ((tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * {SLOTS * 8} + {addr}).to(
        tl.pointer_type(tl.int64), bitcast=True)
    {put(0)}
    tok = tl.program_id(0)
'''),
        ('''    if USE_PDL:  # everything above reads the call's inputs; the partials are the attention kernel's
        gdc_wait()
''', f'''    if USE_PDL:  # everything above reads the call's inputs; the partials are the attention kernel's
        gdc_wait()
    {put(1)}
'''),
        ('''    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
''', f'''    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    {put(2)}
'''),
    )


def main():
    device = torch.device("cuda")
    main_buf = torch.zeros(T.MAX_PROGRAMS * T.SLOTS, dtype=torch.int64, device=device)
    comb_buf = torch.zeros(MAX_COMBINE * SLOTS, dtype=torch.int64, device=device)
    narrow = P.module_from_source("mla_sm90_narrow", P.replaced(mla_sm90_narrow, T._stamps(main_buf.data_ptr())))
    combine = P.module_from_source("paged_attention", P.replaced(paged_attention, _combine_stamps(
        comb_buf.data_ptr())))._combine_kernel
    package = P.tmla._combine_kernel
    named = {s.name: s for s in P.narrow_shapes()}
    shapes = [named[n] for n in ("mtp2_B64_ctx4096_H16", "B64_ctx4096_H16", "mtp2_B32_ctx8192_H16",
                                 "B32_ctx8192_H16")]
    replays = int(os.environ.get("REPLAYS", "6"))
    if os.environ.get("COMBINE_TILE"):
        paged_attention._COMBINE_TILE = int(os.environ["COMBINE_TILE"])
        print(f"combine tile {paged_attention._COMBINE_TILE}")
    P.tmla._combine_kernel = combine
    try:
        for s in P.selected(shapes, "PROBE_SHAPES"):
            graph, calls = T.stamped_graph(s, device, narrow)
            print(f"{s.name}: µs from the attention kernel's first entry: its last end | the combine's first "
                  f"entry, first wait return, last end | the replay's time a call")
            for _ in range(replays):
                main_buf.zero_()
                comb_buf.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                torch.cuda.synchronize()
                per_call = start.elapsed_time(end) * 1e3 / calls
                t = main_buf.view(T.MAX_PROGRAMS, T.SLOTS).cpu()
                t = t[t[:, 0] != 0]
                c = comb_buf.view(MAX_COMBINE, SLOTS).cpu()
                c = c[c[:, 0] != 0]
                t0 = t[:, 0].min()
                us = lambda x: float(x - t0) / 1e3  # noqa: E731
                print(f"  {us(t[:, 5].max()):7.1f} | {us(c[:, 0].min()):7.1f} {us(c[:, 1].min()):7.1f} "
                      f"{us(c[:, 2].max()):7.1f} | {per_call:7.1f}   ({len(c)} combine programs)", flush=True)
            P.swap("mla_sm90_narrow", mla_sm90_narrow)()
    finally:
        P.tmla._combine_kernel = package


if __name__ == "__main__":
    main()
