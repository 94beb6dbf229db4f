"""mamba-ssm's Triton SSD kernel as the GPU path of the chunked scan (`gna.engine.ssm.ssd_chunked`
stays the reference, and the path everywhere the kernel does not run).

`mamba_chunk_scan_combined` computes, per head,

    y_t = sum_{s <= t} (C_t . B_s) exp(A sum_{s < r <= t} dt_r) dt_s x_s

With A = -1 and dt = -log a this is our decay exp(cum_t - cum_s); the kernel's dt_s x_s is undone
by passing x / dt, and D is added outside (the kernel's D would see x / dt). dt is clamped away
from 0 (a decay of exactly 1), which changes a decay by less than DT_MIN.

The kernel comes from the mamba-ssm package (`make gpu`). Its released `__init__` imports the
package's CUDA extension unguarded, so a build without it (`MAMBA_SKIP_CUDA_BUILD`: the Triton
kernels only) cannot `import mamba_ssm`; `load_kernel` then imports the kernel's own modules
under a bare package entry instead. Triton's interpreter (TRITON_INTERPRET=1, set before triton
is imported) runs the same kernel on the CPU: that is how the tests compare it with the reference
on a machine without a GPU.

GNA_SSM_KERNEL=torch keeps the reference everywhere (e.g. to compare a GPU run with it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import types

import torch

log = logging.getLogger("gna.engine.ssm_kernel")

# the packages whose CUDA/Triton kernels transformers binds for Mamba-2 and Zamba2 without a device check
KERNEL_PACKAGES = ("mamba_ssm", "causal_conv1d")
KERNEL_ENV = "GNA_SSM_KERNEL"  # "torch": the reference only; unset or "triton": the kernel where it runs
DT_MIN = 1e-6


@functools.cache
def load_kernel():
    """mamba_ssm's `mamba_chunk_scan_combined`, or None where mamba-ssm or Triton is missing (the
    reason logged once). The modules it imports are taken out of sys.modules again: transformers
    binds mamba-ssm's kernels for Mamba-2 and Zamba2 when `import mamba_ssm` works, with no device
    check, so a package entry left behind would send CPU models into Triton (kernel_free_modules)."""
    if importlib.util.find_spec("mamba_ssm") is None or importlib.util.find_spec("triton") is None:
        log.debug("mamba-ssm's SSD kernel: mamba-ssm or triton is not installed (make gpu)")
        return None
    before = set(_mamba_modules())
    try:
        return _import_kernel()
    finally:
        for name in set(_mamba_modules()) - before:
            del sys.modules[name]


def _mamba_modules() -> list[str]:
    return [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]


def _import_kernel():
    try:
        module = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    except ImportError as error:  # the released package's __init__ needs its CUDA extension
        log.info("mamba-ssm imported without its package __init__ (%s)", error)
        for name in _mamba_modules():
            del sys.modules[name]
        spec = importlib.util.find_spec("mamba_ssm")
        package = types.ModuleType("mamba_ssm")
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["mamba_ssm"] = package
        try:
            module = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        except ImportError as again:
            log.warning("mamba-ssm's SSD kernel cannot be imported (%s): the torch scan runs", again)
            return None
    if interpreted():  # before the modules leave sys.modules: it finds their autotuners there
        _for_the_interpreter()
    return module.mamba_chunk_scan_combined


def _for_the_interpreter() -> None:
    """Triton's interpreter runs kernels on CPU tensors, with no device to time autotuning
    candidates on: each of mamba-ssm's autotuned kernels keeps its first configuration, and in
    this process torch.cuda.device, which mamba-ssm enters around its kernels with the tensor's
    device index, is a no-op for a CPU tensor's (None), and torch.cuda.get_device_properties,
    whose multiprocessor count sizes its backward's split, gives a CPU's core count."""
    from triton.runtime.autotuner import Autotuner

    cuda_device = torch.cuda.device
    if not getattr(cuda_device, "gna_interpreted", False):

        def device(index):
            return contextlib.nullcontext() if index is None else cuda_device(index)

        device.gna_interpreted = True
        torch.cuda.device = device
        properties = torch.cuda.get_device_properties

        def device_properties(device=None):
            if torch.device(device).type == "cpu":
                return types.SimpleNamespace(multi_processor_count=os.cpu_count() or 1)
            return properties(device)

        torch.cuda.get_device_properties = device_properties

    for name, module in list(sys.modules.items()):
        if name.startswith("mamba_ssm.") and module is not None:
            for value in vars(module).values():
                if isinstance(value, Autotuner) and len(value.configs) > 1:
                    value.configs = value.configs[:1]


def interpreted() -> bool:
    """Whether Triton runs its kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_runs(x: torch.Tensor) -> bool:
    """Whether gna.engine.ssm.ssd_scan takes the kernel for `x`: on a CUDA tensor (or any tensor under Triton's
    interpreter), unless GNA_SSM_KERNEL=torch, where mamba-ssm's kernel can be loaded."""
    choice = os.environ.get(KERNEL_ENV, "triton")
    if choice not in ("triton", "torch"):
        raise ValueError(f"{KERNEL_ENV}={choice!r}: allowed triton (the kernel where it runs) or torch (the reference)")
    return choice == "triton" and (x.is_cuda or interpreted()) and load_kernel() is not None


def ssd_chunked_kernel(inputs: tuple[torch.Tensor, ...], chunk: int = 64, state=None):
    """ssd_chunked (same arguments and result: y [B, L, H, P], final state [B, H, N, P]) by
    mamba-ssm's Triton kernel, in the dtype of x. `inputs`: a gna.engine.ssm.ScanInputs (x,
    log_a, B, C, D; not imported here: gna.engine.ssm imports this module)."""
    x, log_a, Bm, Cm, D = inputs
    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("mamba-ssm's SSD kernel is not installed (make gpu)")
    dt = (-log_a).clamp_min(DT_MIN)
    A = -torch.ones(x.shape[2], device=x.device, dtype=torch.float32)
    initial = None if state is None else state.transpose(-1, -2).contiguous()  # the kernel's state is [B, H, P, N]
    y, final = kernel(
        (x / dt[..., None]).contiguous(),
        dt.contiguous(),
        A,
        Bm.contiguous(),
        Cm.contiguous(),
        chunk_size=chunk,
        initial_states=initial,
        return_final_states=True,
    )
    return y + D[None, None, :, None] * x, final.transpose(-1, -2).to(x.dtype)


def cpu_scans_in_torch(model: torch.nn.Module) -> torch.nn.Module:
    """`model`, its transformers modeling modules made to send CPU tensors to their torch scans.
    Where `import mamba_ssm` works when such a module is first imported (a full mamba-ssm build),
    transformers binds mamba-ssm's Triton kernels (and causal-conv1d's, where installed) for Mamba-2
    and Zamba2 with no device check, and a CPU model then fails inside them; each such binding is
    replaced, once per process, by one that chooses by its first tensor's device (the kernel on CUDA,
    transformers' own torch function elsewhere). Models whose modules bound none are left as they are."""
    for name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(name)
        for attr, fn in list(vars(module).items()) if module is not None else []:
            if _bound_to_mamba_ssm(fn):
                setattr(module, attr, _by_device(fn))
    return model


def _bound_to_mamba_ssm(fn) -> bool:
    """Whether `fn` is a transformers kernel wrapper (use_kernel_func_from_hub_with_fallback: the
    torch function under __wrapped__, the chosen implementation in its closure) that chose a
    KERNEL_PACKAGES kernel."""
    if not callable(fn) or getattr(fn, "gna_by_device", False) or not hasattr(fn, "__wrapped__"):
        return False
    try:
        chosen = inspect.getclosurevars(fn).nonlocals.get("implementation")
    except (TypeError, ValueError):
        return False
    return (getattr(chosen, "__module__", None) or "").startswith(KERNEL_PACKAGES)


def _by_device(fn):
    torch_function = fn.__wrapped__

    @functools.wraps(torch_function)
    def by_device(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        return fn(*args, **kwargs) if first is not None and first.is_cuda else torch_function(*args, **kwargs)

    by_device.gna_by_device = True
    return by_device
