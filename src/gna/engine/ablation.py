"""Scoring a model under many head ablations at once: per batch one pass of the model records the
hidden state entering each layer, and each ablation reruns only the layers from its first ablated
head's on (exact prefix reuse, gna.engine.scoring.score_variants; the reference is a full forward
per ablation, gna.engine.hooks.ablate_heads + gna.engine.scoring.score_table). Used by the per-head
sweep, the head tables and the G&A masking experiment."""

from __future__ import annotations

import polars as pl

from gna.engine.anatomy import all_heads, decoder_layers, head_sites, kv_groups
from gna.engine.hooks import ablate_heads
from gna.engine.scoring import Scorer, Variant, score_variants


def score_ablations(
    scorer: Scorer,
    table: pl.DataFrame,
    ablations: dict,
    layers: list[int] | None = None,
    desc: str = "ablations",
    more: tuple[Variant, ...] = (),
) -> dict:
    """{key: per-item frame} of `table` scored by the model made of `layers` (default all) with the
    heads of each entry of `ablations` {key: [(layer, head), …]} ablated together; an empty list
    is the model itself. Exact prefix reuse (gna.engine.scoring.score_variants): per batch one
    pass records the hidden state entering each layer, and each ablation reruns only the layers
    from its first ablated head's on — the same scores as a full forward per ablation (tested),
    with the model itself read from that pass. `more`: other variants scored in the same pass
    (e.g. attention masks from a layer on), under their own keys."""
    if not ablations and not more:
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
    frames = score_variants(scorer, table, layers, variants + list(more), desc, base_key=plain[0] if plain else None)
    return {key: frames[plain[0] if key in plain else key] for key in ablations} | {v.key: frames[v.key] for v in more}


SWEEP_UNITS = ("head", "group")


def ablation_units(model, unit: str = "head") -> dict[tuple[int, int], list[tuple[int, int]]]:
    """{(layer, index): the heads ablated together as one unit}: every head alone (`head`), or
    every key/value group (`group`: the query heads that read one key/value head, index = that
    head's; gna.engine.anatomy.kv_groups). In grouped-query attention the heads of a group read the
    same keys and values, so one of them can stand in for another that is removed alone."""
    if unit == "head":
        return {head: [head] for head in all_heads(model)}
    if unit == "group":
        return kv_groups(model)
    raise ValueError(f"heads.sweep_unit: unknown unit {unit!r}; one of {', '.join(SWEEP_UNITS)}")


def ranking_unit(ranking: pl.DataFrame) -> str:
    """The unit a ranking ranks (heads.sweep_unit): 'head', or 'group' (key/value groups)."""
    return ranking["unit"][0] if "unit" in ranking.columns and len(ranking) else "head"


def single_heads(ranking: pl.DataFrame, user: str) -> pl.DataFrame:
    """`ranking` where it ranks single heads; an error naming `user` (what keeps single heads) and the
    key where it ranks key/value groups."""
    if ranking_unit(ranking) != "head":
        raise ValueError(
            f"{user} keeps single heads, but this ranking ranks key/value groups (heads.sweep_unit: group); "
            f"set heads.sweep_unit: head for this model, or skip the phase (models.<name>.skip)"
        )
    return ranking


def unit_name(layer: int, index: int, unit: str = "head") -> str:
    """'L13H2' (a head) or 'L13G0' (key/value group 0 of layer 13)."""
    return f"L{layer}{'G' if unit == 'group' else 'H'}{index}"


def head_ranks(ranking: pl.DataFrame) -> pl.DataFrame:
    """A ranking with one row per query head: a head ranking as it is; a key/value group ranking with
    each of a group's query heads in its own row, carrying the group's rank and drops (best group
    first, a group's heads in their order)."""
    if ranking_unit(ranking) == "head":
        return ranking
    return (
        ranking.explode("query_heads")
        .with_columns(pl.col("query_heads").cast(pl.Int64).alias("head"))
        .sort(["rank", "head"])
    )
