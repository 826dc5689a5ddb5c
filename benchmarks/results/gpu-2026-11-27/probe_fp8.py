"""The fp8 MLA kernel (``mla_sm90_fp8``) with its producer's block-id lookup before the stage's
``empty`` wait (block sizes >= 64), against the kernel before (main 5070d8c's, which looked the page
up after that wait: rebuilt from the package's module by ``_BEFORE``'s replacements), timed as
``mla_probe.compare`` times them.

    python3 probe_fp8.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...

(The runs in logs/probe-fp8.txt loaded an archived copy of 5070d8c's module, whose code is what the
replacements rebuild: the same sm_90 SASS.)
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_fp8  # noqa: E402

# (the package's code, 5070d8c's)
_BEFORE = (
    ("        _convert, _empty_state, _program,", "        _convert, _empty_state, _issue, _program,"),
    ("""            key0 = key_lo + j * _TILE
            blk = _tile_block(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE, BOX)
            mbarrier.wait(empty.index(st), ((j // 2) & 1) ^ 1)
            _refill(kv_desc, kvs, ready, st, key0, blk, seq_row_ptr, stride_bt_block, num_pages, num_blocks,
                    block_rows, CHUNKS, BLOCK_SIZE, BOX)
""", """            mbarrier.wait(empty.index(st), ((j // 2) & 1) ^ 1)
            _issue(kv_desc, kvs, ready, st, key_lo + j * _TILE, seq_row_ptr, stride_bt_block, num_pages,
                   num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
"""),
)


def main():
    before = P.module_from_source("mla_sm90_fp8_before", P.replaced(mla_sm90_fp8, _BEFORE))
    by = {s.name: s for s in P.md.SHAPES}
    f = by["fp8_B128_ctx4096_H16"]
    shapes = [f, by["mtp2_fp8_B64_ctx4096_H16"], replace(f, name="fp8_B1_ctx32768_H16", batch=1, seq_len=32768),
              replace(f, name="fp8_B128_ctx4096_H16_bs16", block_size=16)]
    P.compare(shapes, {"after": P.swap("mla_sm90_fp8", mla_sm90_fp8),
                       "before": P.swap("mla_sm90_fp8", before)}, 3)
    P.swap("mla_sm90_fp8", mla_sm90_fp8)()


if __name__ == "__main__":
    main()
