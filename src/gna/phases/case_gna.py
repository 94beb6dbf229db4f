"""The case study's Gather-and-Aggregate step (gna.phases.case_study finds the heads): the roles, attention
maps and masking of the heads found, inside the minimal model, on MMLU letter questions. Apart from the
other case rules because G&A reads the students' code (SSM heads' implicit attention), which they do not."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import polars as pl

from gna.core.io import read_json, read_parquet, write_parquet
from gna.core.paired import empty
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.engine.scoring import Scorer
from gna.engine.stack import pruned_layers
from gna.models.prepare import load_model
from gna.phases.gather_aggregate import GnaRoleConfig, head_roles, map_frame, mmlu_row_segments, shortest_item
from gna.phases.masking import Segmented, masking_comparisons, masking_experiment
from gna.tasks.tables import subset_evenly

log = logging.getLogger("gna.phases.case_gna")


def found_roles(scorer: Scorer, table: pl.DataFrame, kept_layers: list[int], heads: list, gna: GnaRoleConfig):
    """(roles, maps) of the minimal model made of `kept_layers` on MMLU letter items: every head's G&A role
    scores over `table` (gna.phases.gather_aggregate.head_roles, each answer option a segment) with a
    `found` column marking `heads`, and the attention maps of `heads` on its shortest item."""
    with pruned_layers(scorer.model, kept_layers):
        roles = head_roles(scorer, table, mmlu_row_segments, gna.gather_min, gna.aggregate_min)
        maps = map_frame(scorer.model, scorer.tok, shortest_item(table), heads, mmlu_row_segments)
    found = pl.struct("layer", "head").map_elements(
        lambda r: (r["layer"], r["head"]) in set(heads), return_dtype=pl.Boolean
    )
    return roles.with_columns(found.alias("found")), maps.with_columns(pl.lit("mmlu_letter").alias("task"))


def pattern_roles(roles: pl.DataFrame, heads: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """{'gather': head, 'aggregate': head} of the heads found for the masking: their own roles where they are a
    Gather and an Aggregate head, else the study's reading (the earlier layer's head gathers, the later's
    aggregates); {} for a single head that is neither."""
    role_of = {(r["layer"], r["head"]): r["role"] for r in roles.iter_rows(named=True)}
    own = {role_of.get(h): h for h in heads if role_of.get(h) in ("gather", "aggregate")}
    if len(heads) == 1:
        return own
    if len(own) == 2:
        return own
    first, second = sorted(heads)[:2]
    return {"gather": first, "aggregate": second}


def found_masking(scorer: Scorer, table: pl.DataFrame, kept_layers: list[int], heads: dict) -> tuple:
    """(summary, comparisons) of the G&A masking (gna.phases.masking.masking_experiment) of `heads`
    {role: head} inside the minimal model made of `kept_layers`, on MMLU letter questions (answer options
    as segments): unmodified, the heads ablated, the heads restricted to their G&A pattern."""
    per_item: dict = {}
    with pruned_layers(scorer.model, kept_layers):
        summary = masking_experiment(scorer, Segmented(table, mmlu_row_segments), heads, per_item=per_item)
    return summary, masking_comparisons(per_item)


@dataclass(frozen=True)
class CaseGna(RuleSettings):
    """Settings of rule case_gna: the `model` (wildcard), the MMLU letter evaluation questions the roles
    are averaged over and the masking scores (`items`, evenly spaced), the roles' thresholds (`gna`: config
    section gna) and how the model is loaded and scored (`evaluation`)."""

    model: str
    items: int = 50
    gna: GnaRoleConfig = GnaRoleConfig()
    evaluation: Evaluation = Evaluation()


def run_case_gna(inputs: Files, outputs: Files, settings: CaseGna) -> pl.DataFrame:
    """Phase case_gna: found_roles of the heads found inside the minimal model on MMLU letter questions, and
    their G&A masking (found_masking, roles by pattern_roles), each with a model column; empty where no head
    was found. inputs: model, minimal, found, mmlu_letter; outputs: roles, maps, masking, masking_comparisons."""
    minimal, found = read_json(inputs.minimal), read_json(inputs.found)
    roles = pl.DataFrame(schema={"layer": pl.Int64, "head": pl.Int64, "found": pl.Boolean})
    maps = pl.DataFrame(schema={"layer": pl.Int64, "head": pl.Int64, "task": pl.String})
    masking, masked = pl.DataFrame(schema={"condition": pl.String}), empty()
    if found["heads"]:
        evaluation = settings.evaluation
        model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
        heads = [(h["layer"], h["head"]) for h in found["heads"]]
        table = subset_evenly(read_parquet(inputs.mmlu_letter), settings.items)
        scorer = Scorer(model, tok, evaluation.batch_size)
        roles, maps = found_roles(scorer, table, minimal["kept_layers"], heads, settings.gna)
        pattern = pattern_roles(roles, heads)
        if pattern:
            masking, masked = found_masking(scorer, table, minimal["kept_layers"], pattern)
    named = pl.lit(settings.model).alias("model")
    write_parquet(roles.with_columns(named), outputs.roles)
    write_parquet(maps.with_columns(named), outputs.maps)
    write_parquet(masking.with_columns(named), outputs.masking)
    write_parquet(masked.with_columns(named), outputs.masking_comparisons)
    log.info("G&A roles of the heads found: %s", roles.filter(pl.col("found")).rows() if len(roles) else "none")
    return roles
