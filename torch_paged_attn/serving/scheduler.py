"""Which tokens of which requests the next step computes (host-side policy, no tensors).

A request is a token list (its prompt, then what it generated) of which the first
``num_computed`` have keys/values in the cache. A step computes ``tokens[num_computed :
num_computed + n]`` for each scheduled request; when that reaches the end of the list, the step
samples the request's next token. A decode is the case ``n = 1``; a prefill chunk, a recompute
after preemption and a prompt whose prefix was cached are the same thing with other numbers.

Policy per step, under ``max_num_batched_tokens`` (the token budget) and ``max_num_seqs``:

1. running decodes, oldest first; when a decode needs a block and none is free, the newest running
   request is preempted (blocks freed, back to the front of the queue, recomputed later);
2. running requests still prefilling, oldest first (chunks of at most ``chunk_size``); one that
   needs a block preempts the newest running request not yet scheduled in this step;
3. waiting requests in order: the longest run of their leading full blocks found in the prefix
   cache is shared (computed once), the rest prefilled in chunks; a request whose next full
   block a running request is still computing (a long shared prefix in chunks) waits for it. A request that does not fit
   waits; a request that could never fit is refused when it is added.

Blocks a step fills completely are registered in the prefix cache when it is scheduled: every
layer stores the whole step's keys before it attends, so a request later in the same step can
already share them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from ..cache import BlockAllocator, OutOfBlocksError, cdiv
from .sampling import SamplingParams

__all__ = ["Request", "ScheduledChunk", "Scheduler"]

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Request:
    request_id: Hashable
    prompt: list[int]
    params: SamplingParams
    seed: int  # 31-bit, see sampling.seed32
    stop: frozenset
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: str = WAITING
    finish_reason: str | None = None
    admitted: int = -1  # admission counter: preemption takes the newest
    row: int = -1  # the engine's host block-table row while running
    num_blocks: int = 0  # blocks mirrored into that row
    hashes: list = field(default_factory=list)  # chained hashes of full blocks of tokens
    num_registered: int = 0  # leading blocks registered in the prefix cache
    pending_upto: int = 0  # hashes counted in Scheduler._pending are hashes[num_registered:pending_upto]
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache (last admission)
    num_preemptions: int = 0
    # timestamps (time.perf_counter), for the benchmark
    t_arrival: float = 0.0
    t_first: float = 0.0
    t_finish: float = 0.0

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt):]


@dataclass
class ScheduledChunk:
    request: Request
    start: int  # first position computed
    num_tokens: int
    samples: bool  # the chunk ends the token list: the step samples a token for it


class Scheduler:
    def __init__(
        self,
        allocator: BlockAllocator,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunk_size: int | None,
        prefix_caching: bool,
    ):
        self.allocator = allocator
        self.block_size = allocator.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunk_size = chunk_size or max_num_batched_tokens
        self.prefix_caching = prefix_caching
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self._admissions = 0
        self.num_preemptions = 0
        # callbacks the engine sets: a request got a row / lost it; a block must be copied
        self.on_admit = lambda r: None
        self.on_release = lambda r: None
        self.pending_copies: list[tuple[int, int]] = []
        # hashes of full prompt blocks that running requests will compute (not yet registered)
        self._pending: dict = {}

    # -- requests --------------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def finish(self, request: Request, reason: str) -> None:
        """End a request (finished or cancelled): its blocks are freed at once."""
        if request.status == RUNNING:
            self.running.remove(request)
            self._release(request)
        elif request.status == WAITING:
            self.waiting.remove(request)
        request.status, request.finish_reason = FINISHED, reason

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ---------------------------------------------------------------------------------

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        plan: list[ScheduledChunk] = []
        planned: set[int] = set()
        self.pending_copies = []

        # 1. decodes (one token left to compute), oldest first; preempt the newest when blocks run out
        for r in list(self.running):
            if budget == 0:
                break
            if r.status != RUNNING or len(r.tokens) - r.num_computed != 1:
                continue
            while not self._try_extend(r, 1):
                victim = next((v for v in reversed(self.running) if id(v) not in planned), None)
                self._preempt(victim)
                if victim is r:
                    break
            if r.status != RUNNING:
                continue
            plan.append(self._chunk(r, 1))
            planned.add(id(r))
            budget -= 1

        starved = False
        # 2. running prefills (chunked), oldest first; a newer unplanned request yields its blocks
        #    to an older one (else two half-prefilled requests could wait on each other forever)
        for r in list(self.running):
            if budget == 0:
                break
            if id(r) in planned or r.status != RUNNING:
                continue
            n = min(len(r.tokens) - r.num_computed, budget, self.chunk_size)
            while not self._try_extend(r, n):
                victim = next((v for v in reversed(self.running) if id(v) not in planned), None)
                if victim is r:
                    break
                self._preempt(victim)
            else:
                plan.append(self._chunk(r, n))
                planned.add(id(r))
                budget -= n
                continue
            starved = True  # no admissions either: the blocks that free up go to r first
            break

        # 3. waiting requests, in order; one whose next prompt block a running request is about
        #    to compute waits for it (and lets the requests behind it go first)
        deferred: list[Request] = []
        while self.waiting and not starved and budget > 0 and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            admitted = self._admit(r)
            if admitted is None:
                deferred.append(self.waiting.popleft())
                continue
            if not admitted:
                break
            self.waiting.popleft()
            n = min(len(r.tokens) - r.num_computed, budget, self.chunk_size)
            if not self._try_extend(r, n):
                self.running.remove(r)
                self._release(r)
                r.status, r.num_computed = WAITING, 0
                self.waiting.appendleft(r)
                break
            plan.append(self._chunk(r, n))
            planned.add(id(r))
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        return plan

    # -- internals ------------------------------------------------------------------------------

    def _chunk(self, r: Request, n: int) -> ScheduledChunk:
        start = r.num_computed
        end = start + n
        if self.prefix_caching and end // self.block_size > r.num_registered:
            full = end // self.block_size
            self._hash_upto(r, full)
            for k in range(r.num_registered, full):
                self.allocator.register(r.request_id, k, r.hashes[k])
                if k < r.pending_upto:
                    self._unpend(r.hashes[k])
            r.num_registered = max(r.num_registered, full)
        return ScheduledChunk(r, start, n, end == len(r.tokens))

    def _hash_upto(self, r: Request, num_blocks: int) -> None:
        bs, tokens = self.block_size, r.tokens
        parent = r.hashes[-1] if r.hashes else None
        for k in range(len(r.hashes), num_blocks):
            parent = hash((parent, tuple(tokens[k * bs : (k + 1) * bs])))
            r.hashes.append(parent)

    def _try_extend(self, r: Request, n: int) -> bool:
        """Room for ``n`` more tokens of ``r`` in the cache (its allocator length becomes
        ``num_computed + n``); False, with nothing changed, when blocks are short."""
        return self.allocator.try_grow(r.request_id, r.num_computed + n)

    def _admit(self, r: Request) -> bool | None:
        """Give ``r`` its cached prefix (if any) and a row; False when it does not fit now, None
        when its next full block is one a running request has yet to compute (then it waits for
        that block instead of computing it a second time)."""
        a, bs = self.allocator, self.block_size
        blocks: list[int] = []
        if self.prefix_caching:
            self._hash_upto(r, len(r.tokens) // bs)
            blocks = a.cached_prefix(r.hashes)
            if len(blocks) < len(r.hashes) and r.hashes[len(blocks)] in self._pending:
                return None
        # at least one token is computed, to give the logits of the next one
        cached = min(len(blocks) * bs, len(r.tokens) - 1)
        blocks = blocks[: cdiv(cached, bs)]
        if a.num_free_blocks < cdiv(len(r.tokens), bs) - len(blocks) + 1 and self.running:
            return False  # not enough room for its prompt: wait for running requests to finish
        if blocks:
            a.allocate_prefix(r.request_id, blocks, cached)
            if cached % bs:  # its next token lands in the last shared block: copy on write
                try:
                    pair = a.copy_on_write(r.request_id, len(blocks) - 1)
                except OutOfBlocksError:
                    a.free(r.request_id)
                    return False
                if pair is not None:
                    self.pending_copies.append(pair)
        else:
            a.allocate(r.request_id, 0)
        r.num_computed = r.num_cached_tokens = cached
        r.num_registered = len(blocks) if cached % bs == 0 else len(blocks) - 1
        r.pending_upto = len(r.hashes)
        for h in r.hashes[r.num_registered :]:
            self._pending[h] = self._pending.get(h, 0) + 1
        r.status = RUNNING
        r.admitted = self._admissions
        self._admissions += 1
        self.running.append(r)
        self.on_admit(r)
        return True

    def _unpend(self, h) -> None:
        count = self._pending[h] - 1
        if count:
            self._pending[h] = count
        else:
            del self._pending[h]

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self._release(r)
        r.status, r.num_computed = WAITING, 0
        r.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    def _release(self, r: Request) -> None:
        for h in r.hashes[r.num_registered : r.pending_upto]:
            self._unpend(h)
        r.pending_upto = 0
        self.allocator.free(r.request_id)
        r.num_registered = 0
        self.on_release(r)
