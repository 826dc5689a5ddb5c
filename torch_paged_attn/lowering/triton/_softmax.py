"""Online-softmax algebra shared by the Triton kernels (``@triton.jit`` helpers, no launches).

Two kinds of state. A *running* state ``(m, l, acc)`` over the keys seen so far, in the log2
domain (scores already multiplied by log2(e), so ``exp2`` is one instruction)::

    m = max_j s_j,   l = sum_j 2^(s_j - m),   acc = sum_j 2^(s_j - m) v_j      (Milakov & Gimelshein 2018)

and a *partial* result ``(out, lse)`` over a disjoint part of the keys: the normalised output
``acc / l`` and ``lse = m + log2(l)`` (still log2). Partials merge exactly through their lse
(FlashDecoding, Dao et al. 2023). An empty part has ``l = 0``: out 0, lse -inf. Only
``merged_to_output`` returns a natural-log lse, the one the ops expose; ``LN2``/``LOG2E`` convert.

Merges spell their multiply-adds as ``tl.fma`` so the compiler cannot contract them differently
in two kernels: the split-KV combine kernel and the in-program combine of the attention kernel
produce the same bits from the same partials, which batch-invariant mode relies on.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def softmax_step(m_i, l_i, acc, s):
    """One tile of the online softmax: fold scores ``s`` [M, N] (log2 domain, -inf = masked)
    into the running state ``m_i``/``l_i`` [M], ``acc`` [M, Dv].

    Returns ``(m_new, l_new, acc_rescaled, p)``; the caller adds ``p @ V`` to ``acc_rescaled``.
    Rows that have seen no visible key keep ``m = -inf`` and contribute ``p = 0``.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with no visible key so far has m_new = -inf; subtracting 0 keeps exp2 at 0, not NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, acc * alpha[:, None], p


@triton.jit
def state_to_partial(m_i, l_i, acc):
    """Running state -> partial ``(out [M, Dv] = acc / l, lse [M] = m + log2 l)``; an empty
    state (``l = 0``) gives out 0 and lse -inf. A NaN ``l`` (a NaN score: a NaN scale, query or
    key) is not empty: out and lse NaN."""
    has_keys = l_i != 0.0
    inv_l = tl.where(has_keys, 1.0 / tl.where(has_keys, l_i, 1.0), 0.0)
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    return acc * inv_l[:, None], lse


@triton.jit
def merge_partial(m_i, l_i, acc, lse_p, out_p):
    """Fold the partial ``(out_p [M, Dv], lse_p [M])`` (log2) into the merge state ``(m_i, l_i,
    acc)``: ``m`` the largest lse so far, ``l = sum 2^(lse - m)``, ``acc = sum 2^(lse - m) out``.

    An empty partial (lse -inf, out 0) leaves the state unchanged; a NaN ``lse_p`` makes ``l``
    and ``acc`` NaN (``tl.maximum`` may drop the NaN from ``m``, ``exp2`` does not).
    """
    m_new = tl.maximum(m_i, lse_p)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    beta = tl.exp2(lse_p - m_ref)
    l_new = tl.fma(l_i, alpha, beta)
    acc_new = tl.fma(out_p, beta[:, None], acc * alpha[:, None])
    return m_new, l_new, acc_new


@triton.jit
def merged_to_output(m_i, l_i, acc, out_scale):
    """Merge state -> ``(out [M, Dv] = acc / l * out_scale, lse [M] natural log)``; rows that
    merged nothing but empty parts give 0 and -inf, rows that merged a NaN lse NaN and NaN."""
    has_keys = l_i != 0.0
    inv_l = tl.where(has_keys, out_scale / tl.where(has_keys, l_i, 1.0), 0.0)
    lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2, float("-inf"))
    return acc * inv_l[:, None], lse

