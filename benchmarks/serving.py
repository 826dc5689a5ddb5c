"""Serving throughput: torch_paged_attn.serving against transformers' continuous batching and
static-batch ``generate``.

Model: a random-weight Llama-3-style model of about 1.2B parameters in bf16 (hidden 2048, 16
layers, 32 query / 8 kv heads, head 64, intermediate 8192, vocabulary 128256, tied embeddings).
Workload (seeded): ``--num-requests`` requests (512), prompt lengths uniform in
``--prompt-len`` (64-2048), new tokens uniform in ``--new-tokens`` (64-512), EOS ignored (fixed
lengths), all submitted at once, greedy. Scenario ``shared`` puts the same 1,024-token prefix in
front of every prompt (``--prefix-len``).

Contenders (``--contenders``, each runnable alone so that one 10-minute GPU call can take one):
- ``ours``: ``torch_paged_attn.serving.Engine`` (decode steps replay CUDA graphs, mixed steps eager);
- ``hf_cb``: transformers' continuous batching (``model.continuous_batching_context_manager`` +
  ``add_request`` per request, so each keeps its own length; transformers 5.17 and 5.23), with
  ``--hf-attn`` (``sdpa`` by default; transformers switches to FlashAttention 2/3 itself when it is
  installed; ``paged|eager`` is the other implementation it accepts);
- ``static``: ``model.generate`` over a ``PagedCache`` (``attn_implementation="paged_attn"``) in
  batches of ``--static-batch`` (64) requests in submission order, left-padded, each batch
  running to its longest request.

Reported per contender and scenario: output tokens/s (requested new tokens / wall time from
submission to the last token), time to first token and time per output token (p50/p99, seconds
and milliseconds), for ``ours`` the prompt tokens computed (the shared prefix once: about
``prefix_len + sum(prompt lengths)``), steps, preemptions, and the share of each step spent on
the host (step wall time minus the wait for the sampled tokens, over the step wall time: p50 and
overall). Warm-up (Triton compilation, CUDA-graph capture, transformers' own warm-up) is outside
the timed region; ``ours`` runs the workload ``--passes`` times (2), each on a fresh engine, and
reports the last (the earlier passes' tokens/s in ``earlier_passes_tokens_per_s``): a first pass
in a process with a cold Triton cache also compiles the kernel variants mixed steps reach. A table on stdout, ``serving-<date>.json`` and ``.txt`` in ``--out``.

    python benchmarks/serving.py --out benchmarks/results                      # everything
    python benchmarks/serving.py --contenders ours --scenarios plain,shared    # one contender
    python benchmarks/serving.py --tiny --device cpu --out /tmp/x              # CPU smoke run
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import device_info, progress  # noqa: E402

CONTENDERS = ("ours", "hf_cb", "static")
SCENARIOS = ("plain", "shared")

MODEL_1B = dict(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=500000.0,
    bos_token_id=None, eos_token_id=None, pad_token_id=0,
)
MODEL_TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=0,
)


def _range(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split("-"))
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected LO-HI with 1 <= LO <= HI, got {text}")
    return lo, hi


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return int(text)


def _pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def workload(args, scenario: str):
    g = torch.Generator().manual_seed(args.seed)
    vocab = args.vocab
    prefix = torch.randint(1, vocab, (args.prefix_len,), generator=g).tolist() if scenario == "shared" else []
    lens = torch.randint(args.prompt_len[0], args.prompt_len[1] + 1, (args.num_requests,), generator=g).tolist()
    news = torch.randint(args.new_tokens[0], args.new_tokens[1] + 1, (args.num_requests,), generator=g).tolist()
    prompts = [prefix + torch.randint(1, vocab, (n,), generator=g).tolist() for n in lens]
    return prompts, news


def build_model(args, attn: str):
    import transformers

    import torch_paged_attn.integrations.transformers  # noqa: F401  (registers "paged_attn")

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**(MODEL_TINY if args.tiny else MODEL_1B))
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=args.dtype)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def _sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def _summary(ttft, tpot, out_tokens, seconds) -> dict:
    return dict(
        output_tokens=out_tokens, seconds=round(seconds, 3), tokens_per_s=round(out_tokens / seconds, 1),
        ttft_p50_s=_r(_pct(ttft, 50)), ttft_p99_s=_r(_pct(ttft, 99)),
        tpot_p50_ms=_r(_pct(tpot, 50), 1e3), tpot_p99_ms=_r(_pct(tpot, 99), 1e3),
    )


def _r(x, scale=1.0):
    return None if x is None else round(x * scale, 4)


# -- contenders -----------------------------------------------------------------------------------


def run_ours(args, model, prompts, news) -> dict:
    from torch_paged_attn.serving import Engine, SamplingParams

    longest = max(len(p) + n for p, n in zip(prompts, news))
    options = dict(
        block_size=args.block_size, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=longest, memory_fraction=args.memory_fraction,
    )
    if args.num_blocks:
        options["num_blocks"] = args.num_blocks
    engine = Engine(model, **options)
    progress(f"  ours: {engine.num_blocks} blocks of {args.block_size} tokens; warming up")
    t = time.perf_counter()
    engine.capture_graphs()
    for i, n in enumerate((17, min(300, longest - 4), 1)):  # compile the kernels of prefill, chunked prefill and decode
        engine.add_request([1 + i] * n, SamplingParams(max_new_tokens=4, ignore_eos=True, seed=0))
    engine.run()
    _sync(args)
    progress(f"  ours: warm-up {time.perf_counter() - t:.1f} s")
    rows = []
    for _ in range(args.passes):
        del engine  # its pool holds most of the free memory: free it before the next engine takes its own
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        engine = Engine(model, **options)  # fresh pool and counters (graphs are per engine: recapture)
        rows.append(_timed_pass(args, engine, prompts, news))
    row = rows[-1]
    # A first pass pays for compiling the kernel variants the warm-up's three requests did not reach
    # (mixed steps' query-length hints select tile shapes). H100, 2026-11-23, a cold Triton cache:
    # warm-up 9.5 s, first pass 9,729 tokens/s with 66 % of step time on the host; the next process,
    # cache warm: warm-up 1.9 s, 16,623 tokens/s, 41 % on the host.
    row["earlier_passes_tokens_per_s"] = [r["tokens_per_s"] for r in rows[:-1]]
    return row


def _timed_pass(args, engine, prompts, news) -> dict:
    """One timed pass of the whole workload through ``engine`` (all requests submitted at once)."""
    from torch_paged_attn.serving import SamplingParams

    engine.capture_graphs()
    _sync(args)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in zip(prompts, news)]
    start = time.perf_counter()
    for r in (engine.request(i) for i in ids):
        r.t_arrival = start
    done, last = 0, start
    while engine.has_unfinished():
        for o in engine.step():
            done += o.finished
        if time.perf_counter() - last > 10:
            last = time.perf_counter()
            progress(f"  ours: {done}/{len(ids)} requests, {last - start:.0f} s")
    seconds = time.perf_counter() - start
    reqs = [engine.pop(i) for i in ids]
    assert all(len(r.output) == n for r, n in zip(reqs, news))
    ttft = [r.t_first - r.t_arrival for r in reqs]
    tpot = [(r.t_finish - r.t_first) / (len(r.output) - 1) for r in reqs if len(r.output) > 1]
    host = [h / s for h, s in engine.step_times if s > 0]
    row = _summary(ttft, tpot, sum(news), seconds)
    row.update(
        prompt_tokens=sum(map(len, prompts)), prompt_tokens_computed=engine.num_prefill_tokens,
        steps=engine.num_steps, preemptions=engine.scheduler.num_preemptions,
        host_share_p50=round(statistics.median(host), 3),
        host_share_total=round(sum(h for h, _ in engine.step_times) / sum(s for _, s in engine.step_times), 3),
        graph_buckets=sorted(engine._graphs), num_blocks=engine.num_blocks,
    )
    progress(f"  ours: pass of {seconds:.1f} s, {row['tokens_per_s']} tokens/s")
    return row


def _hf_manager(model, args):
    """transformers' continuous-batching manager, across the 5.17 / 5.23 API differences."""
    import inspect

    from transformers import GenerationConfig

    gen = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0, max_new_tokens=args.new_tokens[1])
    params = inspect.signature(model.continuous_batching_context_manager).parameters
    kwargs = {k: v for k, v in dict(generation_config=gen, block=True, timeout=30).items() if k in params}
    try:
        from transformers import ContinuousBatchingConfig  # 5.23
    except ImportError:
        try:
            from transformers.generation.configuration_utils import ContinuousBatchingConfig
        except ImportError:
            ContinuousBatchingConfig = None
    if ContinuousBatchingConfig is not None and "continuous_batching_config" in params:
        kwargs["continuous_batching_config"] = ContinuousBatchingConfig()
    return model.continuous_batching_context_manager(**kwargs)


def run_hf_cb(args, model, prompts, news) -> dict:
    import inspect

    results = {}
    with _hf_manager(model, args) as manager:
        accepts = inspect.signature(manager.add_request).parameters
        extra = {"record_timestamps": True} if "record_timestamps" in accepts else {}
        progress(f"  hf_cb: attention {model.config._attn_implementation}")
        start = time.perf_counter()
        for i, (p, n) in enumerate(zip(prompts, news)):
            manager.add_request(input_ids=p, request_id=f"r{i}", max_new_tokens=n, **extra)
        last = start
        while len(results) < len(prompts):
            out = manager.get_result(timeout=1)
            if out is not None and out.is_finished():
                results[out.request_id] = (out, time.perf_counter())
            elif out is None and hasattr(manager, "is_running") and not manager.is_running():
                raise RuntimeError("transformers' generation thread stopped")
            if time.perf_counter() - last > 10:
                last = time.perf_counter()
                progress(f"  hf_cb: {len(results)}/{len(prompts)} requests, {last - start:.0f} s")
        seconds = time.perf_counter() - start
    outs = [results[f"r{i}"][0] for i in range(len(prompts))]
    errors = [o.error for o in outs if o.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]}")
    got = sum(len(o.generated_tokens) for o in outs)
    ttft, tpot = [], []
    for o in outs:
        ts = getattr(o, "timestamps", None)
        if ts:
            ttft.append(ts[0] - start)
            if len(ts) > 1:
                tpot.append((ts[-1] - ts[0]) / (len(ts) - 1))
    row = _summary(ttft, tpot, got, seconds)
    row.update(attn_implementation=model.config._attn_implementation, requested_tokens=sum(news))
    return row


def run_static(args, model, prompts, news) -> dict:
    from torch_paged_attn.integrations.transformers import PagedCache

    model.set_attn_implementation("paged_attn")
    batch = args.static_batch

    def one_batch(ps, ns):
        width = max(map(len, ps))
        ids = torch.zeros(len(ps), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(ps):
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        ids, mask = ids.to(args.device), mask.to(args.device)
        cache = PagedCache(model.config, max_cache_len=width + max(ns), block_size=args.block_size)
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=max(ns),
                           min_new_tokens=max(ns), do_sample=False)

    one_batch([[1] * 20, [2] * 9], [3, 3])  # warm-up
    _sync(args)
    start = time.perf_counter()
    ttft, tpot = [], []
    for b in range(0, len(prompts), batch):
        t = time.perf_counter()
        one_batch(prompts[b:b + batch], news[b:b + batch])
        _sync(args)
        now = time.perf_counter()
        progress(f"  static: batch {b // batch + 1}/{-(-len(prompts) // batch)}, {now - start:.0f} s")
        # every request of a batch ends with the batch; its per-token time is the batch's
        steps = max(news[b:b + batch])
        tpot += [(now - t) / steps] * len(news[b:b + batch])
    seconds = time.perf_counter() - start
    row = _summary(ttft, tpot, sum(news), seconds)
    row["note"] = "tokens/s counts requested tokens; a batch runs to its longest request; TTFT not measured"
    return row


RUNNERS = {"ours": ("paged_attn", run_ours), "hf_cb": (None, run_hf_cb), "static": ("paged_attn", run_static)}


# -- main ---------------------------------------------------------------------------------------------


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--num-requests", type=int, default=512)
    p.add_argument("--prompt-len", type=_range, default=(64, 2048))
    p.add_argument("--new-tokens", type=_range, default=(64, 512))
    p.add_argument("--prefix-len", type=int, default=1024)
    p.add_argument("--static-batch", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-batched-tokens", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=0, help="0: from --memory-fraction")
    p.add_argument("--memory-fraction", type=float, default=0.8)
    p.add_argument("--hf-attn", default="sdpa", help="transformers' implementation for hf_cb (sdpa, paged|eager, ...)")
    p.add_argument("--passes", type=_positive, default=2,
                   help="timed passes of the workload for ours, each on a fresh engine; the last is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model and a small workload (CPU smoke run)")
    p.add_argument("--out", default=None, help="directory for serving-<date>.json / .txt")
    args = p.parse_args(argv)
    if args.tiny:
        for name, value in dict(num_requests=8, prompt_len=(4, 40), new_tokens=(2, 12), prefix_len=32,
                                static_batch=4, max_num_seqs=8, max_batched_tokens=64, num_blocks=256).items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    args.vocab = (MODEL_TINY if args.tiny else MODEL_1B)["vocab_size"]
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    for c in args.contenders:
        if c not in CONTENDERS:
            p.error(f"--contenders: unknown {c!r} (choose from {', '.join(CONTENDERS)})")
    for s in args.scenarios:
        if s not in SCENARIOS:
            p.error(f"--scenarios: unknown {s!r} (choose from {', '.join(SCENARIOS)})")
    return args


COLUMNS = ("scenario", "contender", "status", "tokens_per_s", "vs_hf_cb", "seconds", "ttft_p50_s", "ttft_p99_s", "tpot_p50_ms",
           "tpot_p99_ms", "host_share_p50", "prompt_tokens_computed")


def table(rows) -> str:
    lines = [" | ".join(COLUMNS), " | ".join("---" for _ in COLUMNS)]
    for r in rows:
        lines.append(" | ".join("" if r.get(c) is None else str(r.get(c)) for c in COLUMNS))
    return "\n".join(lines)


def write(args, argv, info, rows) -> str:
    """Ratios to hf_cb, then the table (returned) and, with ``--out``, the JSON and txt files."""
    by = {(r["scenario"], r["contender"]): r for r in rows if r["status"] == "ok"}
    for (scenario, contender), r in by.items():
        hf = by.get((scenario, "hf_cb")) or by.get(("plain", "hf_cb"))
        if hf and contender != "hf_cb":
            r["vs_hf_cb"] = round(r["tokens_per_s"] / hf["tokens_per_s"], 2)
    text = table(rows)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        doc = dict(info, args={k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in vars(args).items()},
                   model=MODEL_TINY if args.tiny else MODEL_1B, rows=rows)
        (out / f"serving-{args.stamp}.json").write_text(json.dumps(doc, indent=1, default=str))
        (out / f"serving-{args.stamp}.txt").write_text(
            f"{info['gpu']} · torch {info['torch']} · transformers {info['transformers']} · {info['date']}\n"
            f"python benchmarks/serving.py {' '.join(argv if argv is not None else sys.argv[1:])}\n\n{text}\n")
    return text


def main(argv=None) -> int:
    args = parse(argv)
    args.stamp = _dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device if device.index is not None else torch.cuda.current_device())
    import transformers

    info = device_info(device)
    info["transformers"] = transformers.__version__
    progress(f"serving benchmark on {info['gpu']}: {args.num_requests} requests, prompts {args.prompt_len}, "
             f"new tokens {args.new_tokens}, contenders {args.contenders}, scenarios {args.scenarios}")
    rows = []
    for contender in args.contenders:
        attn, runner = RUNNERS[contender]
        model = None
        for scenario in args.scenarios:
            if contender == "static" and scenario == "shared":
                continue  # static batches share nothing: the plain run says what they do
            prompts, news = workload(args, scenario)
            row = dict(scenario=scenario, contender=contender, num_requests=len(prompts))
            progress(f"{contender} / {scenario}: {sum(map(len, prompts))} prompt tokens, {sum(news)} new tokens")
            try:
                if model is None:
                    model = build_model(args, attn or args.hf_attn)
                row.update(runner(args, model, prompts, news), status="ok")
            except Exception as exc:  # one contender failing must not lose the others' rows
                traceback.print_exc()
                row.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:500])
            progress(f"  -> {row}")
            rows.append(row)
            write(args, argv, info, rows)  # after every row: a run cut short keeps what it measured
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    text = write(args, argv, info, rows)
    print(text)
    return 0 if all(r["status"] == "ok" for r in rows if r["contender"] == "ours") else 1


if __name__ == "__main__":
    sys.exit(main())
