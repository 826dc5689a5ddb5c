"""Host time of an eager paged_attention call, piece by piece, and the pinned launch against the
runner in alternating windows (no re-planning between them: the remembered entry's ``fire`` is
swapped for None and back). overhead.py's one-token decode inputs. Each figure: perf_counter over
N calls issued while the GPU is held busy by a sleep kernel (the host's cost alone, nothing waits
on the device), median over WINDOWS windows, the modes alternating window by window."""

import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..", "..", "..")]
import torch  # noqa: E402

import overhead as O  # noqa: E402
import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.ops.paged_attention import plain_eager  # noqa: E402

WINDOWS, N = int(os.environ.get("WINDOWS", "40")), 100
device = torch.device("cuda")
q, kc, vc, table, lens, qsl = O._decode_inputs(device)
out = torch.empty(1, 32, 128, device=device, dtype=q.dtype)
scale = 1.0 / math.sqrt(128)


def functional():
    return tpa.paged_attention(q, kc, vc, table, lens, qsl, scale=scale, max_query_len=1)


def out_form():
    tpa.paged_attention_out(q, kc, vc, table, lens, qsl, out, scale=scale, max_query_len=1)


lowering._CHOICES.clear()
for _ in range(20):
    functional(), out_form()
torch.cuda.synchronize()
entries = {key[0][0]: found for key, found in lowering._CHOICES.items() if isinstance(found, list)}
fires = {op: entries[op][0][1][-1] for op in ("paged_attention", "paged_attention_out")}
assert all(f is not None for f in fires.values()), fires


def set_pinned(op: str, pinned: bool) -> None:
    check, payload = entries[op][0]
    entries[op][0] = (check, (*payload[:-1], fires[op] if pinned else None))


def window(fn) -> float:
    torch.cuda._sleep(35_000_000)
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed * 1e6 / N


key = ("paged_attention", q.shape[:1], scale, True, -1, -1, 0.0, 0, 1, False, float, bool, int, int, float, int,
       int, bool, True, True, True, True)
checked = (q, kc, vc, table, lens, qsl)
assert lowering.eager_planned(key, checked) is not None
run, options, out_size, lse_size, lse_like, _ = lowering.eager_planned(key, checked)
fire = fires["paged_attention"]
null = O.null_kernel(cached=True)


def key_build(query=q, causal=True, window_left=-1, window_right=-1, softcap=0.0, attention_chunk_size=0,
              max_query_len=1, return_lse=False, alibi_slopes=None, sinks=None, k_scale=None, v_scale=None):
    return (
        "paged_attention", query.shape[:1], scale, causal, window_left, window_right, softcap,
        attention_chunk_size, max_query_len, return_lse, scale.__class__, causal.__class__,
        window_left.__class__, window_right.__class__, softcap.__class__, attention_chunk_size.__class__,
        max_query_len.__class__, return_lse.__class__,
        alibi_slopes is None, sinks is None, k_scale is None, v_scale is None,
    )


pieces = {
    "null kernel, cached launch": null,
    "torch add_ (1 element)": lambda: out.add_(0),
    "plain_eager(query)": lambda: plain_eager(q),
    "the key tuple": key_build,
    "lowering.eager_planned": lambda: lowering.eager_planned(key, checked),
    "query.new_empty(*size), dropped": lambda: q.new_empty(*out_size),
    "lse_like.detach()": lambda: lse_like.detach(),
    "fire (out given)": lambda: fire(q, kc, vc, table, lens, qsl, out),
    "run (out given)": lambda: run(q, kc, vc, table, lens, qsl, out, None, options),
}
got: dict[str, list[float]] = {}
for w in range(WINDOWS):
    order = (True, False) if w % 2 == 0 else (False, True)
    for pinned in order:
        for op in fires:
            set_pinned(op, pinned)
        for name, fn in (("paged_attention", functional), ("paged_attention_out", out_form)):
            got.setdefault(f"{name} {'pinned' if pinned else 'run'}", []).append(window(fn))
    for name, fn in pieces.items():
        got.setdefault(name, []).append(window(fn))
print(f"host us per call ({torch.cuda.get_device_name()}), perf_counter over {N} calls with the GPU busy, "
      f"median (p20-p80) of {WINDOWS} windows:")
for name, vs in got.items():
    s = sorted(vs)
    print(f"  {name:<36} {statistics.median(vs):6.2f}  ({s[len(s) // 5]:.2f}-{s[4 * len(s) // 5]:.2f})")
for name in ("paged_attention", "paged_attention_out"):
    d = [a - b for a, b in zip(got[f"{name} run"], got[f"{name} pinned"])]
    print(f"  {name}: run - pinned, paired by window: median {statistics.median(d):.2f} us, "
          f"{sum(x > 0 for x in d)} of {len(d)} windows > 0")
