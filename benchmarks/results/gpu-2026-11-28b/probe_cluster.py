"""The narrow MLA kernel (``mla_sm90_narrow``) as pairs of CTAs, two ways, for 2 query tokens a
sequence at 16 heads, against the package's plan (32-row programs split two ways, the combine
kernel after them). Both are built from the package's source as it stood before the fold landed
(cb54507's parent) by asserted replacements (``P.replaced``), their PTX rewritten on the way to
ptxas (``knobs.runtime.add_stages_inspection_hook``, only PTX carrying the ``TPA_CLUSTER2``
marker): ``.reqnctapercluster 2, 1, 1`` on the entry, every plain ``mbarrier.arrive`` a release
at cluster scope on the other CTA's barrier (``mapa``), and, with ``TPA_MULTICAST`` too, every
``cp.async.bulk.tensor.2d`` a multicast to both CTAs (mask 0b11). A cluster barrier after the
barriers' init (``fence.mbarrier_init``) keeps copies and arrivals from reaching a CTA before its
barriers exist.

- ``cluster`` (multicast): a 2-token block's two CTAs each take one token (16 rows, one
  warpgroup) over all of the keys; CTA r issues the TMA boxes of chunks ``c % 2 == r`` as
  multicast copies, both ``ready`` barriers expect the whole tile, and a stage is refilled once
  both CTAs are done with it (each arrives on the other's ``free`` barrier). Splits as the package
  would for twice the programs.
- ``fold``: a block's two CTAs each take half of its tiles (32 rows each, as the package's
  programs); rank 1 writes its normalised state into ``out`` / ``lse`` and arrives on rank 0's
  ``done`` barrier, rank 0 merges it (what the package's ``FOLD`` became). Unsplit.
- ``tok``: one token a program, unsplit (``mla._SHORT_SPLITS = 1``), the two programs of a sequence
  reading the same pages through L2.

Timed by ``mla_probe.compare`` (CUDA-graph replays, alternated round by round, each output
checked against a float32 gather-einsum); ``PROBE_VARIANTS`` selects variants by name. It runs on
the tree it was written for, d662c97 (its replacements assert the source they replace), as in
calls 1-4 of ``run.sh``.

    python3 probe_cluster.py [compile cluster|fold]   # compile: sm_90 SASS figures only (no GPU needed)
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow  # noqa: E402

MARK = "TPA_CLUSTER2"


def rewrite(ptx: str) -> str:
    """The cluster variant's PTX (see the docstring); other PTX unchanged."""
    if MARK not in ptx:
        return ptx
    ptx, n = re.subn(r"(\n\.reqntid [^\n]*\n)", r"\1.reqnctapercluster 2, 1, 1\n", ptx, count=1)
    assert n == 1, "no .reqntid"
    if "TPA_MULTICAST" in ptx:
        ptx, n = re.subn(
            r"(@%p\d+ )?cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes (\[[^;]*);",
            lambda m: ("{ .reg .b16 tpam; mov.b16 tpam, 3; %scp.async.bulk.tensor.2d.shared::cluster.global"
                       ".mbarrier::complete_tx::bytes.multicast::cluster %s, tpam; }" % (m.group(1) or "", m.group(2))),
            ptx)
        assert n > 0, "no TMA copy"
    ptx, n = re.subn(
        r"(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\];",
        lambda m: ("{ .reg .b32 tpar, tpak; mov.u32 tpak, %%cluster_ctarank; xor.b32 tpak, tpak, 1; "
                   "mapa.shared::cluster.u32 tpar, %s, tpak; %smbarrier.arrive.release.cluster.shared::cluster.b64 "
                   "_, [tpar]; }" % (m.group(2), m.group(1) or "")),
        ptx)
    assert n > 0, "no arrive"
    return ptx


def hook(backend, stages, options, language, capability):
    if "ptx" in stages:
        make = stages["ptx"]
        stages["ptx"] = lambda src, metadata: rewrite(make(src, metadata))


HELPERS = '''
    _QUERIES_FIRST = gl.constexpr(16)
    _CL = gl.constexpr(2)

    @gluon.jit
    def _rank():
        """This CTA's rank in its cluster of two (clusters are consecutive CTAs along axis 0)."""
        return gl.program_id(0) % _CL

    @gluon.jit
    def _cluster_start(x):
        """The barriers' init made visible to the cluster, then a cluster barrier (and the
        variant's PTX markers)."""
        gl.inline_asm_elementwise(
            "// TPA_CLUSTER2 TPA_MULTICAST\\n\\tfence.mbarrier_init.release.cluster;\\n\\tbarrier.cluster.arrive.release.aligned;"
            "\\n\\tbarrier.cluster.wait.acquire.aligned;\\n\\tmov.u32 $0, 0;",
            "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)
'''


def cluster_source() -> str:
    src = P.replaced(mla_sm90_narrow, (
        ("\n    _QUERIES_FIRST = gl.constexpr(16)\n", HELPERS),
        ("tma_load(kv_desc, [row, c * 64], bar, kvs[c].index(stage).slice(i * BOX, BOX))",
         "tma_load(kv_desc, [row, c * 64], bar, kvs[c].index(stage).slice(i * BOX, BOX), pred=(c % _CL) == _rank())"),
        ("tma_load(kv_desc, [row, c * 64], bar, kvs[c].index(stage))",
         "tma_load(kv_desc, [row, c * 64], bar, kvs[c].index(stage), pred=(c % _CL) == _rank())"),
        ("        pid_q = gl.program_id(0)\n",
         "        pid_q = gl.program_id(0) // _CL\n        RQ: gl.constexpr = BLOCK_Q // _CL\n"),
        ("        if skip:\n            return\n",
         "        if skip:\n            return\n        q_rows = q_block_start + _rank() * RQ  # this CTA's token\n"),
        ("            mbarrier.init(ready.index(i), count=1)\n        fence_async_shared()\n",
         "            mbarrier.init(ready.index(i), count=1)\n"
         "        free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())\n"
         "        for i in gl.static_range(STAGES):\n"
         "            mbarrier.init(free.index(i), count=1)\n"
         "        fence_async_shared()\n        _cluster_start(pid_q)\n"),
        ("        pos_c = context + q_block_start + t_c", "        pos_c = context + q_rows + t_c"),
        ("""            if not IS_FP8:
                if j + STAGES < n_tiles:
                    _refill(""", """            if not IS_FP8:
                if j + STAGES < n_tiles:
                    thread_barrier()
                    mbarrier.arrive(free.index(st))  # (the other CTA's: the PTX rewrite)
                    mbarrier.wait(free.index(st), (j // STAGES) & 1)
                    _refill("""),
        ("        _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start, q_block_start,",
         "        _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start, q_rows,"),
        ("stride_lse_head, HEADS, BLOCK_Q, ROWS, VCH,", "stride_lse_head, HEADS, RQ, ROWS, VCH,"),
        ("    return num_tokens if block_q == 1 else num_tokens // block_q + num_seqs + 1",
         "    return 2 * (num_tokens // block_q + num_seqs + 1)"),
        ("    n = rows(num_heads, block_q)\n", "    n = rows(num_heads, block_q // 2)\n"),
    ))
    old = "chunks = _query_chunks(q_latent_ptr, q_rope_ptr, q_start, q_block_start, q_len,"
    assert src.count(old) == 2
    src = src.replace(old, "chunks = _query_chunks(q_latent_ptr, q_rope_ptr, q_start, q_rows, q_len,")
    assert src.count("stride_qr_head, HEADS, BLOCK_Q, ROWS, CHUNKS, WARPS)") == 2
    src = src.replace("stride_qr_head, HEADS, BLOCK_Q, ROWS, CHUNKS, WARPS)", "stride_qr_head, HEADS, RQ, ROWS, CHUNKS, WARPS)")
    return src


FOLD_HELPERS = HELPERS.replace("TPA_CLUSTER2 TPA_MULTICAST", "TPA_CLUSTER2") + '''
    @gluon.jit
    def _cluster_fence(x):
        """fence.acq_rel.cluster."""
        gl.inline_asm_elementwise("fence.acq_rel.cluster;\\n\\tmov.u32 $0, 0;", "=r,r", [x], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _part(c: gl.constexpr, part_ptr, cols, ok, VCH: gl.constexpr, acc_layout: gl.constexpr):
        """Latent chunk ``c`` of rank 1's normalised O^T (in ``out``), in rank 0's accumulator layout."""
        i = gl.arange(0, _TILE, layout=gl.SliceLayout(1, acc_layout)) + (c % VCH) * 64
        return gl.load(part_ptr + cols + gl.expand_dims(i, 1), mask=ok, other=0.0)

    @gluon.jit
    def _fold(o, c: gl.constexpr, a0, w1, o1, VCH: gl.constexpr):
        """Latent chunk ``c`` of rank 0's O^T merged with rank 1's ``o1``."""
        if c < VCH:
            o = o * a0 + o1.to(gl.float32) * w1
        return o
'''


def fold_source() -> str:
    """The narrow kernel with a sequence's two splits in one cluster: rank 0 the first half of the
    tiles, rank 1 the rest; rank 1 writes its normalised O and log2 LSE into ``out`` / ``lse``,
    arrives on rank 0's ``done`` barrier, and rank 0 merges them with its own state into ``out``
    (no partials, no combine kernel; the call must pass ``lse``)."""
    src = P.replaced(mla_sm90_narrow, (
        ("\n    _QUERIES_FIRST = gl.constexpr(16)\n", FOLD_HELPERS),
        ("        pid_q = gl.program_id(0)\n", "        pid_q = gl.program_id(0) // _CL\n"),
        ("        if skip:\n            return\n",
         "        if skip:\n            return\n"
         "        half = (n_tiles + 1) // 2  # rank 0 the first half of the tiles, rank 1 the rest\n"
         "        key_lo = key_lo + _rank() * half * _TILE\n"
         "        n_tiles = gl.where(_rank() == 0, half, n_tiles - half)\n"),
        ("            mbarrier.init(ready.index(i), count=1)\n        fence_async_shared()\n",
         "            mbarrier.init(ready.index(i), count=1)\n"
         "        done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())\n"
         "        mbarrier.init(done.index(0), count=1)\n"
         "        fence_async_shared()\n        _cluster_start(pid_q)\n"),
        ("""        _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start, q_block_start,
               q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, ROWS, VCH,
               IS_FP8 and LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, WARPS)""",
         """        if _rank() == 1:  # its normalised state and log2 LSE where rank 0 reads them
            _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start,
                   q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q,
                   ROWS, VCH, False, True, 1.0, WARPS)
            _cluster_fence(pid_q)
            thread_barrier()
            mbarrier.arrive(done.index(0))  # (rank 0's: the PTX rewrite)
        else:
            mbarrier.wait(done.index(0), 0)
            _cluster_fence(pid_q)
            row_ok = (t_c < BLOCK_Q) & (q_block_start + t_c < q_len)
            tok_c = (q_start + q_block_start + t_c).to(gl.int64)
            lse1 = gl.load(lse_ptr + tok_c * stride_lse_tok + (r_c % HEADS) * stride_lse_head, mask=row_ok,
                           other=float("-inf"))
            m_new = gl.maximum(m_i, lse1)
            m_ref = _finite(m_new)
            a0 = gl.exp2(m_i - m_ref)
            w1 = gl.exp2(lse1 - m_ref)
            l_i = l_i * a0 + w1
            m_i = m_new
            a0 = gl.expand_dims(a0, 0)
            w1 = gl.expand_dims(w1, 0)
            cols = gl.expand_dims(tok_c * stride_o_tok + (r_c % HEADS) * stride_o_head, 0)
            ok = gl.expand_dims(row_ok, 0)
            # every load of rank 1's rows issued before any is used (one L2 round trip, not eight)
            p0 = _part(0, out_ptr, cols, ok, VCH, acc_layout)
            p1 = _part(1, out_ptr, cols, ok, VCH, acc_layout)
            p2 = _part(2, out_ptr, cols, ok, VCH, acc_layout)
            p3 = _part(3, out_ptr, cols, ok, VCH, acc_layout)
            p4 = _part(4, out_ptr, cols, ok, VCH, acc_layout)
            p5 = _part(5, out_ptr, cols, ok, VCH, acc_layout)
            p6 = _part(6, out_ptr, cols, ok, VCH, acc_layout)
            p7 = _part(7, out_ptr, cols, ok, VCH, acc_layout)
            o0 = _fold(o0, 0, a0, w1, p0, VCH)
            o1 = _fold(o1, 1, a0, w1, p1, VCH)
            o2 = _fold(o2, 2, a0, w1, p2, VCH)
            o3 = _fold(o3, 3, a0, w1, p3, VCH)
            o4 = _fold(o4, 4, a0, w1, p4, VCH)
            o5 = _fold(o5, 5, a0, w1, p5, VCH)
            o6 = _fold(o6, 6, a0, w1, p6, VCH)
            o7 = _fold(o7, 7, a0, w1, p7, VCH)
            thread_barrier()  # (every thread has read rank 1's rows before any overwrites them)
            _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start,
                   q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q,
                   ROWS, VCH, IS_FP8 and LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, WARPS)"""),
        ("    return num_tokens if block_q == 1 else num_tokens // block_q + num_seqs + 1",
         "    return 2 * (num_tokens if block_q == 1 else num_tokens // block_q + num_seqs + 1)"),
    ))
    assert "from .mla_sm90 import (" in src
    return src


def install():
    from triton import knobs
    knobs.runtime.add_stages_inspection_hook = hook


def unsplit(plan):
    """``_plan_splits`` planning one split (the fold variant splits in the cluster)."""
    def f(device, programs, *a):
        return plan(device, 1 << 20, *a)
    return f


def per_cta(plan):
    """``_plan_splits`` counting a cluster's two CTAs as two programs."""
    def f(device, programs, *a):
        return plan(device, 2 * programs, *a)
    return f


def main():
    from dataclasses import replace
    install()
    cluster = P.module_from_source("mla_sm90_narrow", cluster_source())
    fold = P.module_from_source("mla_sm90_narrow", fold_source())
    planned = P.tmla._plan_splits

    def package():
        P.swap("mla_sm90_narrow", mla_sm90_narrow)()
        P.tmla._plan_splits = planned

    def clustered():
        P.swap("mla_sm90_narrow", cluster)()
        P.tmla._plan_splits = per_cta(planned)

    def folded():
        P.swap("mla_sm90_narrow", fold)()
        P.tmla._plan_splits = unsplit(planned)

    def tok():
        P.swap("mla_sm90_narrow", mla_sm90_narrow)()
        P.tmla._plan_splits = planned
        P.tmla._SHORT_SPLITS = 1

    short = P.tmla._SHORT_SPLITS
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128), replace(m, name="mtp2_B16_ctx4096_H16", batch=16),
              # more shapes the package splits two ways (fold)
              replace(m, name="mtp2_B64_ctx8192_H16", seq_len=8192), replace(m, name="mtp2_B48_ctx4096_H16", batch=48),
              replace(m, name="B64_ctx4096_H16", q_len=1), replace(m, name="B48_ctx4096_H16", q_len=1, batch=48),
              replace(m, name="mtp2_B56_ctx4096_H16", batch=56), replace(m, name="mtp2_B60_ctx4096_H16", batch=60),
              replace(m, name="B56_ctx4096_H16", q_len=1, batch=56), replace(m, name="B60_ctx4096_H16", q_len=1, batch=60)]
    if sys.argv[1:2] == ["compile"]:
        import sass_report as S
        {"cluster": clustered, "fold": folded}[sys.argv[2]]()
        S.mla_sm90 = P.pkg.mla_sm90
        s, plan = S.shapes()["mtp2_B64_ctx4096_H16"]
        with S.captured_launches(132) as launches:
            plan(s)
        for kernel, kw in launches:
            print(kernel.__name__, {k: v for k, v in kw.items() if k in ("ROWS", "WARPS", "STAGES", "BLOCK_Q")})
            if "narrow" in kernel.__name__:
                c = S.compile_for(kernel, kw, 90)
                sass = S.cuobjdump(c, "-sass")
                print(S.compile_launch(kernel, kw, 90))
                print("multicast", sass.count("UTMALDG.2D.MULTICAST"), "remote arrive", sass.count("RED.A1T0"),
                      "cluster bar", sass.count("UCGABAR"), "reqnctapercluster", ".reqnctapercluster" in c.asm["ptx"])
        package()
        return
    def plain():
        package()
        P.tmla._SHORT_SPLITS = short

    variants = {"package": plain, "fold": folded, "cluster": clustered, "tok": tok}
    wanted = os.environ.get("PROBE_VARIANTS")
    variants = {k: v for k, v in variants.items() if not wanted or k in wanted.split(",")}
    P.compare(shapes, variants, 3,
              lambda p: f"splits {P.splits(p)} block_q {p.get('block_q')}")
    plain()


if __name__ == "__main__":
    main()
