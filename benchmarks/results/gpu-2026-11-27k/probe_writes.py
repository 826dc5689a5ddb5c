"""The cache writes' host time with their eager entries (7d63d30's successor: a repeated plain
``reshape_and_cache`` / ``concat_and_cache_mla`` call served by its plan's pinned launch) against
the usual path, the rows' repetitions interleaved in one process as ``../gpu-2026-11-27j/probe_rows.py``
does: each round times every row once (CUDA events over ``CALLS`` back-to-back calls, then host time
over 100 calls issued while a sleep kernel holds the GPU). Rows per op: as shipped (the native
``Pinned`` where it builds), "[python pin]" (``TORCH_PAGED_ATTN_NATIVE_LAUNCH=0`` when the entry was
remembered), and "[usual path]" (``lowering.eager_planned`` answering None, ``lowering.remember``
doing nothing and ``ops.kv_cache._pinned`` pinning nothing: validation by signature, the plan's
runner and the launcher's cached path, as every call went before the entries). Calls 9 and 10 ran
it without the last two and the last one: every call of that row pinned a new launch, which
``remember`` then stored (call 9, ``logs/call9/writes-remembering.txt``) or dropped (call 10,
``logs/call10/writes.txt``), so their usual-path rows are slower than the usual path was. Inputs: ``overhead.py``'s (one token, 8 kv heads of 128 / a 512 + 64 MLA row).

    python3 probe_writes.py   # ROUNDS=30 CALLS=1000
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import overhead as O  # noqa: E402

from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.ops import kv_cache  # noqa: E402

OPS = ("reshape_and_cache", "concat_and_cache_mla")


def main():
    device = torch.device("cuda")
    rounds, calls = int(os.environ.get("ROUNDS", 30)), int(os.environ.get("CALLS", 1000))
    ops = O.op_calls(device)
    fns = {"null kernel, cached launch": O.null_kernel(cached=True)}
    choices = {}
    for suffix, native in (("", "1"), (" [python pin]", "0")):
        os.environ["TORCH_PAGED_ATTN_NATIVE_LAUNCH"] = native
        lowering._CHOICES = {}
        for name in OPS:
            fns[name + suffix] = ops[name]
            for _ in range(50):
                ops[name]()
            choices[name + suffix] = lowering._CHOICES
    os.environ.pop("TORCH_PAGED_ATTN_NATIVE_LAUNCH")
    for name in OPS:
        fns[name + " [usual path]"] = ops[name]
        choices[name + " [usual path]"] = choices[name]
    for name, table in choices.items():  # the fire each remembered entry holds
        fires = [(key[0][0], type(payload[-1]).__name__) for key, entries in table.items()
                 if isinstance(entries, list) for _, payload in entries]
        print(f"{name}: {fires}")
    eager_planned, remember, pinned = lowering.eager_planned, lowering.remember, kv_cache._pinned
    usual_rows = {name for name in fns if name.endswith("[usual path]")}

    def before(name):  # the row's own entries; the usual path's entries and pins switched off
        if name in choices:
            lowering._CHOICES = choices[name]
        usual = name in usual_rows
        lowering.eager_planned = (lambda key, tensors: None) if usual else eager_planned
        lowering.remember = (lambda key, tensors, payload: None) if usual else remember
        kv_cache._pinned = (lambda run, tensors: None) if usual else pinned

    got = O.interleaved(fns, device, rounds, calls, before)
    lowering.eager_planned, lowering.remember, kv_cache._pinned = eager_planned, remember, pinned
    print(f"{torch.cuda.get_device_name()}: {rounds} rounds, rows interleaved; us a call")
    O.print_interleaved(got, 36)


if __name__ == "__main__":
    main()
