"""Work counts: how many token-layer forward passes a job ran. Wall times depend on the CPU (the
same study took 30 min on one generation and 50 on another); this count does not, so benchmarks
and the run record show it beside the times (seconds per billion layer-tokens compares machines,
the count compares code).

A layer-token is one token through one decoder layer's forward, padding included; training
steps count their forward only. Counted where the engine and the students run layers:
gna.engine.stack (scoring, sweeps, variants), teacher activations, layer alignment, KD steps.

Beside it, the useful FLOPs of the same work: 2 × the linear weights a token goes through, plus
causal attention (2 · T² · query width per sequence), plus the output head at the rows read out;
a training step counts 3 × its forward (forward, input and weight gradients). Padding is counted
as the kernels compute it. The run record divides them by the step's wall time (GFLOP/s) and by
the machine's matmul peak (gna.engine.peak).
"""

from __future__ import annotations

import json
from pathlib import Path

_counts = {"layer_tokens": 0, "flops": 0.0}

TRAINING = 3  # a training step's FLOPs per forward FLOP: the forward, the input and the weight gradients


def add(tokens: int, layers: int, flops: float = 0.0) -> None:
    """Count `tokens` (a batch's, padding included) through `layers` decoder layers, which took
    `flops` useful floating-point operations (0: not counted by the caller)."""
    _counts["layer_tokens"] += int(tokens) * int(layers)
    _counts["flops"] += float(flops)


def add_flops(flops: float) -> None:
    """Count useful FLOPs outside the decoder layers (the output head at the rows read out)."""
    _counts["flops"] += float(flops)


def linear_flops(module) -> int:
    """FLOPs per token of the linear layers inside `module` (2 per weight of each nn.Linear;
    GPT-2's Conv1D projections count as linear layers)."""
    import torch

    return 2 * sum(
        m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    )


def layer_tokens() -> int:
    return _counts["layer_tokens"]


def useful_flops() -> float:
    return _counts["flops"]


def reset() -> None:
    _counts["layer_tokens"] = 0
    _counts["flops"] = 0.0


def write_work(path: str | Path) -> None:
    """{"layer_tokens": N, "flops": F} of this process, written to `path` (beside the job's log)."""
    from gna.core.io import write_text

    write_text(json.dumps({"layer_tokens": layer_tokens(), "flops": useful_flops()}) + "\n", path)
