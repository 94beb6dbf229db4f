"""The students compared item by item (gna.core.paired): with their teacher, the hybrids with
the pure SSM, each student with the one keeping fewer heads or a smaller state, and the layer
swap with the pure SSM it starts from. Read from the answers hybrid_score and hybrid_swap wrote
(no model is loaded)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.paired import comparisons
from gna.core.settings import Files, RuleSettings
from gna.students.spec import TEACHER_VARIANT, parse_variant

log = logging.getLogger("gna.students.student_comparisons")


def student_pairs(variants: list[str], pure_ssm: str, swap: str | None = None) -> list[tuple[str, str, str]]:
    """(family, reference, condition) of the students' comparisons: every student against the
    teacher; every hybrid (k > 0) of the pure SSM's state size against the pure SSM `pure_ssm`;
    each student against the one of the same state size keeping the next fewer heads (where that
    is not the pure SSM, compared already), and against the one of the same k with the next
    smaller state; the layer swap (`swap`, its label) against the pure SSM."""
    students = [v for v in variants if v != TEACHER_VARIANT]
    shape = {v: parse_variant(v) for v in students}
    pure_n = parse_variant(pure_ssm)[1]
    pairs = [("students vs teacher", TEACHER_VARIANT, v) for v in students]
    pairs += [("hybrids vs pure SSM", pure_ssm, v) for v in students if shape[v][0] > 0 and shape[v][1] == pure_n]
    for v, (k, n) in shape.items():
        fewer = sorted((kk, u) for u, (kk, nn) in shape.items() if nn == n and kk < k)
        if fewer and not (fewer[-1][1] == pure_ssm and ("hybrids vs pure SSM", pure_ssm, v) in pairs):
            pairs.append(("more heads kept vs fewer", fewer[-1][1], v))
        smaller = sorted((nn, u) for u, (kk, nn) in shape.items() if kk == k and nn < n)
        if smaller:
            pairs.append(("larger state vs smaller", smaller[-1][1], v))
    if swap is not None:
        pairs.append(("layer swap vs pure SSM", pure_ssm, swap))
    return pairs


@dataclass(frozen=True)
class HybridComparisons(RuleSettings):
    """Rule hybrid_comparisons's settings: the students of `model` (wildcard model) and
    `pure_ssm`, the pure-SSM variant the hybrids and the layer swap are compared with."""

    model: str
    pure_ssm: str


def run_hybrid_comparisons(inputs: Files, outputs: Files, settings: HybridComparisons) -> pl.DataFrame:
    """Rule hybrid_comparisons: student_pairs (against settings.pure_ssm) compared on the answers
    of the teacher and its students, written with a model column (settings.model).
    inputs: answers (the teacher's and every student's, list), swap (the layer swap's; an empty
    list where hybrid.swap is off).
    outputs: comparisons."""
    model_name, pure_ssm = settings.model, settings.pure_ssm
    per_item = {}
    for path in inputs.answers:
        frame = read_parquet(path)
        if not frame.is_empty():  # a student kept off every task by its teacher answered nothing
            per_item[frame["variant"][0]] = frame
    variants, swap = list(per_item), None
    for path in inputs.get("swap", []):  # none where hybrid.swap is off
        frame = read_parquet(path)
        if not frame.is_empty():
            swap = frame["variant"][0]
            per_item[swap] = frame
    result = comparisons(per_item, student_pairs(variants, pure_ssm, swap)).with_columns(
        pl.lit(model_name).alias("model")
    )
    write_parquet(result, outputs.comparisons)
    log.info("students compared: %d rows", len(result))
    return result
