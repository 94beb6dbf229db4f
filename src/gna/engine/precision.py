"""Reduced-precision compute for a float32 model (the float32 weights are the reference; tests
keep the two close). Training: bf16 autocast with the frozen weights held in bf16 for the
duration. Evaluation: the linear layers' matmuls in bf16, everything else in float32
(linears_computed_in).

Autocast re-casts every weight that needs no gradient at every call — a copy of the model per
forward — so `frozen_weights_in` converts them once and puts the float32 originals back after.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

import torch

log = logging.getLogger("gna.engine.precision")

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


def _weight_state(weight: torch.Tensor) -> tuple[int, int]:
    return weight._version, weight.data_ptr()


def _low_weight(module: torch.nn.Linear) -> torch.Tensor:
    """The low-precision copy of linears_computed_in, made again where the weight changed in
    place since it was copied (a restored checkpoint)."""
    if module.weight_low_of != _weight_state(module.weight):
        module.weight_low = module.weight.detach().to(module.weight_low.dtype)
        module.weight_low_of = _weight_state(module.weight)
    return module.weight_low


def _linear_in_low_precision(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = _low_weight(module)
    y = torch.nn.functional.linear(x.to(weight.dtype), weight)
    return (y.to(x.dtype) if module.bias is None else y.to(x.dtype) + module.bias.to(x.dtype))


def _computes_in_low_precision(module: torch.nn.Linear) -> bool:
    """Whether linears_computed_in set `module` up and linears_in_full_precision has not switched
    it back for now."""
    forward = vars(module).get("forward")
    return isinstance(forward, functools.partial) and forward.func is _linear_in_low_precision


def linear_group(modules: list[torch.nn.Linear], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of several linear layers that read the same input `x`, from one matmul with
    their weights side by side: one pass over x (and under autocast one cast of it) instead of
    one per layer; a student's SSM projections are five small ones per layer. Each output is
    what the layer's own call gives (under linears_computed_in with its low-precision copy, its
    bias added in x's dtype; under linears_in_full_precision with its weight), up to the rounding
    of a differently blocked matmul (tested); the layer's own call is the reference. Gradients
    reach every layer's weight and bias."""
    sizes = [m.out_features for m in modules]
    if all(_computes_in_low_precision(m) for m in modules):  # as _linear_in_low_precision
        weight = torch.cat([_low_weight(m) for m in modules])
        y = torch.nn.functional.linear(x.to(weight.dtype), weight).to(x.dtype)
        if any(m.bias is not None for m in modules):
            y = y + torch.cat([m.bias.to(x.dtype) if m.bias is not None else x.new_zeros(m.out_features)
                               for m in modules])
    else:
        bias = None
        if any(m.bias is not None for m in modules):
            bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules])
        y = torch.nn.functional.linear(x, torch.cat([m.weight for m in modules]), bias)
    return y.split(sizes, dim=-1)


def linears_computed_in(model, compute_dtype: str):
    """Evaluate `model` with its linear layers' matmuls in `compute_dtype` (a COMPUTE_DTYPES
    name; "float32": unchanged). Each linear layer, the output head included, keeps its weight
    and multiplies with a copy in that dtype, its input cast to it and its output cast back: the
    residual stream, norms, attention softmax, SSM scans and the log-softmax over the vocabulary
    stay in the model's dtype. The head's copy is its own, so an input embedding tied to it is
    read in full precision; the head is a sixth of a scoring pass on a 49k vocabulary (logits at
    ~11 positions per KV item), which is why it is not left in float32. Unlike autocast, nothing
    else drops precision (tested against float32). A copy is made again when its weight changed
    in place (a checkpoint restored: the budget curve). For evaluation only: the weights stop
    taking gradients (none would reach them). Returns `model`."""
    low = COMPUTE_DTYPES[compute_dtype]
    if low is None:
        return model
    if model.device.type == "cpu" and cpu_lacks_bf16():
        log.warning("this CPU has no bf16 instructions (AVX512-BF16 or AMX): its bf16 matmuls are emulated and "
                    "may be slower than float32 (eval.compute_dtype: float32)")
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype != low:
            module.weight.requires_grad_(False)
            module.register_buffer("weight_low", module.weight.detach().to(low), persistent=False)
            module.weight_low_of = _weight_state(module.weight)
            module.forward = functools.partial(_linear_in_low_precision, module)
    return model


@contextlib.contextmanager
def linears_in_full_precision(model):
    """Within the block, the linear layers that linears_computed_in set up multiply with their
    own weights again (the engine's probe compares two paths through the model: a precision
    difference must not read as a structural one)."""
    low = [m for m in model.modules() if hasattr(m, "weight_low")]
    for module in low:
        del module.forward  # the class's own forward
    try:
        yield model
    finally:
        for module in low:
            module.forward = functools.partial(_linear_in_low_precision, module)


def cpu_lacks_bf16() -> bool:
    """True where /proc/cpuinfo (Linux) lists neither avx512_bf16 nor amx_bf16; False where it
    cannot tell."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "flags" in flags and "avx512_bf16" not in flags and "amx_bf16" not in flags
