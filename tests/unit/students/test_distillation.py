"""Distillation: the SSM parameters a student trains, aligned heads copied into a student, the
teacher file, alignment and KD on a tiny teacher. (The corpus: test_corpus.py; scoring the
students: test_student_evaluation.py; the ablations: test_recipe.py; the shared `phase` fixture:
conftest.py.)"""

import copy

import polars as pl
import pytest
import torch

from gna.core.io import write_parquet
from gna.core.settings import Files
from gna.core.tensor_files import read_tensors, write_tensors
from gna.engine.precision import frozen_weights_in
from gna.engine.scoring import Scorer, score_table
from gna.students.alignment import (
    Align,
    Realign,
    align_layers,
    first_token_attention,
    head_errors,
    init_from_teacher_maps,
    load_aligned,
    realign_in_context,
)
from gna.students.kd import KD as KDSettings
from gna.students.kd import (
    DistillKD,
    KDBatch,
    Selection,
    Watch,
    answer_weights,
    distill_logits,
    kd_backward,
    kd_loss,
    run_distill_kd,
)
from gna.students.mixer import captured_maps, mixers, restore, snapshot
from gna.students.spec import (
    ablation_kd,
    checkpoint_steps,
    load_any,
    make_hybrid,
    ranked_heads,
    read_spec,
    scored_dict_size,
    scored_tasks,
)
from gna.students.student_evaluation import checkpoint_states
from gna.students.teacher_file import teacher_activations
from gna.tasks.tables import build_kv_retrieval
from unit.students.conftest import kd_outputs
from unit.students.rules import KD


def test_ssm_state_names_every_trained_parameter_once(tiny_llama):
    student = make_hybrid(copy.deepcopy(tiny_llama[0]), [(0, 1)], state_size=4)
    m = mixers(student)[0]
    named = m.ssm_state()
    assert list(named) == [
        "C_proj.weight",
        "B_proj.weight",
        "x_proj.weight",
        "decay_proj.weight",
        "decay_proj.bias",
        "D",
        "local",
        "norm_weight",
        "sink_proj.weight",
        "sink_proj.bias",
    ]  # the tiny Llama has no q/k/v biases
    assert [id(p) for p in m.ssm_params()] == [id(p) for p in named.values()]
    trained = {id(p) for m in mixers(student) for p in m.ssm_params()}
    teacher = {
        id(p) for m in mixers(student) for proj in (m.q_proj, m.k_proj, m.v_proj, m.o_proj) for p in proj.parameters()
    }
    assert not trained & teacher


def test_load_aligned_copies_the_rows_of_each_ssm_head(tiny_llama):
    model = tiny_llama[0]
    pure = make_hybrid(copy.deepcopy(model), [], state_size=4)
    with torch.no_grad():
        for m in mixers(pure):
            for p in m.ssm_params():
                p.normal_()
    aligned = {f"{m.layer_idx}.{k}": v.detach().clone() for m in mixers(pure) for k, v in m.ssm_state().items()}
    hybrid = load_aligned(make_hybrid(copy.deepcopy(model), [(1, 0), (1, 2)], state_size=4), aligned)
    m, source = mixers(hybrid)[1], mixers(pure)[1]
    assert m.ssm_heads == [1, 3]
    n, p = 4, m.head_dim
    torch.testing.assert_close(m.C_proj.weight, torch.cat([source.C_proj.weight[h * n : (h + 1) * n] for h in (1, 3)]))
    torch.testing.assert_close(m.x_proj.weight, torch.cat([source.x_proj.weight[h * p : (h + 1) * p] for h in (1, 3)]))
    torch.testing.assert_close(m.D, source.D[[1, 3]])
    torch.testing.assert_close(m.local, source.local[[1, 3]])
    torch.testing.assert_close(m.norm_weight, source.norm_weight[[1, 3]])
    with pytest.raises(ValueError, match="does not fit"):
        load_aligned(make_hybrid(copy.deepcopy(model), [], state_size=8), aligned)


def test_tensor_files_read_only_the_named_tensors(tmp_path):
    tensors = {"a": torch.arange(6).view(2, 3), "b": torch.ones(2)}
    write_tensors(tensors, str(tmp_path / "t.safetensors"))
    assert set(read_tensors(str(tmp_path / "t.safetensors"))) == {"a", "b"}
    only = read_tensors(str(tmp_path / "t.safetensors"), ["a"])
    assert list(only) == ["a"] and torch.equal(only["a"], tensors["a"])


def test_distillation_writes_the_teacher_file_curves_and_students(phase):
    root, _ = phase
    teacher = read_tensors(str(root / "teacher.safetensors"))
    assert set(teacher) == {"hidden", "top_logp", "top_idx", "train_ids", "train_answers", "heldout_ids"}
    assert teacher["train_ids"].shape == teacher["train_answers"].shape == (6, 32)
    assert teacher["heldout_ids"].shape == (2, 32) and teacher["train_answers"].any()
    # hidden states of the alignment windows only, next-token targets for every training window
    assert teacher["hidden"].shape[:3] == (3, 4, 32) and teacher["top_idx"].shape == (6, 32, 4)
    align = pl.read_parquet(root / "align.parquet")
    assert set(align["state_size"]) == {4} and set(align["model"]) == {"tiny"}
    spec = read_spec(root / "k2")
    assert spec["variant"] == "k2-n4" and spec["kept_ranked"] == [[2, 1], [0, 3]] and spec["teacher"] == "tiny"
    assert sorted(map(tuple, spec["kept_heads"])) == [(0, 3), (2, 1)]
    errors = pl.read_parquet(root / "align-heads.parquet")
    assert len(errors) == 3 * 4 and set(errors["state_size"]) == {4}  # every head of the tiny model is an SSM head
    assert errors["rel_error"].min() >= 0 and errors["teacher_first_token_attention"].is_between(0, 1).all()
    kd = pl.read_parquet(root / "kd2.parquet")
    assert kd["step"].to_list() == [0, 1] and set(kd["heads_kept"]) == {2}
    assert spec["kd_steps"] == 2 and spec["kd_tokens"] == 2 * 2 * 32
    # checkpoints below the full budget, and the full budget where selection chose another step; none for k = 0
    full = [] if spec["chosen_step"] == spec["kd_steps"] else [2]
    assert sorted(checkpoint_states(read_tensors(str(root / "kd2-checkpoints.safetensors")))) == [0, 1, *full]
    assert read_tensors(str(root / "kd0-checkpoints.safetensors")) == {}


def test_ablation_kd_steps_must_be_a_budget_of_the_ablated_students_curve():
    hybrid = {
        "kd": {"steps": 42, "lr": 1e-3},
        "budget_curve": {"variants": ["k10-n16"], "points": 3},
        "ablation": {"variant": "k10-n16", "kd_steps": None},
    }
    assert ablation_kd(hybrid) == {"steps": 42, "lr": 1e-3}
    hybrid["ablation"]["kd_steps"] = 14
    assert ablation_kd(hybrid) == {"steps": 14, "lr": 1e-3}
    hybrid["ablation"]["kd_steps"] = 15
    with pytest.raises(ValueError, match=r"hybrid.ablation.kd_steps.*allowed: 14, 28, 42 or null"):
        ablation_kd(hybrid)
    hybrid["ablation"] = {"variant": "k0-n16", "kd_steps": 14}
    with pytest.raises(ValueError, match="budget curve of k0-n16"):
        ablation_kd(hybrid)


def test_the_state_size_sweep_alone_is_scored_on_retrieval_at_one_dictionary_size():
    hybrid = {"heads_kept": [0, 10], "state_size": 16, "dict_size": 10}
    tasks = ["kv_retrieval", "mmlu_letter"]
    for variant in ("teacher", "k0-n16", "k10-n16"):
        assert scored_tasks(hybrid, variant, tasks) == tasks and scored_dict_size(hybrid, variant) is None
    for variant in ("k0-n4", "k10-n64", "k2-n4"):
        assert scored_tasks(hybrid, variant, tasks) == ["kv_retrieval"] and scored_dict_size(hybrid, variant) == 10
    # knowledge_heads_kept: the heads-kept sweep's other students on KV retrieval only, at every size
    hybrid = {**hybrid, "heads_kept": [0, 2, 10], "knowledge_heads_kept": [0, 10]}
    assert scored_tasks(hybrid, "k2-n16", tasks) == ["kv_retrieval"] and scored_dict_size(hybrid, "k2-n16") is None
    for variant in ("teacher", "k0-n16", "k10-n16"):
        assert scored_tasks(hybrid, variant, tasks) == tasks
    assert scored_tasks({**hybrid, "knowledge_heads_kept": None}, "k2-n16", tasks) == tasks


def test_checkpoint_steps_are_evenly_spaced_from_alignment_to_the_student():
    assert checkpoint_steps(14, 4) == [0, 4, 7, 10, 14]
    assert checkpoint_steps(2, 4) == [0, 1, 2]
    assert checkpoint_steps(0, 3) == [0]


def test_distill_logits_with_unit_weights_is_the_unweighted_loss_and_keeps_snapshots(tiny_llama):
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(2))
    acts = teacher_activations(model, ids, top_k=4, progress=False)
    runs = []
    for weights in (None, answer_weights(torch.zeros(4, 12, dtype=torch.bool), 7.0)):
        student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
        targets = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"], "weights": weights}
        watch = Watch(checkpoints=[0, 2, 3], progress=False)
        curve, saved = distill_logits(student, targets, KDSettings(steps=3, batch=2, lr=1e-3), seed=0, watch=watch)
        runs.append((curve, saved, snapshot(student)))
    assert runs[0][0].equals(runs[1][0])
    curve, saved, final = runs[0]
    assert sorted(saved) == [0, 2, 3] and all(torch.equal(saved[3][k], v) for k, v in final.items())
    assert not all(torch.equal(saved[0][k], v) for k, v in final.items())
    # answer weights change the loss where answers are marked
    marked = torch.zeros(4, 12, dtype=torch.bool)
    marked[:, 5] = True
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    targets = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
    weighted, _ = distill_logits(
        student,
        {**targets, "weights": answer_weights(marked, 7.0)},
        KDSettings(steps=3, batch=2, lr=1e-3),
        seed=0,
        watch=Watch(progress=False),
    )
    assert weighted["loss"][0] != curve["loss"][0]
    # restore puts a snapshot back
    restore(student, saved[0])
    assert all(torch.equal(saved[0][k], v) for k, v in snapshot(student).items())


def test_first_token_attention_equals_the_teachers_attention_maps(tiny_llama):
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    hidden = teacher_activations(model, ids, top_k=2, progress=False)["hidden"].float()
    kept = make_hybrid(copy.deepcopy(model), [(i, h) for i in range(3) for h in range(4)], 4)  # all attention
    with captured_maps(kept) as maps:
        kept(input_ids=ids)
    base = kept.base_model
    for i, (layer, m) in enumerate(zip(base.layers, mixers(kept))):
        u = layer.input_layernorm(hidden[i])
        rope = base.rotary_emb(u, position_ids=torch.arange(12)[None].expand(2, -1))
        torch.testing.assert_close(
            first_token_attention(m, u, rope, [0, 1, 2, 3]), maps[i][:, :, 1:, 0].mean(dim=(0, 2)), atol=1e-3, rtol=1e-3
        )


def test_ssm_heads_start_from_the_teachers_attention_profile(tiny_llama):
    """init_from_teacher_maps against the teacher's own eager attention maps: the sink share is
    its mean attention on the first token, D and the local skip its mean share (beside the first
    token) at offsets 0..3, the decay's mean distance that of its attention further back."""
    model, _ = tiny_llama
    length, start = 24, 8
    ids = torch.randint(0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))
    hidden = teacher_activations(model, ids, top_k=2, progress=False)["hidden"].float()
    attn = model(input_ids=ids, output_attentions=True).attentions  # [layers] of [B, H, L, L]
    pure = make_hybrid(copy.deepcopy(model), [], 4)
    init_from_teacher_maps(mixers(pure), pure.base_model, hidden, torch.arange(length)[None], skip=start)
    for m, probs in zip(mixers(pure), attn):
        rows = probs[:, :, start:].detach()
        first = rows[..., 0]
        share = torch.sigmoid(m.sink_proj.bias)
        torch.testing.assert_close(share, first.mean(dim=(0, 2)).clamp(0.01, 0.99), atol=1e-4, rtol=1e-4)
        for j in range(4):
            at_j = torch.stack([rows[:, :, r, start + r - j] for r in range(length - start)], -1) / (1 - first)
            got = m.D if j == 0 else m.local[:, j - 1]
            torch.testing.assert_close(got, at_j.mean(dim=(0, 2)), atol=1e-4, rtol=1e-4)
        a = torch.exp(-torch.nn.functional.softplus(m.decay_proj.bias))
        assert torch.all((a >= 0.5 - 1e-6) & (a <= 0.999 + 1e-6)) and torch.all(m.decay_proj.weight == 0)


def test_head_errors_are_zero_where_an_ssm_head_reproduces_its_teacher(tiny_llama):
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    hidden = teacher_activations(model, ids, top_k=2, progress=False)["hidden"]
    student = make_hybrid(copy.deepcopy(model), [], 4)
    errors = head_errors(student, hidden)
    assert len(errors) == 12 and (errors["rel_error"] > 0).all()
    # at the first position an SSM head outputs the first token's value, exactly what attention
    # over one token gives
    assert head_errors(student, hidden[:, :, :1])["rel_error"].max() < 1e-10


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("low", [None, torch.bfloat16])
def test_kd_backward_by_slices_gives_the_gradients_of_the_whole_loss(tiny_llama, low, tail):
    """The fast path (output head and loss a few positions at a time, slices that do not divide
    the batch) against its reference: kd_loss on the whole batch's logits, then backward; with the
    tail bin (the teacher's top k as they are, the rest of its mass matched to the student's on
    every other token, by log-sum-exp in the reference) too."""
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (3, 10), generator=torch.Generator().manual_seed(5))
    acts = teacher_activations(model, ids, top_k=6, progress=False)
    target = acts["top_logp"].float().exp() if tail else torch.softmax(acts["top_logp"].float(), -1)
    assert (target.sum(-1) < 0.99).all() or not tail  # the tail bin holds mass
    marked = torch.zeros(3, 10, dtype=torch.bool)
    marked[:, 4] = True
    weights = answer_weights(marked, 5.0)
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    student.requires_grad_(False)
    params = [p for m in mixers(student) for p in m.ssm_params()]
    for p in params:
        p.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low is not None):
        logits = student(input_ids=ids, use_cache=False).logits
    reference = kd_loss(logits, target, acts["top_idx"], weights, tail=tail)
    expected = torch.autograd.grad(reference, params)
    loss = kd_backward(student, KDBatch(ids, target, acts["top_idx"], weights, tail), low, head_rows=7)
    got = [p.grad for p in params]
    assert loss == pytest.approx(reference.item(), rel=1e-5)
    for g, e in zip(got, expected):
        if low is not None and tail:
            # the two write the tail's gradient in different float32 operations, and the
            # logits' gradient is rounded to bf16 before the decoder (measured: 0.9% of the largest)
            assert (g - e).abs().max() <= 2**-5 * e.abs().max(), float((g - e).abs().max() / e.abs().max())
        else:
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    assert any(e.abs().max() > 0 for e in expected)


def test_heads_gathered_in_the_autocast_dtype_give_the_float32_buffers_gradients(tiny_llama, monkeypatch):
    """Under bf16 autocast a mixer gathers its heads in bf16 (what o_proj multiplies in); its
    reference, a float32 buffer that o_proj casts, gives the same loss and gradients bit for bit."""
    from gna.students import mixer as mixer_module

    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(8))
    student = make_hybrid(copy.deepcopy(model), [(1, 0), (2, 1)], 4)
    student.requires_grad_(False)
    params = [p for m in mixers(student) for p in m.ssm_params()]
    for p in params:
        p.requires_grad_(True)

    seen = []
    mixers(student)[1].o_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = student(input_ids=ids, use_cache=False).logits.float().square().mean()
        return [loss.detach()] + list(torch.autograd.grad(loss, params))

    with frozen_weights_in(student, torch.bfloat16):
        fast = step()
        monkeypatch.setattr(mixer_module, "_matmul_dtype", lambda x: x.dtype)
        reference = step()
    assert seen == [torch.bfloat16, torch.float32]  # the two paths differ
    assert all(torch.equal(f, r) for f, r in zip(fast, reference))
    assert any(g.abs().max() > 0 for g in reference[1:])


def test_bf16_distillation_step_agrees_with_the_float32_reference(tiny_llama):
    """The real KD step (distill_logits: frozen_weights_in, then kd_backward under bf16 autocast)
    against the float32 reference computed apart from it (the student's own forward, kd_loss on
    the whole batch with answer weights, autograd): the loss the step reports and the gradient it
    applies (captured on the trained parameters during the step) equal the reference to float32
    rounding in float32 and to bf16 rounding in bf16; during the bf16 step the frozen linear
    weights are held in bf16, the trained ones and the output head in float32."""
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))
    acts = teacher_activations(model, ids, top_k=8, progress=False)
    marked = torch.zeros(4, 16, dtype=torch.bool)
    marked[:, 5::4] = True
    weights = answer_weights(marked, 5.0)

    def trained(student):
        return [p for m in mixers(student) for p in m.ssm_params() if p.numel()]

    reference = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    reference.requires_grad_(False)
    for p in trained(reference):
        p.requires_grad_(True)
    ref_loss = kd_loss(
        reference(input_ids=ids, use_cache=False).logits,
        torch.softmax(acts["top_logp"].float(), -1),
        acts["top_idx"],
        weights,
    )
    ref_grad = torch.cat([g.flatten() for g in torch.autograd.grad(ref_loss, trained(reference))])
    ref_loss = ref_loss.item()
    steps = {}
    for compute_dtype in ("float32", "bfloat16"):
        student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
        params, grads, dtypes = trained(student), {}, set()
        for i, p in enumerate(params):  # the gradient the step computes, before clipping
            p.register_hook(lambda g, i=i, grads=grads: grads.__setitem__(i, g.detach().float().clone()))
        m, head = mixers(student)[1], student.get_output_embeddings()
        student.base_model.layers[0].mlp.up_proj.register_forward_pre_hook(
            lambda module, args, m=m, head=head, dtypes=dtypes: dtypes.add(
                (module.weight.dtype, m.C_proj.weight.dtype, head.weight.dtype)
            )
        )
        curve, _ = distill_logits(
            student,
            {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"], "weights": weights},
            KDSettings(steps=1, batch=4, lr=0.0, compute_dtype=compute_dtype),
            seed=0,
            watch=Watch(progress=False),
        )  # lr 0: one step over the whole batch
        assert sorted(grads) == list(range(len(params))), "the step's backward did not reach every trained parameter"
        steps[compute_dtype] = (curve["loss"][0], torch.cat([grads[i].flatten() for i in range(len(params))]), dtypes)
    f32, bf16 = torch.float32, torch.bfloat16
    for compute_dtype, held in (("float32", {(f32, f32, f32)}), ("bfloat16", {(bf16, f32, f32)})):
        seen = steps[compute_dtype][2]
        assert seen == held, f"{compute_dtype} step: (frozen, trained, output head) weights in {seen}, not {held}"
    # measured here: float32 loss exact, gradient 2.5e-7 of its norm; bf16 loss 1e-5..5e-5
    # relative, gradient ~1e-2 of its norm. Ignoring the answer weights moves the gradient by
    # ~0.55 of its norm (the loss by only ~0.2%)
    for compute_dtype, loss_rtol, grad_rtol in (("float32", 1e-5, 1e-4), ("bfloat16", 5e-4, 0.05)):
        loss, grad, _ = steps[compute_dtype]
        assert abs(loss - ref_loss) <= loss_rtol * abs(ref_loss), (compute_dtype, loss, ref_loss)
        err = ((grad - ref_grad).norm() / ref_grad.norm()).item()
        assert err <= grad_rtol, (compute_dtype, err)
    assert steps["bfloat16"][0] != steps["float32"][0]  # the bf16 step took the bf16 path
    assert ref_grad.abs().max() > 0


def test_on_a_cpu_without_bf16_instructions_a_bf16_kd_step_is_the_float32_one(tiny_llama, monkeypatch):
    """There bf16 autocast would run emulated: the step asked in bf16 runs in float32 (the same loss,
    bit for bit), where a CPU with bf16 instructions runs it in bf16 (another loss)."""
    from gna.engine import precision
    from gna.students import kd

    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    acts = teacher_activations(model, ids, top_k=8, progress=False)
    monkeypatch.setattr(kd, "training_dtype", precision.training_dtype)  # the pipeline's, not the fixture's

    def loss(compute_dtype: str, lacks_bf16: bool) -> float:
        monkeypatch.setattr(precision, "cpu_lacks_bf16", lambda: lacks_bf16)
        student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
        batch = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
        settings = KDSettings(steps=1, batch=2, lr=0.0, compute_dtype=compute_dtype)
        return distill_logits(student, batch, settings, seed=0, watch=Watch(progress=False))[0]["loss"][0]

    assert loss("bfloat16", lacks_bf16=True) == loss("float32", lacks_bf16=True)
    assert loss("bfloat16", lacks_bf16=False) != loss("float32", lacks_bf16=False)


def test_frozen_weights_are_held_in_bf16_during_distillation_and_restored_exactly(tiny_llama):
    """Only frozen linear weights change dtype inside the block (trained SSM weights and the
    output head tied to the embeddings stay float32), and every weight is back bit for bit."""
    student = make_hybrid(copy.deepcopy(tiny_llama[0]), [(1, 0)], 4)
    m = mixers(student)[1]
    student.requires_grad_(False)
    m.C_proj.weight.requires_grad_(True)
    before = {name: p.detach().clone() for name, p in student.named_parameters()}
    with frozen_weights_in(student, torch.bfloat16):
        assert m.q_proj.weight.dtype == torch.bfloat16 and m.C_proj.weight.dtype == torch.float32
        assert student.get_output_embeddings().weight.dtype == torch.float32
        assert student.base_model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    for name, p in student.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name


def test_bf16_alignment_agrees_with_the_float32_reference(tiny_llama):
    """Alignment's fast path (bf16 autocast for the SSM heads) against float32: the same
    relative error per layer to bf16 precision at the first step and after a few steps."""
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(5))
    hidden = teacher_activations(model, ids, top_k=4, progress=False)["hidden"]
    curves = [
        align_layers(model, hidden, 4, Align(steps=5, batch=2, lr=1e-3, compute_dtype=dtype), 0, False)[1]
        for dtype in ("float32", "bfloat16")
    ]
    for step in (0, 4):
        ref, fast = (c.filter(pl.col("step") == step)["loss"].to_numpy() for c in curves)
        assert abs(fast - ref).max() < 0.03 * abs(ref).max() + 1e-3


def test_a_bfloat16_teacher_gets_float32_ssm_heads_that_align_distil_score_and_decode(tiny_llama):
    """The paper config's dtype: beside a bf16 teacher the SSM parameters stay float32 (they are
    trained), the teacher's states are promoted for them and the heads cast back."""
    from gna.engine.scoring import score_table
    from gna.students.decoding import measured_cache
    from gna.tasks.tables import build_kv_retrieval

    model = copy.deepcopy(tiny_llama[0]).to(torch.bfloat16)
    tok = tiny_llama[1]
    ids = torch.randint(0, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(4))
    acts = teacher_activations(model, ids, top_k=4, progress=False)
    state, align_curve = align_layers(model, acts["hidden"], 4, Align(steps=2, batch=2, lr=1e-2), 0, progress=False)
    student = load_aligned(make_hybrid(copy.deepcopy(model), [(1, 0)], 4), state)
    m = mixers(student)[1]
    assert m.x_proj.weight.dtype == torch.float32 and m.q_proj.weight.dtype == torch.bfloat16
    targets = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
    curve, _ = distill_logits(
        student, targets, KDSettings(steps=2, batch=2, lr=1e-3), seed=0, watch=Watch(progress=False)
    )
    assert align_curve["loss"].is_finite().all() and curve["loss"].is_finite().all()
    scores = score_table(Scorer(student, tok, progress=False), build_kv_retrieval([3], 2, 0, "lookup"))
    assert scores["logprobs"].explode().is_finite().all()
    assert measured_cache(student, 12) > 0


def test_teacher_states_past_float16_are_kept_in_float32_and_align(tiny_llama):
    """A teacher whose residual stream outgrows float16 (Gemma 3's reaches 1e5) keeps its states in
    float32, and alignment stays finite; one whose states fit keeps them in float16."""
    model = copy.deepcopy(tiny_llama[0])
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    assert teacher_activations(model, ids, top_k=4, progress=False)["hidden"].dtype == torch.float16
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1e7)
    hidden = teacher_activations(model, ids, top_k=4, progress=False)["hidden"]
    assert hidden.dtype == torch.float32 and hidden.abs().max() > torch.finfo(torch.float16).max
    _, curve = align_layers(model, hidden, 4, Align(steps=2, batch=2, lr=1e-3), 0, progress=False)
    assert curve["loss"].is_finite().all()


def test_the_distillation_stages_count_their_layer_tokens(tiny_llama):
    """The run record's work counts (gna.core.work) of the three distillation stages: the
    teacher's forward over every window, each alignment step's batch through every layer (its
    FLOPs those of the SSM projections alone, forward and backward: the teacher's q/k/v/o do not
    run in a step), each KD step's batch through the student's decoder."""
    from gna.core import work

    model, _ = tiny_llama
    n, length, layers = 4, 12, model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(3))
    work.reset()
    acts = teacher_activations(model, ids, top_k=4, batch=3, progress=False)
    assert work.layer_tokens() == n * length * layers
    work.reset()
    align_layers(model, acts["hidden"], 4, Align(steps=3, batch=2, lr=1e-3), 0, False)
    assert work.layer_tokens() == 3 * 2 * length * layers
    ssm = mixers(make_hybrid(copy.deepcopy(model), [], 4))
    per_token = sum(2 * p.weight.numel() for m in ssm for p in m.ssm_projections)
    assert per_token < sum(2 * p.weight.numel() for m in ssm for p in m.modules() if isinstance(p, torch.nn.Linear))
    assert work.useful_flops() == work.TRAINING * 3 * 2 * length * per_token
    work.reset()
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    targets = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"], "weights": None}
    distill_logits(student, targets, KDSettings(steps=5, batch=2, lr=1e-3), seed=0, watch=Watch(progress=False))
    assert work.layer_tokens() == 5 * 2 * length * layers
    work.reset()


def test_checkpoint_selection_writes_the_best_step_where_the_last_is_worse(phase, tiny_llama, tmp_path):
    """The validation prompts are built so that the aligned student (step 0) answers every one
    (each target is its own prediction); KD at a learning rate that wrecks it follows. Selection
    must write the step-0 student, say so in its spec and curve, keep the last step for the budget
    curve, and report how far KD moved each parameter."""
    root, p = phase
    _, tok = tiny_llama
    candidates = build_kv_retrieval([3, 5], 20, seed=11, template="lookup")
    teacher, _ = load_any(p["teacher"], "float32")
    aligned = load_aligned(
        make_hybrid(teacher, ranked_heads(pl.read_parquet(p["ranking.parquet"]), 2), 4),
        read_tensors(str(root / "align.safetensors")),
    )
    preds = score_table(Scorer(aligned, tok, batch_size=4, progress=False), candidates)["pred"]
    table = candidates.with_columns(preds.alias("target"))
    write_parquet(table, tmp_path / "validation.parquet")
    outputs = kd_outputs(tmp_path, "kd", student=tmp_path / "student")
    inputs = Files(
        model=p["teacher"],
        teacher=str(root / "teacher.safetensors"),
        aligned=str(root / "align.safetensors"),
        ranking=p["ranking.parquet"],
        validation=str(tmp_path / "validation.parquet"),
    )
    settings = {
        "model": "tiny",
        "variant": "k2-n4",
        "kd": {**KD, "steps": 4, "lr": 3.0},
        "checkpoints": [0, 2, 4],
        "seed": 1,
        "select": {"by": "validation", "every": 2, "batch_size": 4},
    }
    run_distill_kd(inputs, outputs, DistillKD.of(settings))
    points = pl.read_parquet(outputs.validation_curve).sort("after_steps")
    assert points["after_steps"].to_list() == [0, 2, 4]
    assert points["accuracy"][0] == 1.0
    if points["p_vs_last"][0] >= 0.05:
        pytest.fail(f"the wrecking KD did not make the last step worse by the paired test: {points}")
    assert points.filter(pl.col("chosen"))["after_steps"].to_list() == [0]
    spec = read_spec(tmp_path / "student")
    assert spec["chosen_step"] == 0 and spec["kd_steps"] == 4 and spec["select"] == "validation"
    student, _ = load_any(tmp_path / "student", "float32")
    assert all(
        torch.equal(v, aligned_v) for v, aligned_v in zip(snapshot(student).values(), snapshot(aligned).values())
    )
    # the last step stays available to the budget curve, whose student point is the chosen step
    assert sorted(checkpoint_states(read_tensors(outputs.checkpoints))) == [0, 2, 4]
    # without budget checkpoints the last step's changes are still the last step's, not the chosen one's
    bare = kd_outputs(tmp_path, "bare", student=tmp_path / "bare-student")
    run_distill_kd(inputs, bare, DistillKD.of({**settings, "checkpoints": []}))
    assert read_tensors(bare.checkpoints) == {}
    assert pl.read_parquet(bare.changes).equals(pl.read_parquet(outputs.changes))
    changes = pl.read_parquet(outputs.changes)
    assert (changes["abs_change_chosen"] == 0).all() and (
        changes.group_by("param").agg(pl.col("abs_change_last").sum())["abs_change_last"] > 0
    ).any()
    curve = pl.read_parquet(outputs.curve)
    assert {"loss_answer", "loss_other", "grad_norm", "lr"} <= set(curve.columns) and (curve["grad_norm"] > 0).all()


def test_selection_by_last_keeps_the_last_step_and_scores_nothing(phase):
    root, _ = phase
    spec = read_spec(root / "k0")
    assert spec["chosen_step"] == spec["kd_steps"] and spec["select"] == "last"
    assert pl.read_parquet(root / "kd0-validation.parquet").is_empty()
    chosen = pl.read_parquet(root / "kd2-validation.parquet").filter(pl.col("chosen"))
    assert len(chosen) == 1 and read_spec(root / "k2")["chosen_step"] == chosen["after_steps"][0]


def _selected(curves: list[list[bool]]) -> Selection:
    scores = iter(curves)
    select = Selection(lambda _: (next(scores), 0.0), every=1)
    for step in range(len(curves)):
        select.record(None, step)
    select.finish(len(curves) - 1)
    return select


def test_selection_keeps_the_last_step_unless_the_items_show_an_earlier_one_better():
    """A point better by one item of 50 (one-sided exact McNemar p = 0.5) or tied keeps the most
    trained student; one better by ten items (none the other way: p = 0.001) replaces it."""
    last = [True] * 40 + [False] * 10
    one_more = _selected([last, [True] * 41 + [False] * 9, last])
    assert one_more.chosen == 2 and one_more.rows[1]["p_vs_last"] == 0.5 and one_more.rows[2]["p_vs_last"] is None
    assert _selected([[True] * 50, last]).chosen == 0
    tied = _selected([last, last])
    assert tied.chosen == 1 and tied.rows[0]["p_vs_last"] == 1.0


@pytest.mark.parametrize("k", [3, 11, 573])
def test_selection_among_equally_good_checkpoints_replaces_the_last_at_most_five_percent_of_the_time(k):
    """K checkpoints equally good on 50 validation prompts (each answers each prompt right with
    probability 0.8, independently): the best of K - 1 candidates against the last, Holm-corrected,
    replaces it in at most 5% of 400 seeded runs (the uncorrected rule: 8% at K = 11, 19-25% at 58)."""
    import gc

    import numpy as np

    rng = np.random.default_rng(k)
    runs = 400 if k < 100 else 60
    gc.freeze()  # statsmodels' Holm runs gc.collect() on every call: over the test process's objects, 0.2 s each
    try:
        replaced = sum(_selected((rng.random((k, 50)) < 0.8).tolist()).chosen != k - 1 for _ in range(runs))
    finally:
        gc.unfreeze()
    # a binomial count over `runs` at 5% stays under this bound 99% of the time
    assert replaced / runs <= 0.05 + 2.4 * (0.05 * 0.95 / runs) ** 0.5, replaced


def test_realignment_fits_each_layer_on_the_students_own_stream(tiny_llama):
    """realign_in_context: each layer's error before and after is measured on the stream the
    student's own forward makes (checked against the hidden states its forward produces after the
    stage, which a fit on the teacher's stream would not match), falls in every layer, and only SSM
    parameters move; 0 steps changes nothing."""
    from gna.students.alignment import _output_metric, realign_in_context
    from gna.students.mixer import layers_of, mixer_input, rotary

    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(5))
    theirs = teacher_activations(model, ids, top_k=2, progress=False)["hidden"].float()
    aligned, _ = align_layers(model, theirs, 4, Align(steps=3, batch=2, lr=1e-2), 0, False)
    student = load_aligned(make_hybrid(copy.deepcopy(model), [(1, 0), (2, 1)], 4), aligned)
    frozen = {k: v.clone() for k, v in student.state_dict().items()}
    trained = [q for m in mixers(student) for q in m.ssm_params()]
    ssm_keys = {name for name, p in student.named_parameters() if any(p is q for q in trained)}

    none = realign_in_context(student, theirs, Realign(steps=0, lr=1e-2), seed=0, progress=False)
    assert none.is_empty() and all(torch.equal(v, student.state_dict()[k]) for k, v in frozen.items())

    errors = realign_in_context(student, theirs, Realign(steps=30, batch=2, lr=1e-2), seed=0, progress=False)
    assert errors["layer"].to_list() == list(range(model.config.num_hidden_layers))
    assert (errors["error_after"] < errors["error_before"]).all()
    after = student.state_dict()
    moved = {k for k, v in frozen.items() if not torch.equal(v, after[k])}
    assert moved and moved <= ssm_keys

    # the stream it fitted on is the student's own forward (identical to the teacher's at layer 0 only)
    own = teacher_activations(student, ids, top_k=2, progress=False)["hidden"].float()
    assert torch.equal(own[0], theirs[0]) and not torch.allclose(own[1], theirs[1])
    base, pos = student.base_model, torch.arange(ids.shape[1])[None].expand(len(ids), -1)
    for i, (layer, m) in enumerate(zip(layers_of(student), mixers(student))):
        metric = _output_metric(m)[m.ssm_heads]
        u, t = mixer_input(layer, own[i]), mixer_input(layer, theirs[i])
        theirs_out = m.attention_output(t, rotary(base, t, pos, i), None, m.ssm_heads)
        target = torch.einsum("blhp,hpq->blhq", theirs_out, metric)
        with torch.no_grad():
            pred = torch.einsum("blhp,hpq->blhq", m.ssm_output(u, None), metric)
            on_theirs = torch.einsum("blhp,hpq->blhq", m.ssm_output(t, None), metric)
        err = float((pred - target).square().sum() / target.square().sum())
        assert err == pytest.approx(errors["error_after"][i], rel=1e-3)
        if i > 0:  # measured on the teacher's stream it would read otherwise
            err_theirs = float((on_theirs - target).square().sum() / target.square().sum())
            assert err_theirs != pytest.approx(errors["error_after"][i], rel=1e-2)


def test_realignment_runs_on_the_first_windows_it_is_given(tiny_llama):
    """realign.windows: the stage sees the first `windows` windows only (the same fit as on those
    windows alone), and fewer windows fit otherwise than all."""
    from gna.students.alignment import realign_in_context

    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(5))
    theirs = teacher_activations(model, ids, top_k=2, progress=False)["hidden"].float()
    aligned, _ = align_layers(model, theirs, 4, Align(steps=3, batch=2, lr=1e-2), 0, False)
    realign = {"steps": 5, "batch": 2, "lr": 1e-2}

    def realigned(hidden, **extra):
        student = load_aligned(make_hybrid(copy.deepcopy(model), [(1, 0)], 4), aligned)
        realign_in_context(student, hidden, Realign(**realign, **extra), seed=0, progress=False)
        return student.state_dict()

    first_two, alone, every = realigned(theirs, windows=2), realigned(theirs[:, :2]), realigned(theirs)
    assert all(torch.equal(v, alone[k]) for k, v in first_two.items())
    assert any(not torch.equal(v, every[k]) for k, v in first_two.items())


def test_warmup_steps_are_a_share_of_the_stage_at_least_one():
    from gna.students.alignment import lr_schedule, warmup_steps

    assert [warmup_steps(s, 0.1) for s in (0, 9, 10, 14, 30, 80)] == [1, 1, 1, 1, 3, 8]  # the old a-tenth rule
    assert warmup_steps(14, 0.3) == 4 and warmup_steps(10, 0.0) == 1
    assert [lr_schedule(s, 14, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="warmup: 1.5 is not a share"):
        warmup_steps(10, 1.5)


def test_kd_warmup_keeps_a_step_0_solution_that_a_full_rate_first_step_destroys(tiny_llama):
    """The student starts next to the solution: its targets are its own next-token distribution over
    the whole vocabulary, taken before its weights moved by 1e-6, so its loss is near the minimum and
    the gradient is small but real (far above Adam's eps and the kernels' rounding, so its sign, and
    this test, are the same on every CPU kind; at the solution itself the step-0 gradient would be
    rounding noise). Adam's first update still moves every weight by about the learning rate, a
    hundred times the distance, so a full-rate first step (warmup 0: one step) raises the loss;
    warming up over half the steps (first step at a fifth of the rate) overshoots a fifth as far."""
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(3))
    solution = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    own = teacher_activations(solution, ids, top_k=model.config.vocab_size, progress=False)
    targets = {"ids": ids, "top_logp": own["top_logp"], "top_idx": own["top_idx"]}
    student0 = copy.deepcopy(solution)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in student0.parameters():
            if p.requires_grad:
                p.add_(1e-6 * torch.randn(p.shape, generator=gen))
    rises, curves = {}, {}
    for warmup in (0.0, 0.5):
        student = copy.deepcopy(student0)
        kd = KDSettings(steps=10, batch=4, lr=1e-4, warmup=warmup)
        curve, _ = distill_logits(student, targets, kd, seed=0, watch=Watch(progress=False))
        rises[warmup], curves[warmup] = curve["loss"][1] - curve["loss"][0], curve
    assert curves[0.0]["lr"][0] == pytest.approx(1e-4) and curves[0.5]["lr"][0] == pytest.approx(2e-5)
    # a real gradient: 0.028 measured, linear in the nudge (0.28 at 1e-5); below 1e-5 without it
    assert curves[0.0]["grad_norm"][0] > 1e-3
    assert rises[0.0] > 1e-3  # the full-rate first step leaves the solution (measured: 0.0057)
    assert rises[0.5] < rises[0.0] / 4  # measured: 0.0006, a ninth


def test_the_tail_bin_is_the_cross_entropy_over_top_k_and_the_rest():
    """kd_loss with the tail bin equals the cross-entropy of the (k+1)-bin distributions written
    out: the teacher's top-k probabilities and its remaining mass against the student's
    probabilities there and its mass on every other token; without it, the renormalised target."""
    from gna.students.kd import _TopKCrossEntropy

    gen = torch.Generator().manual_seed(0)
    logits, teacher = torch.randn(5, 40, generator=gen), torch.randn(5, 40, generator=gen).log_softmax(-1)
    top_logp, top_idx = teacher.topk(6, dim=-1)
    p = logits.softmax(-1)
    inside = p.gather(-1, top_idx)
    target = top_logp.exp()
    written = -(target * inside.log()).sum(-1) - (1 - target.sum(-1)) * (1 - inside.sum(-1)).log()
    torch.testing.assert_close(kd_loss(logits, target, top_idx, tail=True), written.mean())
    fast = _TopKCrossEntropy.apply(logits.clone().requires_grad_(True), target, top_idx, True)
    torch.testing.assert_close(fast, written, rtol=1e-5, atol=1e-6)
    assert kd_loss(logits, target, top_idx, tail=True) > kd_loss(logits, target, top_idx)


def _first_kd_gradient(teacher, ids, realign: bool) -> float:
    """The smoke recipe's chain on `teacher` (alignment, realignment where asked, KD): the gradient norm
    of the first KD step of its pure-SSM student with state 8 (k0-n8)."""
    acts = teacher_activations(teacher, ids, top_k=8, hidden_windows=4, progress=False)  # the smoke's align_windows
    aligned, _ = align_layers(teacher, acts["hidden"], 8, Align(steps=4, batch=2, lr=5e-3), seed=0, progress=False)
    student = load_aligned(make_hybrid(copy.deepcopy(teacher), [], 8), aligned)
    if realign:
        realign_in_context(student, acts["hidden"], Realign(steps=2, batch=2), seed=0, progress=False)
    targets = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
    kd = KDSettings(steps=1, batch=2, lr=1e-3)
    curve, _ = distill_logits(student, targets, kd, seed=0, watch=Watch(progress=False))
    return curve["grad_norm"][0]


@pytest.mark.slow
def test_one_ulp_of_the_teacher_moves_a_realigned_students_first_kd_step_beyond_the_cpu_tolerance():
    """Why a student's numbers from another device are judged by a recorded spread (tests/golden.py,
    DEVICE_SPREAD) and not by the 1e-3 that has held between CPU kinds: on a stand-in close to the
    smoke (a tiny llama 4 x 64, 8 windows of 64 tokens, 4 of them aligned on, k0-n8), the teacher's
    embeddings moved by one ulp, as another summation order moves them, move the first KD gradient
    norm by less than 1e-3 after alignment alone (measured: 7e-5 and 1e-4 for teacher seeds 0 and 1)
    and by more after alignment and realignment (0.5% and 1.2%): the chain amplifies rounding (the
    teacher's hidden states are stored in float16, where a float32 ulp now and then flips a float16
    one), and a device's float32 sums differ in order from a CPU's."""
    from gna.models.tiny import tiny_random_model

    teacher, _ = tiny_random_model({"arch": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "seed": 0})
    teacher.requires_grad_(False)
    ids = torch.randint(0, teacher.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0))
    nudged = copy.deepcopy(teacher)
    with torch.no_grad():
        weight = nudged.get_input_embeddings().weight
        weight.copy_(torch.nextafter(weight, torch.full_like(weight, float("inf"))))
    moved = {}
    for realign in (False, True):
        base = _first_kd_gradient(teacher, ids, realign)
        moved[realign] = abs(_first_kd_gradient(nudged, ids, realign) - base) / base
    assert moved[False] < 1e-3 < moved[True], f"relative moves of the first KD gradient norm: {moved}"
