"""Continuous batching for transformers causal LMs on the paged ops (needs ``transformers``).

- :func:`generate_batch` (offline: prompts in, each request's new tokens out, in order);
- :class:`Engine` (streaming: ``add_request`` at any time, ``step()`` returns what each request
  produced, ``cancel``), with :class:`SamplingParams` per request;
- ``scheduler.py`` decides each step's chunks (token budget, decodes first, chunked prefill,
  prefix sharing, preemption); ``sampling.py`` samples every row of a step on the device.
"""

from .engine import Engine, RequestOutput, generate_batch
from .sampling import SamplingParams

__all__ = ["Engine", "RequestOutput", "SamplingParams", "generate_batch"]
