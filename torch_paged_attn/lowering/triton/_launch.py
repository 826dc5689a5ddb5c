"""One launch helper for every Triton kernel of the package.

``launch(kernel, grid, like)`` is ``wrap_triton(kernel)[grid]`` whenever something may be
tracing (fake or functional tensors, a dispatch mode on the stack): that is what lets
torch.compile and AOTInductor see and launch the kernels themselves. For a plain eager call on
real tensors it is the kernel's own ``kernel[grid]`` launcher, which is what ``wrap_triton``
would call there too, without its ~20 us of wrapper objects and mode checks per launch
(measured on a 2-core machine, 2026-11).
"""

from __future__ import annotations

import torch
from torch.library import wrap_triton


def launch(kernel, grid, like: torch.Tensor):
    """The launcher of ``kernel`` over ``grid`` for a call whose tensors look like ``like``."""
    if type(like) is torch.Tensor and torch._C._len_torch_dispatch_stack() == 0:
        return kernel[grid]
    return wrap_triton(kernel)[grid]
