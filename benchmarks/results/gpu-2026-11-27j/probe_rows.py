"""overhead.py's host-time rows measured with their repetitions interleaved: each round times every
row once (CUDA events over ``CALLS`` back-to-back calls, then host time over 100 calls issued while
a sleep kernel holds the GPU), the rows in turn, for ``ROUNDS`` rounds in one process, so that a
slow stretch of the host (seconds long on these machines) lands on every row alike instead of on
whichever row it meets. Per row: median, quartiles and minimum over the rounds, and the median of
its paired difference to the null kernel's cached launch of the same round.

The two ``paged_attention`` rows run twice each: their eager entries remembered with the native
pinned launch (``lowering/triton/_native.py``; as shipped where it builds) and, as "[python pin]",
with ``TORCH_PAGED_ATTN_NATIVE_LAUNCH=0`` (the Python ``fire``), each row with its own entries
(``lowering._CHOICES`` swapped in before it).

    python3 probe_rows.py   # ROUNDS=40 CALLS=1000

(Calls 3-8 ran it with its own copies of the two timers, since moved into overhead.py as
``events_us`` and ``host_us``, the same code; its rounds loop and summary moved there too, as
``interleaved`` and ``print_interleaved``, in the eighteenth session, the same code.)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import overhead as O  # noqa: E402

from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import _native  # noqa: E402

ROWS = ("null kernel, cached launch", "torch add_ (1 element)", "paged_attention", "paged_attention [python pin]",
        "paged_attention_out", "paged_attention_out [python pin]")


def main():
    device = torch.device("cuda")
    rounds, calls = int(os.environ.get("ROUNDS", 40)), int(os.environ.get("CALLS", 1000))
    one = torch.zeros(1, device=device)
    ops = O.op_calls(device)
    fns = {"null kernel, cached launch": O.null_kernel(cached=True), "torch add_ (1 element)": lambda: one.add_(1)}
    choices = {}
    for suffix, native in (("", "1"), (" [python pin]", "0")):
        os.environ["TORCH_PAGED_ATTN_NATIVE_LAUNCH"] = native
        lowering._CHOICES = {}
        for name in ("paged_attention", "paged_attention_out"):
            fns[name + suffix] = ops[name]
            for _ in range(50):
                ops[name]()
            choices[name + suffix] = lowering._CHOICES
    os.environ.pop("TORCH_PAGED_ATTN_NATIVE_LAUNCH")
    print("native module:", _native.module())
    for name, table in choices.items():  # the fire each remembered entry holds
        fires = [(key[0][0], type(payload[-2] if key[0][0] == "paged_attention" else payload[-1]).__name__)
                 for key, entries in table.items() if isinstance(entries, list) for _, payload in entries]
        print(f"{name}: {fires}")
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()

    def before(name):  # the row's own eager entries
        if name in choices:
            lowering._CHOICES = choices[name]

    got = O.interleaved({name: fns[name] for name in ROWS}, device, rounds, calls, before)
    print(f"{torch.cuda.get_device_name()}: {rounds} rounds, rows interleaved; us a call")
    O.print_interleaved(got)


if __name__ == "__main__":
    main()
