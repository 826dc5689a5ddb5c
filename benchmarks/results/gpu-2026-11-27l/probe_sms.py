"""Whether the narrow MLA programs' unequal key-loop times belong to the SMs they run on, and to
the SMs' GPCs. Two parts, one process:

1. The GPCs: a kernel whose CTAs store their ``%smid`` and ``%clusterid`` and spin, launched as
   clusters of 16, 8, 4 and 2 CTAs (Triton's ``num_ctas``; a cluster's CTAs run on one GPC), many
   times; SMs seen in one cluster are joined (union-find). The groups printed are GPCs (or parts of
   one where no cluster spanned them).
2. The programs: the package's narrow kernel with ``probe_timeline.py``'s ``%globaltimer`` stamps
   (``gpu-2026-11-27e``), each shape's calls captured back to back in one CUDA graph and replayed
   ``REPLAYS`` times; after each replay the last call's stamps are read. A tile's time a program
   (its key loop over its tiles) is put on its SM. Printed: the split-half correlation of the
   per-SM tile times (even replays against odd ones: near 1 if an SM's speed is its own), each
   GPC's SM count with its SMs' mean tile time and end offset, and the programs ending last.

    python3 probe_sms.py   # PROBE_SHAPES=name,...  REPLAYS=8
"""
import os
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "gpu-2026-11-27e"))
import probe_timeline as T  # noqa: E402  (its stamps and stamped_graph)


@triton.jit
def _where(out_addr, spin_ns, dummy_ptr):
    """Each CTA's SM and cluster at ``out_addr`` (8 bytes a CTA, by cluster and rank: the stores
    are inline PTX, which every CTA of a cluster runs; Triton's own scalar stores would be rank
    0's only), after spinning ``spin_ns`` so that the launch's clusters are resident together."""
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    rank = tl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    cid = tl.inline_asm_elementwise("mov.u32 $0, %clusterid.x;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    ncta = tl.inline_asm_elementwise("mov.u32 $0, %cluster_nctarank;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    t = t0
    while t - t0 < spin_ns:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    addr = out_addr + ((cid * ncta + rank) * 8).to(tl.int64)
    tl.inline_asm_elementwise("st.global.b32 [$1], $2; st.global.b32 [$1+4], $3; mov.u32 $0, 0;", "=r,l,r,r",
                              [addr, sm, cid], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(dummy_ptr, sm)  # (Triton's CTA planning wants a store of its own)


def gpcs(device) -> list[list[int]]:
    """The SMs grouped by the clusters they ran in (``_where``): sorted groups of SM ids."""
    nsm = torch.cuda.get_device_properties(device).multi_processor_count
    parent = list(range(nsm))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    dummy = torch.zeros(1, dtype=torch.int32, device=device)
    seen = set()
    for n in (16, 8, 4, 2):
        for rep in range(12):
            clusters = max(1, nsm // n) + (rep % 3)  # a few more than fit at once now and then
            buf = torch.full((clusters * n, 2), -1, dtype=torch.int32, device=device)
            try:
                _where[(clusters, )](buf.data_ptr(), 100_000, dummy, num_ctas=n, num_warps=1)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (a cluster size this device or launcher refuses)
                print(f"clusters of {n}: {type(e).__name__}: {e}")
                break
            got = buf.cpu().tolist()
            for c in range(clusters):
                sms = [got[c * n + r][0] for r in range(n)]
                if min(sms) < 0:
                    continue
                seen.update(sms)
                for s in sms[1:]:
                    parent[find(s)] = find(sms[0])
    groups = {}
    for s in range(nsm):
        groups.setdefault(find(s), []).append(s)
    out = sorted((sorted(g) for g in groups.values()), key=lambda g: (-len(g), g[0]))
    unseen = sorted(set(range(nsm)) - seen)
    print(f"{nsm} SMs; groups by cluster (size: SM ids); never in a cluster: {unseen}")
    for g in out:
        print(f"  {len(g):3d}: {g}")
    return out


def programs(s, device, replays: int, stamped) -> list[torch.Tensor]:
    """The stamps (``probe_timeline``'s slots) of the working programs of the last call of each of
    ``replays`` replays of shape ``s``'s calls captured back to back."""
    buf = stamped.buf
    graph, _ = T.stamped_graph(s, device, stamped.module)
    got = []
    for _ in range(replays):
        buf.zero_()
        graph.replay()
        torch.cuda.synchronize()
        t = buf.view(T.MAX_PROGRAMS, T.SLOTS).cpu()
        t = t[(t[:, 0] != 0) & (t[:, 7] >= 0)]
        got.append(t)
    P.swap("mla_sm90_narrow", mla_sm90_narrow)()
    return got


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()).clamp(min=1e-30))


def report(name: str, runs: list[torch.Tensor], groups: list[list[int]], nsm: int) -> None:
    tile = torch.full((len(runs), nsm), float("nan"), dtype=torch.float64)
    end = torch.full((len(runs), nsm), float("nan"), dtype=torch.float64)
    for i, t in enumerate(runs):
        t0 = t[:, 0].min()
        per_tile = (t[:, 4] - t[:, 3]).double() / 1e3 / t[:, 7].clamp(min=2).sub(1).double()
        tile[i, t[:, 6].long()] = per_tile
        end[i, t[:, 6].long()] = (t[:, 5] - t0).double() / 1e3
    used = ~torch.isnan(tile)
    both = used[0::2].all(0) & used[1::2].all(0)
    even, odd = tile[0::2][:, both].mean(0), tile[1::2][:, both].mean(0)
    mean_tile = torch.nanmean(tile, 0)
    mean_end = torch.nanmean(end, 0)
    spans = [float(((t[:, 5].max() - t[:, 0].min()) / 1e3)) for t in runs]
    print(f"{name}: {len(runs)} replays, kernel span {min(spans):.1f}-{max(spans):.1f} us; "
          f"{int(used.any(0).sum())} SMs ran a working program, {int(both.sum())} in every replay")
    print(f"  a tile, per SM mean over replays (us): min {float(mean_tile[both].min()):.3f} "
          f"median {float(mean_tile[both].median()):.3f} max {float(mean_tile[both].max()):.3f}; "
          f"split-half correlation of the per-SM tile times (even vs odd replays) {corr(even, odd):.3f}")
    within = torch.nanmean((tile - mean_tile).abs(), 0)
    print(f"  an SM's tile time from one replay to the next: mean |deviation| {float(within[both].mean()):.3f} us "
          f"against the SMs' spread (sd) {float(mean_tile[both].std()):.3f}")
    print("  group (size): its SMs' tile time mean / min / max, end offset mean (us), SMs used")
    for g in groups:
        idx = torch.tensor(g)
        m = both[idx]
        if not m.any():
            print(f"    {len(g):3d}: no SM of it ran every replay")
            continue
        x, e = mean_tile[idx][m], mean_end[idx][m]
        print(f"    {len(g):3d}: {float(x.mean()):.3f} / {float(x.min()):.3f} / {float(x.max()):.3f}, "
              f"end {float(e.mean()):.1f}, {int(m.sum())} SMs")
    size = {s: len(g) for g in groups for s in g}
    entry_end = []
    for t in runs:
        t0 = t[:, 0].min()
        entry_end.append((corr((t[:, 0] - t0).double(), (t[:, 5] - t0).double()),
                          corr((t[:, 4] - t[:, 3]).double(), (t[:, 5] - t0).double())))
    print("  correlation over a replay's programs of the end offset with the entry offset / with the key loop's "
          "time, each replay: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in entry_end))
    last = runs[-1]
    t0 = last[:, 0].min()
    order = ((last[:, 5] - t0).double() / 1e3).argsort(descending=True)[:12]
    print("  last replay, the 12 programs ending last (SM, its group's size, entry us, queries landed us, end us, "
          "a tile us): " + "; ".join(
              f"{int(last[i, 6])} ({size.get(int(last[i, 6]), 0)}) {float((last[i, 0] - t0) / 1e3):.1f} "
              f"{float((last[i, 2] - t0) / 1e3):.1f} {float((last[i, 5] - t0) / 1e3):.1f} "
              f"{float((last[i, 4] - last[i, 3]) / 1e3 / max(int(last[i, 7]) - 1, 1)):.3f}" for i in order))
    idle = sorted(set(range(nsm)) - set(int(x) for x in last[:, 6].tolist()))
    fast = [int(i) for i in mean_tile.argsort().tolist() if both[i]][:12]
    print(f"  SMs without a working program in the last replay: {idle}; the 12 fastest SMs (mean tile us): "
          + ", ".join(f"{i} {float(mean_tile[i]):.3f}" for i in fast))


class _Stamped:
    def __init__(self, device):
        self.buf = torch.zeros(T.MAX_PROGRAMS * T.SLOTS, dtype=torch.int64, device=device)
        self.module = P.module_from_source("mla_sm90_narrow", P.replaced(mla_sm90_narrow, T._stamps(
            self.buf.data_ptr())))


def main():
    device = torch.device("cuda")
    nsm = torch.cuda.get_device_properties(device).multi_processor_count
    groups = gpcs(device)
    stamped = _Stamped(device)
    named = {s.name: s for s in P.narrow_shapes()}
    shapes = [named[n] for n in ("mtp2_B64_ctx4096_H16", "B64_ctx4096_H16", "mtp2_B128_ctx4096_H16",
                                 "B128_ctx4096_H16", "mtp2_B32_ctx8192_H16")]
    replays = int(os.environ.get("REPLAYS", "8"))
    for s in P.selected(shapes, "PROBE_SHAPES"):
        report(s.name, programs(s, device, replays, stamped), groups, nsm)
    print("groups again (the map may differ between processes):")
    gpcs(device)


if __name__ == "__main__":
    main()
