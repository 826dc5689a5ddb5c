"""A continuous-batching engine for transformers causal LMs on the paged ops.

One step = one ragged forward pass over every scheduled token (``input_ids [1, T]``, decodes and
prefill chunks of many requests mixed), then one batched sampling call, then one host
synchronisation that returns the sampled tokens. Per step the host:

1. asks the :class:`~.scheduler.Scheduler` for the chunks (decodes first, then prefill chunks,
   under the token budget; preemption and prefix sharing happen there);
2. writes the step's whole description into one pinned int32 staging buffer, laid out as
   ``ids [T] | positions [T] | slot_mapping [T] | seq_lens [B] | query_start_loc [B+1] |
   logits rows [B] | block_table [B, MB] | temperature [B] (f32 bits) | top_k [B] | top_p [B]
   (f32 bits) | seed [B] | sample position [B]``, and copies it to the device in one transfer; the
   model and the sampler read views of the device copy (not ``MetadataBuilder``, which makes
   tensors per sequence and field and copies five buffers a step: this is the hot path);
3. runs the model: a decode-only step of ``B`` requests replays the CUDA graph captured for the
   smallest batch bucket ``>= B`` (padding rows: ``seq_len`` 0, slot -1, ``query_start_loc`` flat,
   as DESIGN.md describes them), any other step runs the model eagerly;
4. samples on the device (``sampling.sample``) and reads the tokens back (the one sync).

Each layer sees the step through :class:`~torch_paged_attn.integrations.transformers.RaggedBatch`:
``reshape_and_cache`` of the step's keys/values at ``slot_mapping``, then one ``paged_attention``
call over the block tables (bottom-right causal alignment makes a prefill chunk attend to its
cached context and a decode to its whole sequence in the same call).
"""

from __future__ import annotations

import itertools
import random
import sys
import time
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..cache import BlockAllocator, PagedKVCache, cdiv
from .sampling import SamplingParams, sample, seed32
from .scheduler import FINISHED, Request, ScheduledChunk, Scheduler

__all__ = ["Engine", "RequestOutput", "generate_batch"]

DEFAULT_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: Hashable
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None = None  # "stop", "length", "cancelled"


@dataclass
class _Views:
    """Device views of one step layout (``T`` token rows, ``B`` sequence rows)."""

    ids: Tensor
    positions: Tensor
    slot_mapping: Tensor
    seq_lens: Tensor
    query_start_loc: Tensor
    logits_rows: Tensor
    block_table: Tensor
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    seed: Tensor
    sample_pos: Tensor


def _layout(num_tokens: int, num_seqs: int, max_blocks: int) -> dict[str, tuple[int, int]]:
    """Offsets ``(start, length)`` of every field in the staging buffer."""
    fields = [
        ("ids", num_tokens), ("positions", num_tokens), ("slot_mapping", num_tokens),
        ("seq_lens", num_seqs), ("query_start_loc", num_seqs + 1), ("logits_rows", num_seqs),
        ("block_table", num_seqs * max_blocks), ("temperature", num_seqs), ("top_k", num_seqs),
        ("top_p", num_seqs), ("seed", num_seqs), ("sample_pos", num_seqs),
    ]
    out, at = {}, 0
    for name, n in fields:
        out[name] = (at, n)
        at += n
    out["_total"] = (0, at)
    return out


def _model_dims(config) -> tuple[int, int, int]:
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, kv_heads, head_dim


class Engine:
    """Continuous batching for a transformers causal LM (``AutoModelForCausalLM``) on the paged ops.

    The model is switched to ``attn_implementation="paged_attn"`` and used as it is (any family the
    integration supports: Llama, Qwen3, Mistral, Gemma 2, GPT-OSS, ...), on its device and dtype.

    Args:
        model: the model (eval mode is set).
        block_size: tokens per cache block (a multiple of 8).
        num_blocks: blocks in the KV pool; None sizes it from ``memory_fraction`` of the free
            CUDA memory (after an allowance for the step's activations), or on CPU for
            ``max_num_seqs`` sequences of ``max_model_len`` tokens (at most 1 GiB).
        memory_fraction: share of the free device memory given to the pool when ``num_blocks`` is None.
        max_num_seqs: requests running at once.
        max_num_batched_tokens: the token budget of a step (decodes + prefill chunks).
        chunk_size: the most prompt tokens of one request a step computes (default: the budget).
        max_model_len: the longest request (prompt + new tokens); it sets the block-table width.
            Default: the config's ``max_position_embeddings``, at most 8192.
        prefix_caching: share full leading blocks between requests with equal prefixes.
        cuda_graphs: replay CUDA graphs for decode-only steps (default: on for CUDA models).
        graph_batch_sizes: the decode batch buckets graphs are captured for (lazily, on first use).
        seed: seeds the generator that gives requests without a seed their own.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        memory_fraction: float = 0.8,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        chunk_size: int | None = None,
        max_model_len: int | None = None,
        prefix_caching: bool = True,
        cuda_graphs: bool | None = None,
        graph_batch_sizes: Sequence[int] | None = None,
        seed: int = 0,
    ):
        from ..integrations import transformers as _integration

        self._ragged_batch = _integration.RaggedBatch
        if block_size < 8 or block_size % 8:
            raise ValueError(f"block_size: expected a positive multiple of 8, got {block_size}")
        for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size: expected an int >= 1 or None, got {chunk_size!r}")
        if not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction: expected a float in (0, 1], got {memory_fraction}")

        self.model = model.eval()
        if getattr(model.config, "_attn_implementation", None) != _integration.ATTN_IMPLEMENTATION:
            model.set_attn_implementation(_integration.ATTN_IMPLEMENTATION)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        config = model.config.get_text_config(decoder=True)
        num_layers, kv_heads, head_dim = _model_dims(model.config)
        if max_model_len is None:
            max_model_len = min(getattr(config, "max_position_embeddings", None) or 8192, 8192)
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks = cdiv(max_model_len, block_size)
        self.vocab_size = config.vocab_size

        block_bytes = 2 * num_layers * block_size * kv_heads * head_dim * torch.empty((), dtype=self.dtype).element_size()
        if num_blocks is None:
            num_blocks = self._default_num_blocks(config, block_bytes, memory_fraction, max_num_seqs, max_num_batched_tokens)
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks: expected an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.cache = PagedKVCache(
            num_layers, num_blocks, block_size, kv_heads, head_dim, dtype=self.dtype, device=self.device
        )
        self._key_caches = [self.cache.key_cache(l) for l in range(num_layers)]
        self._value_caches = [self.cache.value_cache(l) for l in range(num_layers)]
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.scheduler = Scheduler(
            self.allocator,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            chunk_size=chunk_size,
            prefix_caching=prefix_caching,
        )
        self.scheduler.on_admit = self._on_admit
        self.scheduler.on_release = self._on_release
        self.max_num_seqs = max_num_seqs

        # host block-table rows of running requests
        self._rows = np.zeros((max_num_seqs, self.max_blocks), dtype=np.int32)
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))

        # CUDA graphs for decode buckets
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs: the model is on {self.device}, CUDA graphs need a CUDA device")
        sizes = sorted(set(graph_batch_sizes or DEFAULT_GRAPH_BATCH_SIZES))
        if any(s < 1 for s in sizes):
            raise ValueError(f"graph_batch_sizes: expected sizes >= 1, got {sizes}")
        sizes = [s for s in sizes if s < max_num_seqs] + [max_num_seqs]
        self.graph_batch_sizes = sizes if cuda_graphs else []
        self._graphs: dict[int, tuple] = {}
        self._graph_pool = None

        # one staging buffer (pinned on CUDA) and its device copy, sized for the largest step
        max_tokens = max(max_num_batched_tokens, max(self.graph_batch_sizes, default=1))
        total = _layout(max_tokens, max_num_seqs if not sizes else max(sizes), self.max_blocks)["_total"][1]
        pin = self.device.type == "cuda"
        self._host = torch.zeros(total, dtype=torch.int32, pin_memory=pin)
        self._host_np = self._host.numpy()
        self._dev = torch.zeros(total, dtype=torch.int32, device=self.device)

        self._requests: dict[Hashable, Request] = {}
        self._ids = itertools.count()
        self._rng = random.Random(seed)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self._eos = frozenset([eos] if isinstance(eos, int) else (eos or ()))
        # statistics
        self.num_steps = 0
        self.num_prefill_tokens = 0  # prompt tokens computed (a cached prefix is not computed)
        self.num_computed_tokens = 0
        self.step_times: list[tuple[float, float]] = []  # (host seconds, step seconds)
        self._logits_hook = None  # tests: called with (plan, logits [B, V]) after each forward

    # -- memory --------------------------------------------------------------------------------

    def _default_num_blocks(self, config, block_bytes, fraction, max_num_seqs, max_tokens) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            itemsize = torch.empty((), dtype=self.dtype).element_size()
            inter = getattr(config, "intermediate_size", 4 * config.hidden_size)
            # the step's activations (a few hidden/intermediate rows per token) and the logits rows
            activations = max_tokens * (4 * config.hidden_size + 3 * inter) * itemsize * 2
            activations += max(max_num_seqs, 512) * self.vocab_size * 4 * 4
            blocks = int((free - activations) * fraction) // block_bytes
            if blocks < self.max_blocks:
                raise ValueError(
                    f"memory_fraction: {fraction} of the {free / 2**30:.1f} GiB free leaves {max(blocks, 0)} blocks, "
                    f"fewer than one request of max_model_len={self.max_model_len} needs ({self.max_blocks})"
                )
            return blocks
        return max(self.max_blocks, min(max_num_seqs * self.max_blocks, (1 << 30) // block_bytes))

    # -- requests ------------------------------------------------------------------------------

    def add_request(
        self, prompt: Sequence[int], params: SamplingParams | None = None, request_id: Hashable | None = None
    ) -> Hashable:
        """Queue a request (``prompt``: token ids); it joins the next step. Returns its id."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params: expected a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, Tensor):
            if prompt.dim() != 1:
                raise ValueError(f"prompt: expected a 1D tensor of token ids, got shape {list(prompt.shape)}")
            prompt = prompt.tolist()
        prompt = list(prompt)
        if not prompt:
            raise ValueError("prompt: expected at least one token id")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt):
            raise ValueError(f"prompt: expected token ids in [0, {self.vocab_size}), got {prompt[:8]}...")
        total = len(prompt) + params.max_new_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt: {len(prompt)} tokens + max_new_tokens={params.max_new_tokens} exceed "
                f"max_model_len={self.max_model_len}"
            )
        if cdiv(total, self.block_size) > self.num_blocks:
            raise ValueError(
                f"prompt: {total} tokens need {cdiv(total, self.block_size)} blocks, the pool has {self.num_blocks}"
            )
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._requests:
                request_id = next(self._ids)
        elif request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos)
        r = Request(request_id, prompt, params, seed32(seed), stop, tokens=list(prompt), t_arrival=time.perf_counter())
        self._requests[request_id] = r
        self.scheduler.add(r)
        return request_id

    def cancel(self, request_id: Hashable) -> None:
        """End a request now; its blocks are freed at once."""
        r = self._request(request_id)
        if r.status != FINISHED:
            self.scheduler.finish(r, "cancelled")

    def request(self, request_id: Hashable) -> Request:
        return self._request(request_id)

    def pop(self, request_id: Hashable) -> Request:
        """Forget a finished request (its tokens stay in the returned object)."""
        r = self._request(request_id)
        if r.status != FINISHED:
            raise ValueError(f"request_id: {request_id!r} has not finished")
        return self._requests.pop(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def _request(self, request_id):
        try:
            return self._requests[request_id]
        except KeyError:
            raise KeyError(f"request_id: unknown request {request_id!r}") from None

    def _on_admit(self, r: Request) -> None:
        r.row = self._free_rows.pop()
        r.num_blocks = -1  # mirror the block table at the next build

    def _on_release(self, r: Request) -> None:
        if r.row >= 0:
            self._free_rows.append(r.row)
            r.row = -1

    # -- one step --------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, run and sample one step; returns what each request that produced a token (or
        ended) got. Finished requests have already freed their blocks."""
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan:
            return []
        if self.scheduler.pending_copies:
            self.cache.copy_blocks(self.scheduler.pending_copies)
        num_seqs = len(plan)
        num_tokens = sum(c.num_tokens for c in plan)
        decode_only = num_tokens == num_seqs
        bucket = self._graph_bucket(num_seqs) if decode_only else None
        rows_b = bucket or num_seqs
        rows_t = bucket or num_tokens
        any_sampled, any_filtered = self._fill(plan, rows_t, rows_b)
        views = self._views(rows_t, rows_b)
        tokens, logits = self._run(views, bucket, rows_b, max(c.num_tokens for c in plan), any_sampled, any_filtered)
        if self._logits_hook is not None:
            self._logits_hook(plan, logits)
        t_launched = time.perf_counter()
        sampled = tokens[:num_seqs].tolist()  # the step's one host synchronisation
        t_synced = time.perf_counter()
        outputs = self._apply(plan, sampled, t_synced)
        t1 = time.perf_counter()
        self.num_steps += 1
        self.num_computed_tokens += num_tokens
        self.num_prefill_tokens += sum(max(0, min(c.start + c.num_tokens, len(c.request.prompt)) - c.start) for c in plan)
        self.step_times.append(((t_launched - t0) + (t1 - t_synced), t1 - t0))
        return outputs

    def _graph_bucket(self, num_seqs: int) -> int | None:
        for b in self.graph_batch_sizes:
            if b >= num_seqs:
                return b
        return None

    def _fill(self, plan: list[ScheduledChunk], rows_t: int, rows_b: int) -> tuple[bool, bool]:
        """Write the step into the host staging buffer (padding included) and copy it to the device."""
        lay = _layout(rows_t, rows_b, self.max_blocks)
        h = self._host_np
        bs = self.block_size
        ids: list[int] = []
        n = len(plan)
        rows = np.empty(n, dtype=np.int64)
        starts = np.empty(n, dtype=np.int64)
        lens = np.empty(n, dtype=np.int64)
        temps, topks, topps, seeds = [], [], [], []
        any_sampled = any_filtered = False
        alloc = self.allocator
        for i, c in enumerate(plan):
            r = c.request
            nb = alloc.num_blocks_of(r.request_id)
            if nb != r.num_blocks:
                table = alloc.block_table(r.request_id)
                self._rows[r.row, : len(table)] = table
                r.num_blocks = nb
            rows[i], starts[i], lens[i] = r.row, c.start, c.num_tokens
            if c.num_tokens == 1:
                ids.append(r.tokens[c.start])
            else:
                ids.extend(r.tokens[c.start : c.start + c.num_tokens])
            p = r.params
            temps.append(p.temperature)
            topks.append(p.top_k)
            topps.append(p.top_p)
            seeds.append(r.seed)
            any_sampled |= p.temperature > 0
            any_filtered |= p.filtered
        t = len(ids)
        ends = starts + lens
        qsl = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=qsl[1:])
        # token t of sequence i sits at position starts[i] + (t - qsl[i])
        pos = np.arange(t, dtype=np.int64) + np.repeat(starts - qsl[:-1], lens)
        tok_rows = np.repeat(rows, lens)
        slots = self._rows[tok_rows, pos // bs].astype(np.int64) * bs + pos % bs

        def put(name, values, pad=0):
            at, length = lay[name]
            k = len(values)
            h[at : at + k] = values
            if length > k:
                h[at + k : at + length] = pad

        put("ids", ids)
        put("positions", pos)
        put("slot_mapping", slots, -1)
        put("seq_lens", ends)
        put("query_start_loc", qsl, t)
        put("logits_rows", qsl[1:] - 1)
        at, length = lay["block_table"]
        bt = h[at : at + length].reshape(rows_b, self.max_blocks)
        bt[:n] = self._rows[rows]
        bt[n:] = 0
        put("temperature", np.asarray(temps, dtype=np.float32).view(np.int32), 0)
        put("top_k", topks)
        put("top_p", np.asarray(topps, dtype=np.float32).view(np.int32), np.float32(1).view(np.int32))
        put("seed", seeds)
        put("sample_pos", ends)
        total = lay["_total"][1]
        self._dev[:total].copy_(self._host[:total], non_blocking=True)
        return any_sampled, any_filtered

    def _views(self, rows_t: int, rows_b: int) -> _Views:
        lay = _layout(rows_t, rows_b, self.max_blocks)
        d = self._dev

        def v(name):
            at, length = lay[name]
            return d[at : at + length]

        return _Views(
            ids=v("ids").view(1, rows_t),
            positions=v("positions").view(1, rows_t),
            slot_mapping=v("slot_mapping"),
            seq_lens=v("seq_lens"),
            query_start_loc=v("query_start_loc"),
            logits_rows=v("logits_rows"),
            block_table=v("block_table").view(rows_b, self.max_blocks),
            temperature=v("temperature").view(torch.float32),
            top_k=v("top_k"),
            top_p=v("top_p").view(torch.float32),
            seed=v("seed"),
            sample_pos=v("sample_pos"),
        )

    def _forward(self, v: _Views, max_query_len: int) -> Tensor:
        batch = self._ragged_batch(
            self._key_caches, self._value_caches, v.block_table, v.seq_lens, v.query_start_loc,
            v.slot_mapping, max_query_len,
        )
        out = self.model(
            input_ids=v.ids, position_ids=v.positions, use_cache=False, logits_to_keep=v.logits_rows,
            paged_batch=batch,
        )
        return out.logits[0]

    def _run(self, v: _Views, bucket, rows_b, max_query_len, any_sampled, any_filtered) -> Tensor:
        if bucket is not None:
            graph = self._graphs.get(bucket)
            if graph is None:
                graph = self._capture(bucket, v)
            if graph is not None:
                g, logits, greedy = graph
                g.replay()
                if not any_sampled:
                    return greedy, logits
                return self._sample(logits, v, True, any_filtered), logits
        logits = self._forward(v, max_query_len)
        return self._sample(logits, v, any_sampled, any_filtered), logits

    @staticmethod
    def _sample(logits, v: _Views, any_sampled, any_filtered) -> Tensor:
        return sample(
            logits, v.temperature, v.top_k, v.top_p, v.seed, v.sample_pos,
            any_sampled=any_sampled, any_filtered=any_filtered,
        )

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Capture every decode bucket's CUDA graph now (else each is captured on first use), on an
        all-padding step: nothing is written to the cache."""
        for bucket in list(self.graph_batch_sizes):
            if bucket not in self._graphs:
                self._fill([], bucket, bucket)
                if self._capture(bucket, self._views(bucket, bucket)) is None:
                    break

    def _capture(self, bucket: int, v: _Views):
        """Capture the decode step of ``bucket`` rows on the views' static addresses (the step's
        data is already in the device buffer: the warm-up runs compute it, then the graph replays it)."""
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(v, 1)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._graph_pool):
                logits = self._forward(v, 1)
                greedy = logits.argmax(-1)
        except Exception as exc:  # a model whose forward synchronises (data-dependent routing, ...)
            warnings.warn(f"CUDA graph capture of decode batch {bucket} failed ({exc}); decode steps run eagerly")
            self.graph_batch_sizes = []
            return None
        self._graphs[bucket] = (g, logits, greedy)
        return self._graphs[bucket]

    def _apply(self, plan: list[ScheduledChunk], sampled: list[int], now: float) -> list[RequestOutput]:
        outputs = []
        for c, token in zip(plan, sampled):
            r = c.request
            r.num_computed += c.num_tokens
            if not c.samples:
                continue
            r.tokens.append(token)
            num_out = len(r.tokens) - len(r.prompt)
            if num_out == 1:
                r.t_first = now
            reason = None
            if token in r.stop:
                reason = "stop"
            elif num_out >= r.params.max_new_tokens:
                reason = "length"
            if reason is not None:
                r.t_finish = now
                self.scheduler.finish(r, reason)
            outputs.append(RequestOutput(r.request_id, [token], reason is not None, reason))
        return outputs

    # -- offline ---------------------------------------------------------------------------------

    def run(self, progress: bool = False, total: int | None = None) -> None:
        """Step until every request has finished."""
        bar = _Progress(total if total is not None else len(self._requests), progress)
        try:
            while self.has_unfinished():
                for o in self.step():
                    if o.finished:
                        bar.update()
        finally:
            bar.close()


class _Progress:
    """tqdm over finished requests when installed, else one rewritten stderr line."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.bar = total, 0, enabled, None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc="requests", unit="req")
            except ImportError:
                self._t0 = time.perf_counter()

    def update(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
        else:
            rate = self.done / max(time.perf_counter() - self._t0, 1e-9)
            print(f"\rrequests: {self.done}/{self.total} ({rate:.1f}/s)", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            print(file=sys.stderr, flush=True)


def generate_batch(
    model: torch.nn.Module,
    prompts: Iterable[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    max_new_tokens: int | None = None,
    progress: bool = True,
    **engine_options,
) -> list[list[int]]:
    """Generate for every prompt with continuous batching; returns each request's new tokens, in
    the prompts' order.

    Args:
        model: a transformers causal LM (switched to ``attn_implementation="paged_attn"``).
        prompts: token-id lists (or 1D tensors).
        params: one :class:`SamplingParams` for all, or one per prompt (default: greedy).
        max_new_tokens: shorthand for ``SamplingParams(max_new_tokens=...)`` when ``params`` is None.
        progress: a progress bar over finished requests.
        engine_options: :class:`Engine`'s keyword arguments.

    Example::

        >>> import torch, transformers
        >>> cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> model = transformers.AutoModelForCausalLM.from_config(cfg)
        >>> out = generate_batch(model, [[1, 2, 3], [4, 5]], max_new_tokens=4, progress=False)
        >>> [len(o) for o in out]
        [4, 4]
    """
    prompts = list(prompts)
    if params is None:
        params = SamplingParams(max_new_tokens=16 if max_new_tokens is None else max_new_tokens)
    elif max_new_tokens is not None:
        raise ValueError("max_new_tokens: give it inside params, not both")
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"params: {len(params)} SamplingParams for {len(prompts)} prompts")
    engine = Engine(model, **engine_options)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    engine.run(progress=progress, total=len(ids))
    return [engine.pop(i).output for i in ids]
