"""Where Triton keeps the query operand of a batched score dot: a stand-alone fp8 paged-decode loop
(16 query rows, 128 keys a tile in four warps' groups of 32, D 128, e4m3 K/V, both dots batched over
the warps) compiled for sm_90 with the fp16 query tile made seven ways (``MODES``). Where the query
operand stays in registers the loop has 96 KiB of shared memory and 6 ``LDS.64`` a tile (the masks');
where Triton keeps it in shared memory (112 KiB) it is reloaded every tile, 22 ``LDS.64``
(``logs/sass-query-operand.txt``; Triton 3.6). No GPU needed (Triton's compiler and cuobjdump).

    python3 sass_query_operand.py
"""

import collections
import os
import re
import sys

import triton
import triton.language as tl

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")]
import sass_report as R  # noqa: E402
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def proto(q_ptr, k_ptr, v_ptr, bt_ptr, sl_ptr, o_ptr, unit, qk_scale, stride_bt, stride_kb, stride_ks, stride_kh, nblocks,
          BS: tl.constexpr, G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
          W: tl.constexpr, NW: tl.constexpr, MODE: tl.constexpr):
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    seq_len = tl.load(sl_ptr + b)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * HQ * D + (kvh * G + offs_m)[:, None] * D + offs_d[None, :], mask=(offs_m < G)[:, None], other=0.)
    if MODE == 4:
        q = (q.to(tl.float32) / tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)).to(tl.float16)
    elif MODE == 6:
        q = (q.to(tl.float32) * (tl.zeros([BLOCK_M, 1], tl.float32) + qk_scale)).to(tl.float16)
    elif MODE == 7:
        rs = tl.load(sl_ptr + offs_m * 0).to(tl.float32)
        q = (q.to(tl.float32) * rs[:, None]).to(tl.float16)
    elif MODE == 8:
        q = tl.inline_asm_elementwise("mul.f32 $0, $1, $2;", "=r,r,r", [q.to(tl.float32), tl.full(q.shape, 1.0, tl.float32) * qk_scale], dtype=tl.float32, is_pure=True, pack=1).to(tl.float16)
    elif MODE == 9:
        q = (q * tl.cast(qk_scale, tl.bfloat16)).to(tl.float16)
    elif MODE == 5:
        q = (q.to(tl.float32) / qk_scale).to(tl.float16)
    else:
        q = q.to(tl.float16)
    w = tl.arange(0, W)[:, None]
    j = tl.arange(0, NW)[None, :]
    m_i = tl.full([W, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([W, BLOCK_M], tl.float32)
    acc = tl.zeros([W, BLOCK_M, D], tl.float32)
    q3 = tl.broadcast_to(q[None, :, :], [W, BLOCK_M, D])
    for start in range(0, seq_len, W * NW):
        offs_n = start + w * NW + j
        blk = tl.load(bt_ptr + b * stride_bt + offs_n // BS, mask=offs_n < seq_len, other=-1)
        ok = (blk >= 0) & (blk < nblocks)
        blk = tl.where(ok, blk, 0).to(tl.int64)
        rows = blk * stride_kb + (offs_n % BS) * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + rows[:, :, None] + offs_d[None, None, :], mask=ok[:, :, None], other=0.)
        k = k.to(tl.float16)
        s = tl.dot(q3, tl.trans(k, (0, 2, 1))) * qk_scale
        s = tl.where(ok[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, :, None])
        l_i = l_i * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None]
        m_i = m_new
        v = tl.load(v_ptr + rows[:, :, None] + offs_d[None, None, :], mask=ok[:, :, None], other=0.)
        v = v.to(tl.float16) * tl.cast(unit, tl.float16)  # as _fp8_to_fp16
        acc = tl.dot(p.to(tl.float16), v, acc)
    m = tl.max(m_i, 0)
    sc = tl.exp2(m_i - m[None, :])
    l = tl.sum(l_i * sc, 0)
    o = tl.sum(acc * sc[:, :, None], 0) / l[:, None]
    tl.store(o_ptr + b * HQ * D + (kvh * G + offs_m)[:, None] * D + offs_d[None, :], o.to(tl.bfloat16), mask=(offs_m < G)[:, None])

def compile(mode=0, W=4, NW=32, stages=3, warps=4):
    sig = dict(q_ptr="*bf16", k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", bt_ptr="*i32", sl_ptr="*i32", o_ptr="*bf16", unit="fp32", qk_scale="fp32",
               stride_bt="i32", stride_kb="i32", stride_ks="i32", stride_kh="i32", nblocks="i32",
               BS="constexpr", G="constexpr", HQ="constexpr", D="constexpr", BLOCK_M="constexpr", W="constexpr", NW="constexpr", MODE="constexpr")
    consts = dict(BS=16, G=4, HQ=32, D=128, BLOCK_M=16, W=W, NW=NW, MODE=mode)
    names = list(sig)
    cx = {(names.index(k),): v for k, v in consts.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(names) if k.endswith("_ptr") or k in ("stride_bt", "stride_kb", "stride_ks", "stride_kh")}
    return triton.compile(ASTSource(proto, sig, cx, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))

MODES = {
    0: "q.to(fp16)",
    4: "(q / max|q|) in float32, to fp16 (a reduction of the same tile)",
    5: "(q / a kernel argument) in float32, to fp16",
    6: "q * (zeros([M, 1]) + argument) in float32, to fp16",
    7: "q * a row vector loaded from memory, in float32, to fp16",
    8: "q * argument by inline PTX, to fp16",
    9: "q * bf16(argument) in bf16, to fp16 (the package's form)",
}

if __name__ == "__main__":
    for mode, what in MODES.items():
        c = compile(mode)
        sass = R.cuobjdump(c, "-sass"); usage = R.cuobjdump(c, "-res-usage")
        code = [(int(a, 16), t) for a, t in re.findall(r"(?m)^\s+/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
        back = [(int(m.group(1), 16), a) for a, t in code if (m := re.search(r"\bBRA\b.*?0x([0-9a-f]+)", t)) and int(m.group(1), 16) < a]
        loops = [[t for a, t in code if top <= a <= bot] for top, bot in back]
        body = min([b for b in loops if any("HMMA" in t for t in b)], key=len)
        h = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t.strip()).split()[0] for t in body)
        regs = re.search(r"REG:(\d+)", usage).group(1)
        print(f"mode {mode}: {what}: registers {regs}, shared memory "
              f"{c.metadata.shared} B, loop {len(body)} instructions, LDS.64 {h['LDS.64']}, IMAD.MOV {h['IMAD.MOV.U32']}")
