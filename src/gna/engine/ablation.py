"""Scoring a model under many head ablations at once: per batch one pass of the model records the
hidden state entering each layer, and each ablation reruns only the layers from its first ablated
head's on (exact prefix reuse, gna.engine.scoring.score_variants; the reference is a full forward
per ablation, gna.engine.hooks.ablate_heads + gna.engine.scoring.score_table). Used by the per-head
sweep, the head tables and the G&A masking experiment."""

from __future__ import annotations

import polars as pl

from gna.engine.anatomy import decoder_layers, head_sites
from gna.engine.hooks import ablate_heads
from gna.engine.scoring import Scorer, Variant, score_variants


def score_ablations(
    scorer: Scorer,
    table: pl.DataFrame,
    ablations: dict,
    layers: list[int] | None = None,
    desc: str = "ablations",
) -> dict:
    """{key: per-item frame} of `table` scored by the model made of `layers` (default all) with the
    heads of each entry of `ablations` {key: [(layer, head), …]} ablated together; an empty list
    is the model itself. Exact prefix reuse (gna.engine.scoring.score_variants): per batch one
    pass records the hidden state entering each layer, and each ablation reruns only the layers
    from its first ablated head's on — the same scores as a full forward per ablation (tested),
    with the model itself read from that pass."""
    if not ablations:
        return {}
    model = scorer.model
    sites = head_sites(model)
    layers = list(range(len(decoder_layers(model)))) if layers is None else list(layers)
    plain = [key for key, heads in ablations.items() if not heads]
    variants = []
    for key, heads in ablations.items():
        if not heads:
            continue
        outside = sorted({layer for layer, _ in heads} - set(layers))
        if outside:
            raise ValueError(f"cannot ablate heads of layers {outside}: not among the layers run {layers}")
        start = min(layers.index(layer) for layer, _ in heads)
        variants.append(
            Variant(key, layers[start], layers[start:], context=lambda heads=heads: ablate_heads(model, heads, sites))
        )
    frames = score_variants(scorer, table, layers, variants, desc, base_key=plain[0] if plain else None)
    return {key: frames[plain[0] if key in plain else key] for key in ablations}
