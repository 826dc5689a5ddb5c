"""The continuous-batching engine (``torch_paged_attn.serving``, issue 19).

The oracle is transformers' own ``generate`` with ``eager`` attention, run on each prompt alone
(float32, CPU, tiny random-weight models from configs: no downloads). Whatever the engine does to
a request (arrives mid-run, chunked prefill under any token budget, preempted and recomputed,
prefix blocks shared with other requests, copy on write), its greedy tokens must be those.

- a hypothesis property over random prompts (some sharing prefixes), arrival steps, budgets,
  chunk sizes, sequence limits, block sizes and pool sizes (tight pools preempt);
- every model family the integration tests (Llama, Qwen3, Mistral window, Gemma 2 softcap +
  alternating windows, GPT-OSS sinks) through one mixed schedule;
- targeted: preemption happens and changes nothing; a shared prefix is computed once (prefill
  tokens counted); a prompt fully in the cache copies its last block before writing;
- seeded sampling: the same tokens alone and in a batch; top_k=1 is greedy;
- cancel and finish free every block; bad arguments raise errors that name them;
- CUDA (skipped without): bf16 teacher-forced logits against float32 eager within the error bf16
  eager itself makes; CUDA-graph decode gives eager's tokens on a float32 model.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torch_paged_attn.serving import Engine, SamplingParams, generate_batch  # noqa: E402
from torch_paged_attn.testing import assert_close  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=0,
)
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "mistral_window8": ("MistralConfig", dict(sliding_window=8)),
    "gemma2": ("Gemma2Config", dict(
        initializer_range=0.2, head_dim=16, sliding_window=8, attn_logit_softcapping=1.0,
        query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"],
    )),
    "gpt_oss": ("GptOssConfig", dict(
        head_dim=16, sliding_window=8, max_position_embeddings=131072, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
    )),
}


def _build(family: str, dtype=torch.float32, device="cpu"):
    name, options = FAMILIES[family]
    config_class = getattr(transformers, name, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(
        config_class(**{**COMMON, **options}), attn_implementation="eager", dtype=torch.float32
    )
    if name == "GptOssConfig":
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return m.to(device=device, dtype=dtype).eval()


class Oracle:
    """transformers' eager greedy ``generate`` of one prompt alone, memoised."""

    def __init__(self, model):
        self.model = model
        self.memo: dict = {}

    def __call__(self, prompt: list[int], new_tokens: int) -> list[int]:
        key = (tuple(prompt), new_tokens)
        if key not in self.memo:
            with torch.no_grad():
                ids = torch.tensor([prompt], device=self.model.device)
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                          do_sample=False)
            self.memo[key] = out[0, len(prompt):].tolist()
        return self.memo[key]


@pytest.fixture(scope="module")
def llama():
    m = _build("llama")
    return m, Oracle(m)


def _engine_model(m):
    return copy.deepcopy(m)  # the engine switches its model to "paged_attn"


def _prompts(lengths, seed=1, prefix=()):
    g = torch.Generator().manual_seed(seed)
    return [list(prefix) + torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _run_schedule(engine, prompts, new_tokens, arrivals):
    """Add prompt i at step ``arrivals[i]``; step until all finish; tokens in prompt order."""
    ids = {}
    step = 0
    while len(ids) < len(prompts) or engine.has_unfinished():
        for i, at in enumerate(arrivals):
            if at == step:
                ids[i] = engine.add_request(prompts[i], SamplingParams(max_new_tokens=new_tokens[i]))
        engine.step()
        step += 1
        assert step < 10_000
    return [engine.pop(ids[i]).output for i in range(len(prompts))]


# -- greedy tokens equal transformers' generate, whatever the schedule --------------------------


@settings(max_examples=int(os.environ.get("SERVING_EXAMPLES", "25")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_greedy_matches_generate_any_schedule(llama, data):
    m, oracle = llama
    block_size = data.draw(st.sampled_from([8, 16]), label="block_size")
    n = data.draw(st.integers(1, 5), label="requests")
    shared = data.draw(st.sampled_from([0, block_size, 2 * block_size + 3]), label="shared prefix")
    lengths = data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n), label="prompt lengths")
    new_tokens = data.draw(st.lists(st.integers(1, 8), min_size=n, max_size=n), label="new tokens")
    arrivals = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n), label="arrival steps")
    budget = data.draw(st.integers(1, 48), label="token budget")
    chunk = data.draw(st.sampled_from([None, 1, 5, 16]), label="chunk size")
    max_seqs = data.draw(st.integers(1, 4), label="max_num_seqs")
    prompts = _prompts(lengths, seed=data.draw(st.integers(0, 1000)), prefix=_prompts([shared], seed=7)[0])
    longest = max(len(p) + t for p, t in zip(prompts, new_tokens))
    # from one request's worth of blocks (preemption certain) to room for all
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, need * n + 2), label="num_blocks")
    engine = Engine(_engine_model(m), block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_seqs,
                    max_num_batched_tokens=budget, chunk_size=chunk, max_model_len=96)
    got = _run_schedule(engine, prompts, new_tokens, arrivals)
    assert got == [oracle(p, t) for p, t in zip(prompts, new_tokens)]
    assert engine.allocator.num_free_blocks == num_blocks


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_match_generate(family):
    m = _build(family)
    oracle = Oracle(m)
    prompts = _prompts([5, 19, 11, 26])
    new_tokens = [12, 6, 12, 9]
    engine = Engine(_engine_model(m), block_size=8, num_blocks=64, max_num_seqs=3, max_num_batched_tokens=13,
                    max_model_len=64)
    got = _run_schedule(engine, prompts, new_tokens, [0, 0, 2, 5])
    assert got == [oracle(p, t) for p, t in zip(prompts, new_tokens)]


def test_preemption_recomputes_to_the_same_tokens(llama):
    m, oracle = llama
    prompts = _prompts([14, 9, 20, 12])
    # 40 tokens per request at most, 4 requests, 12 blocks of 8 = 96 slots: someone must yield
    engine = Engine(_engine_model(m), block_size=8, num_blocks=12, max_num_seqs=4, max_num_batched_tokens=64,
                    max_model_len=64)
    got = _run_schedule(engine, prompts, [20] * 4, [0] * 4)
    assert engine.scheduler.num_preemptions > 0
    assert got == [oracle(p, 20) for p in prompts]
    assert engine.allocator.num_free_blocks == 12


@pytest.mark.parametrize("prefix_caching, chunk_size", [(True, None), (True, 8), (False, None)])
def test_shared_prefix_is_computed_once(llama, prefix_caching, chunk_size):
    """Also when the prefix is prefilled in chunks of one block: the others wait for its blocks."""
    m, oracle = llama
    prefix = _prompts([32], seed=3)[0]  # 4 full blocks of 8
    suffixes = [3, 9, 1, 14, 6]
    prompts = _prompts(suffixes, seed=4, prefix=prefix)
    engine = Engine(_engine_model(m), block_size=8, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=256,
                    max_model_len=64, prefix_caching=prefix_caching, chunk_size=chunk_size)
    got = _run_schedule(engine, prompts, [6] * 5, [0, 0, 0, 1, 3])
    assert got == [oracle(p, 6) for p in prompts]
    copies = 1 if prefix_caching else len(prompts)
    assert engine.num_prefill_tokens == copies * len(prefix) + sum(suffixes)


def test_prompt_fully_cached_copies_on_write(llama):
    """Two equal prompts of whole blocks: the second shares every block, recomputes its last token
    into a private copy of the last block (the first request's cache stays intact)."""
    m, oracle = llama
    prompt = _prompts([24], seed=5)[0]
    engine = Engine(_engine_model(m), block_size=8, num_blocks=32, max_num_seqs=4, max_num_batched_tokens=64,
                    max_model_len=48)
    got = _run_schedule(engine, [prompt, prompt, prompt + [7]], [10, 10, 10], [0, 2, 4])
    assert got == [oracle(prompt, 10)] * 2 + [oracle(prompt + [7], 10)]
    assert engine.num_prefill_tokens == 24 + 1 + 1


def test_generate_batch_in_order(llama):
    m, oracle = llama
    prompts = _prompts([7, 1, 30])
    got = generate_batch(_engine_model(m), prompts, max_new_tokens=5, progress=True, num_blocks=32,
                         max_model_len=64, max_num_batched_tokens=16)
    assert got == [oracle(p, 5) for p in prompts]


def test_allocator_prefix_cache():
    """register / cached_prefix / allocate_prefix / copy_on_write / eviction, and try_grow."""
    from torch_paged_attn import BlockAllocator

    a = BlockAllocator(num_blocks=4, block_size=8)
    a.allocate("a", 20)  # blocks 0, 1, 2
    a.register("a", 0, "h0")
    a.register("a", 1, "h1")
    assert a.cached_prefix(["h0", "h1", "h2"]) == [0, 1]
    a.allocate_prefix("b", [0, 1], 16)
    assert a.ref_count(0) == a.ref_count(1) == 2 and a.num_free_blocks == 1
    with pytest.raises(ValueError, match="allocate_prefix"):
        a.allocate_prefix("c", [0, 1], 5)
    assert a.copy_on_write("b", 1) == (1, 3)  # shared: a private copy
    assert a.block_table("b") == [0, 3] and a.ref_count(1) == 1
    assert a.copy_on_write("b", 1) is None  # already private and unnamed
    a.free("a")  # blocks 0 (still held by b) and 1 (cached) stay; 2 is free
    assert a.num_free_blocks == 2 and a.cached_prefix(["h0", "h1"]) == [0, 1]
    a.free("b")
    assert a.num_free_blocks == 4
    a.allocate_prefix("c", [0, 1], 9)  # cached blocks come back from the evictable pool
    assert a.num_free_blocks == 2
    assert not a.try_grow("c", 40) and a.seq_len("c") == 9  # needs 3 more blocks: nothing changes
    assert a.try_grow("c", 32) and a.num_free_blocks == 0
    a.free("c")
    a.allocate("d", 32)  # takes the never-cached blocks first, then evicts h0 and h1 (LRU)
    assert a.num_free_blocks == 0 and a.cached_prefix(["h0"]) == []
    with pytest.raises(ValueError, match="shrink"):
        a.try_grow("d", 3)


# -- sampling -------------------------------------------------------------------------------------


def test_seeded_sampling_alone_equals_in_batch(llama):
    m, _ = llama
    model = _engine_model(m)
    prompts = _prompts([6, 13, 21, 9])
    params = [SamplingParams(max_new_tokens=12, temperature=1.3, seed=s, top_k=k, top_p=p)
              for s, k, p in [(1, 0, 1.0), (2, 20, 1.0), (3, 0, 0.8), (4, 10, 0.9)]]
    options = dict(num_blocks=64, max_model_len=64, max_num_batched_tokens=16, progress=False)
    batched = generate_batch(model, prompts, params, **options)
    alone = [generate_batch(model, [p], [sp], **options)[0] for p, sp in zip(prompts, params)]
    assert batched == alone
    reseeded = generate_batch(model, prompts, [dataclasses.replace(sp, seed=sp.seed + 10) for sp in params], **options)
    assert reseeded != batched
    greedy = generate_batch(model, prompts, max_new_tokens=12, **options)
    assert greedy != batched
    top1 = generate_batch(model, prompts, [dataclasses.replace(sp, top_k=1) for sp in params], **options)
    assert top1 == greedy


def test_gumbel_noise_is_uniform_enough():
    from torch_paged_attn.serving.sampling import sample

    logits = torch.tensor([[0.0, 1.0, 2.0]]).log_softmax(-1).expand(4000, 3).contiguous()
    seeds = torch.arange(4000, dtype=torch.int32)
    tokens = sample(logits, torch.ones(4000), torch.zeros(4000, dtype=torch.int32), torch.ones(4000), seeds,
                    torch.full((4000,), 5, dtype=torch.int32), any_sampled=True, any_filtered=False)
    freq = torch.bincount(tokens, minlength=3).double() / 4000
    expected = torch.tensor([0.0, 1.0, 2.0]).double().softmax(-1)
    assert (freq - expected).abs().max() < 0.03, freq  # 4000 draws: one standard error is < 0.008


# -- lifecycle and errors -------------------------------------------------------------------------


def test_cancel_and_finish_free_blocks(llama):
    m, _ = llama
    engine = Engine(_engine_model(m), block_size=8, num_blocks=32, max_model_len=64, prefix_caching=False)
    a = engine.add_request(_prompts([20])[0], SamplingParams(max_new_tokens=30))
    b = engine.add_request(_prompts([10], seed=2)[0], SamplingParams(max_new_tokens=4))
    waiting = engine.add_request([1, 2, 3])
    engine.cancel(waiting)
    out = engine.step()
    assert {o.request_id for o in out} == {a, b}
    assert engine.allocator.num_free_blocks == 32 - 3 - 2
    engine.cancel(a)
    assert engine.request(a).finish_reason == "cancelled"
    assert engine.allocator.num_free_blocks == 32 - 2
    while engine.has_unfinished():
        engine.step()
    assert engine.request(b).finish_reason == "length" and len(engine.request(b).output) == 4
    assert engine.allocator.num_free_blocks == 32
    assert engine.step() == []


def test_stop_tokens_end_a_request(llama):
    m, oracle = llama
    prompt = _prompts([9])[0]
    expected = oracle(prompt, 8)
    engine = Engine(_engine_model(m), num_blocks=16, max_model_len=64)
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=8, stop_token_ids=[expected[3]]))
    engine.run()
    stop_at = expected.index(expected[3])
    assert engine.request(rid).output == expected[: stop_at + 1]
    assert engine.request(rid).finish_reason == "stop"


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: SamplingParams(max_new_tokens=0), ValueError, "max_new_tokens"),
        (lambda: SamplingParams(temperature=-1.0), ValueError, "temperature"),
        (lambda: SamplingParams(top_p=0.0), ValueError, "top_p"),
        (lambda: SamplingParams(top_k=-2), ValueError, "top_k"),
        (lambda: SamplingParams(seed=1.5), TypeError, "seed"),
        (lambda: SamplingParams(stop_token_ids=["a"]), TypeError, "stop_token_ids"),
    ],
)
def test_bad_sampling_params(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_engine_arguments(llama):
    m, _ = llama
    model = _engine_model(m)
    with pytest.raises(ValueError, match="block_size"):
        Engine(model, block_size=12, num_blocks=8)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(model, max_num_batched_tokens=0, num_blocks=8)
    with pytest.raises(ValueError, match="cuda_graphs"):
        Engine(model, num_blocks=8, cuda_graphs=True)
    engine = Engine(model, num_blocks=4, max_model_len=80)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request([1] * 70, SamplingParams(max_new_tokens=11))
    with pytest.raises(ValueError, match="blocks"):
        engine.add_request([1] * 60, SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request([])
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request([VOCAB])
    with pytest.raises(TypeError, match="params"):
        engine.add_request([1], {"max_new_tokens": 3})
    engine.add_request([1], request_id="x")
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request([2], request_id="x")
    with pytest.raises(KeyError, match="request_id"):
        engine.cancel("y")
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_batch(model, [[1]], SamplingParams(), max_new_tokens=3)


def test_example_runs():
    # float32 on the CPU: the exact token check (bf16 on a GPU may flip near-ties)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "serve_batch.py"), "--device", "cpu"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "equal to transformers' generate: True" in proc.stdout


# -- CUDA -------------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.gpu
def test_cuda_graph_decode_matches_eager_cuda():
    m = _build("llama", device="cuda")
    prompts = _prompts([5, 19, 11, 26, 3])
    options = dict(block_size=16, num_blocks=64, max_num_batched_tokens=32, max_model_len=96, progress=False)
    eager = generate_batch(copy.deepcopy(m), prompts, max_new_tokens=24, cuda_graphs=False, **options)
    model = copy.deepcopy(m)
    engine = Engine(model, cuda_graphs=True, graph_batch_sizes=[1, 2, 4, 8], **{
        k: v for k, v in options.items() if k != "progress"})
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=24)) for p in prompts]
    engine.run()
    assert [engine.pop(i).output for i in ids] == eager
    assert engine._graphs, "no decode step replayed a CUDA graph"
    assert eager == [Oracle(m)(p, 24) for p in prompts]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_teacher_forced_logits_cuda(family):
    """Every request is fed float32 eager's greedy tokens (teacher forcing) through the engine with
    CUDA graphs and mixed steps; its logits at every step against float32 eager's, within twice
    the error of transformers' own bf16 attention (sdpa) on the same tokens."""
    m32 = _build(family, device="cuda")
    prompts = _prompts([5, 19, 11, 26])
    steps = 16
    forced = [Oracle(m32)(p, steps) for p in prompts]

    def full_logits(model, p, toks):
        with torch.no_grad():
            ids = torch.tensor([p + toks[:-1]], device="cuda")
            return model(ids).logits[0, len(p) - 1:].float()

    truth = torch.stack([full_logits(m32, p, t) for p, t in zip(prompts, forced)])
    m16 = _build(family, dtype=torch.bfloat16, device="cuda")
    m16.set_attn_implementation("sdpa" if family != "gpt_oss" else "eager")
    reference = torch.stack([full_logits(m16, p, t) for p, t in zip(prompts, forced)])
    engine = Engine(m16, block_size=16, num_blocks=64, max_num_batched_tokens=24, max_model_len=96,
                    max_num_seqs=4)
    captured: dict = {}
    engine._logits_hook = lambda plan, logits: [
        captured.setdefault(c.request.request_id, []).append(logits[i].float())
        for i, c in enumerate(plan) if c.samples]
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=steps)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        for i, rid in enumerate(ids):  # force the next input token
            r = engine.request(rid)
            if len(r.output):
                r.tokens[len(r.prompt):] = forced[i][: len(r.output)]
    actual = torch.stack([torch.stack(captured[rid]) for rid in ids])
    assert_close(actual, truth, dtype=torch.bfloat16, reference=reference, name="logits")
