"""pytest plugin (``-p ksplit_plugin`` with this directory on PYTHONPATH): every launch of
``mla_sm90_pair`` runs ``mla_sm90_ksplit``'s kernel instead (same arguments), so that the pair
kernel's tests and fuzz check it."""
import importlib.util
import os
import sys

PKG = "torch_paged_attn.lowering.triton"


def load():
    """``mla_sm90_ksplit`` loaded as a module of the package, and swapped in for the pair kernel."""
    import torch_paged_attn.lowering.triton.mla_sm90_pair as pair

    name = f"{PKG}.mla_sm90_ksplit"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__),
                                                                          "mla_sm90_ksplit.py"))
        module = importlib.util.module_from_spec(spec)
        module.__package__ = PKG
        sys.modules[name] = module
        spec.loader.exec_module(module)
    module = sys.modules[name]
    pair._mla_pair_kernel = module._mla_ksplit_kernel
    return module


def pytest_configure(config):
    load()
