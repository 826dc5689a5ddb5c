"""Every public entry point compiles with ``torch.compile(fullgraph=True)`` as the first thing a
fresh process does (issue 16, item 2).

A model whose first call is compiled makes the process's first ``paged_attn`` call inside
Dynamo's trace: switches, memos and lazy imports are then cold while traced. Each case below
runs in its own process, forked from a parent that has imported third-party modules only
(torch, Dynamo, AOTAutograd, transformers; never ``torch_paged_attn``): the case imports
``torch_paged_attn``, checks that no switch has been read yet, compiles its entry point with
``fullgraph=True``, calls it, and only then runs it eagerly on copies of the same inputs: the
compiled call must give eager's outputs and mutations. Forking saves the imports of torch,
Dynamo, AOTAutograd and transformers, about 6 s a case (2-core CPU, 2026-11); where ``os.fork`` is
missing, on a machine with a GPU (the parent's imports initialise CUDA, which a forked child
cannot use) or under pytest-xdist, each test starts its own interpreter for its case.

Entry points: every op and its ``_out`` form, the transformers integration (also with
``TORCH_PAGED_ATTN_DEBUG=1`` set before the first read), ``MLAAttention``'s decode and prefill
paths, and the example Llama model on ``PagedKVCache`` with ``BlockAllocator`` /
``MetadataBuilder`` metadata. On CPU the cases compile with ``backend="aot_eager"`` (Dynamo and
AOTAutograd, where first-use failures live, without Inductor's C++ builds: one process each, a
few seconds); on CUDA with Inductor, which launches the Triton kernels itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()

# What every case starts with: tiny float32 inputs on the test device, and the check that the
# process has not used torch_paged_attn yet.
PRELUDE = """
import math, os, sys
import torch
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "inductor" if DEVICE == "cuda" else "aot_eager"
sys.path.insert(0, ROOT)
import torch_paged_attn as pa
from torch_paged_attn import _config
from torch_paged_attn.testing import make_paged_batch


def cold():
    # no switch has been read: nothing of torch_paged_attn has run in this process
    for switch in (_config._BACKEND, _config._BATCH_INVARIANT):
        assert switch.env.raw is _config._UNREAD, "torch_paged_attn was used before the compiled call"


def first_use(fn, *args):
    # fn compiled with fullgraph=True and called first, then eagerly on copies of args
    cold()
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        compiled = torch.compile(fn, fullgraph=True, backend=BACKEND)(*args)
        eager = fn(*eager_args)
    torch.testing.assert_close(compiled, eager, equal_nan=True)
    torch.testing.assert_close(list(args), eager_args, equal_nan=True)  # mutations alike


def nan_like(shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def batch():
    # a decode row and a 3-token prefill over a shuffled paged cache with NaN in uncovered slots
    return make_paged_batch([1, 3], [13, 9], block_size=8, device=DEVICE, seed=1)
"""

CASES = {
    "paged_attention": """
b = batch()
first_use(lambda *a: pa.paged_attention(*a, scale=0.2, return_lse=True), *b.args())
""",
    "paged_attention_out": """
b = batch()
out, lse = nan_like(b.query.shape), nan_like(b.query.shape[:2])
first_use(lambda *a: pa.paged_attention_out(*a, scale=0.2, window_left=4), *b.args(), out, lse)
""",
    "mla_decode": """
kv_cache = torch.randn(4, 8, 48, device=DEVICE)
table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32, device=DEVICE)
seq_lens = torch.tensor([11, 5], dtype=torch.int32, device=DEVICE)
qsl = torch.tensor([0, 1, 3], dtype=torch.int32, device=DEVICE)
q_latent, q_rope = torch.randn(3, 4, 32, device=DEVICE), torch.randn(3, 4, 16, device=DEVICE)
first_use(lambda *a: pa.mla_decode(*a, scale=0.15), q_latent, q_rope, kv_cache, table, seq_lens, qsl)
""",
    "reshape_and_cache": """
key, value = torch.randn(4, 2, 32, device=DEVICE), torch.randn(4, 2, 32, device=DEVICE)
key_cache, value_cache = nan_like((3, 8, 2, 32)), nan_like((3, 8, 2, 32))
slots = torch.tensor([17, -1, 3], device=DEVICE)  # a padding slot, and a padding row of key/value
first_use(pa.reshape_and_cache, key, value, key_cache, value_cache, slots)
""",
    "concat_and_cache_mla": """
kv_c, k_pe = torch.randn(3, 32, device=DEVICE), torch.randn(3, 16, device=DEVICE)
kv_cache = nan_like((3, 8, 48))
first_use(pa.concat_and_cache_mla, kv_c, k_pe, kv_cache, torch.tensor([9, 0, -1], device=DEVICE))
""",
    "gather_cache": """
kv_cache = torch.randn(4, 8, 48, device=DEVICE)
table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32, device=DEVICE)
cu = torch.tensor([0, 10, 13], dtype=torch.int32, device=DEVICE)
starts = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
first_use(pa.gather_cache, kv_cache, table, cu, starts, nan_like((16, 48)))
""",
    "merge_attn_states": """
o1, o2 = torch.randn(5, 4, 32, device=DEVICE), torch.randn(5, 4, 32, device=DEVICE)
l1, l2 = torch.randn(5, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE)
l1[0] = -math.inf  # an empty part
first_use(pa.merge_attn_states, o1, l1, o2, l2)
""",
    "merge_attn_states_out": """
o1, o2 = torch.randn(5, 4, 32, device=DEVICE), torch.randn(5, 4, 32, device=DEVICE)
l1, l2 = torch.randn(5, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE)
first_use(pa.merge_attn_states_out, o1, l1, o2, l2, nan_like((5, 4, 32)), nan_like((5, 4)))
""",
    "merge_attn_states_n": """
outs, lses = torch.randn(3, 5, 4, 32, device=DEVICE), torch.randn(3, 5, 4, device=DEVICE)
first_use(pa.merge_attn_states_n, outs, lses)
""",
    "merge_attn_states_n_out": """
outs, lses = torch.randn(3, 5, 4, 32, device=DEVICE), torch.randn(3, 5, 4, device=DEVICE)
first_use(pa.merge_attn_states_n_out, outs, lses, nan_like((5, 4, 32)), nan_like((5, 4)))
""",
    "MLAAttention.forward_decode": """
torch.manual_seed(0)
m = pa.MLAAttention(32, 4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                    device=DEVICE)
table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32, device=DEVICE)
first_use(m.forward_decode, torch.randn(2, 32, device=DEVICE), torch.tensor([20, 5], device=DEVICE),
          torch.randn(4, 16, 48, device=DEVICE), torch.tensor([2 * 16 + 4, 16 + 5], device=DEVICE), table,
          torch.tensor([21, 6], dtype=torch.int32, device=DEVICE),
          torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE))
""",
    "MLAAttention.forward_prefill": """
torch.manual_seed(0)
m = pa.MLAAttention(32, 4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                    workspace_tokens=16, device=DEVICE)
table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32, device=DEVICE)
# sequence 0: 18 cached tokens, 3 new ones at positions 18.. (its second block, id 0: slots 2..);
# sequence 1: 4 cached, 2 new (block 1: slots 20..); 22 context rows: two workspace chunks
positions = torch.tensor([18, 19, 20, 4, 5], device=DEVICE)
slots = torch.tensor([2, 3, 4, 20, 21], device=DEVICE)
qsl = torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE)
first_use(lambda *a: m.forward_prefill(*a, context_lens=[18, 4], max_query_len=3),
          torch.randn(5, 32, device=DEVICE), positions, torch.randn(4, 16, 48, device=DEVICE), slots, table, qsl)
""",
    "llama_paged_kv_cache": """
import importlib.util
spec = importlib.util.spec_from_file_location("_llama", os.path.join(ROOT, "examples", "llama.py"))
L = importlib.util.module_from_spec(spec); sys.modules[spec.name] = L; spec.loader.exec_module(L)
cfg = L.LlamaConfig(vocab_size=64, dim=64, num_layers=1, num_heads=4, num_kv_heads=2, head_size=16,
                    ffn_dim=64, max_positions=64, block_size=8)
model = L.Llama(cfg, num_blocks=8, device=DEVICE).eval()
L.init_weights(model, 0)
alloc = pa.BlockAllocator(8, 8)
builder = pa.MetadataBuilder(alloc, max_blocks_per_seq=3, device=DEVICE, batch_buckets=[2])
for seq, n in ((0, 11), (1, 6)):
    alloc.allocate(seq, n)
md = builder.build([0, 1], [11, 6], num_tokens=17)
ids = torch.randint(64, (17,), device=DEVICE)
first_use(lambda *a: model(*a, max_query_len=md.max_query_len), *L.step_inputs(ids, md))
""",
    "transformers": """
import transformers
import torch_paged_attn.integrations.transformers
from torch_paged_attn.integrations.transformers import PagedCache
config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
torch.manual_seed(0)
m = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="paged_attn").to(DEVICE).eval()
ids = torch.randint(1, 64, (2, 7), device=DEVICE)
mask = torch.ones_like(ids)
mask[0, :3] = 0  # left padding
cold()
forward = m.forward
with torch.no_grad():
    m.forward = torch.compile(forward, fullgraph=True, backend=BACKEND)
    compiled = m(ids, attention_mask=mask, past_key_values=PagedCache(m.config, max_cache_len=8)).logits
    m.forward = forward
    eager = m(ids, attention_mask=mask, past_key_values=PagedCache(m.config, max_cache_len=8)).logits
torch.testing.assert_close(compiled, eager)
""",
}
# The same with debug mode switched on in the environment before the first read: the integration
# reads it in the traced forward.
CASES["transformers_debug_env"] = 'os.environ["TORCH_PAGED_ATTN_DEBUG"] = "1"\n' + CASES["transformers"]

# The parent (CPU machines with os.fork): imports torch, then runs each case in a child forked from
# it, and writes {case: "" or the child's traceback} as JSON to argv[1].
RUNNER = r"""
import json, os, sys, traceback
import importlib
import torch

# third-party modules every case imports anyway (cold torch_paged_attn state is what matters:
# nothing of it is imported here); about 6 s of imports a case saved on a 2-core CPU
for module in ("torch._dynamo", "torch._functorch.aot_autograd", "torch._inductor.compile_fx", "transformers"):
    try:
        importlib.import_module(module)
    except ImportError:
        pass

cases, prelude, out = json.loads(sys.stdin.read()), sys.argv[2], sys.argv[1]
results = {}
for name, body in cases.items():
    source = prelude + body
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(compile(source, f"<first use: {name}>", "exec"), {"__name__": "__main__"})
            message = ""
        except BaseException:
            message = traceback.format_exc()
        with os.fdopen(write, "w") as f:
            f.write(message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        message = f.read()
    _, status = os.waitpid(pid, 0)
    results[name] = message or ("" if status == 0 else f"the case's process ended with wait status {status}")
with open(out, "w") as f:
    json.dump(results, f)
"""


# Where the cases cannot share a forking parent (a GPU machine, no ``os.fork``) or where pytest-xdist
# spreads the tests over workers (a module fixture would run every case in every worker), each
# test starts its own interpreter for its case alone.
PER_CASE = CUDA or not hasattr(os, "fork") or "PYTEST_XDIST_WORKER" in os.environ


def _prelude() -> str:
    return f"ROOT = {str(ROOT)!r}\n" + textwrap.dedent(PRELUDE)


@pytest.fixture(scope="module")
def results(request, tmp_path_factory) -> dict[str, str]:
    """Runs the cases this session selected, each as its process's first use."""
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is sys.modules[__name__] and hasattr(item, "callspec")
    ]
    out = tmp_path_factory.mktemp("first_use") / "results.json"
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(out), _prelude()],
        input=json.dumps({name: CASES[name] for name in selected}),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@pytest.mark.skipif(sys.platform == "win32", reason="torch.compile needs a C++ toolchain")
@pytest.mark.parametrize("case", list(CASES))
def test_compiles_fullgraph_as_first_use(case: str, request) -> None:
    if PER_CASE:
        proc = subprocess.run([sys.executable, "-c", _prelude() + CASES[case]], capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        message = request.getfixturevalue("results")[case]
        assert message == "", message
