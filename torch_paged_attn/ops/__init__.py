"""Operator declarations: importing this package registers every ``torch.ops.paged_attn`` op."""

from .kv_cache import concat_and_cache_mla, gather_cache, reshape_and_cache
from .merge import merge_attn_states, merge_attn_states_n, merge_attn_states_n_out, merge_attn_states_out
from .mla import mla_decode
from .paged_attention import paged_attention, paged_attention_out

__all__ = [
    "concat_and_cache_mla",
    "gather_cache",
    "merge_attn_states",
    "merge_attn_states_n",
    "merge_attn_states_n_out",
    "merge_attn_states_out",
    "mla_decode",
    "paged_attention",
    "paged_attention_out",
    "reshape_and_cache",
]
