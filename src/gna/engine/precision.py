"""How a float32 model's linear layers multiply (F.linear on the float32 weights is the reference;
tests keep every other way close to it). Training: bf16 autocast with the frozen weights held in
bf16 for the duration. Evaluation (linears_computed_in): the matmuls in bf16, everything else in
float32; or, in float32 on a CPU, through oneDNN's float32 kernel (float32_linear), which uses the
CPU's AVX-512 where PyTorch's default (MKL) runs AVX2 code on AMD CPUs.

Autocast re-casts every weight that needs no gradient at every call — a copy of the model per
forward — so `frozen_weights_in` converts them once and puts the float32 originals back after.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

import torch

from gna.core.settings import COMPUTE_DTYPE_NAMES

log = logging.getLogger("gna.engine.precision")

# float32 is the model's own matmul (None: nothing to change)
COMPUTE_DTYPES = {name: None if name == "float32" else getattr(torch, name) for name in COMPUTE_DTYPE_NAMES}


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


def _low_copy(weight: torch.Tensor, low: torch.dtype, emulated: bool) -> torch.Tensor:
    """`weight` rounded to `low`; held in float32 where the matmul is `emulated`."""
    copy = weight.detach().to(low)
    return copy.float() if emulated else copy


def _low_weight(module: torch.nn.Linear) -> torch.Tensor:
    """The low-precision copy of linears_computed_in, made again where the weight changed in
    place since it was copied (a restored checkpoint)."""
    if module.weight_low_of != _weight_state(module.weight):
        emulated = emulated_low_matmul(module.weight.device, module.low_dtype)
        module.weight_low = _low_copy(module.weight, module.low_dtype, emulated)
        module.weight_low_of = _weight_state(module.weight)
    return module.weight_low


def _low_matmul(x: torch.Tensor, weight: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """x Wᵀ with both rounded to `low`, in x's dtype. Where `weight` is held in float32 (a CPU
    without bf16 instructions, emulated_low_matmul) the low-precision operands are multiplied by
    the float32 kernel: their products are exact in float32 and summed in float32, as bf16
    instructions do, so the result is the bf16 matmul's up to summation order and the last bit of
    its rounding (tested), at float32 speed instead of PyTorch's emulated bf16 kernel (5.4x slower
    on an AMD AVX2-only CPU, measured)."""
    if weight.dtype == low:
        return torch.nn.functional.linear(x.to(low), weight).to(x.dtype)
    return _matmul_in_float32(x.to(low).float(), weight).to(low).to(x.dtype)


def _linear_in_low_precision(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = _low_matmul(x, _low_weight(module), module.low_dtype)
    return y if module.bias is None else y + module.bias.to(x.dtype)


def training_dtype(device: torch.device, compute_dtype: str, key: str) -> str:
    """The compute dtype training runs in for the config's `compute_dtype` at `key`: as asked,
    except bf16 on a CPU without bf16 instructions, which trains in float32 (said in the log).
    There bf16 autocast, which has no float32-kernel path (_low_matmul is evaluation's), would
    multiply through PyTorch's emulated bf16 kernel, about 5x slower than float32 (measured on an
    AMD AVX2-only CPU); float32 is the computation bf16 autocast approximates, so the students
    differ from a bf16 run by more than rounding only as two training runs in different
    precisions do."""
    if COMPUTE_DTYPES.get(compute_dtype) == torch.bfloat16 and emulated_low_matmul(device, torch.bfloat16):
        log.info(
            "%s.compute_dtype bfloat16: this CPU has no bf16 instructions (AVX512-BF16 or AMX), where bf16 autocast "
            "runs PyTorch's emulated bf16 matmuls (about 5x slower than float32): training runs in float32",
            key,
        )
        return "float32"
    return compute_dtype


def emulated_low_matmul(device: torch.device, low: torch.dtype) -> bool:
    """Whether linears_computed_in multiplies `low` operands with the float32 kernel on `device`
    (_low_matmul): bf16 on a CPU without bf16 instructions (cpu_lacks_bf16)."""
    return device.type == "cpu" and low == torch.bfloat16 and cpu_lacks_bf16()


def float32_kernel_available(device: torch.device) -> bool:
    """Whether float32_linear can run on `device`: a CPU and a PyTorch built with oneDNN."""
    return (
        device.type == "cpu" and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class _Float32Linear(torch.autograd.Function):
    """x Wᵀ through oneDNN's float32 kernel, which has no autograd of its own; the backward is
    F.linear's (input and weight gradients, in PyTorch's default matmul)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = grad.reshape(-1, grad.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        return grad_x, grad_weight


def float32_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) for float32 CPU tensors through oneDNN's float32 matmul: the same
    precision, rounded in another summation order (reference: F.linear; ~1e-6 relative here,
    tested to 1e-5). About 2.2× PyTorch's default on this project's AMD CPU (MKL runs its AVX2 code
    there; oneDNN its AVX-512 code); about equal where MKL has AVX-512 (Intel)."""
    return _Float32Linear.apply(x, weight)


def _matmul_in_float32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x Wᵀ through float32_linear where it runs (float32 CPU tensors, oneDNN), else F.linear."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not float32_kernel_available(x.device):
        return torch.nn.functional.linear(x, weight)
    return float32_linear(x, weight)


def _linear_in_float32(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = _matmul_in_float32(x, module.weight)
    return y if module.bias is None else y + module.bias.to(y.dtype)


# linear layers of one module that read the same input: attention's query/key/value projections and
# the MLP's gate and up projections, by their names in transformers' families (GPT-2, GPT-NeoX and
# Phi-3 store them fused already)
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class InputGroup:
    """Linear layers that read one input, multiplied by linears_computed_in as one matmul with
    their low-precision copies side by side: one cast of the input and one larger matmul instead
    of one of each per layer. The members' own copies (`weight_low`) are views of the group's, so
    the group costs no memory; where a member's weight changed in place (a restored checkpoint)
    the group's copy is made again (weight)."""

    def __init__(self, members: list[torch.nn.Linear]):
        self.members = members
        self.sizes = [m.out_features for m in members]
        self.of: tuple = ()
        self.fused: torch.Tensor | None = None
        self.pending: tuple | None = None  # (input, its version, {member: output}) not yet asked for

    def weight(self) -> torch.Tensor:
        """The members' low-precision weights side by side, each member's `weight_low` a view of it."""
        state = tuple(_weight_state(m.weight) for m in self.members)
        if state != self.of:
            self.fused = torch.cat([_low_weight(m) for m in self.members])
            for m, part in zip(self.members, self.fused.split(self.sizes)):
                m.weight_low = part
            self.of = state
        return self.fused

    def output(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """`module`'s output for `x`: from the matmul its group made for the same `x` where one
        is pending, else from a new one whose other outputs wait for their layers' calls."""
        pending = self.pending
        if pending is not None and pending[0] is x and pending[1] == _version(x) and module in pending[2]:
            out = pending[2].pop(module)
            if not pending[2]:
                self.pending = None
            return out
        y = _low_matmul(x, self.weight(), module.low_dtype)
        outs = {}
        for m, part in zip(self.members, y.split(self.sizes, dim=-1)):
            outs[m] = part if m.bias is None else part + m.bias.to(x.dtype)
        mine = outs.pop(module)
        self.pending = (x, _version(x), outs)
        return mine


def _version(x: torch.Tensor) -> int | None:
    """x's version counter (changed by in-place writes); None for an inference tensor, which has none."""
    return None if x.is_inference() else x._version


def _linear_in_group(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return module.input_group.output(module, x)


def input_groups(model) -> list[list[torch.nn.Linear]]:
    """The linear layers of `model` that read one input (SHARED_INPUT), group by group: members of
    one module with the same input width and no other forward of their own."""
    groups = []
    for module in model.modules():
        for names in SHARED_INPUT:
            members = [getattr(module, name, None) for name in names]
            if all(type(m) is torch.nn.Linear for m in members) and len({m.in_features for m in members}) == 1:
                groups.append(members)
    return groups


_KERNELS = (_linear_in_low_precision, _linear_in_float32, _linear_in_group)


def _kernel_of(module: torch.nn.Linear):
    """The forward linears_computed_in gave `module` (None: its class's own, also while
    linears_in_full_precision has switched it back)."""
    forward = vars(module).get("forward")
    return forward.func if isinstance(forward, functools.partial) and forward.func in _KERNELS else None


def linear_group(modules: list[torch.nn.Linear], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of several linear layers that read the same input `x`, from one matmul with
    their weights side by side: one pass over x (and under autocast one cast of it) instead of
    one per layer; a student's SSM projections are five small ones per layer. Each output is
    what the layer's own call gives (under linears_computed_in with its low-precision copy or
    through the float32 kernel, its bias added after the matmul in x's dtype; under
    linears_in_full_precision with its weight through F.linear), up to the rounding
    of a differently blocked matmul (tested); the layer's own call is the reference. Gradients
    reach every layer's weight and bias."""
    sizes = [m.out_features for m in modules]
    kernels = {_kernel_of(m) for m in modules}
    kernel = kernels.pop() if len(kernels) == 1 else None
    if kernel is not None:  # as the layers' own forward, with the bias added after the matmul
        if kernel in (_linear_in_low_precision, _linear_in_group):
            y = _low_matmul(x, torch.cat([_low_weight(m) for m in modules]), modules[0].low_dtype)
        else:
            y = _matmul_in_float32(x, torch.cat([m.weight for m in modules]))
        if any(m.bias is not None for m in modules):
            y = y + torch.cat(
                [m.bias.to(x.dtype) if m.bias is not None else x.new_zeros(m.out_features) for m in modules]
            )
    else:
        bias = None
        if any(m.bias is not None for m in modules):
            bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules])
        y = torch.nn.functional.linear(x, torch.cat([m.weight for m in modules]), bias)
    return y.split(sizes, dim=-1)


def linears_computed_in(model, compute_dtype: str, grouped: bool = True):
    """Evaluate `model` with its linear layers' matmuls in `compute_dtype` (a COMPUTE_DTYPES
    name). Each linear layer, the output head included, keeps its weight; for bfloat16 it
    multiplies with a copy in that dtype, its input cast to it and its output cast back: the
    residual stream, norms, attention softmax, SSM scans and the log-softmax over the vocabulary
    stay in the model's dtype. The head's copy is its own, so an input embedding tied to it is
    read in full precision; the head is a sixth of a scoring pass on a 49k vocabulary (logits at
    ~11 positions per KV item), which is why it is not left in float32. Unlike autocast, nothing
    else drops precision (tested against float32). A copy is made again when its weight changed
    in place (a checkpoint restored: the budget curve). For float32 on a CPU, the float32
    weights multiply through oneDNN's float32 kernel (float32_linear: same precision, about 2.2×
    faster on AMD CPUs; elsewhere F.linear as before). For evaluation only: the weights stop
    taking gradients (none would reach them); inputs' gradients still flow (attribution).
    `grouped` (bf16): the layers that read one input (input_groups: q|k|v, gate|up) multiply as
    one (InputGroup), which agrees with one matmul per layer (grouped=False, the reference) up to
    the rounding of a differently blocked matmul (tested). Returns `model`."""
    low = COMPUTE_DTYPES[compute_dtype]
    if low is None:
        if float32_kernel_available(model.device):
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.float32:
                    module.weight.requires_grad_(False)
                    module.forward = functools.partial(_linear_in_float32, module)
        return model
    emulated = emulated_low_matmul(model.device, low)
    if emulated:
        log.info(
            "this CPU has no bf16 instructions (AVX512-BF16 or AMX): bf16 linears multiply their bf16-rounded "
            "operands with the float32 kernel (the bf16 result up to its last bit, at float32 speed)"
        )
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype != low:
            module.weight.requires_grad_(False)
            module.register_buffer("weight_low", _low_copy(module.weight, low, emulated), persistent=False)
            module.low_dtype = low
            module.weight_low_of = _weight_state(module.weight)
            module.forward = functools.partial(_linear_in_low_precision, module)
    for members in input_groups(model) if grouped else []:
        if all(_kernel_of(m) is _linear_in_low_precision and m.low_dtype == low for m in members):
            group = InputGroup(members)
            group.weight()
            for m in members:
                m.input_group = group
                m.forward = functools.partial(_linear_in_group, m)
    return model


# what linears_computed_in sets on a module, besides weight_low
_SET_UP = ("forward", "low_dtype", "weight_low_of", "input_group")


@contextlib.contextmanager
def evaluated_in(model, compute_dtype: str):
    """Within the block, `model` multiplies as linears_computed_in(model, compute_dtype) sets it up
    (the evaluation's precision: checkpoint selection scores a student as it will be scored); after
    it, each linear layer is as it was (its forward, low copy and weight's requires_grad), so
    training goes on as before."""
    missing = object()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    before = {
        m: (
            {k: vars(m).get(k, missing) for k in _SET_UP},
            m._buffers.get("weight_low", missing),
            m.weight.requires_grad,
        )
        for m in linears
    }
    try:
        linears_computed_in(model, compute_dtype)
        yield model
    finally:
        for module, (attributes, low, grad) in before.items():
            for name, value in attributes.items():
                if value is missing:
                    vars(module).pop(name, None)
                else:
                    vars(module)[name] = value
            if low is missing:
                module._buffers.pop("weight_low", None)
            else:
                module._buffers["weight_low"] = low
            module.weight.requires_grad_(grad)


@contextlib.contextmanager
def linears_in_full_precision(model):
    """Within the block, the linear layers that linears_computed_in set up multiply with their
    own weights through F.linear again (the engine's probe compares two paths through the model:
    a precision or kernel difference must not read as a structural one)."""
    set_up = {m: vars(m)["forward"] for m in model.modules() if _kernel_of(m) is not None}
    for module in set_up:
        del module.forward  # the class's own forward
    try:
        yield model
    finally:
        for module, forward in set_up.items():
            module.forward = forward


def cpu_lacks_bf16() -> bool:
    """True where /proc/cpuinfo (Linux) lists neither avx512_bf16 nor amx_bf16; False where it
    cannot tell."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "flags" in flags and "avx512_bf16" not in flags and "amx_bf16" not in flags
