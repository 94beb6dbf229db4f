"""Shared set-up for the benchmark scripts."""

from __future__ import annotations

from pathlib import Path

import torch

from gna.models.prepare import load_model
from gna.models.tiny import tiny_random_model


def model_or_tiny(model_dir: str, threads: int):
    """The prepared model if it exists, else a tiny random Llama (e.g. before `make reproduce`)."""
    torch.set_num_threads(threads)
    if Path(model_dir, "config.json").exists():
        model, tok = load_model(model_dir)
        return model, tok, Path(model_dir).name
    model, tok = tiny_random_model({"layers": 8, "hidden": 128, "heads": 4, "kv_heads": 2, "seed": 0})
    return model, tok, "tiny-random (no prepared model found)"


def extrapolated_fast_sweep_s(seconds: float, heads: list[tuple[int, int]], per_layer: dict[int, int]) -> float:
    """The exact sweep's time for every head, from `seconds` spent on `heads`: a head in layer L
    reruns layers L..end, so each layer's heads weigh by the layers they rerun."""
    n_layers = len(per_layer)
    swept = sum(n_layers - layer for layer, _ in heads)
    every = sum((n_layers - layer) * n for layer, n in per_layer.items())
    return seconds * every / swept
