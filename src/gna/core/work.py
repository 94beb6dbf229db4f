"""Work counts: how many token-layer forward passes a job ran. Wall times depend on the CPU (the
same study took 30 min on one generation and 50 on another); this count does not, so benchmarks
and the run record show it beside the times (seconds per billion layer-tokens compares machines,
the count compares code).

A layer-token is one token through one decoder layer's forward, padding included; training
steps count their forward only. Counted where the engine and the students run layers:
gna.engine.stack (scoring, sweeps, variants), teacher activations, layer alignment, KD steps.
"""

from __future__ import annotations

import json
from pathlib import Path

_counts = {"layer_tokens": 0}


def add(tokens: int, layers: int) -> None:
    """Count `tokens` (a batch's, padding included) through `layers` decoder layers."""
    _counts["layer_tokens"] += int(tokens) * int(layers)


def layer_tokens() -> int:
    return _counts["layer_tokens"]


def reset() -> None:
    _counts["layer_tokens"] = 0


def write_work(path: str | Path) -> None:
    """{"layer_tokens": N} of this process, written to `path` (beside the job's log)."""
    from gna.core.io import write_text

    write_text(json.dumps({"layer_tokens": layer_tokens()}) + "\n", path)
