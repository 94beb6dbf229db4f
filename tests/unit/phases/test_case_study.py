"""The MMLU case study: the cut rule and the choice of critical layers on scripted tables, and the
engine's fast paths (one-pass layer removal, the head sweep inside a pruned model, the heads-kept
variants) against their naive loops on a tiny qwen2 model."""

import polars as pl
import pytest
from conftest import MINI_MMLU

from gna.core.paired import comparisons
from gna.engine.hooks import ablate_heads
from gna.engine.scoring import Scorer, score_table
from gna.engine.stack import pruned_layers
from gna.models.tiny import tiny_random_model
from gna.phases.case_study import (
    ALL_HEADS,
    DEVELOPMENT,
    EVALUATION,
    KEPT,
    MINIMAL,
    REMOVALS_FAMILY,
    VS_ALL,
    VS_KEPT,
    Control,
    by_dict_size,
    choose_critical,
    choose_minimal,
    kept_pairs,
    kept_variants,
    removal_items,
    sweep_items,
    sweep_table,
    top_per_layer,
)
from gna.phases.head_tables import score_items
from gna.tasks.tables import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu

CHANCE, MARGIN = 0.25, 0.05


def _items(correct: list[bool]) -> pl.DataFrame:
    return pl.DataFrame({"task": "mmlu_letter", "item_id": range(len(correct)), "group": "x", "correct": correct})


def _prefix_tables(full: list[bool], prefixes: dict[int, list[bool]], evaluation: dict[int, float], n_eval: int = 200):
    """(comparisons, summary) of scripted prefixes: development items per depth, and the evaluation
    letter accuracy per depth."""
    n = max(prefixes) + 1
    per_item = {f"{n} layers": _items(full), **{f"{k} layers": _items(c) for k, c in prefixes.items()}}
    compared = comparisons(per_item, [("prefix vs all layers", f"{n} layers", f"{k} layers") for k in prefixes])
    summary = pl.DataFrame(
        [
            {
                "split": EVALUATION,
                "task": "mmlu_letter",
                "group": "all",
                "metric": "acc",
                "n": n_eval,
                "value": v,
                "layers_kept": k,
            }
            for k, v in {n: evaluation.get(n, 0.45), **evaluation}.items()
        ]
    )
    return compared.with_columns(pl.lit(DEVELOPMENT).alias("split")), summary


def test_the_minimal_model_is_the_shallowest_prefix_shown_to_hold_and_clear_of_chance():
    full = [True] * 150 + [False] * 150
    same = list(full)
    one_flip = [False] + full[1:]  # 1 of 300 lost: within ±5
    broken = [False] * 300  # 150 lost
    compared, summary = _prefix_tables(
        full, {7: same, 6: one_flip, 5: broken, 4: same}, {7: 0.45, 6: 0.44, 5: 0.25, 4: 0.45}
    )
    chosen = choose_minimal(compared, summary, CHANCE, MARGIN)
    # the fixed sequence stops at 5 (it falls): 4 holds too but is never reached
    assert chosen["applies"] and chosen["layers_kept"] == 6 and chosen["kept_layers"] == list(range(6))
    assert chosen["n_layers"] == 8 and chosen["development_items"] == 300
    assert chosen["shallower"]["layers_kept"] == 5 and chosen["shallower"]["verdict"] == "falls"
    assert chosen["letter"]["n"] == 200 and chosen["letter"]["ci_low"] > CHANCE
    # the shallowest holding prefix at chance on the evaluation items: the next deeper one is chosen
    compared, summary = _prefix_tables(full, {7: same, 6: one_flip, 5: broken}, {7: 0.45, 6: 0.27})
    chosen = choose_minimal(compared, summary, CHANCE, MARGIN)
    assert (chosen["layers_kept"], chosen["holding"]) == (7, 6)
    # every holding prefix at chance: none qualifies, and the reason says that, not that none holds
    compared, summary = _prefix_tables(full, {7: same, 6: one_flip, 5: broken}, {7: 0.26, 6: 0.27})
    chosen = choose_minimal(compared, summary, CHANCE, MARGIN)
    assert (
        not chosen["applies"] and "the prefixes of 6 to 7 layers are shown not to lose more than 5" in chosen["reason"]
    )
    assert "clear of chance" in chosen["reason"]


def test_no_prefix_qualifies_and_the_reason_says_why():
    full = [True] * 150 + [False] * 150
    shaky = [False] * 30 + full[30:150] + [True] * 20 + full[170:]  # 30 lost, 20 gained: a fall of 5 not excluded
    compared, summary = _prefix_tables(full, {7: shaky, 6: shaky}, {7: 0.45, 6: 0.45})
    chosen = choose_minimal(compared, summary, CHANCE, MARGIN)
    assert not chosen["applies"] and chosen["layers_kept"] is None and chosen["kept_layers"] == list(range(8))
    assert "no prefix short of the full 8 layers is shown not to lose more than 5 points" in chosen["reason"]
    assert "the 7-layer prefix loses 30 and gains 20 of 300" in chosen["reason"] and len(chosen["sequence"]) == 1


def test_a_prefix_that_gains_is_not_broken_though_it_does_not_hold_both_ways():
    full = [True] * 150 + [False] * 150
    gains = full[:150] + [True] * 20 + full[170:]  # 20 gained, none lost: rises, not within ±5 both ways
    broken = [False] * 60 + full[60:]
    compared, summary = _prefix_tables(full, {7: gains, 6: gains, 5: broken}, {7: 0.5, 6: 0.5})
    chosen = choose_minimal(compared, summary, CHANCE, MARGIN)
    assert chosen["layers_kept"] == 6 and chosen["two_sided"] is None
    assert [s["passed"] for s in chosen["sequence"]] == [True, True, False]
    assert chosen["shallower"]["layers_kept"] == 5 and chosen["shallower"]["verdict"] == "falls"


def _removals(falls: dict[int, int], n: int = 300) -> pl.DataFrame:
    base = [True] * 200 + [False] * 100
    per_item = {MINIMAL: _items(base)}
    for layer, lost in falls.items():
        per_item[f"without L{layer}"] = _items([False] * lost + base[lost:])
    return comparisons(per_item, [(REMOVALS_FAMILY, MINIMAL, f"without L{layer}") for layer in falls])


def test_the_critical_layers_are_the_two_holm_significant_largest_falls_in_layer_order():
    layers, reason = choose_critical(_removals({3: 4, 4: 60, 5: 20, 6: 90, 7: 0}), MARGIN)
    assert layers == [4, 6] and reason is None
    # one falls: one critical layer; a loss of 6 of 300 is significant alone but not after Holm over 5
    assert choose_critical(_removals({3: 6, 4: 0, 5: 1, 6: 30, 7: 0}), MARGIN)[0] == [6]
    layers, reason = choose_critical(_removals({3: 2, 4: 0, 5: 1}), MARGIN)
    assert layers == [] and "no layer's removal" in reason and "3 layers removed" in reason and "n = 300" in reason


@pytest.fixture(scope="module")
def tiny_qwen():
    return tiny_random_model({"arch": "qwen2", "layers": 4, "hidden": 48, "heads": 4, "kv_heads": 2, "seed": 5})


@pytest.fixture(scope="module")
def letter():
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 8, 1, [])
    return build_mmlu(subset, pool, "letter", 0, 1)


def _same(a: pl.DataFrame, b: pl.DataFrame):
    assert a["correct"].to_list() == b["correct"].to_list()
    assert a["logp_target"].to_list() == pytest.approx(b["logp_target"].to_list(), abs=1e-5)


def test_one_pass_layer_removal_equals_each_pruned_model(tiny_qwen, letter):
    model, tok = tiny_qwen
    scorer = Scorer(model, tok, progress=False)
    kept = [0, 1, 2]
    frames = removal_items(scorer, letter, kept, [1, 2])
    for label, layers in [(MINIMAL, kept), ("without L1", [0, 2]), ("without L2", [0, 1])]:
        with pruned_layers(model, layers):
            _same(frames[label], score_table(scorer, letter))


def test_head_sweep_inside_a_pruned_model_equals_the_naive_loop(tiny_qwen, letter):
    model, tok = tiny_qwen
    scorer = Scorer(model, tok, progress=False)
    kept = [0, 1, 2]
    frames = sweep_items(scorer, letter, kept, [1, 2])
    assert set(frames) == {MINIMAL, *[(layer, h) for layer in (1, 2) for h in range(4)]}
    for (layer, head), frame in [(k, v) for k, v in frames.items() if k != MINIMAL]:
        with pruned_layers(model, kept), ablate_heads(model, [(kept.index(layer), head)]):
            _same(frame, score_table(scorer, letter))
    sweep = sweep_table(frames)
    # the halves interleave (the development questions come in id order, grouped by subject)
    first = frames[(1, 0)]["correct"].to_list()[0::2]
    base = frames[MINIMAL]["correct"].to_list()[0::2]
    row = sweep.filter((pl.col("layer") == 1) & (pl.col("head") == 0)).row(0, named=True)
    assert row["acc_drop_half1"] == pytest.approx(sum(base) / len(base) - sum(first) / len(first))
    assert len(sweep) == 8 and sorted(sweep.filter(pl.col("layer") == 1)["rank"].to_list()) == [1, 2, 3, 4]
    found = top_per_layer(sweep)
    assert [f["layer"] for f in found] == [1, 2]
    for f in found:
        part = sweep.filter(pl.col("layer") == f["layer"])
        best = part.sort(["acc_drop", "logp_drop"], descending=True).row(0, named=True)
        assert f["head"] == best["head"] and f["stable"] == (f["top_half1"] == f["top_half2"] == f["head"])


def test_kept_variants_keep_only_the_heads_found_and_draw_their_controls_from_the_same_layer():
    variants = kept_variants([(1, 2), (3, 0)], {0: 4, 1: 4, 2: 4, 3: 4}, Control(seed=7, draws=2))
    kept = variants[KEPT]
    assert sorted(kept) == [(1, 0), (1, 1), (1, 3), (3, 1), (3, 2), (3, 3)] and variants[ALL_HEADS] == []
    assert sorted(variants[f"{KEPT} − L1H2"]) == sorted(kept + [(1, 2)])
    assert sorted(variants[f"{KEPT} − L1H2 − L3H0"]) == sorted(kept + [(1, 2), (3, 0)])
    randoms = [label for label in variants if "random" in label]
    assert len(randoms) == 4 and all(len(variants[label]) == 1 for label in randoms)
    for label in randoms:
        ((layer, head),) = variants[label]
        assert label.startswith(f"{ALL_HEADS} − random L{layer}H{head}") and head != {1: 2, 3: 0}[layer]
    swaps = [label for label in variants if "in place of" in label]
    for label in swaps:  # one head of the layer kept: the random one instead of the one found
        layer = int(label.split("L")[1].split("H")[0])
        assert sum(h[0] == layer for h in variants[label]) == 3
    assert variants == kept_variants([(1, 2), (3, 0)], {0: 4, 1: 4, 2: 4, 3: 4}, Control(seed=7, draws=2))
    # draws without replacement: three draws of a layer's three other heads are all of them
    drawn = kept_variants([(1, 2)], {0: 4, 1: 4}, Control(seed=1, draws=3))
    assert sorted(variants_of[0][1] for label, variants_of in drawn.items() if "random" in label) == [0, 1, 3]
    pairs = kept_pairs(list(variants))
    assert (VS_KEPT, KEPT, f"{KEPT} − L1H2") in pairs and (VS_ALL, ALL_HEADS, KEPT) in pairs
    assert not any(family == VS_KEPT and label.startswith(ALL_HEADS) for family, _, label in pairs)


def test_the_heads_kept_table_equals_a_forward_per_variant(tiny_qwen, letter):
    model, tok = tiny_qwen
    scorer = Scorer(model, tok, progress=False)
    kept = [0, 1, 2]
    variants = kept_variants([(1, 2), (2, 0)], {0: 4, 1: 4, 2: 4, 3: 4}, Control())
    kv = by_dict_size(build_kv_retrieval([3, 5], 2, 0, "lookup"))
    assert sorted(kv) == ["kv_retrieval@3", "kv_retrieval@5"]
    items = score_items(scorer, {"mmlu_letter": letter, **kv}, variants, layers=kept, desc="heads kept")
    for label in (KEPT, f"{KEPT} − L1H2 − L2H0"):
        with pruned_layers(model, kept), ablate_heads(model, variants[label]):
            for task, table in {"mmlu_letter": letter, **kv}.items():
                _same(items[label].filter(pl.col("task") == task), score_table(scorer, table))


def test_the_roles_of_the_heads_found_are_read_inside_the_minimal_model(tiny_qwen, letter):
    from gna.phases.case_gna import found_roles
    from gna.phases.gather_aggregate import GnaRoleConfig, head_roles, mmlu_row_segments

    model, tok = tiny_qwen
    scorer = Scorer(model, tok, progress=False)
    roles, maps = found_roles(scorer, letter, [0, 1, 2], [(1, 2), (2, 0)], GnaRoleConfig())
    assert sorted(roles["layer"].unique().to_list()) == [0, 1, 2] and model.config.num_hidden_layers == 4
    assert sorted(roles.filter(pl.col("found")).select("layer", "head").rows()) == [(1, 2), (2, 0)]
    assert set(maps.select("layer", "head").unique().rows()) == {(1, 2), (2, 0)} and maps["task"][0] == "mmlu_letter"
    # attention in a layer does not depend on the layers after it: the prefix's roles are the full model's
    full = head_roles(scorer, letter, mmlu_row_segments).filter(pl.col("layer") < 3)
    assert roles["aggregate"].to_list() == pytest.approx(full["aggregate"].to_list(), abs=1e-5)


def test_the_masking_of_the_heads_found_runs_inside_the_minimal_model(tiny_qwen, letter):
    from gna.phases.case_gna import found_masking, pattern_roles
    from gna.phases.gather_aggregate import mmlu_row_segments
    from gna.phases.masking import CONDITIONS, Segmented, score_masked

    roles = pl.DataFrame({"layer": [1, 2], "head": [2, 0], "role": ["other", "gather"]})
    assert pattern_roles(roles, [(2, 0), (1, 2)]) == {"gather": (1, 2), "aggregate": (2, 0)}  # the study's order
    assert pattern_roles(roles.with_columns(pl.Series("role", ["aggregate", "gather"])), [(1, 2), (2, 0)]) == {
        "aggregate": (1, 2), "gather": (2, 0)}  # fmt: skip
    assert pattern_roles(roles, [(1, 2)]) == {}
    model, tok = tiny_qwen
    scorer = Scorer(model, tok, progress=False)
    heads = {"gather": (1, 2), "aggregate": (2, 0)}
    summary, compared = found_masking(scorer, letter, [0, 1, 2], heads)
    assert summary["condition"].to_list() == list(CONDITIONS) and set(compared["condition"]) == set(CONDITIONS[1:])
    with pruned_layers(model, [0, 1, 2]):
        masked = score_masked(scorer, Segmented(letter, mmlu_row_segments), heads)
        plain = score_table(scorer, letter)
    row = summary.filter(pl.col("condition") == CONDITIONS[2]).row(0, named=True)
    assert row["acc"] == pytest.approx(float(masked["correct"].mean()))
    assert summary.filter(pl.col("condition") == CONDITIONS[0])["acc"][0] == pytest.approx(
        float(plain["correct"].mean())
    )
