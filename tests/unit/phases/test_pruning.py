import numpy as np
import polars as pl
import pytest
import torch
from transformers import LlamaForCausalLM

from gna.core.chance import ChancePolicy, Reference, at_chance
from gna.engine.scoring import Scorer, score_removals, score_table, score_table_ref
from gna.engine.stack import pruned_layers
from gna.phases.pruning import gradual, individual, minimal_prefix
from gna.tasks.tables import build_kv_retrieval, subset_evenly

KV = build_kv_retrieval([3, 5], 3, 0, "lookup")


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids).logits


def _flat(frame):
    return np.concatenate(frame["logprobs"].to_list())


def test_keep_all_is_the_full_model_and_everything_is_restored(tiny_llama):
    model, tok = tiny_llama
    ids = tok("apple:12\nLookup:\napple:", return_tensors="pt").input_ids
    full = _logits(model, ids)
    layers, n = model.model.layers, model.config.num_hidden_layers
    with pruned_layers(model, list(range(n))):
        assert torch.equal(_logits(model, ids), full)
    with pytest.raises(RuntimeError):
        with pruned_layers(model, [2, 0]):
            assert [l.self_attn.layer_idx for l in model.model.layers] == [0, 1]
            raise RuntimeError("boom")
    assert model.model.layers is layers and model.config.num_hidden_layers == n
    assert [l.self_attn.layer_idx for l in model.model.layers] == list(range(n))
    assert torch.equal(_logits(model, ids), full)


def test_pruned_model_equals_a_model_built_by_hand(tiny_llama):
    model, tok = tiny_llama
    ids = tok("tiger:77\nqueen:31\nLookup:\ntiger:", return_tensors="pt").input_ids
    k = 2
    cfg = model.config.to_dict()
    cfg["num_hidden_layers"] = k
    cfg.pop("layer_types", None)
    by_hand = LlamaForCausalLM(type(model.config)(**cfg)).eval()
    state = {
        name: w
        for name, w in model.state_dict().items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < k
    }
    by_hand.load_state_dict(state, strict=True)
    with pruned_layers(model, list(range(k))):
        assert torch.allclose(_logits(model, ids), _logits(by_hand, ids), atol=1e-6, rtol=0)


def test_pruned_model_cache_stays_aligned(tiny_llama):
    """With a middle layer dropped, incremental decoding through the KV cache must equal the
    uncached forward: misnumbered layer_idx would write into the wrong cache slot."""
    model, tok = tiny_llama
    ids = tok("wolf:55\nzebra:19\nLookup:\nwolf:", return_tensors="pt").input_ids
    with pruned_layers(model, [0, 2]), torch.inference_mode():
        full = model(ids).logits
        out = model(ids[:, :-3], use_cache=True)
        cache, steps = out.past_key_values, [out.logits[:, -1]]
        for t in range(ids.shape[1] - 3, ids.shape[1]):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[:, -1])
    assert torch.allclose(torch.stack(steps[1:], 1), full[:, -3:], atol=1e-5)


def test_one_pass_depth_readout_equals_each_pruned_model(tiny_llama):
    model, tok = tiny_llama
    n = model.config.num_hidden_layers
    fast = score_table(Scorer(model, tok, progress=False), KV, depths=list(range(1, n + 1)))
    for k in range(1, n + 1):
        with pruned_layers(model, list(range(k))):
            ref = score_table_ref(model, tok, KV)
        np.testing.assert_allclose(_flat(fast.filter(pl.col("depth") == k)), _flat(ref), atol=1e-4)


def test_layer_removal_prefix_reuse_equals_pruned_reference(tiny_llama):
    model, tok = tiny_llama
    keep = [0, 1, 2]
    fast = score_removals(Scorer(model, tok, progress=False), KV, keep, keep)
    for r in keep:
        rest = [l for l in keep if l != r]
        with pruned_layers(model, rest):
            ref = score_table_ref(model, tok, KV)
        np.testing.assert_allclose(_flat(fast.filter(pl.col("removed_layer") == r)), _flat(ref), atol=1e-4)
    with pytest.raises(ValueError, match="not among the kept layers"):
        score_removals(Scorer(model, tok, progress=False), KV, [0, 1], [2])


def test_sweeps_are_tidy(tiny_llama):
    model, tok = tiny_llama
    tables = {"kv_retrieval": KV}
    g = gradual(Scorer(model, tok, progress=False), tables)
    assert set(g["layers_kept"]) == {1, 2, 3} and set(g["group"]) == {"3", "5", "all"}
    i = individual(Scorer(model, tok, progress=False), tables, [0, 1])
    assert set(i["removed_layer"]) == {-1, 0, 1} and i["skipped_reason"].is_null().all()
    assert set(g.columns) >= {"task", "group", "n", "metric", "value", "layers_kept", "experiment"}


def test_a_task_at_chance_is_scored_on_the_minimal_model_only_with_the_reason(tiny_llama):
    model, tok = tiny_llama
    base = score_table(Scorer(model, tok, progress=False), KV, layers=[0, 1])
    assert at_chance(base, KV) is not None  # a random model on 3- and 5-key lookups
    i = individual(
        Scorer(model, tok, progress=False),
        {"kv_retrieval": KV},
        [0, 1],
        reference=Reference(chance=ChancePolicy(skip=True)),
    )
    assert set(i["removed_layer"]) == {-1}
    assert i["skipped_reason"].str.starts_with(f"not distinguishable from chance at n={len(KV)}").all()
    # the minimal model's own row is the same either way
    full = individual(Scorer(model, tok, progress=False), {"kv_retrieval": KV}, [0, 1])
    assert i.drop("skipped_reason").equals(full.filter(pl.col("removed_layer") == -1).drop("skipped_reason"))
    # the task that defined the minimal model is always removed layer by layer
    kept = individual(
        Scorer(model, tok, progress=False),
        {"kv_retrieval": KV},
        [0, 1],
        reference=Reference(chance=ChancePolicy(skip=True).sparing("kv_retrieval")),
    )
    assert kept.equals(full)


def test_gradual_pruning_scores_a_task_at_chance_on_the_full_model_only(tiny_llama):
    model, tok = tiny_llama
    n = model.config.num_hidden_layers
    tables = {"kv_retrieval": KV}
    every = gradual(Scorer(model, tok, progress=False), tables)
    assert every["skipped_reason"].is_null().all() and set(every["layers_kept"]) == set(range(1, n + 1))
    g = gradual(
        Scorer(model, tok, progress=False), tables, reference=Reference(chance=ChancePolicy(skip=True))
    )  # a random model is at chance
    assert set(g["layers_kept"]) == {n}
    assert g["skipped_reason"].str.starts_with(f"not distinguishable from chance at n={len(KV)}").all()
    # the full model's row is the same as with every depth scored
    assert g.drop("skipped_reason").equals(every.filter(pl.col("layers_kept") == n).drop("skipped_reason"))
    # the retrieval task that defines the minimal model is scored at every depth
    assert gradual(
        Scorer(model, tok, progress=False),
        tables,
        reference=Reference(chance=ChancePolicy(skip=True).sparing("kv_retrieval")),
    ).equals(every)
    # the decision reads the full model's given scores (its baseline): scores above chance keep every depth
    full = score_table(Scorer(model, tok, progress=False), KV)
    right = full.with_columns(pl.lit(True).alias("correct"))
    assert gradual(
        Scorer(model, tok, progress=False),
        tables,
        reference=Reference(scored={"kv_retrieval": right}, chance=ChancePolicy(skip=True)),
    ).equals(every)
    read = gradual(
        Scorer(model, tok, progress=False),
        tables,
        reference=Reference(scored={"kv_retrieval": full}, chance=ChancePolicy(skip=True)),
    )
    assert read.equals(g)


def test_at_chance_is_the_interval_containing_one_over_the_choices():
    table = pl.DataFrame({"choices": [["a", "b", "c", "d"]] * 40})
    scored = lambda k: pl.DataFrame({"correct": [True] * k + [False] * (40 - k)})  # noqa: E731
    assert "contains chance 25.0%" in at_chance(scored(10), table)  # 25% [14, 40]
    assert at_chance(scored(20), table) is None  # 50% [35, 65]
    assert at_chance(scored(2), table) is None  # 5% [1.4, 17]: below chance is a finding too


def test_minimal_prefix_needs_every_larger_prefix_to_pass():
    values = {1: 0.1, 2: 0.95, 3: 0.5, 4: 0.92, 5: 0.97, 6: 1.0}
    frame = pl.DataFrame(
        {
            "task": "kv_retrieval",
            "metric": "acc",
            "group": "all",
            "layers_kept": list(values),
            "value": list(values.values()),
        }
    )
    best = minimal_prefix(frame, "kv_retrieval", "acc", 0.9)
    assert best["layers_kept"] == 4 and best["kept_layers"] == [0, 1, 2, 3] and best["full_value"] == 1.0
    assert minimal_prefix(frame, "kv_retrieval", "acc", 1.0)["layers_kept"] == 6


def test_sweep_subset_is_stratified():
    table = build_kv_retrieval([3, 5, 7, 9], 10, 0, "lookup")
    sub = subset_evenly(table, 8)
    assert len(sub) == 8 and sub["dict_size"].value_counts()["count"].to_list() == [2, 2, 2, 2]


def test_minimal_model_phase_writes_the_prefix_with_the_model_name(tmp_path):
    import json

    from gna.core.settings import Files
    from gna.phases.pruning import MinimalModel, run_minimal_model

    values = {1: 0.2, 2: 0.9, 3: 1.0}
    frame = pl.DataFrame(
        {
            "task": "kv_retrieval",
            "metric": "acc",
            "group": "all",
            "layers_kept": list(values),
            "value": list(values.values()),
        }
    )
    frame.write_parquet(tmp_path / "gradual.parquet")
    run_minimal_model(
        Files(gradual=str(tmp_path / "gradual.parquet")),
        Files(minimal=str(tmp_path / "minimal.json")),
        MinimalModel(model="m", task="kv_retrieval", metric="acc", fraction=0.9),
    )
    written = json.loads((tmp_path / "minimal.json").read_text())
    assert written["model"] == "m" and written["kept_layers"] == [0, 1]


def test_the_minimal_models_scores_are_read_from_gradual_pruning_exactly(tiny_llama, tmp_path):
    """gradual_items at depth k are the prefix model's own scores, bit for bit; prefix_scores reads
    them back, and individual removal and the heads-kept table give the same results read as
    scored (the tiny model is at chance, so both read them for the skip decision)."""
    from gna.core.io import write_parquet
    from gna.phases.head_tables import heads_kept
    from gna.phases.pruning import gradual_items, prefix_scores

    model, tok = tiny_llama
    tables = {"kv_retrieval": KV}
    items = gradual_items(Scorer(model, tok, batch_size=2, progress=False), tables)
    n = model.config.num_hidden_layers
    assert sorted(items["layers_kept"].unique()) == list(range(1, n + 1))
    write_parquet(items.with_columns(pl.lit("m").alias("model")), tmp_path / "gradual.items.parquet")
    kept = list(range(2))
    read = prefix_scores(str(tmp_path / "gradual.items.parquet"), kept)
    assert read["kv_retrieval"].equals(score_table(Scorer(model, tok, batch_size=2, progress=False), KV, layers=kept))
    assert prefix_scores(str(tmp_path / "gradual.items.parquet"), [0, 2]) == {}  # not a prefix
    assert prefix_scores(None, kept) == {}
    shifted = {"kv_retrieval": read["kv_retrieval"].with_columns(pl.col("logp_target") - 1)}
    plain = individual(
        Scorer(model, tok, batch_size=2, progress=False),
        tables,
        kept,
        reference=Reference(chance=ChancePolicy(skip=True)),
    )
    assert individual(
        Scorer(model, tok, batch_size=2, progress=False),
        tables,
        kept,
        reference=Reference(scored=read, chance=ChancePolicy(skip=True)),
    ).equals(plain)
    # read, not recomputed: shifted scores move the minimal model's own row only
    moved = individual(
        Scorer(model, tok, batch_size=2, progress=False),
        tables,
        kept,
        reference=Reference(scored=shifted, chance=ChancePolicy(skip=True)),
    )
    assert not moved.equals(plain)
    assert moved.filter(pl.col("removed_layer") != -1).equals(plain.filter(pl.col("removed_layer") != -1))
    ranking = pl.DataFrame({"layer": [0, 1], "head": [0, 1], "rank": [1, 2]})
    scorer, on = Scorer(model, tok, batch_size=2, progress=False), ChancePolicy(skip=True)
    assert heads_kept(scorer, ranking, kept, tables, Reference(scored=read, chance=on)).equals(
        heads_kept(scorer, ranking, kept, tables, Reference(chance=on))
    )


def test_gradual_comparisons_pair_each_prefix_with_the_full_model(tiny_llama):
    """One row per prefix (k < n layers) and task, on the same items, with the summary's accuracies."""
    from gna.phases.pruning import gradual_comparisons, gradual_items, summarize_gradual

    model, tok = tiny_llama
    items = gradual_items(Scorer(model, tok, batch_size=2, progress=False), {"kv_retrieval": KV})
    summary = summarize_gradual(items).filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))
    acc = dict(summary.select("layers_kept", "value").iter_rows())
    compared = gradual_comparisons(items)
    n = model.config.num_hidden_layers
    assert compared["condition"].to_list() == [f"{k} layers" for k in range(1, n)]
    assert set(compared["reference"]) == {f"{n} layers"} and set(compared["family"]) == {"prefix vs all layers"}
    for row in compared.iter_rows(named=True):
        assert row["n"] == len(KV) and row["acc_reference"] == acc[n]
        assert row["acc_condition"] == acc[int(row["condition"].split()[0])]
