"""Reduced-precision compute for a float32 model: bf16 autocast with the frozen weights held in
bf16 for the duration (the float32 weights are the reference; tests keep the two close).

Autocast re-casts every weight that needs no gradient at every call — a copy of the model per
forward — so `frozen_weights_in` converts them once and puts the float32 originals back after.
"""

from __future__ import annotations

import contextlib

import torch

COMPUTE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def frozen_weights_in(model, dtype: torch.dtype | None):
    """Within the block, the frozen weights of `model`'s linear layers are held in `dtype` (None:
    unchanged; the output head stays, as it may be tied to the input embeddings). The float32
    originals are put back afterwards, bit for bit."""
    kept = {}
    if dtype is not None:
        head = model.get_output_embeddings()
        for module in model.modules():
            w = getattr(module, "weight", None)
            if isinstance(module, torch.nn.Linear) and module is not head and not w.requires_grad and w.dtype != dtype:
                kept[module] = w.data
                w.data = w.data.to(dtype)
    try:
        yield model
    finally:
        for module, data in kept.items():
            module.weight.data = data
