"""Six query heads per key/value group, as the default study's knowledge model has (Qwen2.5-Coder-1.5B:
12 query heads over 2 KV heads), on a tiny random qwen2 of transformers' own class: the engine's
self-check against the model's own forward, one ablation site per *query* head (never a KV group),
the exact head sweep against one full forward per head, the key/value-group sweep (heads.sweep_unit:
group) against one full forward per group and the remove-top-k table over groups, and the G&A masking."""

import numpy as np
import pytest
import torch

from gna.core.io import read_parquet
from gna.core.settings import Files, TopK
from gna.engine import stack
from gna.engine.ablation import ablation_units, head_ranks
from gna.engine.anatomy import all_heads, head_sites, kv_groups
from gna.engine.hooks import ablate_heads, active_hooks
from gna.engine.scoring import Scorer, score_table_ref
from gna.models.prepare import load_model, prepare_model
from gna.models.tiny import tiny_random_model
from gna.phases.gather_aggregate import kv_row_segments
from gna.phases.head_ablation import (
    HeadsAttribution,
    attribution_scores,
    rank_heads,
    run_heads_attribution,
    sweep_heads,
    sweep_heads_naive,
    sweep_heads_verified,
    unit_attribution,
)
from gna.phases.head_tables import remove_top_k
from gna.phases.masking import CONDITIONS, Segmented, masking_experiment
from gna.tasks.tables import build_kv_retrieval

KV = build_kv_retrieval([3, 4], 2, seed=0, template="lookup")
SPEC = {"arch": "qwen2", "layers": 3, "hidden": 96, "heads": 12, "kv_heads": 2, "window": None, "seed": 3}


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """A tiny qwen2 (12 query heads, 2 KV heads, head_dim 8), saved as an HF folder and prepared as
    the workflow prepares a `local` source."""
    model, tok = tiny_random_model(SPEC)
    folder = tmp_path_factory.mktemp("qwen2-gqa")
    model.save_pretrained(folder / "hf")
    tok.save_pretrained(folder / "hf")
    prepare_model("qwen2-gqa", {"source": "local", "path": str(folder / "hf")}, folder / "prepared")
    return load_model(folder / "prepared", device="cpu")


def test_the_engine_checks_itself_on_six_query_heads_per_group(grouped):
    model, _ = grouped
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 6
    stack._CHECKED.pop(model, None)
    assert stack.check_engine(model) is not None and stack._CHECKED.get(model)
    sites = head_sites(model)
    assert len(all_heads(model)) == 3 * 12
    # one site per layer over o_proj's input: 12 slices of head_dim 8, not 2 KV groups
    assert {(s.layer, s.n_heads, s.head_dim) for s in sites} == {(layer, 12, 8) for layer in range(3)}


def test_a_query_head_is_its_slice_of_o_proj_not_its_kv_group(grouped):
    model, tok = grouped
    ids = torch.tensor([tok(KV["context"][0]).input_ids])
    layer, head = 1, 7  # the second KV group's second query head
    with torch.inference_mode(), ablate_heads(model, [(layer, head)]):
        hooked = model(ids, use_cache=False).logits
    proj = model.model.layers[layer].self_attn.o_proj
    saved = proj.weight.detach().clone()
    try:
        with torch.no_grad():
            proj.weight[:, head * 8 : (head + 1) * 8] = 0
            surgery = model(ids, use_cache=False).logits
            proj.weight.copy_(saved)
            # its group's other five query heads are untouched: zeroing the whole group differs
            proj.weight[:, 6 * 8 : 12 * 8] = 0
            group = model(ids, use_cache=False).logits
    finally:
        with torch.no_grad():
            proj.weight.copy_(saved)
    assert torch.allclose(hooked, surgery, atol=1e-5)
    assert (hooked - group).abs().max() > 1e-3
    assert active_hooks(model) == 0


def test_the_exact_sweep_equals_the_naive_loop_on_every_head(grouped):
    model, tok = grouped
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    heads = all_heads(model)
    sweep = sweep_heads(scorer, KV, heads=heads)
    naive = sweep_heads_naive(scorer, KV, heads)
    for layer, head in heads:
        row = sweep.filter((sweep["layer"] == layer) & (sweep["head"] == head)).row(0, named=True)
        assert row["mean_logp"] == pytest.approx(float(naive[(layer, head)]["logp_target"].mean()), abs=1e-5)
    # and the naive loop is the model's own forward with the head zeroed
    with ablate_heads(model, [heads[-1]]):
        ref = score_table_ref(model, tok, KV)
    assert np.allclose(ref["logp_target"].to_numpy(), naive[heads[-1]]["logp_target"].to_numpy(), atol=1e-4)
    assert sweep.filter(sweep["layer"] >= 0)["mean_logp"].n_unique() > 1
    assert active_hooks(model) == 0


def test_masking_runs_on_query_heads_of_one_group(grouped):
    model, tok = grouped
    # a Gather and an Aggregate head in the same KV group of different layers
    heads = {"gather": (0, 2), "aggregate": (2, 4)}
    result = masking_experiment(
        Scorer(model, tok, batch_size=2, progress=False), Segmented(KV.head(3), kv_row_segments), heads
    )
    assert result["condition"].to_list() == list(CONDITIONS[:3]) and result["acc"].is_between(0, 1).all()
    # condition a (no mask) is the unmasked model
    base = score_table_ref(model, tok, KV.head(3))
    assert result.filter(result["condition"] == CONDITIONS[0])["acc"][0] == pytest.approx(float(base["correct"].mean()))
    assert active_hooks(model) == 0


def test_a_kv_group_is_the_six_query_heads_that_read_one_key_value_head(grouped):
    model, _ = grouped
    groups = kv_groups(model)
    assert len(groups) == 3 * 2
    assert groups[(1, 1)] == [(1, h) for h in range(6, 12)]
    assert ablation_units(model, "group") == groups
    assert ablation_units(model, "head")[(2, 5)] == [(2, 5)]
    with pytest.raises(ValueError, match="heads.sweep_unit: unknown unit 'layer'"):
        ablation_units(model, "layer")


def test_the_group_sweep_equals_one_full_forward_per_group(grouped):
    model, tok = grouped
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    sweep = sweep_heads(scorer, KV, unit="group")
    assert len(sweep) == 1 + 6 and set(sweep["unit"]) == {"group"}
    naive = sweep_heads_naive(scorer, KV, list(kv_groups(model)), unit="group")
    for (layer, group), frame in naive.items():
        row = sweep.filter((sweep["layer"] == layer) & (sweep["head"] == group)).row(0, named=True)
        assert row["query_heads"] == list(range(6 * group, 6 * group + 6))
        assert row["mean_logp"] == pytest.approx(float(frame["logp_target"].mean()), abs=1e-5)
    # a group removed is not any one of its heads removed: the reference differs from each head's
    heads = sweep_heads(scorer, KV, heads=[(2, 0), (2, 1)])
    group = sweep.filter((sweep["layer"] == 2) & (sweep["head"] == 0))["mean_logp"][0]
    assert all(abs(group - v) > 1e-4 for v in heads.filter(heads["layer"] == 2)["mean_logp"])
    assert active_hooks(model) == 0


def test_the_verified_group_sweep_ranks_groups_by_their_heads_summed_estimate_and_measures_them_exactly():
    model, tok = tiny_random_model({**SPEC, "layers": 8})  # deep enough for the attribution to leave budget
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    est = attribution_scores(scorer, KV)
    per_group = unit_attribution(est, ablation_units(model, "group"))
    assert len(per_group) == 16
    layer3 = est.filter((est["layer"] == 3) & (est["head"] >= 6))["logp_drop_est"].sum()
    assert per_group.filter((per_group["layer"] == 3) & (per_group["head"] == 1))["logp_drop_est"][0] == pytest.approx(
        layer3
    )
    verified = sweep_heads_verified(scorer, KV, budget=1.0, unit="group")
    exact = sweep_heads(scorer, KV, unit="group")
    assert set(verified["unit"]) == {"group"} and 2 < len(verified) < len(exact)
    both = verified.join(exact, on=["layer", "head"], suffix="_exact")
    assert np.allclose(both["mean_logp"].to_numpy(), both["mean_logp_exact"].to_numpy(), atol=1e-6)


def test_remove_top_k_over_groups_removes_whole_groups_and_draws_random_groups(grouped):
    model, tok = grouped
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    ranking = rank_heads(sweep_heads(scorer, KV, unit="group"))
    # per query head, a group's heads carry its rank (what the G&A phase joins on)
    ranks = head_ranks(ranking)
    assert len(ranks) == 36 and ranks.filter(ranks["rank"] == 1)["head"].len() == 6
    per_item = {}
    table = remove_top_k(scorer, ranking, {"kv_retrieval": KV}, TopK(ks=(0, 2), random_draws=1), per_item=per_item)
    top = ranking.sort("rank").head(2)
    names = " ".join(f"L{l}G{g}" for l, g in zip(top["layer"], top["head"]))
    row = table.filter((table["condition"] == "top") & (table["k"] == 2) & (table["metric"] == "acc")).row(
        0, named=True
    )
    assert row["heads"] == names and row["unit"] == "group"
    random_row = table.filter(table["condition"] == "random")["heads"][0].split()
    assert len(random_row) == 2 and all("G" in unit for unit in random_row)
    # the top-2 condition is the twelve query heads of those groups removed by hand
    removed = [h for l, g in zip(top["layer"], top["head"]) for h in kv_groups(model)[(l, g)]]
    with ablate_heads(model, removed):
        ref = score_table_ref(model, tok, KV)
    assert np.allclose(per_item["top 2"]["logp_target"].to_numpy(), ref["logp_target"].to_numpy(), atol=1e-4)
    assert active_hooks(model) == 0


def test_the_attribution_check_of_a_group_ranking_compares_the_groups_estimates(grouped, tmp_path):
    """heads_attribution on a model ranked by key/value group: each group's summed estimate against its
    exact drop, the top groups verified (red before: it compared 36 heads with a ranking of 6 groups)."""
    model, tok = grouped
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    ranking = rank_heads(sweep_heads(scorer, KV, unit="group"))
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    paths = {"prompts": tmp_path / "prompts.parquet", "ranking": tmp_path / "ranking.parquet"}
    KV.write_parquet(paths["prompts"])
    ranking.write_parquet(paths["ranking"])
    outputs = Files(attribution=str(tmp_path / "attribution.parquet"), timings=str(tmp_path / "timings.json"))
    settings = HeadsAttribution(model="grouped", top_n=3)
    inputs = Files(model=str(folder), **{k: str(v) for k, v in paths.items()})
    result = run_heads_attribution(inputs, outputs, settings)
    assert len(result) == 6 and result["verified"].sum() == 3
    est = unit_attribution(attribution_scores(scorer, KV), ablation_units(model, "group"))
    joined = result.join(est, on=["layer", "head"], suffix="_direct")
    assert np.allclose(joined["logp_drop_est"].to_numpy(), joined["logp_drop_est_direct"].to_numpy(), atol=1e-5)
    assert read_parquet(outputs.attribution)["model"][0] == "grouped"
