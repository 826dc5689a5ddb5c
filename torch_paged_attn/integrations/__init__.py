"""Integrations of the ops with model libraries. Each submodule imports its library lazily, so
``import torch_paged_attn`` never needs them; import the submodule to use one
(``torch_paged_attn.integrations.transformers``)."""
