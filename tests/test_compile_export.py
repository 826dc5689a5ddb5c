"""The ops under ``torch.compile(fullgraph=True)`` and ``torch.export`` on CPU (issue: foundation, 5).

Small modules call the ops the way a model does (a paged decode step, an MLA step with an fp8
cache, a context gather, a merge, a cascade through the ``_out`` forms). For each:

- a recording dynamo backend sees exactly one ``torch.ops.paged_attn.*`` node per call, and
  changing seq_lens / block_table / slot_mapping values does not recompile;
- Inductor's compiled module gives the eager outputs (float32 rounding aside) and mutates the
  caches bitwise like eager;
- ``torch.export.export`` keeps one node per call (graph text snapshotted inline), its module
  gives eager's outputs and mutations bitwise, and so does a ``save``/``load`` round trip.

Every input is freshly seeded; ``out``/``lse`` buffers and uncovered cache slots start as NaN.
"""

from __future__ import annotations

import io
import unittest
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

import torch_paged_attn as pa
from torch_paged_attn.testing import FP8_DTYPES, make_block_table, make_paged_batch, random_cache

try:
    import expecttest
except ImportError:  # only the graph snapshots need it (the `test` extra installs it)
    expecttest = None

NAN = float("nan")


# -- modules -------------------------------------------------------------------------------------------


class DecodeStep(nn.Module):
    """Write the new tokens' keys and values into the cache, then attend over it."""

    def forward(
        self, query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens, query_start_loc
    ):
        pa.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return pa.paged_attention(
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
            scale=0.125, max_query_len=1, return_lse=True,
        )


class MLAStep(nn.Module):
    """Write the new tokens' latent and rope parts into an fp8 cache, then absorbed MLA decode."""

    def forward(
        self, q_latent, q_rope, kv_c, k_pe, kv_cache, slot_mapping, block_table, seq_lens, query_start_loc, kv_scale
    ):
        pa.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_scale)
        return pa.mla_decode(
            q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, scale=0.09, kv_scale=kv_scale
        )


class GatherContext(nn.Module):
    """Gather cached context tokens into one buffer (MLA chunked prefill), then use it."""

    def forward(self, kv_cache, block_table, cu_seq_lens, seq_starts, out):
        pa.gather_cache(kv_cache, block_table, cu_seq_lens, seq_starts, out)
        return out.sum(dim=-1)


class Merge(nn.Module):
    def forward(self, prefix_out, prefix_lse, suffix_out, suffix_lse):
        return pa.merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse)


class MergeN(nn.Module):
    """N-way merge (one part per context-parallel rank), functional and into given buffers."""

    def forward(self, outs, lses, out):
        pa.merge_attn_states_n_out(outs, lses, out)
        return pa.merge_attn_states_n(outs, lses)


class CascadeOut(nn.Module):
    """Cascade attention through the ``_out`` forms: a shared prefix (non-causal) and each
    sequence's own suffix (causal) into preallocated buffers, merged into ``out``/``lse``."""

    def forward(self, query, prefix_kc, prefix_vc, prefix_bt, prefix_lens, suffix_kc, suffix_vc, suffix_bt,
                suffix_lens, query_start_loc, out, lse):
        num_tokens, num_heads, head_size = query.shape
        prefix_out = query.new_empty(num_tokens, num_heads, head_size)
        suffix_out = query.new_empty(num_tokens, num_heads, head_size)
        prefix_lse = query.new_empty(num_tokens, num_heads, dtype=torch.float32)
        suffix_lse = query.new_empty(num_tokens, num_heads, dtype=torch.float32)
        pa.paged_attention_out(
            query, prefix_kc, prefix_vc, prefix_bt, prefix_lens, query_start_loc, prefix_out, prefix_lse,
            scale=0.125, causal=False,
        )
        pa.paged_attention_out(
            query, suffix_kc, suffix_vc, suffix_bt, suffix_lens, query_start_loc, suffix_out, suffix_lse,
            scale=0.125,
        )
        pa.merge_attn_states_out(prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse)


# -- inputs --------------------------------------------------------------------------------------------


def _new_token_slots(block_table: Tensor, kv_lens: list[int], block_size: int) -> list[int]:
    """The slot of each sequence's last key (the token being decoded)."""
    return [
        int(block_table[i, (n - 1) // block_size]) * block_size + (n - 1) % block_size
        for i, n in enumerate(kv_lens)
    ]


def _decode_inputs(seed: int, kv_lens: tuple[int, ...] = (17, 1, 5)) -> tuple:
    """Three decode sequences (``kv_lens`` keys, the last one new) and one padding row."""
    kv_lens = list(kv_lens)
    b = make_paged_batch(
        [1, 1, 1], kv_lens, num_heads=4, num_kv_heads=2, head_size=32, pad_tokens=1, seed=seed
    )
    g = torch.Generator().manual_seed(seed + 1000)
    key = torch.randn(4, 2, 32, generator=g)
    value = torch.randn(4, 2, 32, generator=g)
    slots = torch.tensor(_new_token_slots(b.block_table, kv_lens, 16) + [-1])
    return (
        b.query, key, value, b.key_cache, b.value_cache, slots, b.block_table, b.seq_lens, b.query_start_loc
    )


def _mla_inputs(seed: int) -> tuple:
    """Two decode sequences (20 and 3 keys) over an fp8 latent cache (L 64, R 16) whose uncovered
    slots hold NaN bytes."""
    kv_lens = [20, 3]
    g = torch.Generator().manual_seed(seed)
    table, covered = make_block_table(kv_lens, 16, 5, g)
    cache = random_cache((5, 16, 80), torch.float8_e4m3fn, "cpu", g, scale=0.5)
    cache.view(torch.uint8)[~covered] = 0x7F
    return (
        torch.randn(2, 4, 64, generator=g),
        torch.randn(2, 4, 16, generator=g),
        torch.randn(2, 64, generator=g),
        torch.randn(2, 16, generator=g),
        cache,
        torch.tensor(_new_token_slots(table, kv_lens, 16)),
        table,
        torch.tensor(kv_lens, dtype=torch.int32),
        torch.tensor([0, 1, 2], dtype=torch.int32),
        torch.tensor([0.5]),
    )


def _gather_inputs(seed: int) -> tuple:
    """A bf16 ``[NB, 16, 2, 32]`` cache; tokens 7..16 of sequence 0 and 0..4 of sequence 1 into a
    float32 buffer with two spare rows (which stay NaN)."""
    g = torch.Generator().manual_seed(seed)
    table, _ = make_block_table([17, 5], 16, 5, g)
    return (
        random_cache((5, 16, 2, 32), torch.bfloat16, "cpu", g),
        table,
        torch.tensor([0, 10, 15], dtype=torch.int32),
        torch.tensor([7, 0], dtype=torch.int32),
        torch.full((17, 2, 32), NAN),
    )


def _merge_inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    prefix_lse = torch.randn(5, 3, generator=g) * 3
    suffix_lse = torch.randn(5, 3, generator=g) * 3
    prefix_lse[0, 0] = suffix_lse[1, 1] = float("-inf")
    prefix_lse[2] = suffix_lse[2] = float("-inf")
    return (torch.randn(5, 3, 32, generator=g), prefix_lse, torch.randn(5, 3, 32, generator=g), suffix_lse)


def _merge_n_inputs(seed: int) -> tuple:
    """Three parts; an entry empty as -inf, one as +inf, a row empty in every part."""
    g = torch.Generator().manual_seed(seed)
    lses = torch.randn(3, 5, 2, generator=g) * 3
    lses[0, 0, 0], lses[2, 1, 1] = float("-inf"), float("inf")
    lses[:, 3] = float("-inf")
    return (torch.randn(3, 5, 2, 32, generator=g), lses, torch.full((5, 2, 32), NAN))


def _cascade_inputs(seed: int) -> tuple:
    """Three sequences (2, 1 and 3 new tokens) sharing a 32-token prefix held in one block table
    row, each with its own suffix (5, 1 and 19 keys)."""
    q_lens = [2, 1, 3]
    prefix = make_paged_batch(q_lens, [32], num_heads=4, num_kv_heads=1, seed=seed)
    suffix = make_paged_batch(q_lens, [5, 1, 19], num_heads=4, num_kv_heads=1, seed=seed + 1)
    num_tokens = sum(q_lens)
    return (
        suffix.query,
        prefix.key_cache,
        prefix.value_cache,
        prefix.block_table.expand(3, -1).contiguous(),
        torch.full((3,), 32, dtype=torch.int32),
        suffix.key_cache,
        suffix.value_cache,
        suffix.block_table,
        suffix.seq_lens,
        suffix.query_start_loc,
        torch.full((num_tokens, 4, 32), NAN),
        torch.full((num_tokens, 4), NAN),
    )


@dataclass
class Step:
    id: str
    module: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]  # seed -> fresh inputs
    calls: list[str]  # the paged_attn ops the module calls, in order
    caches: tuple[int, ...] = ()  # inputs written by copying (bitwise equal under compile)
    outs: tuple[int, ...] = ()  # inputs written with computed values


STEPS = [
    Step("decode", DecodeStep, _decode_inputs, ["reshape_and_cache", "paged_attention"], caches=(3, 4)),
    Step("mla_fp8", MLAStep, _mla_inputs, ["concat_and_cache_mla", "mla_decode"], caches=(4,)),
    Step("gather", GatherContext, _gather_inputs, ["gather_cache"], outs=(4,)),
    Step("merge", Merge, _merge_inputs, ["merge_attn_states"]),
    Step("merge_n", MergeN, _merge_n_inputs, ["merge_attn_states_n_out", "merge_attn_states_n"], outs=(2,)),
    Step(
        "cascade_out", CascadeOut, _cascade_inputs,
        ["paged_attention_out", "paged_attention_out", "merge_attn_states_out"], outs=(10, 11),
    ),
]
STEP_IDS = [s.id for s in STEPS]


# -- helpers -------------------------------------------------------------------------------------------


def _paged_attn_calls(graph: torch.fx.Graph) -> list[str]:
    """Names of the ``torch.ops.paged_attn`` ops a graph calls, in order."""
    calls = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, torch._ops.OpOverload):
            qualified = node.target._schema.name
        elif isinstance(node.target, torch._ops.OpOverloadPacket):
            qualified = node.target._qualified_op_name
        else:
            continue
        namespace, _, name = qualified.partition("::")
        if namespace == "paged_attn":
            calls.append(name)
    return calls


def _flat(result) -> list[Tensor]:
    if result is None:
        return []
    if isinstance(result, Tensor):
        return [result]
    return list(result)


def _bits(t: Tensor) -> Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _assert_bitwise(actual: Tensor, expected: Tensor, name: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
    assert torch.equal(_bits(actual), _bits(expected)), f"{name} differs from eager"


def _assert_close(actual: Tensor, expected: Tensor, name: str) -> None:
    """Equal up to float32 reassociation (Inductor fuses the reference's arithmetic); NaN and
    infinities where eager has them, nowhere else."""
    if actual.dtype in FP8_DTYPES:
        _assert_bitwise(actual, expected, name)
        return
    torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{name}: {m}")


def _run(module: Callable, inputs: tuple) -> tuple[list[Tensor], tuple]:
    """Run on clones of ``inputs``; returns the outputs and the (possibly mutated) clones."""
    args = tuple(t.clone() for t in inputs)
    return _flat(module(*args)), args


def _check_same(
    step: Step, got: tuple[list[Tensor], tuple], want: tuple[list[Tensor], tuple], exact: bool
) -> None:
    """Outputs and mutated inputs of a run against eager's: ``exact`` (bitwise) or up to float32
    rounding; caches bitwise either way, and inputs the step does not write stay untouched."""
    (got_out, got_args), (want_out, want_args) = got, want
    assert len(got_out) == len(want_out)
    check = _assert_bitwise if exact else _assert_close
    for i, (g, w) in enumerate(zip(got_out, want_out)):
        check(g, w, f"output {i}")
    for i in step.caches:
        _assert_bitwise(got_args[i], want_args[i], f"cache input {i}")
    for i in step.outs:
        check(got_args[i], want_args[i], f"out input {i}")
    for i, (g, w) in enumerate(zip(got_args, want_args)):
        if i not in step.caches + step.outs:
            _assert_bitwise(g, w, f"input {i} (not mutated)")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# -- torch.compile -------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS, ids=STEP_IDS)
def test_dynamo_graph_has_one_node_per_call(step: Step):
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    module = step.module()
    inputs = step.inputs(0)
    want = _run(module, inputs)
    got = _run(torch.compile(module, backend=record, fullgraph=True), inputs)
    assert len(graphs) == 1
    assert _paged_attn_calls(graphs[0].graph) == step.calls
    # the recorded graph runs the same ops eagerly, in the same order: bitwise eager
    _check_same(step, got, want, exact=True)


def test_new_lengths_tables_and_slots_do_not_recompile():
    """Seq lens, block tables and slots change every decode step; only shapes may guard."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(DecodeStep(), backend=record, fullgraph=True)
    first, second = _decode_inputs(1, (17, 1, 5)), _decode_inputs(2, (18, 2, 6))
    for i in (5, 6, 7):  # slot_mapping, block_table, seq_lens
        assert not torch.equal(first[i], second[i])
    compiled(*first)
    compiled(*second)
    assert len(graphs) == 1


@pytest.mark.parametrize("step", STEPS, ids=STEP_IDS)
def test_inductor_matches_eager(step: Step):
    module = step.module()
    inputs = step.inputs(3)
    want = _run(module, inputs)
    got = _run(torch.compile(module, fullgraph=True), inputs)
    _check_same(step, got, want, exact=False)


# -- torch.export --------------------------------------------------------------------------------------


def _export(step: Step, seed: int = 4) -> tuple[torch.export.ExportedProgram, tuple]:
    inputs = step.inputs(seed)
    ep = torch.export.export(step.module(), tuple(t.clone() for t in inputs))
    return ep, inputs


@pytest.mark.parametrize("step", STEPS, ids=STEP_IDS)
def test_export_runs_like_eager(step: Step):
    ep, inputs = _export(step)
    assert _paged_attn_calls(ep.graph) == step.calls
    want = _run(step.module(), inputs)
    _check_same(step, _run(ep.module(), inputs), want, exact=True)

    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    assert _paged_attn_calls(loaded.graph) == step.calls
    _check_same(step, _run(loaded.module(), inputs), want, exact=True)


@unittest.skipIf(expecttest is None, "expecttest is not installed")
class TestExportedGraphs(expecttest.TestCase if expecttest is not None else unittest.TestCase):
    """The exported graph text: one ``torch.ops.paged_attn`` call per op call, with every
    argument spelled out. Regenerate with ``EXPECTTEST_ACCEPT=1``."""

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def _code(self, step_id: str) -> str:
        (step,) = [s for s in STEPS if s.id == step_id]
        ep, _ = _export(step)
        return ep.graph_module.code.strip()

    def test_decode(self):
        self.assertExpectedInline(self._code("decode"), """\
def forward(self, query, key, value, key_cache, value_cache, slot_mapping, block_table, seq_lens, query_start_loc):
    reshape_and_cache = torch.ops.paged_attn.reshape_and_cache.default(key, value, key_cache, value_cache, slot_mapping);  key = value = slot_mapping = reshape_and_cache = None
    paged_attention = torch.ops.paged_attn.paged_attention.default(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, 0.125, True, -1, -1, 0.0, None, None, None, None, 0, 1, True);  query = key_cache = value_cache = block_table = seq_lens = query_start_loc = None
    getitem = paged_attention[0]
    getitem_1 = paged_attention[1];  paged_attention = None
    return (getitem, getitem_1)""")

    def test_mla_fp8(self):
        self.assertExpectedInline(self._code("mla_fp8"), """\
def forward(self, q_latent, q_rope, kv_c, k_pe, kv_cache, slot_mapping, block_table, seq_lens, query_start_loc, kv_scale):
    concat_and_cache_mla = torch.ops.paged_attn.concat_and_cache_mla.default(kv_c, k_pe, kv_cache, slot_mapping, kv_scale);  kv_c = k_pe = slot_mapping = concat_and_cache_mla = None
    mla_decode = torch.ops.paged_attn.mla_decode.default(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, 0.09, True, kv_scale);  q_latent = q_rope = kv_cache = block_table = seq_lens = query_start_loc = kv_scale = None
    getitem = mla_decode[0]
    getitem_1 = mla_decode[1];  mla_decode = None
    return (getitem, getitem_1)""")

    def test_gather(self):
        self.assertExpectedInline(self._code("gather"), """\
def forward(self, kv_cache, block_table, cu_seq_lens, seq_starts, out):
    gather_cache = torch.ops.paged_attn.gather_cache.default(kv_cache, block_table, cu_seq_lens, seq_starts, out);  kv_cache = block_table = cu_seq_lens = seq_starts = gather_cache = None
    sum_1 = torch.ops.aten.sum.dim_IntList(out, [-1]);  out = None
    return (sum_1,)""")

    def test_merge(self):
        self.assertExpectedInline(self._code("merge"), """\
def forward(self, prefix_out, prefix_lse, suffix_out, suffix_lse):
    merge_attn_states = torch.ops.paged_attn.merge_attn_states.default(prefix_out, prefix_lse, suffix_out, suffix_lse);  prefix_out = prefix_lse = suffix_out = suffix_lse = None
    getitem = merge_attn_states[0]
    getitem_1 = merge_attn_states[1];  merge_attn_states = None
    return (getitem, getitem_1)""")

    def test_merge_n(self):
        self.assertExpectedInline(self._code("merge_n"), """\
def forward(self, outs, lses, out):
    merge_attn_states_n_out = torch.ops.paged_attn.merge_attn_states_n_out.default(outs, lses, out, None);  out = merge_attn_states_n_out = None
    merge_attn_states_n = torch.ops.paged_attn.merge_attn_states_n.default(outs, lses);  outs = lses = None
    getitem = merge_attn_states_n[0]
    getitem_1 = merge_attn_states_n[1];  merge_attn_states_n = None
    return (getitem, getitem_1)""")

    def test_cascade_out(self):
        self.assertExpectedInline(self._code("cascade_out"), """\
def forward(self, query, prefix_kc, prefix_vc, prefix_bt, prefix_lens, suffix_kc, suffix_vc, suffix_bt, suffix_lens, query_start_loc, out, lse):
    new_empty = torch.ops.aten.new_empty.default(query, [6, 4, 32], pin_memory = False)
    new_empty_1 = torch.ops.aten.new_empty.default(query, [6, 4, 32], pin_memory = False)
    new_empty_2 = torch.ops.aten.new_empty.default(query, [6, 4], dtype = torch.float32, pin_memory = False)
    new_empty_3 = torch.ops.aten.new_empty.default(query, [6, 4], dtype = torch.float32, pin_memory = False)
    paged_attention_out = torch.ops.paged_attn.paged_attention_out.default(query, prefix_kc, prefix_vc, prefix_bt, prefix_lens, query_start_loc, new_empty, new_empty_2, 0.125, False);  prefix_kc = prefix_vc = prefix_bt = prefix_lens = paged_attention_out = None
    paged_attention_out_1 = torch.ops.paged_attn.paged_attention_out.default(query, suffix_kc, suffix_vc, suffix_bt, suffix_lens, query_start_loc, new_empty_1, new_empty_3, 0.125);  query = suffix_kc = suffix_vc = suffix_bt = suffix_lens = query_start_loc = paged_attention_out_1 = None
    merge_attn_states_out = torch.ops.paged_attn.merge_attn_states_out.default(new_empty, new_empty_2, new_empty_1, new_empty_3, out, lse);  new_empty = new_empty_2 = new_empty_1 = new_empty_3 = out = lse = merge_attn_states_out = None
    return (None,)""")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_inductor_cache_writes_in_16_bit_dtypes_are_eagers_bits(dtype):
    """Inductor (CPU) writing a bf16/fp16 cache through the reference: the values eager writes, bit
    for bit. A scatter through an int16 view of the cache was compiled as a conversion of the
    integers (pytorch/pytorch#151156) and wrote garbage (-0.789 became -16512)."""
    g = torch.Generator().manual_seed(11)
    key, value = torch.randn(5, 2, 32, generator=g).to(dtype), torch.randn(5, 2, 32, generator=g).to(dtype)
    kv_c, k_pe = torch.randn(5, 32, generator=g).to(dtype), torch.randn(5, 16, generator=g).to(dtype)
    slots = torch.tensor([17, 3, -1, 40])
    caches = [torch.full((3, 16, 2, 32), NAN, dtype=dtype), torch.full((3, 16, 2, 32), NAN, dtype=dtype),
              torch.full((3, 16, 48), NAN, dtype=dtype)]

    def write(key, value, kv_c, k_pe, kc, vc, mla, slots):
        pa.reshape_and_cache(key, value, kc, vc, slots)
        pa.concat_and_cache_mla(kv_c, k_pe, mla, slots)

    eager = [c.clone() for c in caches]
    compiled = [c.clone() for c in caches]
    write(key, value, kv_c, k_pe, *eager, slots)
    torch._dynamo.reset()
    torch.compile(write, fullgraph=True)(key, value, kv_c, k_pe, *compiled, slots)
    for e, c in zip(eager, compiled):
        assert torch.equal(e.view(torch.int16), c.view(torch.int16))


def test_kernel_helpers_bound_under_their_own_names() -> None:
    """Inductor re-emits a Triton kernel's helpers under each JITFunction's ``__name__``: a helper
    imported under another name (``from m import f as g``), or two helpers of one name, compile in
    eager calls but fail with ``NameError`` once torch.compile launches the kernel."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    from torch_paged_attn.lowering import triton as kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction):
                assert value.fn.__name__ == name, f"{info.name}.{name} is the JIT function {value.fn.__name__}"
