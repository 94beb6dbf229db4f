"""The head tables (gna.phases.head_tables): removing the top-k heads against random controls,
the heads kept, the dictionary-size curves; what a task at chance runs, and k = 0 read from the
baseline scores."""

from dataclasses import replace

import polars as pl
import pytest

from gna.core.chance import ChancePolicy, Reference
from gna.core.settings import TopK
from gna.engine.hooks import active_hooks
from gna.engine.scoring import Scorer, score_table
from gna.phases.head_ablation import rank_heads, sweep_heads
from gna.phases.head_tables import (
    critical_heads,
    dict_size_curves,
    heads_kept,
    kept_comparisons,
    remove_top_k,
    topk_comparisons,
)
from gna.tasks.tables import build_kv_retrieval

KV = build_kv_retrieval([3, 5], 3, 0, "lookup")


def test_head_tables(tiny_llama):
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    tables = {"kv_retrieval": KV}
    top_k = TopK([0, 2], random_draws=2, control_tasks=["kv_retrieval"], seed=1)
    topk, again = (remove_top_k(Scorer(model, tok, progress=False), ranking, tables, top_k) for _ in range(2))
    assert topk.equals(again)
    assert set(topk.filter(pl.col("condition") == "random")["draw"]) == {0, 1}
    k0 = topk.filter((pl.col("k") == 0) & (pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"][0]
    assert k0 == score_table(Scorer(model, tok, progress=False), KV)["correct"].mean()
    kept_layers = [0, 1, 2]
    a, b = critical_heads(ranking, kept_layers)
    assert a[0] != b[0]
    kept = heads_kept(Scorer(model, tok, progress=False), ranking, kept_layers, tables)
    assert kept["variant"].n_unique() == 5
    curves = dict_size_curves(Scorer(model, tok, progress=False), ranking, KV)
    assert set(curves["dict_size"]) == {3, 5} and curves["condition"].n_unique() == 3
    assert active_hooks(model) == 0


def test_head_tables_score_a_task_at_chance_unablated_only(tiny_llama):
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    tables = {"kv_retrieval": KV}  # a random model is at chance on these lookups
    top_k = TopK([0, 1, 2], random_draws=1, control_tasks=["kv_retrieval"], seed=1)
    on = ChancePolicy(skip=True)
    every = remove_top_k(Scorer(model, tok, progress=False), ranking, tables, top_k)
    assert every["skipped_reason"].is_null().all()
    # a task the policy spares (the sweep's own) is always scored; one at chance only at k = 0, with the reason
    spared = on.sparing("kv_retrieval")
    assert remove_top_k(
        Scorer(model, tok, progress=False), ranking, tables, top_k, reference=Reference(chance=spared)
    ).equals(every)
    skipped = remove_top_k(Scorer(model, tok, progress=False), ranking, tables, top_k, reference=Reference(chance=on))
    assert set(skipped["k"]) == {0} and set(skipped["condition"]) == {"top"}
    assert skipped["skipped_reason"].str.contains("so removing heads has no shown ability to take away").all()
    assert skipped.drop("skipped_reason").equals(every.filter(pl.col("k") == 0).drop("skipped_reason"))
    # judged on the given baseline scores: all correct is above chance, so every condition runs
    right = score_table(Scorer(model, tok, progress=False), KV).with_columns(pl.lit(True).alias("correct"))
    ran = remove_top_k(
        Scorer(model, tok, progress=False),
        ranking,
        tables,
        top_k,
        reference=Reference(scored={"kv_retrieval": right}, chance=on),
    )
    assert set(ran["k"]) == {0, 1, 2} and ran["skipped_reason"].is_null().all()
    kept_layers = [0, 1, 2]
    all_kept = heads_kept(Scorer(model, tok, progress=False), ranking, kept_layers, tables)
    assert heads_kept(
        Scorer(model, tok, progress=False), ranking, kept_layers, tables, reference=Reference(chance=spared)
    ).equals(all_kept)
    only = heads_kept(Scorer(model, tok, progress=False), ranking, kept_layers, tables, reference=Reference(chance=on))
    assert set(only["variant"]) == {"all heads"} and only["skipped_reason"].is_not_null().all()
    assert only.drop("skipped_reason").equals(all_kept.filter(pl.col("variant") == "all heads").drop("skipped_reason"))


def test_random_controls_of_other_tasks_run_at_control_k_only(tiny_llama):
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    other = KV.with_columns(pl.lit("facts_cloze").alias("task"))
    tables = {"kv_retrieval": KV, "facts_cloze": other}
    args = dict(random_draws=2, control_tasks=["kv_retrieval", "facts_cloze"], seed=1)
    every = remove_top_k(Scorer(model, tok, progress=False), ranking, tables, TopK([0, 1, 2], **args))
    cut = remove_top_k(Scorer(model, tok, progress=False), ranking, tables, TopK([0, 1, 2], control_k=[2], **args))
    random = cut.filter(pl.col("condition") == "random")
    assert set(random.filter(pl.col("task") == "kv_retrieval")["k"]) == {1, 2}  # the sweep's task: every k
    assert set(random.filter(pl.col("task") == "facts_cloze")["k"]) == {2}
    # what runs is what ran before: the same draws, the same numbers
    dropped = (pl.col("condition") == "random") & (pl.col("task") == "facts_cloze") & (pl.col("k") == 1)
    assert cut.sort(cut.columns).equals(every.filter(~dropped).sort(every.columns))
    # control_draws: the other tasks get the first draws only, the sweep's task all of them
    first = remove_top_k(
        Scorer(model, tok, progress=False), ranking, tables, TopK([0, 1, 2], control_k=[2], control_draws=1, **args)
    )
    random = first.filter(pl.col("condition") == "random")
    assert set(random.filter(pl.col("task") == "kv_retrieval")["draw"]) == {0, 1}
    assert set(random.filter(pl.col("task") == "facts_cloze")["draw"]) == {0}
    dropped = dropped | ((pl.col("condition") == "random") & (pl.col("task") == "facts_cloze") & (pl.col("draw") == 1))
    assert first.sort(first.columns).equals(every.filter(~dropped).sort(every.columns))


def test_tasks_off_the_curve_run_at_control_k_only(tiny_llama):
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    other = KV.with_columns(pl.lit("facts_cloze").alias("task"))
    tables = {"kv_retrieval": KV, "facts_cloze": other}
    args = dict(random_draws=1, control_tasks=["kv_retrieval", "facts_cloze"], seed=1, control_k=[2])
    every = remove_top_k(Scorer(model, tok, progress=False), ranking, tables, TopK([0, 1, 2], **args))
    per_item = {}
    cut = remove_top_k(
        Scorer(model, tok, progress=False),
        ranking,
        tables,
        TopK([0, 1, 2], curve_tasks=["facts_cloze"], **args),
        per_item=per_item,
    )
    # the sweep's task, off the curve, loses k = 1 (top and random); the curve task keeps every k
    assert set(cut.filter(pl.col("task") == "kv_retrieval")["k"]) == {0, 2}
    assert set(cut.filter((pl.col("task") == "facts_cloze") & (pl.col("condition") == "top"))["k"]) == {0, 1, 2}
    dropped = (pl.col("task") == "kv_retrieval") & (pl.col("k") == 1)
    assert cut.sort(cut.columns).equals(every.filter(~dropped).sort(every.columns))
    # its comparisons: top 1 against the unmodified model on the curve task only
    compared = topk_comparisons(per_item, TopK([0, 1, 2], curve_tasks=["facts_cloze"], **args))
    assert set(compared.filter(pl.col("condition") == "top 1")["task"]) == {"facts_cloze"}
    assert set(compared.filter(pl.col("condition") == "top 2")["task"]) == {"kv_retrieval", "facts_cloze"}


def test_top_k_zero_is_read_from_the_baseline_scores(tiny_llama):
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    tables = {"kv_retrieval": KV}
    scorer = Scorer(model, tok, progress=False)
    top = TopK([0, 1], random_draws=1, control_tasks=["kv_retrieval"], seed=1)
    scored = remove_top_k(scorer, ranking, tables, top)
    baseline = score_table(Scorer(model, tok, progress=False), KV)
    read = remove_top_k(scorer, ranking, tables, top, Reference(scored={"kv_retrieval": baseline}))
    assert read.equals(scored)
    # a ranking shorter than a k (a verified sweep) is refused, not silently cut to fewer heads
    with pytest.raises(
        ValueError, match="heads.top_k: removing the top 5 heads needs 5 ranked heads; the ranking has 3"
    ):
        remove_top_k(scorer, ranking.head(3), tables, replace(top, ks=(0, 1, 5)))
    # the k = 0 rows come from the given scores (here all made wrong), the others are scored
    wrong = baseline.with_columns(pl.lit(False).alias("correct"))
    marked = remove_top_k(scorer, ranking, tables, top, Reference(scored={"kv_retrieval": wrong}))
    acc = marked.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))
    assert acc.filter(pl.col("k") == 0)["value"].to_list() == [0.0]
    assert acc.filter(pl.col("k") == 1).equals(
        scored.filter((pl.col("metric") == "acc") & (pl.col("group") == "all") & (pl.col("k") == 1))
    )


def _acc(summary: pl.DataFrame, **where) -> float:
    rows = summary.filter(
        (pl.col("metric") == "acc") & (pl.col("group") == "all"), *[pl.col(k) == v for k, v in where.items()]
    )
    assert len(rows) == 1, (where, rows)
    return rows["value"][0]


def test_comparisons_pair_the_conditions_the_tables_summarize(tiny_llama):
    """Each remove-top-k comparison pairs two conditions of the summary on its items (the
    accuracies are the summary's), one family per question; the heads-kept variants are each
    paired with all heads."""
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    tables = {"kv_retrieval": KV}
    top_k = TopK([0, 1, 2], random_draws=2, control_tasks=["kv_retrieval"], seed=1)
    per_item = {}
    topk = remove_top_k(Scorer(model, tok, progress=False), ranking, tables, top_k, per_item=per_item)
    assert set(per_item) == {"unmodified", "top 1", "top 2", "random 1 #0", "random 1 #1", "random 2 #0", "random 2 #1"}
    compared = topk_comparisons(per_item, top_k)
    assert compared.group_by("family").len().sort("family").rows() == [
        ("random k vs unmodified", 4),
        ("top k vs random k", 2),
        ("top k vs unmodified", 2),
    ]
    for row in compared.iter_rows(named=True):
        assert row["n"] == len(KV)
        condition, k = row["condition"].split()[:2]
        draw = int(row["condition"].split("#")[1]) if condition == "random" else 0
        assert row["acc_condition"] == _acc(topk, condition=condition, k=int(k), draw=draw)
        if row["reference"] == "unmodified":
            assert row["acc_reference"] == _acc(topk, k=0)
        assert row["diff"] == pytest.approx((row["condition_only"] - row["reference_only"]) / row["n"])
    per_item = {}
    kept = heads_kept(Scorer(model, tok, progress=False), ranking, [0, 1, 2], tables, per_item=per_item)
    compared = kept_comparisons(per_item)
    assert sorted(compared["condition"]) == sorted(set(kept["variant"]) - {"all heads"})
    for row in compared.iter_rows(named=True):
        assert row["acc_reference"] == _acc(kept, variant="all heads")
        assert row["acc_condition"] == _acc(kept, variant=row["condition"])
