"""The model-family matrix: tiny random configs of transformers' own classes (no hub), each
prepared from a saved HF folder and run through every phase that applies, against the model's
own forward as the reference. Windowed families use a window of 8 tokens, shorter than every
prompt here, so windowed layers are tested where they differ from full attention."""

import copy
import math

import numpy as np
import pytest
import torch

from gna.core import work
from gna.engine.anatomy import all_heads, decoder_layers, head_sites, sliding_windows
from gna.engine.device import device_of
from gna.engine.hooks import ablate_heads, active_hooks
from gna.engine.scoring import Scorer, Variant, score_removals, score_table, score_table_ref, score_variants
from gna.engine.stack import DecoderStack, pruned_layers
from gna.models.families import FAMILY_PHASES, STUDENT_FAMILIES, check_student_family
from gna.models.prepare import load_model, prepare_model
from gna.models.tiny import ARCHS, tiny_random_model
from gna.phases.gather_aggregate import head_roles, kv_row_segments
from gna.phases.head_ablation import attribution_scores, sweep_heads
from gna.phases.masking import CONDITIONS, Segmented, masking_experiment
from gna.tasks.tables import build_kv_retrieval

KV = build_kv_retrieval([3, 4], 2, seed=0, template="lookup")
SHARPEN = 200.0


def _flat(frame) -> np.ndarray:
    return np.concatenate(frame["logprobs"].to_list())


@pytest.fixture(scope="module", params=ARCHS)
def family(request, tmp_path_factory):
    """(arch, prepared model, tokenizer): a tiny model saved as an HF folder, prepared as a
    `local` source and loaded back as the workflow does."""
    arch = request.param
    model, tok = tiny_random_model({"arch": arch, "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "seed": 1})
    folder = tmp_path_factory.mktemp(arch)
    model.save_pretrained(folder / "hf")
    tok.save_pretrained(folder / "hf")
    prov = prepare_model(arch, {"source": "local", "path": str(folder / "hf")}, folder / "prepared")
    loaded, tok = load_model(folder / "prepared")
    assert prov["architecture"] == type(loaded).__name__ and loaded.config.model_type.startswith(arch)
    return arch, loaded, tok


def test_engine_logprobs_equal_the_models_own_forward(family):
    arch, model, tok = family
    windows = sliding_windows(model.config, model.config.num_hidden_layers)
    longest = max(len(tok(c).input_ids) for c in KV["context"])
    if any(windows):
        assert longest > max(w for w in windows if w)  # the prompts reach past every window
    fast, ref = score_table(Scorer(model, tok, batch_size=3, progress=False), KV), score_table_ref(model, tok, KV)
    assert np.abs(_flat(fast) - _flat(ref)).max() <= 1e-4
    assert fast["pred"].to_list() == ref["pred"].to_list()


def test_pruning_gradual_and_individual_equal_the_pruned_models_forward(family):
    arch, model, tok = family
    n = model.config.num_hidden_layers
    depths = score_table(Scorer(model, tok, progress=False), KV, depths=[1, n - 1])
    # Zamba2's own forward tells a layer its position in the loop, and its shared blocks pick
    # per-layer adapters by it: only a prefix of its layers is a model its own forward can run
    gone = n - 1 if arch == "zamba2" else 1
    removed = score_removals(Scorer(model, tok, progress=False), KV, list(range(n)), [gone])
    for keep, fast in (
        (list(range(1)), depths.filter(depths["depth"] == 1)),
        (list(range(n - 1)), depths.filter(depths["depth"] == n - 1)),
        ([i for i in range(n) if i != gone], removed),
    ):
        with pruned_layers(model, keep):
            ref = score_table_ref(model, tok, KV)
        assert np.abs(_flat(fast) - _flat(ref)).max() <= 1e-4, keep


def test_exact_head_sweep_equals_a_naive_forward_per_head(family):
    arch, model, tok = family
    heads = all_heads(model)
    chosen = [heads[0], heads[len(heads) // 2], heads[-1]]
    sweep = sweep_heads(Scorer(model, tok, batch_size=3, progress=False), KV, heads=chosen)
    for layer, head in chosen:
        with ablate_heads(model, [(layer, head)]):
            ref = score_table_ref(model, tok, KV)
        row = sweep.filter((sweep["layer"] == layer) & (sweep["head"] == head)).row(0, named=True)
        assert row["mean_logp"] == pytest.approx(float(ref["logp_target"].mean()), abs=1e-4)
    unablated = sweep.filter(sweep["layer"] == -1)["mean_logp"][0]
    assert any(abs(r - unablated) > 1e-6 for r in sweep.filter(sweep["layer"] >= 0)["mean_logp"])
    assert active_hooks(model) == 0


def test_variants_without_the_base_model_stop_recording_at_their_last_resume_point_bit_for_bit(family):
    """score_variants without base_key computes no layer after the last resume point: each variant's
    scores equal those read beside a full recording (base_key given), bit for bit, for fewer layer-tokens;
    the layers run their own forward again afterwards."""
    arch, model, tok = family
    n = model.config.num_hidden_layers
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    variants = [Variant("from 1", 1, list(range(1, n))), Variant("from 2", 2, list(range(2, n)))]
    work.reset()
    stopped = score_variants(scorer, KV, list(range(n)), variants)
    counted = work.layer_tokens()
    work.reset()
    full = score_variants(scorer, KV, list(range(n)), variants, base_key="base")
    for key in ("from 1", "from 2"):
        assert stopped[key].equals(full[key]), key
    assert counted < work.layer_tokens()
    assert "base" not in stopped and all("forward" not in vars(layer) for layer in decoder_layers(model))


def test_the_last_layer_at_the_read_rows_only_reads_out_as_the_full_layer(family):
    """Scorer.read_rows_only (the default): a pass's last layer computes its MLP and attention output
    projection at the read rows only; the scores equal the full layer's (read_rows_only=False, the
    reference) within float32 rounding, in a plain pass, with layers read out early (depths), and in
    variants; the modules' own forwards are back afterwards."""
    arch, model, tok = family
    n = model.config.num_hidden_layers
    stack = DecoderStack(model)
    restricted = [layer for layer in range(n) if stack.positionwise[layer]]
    if arch in ("mamba", "falcon_mamba", "mamba2", "zamba2"):
        assert not restricted  # a scan reads along the sequence: nothing is position-wise alone
    else:
        assert restricted == list(range(n))
    variants = [Variant("from 2", 2, list(range(2, n)))]
    for scores in (
        lambda s: score_table(s, KV),
        lambda s: score_table(s, KV, depths=[1, n]),
        lambda s: score_variants(s, KV, list(range(n)), variants, base_key="base")["from 2"],
    ):
        fast = scores(Scorer(model, tok, batch_size=3, progress=False))
        full = scores(Scorer(model, tok, batch_size=3, progress=False, read_rows_only=False))
        assert np.abs(_flat(fast) - _flat(full)).max() <= 1e-5
        assert fast["pred"].to_list() == full["pred"].to_list()
    assert all("forward" not in vars(m) or m.forward.__name__ != "restricted" for m in model.modules())
    if restricted:  # the cut is real: the positions nothing reads hold no layer output
        from gna.engine.packing import collate, pack
        from gna.engine.scoring import encode_table

        items = [pack(e.context, e.choices) for e in encode_table(tok, KV.head(2))]
        batch = collate(items, device=device_of(model))
        with torch.inference_mode():
            fast, full = (stack.record(batch, read_only=flag).final for flag in (True, False))
        read = torch.zeros(fast.shape[:2], dtype=torch.bool)
        read[tuple(zip(*stack.read_positions(batch)))] = True
        assert torch.allclose(fast[read], full[read], atol=1e-5) and not torch.allclose(fast[~read], full[~read])


def _rotations():
    """One fact table under each rotation of its options (letter answers after a solved example,
    and option-text answers: one-token and several-token choices)."""
    from dataclasses import replace

    from conftest import MINI_MMLU

    from gna.tasks.facts import ChoiceForm, FactSelection, build_facts, read_local_facts

    facts = read_local_facts(MINI_MMLU.parent / "mini_facts.csv")
    selection = FactSelection(("capital", "symbol"), 2, seed=1)
    return {
        answer: [
            build_facts(facts, selection, "choice", replace(ChoiceForm(answer=answer, shots=shots), rotation=r))
            for r in range(4)
        ]
        for answer, shots in (("letter", 1), ("text", 0))
    }


def test_contexts_packed_as_one_tree_score_as_each_table_alone(family):
    """score_as_tree (a fact's rotations: the shared prefix runs once) gives every table's scores
    within float32 rounding of scoring it alone (the reference), with the same predictions, for
    fewer layer-tokens where the model packs choices; a model that does not scores each alone."""
    from gna.engine.scoring import score_as_tree

    arch, model, tok = family
    scorer = Scorer(model, tok, batch_size=3, progress=False)
    rotations = _rotations()
    packs = DecoderStack(model).packs_choices
    if not packs:  # scored table by table: one form, two rotations show it
        rotations = {"letter": rotations["letter"][:2]}
    score_table(scorer, rotations["letter"][0].head(1))  # a first pass may count a probe of the stack
    for answer, tables in rotations.items():
        work.reset()
        alone = [score_table(scorer, t) for t in tables]
        separately = work.layer_tokens()
        work.reset()
        together = score_as_tree(scorer, tables)
        for a, b in zip(together, alone):
            assert a.drop("logprobs", "logp_target").equals(b.drop("logprobs", "logp_target")), answer
            assert np.abs(_flat(a) - _flat(b)).max() <= 1e-5, answer
        if packs:
            assert work.layer_tokens() < 0.9 * separately, answer
        else:
            assert work.layer_tokens() == separately


def test_ablating_a_head_equals_zeroing_its_slice_of_the_projection_weights(family):
    """Independent of the hooks: a head's output enters a linear projection (o_proj, dense,
    Conv1D c_proj, Mamba's out_proj), so zeroing it equals zeroing its input columns there."""
    arch, model, tok = family
    sites = head_sites(model)
    # Mamba-2's gated norm is not linear; Zamba2 ties its attention blocks' weights across layers,
    # so zeroing one block's weight would ablate the head in every layer that shares it
    untied = [s for s in sites if s.kind != "ssm" and sum(o.module.weight is s.module.weight for o in sites) == 1]
    if not untied:
        pytest.skip(f"{arch}: no head enters an untied linear projection")
    site = untied[0]
    ids = torch.tensor([tok(KV["context"][0]).input_ids], device=device_of(model))
    with torch.inference_mode(), ablate_heads(model, [(site.layer, site.offset + 1)]):
        hooked = model(ids, use_cache=False).logits
    weight = site.module.weight
    cols = slice(site.head_dim, 2 * site.head_dim)
    saved = weight.detach().clone()
    try:
        with torch.no_grad():  # nn.Linear keeps [out, in]; GPT-2's Conv1D keeps [in, out]
            if isinstance(site.module, torch.nn.Linear):
                weight[:, cols] = 0
            else:
                weight[cols, :] = 0
            surgery = model(ids, use_cache=False).logits
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert torch.allclose(hooked, surgery, atol=1e-5)


def test_attribution_estimates_every_head(family):
    """With frozen weights, as a fresh load in a job has them checked by the engine first."""
    from gna.engine import stack

    arch, model, tok = family
    stack._CHECKED.pop(model, None)
    model.requires_grad_(False)
    try:
        est = attribution_scores(Scorer(model, tok, batch_size=3, progress=False), KV)
    finally:
        model.requires_grad_(True)
    assert len(est) == len(all_heads(model))
    assert all(math.isfinite(v) for v in est["logp_drop_est"]) and est["logp_drop_est"].abs().max() > 0
    assert active_hooks(model) == 0


def test_gather_and_aggregate_phases_run_or_are_refused_by_name(family):
    arch, model, tok = family
    if "gna" not in FAMILY_PHASES[arch]:
        with pytest.raises(TypeError, match=arch):
            head_roles(Scorer(model, tok, progress=False), KV.head(1), kv_row_segments)
        return
    roles = head_roles(
        Scorer(model, tok, progress=False), KV.head(2), kv_row_segments, gather_min=0.0, aggregate_min=0.0
    )
    assert len(roles) == len(all_heads(model))
    heads = {"gather": (0, 1), "aggregate": (model.config.num_hidden_layers - 1, 0)}
    result = masking_experiment(Scorer(model, tok, batch_size=2), Segmented(KV.head(3), kv_row_segments), heads)
    assert result["condition"].to_list() == list(CONDITIONS[:3]) and result["acc"].is_between(0, 1).all()


def test_students_are_built_for_supported_families_and_refused_by_name_otherwise(family):
    import copy

    from gna.students.spec import make_hybrid

    arch, model, tok = family
    if arch not in STUDENT_FAMILIES:
        with pytest.raises(TypeError, match=f"{arch}.*supported: {', '.join(STUDENT_FAMILIES)}"):
            check_student_family(model)
        return
    # the engine's packed batches (choices after their context, windows by position): a student
    # keeping every head scores as the teacher, one with SSM heads as its own reference path
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    kept_all = make_hybrid(copy.deepcopy(model), [(i, h) for i in range(n_layers) for h in range(n_heads)], 4)
    teacher = score_table(Scorer(model, tok, progress=False), KV)
    assert np.abs(_flat(score_table(Scorer(kept_all, tok, progress=False), KV)) - _flat(teacher)).max() <= 1e-4
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    fast, ref = score_table(Scorer(student, tok, progress=False), KV), score_table_ref(student, tok, KV)
    # on CUDA the packed trunk's scan can be mamba-ssm's kernel, whose dots use TF32, beside the
    # float32 recurrence of the choices (measured on an H100: 1.02e-4 for llama)
    tol = 1e-4 if device_of(student).type == "cpu" else 1e-3
    assert np.abs(_flat(fast) - _flat(ref)).max() <= tol


def test_a_students_heads_compute_what_the_teachers_do_in_every_student_family(family, tmp_path, monkeypatch):
    """Per family: a student keeping every head is the teacher (windowed layers keep their window:
    the prompt is longer); a student with SSM heads saves and reloads bit for bit, decodes step by
    step as its forward computes, and takes a KD step."""
    # the reference scan on every device, so the limits below mean the same on a GPU: mamba-ssm's
    # kernel (TF32 dots, its own test) failed them for all ten families on an H200
    monkeypatch.setenv("GNA_SSM_KERNEL", "torch")
    from gna.students.decoding import prefill, step
    from gna.students.kd import KD, Watch, distill_logits
    from gna.students.mixer import mixers
    from gna.students.spec import load_any, make_hybrid, save_student
    from gna.students.teacher_file import teacher_activations

    arch, model, tok = family
    if arch not in STUDENT_FAMILIES:
        pytest.skip(f"{arch}: no students (refused by name, above)")
    model = copy.deepcopy(model)
    with torch.no_grad():  # sharp attention (random tiny weights attend almost uniformly): Gemma 2's
        for layer in decoder_layers(model):  # soft-capping of the logits then changes the outputs
            if hasattr(getattr(layer, "self_attn", None), "q_proj"):
                layer.self_attn.q_proj.weight.mul_(SHARPEN)
    on = device_of(model)
    ids = torch.tensor([tok(KV["context"][0]).input_ids], device=on)
    windows = [w for w in sliding_windows(model.config, model.config.num_hidden_layers) if w]
    assert ids.shape[1] > max(windows, default=0) + 2  # decoding steps past every window too
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    every = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    with torch.no_grad():
        kept_all = make_hybrid(copy.deepcopy(model), every, 4)
        torch.testing.assert_close(kept_all(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
        if windows:  # the effect the tolerance must catch: the teacher without its windows
            unwindowed = copy.deepcopy(model)
            unwindowed.config.sliding_window = 10**6
            moved = (unwindowed(input_ids=ids).logits - model(input_ids=ids).logits).abs().max()
            assert moved > 100 * 1e-4, f"{arch}: removing the window moves the logits by only {moved:.2e}"
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    save_student(student, tok, tmp_path, {"state_size": 4, "kept_heads": [[1, 0]]})
    loaded, _ = load_any(tmp_path)
    with torch.no_grad():
        full = student.to(device_of(loaded))(input_ids=ids.to(device_of(loaded))).logits
        assert torch.equal(loaded(input_ids=ids.to(device_of(loaded))).logits, full)
    logits, caches = prefill(student, ids[:, :-2])
    torch.testing.assert_close(logits[:, -1], full[:, -3], rtol=1e-4, atol=1e-4)
    for t in (ids.shape[1] - 2, ids.shape[1] - 1):
        torch.testing.assert_close(step(student, ids[:, t : t + 1], t, caches)[:, -1], full[:, t], rtol=1e-4, atol=1e-4)
    acts = teacher_activations(model, ids.repeat(2, 1), top_k=4, progress=False)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    targets = {"ids": ids.repeat(2, 1), "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
    distill_logits(student, targets, KD(steps=1, batch=2, lr=1e-3), 0, Watch(progress=False))
    changed = [k for k, v in student.state_dict().items() if not torch.equal(v, before[k])]
    ssm = {id(p) for m in mixers(student) for p in m.ssm_params()}
    trainable = {k for k, p in student.named_parameters() if id(p) in ssm}
    assert changed and set(changed) <= trainable, changed  # only SSM parameters train


def test_every_layer_has_heads_and_windowed_families_declare_their_windows():
    for arch in ARCHS:
        model, _ = tiny_random_model({"arch": arch, "layers": 4, "hidden": 32, "seed": 0})
        sites = head_sites(model)
        assert sorted({s.layer for s in sites}) == [0, 1, 2, 3], arch
        windows = sliding_windows(model.config, 4)
        assert any(windows) == (arch in ("mistral", "qwen2", "gemma2", "gemma3")), arch
        assert DecoderStack(model).packs_choices == all(s.kind == "attention" for s in sites)


def test_the_documented_family_table_is_the_generated_one():
    from pathlib import Path

    from gna.models.families import family_table

    usage = (Path(__file__).resolve().parents[3] / "docs" / "usage.md").read_text()
    assert family_table() in usage


def test_a_tiny_family_a_phase_refuses_must_skip_it_in_the_config():
    from gna.workflow.config import check_families

    def config(**spec):
        return {"models": {"m": {"source": "tiny-random", **spec}}, "hybrid": {"enabled": True}}

    with pytest.raises(ValueError, match=r"models\.m\.skip.*mamba.*skip: \[hybrid\]"):
        check_families(config(arch="mamba", skip=["gna"]))
    with pytest.raises(ValueError, match=r"models\.m\.skip.*G&A maps need attention.*skip: \[gna\]"):
        check_families(config(arch="mamba", skip=["hybrid"]))
    check_families(config(arch="mamba", skip=["hybrid", "gna"]))
    for arch in ("gemma3", "gpt2", "mistral"):  # students for every attention family, windowed or not
        check_families(config(arch=arch))
    check_families(config(arch="llama"))


def test_a_model_whose_read_out_the_engine_does_not_know_is_refused_by_family():
    from gna.engine.anatomy import UnsupportedModel
    from gna.engine.stack import check_engine

    model, tok = tiny_random_model({"arch": "qwen3", "layers": 2, "hidden": 32, "seed": 0})
    check_engine(model)
    model, tok = tiny_random_model({"arch": "qwen3", "layers": 2, "hidden": 32, "seed": 0})
    model.config.final_logit_softcapping = 1e-3  # the engine would cap logits that Qwen3's own head does not
    with pytest.raises(UnsupportedModel, match=r"qwen3 \(Qwen3ForCausalLM\): the engine's log-probs differ"):
        score_table(Scorer(model, tok, progress=False), KV)
