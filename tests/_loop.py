"""Ground truth for the tests: every op as a deliberately naive float64 loop.

Written from the contract alone (DESIGN.md), not from ``torch_paged_attn.lowering.reference``,
so the two can disagree. Attention walks sequence -> query token -> head -> key position in
Python and reads each key through the block table (``block_table[i][j // BS]``, offset
``j % BS``); only the head dimension is handled a whole row at a time (Python lists of floats).
Masks are applied literally, in the order DESIGN.md gives them, with Python's own floor
division for chunked attention. The fp8 quantiser decodes every bit pattern of the format by
hand and picks the nearest representable value (ties to the even bit pattern), independent of
torch's float-to-fp8 conversion.

Attention loops return float64 ``(out, lse)``; cache loops return the expected cache/out
tensors (same dtype and shape as the ones the op mutates, so tests can compare them bitwise).
"""

from __future__ import annotations

import bisect
import math

import torch
from torch import Tensor

NEG_INF = float("-inf")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# (exponent bits, mantissa bits, exponent bias, whether the all-ones exponent is inf/NaN)
_FP8_FORMAT = {
    torch.float8_e4m3fn: (4, 3, 7, False),
    torch.float8_e5m2: (5, 2, 15, True),
}


# ---------------------------------------------------------------------------------------------
# fp8 by hand
# ---------------------------------------------------------------------------------------------


def fp8_decode(bits: int, dtype: torch.dtype) -> float:
    """The value of one fp8 bit pattern (0..255) as a Python float (NaN for NaN patterns)."""
    exp_bits, man_bits, bias, ieee_special = _FP8_FORMAT[dtype]
    sign = -1.0 if bits & 0x80 else 1.0
    exponent = (bits >> man_bits) & ((1 << exp_bits) - 1)
    mantissa = bits & ((1 << man_bits) - 1)
    top = (1 << exp_bits) - 1
    if ieee_special and exponent == top:  # e5m2: inf and NaNs, as in IEEE half precision
        return sign * math.inf if mantissa == 0 else math.nan
    if not ieee_special and exponent == top and mantissa == (1 << man_bits) - 1:
        return math.nan  # e4m3fn: S.1111.111 is NaN, there is no inf
    if exponent == 0:  # subnormal
        return sign * mantissa / (1 << man_bits) * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / (1 << man_bits)) * 2.0 ** (exponent - bias)


def _fp8_magnitudes(dtype: torch.dtype) -> tuple[list[float], list[int]]:
    """Finite non-negative values of the format, ascending, with their bit patterns."""
    pairs = []
    for bits in range(0x80):
        v = fp8_decode(bits, dtype)
        if math.isfinite(v):
            pairs.append((v, bits))
    pairs.sort()
    return [v for v, _ in pairs], [b for _, b in pairs]


_MAGNITUDES = {d: _fp8_magnitudes(d) for d in FP8}


def fp8_encode(y: float, dtype: torch.dtype) -> int:
    """The bit pattern stored for ``y`` (already divided by the scale, in float32): saturate to
    the largest finite value, then round to the nearest value, ties to the even bit pattern."""
    values, patterns = _MAGNITUDES[dtype]
    if math.isnan(y):
        raise ValueError("fp8_encode: NaN has no single expected bit pattern")
    sign = 0x80 if math.copysign(1.0, y) < 0 else 0
    a = min(abs(y), values[-1])
    k = bisect.bisect_left(values, a)
    if values[k] == a:
        return sign | patterns[k]
    lo, hi = k - 1, k
    d_lo, d_hi = a - values[lo], values[hi] - a
    if d_lo < d_hi or (d_lo == d_hi and patterns[lo] % 2 == 0):
        return sign | patterns[lo]
    return sign | patterns[hi]


def quantize_rows(x: Tensor, dtype: torch.dtype, scale: Tensor | None) -> Tensor:
    """``x`` as a cache of ``dtype`` stores it: fp8 through :func:`fp8_encode` of
    ``float32(x) / float32(scale)``; other dtypes are the cache's own dtype (an exact copy)."""
    if dtype not in FP8:
        return x.to(dtype)
    y = (x.float() / scale.float().reshape(())).flatten().tolist()
    bits = [fp8_encode(v, dtype) for v in y]
    return torch.tensor(bits, dtype=torch.uint8).view(dtype).reshape(x.shape)


def dequantize(cache: Tensor, scale: Tensor | None) -> Tensor:
    """A cache as float64 values: fp8 entries times the scale, exactly."""
    if cache.dtype in FP8:
        return cache.double() * float(scale.reshape(()))
    return cache.double()


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _softmax_row(
    scores: list[float], values: list[list[float]], sink: float, dv: int
) -> tuple[list[float], float]:
    """``(sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)), log(exp(sink) + sum_j exp(s_j)))``;
    no key and no sink (``sink = -inf``) gives zeros and -inf; a NaN score (a NaN scale, query
    or key) gives NaN and NaN."""
    if any(math.isnan(s) for s in scores):
        return [math.nan] * dv, math.nan
    m = max(scores + [sink])
    if m == NEG_INF:
        return [0.0] * dv, NEG_INF
    weights = [math.exp(s - m) for s in scores]
    denom = sum(weights) + math.exp(sink - m)
    acc = [0.0] * dv
    for w, v in zip(weights, values):
        acc = [a + w * x for a, x in zip(acc, v)]
    return [a / denom for a in acc], m + math.log(denom)


def paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    *,
    scale: float,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    attention_chunk_size: int = 0,
) -> tuple[Tensor, Tensor]:
    """Paged attention, one key at a time: ``(out [T, Hq, Dv], lse [T, Hq])``, both float64."""
    num_tokens, num_heads, _ = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    head_size_v = value_cache.shape[3]
    group = num_heads // num_kv_heads
    q = query.double().tolist()
    keys = dequantize(key_cache, k_scale).tolist()
    vals = dequantize(value_cache, v_scale).tolist()
    table = block_table.tolist()
    lens = seq_lens.tolist()
    qsl = query_start_loc.tolist()
    slopes = alibi_slopes.double().tolist() if alibi_slopes is not None else None
    sink_logits = sinks.double().tolist() if sinks is not None else None

    out = [[[0.0] * head_size_v for _ in range(num_heads)] for _ in range(num_tokens)]
    lse = [[NEG_INF] * num_heads for _ in range(num_tokens)]
    for i, seq_len in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        context = seq_len - q_len
        for t in range(q_len):
            row = qsl[i] + t
            p = context + t
            visible = []
            for j in range(seq_len):
                if causal and j > p:
                    continue
                if window_left >= 0 and j < p - window_left:
                    continue
                if window_right >= 0 and j > p + window_right:
                    continue
                if attention_chunk_size > 0 and j // attention_chunk_size != p // attention_chunk_size:
                    continue
                visible.append(j)
            for h in range(num_heads):
                kvh = h // group
                scores, values = [], []
                for j in visible:
                    block = table[i][j // block_size]
                    offset = j % block_size
                    s = scale * _dot(q[row][h], keys[block][offset][kvh])
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s += slopes[h] * (j - p)
                    scores.append(s)
                    values.append(vals[block][offset][kvh])
                sink = sink_logits[h] if sink_logits is not None else NEG_INF
                out[row][h], lse[row][h] = _softmax_row(scores, values, sink, head_size_v)
    return (
        torch.tensor(out, dtype=torch.float64).reshape(num_tokens, num_heads, head_size_v),
        torch.tensor(lse, dtype=torch.float64).reshape(num_tokens, num_heads),
    )


def mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    *,
    scale: float,
    causal: bool = True,
    kv_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """MLA, one key at a time: score ``scale * (q_latent . c_j + q_rope . pe_j)`` over cache rows
    ``[c_j | pe_j]``, value ``c_j``. Returns float64 ``(out [T, H, L], lse [T, H])``."""
    num_tokens, num_heads, latent = q_latent.shape
    block_size = kv_cache.shape[1]
    ql = q_latent.double().tolist()
    qr = q_rope.double().tolist()
    rows = dequantize(kv_cache, kv_scale).tolist()
    table = block_table.tolist()
    lens = seq_lens.tolist()
    qsl = query_start_loc.tolist()

    out = [[[0.0] * latent for _ in range(num_heads)] for _ in range(num_tokens)]
    lse = [[NEG_INF] * num_heads for _ in range(num_tokens)]
    for i, seq_len in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        context = seq_len - q_len
        for t in range(q_len):
            row = qsl[i] + t
            p = context + t
            visible = [j for j in range(seq_len) if not (causal and j > p)]
            for h in range(num_heads):
                scores, values = [], []
                for j in visible:
                    kv = rows[table[i][j // block_size]][j % block_size]
                    c, pe = kv[:latent], kv[latent:]
                    scores.append(scale * (_dot(ql[row][h], c) + _dot(qr[row][h], pe)))
                    values.append(c)
                out[row][h], lse[row][h] = _softmax_row(scores, values, NEG_INF, latent)
    return (
        torch.tensor(out, dtype=torch.float64).reshape(num_tokens, num_heads, latent),
        torch.tensor(lse, dtype=torch.float64).reshape(num_tokens, num_heads),
    )


# ---------------------------------------------------------------------------------------------
# cache ops
# ---------------------------------------------------------------------------------------------


def _write_slots(cache: Tensor, rows: Tensor, slot_mapping: Tensor) -> Tensor:
    """A copy of ``cache`` with ``rows[t]`` at slot ``slot_mapping[t]`` for each slot >= 0."""
    expected = cache.clone()
    block_size = cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        expected[slot // block_size, slot % block_size] = rows[t]
    return expected


def reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The caches after the write, as new tensors; rows past ``len(slot_mapping)`` never read."""
    n = slot_mapping.shape[0]
    k_rows = quantize_rows(key[:n], key_cache.dtype, k_scale)
    v_rows = quantize_rows(value[:n], value_cache.dtype, v_scale)
    return _write_slots(key_cache, k_rows, slot_mapping), _write_slots(value_cache, v_rows, slot_mapping)


def concat_and_cache_mla(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None = None
) -> Tensor:
    """The latent cache after writing ``[kv_c[t] | k_pe[t]]`` at each slot, as a new tensor."""
    n = slot_mapping.shape[0]
    rows = torch.cat([kv_c[:n], k_pe[:n]], dim=-1)
    return _write_slots(kv_cache, quantize_rows(rows, kv_cache.dtype, scale), slot_mapping)


def gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    out: Tensor,
    seq_starts: Tensor | None = None,
    scale: Tensor | None = None,
) -> Tensor:
    """``out`` after the gather, as a new tensor. Each token is read as ``float32(stored * scale)``
    (the product of an fp8 value and a float32 scale is exact in float64, so rounding it once to
    float32 is the float32 product), then converted to ``out``'s dtype."""
    expected = out.clone()
    block_size = kv_cache.shape[1]
    table = block_table.tolist()
    cu = cu_seq_lens.tolist()
    starts = seq_starts.tolist() if seq_starts is not None else [0] * len(table)
    for i in range(len(table)):
        for r in range(cu[i + 1] - cu[i]):
            pos = starts[i] + r
            stored = kv_cache[table[i][pos // block_size], pos % block_size]
            if kv_cache.dtype in FP8:
                value = (stored.double() * float(scale.reshape(()))).float()
            else:
                value = stored
            expected[cu[i] + r] = value.to(out.dtype)
    return expected


# ---------------------------------------------------------------------------------------------
# merge
# ---------------------------------------------------------------------------------------------


def merge_attn_states(
    prefix_out: Tensor, prefix_lse: Tensor, suffix_out: Tensor, suffix_lse: Tensor
) -> tuple[Tensor, Tensor]:
    """Per (token, head): ``lse = log(exp(lse_p) + exp(lse_s))`` and the weighted outputs; an
    infinite LSE marks an empty part whose output is never read, a NaN LSE in either part gives
    NaN and NaN. Float64 ``(out, lse)``."""
    num_tokens, num_heads, head_size = prefix_out.shape
    po, so = prefix_out.double().tolist(), suffix_out.double().tolist()
    pl, sl = prefix_lse.double().tolist(), suffix_lse.double().tolist()
    out = [[[0.0] * head_size for _ in range(num_heads)] for _ in range(num_tokens)]
    lse = [[NEG_INF] * num_heads for _ in range(num_tokens)]
    for t in range(num_tokens):
        for h in range(num_heads):
            parts = [
                (l, o)
                for l, o in ((pl[t][h], po[t][h]), (sl[t][h], so[t][h]))
                if not math.isinf(l)
            ]
            if any(math.isnan(l) for l, _ in parts):
                out[t][h], lse[t][h] = [math.nan] * head_size, math.nan
                continue
            if not parts:
                continue
            m = max(l for l, _ in parts)
            total = m + math.log(sum(math.exp(l - m) for l, _ in parts))
            acc = [0.0] * head_size
            for l, o in parts:
                w = math.exp(l - total)
                acc = [a + w * x for a, x in zip(acc, o)]
            out[t][h], lse[t][h] = acc, total
    return (
        torch.tensor(out, dtype=torch.float64).reshape(num_tokens, num_heads, head_size),
        torch.tensor(lse, dtype=torch.float64).reshape(num_tokens, num_heads),
    )


def merge_attn_states_n(outs: Tensor, lses: Tensor) -> tuple[Tensor, Tensor]:
    """Per (token, head): ``lse = log(sum_i exp(lses[i]))`` over the finite parts and the
    outputs weighted by ``exp(lses[i] - lse)``; an infinite LSE marks an empty part whose output
    is never read, a NaN LSE in any part gives NaN and NaN. ``outs [N, T, H, D]``, ``lses [N, T, H]``; float64 ``(out [T, H, D], lse [T, H])``."""
    num_parts, num_tokens, num_heads, head_size = outs.shape
    o, l = outs.double().tolist(), lses.double().tolist()
    out = [[[0.0] * head_size for _ in range(num_heads)] for _ in range(num_tokens)]
    lse = [[NEG_INF] * num_heads for _ in range(num_tokens)]
    for t in range(num_tokens):
        for h in range(num_heads):
            parts = [(l[i][t][h], o[i][t][h]) for i in range(num_parts) if not math.isinf(l[i][t][h])]
            if any(math.isnan(x) for x, _ in parts):
                out[t][h], lse[t][h] = [math.nan] * head_size, math.nan
                continue
            if not parts:
                continue
            m = max(x for x, _ in parts)
            total = m + math.log(sum(math.exp(x - m) for x, _ in parts))
            acc = [0.0] * head_size
            for x, row in parts:
                w = math.exp(x - total)
                acc = [a + w * v for a, v in zip(acc, row)]
            out[t][h], lse[t][h] = acc, total
    return (
        torch.tensor(out, dtype=torch.float64).reshape(num_tokens, num_heads, head_size),
        torch.tensor(lse, dtype=torch.float64).reshape(num_tokens, num_heads),
    )
