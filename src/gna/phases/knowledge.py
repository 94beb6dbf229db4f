"""The facts' format comparison: which multiple-choice format the model can answer at all.

Every format in `tasks.facts.compare` (answer as the letter or as the option's text, after 0..n
solved examples) is built over the same facts as the task and scored beside the cloze form, so
the report can say which multiple-choice format runs (tasks.facts.choice) and how the others do.
"""

from __future__ import annotations

import logging

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Evaluation
from gna.core.stats import wilson_interval
from gna.engine.chance import chance_accuracy
from gna.engine.scoring import known_items, score_table
from gna.models.prepare import load_model
from gna.tasks.facts import build_facts

log = logging.getLogger("gna.phases.knowledge")


def format_row(table: pl.DataFrame, items: pl.DataFrame, answer: str | None, shots: int, tok) -> dict:
    """One format's accuracy with its n and Wilson 95% interval, chance, how many distinct options
    it predicts (1: the same answer for every item, i.e. it does not read the question) and its
    prompt length in tokens."""
    n, correct = len(items), int(items["correct"].sum())
    low, high = wilson_interval(correct, n)
    return {
        "format": str(table["format"][0]),
        "answer": answer,
        "shots": shots,
        "n": n,
        "acc": correct / n,
        "ci_low": low,
        "ci_high": high,
        "chance": chance_accuracy(table),
        "distinct_predictions": items["pred"].n_unique(),
        "prompt_tokens": sum(len(tok(c)["input_ids"]) for c in table["context"]) / n,
    }


PROMPT = ["item_id", "context", "choices", "target"]


def scores_of(
    model, tok, table: pl.DataFrame, earlier: list[tuple[pl.DataFrame, pl.DataFrame]], batch_size: int = 8
) -> pl.DataFrame:
    """The model's per-item scores on `table`: read from `earlier` [(task table, its per-item
    scores)] where one holds the same prompts (the task's own formats, scored by the baseline),
    else scored."""
    for task_table, items in earlier:
        if task_table.select(PROMPT).equals(table.select(PROMPT)):
            return known_items(table, items)
    return score_table(model, tok, table, batch_size=batch_size, progress=False)


def compare_formats(
    model,
    tok,
    facts: pl.DataFrame,
    facts_cfg: dict,
    batch_size: int = 8,
    earlier: list[tuple[pl.DataFrame, pl.DataFrame]] = (),
) -> pl.DataFrame:
    """format_row of the cloze form and of each multiple-choice format of facts_cfg['compare'],
    over the items of `facts_cfg` (relations, n, seed); `chosen` marks the task's own format.
    `earlier`: the task tables with their baseline scores, read instead of scoring them again."""

    def build(fmt, answer="text", shots=0):
        return build_facts(facts, facts_cfg["relations"], facts_cfg["n"], facts_cfg["seed"], fmt, answer, shots)

    rows = []
    cloze = build("cloze")
    rows.append(format_row(cloze, scores_of(model, tok, cloze, earlier, batch_size), None, 0, tok))
    for entry in facts_cfg["compare"]:
        table = build("choice", entry["answer"], entry["shots"])
        items = scores_of(model, tok, table, earlier, batch_size)
        rows.append(format_row(table, items, entry["answer"], entry["shots"], tok))
        log.info(
            "choice (%s), %d shots: acc %.3f [%.3f, %.3f]",
            entry["answer"],
            entry["shots"],
            rows[-1]["acc"],
            rows[-1]["ci_low"],
            rows[-1]["ci_high"],
        )
    chosen = facts_cfg["choice"]
    return pl.DataFrame(rows).with_columns(
        (
            pl.col("answer").is_null() | ((pl.col("answer") == chosen["answer"]) & (pl.col("shots") == chosen["shots"]))
        ).alias("chosen")
    )


def run_facts_formats(
    model_name: str,
    model_dir: str,
    facts_path: str,
    facts_cfg: dict,
    out_path: str,
    task_paths: list[str] = (),
    baseline_paths: list[str] = (),
    evaluation: Evaluation = Evaluation(),
) -> pl.DataFrame:
    """Phase facts_formats: compare_formats of the prepared model `model_dir` on the facts table
    `facts_path`, written to `out_path` with a model column; the task tables `task_paths` are
    read with the model's per-item baseline scores `baseline_paths` (same order)."""
    model, tok = load_model(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    earlier = [(read_parquet(t), read_parquet(b)) for t, b in zip(task_paths, baseline_paths, strict=True)]
    result = compare_formats(
        model, tok, read_parquet(facts_path), facts_cfg, evaluation.batch_size, earlier
    ).with_columns(pl.lit(model_name).alias("model"))
    write_parquet(result, out_path)
    return result
