"""Hugging Face transformers models on ``attn_implementation="paged_attn"`` (issue 7).

Small random-weight models built from configs (2 layers, hidden 64, vocabulary 128; no downloads):
Llama, Qwen3 with ``head_dim != hidden_size / heads``, Mistral (sliding window), Gemma 2 (softcap,
alternating sliding/full layers), GPT-OSS (sinks, alternating layers). Three left-padded prompts of
different lengths each:

- CPU, float32: greedy generation of 32 tokens over a :class:`PagedCache` gives exactly the tokens
  of transformers' own ``eager`` attention, and its per-step logits match eager's to float32
  rounding; once more with the model's forward under ``torch.compile(fullgraph=True)`` (Llama,
  ``aot_eager``: two graphs, prefill and decode, for all 32 steps). Dropping the window, the softcap,
  the sinks or the padding compaction from the attention call changes these logits (by 0.4 to 6).
- A forward without a :class:`PagedCache`, or past its ``max_cache_len``, raises a ValueError that
  says so; ``examples/hf_generate.py`` runs and checks itself.
- CUDA, bf16 (skipped without CUDA): teacher-forced prefill + 32 decode steps, logits against float32
  eager within twice the error bf16 eager itself makes.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch_paged_attn.integrations.transformers import PagedCache  # noqa: E402
from torch_paged_attn.testing import assert_close  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

VOCAB = 128
NEW_TOKENS = 32
PROMPT_LENS = (5, 11, 17)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@dataclass
class Model:
    id: str
    config_class: str
    options: dict = field(default_factory=dict)


COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
)

MODELS = [
    Model("llama_gqa", "LlamaConfig"),
    # head_dim 32 with hidden 64 and 4 heads (hidden / heads = 16).
    Model("qwen3_headdim32", "Qwen3Config", dict(head_dim=32)),
    # A window of 8 keys: prompts of up to 17 tokens plus 32 new ones slide it.
    Model("mistral_window8", "MistralConfig", dict(sliding_window=8)),
    # Weights 10x the default scale give scores of a few units, which a cap of 1.0 changes.
    Model(
        "gemma2_softcap_alternating",
        "Gemma2Config",
        dict(
            initializer_range=0.2,
            head_dim=16,
            sliding_window=8,
            attn_logit_softcapping=1.0,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    Model(
        "gpt_oss_sinks",
        "GptOssConfig",
        dict(
            head_dim=16,
            sliding_window=8,
            max_position_embeddings=131072,  # the YaRN context its default rope parameters expect
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
]


def _config(model: Model):
    config_class = getattr(transformers, model.config_class, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model.config_class}")
    return config_class(**{**COMMON, **model.options})


def _build(model: Model, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(
        _config(model), attn_implementation="eager", dtype=torch.float32
    )
    if model.config_class == "GptOssConfig":
        # Sinks start at zero; random ones make them matter.
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return m.to(device=device, dtype=dtype).eval()


def _prompts(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` ``[3, 17]``."""
    g = torch.Generator().manual_seed(1)
    width = max(PROMPT_LENS)
    ids = torch.zeros(len(PROMPT_LENS), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(PROMPT_LENS):
        ids[i, width - n :] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids.to(device), mask.to(device)


def _generate(m, ids, mask, cache=None):
    out = m.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        past_key_values=cache,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences, torch.stack(out.logits, dim=1)


def _paged_cache(m, ids):
    return PagedCache(m.config, max_cache_len=ids.shape[1] + NEW_TOKENS)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.id)
def test_greedy_generation_matches_eager_cpu(model):
    m = _build(model, torch.float32, "cpu")
    ids, mask = _prompts("cpu")
    with torch.no_grad():
        ref_tokens, ref_logits = _generate(m, ids, mask)
        m.set_attn_implementation("paged_attn")
        tokens, logits = _generate(m, ids, mask, _paged_cache(m, ids))
    assert torch.equal(tokens, ref_tokens), (tokens[:, ids.shape[1]:], ref_tokens[:, ids.shape[1]:])
    torch.testing.assert_close(logits, ref_logits)


@pytest.mark.skipif(sys.platform == "win32", reason="torch.compile needs a C++ toolchain")
def test_greedy_generation_compiled_cpu():
    """The forward under ``torch.compile(fullgraph=True)``: one graph for the prefill, one for
    every decode step (the mask grows, nothing recompiles per step), eager's tokens."""
    from torch._dynamo.testing import CompileCounterWithBackend

    m = _build(MODELS[0], torch.float32, "cpu")
    ids, mask = _prompts("cpu")
    with torch.no_grad():
        ref_tokens, _ = _generate(m, ids, mask)
        m.set_attn_implementation("paged_attn")
        counter = CompileCounterWithBackend("aot_eager")
        m.forward = torch.compile(m.forward, backend=counter, fullgraph=True)
        tokens, _ = _generate(m, ids, mask, _paged_cache(m, ids))
    assert torch.equal(tokens, ref_tokens)
    assert counter.frame_count == 2


def test_without_paged_cache_says_what_to_pass():
    m = _build(MODELS[0], torch.float32, "cpu")
    m.set_attn_implementation("paged_attn")
    ids, mask = _prompts("cpu")
    with torch.no_grad(), pytest.raises(ValueError, match="PagedCache"):
        m(ids, attention_mask=mask)


def test_cache_capacity_is_checked():
    m = _build(MODELS[0], torch.float32, "cpu")
    m.set_attn_implementation("paged_attn")
    ids, mask = _prompts("cpu")
    with torch.no_grad(), pytest.raises(ValueError, match="max_cache_len"):
        m(ids, attention_mask=mask, past_key_values=PagedCache(m.config, max_cache_len=8))


def test_example_checks_itself():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hf_generate.py"), "--new-tokens", "8", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tokens equal to eager attention: True" in proc.stdout


# -- CUDA: bf16 logits ---------------------------------------------------------------------------


def _teacher_forced_logits(m, ids, mask, tokens, cache):
    """Logits of the last prompt position and of 32 decode steps that feed ``tokens`` ``[B, 32]``,
    with generate's positions (``cumsum(mask) - 1``)."""
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    out = m(ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache, use_cache=True)
    cache = out.past_key_values
    logits = [out.logits[:, -1].float()]
    for t in range(tokens.shape[1] - 1):
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        position_ids = position_ids[:, -1:] + 1
        out = m(tokens[:, t : t + 1], attention_mask=mask, position_ids=position_ids,
                past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits, dim=1)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.id)
def test_bf16_logits_cuda(model):
    ids, mask = _prompts("cuda")
    with torch.no_grad():
        m32 = _build(model, torch.float32, "cuda")
        tokens, _ = _generate(m32, ids, mask)
        tokens = tokens[:, ids.shape[1]:]
        truth = _teacher_forced_logits(m32, ids, mask, tokens, None)
        m16 = _build(model, torch.bfloat16, "cuda")
        reference = _teacher_forced_logits(m16, ids, mask, tokens, None)
        m16.set_attn_implementation("paged_attn")
        actual = _teacher_forced_logits(m16, ids, mask, tokens, _paged_cache(m16, ids))
    assert_close(actual, truth, dtype=torch.bfloat16, reference=reference, name="logits")
