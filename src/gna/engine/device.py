"""Where the engine computes: CUDA when torch sees a GPU, else the CPU.

A model is moved to its device once, when it is loaded (gna.models.prepare.load_model,
gna.students.spec.load_any); every tensor the engine creates afterwards is placed on the device
of the model or tensor it serves (device_of), never on torch's default device. So the same code
runs on a GPU node and on a laptop, and the CPU path, the tested one, is the GPU path: the tests
run the engine with torch's default device set to 'meta', where any tensor created without an
explicit device cannot meet the model's.

GNA_DEVICE (auto, cpu or cuda) decides what 'auto' means for a whole run, e.g. GNA_DEVICE=cpu on a
GPU node; the test suite sets it to cpu unless GNA_TEST_DEVICE names another (tests/conftest.py).
"""

from __future__ import annotations

import os

import torch

DEVICES = ("auto", "cpu", "cuda")
DEVICE_ENV = "GNA_DEVICE"


def compute_device(name: str | None = "auto") -> torch.device:
    """The torch device for `name`: 'auto' (or None) is GNA_DEVICE where set, else CUDA when
    available, else the CPU."""
    name = name or "auto"
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; allowed: {', '.join(DEVICES)}")
    if name == "auto":
        name = os.environ.get(DEVICE_ENV) or "auto"
        if name not in DEVICES:
            raise ValueError(f"{DEVICE_ENV}={name!r}: unknown device; allowed: {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device 'cuda' asked for, but torch sees no GPU (a CPU build of torch, or no GPU "
            "on this node); install a CUDA build of torch or use 'cpu'"
        )
    return torch.device(name)


def device_of(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (where its batches must go)."""
    return next(model.parameters()).device
