"""The CTA-pair PTX rewrite (``lowering/triton/_cluster.py``) on any machine: what it changes in
PTX that carries its marker, what it leaves alone, where it refuses, and the compile stage hook
that runs it (kept behind any hook set before it; Triton 3.6's call with the stages, later ones'
call for a cache key). The rewritten kernel itself runs in ``test_triton_mla.py``'s fold tests
on a GPU, and is compiled for sm_90 by ``test_benchmarks_smoke.py``."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from torch_paged_attn.lowering.triton import _cluster  # noqa: E402

# The shape of Triton 3.6's PTX for a kernel that calls cluster_pair, mbarrier.arrive, expect and
# a TMA copy (trimmed from the narrow MLA kernel's)
_PTX = f"""
.visible .entry _mla_narrow_kernel(
\t.param .u64 _mla_narrow_kernel_param_0
)
.reqntid 256
{{
\t.reg .pred \t%p<9>;
\tmov.u32 %r17, 0; // {_cluster.MARK}
\t@%p3 mbarrier.arrive.expect_tx.shared.b64 _, [%r40], 73728;
\t@%p4 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r5], [%rd1, {{%r6, %r7}}], [%r40];
\t@%p1 mbarrier.arrive.shared::cta.b64 _, [%r22];
\tmbarrier.arrive.shared::cta.b64 _, [%r23];
\tmbarrier.try_wait.parity.shared::cta.b64 %p2, [%r22], %r9;
\tret;
}}
"""


def test_rewrite_makes_pairs_of_ctas() -> None:
    out = _cluster.rewrite(_PTX)
    lines = out.splitlines()
    # the cluster compiled in, right after the block size
    assert lines[lines.index(".reqntid 256") + 1] == ".reqnctapercluster 2, 1, 1"
    assert out.count(".reqnctapercluster") == 1
    # the kernel learns it was rewritten
    assert f"mov.u32 %r17, 1; // {_cluster.MARK}" in out and f"mov.u32 %r17, 0; // {_cluster.MARK}" not in out
    # each plain arrive lands on the other CTA's barrier at its offset, predicate kept
    assert "mbarrier.arrive.shared::cta" not in out
    assert out.count("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [tpa_a];") == 2
    assert "mapa.shared::cluster.u32 tpa_a, %r22, tpa_r;" in out and "mapa.shared::cluster.u32 tpa_a, %r23, tpa_r;" in out
    assert "@%p1 mbarrier.arrive.release.cluster" in out
    assert out.count("xor.b32 tpa_r, tpa_r, 1;") == 2 and "mov.u32 tpa_r, %cluster_ctarank;" in out
    # the rest as it was: expect, the copy (no multicast), the wait
    for line in ("@%p3 mbarrier.arrive.expect_tx.shared.b64 _, [%r40], 73728;",
                 "mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r22], %r9;"):
        assert line in out
    assert "[%r5], [%rd1, {%r6, %r7}], [%r40];" in out and "multicast" not in out


def test_rewrite_leaves_other_ptx_alone() -> None:
    plain = _PTX.replace(f"// {_cluster.MARK}", "// another comment")
    assert _cluster.rewrite(plain) == plain


@pytest.mark.parametrize("missing", ["reqntid", "flag", "arrive"])
def test_rewrite_refuses_ptx_it_was_not_written_for(missing: str) -> None:
    ptx = {"reqntid": _PTX.replace(".reqntid 256", ".reqnthreads 256"),
           "flag": _PTX.replace(f"mov.u32 %r17, 0; // {_cluster.MARK}", f"mov.b32 %r17, 0; // {_cluster.MARK}"),
           "arrive": _PTX.replace("mbarrier.arrive.shared::cta.b64", "mbarrier.arrive.shared.b64")}[missing]
    with pytest.raises(RuntimeError, match="CTA-pair PTX rewrite"):
        _cluster.rewrite(ptx)


def test_install_keeps_the_hook_before_it(monkeypatch) -> None:
    from triton import knobs

    calls = []

    def previous(*args):
        if not args:
            return "prev-key", "prev-hash"
        calls.append(args[0])
        args[1]["ir"] = "touched"

    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", previous)
    _cluster.install()
    hook = knobs.runtime.add_stages_inspection_hook
    _cluster.install()  # once
    assert knobs.runtime.add_stages_inspection_hook is hook and hook is not previous
    stages = {"ptx": lambda src, metadata: _PTX, "cubin": lambda src, metadata: src}
    hook("backend", stages, None, None, 90)
    assert calls == ["backend"] and stages["ir"] == "touched"
    assert ".reqnctapercluster 2, 1, 1" in stages["ptx"]("llir", {})
    assert stages["cubin"]("x", {}) == "x"
    key, digest = hook()  # Triton >= 3.7: the hook's part of the cache key
    assert key == "prev-key" + _cluster.MARK and len(digest) == 64


def test_install_alone(monkeypatch) -> None:
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", None)
    _cluster.install()
    hook = knobs.runtime.add_stages_inspection_hook
    assert hook()[0] == _cluster.MARK
    stages = {"llir": lambda src, metadata: src}  # no PTX stage (another backend): nothing wrapped
    hook("backend", stages, None, None, None)
    assert set(stages) == {"llir"}


def test_install_without_the_hook(monkeypatch) -> None:
    """A Triton whose knobs have no stage hook: nothing installed, nothing raised."""
    from triton import knobs

    class Runtime:
        pass

    monkeypatch.setattr(knobs, "runtime", Runtime())
    _cluster.install()
    assert not hasattr(knobs.runtime, "add_stages_inspection_hook")


# remote_begin / remote_end around the stores of a fold's handover (Triton 3.6's PTX, trimmed)
_REMOTE = f"""
\tmov.u32 %r17, 0; // {_cluster.MARK}
\tmov.u32 %r50, 0; // {_cluster.BEGIN}
\t.loc\t1 367 23                        // mla_sm90_narrow.py:367:23
\tmul.f32 \t%f1, %f2, %f3;
\tst.shared.b32 \t[%r1328+147456], %r1329;
\t@%p5 st.shared.v2.b32 \t[%r60], {{%r61, %r62}};
\tmov.u32 %r51, 0; // {_cluster.END}
\tst.shared.b32 \t[%r70+16], %r71;
\tmbarrier.arrive.shared::cta.b64 _, [%r23];
"""


def test_rewrite_sends_a_regions_stores_to_the_other_cta() -> None:
    out = _cluster.rewrite(_PTX + _REMOTE)
    region = out[out.index(_cluster.BEGIN):out.index(_cluster.END)]
    # each store of the region at its offset in the other CTA's shared memory, predicate kept
    assert "st.shared.b32" not in region and "st.shared.v2" not in region
    assert ("mapa.shared::cluster.u32 tpa_a, %r1328, tpa_r; st.shared::cluster.b32 [tpa_a+147456], %r1329; }"
            in region)
    assert "mapa.shared::cluster.u32 tpa_a, %r60, tpa_r; @%p5 st.shared::cluster.v2.b32 [tpa_a], {%r61, %r62}; }" in region
    assert region.count("xor.b32 tpa_r, tpa_r, 1;") == 2 and "mul.f32 \t%f1, %f2, %f3;" in region
    # the store after the region stays in this CTA
    assert "\tst.shared.b32 \t[%r70+16], %r71;" in out[out.index(_cluster.END):]


@pytest.mark.parametrize("body", ["no stores", "a load"])
def test_rewrite_refuses_a_region_it_cannot_send(body: str) -> None:
    """A region without stores, or with another shared-memory instruction (which would still
    reach this CTA's memory), is not PTX the rewrite was written for."""
    if body == "no stores":
        ptx = _REMOTE.replace("\tst.shared.b32 \t[%r1328+147456], %r1329;\n", "").replace(
            "\t@%p5 st.shared.v2.b32 \t[%r60], {%r61, %r62};\n", "")
    else:
        ptx = _REMOTE.replace("\tmul.f32", "\tld.shared.b32 \t%r9, [%r8];\n\tmul.f32")
    with pytest.raises(RuntimeError, match="remote region"):
        _cluster.rewrite(_PTX + ptx)
