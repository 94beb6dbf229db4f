import numpy as np
import polars as pl
import pytest
import torch

from gna.engine.ablation import score_ablations
from gna.engine.anatomy import all_heads, head_sites
from gna.engine.hooks import ablate_heads, active_hooks
from gna.engine.scoring import Scorer, score_table
from gna.phases.head_ablation import (
    attribution_cost,
    attribution_scores,
    compare_attribution,
    rank_attribution,
    rank_heads,
    spearman,
    sweep_cost,
    sweep_heads,
    sweep_heads_naive,
    sweep_heads_verified,
    top_heads,
    within_budget,
)
from gna.tasks.tables import build_kv_retrieval

KV = build_kv_retrieval([3, 5], 3, 0, "lookup")


def _logits(model, tok, text="tiger:77\nqueen:31\nLookup:\ntiger:"):
    ids = tok(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        return model(ids).logits


def test_hooks_are_removed_even_on_error(tiny_llama):
    model, tok = tiny_llama
    assert active_hooks(model) == 0
    with ablate_heads(model, [(0, 1), (2, 3)]):
        assert active_hooks(model) == 3  # two sites + the run counter
    with pytest.raises(RuntimeError):
        with ablate_heads(model, [(1, 0)]):
            raise RuntimeError("boom")
    assert active_hooks(model) == 0
    with pytest.raises(ValueError, match="no head 9 in layer 0"):
        with ablate_heads(model, [(0, 9)]):
            pass


def test_query_head_ablation_equals_zeroing_its_o_proj_columns(tiny_llama):
    """Independent reference: with GQA (4 query heads, 2 K/V groups) ablating query head h must
    equal removing its columns from o_proj, and leave the shared K/V projections alone."""
    model, tok = tiny_llama
    site = head_sites(model)[1]
    assert site.kind == "attention" and model.config.num_key_value_heads < site.n_heads
    with ablate_heads(model, [(1, 2)]):
        hooked = _logits(model, tok)
    o_proj = model.model.layers[1].self_attn.o_proj
    saved = o_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            o_proj.weight[:, 2 * site.head_dim : 3 * site.head_dim] = 0
        surgery = _logits(model, tok)
    finally:
        with torch.no_grad():
            o_proj.weight.copy_(saved)
    assert torch.allclose(hooked, surgery, atol=1e-6)
    assert not torch.allclose(hooked, _logits(model, tok), atol=1e-4)


def test_fast_sweep_equals_full_forward_per_head(tiny_llama):
    model, tok = tiny_llama
    heads = all_heads(model)
    fast = sweep_heads(Scorer(model, tok, progress=False), KV)
    naive = sweep_heads_naive(Scorer(model, tok, progress=False), KV, heads)
    assert len(fast) == len(heads) + 1 and active_hooks(model) == 0
    for layer, head in heads:
        row = fast.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
        ref = naive[(layer, head)]
        assert row["acc"] == ref["correct"].mean()
        assert abs(row["mean_logp"] - ref["logp_target"].mean()) <= 1e-5
    # and the naive path itself is the model's own forward with the head ablated
    from gna.engine.scoring import score_table_ref

    with ablate_heads(model, [(1, 2)]):
        hf = score_table_ref(model, tok, KV)
    np.testing.assert_allclose(
        np.concatenate(naive[(1, 2)]["logprobs"].to_list()), np.concatenate(hf["logprobs"].to_list()), atol=1e-4
    )


@pytest.mark.parametrize("layers", [None, [0, 2]])
def test_ablations_sharing_one_pass_equal_a_full_forward_each(tiny_llama, layers):
    """The head tables' fast path (one recorded pass, each ablation rerun from its first ablated
    layer) against its reference: score_table with the heads ablated, once per condition."""
    model, tok = tiny_llama
    ablations = {"none": [], "one late": [(2, 1)], "two": [(2, 0), (2, 3)], "early and late": [(0, 2), (2, 0)]}
    fast = score_ablations(Scorer(model, tok, progress=False), KV, ablations, layers=layers)
    assert list(fast) == list(ablations) and active_hooks(model) == 0
    for key, heads in ablations.items():
        with ablate_heads(model, heads):
            ref = score_table(Scorer(model, tok, progress=False), KV, layers=layers)
        assert fast[key]["pred"].to_list() == ref["pred"].to_list()
        np.testing.assert_allclose(
            np.concatenate(fast[key]["logprobs"].to_list()), np.concatenate(ref["logprobs"].to_list()), atol=1e-5
        )
    assert not np.allclose(fast["two"]["logp_target"], fast["none"]["logp_target"])
    with pytest.raises(ValueError, match=r"cannot ablate heads of layers \[1\]: not among the layers run"):
        score_ablations(Scorer(model, tok, progress=False), KV, {"x": [(1, 0)]}, layers=[0, 2])


def test_ranking_and_attribution(tiny_llama):
    model, tok = tiny_llama
    ranking = rank_heads(sweep_heads(Scorer(model, tok, progress=False), KV))
    assert ranking["rank"].to_list() == list(range(1, len(ranking) + 1))
    drops = list(zip(ranking["acc_drop"], ranking["logp_drop"]))
    assert drops == sorted(drops, reverse=True)
    est = attribution_scores(Scorer(model, tok, progress=False), KV)
    joined = ranking.join(est, on=["layer", "head"])
    assert len(joined) == len(ranking)
    # on a tiny random model, ablation effects are small and close to linear
    assert spearman(joined["logp_drop"].to_list(), joined["logp_drop_est"].to_list()) > 0.8


def _mamba2_without_head(model, tok, layer: int, head: int, mixer=None):
    """Logits of a Mamba-2 model whose head `head` of layer `layer` sees zeros: its x channels
    (the first num_heads * head_dim of the depthwise conv's channels, head-major) get a zero conv
    kernel and bias, so x = silu(0) = 0 there and the scan's output for that head, D·x included,
    is exactly 0; the other heads (their x, dt, A, D) and the shared B, C are untouched. The
    weights are put back afterwards. `mixer`: the layer's Mamba-2 mixer where the model is not a
    plain Mamba-2 (Zamba2's)."""
    mixer = model.backbone.layers[layer].mixer if mixer is None else mixer
    channels = slice(head * mixer.head_dim, (head + 1) * mixer.head_dim)
    assert mixer.conv1d.weight.shape[0] == mixer.num_heads * mixer.head_dim + 2 * mixer.n_groups * mixer.ssm_state_size
    saved = [t.detach().clone() for t in (mixer.conv1d.weight, mixer.conv1d.bias)]
    try:
        with torch.no_grad():
            mixer.conv1d.weight[channels] = 0
            mixer.conv1d.bias[channels] = 0
        return _logits(model, tok)
    finally:
        with torch.no_grad():
            mixer.conv1d.weight.copy_(saved[0])
            mixer.conv1d.bias.copy_(saved[1])


@pytest.mark.parametrize("family", ["mamba2", "mamba"])
def test_ssm_heads(family):
    from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM

    from gna.models.tiny import byte_level_tokenizer

    tok = byte_level_tokenizer()
    torch.manual_seed(0)
    if family == "mamba2":
        model = Mamba2ForCausalLM(
            Mamba2Config(
                vocab_size=len(tok),
                hidden_size=32,
                num_hidden_layers=2,
                num_heads=4,
                head_dim=16,
                state_size=8,
                n_groups=1,
                expand=2,
            )
        ).eval()
        kind, n = "ssm", 4
    else:
        model = MambaForCausalLM(
            MambaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, state_size=8, expand=2)
        ).eval()
        kind, n = "ssm-channels", 16
    sites = head_sites(model)
    assert [s.kind for s in sites] == [kind, kind] and sites[0].n_heads == n
    base = _logits(model, tok)
    with ablate_heads(model, [(1, 0)]):
        ablated = _logits(model, tok)
    assert not torch.allclose(base, ablated, atol=1e-6)
    assert torch.equal(base, _logits(model, tok)) and active_hooks(model) == 0
    if family == "mamba":  # channel groups enter out_proj linearly: compare with weight surgery
        out_proj, width = model.backbone.layers[1].mixer.out_proj, sites[1].head_dim
        saved = out_proj.weight.detach().clone()
        per_group = []
        for group in range(n):  # every group, so ablating the wrong group's channels fails
            with ablate_heads(model, [(1, group)]):
                per_group.append(_logits(model, tok))
            with torch.no_grad():
                out_proj.weight[:, group * width : (group + 1) * width] = 0
            surgery = _logits(model, tok)
            with torch.no_grad():
                out_proj.weight.copy_(saved)
            # the tolerance (1e-5) against the effect it must be smaller than: the ablation's own
            assert (per_group[-1] - base).abs().max() > 100 * 1e-5, group
            torch.testing.assert_close(per_group[-1], surgery, rtol=0, atol=1e-5)
        assert torch.equal(per_group[0], ablated)
        for a in range(n):  # each group's ablation is its own
            for b in range(a):
                assert (per_group[a] - per_group[b]).abs().max() > 100 * 1e-5, (a, b)
    else:  # Mamba-2: head h's scan output is exactly zero when its x channels are (weight surgery)
        assert sites[1].module is model.backbone.layers[1].mixer.norm and sites[1].head_dim == 16
        per_head = []
        for head in range(n):
            with ablate_heads(model, [(1, head)]):
                per_head.append(_logits(model, tok))
            torch.testing.assert_close(per_head[-1], _mamba2_without_head(model, tok, 1, head), rtol=0, atol=1e-5)
        assert torch.equal(per_head[0], ablated)
        for a in range(n):  # each head's ablation is its own
            for b in range(a):
                assert not torch.allclose(per_head[a], per_head[b], atol=1e-4), (a, b)
        # not the same as dropping the head's channels after the gated norm (they count in its RMS)
        out_proj = model.backbone.layers[1].mixer.out_proj
        saved = out_proj.weight.detach().clone()
        with torch.no_grad():
            out_proj.weight[:, : sites[1].head_dim] = 0
        after_norm = _logits(model, tok)
        with torch.no_grad():
            out_proj.weight.copy_(saved)
        assert not torch.allclose(after_norm, ablated, atol=1e-4)
        assert torch.equal(base, _logits(model, tok))
    sweep = sweep_heads(
        Scorer(model, tok, progress=False), build_kv_retrieval([3], 2, 0, "lookup"), heads=[(0, 0), (1, 1)]
    )
    assert len(sweep) == 3


def test_zamba2_heads_are_ablated_where_they_are():
    """Zamba2, checked against weight surgery as Mamba-2 is: each SSM head of a Mamba layer and of
    a hybrid layer equals zeroing its x channels in that layer's conv; the shared attention block
    runs in two layers, so a head ablated in one layer is not ablated in the other, and ablated in
    both it equals zeroing its columns of the shared o_proj."""
    from gna.engine.anatomy import all_heads
    from gna.models.tiny import tiny_random_model

    model, tok = tiny_random_model({"arch": "zamba2", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "seed": 1})
    layers = model.model.layers
    base = _logits(model, tok)
    for layer in (0, 1):  # a Mamba layer, then a hybrid layer (its Mamba decoder beside the shared block)
        mixer = layers[layer].mamba if hasattr(layers[layer], "mamba") else layers[layer].mamba_decoder.mamba
        for head in range(mixer.num_heads):
            with ablate_heads(model, [(layer, head)]):
                ablated = _logits(model, tok)
            assert (ablated - base).abs().max() > 100 * 1e-5, (layer, head)
            surgery = _mamba2_without_head(model, tok, layer, head, mixer=mixer)
            torch.testing.assert_close(ablated, surgery, rtol=0, atol=1e-5)
    shared = [site for site in head_sites(model) if site.kind == "attention"]
    # two blocks, one weight: the o_proj of both layers holds the same tensor
    assert [site.layer for site in shared] == [1, 3]
    assert shared[0].module.weight.data_ptr() == shared[1].module.weight.data_ptr()
    head = shared[0].offset  # the first attention head of the hybrid layers (after their SSM heads)
    assert (1, head) in all_heads(model) and (3, head) in all_heads(model)
    per_layer = []
    for layer in (1, 3):
        with ablate_heads(model, [(layer, head)]):
            per_layer.append(_logits(model, tok))
        # a random tiny attention head moves the logits less than an SSM head (7e-4 here): still
        # far past the 1e-5 the surgery is compared at
        assert (per_layer[-1] - base).abs().max() > 20 * 1e-5, layer
    assert (per_layer[0] - per_layer[1]).abs().max() > 20 * 1e-5
    with ablate_heads(model, [(1, head), (3, head)]):
        both = _logits(model, tok)
    o_proj, width = shared[0].module, shared[0].head_dim
    saved = o_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            o_proj.weight[:, :width] = 0
        torch.testing.assert_close(both, _logits(model, tok), rtol=0, atol=1e-5)
    finally:
        with torch.no_grad():
            o_proj.weight.copy_(saved)
    assert torch.equal(base, _logits(model, tok)) and active_hooks(model) == 0


def test_attribution_comparison():
    """The estimate ranks heads (est_rank), joins the exact drops, and reports the rank
    correlation and the recall of the exact top 10 in the estimate's top n; no timings (not results)."""
    heads = [(layer, head) for layer in range(3) for head in range(4)]
    est = pl.DataFrame(
        {
            "layer": [l for l, _ in heads],
            "head": [h for _, h in heads],
            "kind": "attention",
            "logp_drop_est": [float(i) for i in range(12)],
        }
    )
    # exact drops agree in order except that the two largest are swapped
    drops = [float(i) for i in range(10)] + [11.0, 10.0]
    exact = pl.DataFrame(
        {
            "layer": [l for l, _ in heads],
            "head": [h for _, h in heads],
            "acc_drop": 0.0,
            "logp_drop": drops,
            "rank": [12 - sorted(drops).index(d) for d in drops],
        }
    )
    ranked = rank_attribution(est)
    assert ranked["est_rank"].to_list() == list(range(1, 13)) and top_heads(ranked, 2) == [(2, 3), (2, 2)]
    result = compare_attribution(ranked, exact, top_n=5)
    assert result["spearman_logp"][0] == pytest.approx(spearman(drops, list(range(12))))
    # the exact top 10 are heads 2..11; the estimate's top 5 are heads 7..11
    assert result["recall_top10_in_top_n"][0] == pytest.approx(0.5)
    assert result["verified"].sum() == 5 and result.columns[-2:] == ["top_n", "verified"]
    # against a verified sweep (some heads never measured) the check refuses instead of correlating nulls
    with pytest.raises(ValueError, match="2 of 12 heads have no exact result.*sweep_mode must be 'exact'"):
        compare_attribution(ranked, exact.head(10), top_n=5)


def _attribution_with_layer_gradient_dropped(model, tok, layer):
    """Reference for one GradDrop term: the plain estimate on the model whose layer `layer` passes
    its own output's value but only the residual path's gradient (out = in + (f(in) - in).detach())."""

    def hook(module, args, kwargs, out):
        h = kwargs.get("hidden_states", args[0] if args else None)
        value = out[0] if isinstance(out, tuple) else out
        value = h + (value - h).detach()
        return (value, *out[1:]) if isinstance(out, tuple) else value

    handle = model.model.layers[layer].register_forward_hook(hook, with_kwargs=True)
    try:
        return attribution_scores(Scorer(model, tok, progress=False), KV)
    finally:
        handle.remove()


def test_graddrop_equals_dropping_each_layers_gradient_by_a_hook(tiny_llama):
    model, tok = tiny_llama
    est = attribution_scores(Scorer(model, tok, progress=False), KV, grad_drop=True).sort("layer", "head")
    plain = attribution_scores(Scorer(model, tok, progress=False), KV).sort("layer", "head")
    np.testing.assert_allclose(est["logp_drop_est"].to_numpy(), plain["logp_drop_est"].to_numpy(), rtol=1e-6)
    n_layers = len(model.model.layers)
    total = np.zeros(len(est))
    for layer in range(n_layers):
        term = _attribution_with_layer_gradient_dropped(model, tok, layer).sort("layer", "head")
        total += np.abs(term["logp_drop_est"].to_numpy())
    np.testing.assert_allclose(est["graddrop_est"].to_numpy(), total, rtol=1e-5, atol=1e-9)
    assert not np.allclose(total, n_layers * np.abs(plain["logp_drop_est"].to_numpy()))
    assert active_hooks(model) == 0


def test_estimate_orders():
    est = pl.DataFrame(
        {
            "layer": [0, 0, 1],
            "head": [0, 1, 0],
            "kind": "attention",
            "logp_drop_est": [0.5, -2.0, 1.0],
            "graddrop_est": [3.0, 1.0, 2.0],
        }
    )
    assert top_heads(rank_attribution(est), 3) == [(1, 0), (0, 0), (0, 1)]
    assert top_heads(rank_attribution(est, "magnitude"), 3) == [(0, 1), (1, 0), (0, 0)]
    assert top_heads(rank_attribution(est, "graddrop"), 3) == [(0, 0), (1, 0), (0, 1)]
    with pytest.raises(ValueError, match="unknown attribution order 'abs'"):
        rank_attribution(est, "abs")


def test_the_budget_counts_layer_runs_and_keeps_the_order():
    # 4 layers x 2 heads: the full sweep costs 2 * (4 + 3 + 2 + 1) = 20 layer runs; attribution 12
    heads = [(3, 0), (3, 1), (2, 0), (0, 0), (1, 0), (0, 1), (1, 1), (2, 1)]
    ranked = pl.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads]})
    assert sweep_cost(heads, 4) == 20
    assert within_budget(ranked, 4, 0.6) == []  # 12 - 12: nothing left to verify
    assert within_budget(ranked, 4, 0.8) == [(3, 0), (3, 1), (2, 0)]  # 16 - 12 = 4 = 1 + 1 + 2; stops at (0, 0)
    assert within_budget(ranked, 4, 1.0) == [(3, 0), (3, 1), (2, 0), (0, 0)]
    # GradDrop's backward from each layer's input costs 2 * (1 + 2 + 3) = 12 more: nothing fits
    assert attribution_cost(4, "graddrop") == 24 and within_budget(ranked, 4, 1.0, "graddrop") == []


def test_ties_in_the_estimate_are_broken_by_magnitude_then_position():
    est = pl.DataFrame(
        {
            "layer": [1, 0, 0, 1],
            "head": [1, 1, 0, 0],
            "logp_drop_est": [0.0, -0.5, 0.0, 0.5],
            "graddrop_est": [1.0, 1.0, 1.0, 1.0],
        }
    )
    assert top_heads(rank_attribution(est, "graddrop"), 4) == [(0, 1), (1, 0), (0, 0), (1, 1)]
    assert rank_attribution(est.reverse(), "signed").equals(rank_attribution(est, "signed"))


def test_a_budget_too_small_to_verify_two_heads_is_an_error_naming_it(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match=r"heads.verify_budget=0.3 verifies 0 heads.*costs \d+% of the exact sweep"):
        sweep_heads_verified(Scorer(model, tok, progress=False), KV, budget=0.3)


def test_verified_sweep_is_exact_where_it_measures(tiny_llama):
    model, tok = tiny_llama
    full = sweep_heads(Scorer(model, tok, progress=False), KV)
    fast = sweep_heads_verified(Scorer(model, tok, progress=False), KV, budget=0.6)
    n_layers = len(model.model.layers)
    verified = [(l, h) for l, h in zip(fast["layer"], fast["head"]) if l >= 0]
    assert 0 < len(verified) < len(full) - 1
    assert sweep_cost(verified, n_layers) <= 0.6 * sweep_cost(all_heads(model), n_layers) - 3 * n_layers
    exact = full.join(fast.select("layer", "head"), on=["layer", "head"]).sort("layer", "head")
    assert exact.equals(fast.sort("layer", "head"))
    # the unablated row comes from the sweep's own pass and equals plain scoring
    base = score_table(Scorer(model, tok, progress=False), KV)
    assert fast.filter(pl.col("layer") == -1)["mean_logp"][0] == pytest.approx(base["logp_target"].mean(), abs=1e-6)


def test_sweep_phase_in_each_mode_says_what_it_measured(tiny_llama, tmp_path):
    from gna.core.settings import Files
    from gna.phases.head_ablation import HeadsSweep, run_heads_sweep
    from gna.tasks.tables import KvPrompts, write_kv_task

    model, tok = tiny_llama
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    prompts = str(tmp_path / "prompts.parquet")
    write_kv_task(KvPrompts(sizes=(3,), n_per_size=3, seed=0, template="lookup"), prompts)
    out = {
        mode: (tmp_path / f"{mode}-sweep.parquet", tmp_path / f"{mode}-ranking.parquet")
        for mode in ("exact", "verified")
    }
    inputs = Files(model=str(tmp_path / "m"), prompts=prompts)

    def outputs(mode):
        return Files(sweep=str(out[mode][0]), ranking=str(out[mode][1]))

    run_heads_sweep(inputs, outputs("exact"), HeadsSweep.of({"model": "t", "sweep": {"mode": "exact"}}))
    verified_mode = {"mode": "verified", "budget": 0.6, "order": "magnitude"}
    run_heads_sweep(inputs, outputs("verified"), HeadsSweep.of({"model": "t", "sweep": verified_mode}))
    exact, verified = (pl.read_parquet(out[m][0]) for m in ("exact", "verified"))
    assert set(exact["mode"]) == {"exact"} and set(verified["mode"]) == {"verified"}
    assert set(exact["heads_total"]) == set(verified["heads_total"]) == {len(all_heads(model))} == {len(exact) - 1}
    assert 1 < len(verified) < len(exact)
    with pytest.raises(ValueError, match="heads.sweep_mode: unknown mode 'fast'"):
        HeadsSweep.of({"model": "t", "sweep": {"mode": "fast"}})
