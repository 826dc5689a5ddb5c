"""The Triton merge_attn_states and merge_attn_states_n kernels against the reference backend
(merge_attn_states_n's interpreter tier: against the float64 loop of tests/_loop.py).

The truth is the reference merge evaluated in float64; the tolerance comes from the reference's
own error in the working precision (``assert_close``). LSEs mix finite values with -inf and +inf
(an empty part), including rows where both parts are empty (0 and -inf), and the output rows of
empty parts hold NaN, which must not leak. Outputs are poisoned with NaN before the kernel writes
them; inputs, outputs and LSEs are also tested as strided views.

Two tiers: the interpreter tier (``TRITON_INTERPRET=1``, CPU tensors, tiny shapes) and the GPU
tier (CUDA: larger shapes, CUDA-graph replay, torch.compile through the public ops, no host
synchronisation).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

import torch_paged_attn  # noqa: E402,F401  (registers the ops)
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import merge  # noqa: E402
from torch_paged_attn.testing import assert_close  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
interpreter_tier = pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")

INF = float("inf")
_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class MergeCase:
    num_tokens: int
    num_heads: int
    head_size: int
    dtype: torch.dtype = torch.bfloat16
    with_lse: bool = True
    strided: bool = False  # outputs sliced from wider buffers, LSEs stored head-major [H, T]

    @property
    def id(self) -> str:
        s = f"T{self.num_tokens}_H{self.num_heads}_D{self.head_size}_{_SHORT[self.dtype]}"
        s += "" if self.with_lse else "_nolse"
        return s + ("_strided" if self.strided else "")


SMALL = [
    MergeCase(13, 3, 32, torch.float32),
    MergeCase(13, 3, 32, torch.bfloat16, strided=True),
    MergeCase(9, 4, 80, torch.float16),
    MergeCase(9, 2, 64, torch.float32, with_lse=False, strided=True),
]
LARGE = [
    MergeCase(8192, 32, 128, torch.bfloat16),
    MergeCase(1000, 16, 256, torch.float16, strided=True),
    MergeCase(777, 5, 96, torch.float32),
    MergeCase(300, 128, 512, torch.bfloat16, with_lse=False),
]


def _out_tensor(shape: tuple[int, int, int], dtype: torch.dtype, strided: bool, device: str) -> torch.Tensor:
    """NaN-filled ``[T, H, D]``; strided: a slice of a ``[T, H, D + 24]`` buffer."""
    t, h, d = shape
    pad = 24 if strided else 0
    return torch.full((t, h, d + pad), float("nan"), dtype=dtype, device=device)[..., pad:]


def _lse_tensor(t: int, h: int, strided: bool, device: str) -> torch.Tensor:
    """NaN-filled ``[T, H]`` float32; strided: the transpose of an ``[H, T]`` buffer."""
    if strided:
        return torch.full((h, t), float("nan"), device=device).t()
    return torch.full((t, h), float("nan"), device=device)


def merge_inputs(case: MergeCase, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = (case.num_tokens, case.num_heads, case.head_size)
    lses = []
    for _ in range(2):
        lse = torch.randn(shape[:2], generator=g) * 4
        # 1 in 8 rows empty (-inf), 1 in 16 empty written as +inf
        kind = torch.randint(0, 16, shape[:2], generator=g)
        lse = torch.where(kind < 2, -INF, lse)
        lse = torch.where(kind == 2, INF, lse)
        lses.append(lse)
    lp, ls = lses
    # make sure rows where both parts are empty occur, in every combination of signs
    lp[0, 0], ls[0, 0] = -INF, -INF
    lp[-1, -1], ls[-1, -1] = INF, -INF
    lp[1, 0], ls[1, 0] = INF, INF
    outs = []
    for lse in (lp, ls):
        o = torch.randn(shape, generator=g).to(case.dtype)
        o[torch.isinf(lse)] = float("nan")  # an empty part's output is garbage
        outs.append(o)
    po, so = outs
    args = []
    for o, lse in ((po, lp), (so, ls)):
        o_dev = _out_tensor(shape, case.dtype, case.strided, device)
        o_dev.copy_(o)
        l_dev = _lse_tensor(case.num_tokens, case.num_heads, case.strided, device)
        l_dev.copy_(lse)
        args += [o_dev, l_dev]
    return args


def check_merge(case: MergeCase, device: str, seed: int) -> None:
    po, lp, so, ls = merge_inputs(case, device, seed)
    out = _out_tensor(tuple(po.shape), case.dtype, case.strided, device)
    lse = _lse_tensor(case.num_tokens, case.num_heads, case.strided, device) if case.with_lse else None
    merge.merge_attn_states(po, lp, so, ls, out, lse)
    truth_out, truth_lse = reference.merge(po.double(), lp.double(), so.double(), ls.double())
    ref_out, ref_lse = reference.merge(po, lp, so, ls)
    assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name="out")
    if lse is not None:
        assert_close(lse, truth_lse, dtype=torch.float32, reference=ref_lse, name="lse")
        assert (lse.cpu() == -INF).any(), "the case has no row with both parts empty"
    both_empty = torch.isinf(lp) & torch.isinf(ls)
    assert (out[both_empty] == 0).all(), "both parts empty must give 0"


@interpreter_tier
@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_merge_interpreted(case: MergeCase) -> None:
    check_merge(case, "cpu", seed=zlib.crc32(case.id.encode()))


@gpu_tier
@pytest.mark.parametrize("case", SMALL + LARGE, ids=lambda c: c.id)
def test_merge_cuda(case: MergeCase) -> None:
    check_merge(case, "cuda", seed=zlib.crc32(case.id.encode()))


@gpu_tier
def test_merge_cuda_graph_replay_and_no_host_sync() -> None:
    """Capture once (under sync-debug "error"), refill the inputs in place, replay."""
    case = MergeCase(512, 8, 128, torch.bfloat16)
    po, lp, so, ls = merge_inputs(case, "cuda", seed=1)
    out = _out_tensor(tuple(po.shape), case.dtype, False, "cuda")
    lse = _lse_tensor(case.num_tokens, case.num_heads, False, "cuda")
    merge.merge_attn_states(po, lp, so, ls, out, lse)  # compile outside capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        merge.merge_attn_states(po, lp, so, ls, out, lse)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            merge.merge_attn_states(po, lp, so, ls, out, lse)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed in (2, 3):
        for dst, src in zip((po, lp, so, ls), merge_inputs(case, "cuda", seed=seed)):
            dst.copy_(src)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        truth_out, truth_lse = reference.merge(po.double(), lp.double(), so.double(), ls.double())
        ref_out, ref_lse = reference.merge(po, lp, so, ls)
        assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name=f"replay {seed}: out")
        assert_close(lse, truth_lse, dtype=torch.float32, reference=ref_lse, name=f"replay {seed}: lse")


@gpu_tier
def test_merge_ops_compiled() -> None:
    """torch.compile(fullgraph=True) over the public functional and _out ops."""
    case = MergeCase(256, 8, 128, torch.float16)
    po, lp, so, ls = merge_inputs(case, "cuda", seed=4)
    out = _out_tensor(tuple(po.shape), case.dtype, False, "cuda")

    def step(po, lp, so, ls, out):
        o, s = torch.ops.paged_attn.merge_attn_states(po, lp, so, ls)
        torch.ops.paged_attn.merge_attn_states_out(po, lp, so, ls, out, None)
        return o, s

    o, s = torch.compile(step, fullgraph=True)(po, lp, so, ls, out)
    truth_out, truth_lse = reference.merge(po.double(), lp.double(), so.double(), ls.double())
    ref_out, ref_lse = reference.merge(po, lp, so, ls)
    for name, got in (("functional out", o), ("_out out", out)):
        assert_close(got, truth_out, dtype=case.dtype, reference=ref_out, name=name)
    assert_close(s, truth_lse, dtype=torch.float32, reference=ref_lse, name="lse")


# -- merge_attn_states_n -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeNCase:
    num_parts: int
    num_tokens: int
    num_heads: int
    head_size: int
    dtype: torch.dtype = torch.float32
    with_lse: bool = True
    strided: bool = False  # parts sliced from wider buffers, LSEs stored head-major [N, H, T]

    @property
    def id(self) -> str:
        s = f"N{self.num_parts}_T{self.num_tokens}_H{self.num_heads}_D{self.head_size}_{_SHORT[self.dtype]}"
        s += "" if self.with_lse else "_nolse"
        return s + ("_strided" if self.strided else "")


SMALL_N = [
    MergeNCase(1, 7, 3, 32),
    MergeNCase(2, 9, 2, 64, torch.bfloat16),
    MergeNCase(3, 13, 3, 80, torch.float16, strided=True),
    MergeNCase(5, 6, 4, 32, with_lse=False, strided=True),
]
LARGE_N = [
    MergeNCase(2, 8192, 32, 128, torch.bfloat16),
    MergeNCase(4, 1000, 16, 512, torch.bfloat16, strided=True),
    MergeNCase(8, 777, 5, 96, torch.float32, with_lse=False),
]


def merge_n_inputs(case: MergeNCase, device: str, seed: int):
    """``outs [N, T, H, D]``, ``lses [N, T, H]``: 1 in 8 entries empty (-inf), 1 in 16 empty
    written as +inf, empty parts' outputs NaN; rows empty in every part, with both markers."""
    g = torch.Generator().manual_seed(seed)
    n, t, h, d = case.num_parts, case.num_tokens, case.num_heads, case.head_size
    lses = torch.randn(n, t, h, generator=g) * 4
    kind = torch.randint(0, 16, (n, t, h), generator=g)
    lses = torch.where(kind < 2, -INF, lses)
    lses = torch.where(kind == 2, INF, lses)
    lses[:, 0, 0] = -INF
    lses[:, -1, -1] = INF
    outs = torch.randn(n, t, h, d, generator=g).to(case.dtype)
    outs[torch.isinf(lses)] = float("nan")
    pad = 24 if case.strided else 0
    outs_dev = torch.full((n, t, h, d + pad), float("nan"), dtype=case.dtype, device=device)[..., pad:]
    outs_dev.copy_(outs)
    if case.strided:
        lses_dev = torch.full((n, h, t), float("nan"), device=device).transpose(1, 2)
    else:
        lses_dev = torch.full((n, t, h), float("nan"), device=device)
    lses_dev.copy_(lses)
    return outs_dev, lses_dev


def check_merge_n(case: MergeNCase, device: str, seed: int, truth=None) -> None:
    outs, lses = merge_n_inputs(case, device, seed)
    shape = (case.num_tokens, case.num_heads, case.head_size)
    out = _out_tensor(shape, case.dtype, case.strided, device)  # NaN until the kernel writes
    lse = _lse_tensor(case.num_tokens, case.num_heads, case.strided, device) if case.with_lse else None
    merge.merge_attn_states_n(outs, lses, out, lse)
    truth_out, truth_lse = truth(outs.cpu(), lses.cpu()) if truth else reference.merge_n(outs.double(), lses.double())
    ref_out, ref_lse = reference.merge_n(outs, lses)
    assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name="out")
    if lse is not None:
        assert_close(lse, truth_lse, dtype=torch.float32, reference=ref_lse, name="lse")
    all_empty = torch.isinf(lses).all(dim=0)
    assert all_empty.any() and (out[all_empty] == 0).all(), "rows empty in every part must give 0"


@interpreter_tier
@pytest.mark.parametrize("case", SMALL_N, ids=lambda c: c.id)
def test_merge_n_interpreted(case: MergeNCase) -> None:
    """Against the float64 loop of tests/_loop.py."""
    import _loop

    check_merge_n(case, "cpu", seed=zlib.crc32(case.id.encode()), truth=_loop.merge_attn_states_n)


@gpu_tier
@pytest.mark.parametrize("case", SMALL_N + LARGE_N, ids=lambda c: c.id)
def test_merge_n_cuda(case: MergeNCase) -> None:
    check_merge_n(case, "cuda", seed=zlib.crc32(case.id.encode()))


@gpu_tier
def test_merge_n_cuda_graph_replay_and_compiled() -> None:
    """Capture once under sync-debug "error" and replay on new inputs; then the public functional
    and _out ops under torch.compile(fullgraph=True)."""
    case = MergeNCase(4, 512, 8, 128, torch.bfloat16)
    outs, lses = merge_n_inputs(case, "cuda", seed=1)
    out = torch.empty(outs.shape[1:], dtype=case.dtype, device="cuda")
    lse = torch.empty(lses.shape[1:], device="cuda")
    merge.merge_attn_states_n(outs, lses, out, lse)  # compile outside capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            merge.merge_attn_states_n(outs, lses, out, lse)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    new_outs, new_lses = merge_n_inputs(case, "cuda", seed=2)
    outs.copy_(new_outs)
    lses.copy_(new_lses)
    out.fill_(float("nan"))
    graph.replay()
    truth_out, truth_lse = reference.merge_n(outs.double(), lses.double())
    ref_out, ref_lse = reference.merge_n(outs, lses)
    assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name="replay: out")
    assert_close(lse, truth_lse, dtype=torch.float32, reference=ref_lse, name="replay: lse")

    def step(outs, lses, out):
        o, s = torch.ops.paged_attn.merge_attn_states_n(outs, lses)
        torch.ops.paged_attn.merge_attn_states_n_out(outs, lses, out, None)
        return o, s

    out2 = torch.full_like(out, float("nan"))
    o, s = torch.compile(step, fullgraph=True)(outs, lses, out2)
    for name, got in (("functional out", o), ("_out out", out2)):
        assert_close(got, truth_out, dtype=case.dtype, reference=ref_out, name=name)
    assert_close(s, truth_lse, dtype=torch.float32, reference=ref_lse, name="lse")


# -- NaN given as data -------------------------------------------------------------------------


def check_nan_lse(device: str) -> None:
    """A NaN LSE in any part of a merge (beside a finite part, an empty one, another NaN one) makes
    that row's out and lse NaN, in both kernels, as the reference and the float64 loop have it;
    rows without a NaN LSE keep the reference's values."""
    g = torch.Generator().manual_seed(77)
    t, h, d = 6, 3, 40
    po, so = (torch.randn(t, h, d, generator=g).to(device) for _ in range(2))
    pl, sl = (torch.randn(t, h, generator=g).to(device) for _ in range(2))
    nan = float("nan")
    pl[0, 0], sl[1, 1], pl[2, 2], sl[2, 2] = nan, nan, nan, nan  # prefix, suffix, both
    pl[3, 0], sl[3, 0] = nan, float("-inf")  # beside an empty part
    pl[4, 1], sl[4, 1] = INF, nan  # beside a +inf (empty) part
    rows = torch.zeros(t, h, dtype=torch.bool, device=device)
    rows[0, 0] = rows[1, 1] = rows[2, 2] = rows[3, 0] = rows[4, 1] = True
    parts = (((po, pl, so, sl), merge.merge_attn_states, reference.merge),
             (((torch.stack([po, so, po]), torch.stack([pl, sl, torch.zeros_like(pl)])),
               merge.merge_attn_states_n, reference.merge_n)))
    for args, kernel, ref in parts:
        out, lse = _out_tensor((t, h, d), torch.float32, False, device), _lse_tensor(t, h, False, device)
        kernel(*args, out, lse)
        want_out, want_lse = ref(*args)
        assert torch.equal(lse.isnan(), rows) and torch.equal(want_lse.isnan(), rows)
        assert torch.equal(out.isnan(), rows[..., None].expand_as(out))
        assert_close(out[~rows], want_out[~rows].double(), dtype=torch.float32, name="out")
        assert_close(lse[~rows], want_lse[~rows].double(), dtype=torch.float32, name="lse")


@interpreter_tier
def test_nan_lse_interpreted() -> None:
    check_nan_lse("cpu")


@gpu_tier
def test_nan_lse_cuda() -> None:
    check_nan_lse("cuda")
