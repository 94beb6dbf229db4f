"""Distillation: the corpus, the SSM parameters a student trains, aligned heads copied into a
student, and the hybrid phase's rule functions chained on a tiny teacher."""

import copy

import polars as pl
import pytest
import torch

from conftest import MINI_MMLU
from gna.students.corpus import split_pool, token_windows
from gna.students.distill import (first_token_attention, head_errors, load_aligned, run_distill_align, run_distill_kd,
                                  run_distill_teacher, teacher_activations)
from gna.students.mixer import captured_maps, mixers
from gna.core.io import write_parquet
from gna.models.prepare import load_model
from gna.students.student_evaluation import label_variant, run_hybrid_score, run_hybrid_swap, swap_label
from gna.students.student_masking import run_hybrid_answer_rows
from gna.students.spec import make_hybrid, read_spec
from gna.tasks.tables import build_kv_retrieval
from gna.core.tensor_files import read_tensors, write_tensors

CORPUS = {"seq_len": 32, "train_windows": 4, "heldout_windows": 2, "kv_sizes": [3, 5], "kv_share": 0.5,
          "heldout_share": 0.2}


def test_split_pool_holds_out_the_first_share():
    pool = pl.DataFrame({"q": list(range(10))})
    train, held = split_pool(pool, 0.2)
    assert held["q"].to_list() == [0, 1] and train["q"].to_list() == list(range(2, 10))


def test_token_windows_are_seeded_and_refuse_a_small_corpus(tiny_llama):
    _, tok = tiny_llama
    docs, kv = [f"question {i} answer" for i in range(20)], [f"k{i}:v{i}" for i in range(20)]
    a = token_windows(tok, docs, kv, 0.5, 16, 5, seed=1)
    assert a.shape == (5, 16) and torch.equal(a, token_windows(tok, docs, kv, 0.5, 16, 5, seed=1))
    assert not torch.equal(a, token_windows(tok, docs, kv, 0.5, 16, 5, seed=2))
    with pytest.raises(ValueError, match="corpus too small"):
        token_windows(tok, docs[:1], [], 0.5, 16, 5, seed=1)


def test_ssm_state_names_every_trained_parameter_once(tiny_llama):
    student = make_hybrid(copy.deepcopy(tiny_llama[0]), [(0, 1)], state_size=4)
    m = mixers(student)[0]
    named = m.ssm_state()
    assert list(named) == ["C_proj.weight", "B_proj.weight", "x_proj.weight", "decay_proj.weight", "decay_proj.bias",
                           "D", "norm_weight", "sink_proj.weight", "sink_proj.bias"]  # the tiny Llama has no q/k/v biases
    assert [id(p) for p in m.ssm_params()] == [id(p) for p in named.values()]
    trained = {id(p) for m in mixers(student) for p in m.ssm_params()}
    teacher = {id(p) for m in mixers(student) for proj in (m.q_proj, m.k_proj, m.v_proj, m.o_proj)
               for p in proj.parameters()}
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
    torch.testing.assert_close(m.C_proj.weight, torch.cat([source.C_proj.weight[h * n: (h + 1) * n] for h in (1, 3)]))
    torch.testing.assert_close(m.x_proj.weight, torch.cat([source.x_proj.weight[h * p: (h + 1) * p] for h in (1, 3)]))
    torch.testing.assert_close(m.D, source.D[[1, 3]])
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
    run_distill_teacher(p["teacher"], str(MINI_MMLU), str(root / "teacher.safetensors"), CORPUS, top_k=4, seed=1,
                        mmlu={"n": 8, "seed": 7, "topics": []}, template="lookup")
    run_distill_align("tiny", p["teacher"], str(root / "teacher.safetensors"), 4, str(root / "align.safetensors"),
                      str(root / "align.parquet"), str(root / "align-heads.parquet"), {"steps": 2, "batch": 2, "lr": 1e-3},
                      seed=1)
    for k in (0, 2):
        run_distill_kd("tiny", p["teacher"], str(root / "teacher.safetensors"), str(root / "align.safetensors"),
                       p["ranking.parquet"], k, 4, str(root / f"k{k}"), str(root / f"kd{k}.parquet"),
                       {"steps": 2, "batch": 2, "lr": 1e-3}, seed=1)
    return root, p


def test_distillation_writes_the_teacher_file_curves_and_students(phase):
    root, _ = phase
    teacher = read_tensors(str(root / "teacher.safetensors"))
    assert set(teacher) == {"hidden", "top_logp", "top_idx", "train_ids", "heldout_ids"}
    assert teacher["train_ids"].shape == (4, 32) and teacher["heldout_ids"].shape == (2, 32)
    assert teacher["hidden"].shape[:3] == (3, 4, 32) and teacher["top_idx"].shape == (4, 32, 4)
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


def test_scoring_rules_on_the_distilled_students(phase):
    root, p = phase
    tasks = [p["kv_retrieval.parquet"]]
    args = dict(max_items=4, batch_size=2)
    scores = run_hybrid_score("tiny", "k2-n4", str(root / "k2"), str(root / "teacher.safetensors"), tasks,
                              str(root / "score.parquet"), str(root / "answers.parquet"), swap_items=None, **args)
    assert "perplexity" in scores["metric"].to_list() and set(scores["heads_kept"]) == {2}
    assert "context_swap_agreement" in scores["metric"].to_list() and "degenerate" in scores.columns
    answers = pl.read_parquet(root / "answers.parquet")
    assert len(answers) == 4 and set(answers["variant"]) == {"k2-n4"} and answers["pred_swapped"].null_count() == 0
    # the summary is computed from exactly these answers
    acc = scores.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"][0]
    assert acc == answers["correct"].mean()
    # a student saved and reloaded scores identically
    again = run_hybrid_score("tiny", "k2-n4", str(root / "k2"), str(root / "teacher.safetensors"), tasks,
                             str(root / "score2.parquet"), str(root / "answers2.parquet"), swap_items=None, **args)
    assert again.equals(scores)
    swap = run_hybrid_swap("tiny", "k0-n4", str(root / "k0"), p["ranking.parquet"], str(root / "teacher.safetensors"),
                           tasks, str(root / "swap.parquet"), str(root / "swap-answers.parquet"), swap_items=0, **args)
    assert set(swap["variant"]) == {"k0-n4 + attention layer 2"} and set(swap["swapped_layer"]) == {2}
    assert "context_swap_agreement" not in swap["metric"].to_list()
    assert set(pl.read_parquet(root / "swap-answers.parquet")["swapped_layer"]) == {2}
    rows = run_hybrid_answer_rows("tiny", "k2-n4", str(root / "k2"), tasks, str(root / "rows.parquet"), **args)
    assert rows["condition"].to_list() == ["unmodified", "attention answer rows masked"]
    assert pl.read_parquet(root / "rows.parquet").equals(rows)
    student, _ = load_model(root / "k2")
    assert len(mixers(student)) == 3


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
        torch.testing.assert_close(first_token_attention(m, u, rope, [0, 1, 2, 3]), maps[i][:, :, 1:, 0].mean(dim=(0, 2)),
                                   atol=1e-3, rtol=1e-3)


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
