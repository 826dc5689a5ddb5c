"""Hypothesis: in the masked key loop the P@V wgmma k-steps 1..3 read their B descriptor from
uniform registers that hold 0 -> shared addresses 0x400, 0x800, 0xC00 = global_smem + 0/1024/2048,
i.e. bytes of the Q tile ([BLOCK_M, D_PAD] bf16, 128B swizzle) read as a 64B-swizzled MN-major V block."""
import sys, zlib
sys.path.insert(0, "tests")
import torch
from test_triton_paged_attention import Case, make_inputs
import _loop as loop

def q_smem_bytes(Qtile):  # [128, 64] bf16 -> flat array of 16384/2 bf16 in 128B-swizzled order
    M, D = Qtile.shape
    flat = torch.zeros(M * D, dtype=Qtile.dtype)
    for m in range(M):
        for d in range(D):
            o = m * 128 + (((d // 8) ^ (m % 8)) * 16) + (d % 8) * 2
            flat[o // 2] = Qtile[m, d]
    return flat

def vprime(V, flat, starts):
    Vp = V.clone()
    for j, start in zip((1, 2, 3), starts):
        for r in range(16):
            for c in range(32):
                o = start + r * 64 + (((c // 8) ^ ((r // 2) % 4)) * 16) + (c % 8) * 2
                Vp[16 * j + r, c] = flat[o // 2]
    return Vp

def run(kw, starts=(0, 1024, 2048), heads_packed=True):
    case = Case((12, 3), (30, 17), **kw)
    batch, opts = make_inputs(case, "cpu", zlib.crc32(case.id.encode()))
    truth = loop.paged_attention(*batch.args(), **opts)[0].double()
    q, kc, vc = batch.query, batch.key_cache, batch.value_cache
    bt, sl, qsl = batch.block_table, batch.seq_lens, batch.query_start_loc
    T, Hq, D = q.shape; Hkv = kc.shape[2]; bs = kc.shape[1]; G = Hq // Hkv; Dv = vc.shape[3]
    out = torch.full((T, Hq, Dv), float('nan'), dtype=torch.float64)
    for b in range(len(sl)):
        L = int(sl[b]); q0, q1 = int(qsl[b]), int(qsl[b+1]); ctx = L - (q1 - q0)
        keys = torch.arange(64); ok = keys < L
        blk = torch.where(ok, bt[b, (keys // bs).clamp(max=bt.shape[1]-1)], 0)
        for h in range(Hkv):
            K = torch.where(ok[:, None], kc[blk, keys % bs, h].double(), 0.0)
            V = torch.zeros(64, 32, dtype=torch.bfloat16)
            V[:, :Dv] = torch.where(ok[:, None], vc[blk, keys % bs, h], torch.zeros((), dtype=vc.dtype))
            Qt = torch.zeros(128, 64, dtype=torch.bfloat16)
            for t in range(q0, q1):
                for g in range(G):
                    Qt[(t - q0) * G + g, :D] = q[t, h * G + g]
            Vp = vprime(V, q_smem_bytes(Qt), starts).double()[:, :Dv]
            for t in range(q0, q1):
                pos = ctx + t - q0; vis = ok & (keys <= pos)
                for g in range(G):
                    hq = h * G + g
                    s = torch.where(vis, (K @ q[t, hq].double()) * opts["scale"], float('-inf'))
                    p = torch.where(vis, torch.exp(s - s.max()), 0.0)
                    p = p.to(torch.bfloat16).double()  # P is rounded to bf16 for the dot
                    out[t, hq] = (p @ Vp) / torch.where(vis, torch.exp(s - s.max()), 0.0).sum()
    d = (out - truth).abs(); i = d.argmax().item()
    t, hq, dd = i // (Hq * Dv), (i // Dv) % Hq, i % Dv
    return f"max err {d.max().item():.4f} at token {t} head {hq} dim {dd}"

BASE = dict(head_size=40, head_size_v=24, block_size=24, num_heads=6, num_kv_heads=2)
GPU = {"{}": "1.2435 at token 7 head 5 dim 3", "{'num_heads': 4}": "1.2307", "{'block_size': 16}": "1.5001",
       "{'block_size': 32}": "1.5352"}
for over in [{}, {"num_heads": 4}, {"block_size": 16}, {"block_size": 32}]:
    print(f"{str(over):22s} simulated: {run({**BASE, **over})}   GPU: {GPU[str(over)]}")
