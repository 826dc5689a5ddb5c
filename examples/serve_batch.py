"""Continuous batching with ``torch_paged_attn.serving``, checked against transformers' ``generate``.

Builds a small random-weight Llama from a config (no download) and serves 24 prompts (a shared
32-token system prompt plus a user part of 1-40 tokens) through ``generate_batch``: one ragged
forward per step over decodes and prefill chunks, blocks from a shared pool, the system prompt's
blocks computed once. Then the streaming engine: requests join mid-run, one is cancelled, one
samples with a seed. Each greedy request's tokens must equal transformers' eager ``generate`` of
that prompt alone. Runs on the GPU when there is one (bf16: tokens may then differ after a
near-tie), else on the CPU (float32, well under a minute).

    python examples/serve_batch.py [--requests 24] [--new-tokens 16] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

try:
    import transformers
except ImportError:
    sys.exit("this example needs transformers: pip install transformers")

from torch_paged_attn.serving import Engine, SamplingParams, generate_batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    if args.device == "cpu":
        torch.set_num_threads(1)  # a 2-layer, 64-wide model: more threads only add synchronisation

    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(device=args.device, dtype=dtype).eval()

    g = torch.Generator().manual_seed(0)
    system = torch.randint(1, 256, (32,), generator=g).tolist()
    prompts = [system + torch.randint(1, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 41, (args.requests,), generator=g)]

    # transformers' eager generate, one prompt at a time: the reference
    with torch.no_grad():
        expected = [
            model.generate(torch.tensor([p], device=args.device), max_new_tokens=args.new_tokens,
                           do_sample=False)[0, len(p):].tolist()
            for p in prompts
        ]

    # offline: everything at once
    serving_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    serving_model.load_state_dict(model.state_dict())
    serving_model = serving_model.to(device=args.device, dtype=dtype).eval()
    start = time.perf_counter()
    options = dict(block_size=16, num_blocks=512, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=128)
    engine = Engine(serving_model, **options)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=args.new_tokens)) for p in prompts]
    engine.run(progress=True, total=len(ids))
    got = [engine.pop(i).output for i in ids]
    seconds = time.perf_counter() - start
    print(f"{len(prompts)} requests, {sum(map(len, got))} tokens in {seconds:.2f} s, {engine.num_steps} steps; "
          f"prompt tokens computed {engine.num_prefill_tokens} of {sum(map(len, prompts))} "
          f"(the 32-token system prompt once)")
    same = sum(g == e for g, e in zip(got, expected))
    print(f"equal to transformers' generate: {got == expected} ({same} of {len(got)} requests token for token)")
    if args.device == "cuda":  # bf16: greedy near-ties may flip; tests/test_serving.py compares logits
        print("  (bf16 on the GPU: a near-tie can flip a greedy token; the float32 CPU run is the exact check)")

    # streaming: requests join while others run; one is cancelled; one samples with a seed
    engine = Engine(serving_model, **options)
    first = engine.add_request(prompts[0], SamplingParams(max_new_tokens=args.new_tokens))
    doomed = engine.add_request(prompts[1], SamplingParams(max_new_tokens=args.new_tokens))
    streamed: dict = {}
    step = 0
    while engine.has_unfinished():
        if step == 3:
            engine.add_request(prompts[2], SamplingParams(max_new_tokens=8, temperature=0.8, top_p=0.9, seed=42),
                               request_id="sampled")
            engine.cancel(doomed)
        for out in engine.step():
            streamed.setdefault(out.request_id, []).extend(out.new_tokens)
        step += 1
    print(f"streamed: first {streamed[first] == expected[0]}, cancelled after {len(streamed.get(doomed, []))} "
          f"tokens, sampled {streamed['sampled']}")
    return 0 if got == expected or args.device == "cuda" else 1


if __name__ == "__main__":
    sys.exit(main())
