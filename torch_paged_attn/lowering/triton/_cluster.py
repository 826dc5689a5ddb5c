"""Pairs of CTAs for the Gluon sm_90 kernels: what Triton 3.6's Gluon does not expose (a kernel
launched as clusters of two CTAs, an mbarrier arrive on the other CTA's barrier, a store into the
other CTA's shared memory), added to the kernel's PTX on its way to ptxas.

A kernel that calls ``cluster_pair`` carries ``MARK`` in its PTX. For such PTX only, ``rewrite``
(run by the compile stage hook ``install`` sets) makes three edits and raises if one finds nothing:
- ``.reqnctapercluster 2, 1, 1`` on the entry: the cluster is compiled in, so every launcher
  (Triton's, the package's, a CUDA graph's) launches the grid as clusters of two CTAs, consecutive
  along axis 0 (CTA ``2k + r`` is rank ``r`` of cluster ``k``); axis 0 of the grid must be even;
- ``cluster_pair``'s ``0`` becomes ``1``, so the kernel knows its binary was rewritten; where it
  was not (the hook replaced after this module was imported and a cached binary served), the
  kernel must not rely on its pair (``mla_sm90_narrow``'s fold then runs on one CTA);
- every plain ``mbarrier.arrive`` (``mbarrier.arrive(bar)`` in Gluon; ``expect`` and the copies'
  completions are other instructions) becomes a release at cluster scope on the barrier at the
  same shared-memory offset in the other CTA of the pair (``mapa``, the other rank).
Where the kernel marks a region with ``remote_begin`` / ``remote_end``, every shared-memory store
in it becomes a store at the same offset in the other CTA's shared memory (``st.shared::cluster``
through ``mapa``); a region with no store or with another shared-memory instruction raises. The
stores are ordered before a later arrive by a ``cluster_fence`` between them.
Before anything reaches the other CTA, both CTAs pass ``cluster_sync`` after their barriers' init
(``fence.mbarrier_init`` then a cluster barrier); a CTA waits for every arrival addressed to it
before it exits.

The marker names the rewrite's version: it is part of the kernel's source, so Triton's cache key
changes with it (Triton 3.6's key does not cover stage hooks; later ones ask the hook for a part).
"""

from __future__ import annotations

import hashlib
import re

# in the PTX of a kernel that calls cluster_pair (a comment of its inline assembly)
MARK = "tpa-cluster-pair-v2"
BEGIN, END = "tpa-remote-begin", "tpa-remote-end"  # remote_begin / remote_end
_REQNTID = re.compile(r"(\n\.(?:reqntid|maxntid) [^\n]*\n)")
_FLAG = re.compile(r"mov\.u32 (%r\d+), 0; // " + re.escape(MARK))
_ARRIVE = re.compile(r"(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\];")
_REGION = re.compile(r"// " + BEGIN + r"\n(.*?)// " + END + r"\n", re.S)
_STORE = re.compile(r"(@!?%p\d+ )?st\.shared\.((?:v[248]\.)?[bfsu]\d+)\s+\[(%r\d+)((?:\+-?\d+)?)\], ([^;]*);")
_PEER = "{ .reg .b32 tpa_r, tpa_a; mov.u32 tpa_r, %%cluster_ctarank; xor.b32 tpa_r, tpa_r, 1; " \
        "mapa.shared::cluster.u32 tpa_a, %s, tpa_r; "  # tpa_a: %s's offset in the other CTA's shared memory


def rewrite(ptx: str) -> str:
    """``ptx`` with the edits above where it carries ``MARK``; other PTX unchanged. Raises
    ``RuntimeError`` where an edit finds nothing to change (another Triton's PTX)."""
    if MARK not in ptx:
        return ptx
    ptx, entries = _REQNTID.subn(r"\1.reqnctapercluster 2, 1, 1\n", ptx, count=1)
    ptx, flags = _FLAG.subn(r"mov.u32 \1, 1; // " + MARK, ptx)
    ptx, arrives = _ARRIVE.subn(
        lambda m: (_PEER % m.group(2)
                   + "%smbarrier.arrive.release.cluster.shared::cluster.b64 _, [tpa_a]; }" % (m.group(1) or "")),
        ptx)
    ptx = _REGION.sub(_remote, ptx)
    if not (entries and flags and arrives):
        raise RuntimeError(f"torch_paged_attn: the CTA-pair PTX rewrite found {entries} entry directive(s), "
                           f"{flags} flag(s) and {arrives} mbarrier arrive(s); this Triton's PTX is not the one it "
                           "was written for")
    return ptx


def _remote(region: re.Match) -> str:
    """A ``remote_begin`` / ``remote_end`` region of PTX with each shared-memory store made a store
    to the other CTA's shared memory at the same offset; raises where the region has none, or
    other shared-memory instructions (which would still reach this CTA's)."""
    body, stores = _STORE.subn(
        lambda m: (_PEER % m.group(3)
                   + "%sst.shared::cluster.%s [tpa_a%s], %s; }" % (m.group(1) or "", m.group(2), m.group(4), m.group(5))),
        region.group(1))
    others = [line.strip() for line in body.splitlines()
              if ".shared" in line and "shared::cluster" not in line and not line.lstrip().startswith("//")]
    if not stores or others:
        raise RuntimeError(f"torch_paged_attn: the CTA-pair PTX rewrite found {stores} shared-memory store(s) "
                           f"and {len(others)} other shared-memory instruction(s) in a remote region "
                           f"({others[:2]}); this Triton's PTX is not the one it was written for")
    return f"// {BEGIN}\n{body}// {END}\n"


def _hook(previous):
    def hook(*args):
        if not args:  # Triton >= 3.7 asks for the hook's part of its cache keys: (key, hash)
            key = (previous()[0] if previous is not None else "") + MARK
            return key, hashlib.sha256(key.encode()).hexdigest()
        backend, stages, options, language, capability = args
        if previous is not None:
            previous(backend, stages, options, language, capability)
        if "ptx" in stages:
            make = stages["ptx"]
            stages["ptx"] = lambda src, metadata: rewrite(make(src, metadata))
    hook.tpa_cluster_pair, hook.tpa_previous = True, previous  # (_launch.FastLauncher.idle reads both)
    return hook


def install() -> None:
    """Triton's compile stage hook (``knobs.runtime.add_stages_inspection_hook``) with ``rewrite``
    after the PTX stage, after whatever hook was set before (kept and called first); once. Triton
    3.6 calls it with the stages only; later ones also without arguments, for their cache keys.
    A Triton without the hook keeps its binaries unpaired (the fold then runs on one CTA)."""
    try:
        from triton import knobs

        current = knobs.runtime.add_stages_inspection_hook
    except (ImportError, AttributeError):
        return
    if not getattr(current, "tpa_cluster_pair", False):
        knobs.runtime.add_stages_inspection_hook = _hook(current)


try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

if gluon is not None:
    _FLAG_ASM = gl.constexpr("mov.u32 $0, 0; // " + MARK)
    _BEGIN_ASM = gl.constexpr("mov.u32 $0, 0; // " + BEGIN)
    _END_ASM = gl.constexpr("mov.u32 $0, 0; // " + END)

    @gluon.jit
    def cluster_pair(x):
        """1 where the kernel's binary was rewritten (launched as pairs of CTAs), else 0; ``x``
        any scalar (the inline assembly's operand)."""
        return gl.inline_asm_elementwise(_FLAG_ASM, "=r,r", [x], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def cluster_sync(x):
        """Every CTA of the cluster here, this CTA's barriers' init visible to the others (after
        ``mbarrier.init``); ``x`` any scalar."""
        gl.inline_asm_elementwise(
            "fence.mbarrier_init.release.cluster;\n\tbarrier.cluster.arrive.release.aligned;\n\t"
            "barrier.cluster.wait.acquire.aligned;\n\tmov.u32 $0, 0;",
            "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def remote_begin(x):
        """The shared-memory stores from here to ``remote_end`` go to the other CTA of the pair, at
        the same offsets (``rewrite``); ``x`` any scalar."""
        gl.inline_asm_elementwise(_BEGIN_ASM, "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def remote_end(x):
        """The end of ``remote_begin``'s stores; ``x`` any scalar."""
        gl.inline_asm_elementwise(_END_ASM, "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def cluster_fence(x):
        """``fence.acq_rel.cluster``: this thread's memory operations before it ordered, at cluster
        scope, before those after it; ``x`` any scalar."""
        gl.inline_asm_elementwise("fence.acq_rel.cluster;\n\tmov.u32 $0, 0;", "=r,r", [x], dtype=gl.int32,
                                  is_pure=False, pack=1)
