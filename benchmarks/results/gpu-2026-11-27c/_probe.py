"""What this directory's probes share: the package's MLA decode timed in CUDA-graph replays
(p50 us; benchmarks/_harness.py) on benchmarks/mla_decode.py's inputs, several variants of the
package alternated round by round in one process, each output checked against a float32
gather-einsum after a run into a NaN-filled output; and kernel modules built from the package's
source by asserted replacements."""
import importlib.util
import os
import sys
import tempfile
from typing import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import mla_decode as md  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402

PKG = "torch_paged_attn.lowering.triton"


def replaced(module, replacements: tuple) -> str:
    """``module``'s source with each ``(old, new)`` of ``replacements`` replaced (each ``old``
    found exactly once)."""
    with open(module.__file__) as f:
        src = f.read()
    for old, new in replacements:
        assert src.count(old) == 1, f"not in {os.path.basename(module.__file__)} once: {old!r}"
        src = src.replace(old, new)
    return src


def module_from_source(name: str, source: str):
    """``source`` (written to a temporary file) loaded as the package's module ``name``;
    ``sys.modules`` keeps the package's own."""
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    full = f"{PKG}.{name}"
    spec = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = PKG
    saved = sys.modules.get(full)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is not None:
            sys.modules[full] = saved
    return module


def selected(items: list, env: str) -> list:
    """The ``items`` (each with a ``name``) that the comma-separated ``env`` names (all without it)."""
    wanted = os.environ.get(env)
    return [x for x in items if not wanted or x.name in wanted.split(",")]


def compare(shapes: list, variants: dict[str, Callable[[], None]], rounds: int,
            describe: Callable[[dict], str] | None = None) -> None:
    """Each of mla_decode.py's ``shapes`` (``PROBE_SHAPES`` selects by name) timed under each
    variant (``variants``: name -> what switches the package to it), alternated for ``rounds``
    rounds (``PROBE_ROUNDS`` overrides), the plans and launchers dropped at each switch; a line a
    timing, with ``describe`` of the keyword arguments ``mla_sm90.prepare`` got (if it was)."""
    device = torch.device("cuda")
    rounds = int(os.environ.get("PROBE_ROUNDS", rounds))
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    for s in selected(shapes, "PROBE_SHAPES"):
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(rounds):
            for name, use in variants.items():
                use()
                mla_sm90._LAUNCHERS.clear()
                lowering._CHOICES.clear()
                plans = []
                prepare = mla_sm90.prepare
                mla_sm90.prepare = lambda **k: plans.append(k) or prepare(**k)
                try:
                    fns = [_runner(s, x, device) for x in copies]
                    fns[0]().fill_(float("nan"))
                    got = fns[0]().float()
                finally:
                    mla_sm90.prepare = prepare
                err = ((got - want).abs().max() / want.abs().max()).item()
                what = f"  {describe(plans[-1] if plans else {})}" if describe else ""
                t = H.bench(fns, device, use_graph=True)
                print(f"{s.name:28s} round {rnd} {name:7s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}{what}", flush=True)


def _runner(s, x, device: torch.device) -> Callable[[], torch.Tensor]:
    """One call of the package's MLA decode on inputs ``x`` of shape ``s``, into its own output."""
    out = torch.empty_like(x.q_latent)
    lse = torch.empty(x.q_latent.shape[:2], device=device)

    def run():
        tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                        max_query_len=s.q_len)
        return out
    return run


def splits(plan: dict) -> int:
    """The splits of a plan ``mla_sm90.prepare`` got."""
    return plan["workspace"].shapes[0][1] if plan.get("workspace") else 1
