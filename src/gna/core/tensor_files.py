"""Named tensors in safetensors files (the distillation's teacher file and aligned SSM heads)."""

from __future__ import annotations

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gna.core.io import atomic_path

FLOAT16_MAX = torch.finfo(torch.float16).max


def write_tensors(tensors: dict[str, torch.Tensor], path: str) -> None:
    """Write named tensors (on any device) to a safetensors file atomically."""
    with atomic_path(path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))


def read_tensors(path: str, names=None, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors `names` (default: all) of a safetensors file, reading only those, onto
    `device` (the model's that uses them: gna.engine.device.device_of)."""
    with safe_open(path, "pt", device=str(device)) as f:
        return {name: f.get_tensor(name) for name in (f.keys() if names is None else names)}


def compact(t: torch.Tensor) -> torch.Tensor:
    """`t` in float16 where every value fits in it, else in float32: stored states take half the
    space, but some teachers' residual streams outgrow float16 (Gemma 3's reach 1e5, past 65504,
    which would become inf and the alignment NaN)."""
    return t.to(torch.float16) if bool((t.abs() <= FLOAT16_MAX).all()) else t.float()
