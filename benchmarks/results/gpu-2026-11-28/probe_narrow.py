"""The narrow MLA kernel (``mla_sm90_narrow``) asking L2 for a tile ahead of its copy, as the wide
kernel's producer does since f8e8ec6: at the top of key step j, one bulk prefetch of the page of
tile ``j + STAGES + AHEAD`` (``AHEAD`` 0: the tile whose copy this step issues at its end), by one
thread; bf16/fp16 caches with whole tiles a page whose rows lie one after another. For the 2-token
row both ways of planning it: the planner's 32-row programs split two ways, and a token a program
(16 rows, unsplit at B64, ``mla._SHORT_SPLITS = 1``), where a sequence's two programs read the same
pages, as the wide kernel's head groups do. Timed by ``mla_probe.compare`` (CUDA-graph replays,
alternated round by round, each output checked against a float32 gather-einsum).

The variants are built from the package's own source by asserted replacements (``P.replaced``):
the narrow kernel's module with the prefetch (``PREFETCH_AHEAD``; None: the package's kernel), and
``mla_sm90`` passing the cache itself as the narrow kernels' ``kv_scale_ptr`` on bf16/fp16 caches
(where it is otherwise the queries, unread), which the variant prefetches from.

    python3 probe_narrow.py   # PROBE_ROUNDS, PROBE_SHAPES as mla_probe says
"""
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90, mla_sm90_narrow  # noqa: E402

PLANNED = P.tmla._SHORT_SPLITS

wide = P.module_from_source("mla_sm90", P.replaced(mla_sm90, (
    ('''           lse_ptr=lse if lse is not None else out, kv_scale_ptr=kv_scale if kv_scale is not None else q_latent)''',
     '''           lse_ptr=lse if lse is not None else out, kv_scale_ptr=kv_scale if kv_scale is not None else kv_cache)'''),
    ('''        if not fp8:
            own["kv_scale_ptr"] = same_as("q_latent_ptr")''', '''        if not fp8:  # (the cache, passed with each call)
            pass'''),
)))

PREFETCH_HELPER = '''
    @gluon.jit
    def _prefetch_tile(kv_ptr, key0, kv_end, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
                       CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr):
        """One bulk L2 prefetch of the 64-key tile from ``key0`` (rows of CHUNKS * 64 elements one
        after another), by thread 0; nothing at or past ``kv_end`` or for an id outside [0, NB)."""
        blk = _block_id(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
        ok = (blk >= 0) & (blk < num_blocks) & (key0 < kv_end)
        row = gl.where(ok, blk * block_rows + key0 % BLOCK_SIZE, 0)
        src = kv_ptr + row.to(gl.int64) * (CHUNKS * 64)
        size: gl.constexpr = _TILE * CHUNKS * 64 * kv_ptr.dtype.element_ty.primitive_bitwidth // 8
        gl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .b32 l; mov.u32 l, %tid.x; setp.eq.u32 p, l, 0; setp.ne.and.u32 q, $2, 0, p; "
            f"@q cp.async.bulk.prefetch.L2.global [$1], {size}; mov.u32 $0, 0; }}",
            "=r,l,r", [src, ok.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _tile_block('''


def narrow_module(ahead):
    src = P.replaced(mla_sm90_narrow, (
        ('''
    @gluon.jit
    def _tile_block(''', PREFETCH_HELPER),
        ('''        for j in range(n_tiles):
            st = j % STAGES
            key0 = key_lo + j * _TILE
''', f'''        for j in range(n_tiles):
            st = j % STAGES
            key0 = key_lo + j * _TILE
            if not IS_FP8 and BOX == _TILE:
                _prefetch_tile(kv_scale_ptr, key0 + (STAGES + {ahead}) * _TILE, kv_end, seq_row_ptr, stride_bt_block,
                               num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE)
'''),
    ))
    return P.module_from_source("mla_sm90_narrow", src)


def variant(narrow, short_splits):
    def use():
        P.swap("mla_sm90", wide)()
        P.swap("mla_sm90_narrow", narrow)()
        P.tmla._SHORT_SPLITS = short_splits
    return use


def main():
    plain, pf0, pf1 = mla_sm90_narrow, narrow_module(0), narrow_module(1)
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="B64_ctx4096_H16", q_len=1), by["B128_ctx4096_H16"]]
    variants = {"package": variant(plain, PLANNED), "pf0": variant(pf0, PLANNED), "pf1": variant(pf1, PLANNED),
                "tok": variant(plain, 1), "tok+pf0": variant(pf0, 1), "tok+pf1": variant(pf1, 1)}
    P.compare(shapes, variants, 3, lambda p: f"splits {P.splits(p)} block_q {p.get('block_q')}")
    P.swap("mla_sm90", mla_sm90)()
    P.swap("mla_sm90_narrow", mla_sm90_narrow)()
    P.tmla._SHORT_SPLITS = PLANNED


if __name__ == "__main__":
    main()
