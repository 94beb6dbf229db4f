"""Distillation: the corpus, the SSM parameters a student trains, aligned heads copied into a
student, and the hybrid phase's rule functions chained on a tiny teacher."""

import copy
import json
import logging

import polars as pl
import pytest
import torch
from conftest import MINI_MMLU

from gna.core.io import write_parquet
from gna.core.settings import Evaluation, Files, StudentScoring
from gna.core.tensor_files import read_tensors, write_tensors
from gna.engine.chance import ChancePolicy, chance_accuracy
from gna.engine.device import device_of
from gna.engine.precision import frozen_weights_in
from gna.models.prepare import load_model
from gna.students.corpus import (
    answer_tokens,
    answered_kv,
    check_no_evaluation_items,
    corpus_kv_seed,
    run_corpus_check,
    split_pool,
    token_windows,
)
from gna.students.distill import (
    align_layers,
    answer_weights,
    distill_logits,
    first_token_attention,
    head_errors,
    init_from_teacher_maps,
    kd_backward,
    kd_loss,
    load_aligned,
    restore,
    run_distill_align,
    run_distill_kd,
    run_distill_teacher,
    snapshot,
    teacher_activations,
)
from gna.students.mixer import captured_maps, mixers
from gna.students.recipe import ablated_student, run_hybrid_ablation
from gna.students.spec import (
    ablation_kd,
    checkpoint_steps,
    load_any,
    make_hybrid,
    read_spec,
    scored_dict_size,
    scored_tasks,
)
from gna.students.student_evaluation import (
    budget_point_from_scores,
    checkpoint_states,
    label_variant,
    run_hybrid_budget,
    run_hybrid_score,
    run_hybrid_swap,
    swap_label,
)
from gna.students.student_masking import run_hybrid_answer_rows
from gna.tasks.tables import build_kv_retrieval, load_task_tables

CORPUS = {
    "seq_len": 32,
    "train_windows": 6,
    "align_windows": 4,
    "heldout_windows": 2,
    "kv_sizes": [3, 5],
    "kv_share": 0.5,
    "heldout_share": 0.2,
}
KD = {"steps": 2, "batch": 2, "lr": 1e-3, "answer_weight": 5, "compute_dtype": "bfloat16"}


ON = ChancePolicy(skip=True)  # the default config's policy


# the rules' functions with their files and scoring settings given as keywords (the scripts pass
# Snakemake's input/output and the rule's StudentScoring)
def _scoring(max_items=None, degeneracy_items=None, evaluation=Evaluation(), chance=ON, dict_size=None):
    return StudentScoring(max_items, degeneracy_items, dict_size, chance, evaluation)


def score(
    model_name,
    variant,
    model_dir,
    teacher,
    tasks,
    summary,
    answers,
    *,
    baseline_paths=(),
    teacher_summary_path=None,
    kv_dict_size=None,
    degeneracy_dict_size=None,
    **scoring,
):
    inputs = Files(
        model=model_dir,
        teacher=teacher,
        tasks=tasks,
        baseline=list(baseline_paths),
        teacher_summary=teacher_summary_path,
    )
    return run_hybrid_score(
        model_name,
        variant,
        inputs,
        Files(summary=summary, answers=answers),
        _scoring(dict_size=degeneracy_dict_size, **scoring),
        kv_dict_size,
    )


def swap_layer(
    model_name, variant, model_dir, ranking, teacher, tasks, summary, answers, *, teacher_summary_path=None, **scoring
):
    inputs = Files(model=model_dir, ranking=ranking, teacher=teacher, tasks=tasks, teacher_summary=teacher_summary_path)
    return run_hybrid_swap(model_name, variant, inputs, Files(summary=summary, answers=answers), _scoring(**scoring))


def answer_rows(
    model_name,
    variant,
    model_dir,
    tasks,
    out,
    *,
    teacher_summary_path=None,
    answers_path=None,
    **scoring,
):
    inputs = Files(model=model_dir, tasks=tasks, teacher_summary=teacher_summary_path, answers=answers_path)
    return run_hybrid_answer_rows(model_name, variant, inputs, out, _scoring(**scoring))


def budget(
    model_name,
    variant,
    model_dir,
    checkpoints,
    teacher,
    task,
    out,
    *,
    dict_size,
    summary_path=None,
    answers_path=None,
    **scoring,
):
    inputs = Files(
        model=model_dir, checkpoints=checkpoints, teacher=teacher, task=task, summary=summary_path, answers=answers_path
    )
    return run_hybrid_budget(model_name, variant, inputs, out, _scoring(dict_size=dict_size, **scoring))


def ablation(
    model_name,
    which,
    variant,
    model_dir,
    teacher,
    aligned,
    ranking,
    task,
    out,
    *,
    align,
    kd,
    align_windows,
    seed,
    dict_size,
    **scoring,
):
    inputs = Files(model=model_dir, teacher=teacher, aligned=aligned, ranking=ranking, task=task)
    recipe = {"align": align, "kd": kd, "align_windows": align_windows, "seed": seed}
    return run_hybrid_ablation(
        model_name, which, variant, inputs, out, recipe, _scoring(dict_size=dict_size, **scoring)
    )


def test_split_pool_holds_out_the_first_share():
    pool = pl.DataFrame({"q": list(range(10))})
    train, held = split_pool(pool, 0.2)
    assert held["q"].to_list() == [0, 1] and train["q"].to_list() == list(range(2, 10))


def test_token_windows_are_seeded_and_refuse_a_small_corpus(tiny_llama):
    _, tok = tiny_llama
    docs, kv = [(f"question {i} answer:", " B") for i in range(20)], [(f"k{i}:v{i}\nk{i}:", f"v{i}") for i in range(20)]
    a, answers = token_windows(tok, docs, kv, 0.5, 16, 5, seed=1)
    assert a.shape == answers.shape == (5, 16) and answers.dtype == torch.bool
    again = token_windows(tok, docs, kv, 0.5, 16, 5, seed=1)
    assert torch.equal(a, again[0]) and torch.equal(answers, again[1])
    assert not torch.equal(a, token_windows(tok, docs, kv, 0.5, 16, 5, seed=2)[0])
    with pytest.raises(ValueError, match="corpus too small"):
        token_windows(tok, docs[:1], [], 0.5, 16, 5, seed=1)


def test_answer_mask_marks_the_positions_that_predict_an_answer_token(tiny_llama):
    _, tok = tiny_llama
    context, answer = "question one answer:", " B"
    ids, is_answer = answer_tokens(tok, context, answer)
    assert ids == tok(context + answer, add_special_tokens=False)["input_ids"]
    n_answer = sum(is_answer)
    assert n_answer >= 1 and is_answer[-n_answer:] == [True] * n_answer and not any(is_answer[:-n_answer])
    windows, predicts = token_windows(tok, [(context, answer)] * 40, [], 0.0, 8, 4, seed=0)
    stream, marks = windows.flatten().tolist(), predicts.flatten().tolist()
    doc = len(ids) + 1  # the document and its EOS separator
    for t in range(len(stream) - 1):
        assert marks[t] == (
            t % doc in range(len(ids) - 1 - n_answer, len(ids) - 1)
        )  # the next token is an answer token


def test_corpus_kv_prompts_never_come_from_an_evaluation_seed():
    evaluation = set(build_kv_retrieval([3, 5], 20, seed=7, template="lookup")["context"])
    corpus = {c for c, _ in answered_kv([3, 5], 40, corpus_kv_seed("train", 7), "lookup")}
    assert corpus and not corpus & evaluation
    assert corpus_kv_seed("train", 7) != corpus_kv_seed("heldout", 7)


def test_a_corpus_holding_an_evaluation_item_is_refused(tmp_path):
    """The corpus check: a KV prompt of the corpus among the evaluation items (here made so on
    purpose) stops it, naming the split; disjoint items pass and are counted."""
    config = {
        "heldout_share": 0.5,
        "train_windows": 2,
        "heldout_windows": 1,
        "seq_len": 16,
        "kv_share": 1.0,
        "kv_sizes": [3],
    }
    mmlu = {"n": 4, "seed": 0, "topics": []}
    clean = build_kv_retrieval([3], 4, seed=0, template="lookup")
    write_parquet(clean, tmp_path / "kv.parquet")
    counts = run_corpus_check(
        str(MINI_MMLU), str(tmp_path / "kv.parquet"), str(tmp_path / "check.json"), config, 0, mmlu, "lookup"
    )
    assert counts["evaluation_kv_prompts"] == 4 and counts["train_kv_prompts"] > 0
    assert json.loads((tmp_path / "check.json").read_text())["leaked"] == 0
    corpus_prompt = answered_kv([3], 2, corpus_kv_seed("train", 0), "lookup")[0][0]
    write_parquet(clean.with_columns(pl.lit(corpus_prompt).alias("context")), tmp_path / "kv.parquet")
    with pytest.raises(ValueError, match="train KV-retrieval prompts are evaluation items"):
        run_corpus_check(
            str(MINI_MMLU), str(tmp_path / "kv.parquet"), str(tmp_path / "check2.json"), config, 0, mmlu, "lookup"
        )
    with pytest.raises(ValueError, match="1 MMLU questions are evaluation items"):
        check_no_evaluation_items(["q1", "q2"], ["q2", "q3"], "MMLU questions")


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


def test_variant_labels():
    frame = pl.DataFrame({"task": ["kv"], "value": [1.0]})
    student = label_variant(frame, "k2-n8").row(0, named=True)
    assert (student["variant"], student["heads_kept"], student["state_size"]) == ("k2-n8", 2, 8)
    teacher = label_variant(frame, "teacher")
    assert teacher["heads_kept"].to_list() == [None] and teacher["heads_kept"].dtype == pl.Int64
    assert swap_label("k0-n8", 3) == "k0-n8 + attention layer 3"


@pytest.fixture(scope="module")
def phase(tmp_path_factory, tiny_llama):
    """The hybrid phase's rule functions run in order on the tiny teacher."""
    model, tok = tiny_llama
    root = tmp_path_factory.mktemp("hybrid")
    model.save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    write_parquet(pl.DataFrame({"rank": [1, 2, 3], "layer": [2, 0, 1], "head": [1, 3, 0]}), root / "ranking.parquet")
    write_parquet(build_kv_retrieval([3, 5], 2, seed=0, template="lookup"), root / "kv_retrieval.parquet")
    p = {name: str(root / name) for name in ("teacher", "ranking.parquet", "kv_retrieval.parquet")}
    run_distill_teacher(
        Files(model=p["teacher"], mmlu=str(MINI_MMLU)),
        str(root / "teacher.safetensors"),
        CORPUS,
        top_k=4,
        seed=1,
        mmlu={"n": 8, "seed": 7, "topics": []},
        template="lookup",
    )
    run_distill_align(
        "tiny",
        4,
        Files(model=p["teacher"], teacher=str(root / "teacher.safetensors")),
        Files(
            weights=str(root / "align.safetensors"),
            curve=str(root / "align.parquet"),
            heads=str(root / "align-heads.parquet"),
        ),
        {"steps": 2, "batch": 2, "lr": 1e-3},
        seed=1,
    )
    for k in (0, 2):
        run_distill_kd(
            "tiny",
            f"k{k}-n4",
            Files(
                model=p["teacher"],
                teacher=str(root / "teacher.safetensors"),
                aligned=str(root / "align.safetensors"),
                ranking=p["ranking.parquet"],
            ),
            Files(
                student=str(root / f"k{k}"),
                curve=str(root / f"kd{k}.parquet"),
                checkpoints=str(root / f"kd{k}-checkpoints.safetensors"),
            ),
            KD,
            checkpoints=[0, 1, 2] if k == 2 else [],
            seed=1,
        )
    return root, p


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
    # checkpoints below the full budget only (the student is the last); none asked for k = 0
    assert sorted(checkpoint_states(read_tensors(str(root / "kd2-checkpoints.safetensors")))) == [0, 1]
    assert read_tensors(str(root / "kd0-checkpoints.safetensors")) == {}


def test_scoring_rules_on_the_distilled_students(phase):
    root, p = phase
    tasks = [p["kv_retrieval.parquet"]]
    args = dict(max_items=4, evaluation=Evaluation(batch_size=2))
    scores = score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        tasks,
        str(root / "score.parquet"),
        str(root / "answers.parquet"),
        degeneracy_items=None,
        **args,
    )
    assert "perplexity" in scores["metric"].to_list() and set(scores["heads_kept"]) == {2}
    assert "degeneracy_agreement" in scores["metric"].to_list() and "degenerate" in scores.columns
    answers = pl.read_parquet(root / "answers.parquet")
    assert (
        len(answers) == 4 and set(answers["variant"]) == {"k2-n4"} and answers["pred_other_context"].null_count() == 0
    )
    # the summary is computed from exactly these answers
    acc = scores.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"][0]
    assert acc == answers["correct"].mean()
    # a student saved and reloaded scores identically
    again = score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        tasks,
        str(root / "score2.parquet"),
        str(root / "answers2.parquet"),
        degeneracy_items=None,
        **args,
    )
    assert again.equals(scores)
    swap = swap_layer(
        "tiny",
        "k0-n4",
        str(root / "k0"),
        p["ranking.parquet"],
        str(root / "teacher.safetensors"),
        tasks,
        str(root / "swap.parquet"),
        str(root / "swap-answers.parquet"),
        degeneracy_items=0,
        **args,
    )
    assert set(swap["variant"]) == {"k0-n4 + attention layer 2"} and set(swap["swapped_layer"]) == {2}
    assert "degeneracy_agreement" not in swap["metric"].to_list()
    assert set(pl.read_parquet(root / "swap-answers.parquet")["swapped_layer"]) == {2}
    every = ChancePolicy(skip=False)  # the tiny student is at chance: run the masked condition anyway
    rows = answer_rows("tiny", "k2-n4", str(root / "k2"), tasks, str(root / "rows.parquet"), chance=every, **args)
    assert rows["condition"].to_list() == ["unmodified", "attention answer rows masked"]
    assert pl.read_parquet(root / "rows.parquet").equals(rows)
    student, _ = load_any(root / "k2")
    assert len(mixers(student)) == 3


def test_the_teacher_is_read_from_its_baseline_not_scored_again(phase):
    root, p = phase
    from gna.phases.evaluation import run_baseline

    run_baseline(
        "tiny",
        p["teacher"],
        p["kv_retrieval.parquet"],
        str(root / "base.parquet"),
        str(root / "base.items.parquet"),
        evaluation=Evaluation(batch_size=2),
    )
    args = dict(max_items=3, degeneracy_items=2, evaluation=Evaluation(batch_size=2))
    scored = score(
        "tiny",
        "teacher",
        p["teacher"],
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "t1.parquet"),
        str(root / "t1a.parquet"),
        **args,
    )
    read = score(
        "tiny",
        "teacher",
        p["teacher"],
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "t2.parquet"),
        str(root / "t2a.parquet"),
        baseline_paths=[str(root / "base.items.parquet")],
        **args,
    )
    assert read.equals(scored)
    assert pl.read_parquet(root / "t2a.parquet").equals(pl.read_parquet(root / "t1a.parquet"))
    # scores of other items are refused, not silently mixed in
    write_parquet(pl.read_parquet(root / "base.items.parquet").head(1), root / "short.items.parquet")
    with pytest.raises(ValueError, match="items have no earlier scores"):
        score(
            "tiny",
            "teacher",
            p["teacher"],
            str(root / "teacher.safetensors"),
            [p["kv_retrieval.parquet"]],
            str(root / "t3.parquet"),
            str(root / "t3a.parquet"),
            baseline_paths=[str(root / "short.items.parquet")],
            **args,
        )


def test_a_student_is_not_scored_where_its_teacher_is_degenerate(phase):
    root, p = phase
    tasks, args = (
        [p["kv_retrieval.parquet"]],
        dict(max_items=4, degeneracy_items=None, evaluation=Evaluation(batch_size=2)),
    )
    student = (str(root / "k2"), str(root / "teacher.safetensors"))
    # the tiny teacher is at chance too: its summaries below are made clear of chance, so that only the flag decides
    # 2 of 4 items, of 3 and 5 keys: no item has a partner to swap contexts with, so no check (not a crash)
    unchecked = score(
        "tiny",
        "teacher",
        p["teacher"],
        student[1],
        tasks,
        str(root / "u.parquet"),
        str(root / "ua.parquet"),
        **(args | {"degeneracy_items": 2}),
    )
    assert "degeneracy_agreement" not in unchecked["metric"].to_list() and "degenerate" not in unchecked.columns
    teacher = score(
        "tiny", "teacher", p["teacher"], student[1], tasks, str(root / "t.parquet"), str(root / "ta.parquet"), **args
    )
    clear = pl.col("metric") == "acc"
    for flag in (True, False):
        write_parquet(
            teacher.with_columns(
                pl.when(clear).then(0.95).otherwise(pl.col("ci_low")).alias("ci_low"),
                pl.when(clear).then(1.0).otherwise(pl.col("ci_high")).alias("ci_high"),
                pl.lit(flag).alias("degenerate"),
            ),
            root / f"teacher-{flag}.parquet",
        )
    skipped = score(
        "tiny",
        "k2-n4",
        *student,
        tasks,
        str(root / "s1.parquet"),
        str(root / "a1.parquet"),
        teacher_summary_path=str(root / "teacher-True.parquet"),
        **args,
    )
    assert set(skipped["metric"]) == {"perplexity", "acc"}
    row = skipped.filter(pl.col("skipped_reason").is_not_null()).row(0, named=True)
    assert row["task"] == "kv_retrieval" and row["metric"] == "acc" and row["value"] is None
    assert row["skipped_reason"].startswith("the teacher keeps its answer on") and row["heads_kept"] == 2
    assert pl.read_parquet(root / "a1.parquet").is_empty()
    # a teacher that reads the context leaves the student's scoring as it is without the check
    kept = score(
        "tiny",
        "k2-n4",
        *student,
        tasks,
        str(root / "s2.parquet"),
        str(root / "a2.parquet"),
        teacher_summary_path=str(root / "teacher-False.parquet"),
        **args,
    )
    plain = score("tiny", "k2-n4", *student, tasks, str(root / "s3.parquet"), str(root / "a3.parquet"), **args)
    assert kept.equals(plain) and plain["skipped_reason"].is_null().all()
    assert skipped.filter(pl.col("metric") == "perplexity")["value"][0] == pytest.approx(
        plain.filter(pl.col("metric") == "perplexity")["value"][0]
    )
    swap = swap_layer(
        "tiny",
        "k0-n4",
        str(root / "k0"),
        p["ranking.parquet"],
        student[1],
        tasks,
        str(root / "sw.parquet"),
        str(root / "swa.parquet"),
        teacher_summary_path=str(root / "teacher-True.parquet"),
        **args,
    )
    assert swap["skipped_reason"].drop_nulls().to_list() == [row["skipped_reason"]]
    assert set(swap["swapped_layer"]) == {2}
    rows = answer_rows(
        "tiny",
        "k2-n4",
        student[0],
        tasks,
        str(root / "rows.parquet"),
        max_items=4,
        evaluation=Evaluation(batch_size=2),
        teacher_summary_path=str(root / "teacher-True.parquet"),
    )
    assert rows["task"].to_list() == ["kv_retrieval"] and rows["condition"].null_count() == 1
    assert rows["skipped_reason"][0].startswith("the teacher keeps its answer on")
    ran = answer_rows(
        "tiny",
        "k2-n4",
        student[0],
        tasks,
        str(root / "rows.parquet"),
        max_items=4,
        evaluation=Evaluation(batch_size=2),
        teacher_summary_path=str(root / "teacher-False.parquet"),
    )
    # the teacher passes; the tiny student is at chance itself, so only its unmodified row is scored
    assert ran["condition"].to_list() == ["unmodified"]
    assert "masking answer rows cannot show a loss: the masked condition not run" in ran["skipped_reason"][0]
    every = answer_rows(
        "tiny",
        "k2-n4",
        student[0],
        tasks,
        str(root / "rows.parquet"),
        max_items=4,
        evaluation=Evaluation(batch_size=2),
        teacher_summary_path=str(root / "teacher-True.parquet"),
        chance=ChancePolicy(skip=False),
    )
    assert every["condition"].to_list() == ["unmodified", "attention answer rows masked"]


def test_a_student_is_not_scored_where_its_teacher_is_at_chance(phase):
    root, p = phase
    tasks, args = (
        [p["kv_retrieval.parquet"]],
        dict(max_items=4, degeneracy_items=None, evaluation=Evaluation(batch_size=2)),
    )
    student = (str(root / "k2"), str(root / "teacher.safetensors"))
    teacher = score(
        "tiny", "teacher", p["teacher"], student[1], tasks, str(root / "t.parquet"), str(root / "ta.parquet"), **args
    )
    chance = chance_accuracy(load_task_tables(tasks, 4)["kv_retrieval"])
    accuracy = (pl.col("metric") == "acc") & (pl.col("group") == "all")
    for name, (low, high) in {"at": (chance - 0.1, chance + 0.1), "above": (chance + 0.05, 1.0)}.items():
        write_parquet(
            teacher.with_columns(
                pl.when(accuracy).then(low).otherwise(pl.col("ci_low")).alias("ci_low"),
                pl.when(accuracy).then(high).otherwise(pl.col("ci_high")).alias("ci_high"),
                pl.lit(False).alias("degenerate"),
            ),
            root / f"teacher-{name}.parquet",
        )
    skipped = score(
        "tiny",
        "k2-n4",
        *student,
        tasks,
        str(root / "c1.parquet"),
        str(root / "c1a.parquet"),
        teacher_summary_path=str(root / "teacher-at.parquet"),
        **args,
    )
    row = skipped.filter(pl.col("skipped_reason").is_not_null()).row(0, named=True)
    assert row["task"] == "kv_retrieval" and row["value"] is None
    assert f"contains chance {chance:.1%}" in row["skipped_reason"]
    assert row["skipped_reason"].startswith("the teacher's accuracy is not distinguishable from chance at n=4")
    # with the policy off, or a teacher above chance, the scoring is as it is without a teacher
    plain = score("tiny", "k2-n4", *student, tasks, str(root / "c2.parquet"), str(root / "c2a.parquet"), **args)
    for summary, policy in (("at", ChancePolicy(skip=False)), ("above", ON)):
        kept = score(
            "tiny",
            "k2-n4",
            *student,
            tasks,
            str(root / "c3.parquet"),
            str(root / "c3a.parquet"),
            teacher_summary_path=str(root / f"teacher-{summary}.parquet"),
            chance=policy,
            **args,
        )
        assert kept.equals(plain)
    # degenerate and at chance: one row, the degeneracy's reason
    write_parquet(
        pl.read_parquet(root / "teacher-at.parquet").with_columns(pl.lit(True).alias("degenerate")),
        root / "teacher-both.parquet",
    )
    both = answer_rows(
        "tiny",
        "k2-n4",
        student[0],
        tasks,
        str(root / "rows.parquet"),
        max_items=4,
        evaluation=Evaluation(batch_size=2),
        teacher_summary_path=str(root / "teacher-both.parquet"),
    )
    assert len(both) == 1 and both["skipped_reason"][0].startswith("the teacher keeps its answer on")


def test_budget_curve_scores_each_checkpoint_and_ends_at_the_student(phase, caplog):
    root, p = phase
    curve = budget(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "kd2-checkpoints.safetensors"),
        str(root / "teacher.safetensors"),
        p["kv_retrieval.parquet"],
        str(root / "budget.parquet"),
        dict_size=5,
        degeneracy_items=2,
        evaluation=Evaluation(batch_size=2),
    )
    assert sorted(set(curve["kd_steps"])) == [0, 1, 2] and sorted(set(curve["kd_tokens"])) == [0, 64, 128]
    assert pl.read_parquet(root / "budget.parquet").equals(curve)
    # hybrid_score at the one dictionary size (the state-size sweep's scoring) is the last point
    full = score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "s.parquet"),
        str(root / "a.parquet"),
        max_items=None,
        degeneracy_items=2,
        evaluation=Evaluation(batch_size=2),
        kv_dict_size=5,
    )
    assert set(pl.read_parquet(root / "a.parquet")["group"]) == {"5"}
    with pytest.raises(ValueError, match="no KV-retrieval items of dictionary size 4"):
        score(
            "tiny",
            "k2-n4",
            str(root / "k2"),
            str(root / "teacher.safetensors"),
            [p["kv_retrieval.parquet"]],
            str(root / "s.parquet"),
            str(root / "a.parquet"),
            max_items=None,
            degeneracy_items=2,
            evaluation=Evaluation(batch_size=2),
            kv_dict_size=4,
        )
    last = curve.filter(pl.col("kd_steps") == 2).drop("kd_steps", "kd_tokens", "model")
    assert last.sort("task", "group", "metric").equals(full.select(last.columns).sort("task", "group", "metric"))
    # scored on every size with its degeneracy check at the curve's size, the student's own
    # results give the last point: read, not scored again, and equal to scoring it
    score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "s5.parquet"),
        str(root / "a5.parquet"),
        max_items=None,
        degeneracy_items=2,
        evaluation=Evaluation(batch_size=2),
        degeneracy_dict_size=5,
    )
    answers = pl.read_parquet(root / "a5.parquet")
    assert answers.filter(pl.col("pred_other_context").is_not_null())["group"].to_list() == ["5", "5"]
    with caplog.at_level(logging.INFO, logger="gna.students.student_evaluation"):
        read = budget(
            "tiny",
            "k2-n4",
            str(root / "k2"),
            str(root / "kd2-checkpoints.safetensors"),
            str(root / "teacher.safetensors"),
            p["kv_retrieval.parquet"],
            str(root / "budget-read.parquet"),
            dict_size=5,
            degeneracy_items=2,
            evaluation=Evaluation(batch_size=2),
            summary_path=str(root / "s5.parquet"),
            answers_path=str(root / "a5.parquet"),
        )
    assert "after 2 KD steps: read from its scores" in caplog.text
    order = ["kd_steps", "task", "group", "metric"]
    assert read.select(sorted(curve.columns)).sort(order).equals(curve.select(sorted(curve.columns)).sort(order))
    # answers without the check on every item of that size are not read: the point is scored
    score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "s0.parquet"),
        str(root / "a0.parquet"),
        max_items=None,
        degeneracy_items=0,
        evaluation=Evaluation(batch_size=2),
    )
    kv = pl.read_parquet(p["kv_retrieval.parquet"])
    at = {size: kv.filter(pl.col("dict_size") == size) for size in (3, 5)}
    assert budget_point_from_scores(str(root / "s0.parquet"), str(root / "a0.parquet"), at[5]) is None
    assert budget_point_from_scores(str(root / "s5.parquet"), str(root / "a5.parquet"), at[3]) is None
    # nor answers on fewer items than the curve's (hybrid.eval_items cuts the tables)
    score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "s1.parquet"),
        str(root / "a1.parquet"),
        max_items=3,
        degeneracy_items=2,
        evaluation=Evaluation(batch_size=2),
        degeneracy_dict_size=5,
    )
    assert len(pl.read_parquet(root / "a1.parquet").filter(pl.col("group") == "5")) == 1
    assert budget_point_from_scores(str(root / "s1.parquet"), str(root / "a1.parquet"), at[5]) is None
    assert budget_point_from_scores(str(root / "s5.parquet"), str(root / "a5.parquet"), at[5]) is not None
    # step 0 is the aligned student: the same scores as a student built from the aligned file
    teacher = load_model(p["teacher"])[0]
    aligned = load_aligned(
        make_hybrid(teacher, [(2, 1), (0, 3)], 4),
        read_tensors(str(root / "align.safetensors"), None, device_of(teacher)),
    )
    first = checkpoint_states(read_tensors(str(root / "kd2-checkpoints.safetensors")))[0]  # on the CPU
    for key, value in snapshot(aligned).items():
        assert torch.equal(first[key], value.cpu())


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
        curve, saved = distill_logits(
            student, targets, {"steps": 3, "batch": 2, "lr": 1e-3}, seed=0, checkpoints=[0, 2, 3], progress=False
        )
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
        {"steps": 3, "batch": 2, "lr": 1e-3},
        seed=0,
        progress=False,
    )
    assert weighted["loss"][0] != curve["loss"][0]
    # restore puts a snapshot back
    restore(student, saved[0])
    assert all(torch.equal(saved[0][k], v) for k, v in snapshot(student).items())


def _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, weights, kd, seed) -> dict:
    """The SSM parameters of a student made by make_hybrid, its SSM heads loaded from `aligned`
    (None: left as initialised), after distill_logits on exactly these windows and weights."""
    student = make_hybrid(copy.deepcopy(teacher), kept, 4)
    if aligned is not None:
        load_aligned(student, aligned)
    distill_logits(
        student,
        {"ids": ids, "top_logp": top_logp, "top_idx": top_idx, "weights": weights},
        kd,
        seed,
        progress=False,
    )
    return snapshot(student)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], v) for k, v in b.items())


@pytest.mark.parametrize("ablation", ["init_only", "no_align", "no_answer_weight", "small_corpus", "no_first_token"])
def test_each_ablation_removes_its_ingredient(phase, ablation):
    """Each ablated student is, bit for bit, the recipe's KD run with exactly its ingredient
    removed (built here from make_hybrid, load_aligned and distill_logits), and differs from the
    full recipe's student: an ignored switch trains the full recipe and fails."""
    root, p = phase
    teacher, _ = load_model(p["teacher"])
    # read onto the teacher's device, as run_hybrid_ablation reads them
    data = read_tensors(str(root / "teacher.safetensors"), None, device_of(teacher))
    aligned = read_tensors(str(root / "align.safetensors"), None, device_of(teacher))
    kept = [(2, 1), (0, 3)]
    # two steps over every window: the answer positions and the windows beyond align_windows are
    # in every batch, and Adam's second step follows the gradients' size, not only their signs
    kd, seed, align_windows = {**KD, "steps": 2, "batch": 6}, 1, 4
    args = dict(align={"steps": 2, "batch": 2, "lr": 1e-3}, kd=kd, align_windows=align_windows, seed=seed)
    student = ablated_student(copy.deepcopy(teacher), kept, 4, ablation, aligned, data, args)
    state = snapshot(student)
    init = snapshot(make_hybrid(copy.deepcopy(teacher), kept, 4))
    from_aligned = snapshot(load_aligned(make_hybrid(copy.deepcopy(teacher), kept, 4), aligned))
    assert not _same(init, from_aligned)  # alignment moved the SSM heads: the two starts differ
    if ablation == "init_only":
        assert _same(init, state)
    else:
        assert not _same(init, state) and not _same(from_aligned, state)
    ids, top_logp, top_idx, answers = data["train_ids"], data["top_logp"], data["top_idx"], data["train_answers"]
    weighted = answer_weights(answers, kd["answer_weight"])
    if ablation in ("no_align", "no_answer_weight", "small_corpus"):
        recipe = _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, weighted, kd, seed)
        if ablation == "no_align":  # KD starts from the initialised SSM heads, not the aligned ones
            expected = _kd_from(teacher, kept, None, ids, top_logp, top_idx, weighted, kd, seed)
        elif ablation == "no_answer_weight":  # every position weighs the same: the plain loss
            assert answers.any() and weighted.max() == kd["answer_weight"] > 1
            expected = _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, None, kd, seed)
        else:  # only the first align_windows windows (those alignment saw), not all train windows
            assert len(ids) > align_windows
            expected = _kd_from(
                teacher, kept, aligned, *(t[:align_windows] for t in (ids, top_logp, top_idx, weighted)), kd, seed
            )
        assert _same(expected, state), f"{ablation}: not the recipe with its ingredient removed"
        assert not _same(recipe, state), f"{ablation}: the full recipe's student (the switch did nothing)"
    shares = [m.first_token_share for m in mixers(student)]
    assert all(shares) == (ablation != "no_first_token") and any(shares) == all(shares)
    if ablation == "no_first_token":  # the share's parameters are not trained
        assert all(torch.equal(init[k], state[k]) for k in state if ".sink_proj." in k)
    with pytest.raises(ValueError, match="unknown distillation ablation 'nope'"):
        ablated_student(copy.deepcopy(teacher), kept, 4, "nope", aligned, data, args)


def test_ablation_rule_writes_scored_rows(phase):
    root, p = phase
    frame = ablation(
        "tiny",
        "no_align",
        "k2-n4",
        p["teacher"],
        str(root / "teacher.safetensors"),
        str(root / "align.safetensors"),
        p["ranking.parquet"],
        p["kv_retrieval.parquet"],
        str(root / "ablation.parquet"),
        align={"steps": 1, "batch": 2, "lr": 1e-3},
        kd={**KD, "steps": 1},
        align_windows=4,
        seed=1,
        dict_size=3,
        degeneracy_items=2,
        evaluation=Evaluation(batch_size=2),
    )
    assert set(frame["ablation"]) == {"no_align"} and {"acc", "perplexity"} <= set(frame["metric"])
    assert set(frame.filter(pl.col("metric") == "acc")["group"]) == {"3", "all"}
    with pytest.raises(ValueError, match="no KV-retrieval items of dictionary size 7"):
        ablation(
            "tiny",
            "init_only",
            "k2-n4",
            p["teacher"],
            str(root / "teacher.safetensors"),
            str(root / "align.safetensors"),
            p["ranking.parquet"],
            p["kv_retrieval.parquet"],
            str(root / "x.parquet"),
            align={"steps": 1, "batch": 2, "lr": 1e-3},
            kd=KD,
            align_windows=4,
            seed=1,
            dict_size=7,
            degeneracy_items=2,
            evaluation=Evaluation(batch_size=2),
        )
    assert pl.read_parquet(root / "ablation.parquet").equals(frame)


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


@pytest.mark.parametrize("low", [None, torch.bfloat16])
def test_kd_backward_by_slices_gives_the_gradients_of_the_whole_loss(tiny_llama, low):
    """The fast path (output head and loss a few positions at a time, slices that do not divide
    the batch) against its reference: kd_loss on the whole batch's logits, then backward."""
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (3, 10), generator=torch.Generator().manual_seed(5))
    acts = teacher_activations(model, ids, top_k=6, progress=False)
    target = torch.softmax(acts["top_logp"].float(), -1)
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
    reference = kd_loss(logits, target, acts["top_idx"], weights)
    expected = torch.autograd.grad(reference, params)
    loss = kd_backward(student, ids, target, acts["top_idx"], weights, low, head_rows=7)
    got = [p.grad for p in params]
    assert loss == pytest.approx(reference.item(), rel=1e-5)
    for g, e in zip(got, expected):
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
            {"steps": 1, "batch": 4, "lr": 0.0, "compute_dtype": compute_dtype},
            seed=0,
            progress=False,
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
        align_layers(
            model, hidden, 4, {"steps": 5, "batch": 2, "lr": 1e-3, "compute_dtype": dtype}, 0, False, log_every=1
        )[1]
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
    state, align_curve = align_layers(model, acts["hidden"], 4, {"steps": 2, "batch": 2, "lr": 1e-2}, 0, progress=False)
    student = load_aligned(make_hybrid(copy.deepcopy(model), [(1, 0)], 4), state)
    m = mixers(student)[1]
    assert m.x_proj.weight.dtype == torch.float32 and m.q_proj.weight.dtype == torch.bfloat16
    targets = {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
    curve, _ = distill_logits(student, targets, {"steps": 2, "batch": 2, "lr": 1e-3}, seed=0, progress=False)
    assert align_curve["loss"].is_finite().all() and curve["loss"].is_finite().all()
    scores = score_table(student, tok, build_kv_retrieval([3], 2, 0, "lookup"), progress=False)
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
    _, curve = align_layers(model, hidden, 4, {"steps": 2, "batch": 2, "lr": 1e-3}, 0, progress=False)
    assert curve["loss"].is_finite().all()
