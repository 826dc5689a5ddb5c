"""Variants of the package's MLA kernels timed against each other: what the probes under
``results/gpu-*/`` share (CUDA only).

``compare`` times the package's MLA decode (``lowering.triton.mla.mla_decode``, the hint
``max_query_len`` given) in CUDA-graph replays (p50 us; ``_harness.bench``) on ``mla_decode.py``'s
inputs, several variants of the package alternated round by round in one process, each output
checked against a float32 gather-einsum after a run into a NaN-filled output. A variant is a
function that switches the package to it (a module swapped in, a switch set); ``replaced`` and
``module_from_source`` build variant modules from the package's own source by asserted
replacements, ``module_from_file`` loads an archived one.

Environment: ``PROBE_ROUNDS`` (rounds, overriding the probe's), ``PROBE_SHAPES`` (shape names,
comma-separated), ``PROBE_NCU`` (one eager call of each variant and shape, nothing timed: for
Nsight Compute).
"""
import importlib.util
import os
import sys
import tempfile
from dataclasses import replace
from typing import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the harness, and the checkout (also when not pip-installed)
import _harness as H  # noqa: E402
import mla_decode as md  # noqa: E402

import torch_paged_attn.lowering.triton as pkg  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402,F401  (pkg.mla_sm90, which variants may swap)

PKG = pkg.__name__


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
    """``source`` (written to a temporary file) loaded as the package's module ``name``."""
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    return module_from_file(name, path)


def module_from_file(name: str, path: str):
    """The file ``path`` loaded as the package's module ``name`` (its relative imports the
    package's); ``sys.modules`` keeps what it held under that name."""
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


def swap(name: str, module) -> Callable[[], None]:
    """A variant: ``module`` as the package's module ``name`` (its attribute and ``sys.modules``)."""
    def switch():
        sys.modules[f"{PKG}.{name}"] = module
        setattr(pkg, name, module)
    return switch


def selected(items: list, env: str) -> list:
    """The ``items`` (each with a ``name``) that the comma-separated ``env`` names (all without it)."""
    wanted = os.environ.get(env)
    return [x for x in items if not wanted or x.name in wanted.split(",")]


def runner(s, x, device: torch.device) -> Callable[[], torch.Tensor]:
    """One call of the package's MLA decode on inputs ``x`` of shape ``s``, into its own output."""
    out = torch.empty_like(x.q_latent)
    lse = torch.empty(x.q_latent.shape[:2], device=device)

    def run():
        tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                        max_query_len=s.q_len)
        return out
    return run


def compare(shapes: list, variants: dict[str, Callable[[], None]], rounds: int,
            describe: Callable[[dict], str] | None = None) -> None:
    """Each of ``shapes`` (``PROBE_SHAPES`` selects by name) timed under each variant
    (``variants``: name -> what switches the package to it), alternated for ``rounds`` rounds
    (``PROBE_ROUNDS`` overrides), the plans and launchers dropped at each switch; a line a timing,
    with ``describe`` of the keyword arguments ``mla_sm90.prepare`` got (if it was)."""
    device = torch.device("cuda")
    rounds = int(os.environ.get("PROBE_ROUNDS", rounds))
    ncu = bool(os.environ.get("PROBE_NCU"))
    if not ncu:
        copy_gbps, _ = H.copy_bandwidth(device)
        print(f"copy {copy_gbps:.0f} GB/s")
    for s in selected(shapes, "PROBE_SHAPES"):
        copies = md.input_copies(s, device)
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(1 if ncu else rounds):
            for name, use in variants.items():
                use()
                wide = pkg.mla_sm90  # (a variant may be one)
                wide._LAUNCHERS.clear()
                lowering._CHOICES.clear()
                plans = []
                prepare = wide.prepare
                wide.prepare = lambda **k: plans.append(k) or prepare(**k)
                try:
                    fns = [runner(s, x, device) for x in copies]
                    fns[0]().fill_(float("nan"))
                    got = fns[0]().float()
                finally:
                    wide.prepare = prepare
                err = ((got - want).abs().max() / want.abs().max()).item()
                what = f"  {describe(plans[-1] if plans else {})}" if describe else ""
                if ncu:
                    print(f"{s.name} {name}: max rel err {err:.2e}{what}", flush=True)
                    continue
                t = H.bench(fns, device, use_graph=True)
                print(f"{s.name:28s} round {rnd} {name:8s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}{what}", flush=True)


def narrow_shapes() -> list:
    """The 16-head shapes the narrow MLA kernels' probes time, by name: 2 tokens a sequence (32-row
    programs) at B64 x 4096 (two splits), B32 x 8192 (four) and B128 x 4096 (unsplit); 1 token (16
    rows) at B64 x 4096, B32 x 8192, B128 x 4096 and B16 x 8192 (eight splits); 2 tokens at B8 x
    4096 (a token a program)."""
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    return [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
            replace(m, name="mtp2_B128_ctx4096_H16", batch=128), replace(m, name="B64_ctx4096_H16", q_len=1),
            by["B32_ctx8192_H16"], by["B128_ctx4096_H16"],
            replace(by["B32_ctx8192_H16"], name="B16_ctx8192_H16", batch=16),
            replace(m, name="mtp2_B8_ctx4096_H16", batch=8)]


def splits(plan: dict) -> int:
    """The splits of a plan ``mla_sm90.prepare`` got."""
    return plan["workspace"].shapes[0][1] if plan.get("workspace") else 1
