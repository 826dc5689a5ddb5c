"""Hugging Face ``generate`` on torch_paged_attn, checked against transformers' eager attention.

Builds a small random-weight causal LM from a config (Llama by default: no download), generates
greedily for a batch of left-padded prompts of different lengths with transformers' ``eager``
attention, then switches the same model to ``attn_implementation="paged_attn"`` and generates
again over a :class:`~torch_paged_attn.integrations.transformers.PagedCache`: the keys and values
live in paged block pools written by ``reshape_and_cache`` and read by ``paged_attention``. The
tokens must be the same. Runs on the GPU when there is one (bf16, Triton kernels; tokens may then
differ after a near-tie), else on the CPU (float32, reference backend).

    python examples/hf_generate.py [--model llama|qwen3|mistral|gemma2|gpt_oss] [--new-tokens 32]
                                   [--compile] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

try:
    import transformers
    from transformers.generation.streamers import BaseStreamer
except ImportError:
    sys.exit("this example needs transformers: pip install transformers")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import end_progress, positive_int, progress, set_cpu_threads  # noqa: E402

from torch_paged_attn.integrations.transformers import PagedCache  # noqa: E402

SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
)
CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=8, attn_logit_softcapping=1.0,
                                    layer_types=["sliding_attention", "full_attention"])),
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, sliding_window=8, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=131072,
                                     layer_types=["sliding_attention", "full_attention"])),
}


class Progress(BaseStreamer):
    """``generate``'s streamer: a progress line on stderr per generated token (the first forward
    of a compiled model compiles the prefill graph, the second the decode graph: minutes on a
    CPU, so the line says what is happening)."""

    def __init__(self, label: str, new_tokens: int, compiling: bool):
        self.label, self.new_tokens, self.compiling = label, new_tokens, compiling
        self.done = -1  # the first put() is the prompt

    def put(self, value) -> None:
        self.done += 1
        if self.done == 0:
            what = "compiling the prefill graph (first call; up to a few minutes on a CPU)" if self.compiling else "prefill"
        elif self.done == 1 and self.compiling:
            what = "compiling the decode graph"
        else:
            what = f"token {self.done}/{self.new_tokens}"
        progress(f"{self.label}: {what}")

    def end(self) -> None:
        end_progress()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="llama")
    parser.add_argument("--new-tokens", type=positive_int, default=32)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model's forward")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    set_cpu_threads(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    config_name, options = CONFIGS[args.model]
    config = getattr(transformers, config_name)(**{**SMALL, **options})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(device=device, dtype=dtype).eval()

    # Three prompts of 5, 11 and 17 tokens, left-padded to 17.
    lens = [5, 11, 17]
    width = max(lens)
    input_ids = torch.zeros(len(lens), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, n in enumerate(lens):
        input_ids[i, width - n :] = torch.randint(1, config.vocab_size, (n,))
        attention_mask[i, width - n :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    generate = dict(attention_mask=attention_mask, max_new_tokens=args.new_tokens, do_sample=False)
    print(f"{args.model}: {len(lens)} prompts of {lens} tokens, {args.new_tokens} new tokens, "
          f"{device} {dtype}, transformers {transformers.__version__}")

    with torch.no_grad():
        start = time.perf_counter()
        eager = model.generate(input_ids, **generate, streamer=Progress("eager", args.new_tokens, False))
        print(f"eager      {time.perf_counter() - start:6.2f} s")

        model.set_attn_implementation("paged_attn")
        if args.compile:
            model.forward = torch.compile(model.forward, fullgraph=True)
        cache = PagedCache(model.config, max_cache_len=width + args.new_tokens, block_size=16)
        start = time.perf_counter()
        paged = model.generate(input_ids, past_key_values=cache, **generate,
                               streamer=Progress("paged_attn", args.new_tokens, args.compile))
        print(f"paged_attn {time.perf_counter() - start:6.2f} s")

    layer = cache.layers[0]
    print(f"layer 0: key_cache {list(layer.key_cache.shape)}, block_table {list(layer.block_table.shape)}, "
          f"tokens stored per sequence {layer.lengths.tolist()} (pads are not stored)")
    for i in range(len(lens)):
        print(f"  seq {i}: {paged[i, width:].tolist()}")
    same = torch.equal(eager, paged)
    print("tokens equal to eager attention:", same)
    return 0 if same or device.type != "cpu" else 1


if __name__ == "__main__":
    sys.exit(main())
