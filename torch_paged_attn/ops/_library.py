"""The ``paged_attn`` operator namespace: every op this package registers, in one view.

Each op is declared with ``torch.library.triton_op`` in the module named beside it: one schema
(inferred from the annotated signature), exact mutation annotations, and a body that validates
its inputs and hands them to the backend ``torch_paged_attn.lowering.select`` picks. The body
doubles as the fake kernel (it allocates outputs from shapes and launches nothing on fake
tensors), and under torch.compile Inductor traces through it to the kernels it launches;
``torch.export`` keeps one ``torch.ops.paged_attn.*`` node per call.
"""

NAMESPACE = "paged_attn"

# op name -> (declaring module, arguments it mutates)
OPS = {
    "paged_attention": ("paged_attention", ()),
    "paged_attention_out": ("paged_attention", ("out", "lse")),
    "mla_decode": ("mla", ()),
    "reshape_and_cache": ("kv_cache", ("key_cache", "value_cache")),
    "concat_and_cache_mla": ("kv_cache", ("kv_cache",)),
    "gather_cache": ("kv_cache", ("out",)),
    "merge_attn_states": ("merge", ()),
    "merge_attn_states_out": ("merge", ("out", "lse")),
}


def qualname(op: str) -> str:
    """``"paged_attn::<op>"`` for an op listed in ``OPS``."""
    if op not in OPS:
        raise KeyError(f"{op!r} is not a paged_attn op; known ops: {sorted(OPS)}")
    return f"{NAMESPACE}::{op}"


def mutated(op: str) -> tuple[str, ...]:
    return OPS[op][1]
