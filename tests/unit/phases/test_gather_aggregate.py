import polars as pl
import pytest
import torch
from conftest import MINI_MMLU

from gna.engine.chance import ChancePolicy
from gna.phases.gather_aggregate import (
    attention_maps,
    head_roles,
    kv_row_segments,
    kv_segments,
    map_frame,
    mmlu_letter_segments,
    role_scores,
)
from gna.tasks.tables import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu


@pytest.mark.parametrize("template", ["lookup", "study"])
def test_kv_segments_are_the_dictionary_lines(tiny_llama, template):
    _, tok = tiny_llama
    row = build_kv_retrieval([4], 1, 3, template).row(0, named=True)
    seg = kv_segments(tok, row["context"], row["query_key"])
    lines = row["context"].split("\n")[1:5]
    assert ["".join(seg.tokens[a:b]) for a, b in seg.spans] == lines
    assert all(seg.tokens[s] == "Ċ" for s in seg.summary)  # byte-level newline
    assert lines[seg.correct].split(":")[0] == row["query_key"]
    assert seg.answer == len(seg.tokens) - 1


def test_mmlu_option_segments(tiny_llama):
    _, tok = tiny_llama
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 2, 0, [])
    row = build_mmlu(subset, pool, "letter", 1, 0).row(0, named=True)
    seg = mmlu_letter_segments(tok, row["context"], row["target"])
    texts = ["".join(seg.tokens[a:b]).replace("Ġ", " ") for a, b in seg.spans]
    assert [t[:3] for t in texts] == ["A. ", "B. ", "C. ", "D. "]
    assert texts[0] == "A. " + subset["answer_a"][0]  # the final question's options, not the few-shot ones


def test_role_scores_on_constructed_maps(tiny_llama):
    _, tok = tiny_llama
    row = build_kv_retrieval([3], 1, 0, "lookup").row(0, named=True)
    seg = kv_segments(tok, row["context"], row["query_key"])
    T = len(seg.tokens)
    maps = torch.zeros(1, 3, T, T)
    maps[0, :, torch.arange(T), torch.arange(T)] = 1.0  # default: attend to self
    for (a, b), s in zip(seg.spans, seg.summary):  # head 0: a perfect gather head
        maps[0, 0, s] = 0
        maps[0, 0, s, a:b] = 1 / (b - a)
    a, b = seg.spans[seg.correct]  # head 1: a perfect aggregate head
    maps[0, 1, seg.answer] = 0
    maps[0, 1, seg.answer, a:b] = 1 / (b - a)
    scores = role_scores(maps, seg)
    assert scores["gather"][0, 0] == pytest.approx(1.0) and scores["gather"][0, 2] == pytest.approx(0.0)
    assert scores["aggregate"][0, 1] == pytest.approx(1.0) and scores["selectivity"][0, 1] == pytest.approx(1.0)
    assert scores["aggregate"][0, 2] == pytest.approx(0.0)


def test_maps_and_roles_on_a_model(tiny_llama):
    model, tok = tiny_llama
    before = model.config._attn_implementation
    table = build_kv_retrieval([3], 2, 0, "lookup")
    maps = attention_maps(model, tok, table["context"][0])
    assert model.config._attn_implementation == before
    assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)
    assert torch.all(maps.triu(1) == 0)  # causal
    roles = head_roles(model, tok, table, kv_row_segments, progress=False)
    assert len(roles) == 3 * 4 and set(roles["role"]) <= {"gather", "aggregate", "other"}
    frame = map_frame(model, tok, table.row(0, named=True), [(1, 2)], kv_row_segments)
    assert set(frame["mark"]) >= {"summary", "answer"} and frame["weight"].max() <= 1.0


def test_unrestricted_head_masks_reproduce_the_model_and_restriction_bites(tiny_llama):
    import numpy as np

    from gna.engine.packing import collate, pack
    from gna.engine.scoring import encode, score_table
    from gna.phases.masking import head_mask, masking_experiment, score_masked

    model, tok = tiny_llama
    kv = build_kv_retrieval([3, 5], 3, 0, "lookup")
    heads = {"gather": (1, 2), "aggregate": (2, 0)}
    plain = score_table(model, tok, kv, progress=False)
    same = score_masked(model, tok, kv, kv_row_segments, heads, restrict=False)
    flat = lambda f: np.concatenate(f["logprobs"].to_list())  # noqa: E731
    assert np.array_equal(flat(plain), flat(same))
    masked = score_masked(model, tok, kv, kv_row_segments, heads, restrict=True)
    assert not np.allclose(flat(plain), flat(masked), atol=1e-4)
    # the Gather head's summary row sees exactly its own line; other heads keep the ordinary mask
    row = kv.row(0, named=True)
    enc = encode(tok, row["context"], row["choices"])
    batch = collate([pack(enc.context, enc.choices)])
    seg = kv_row_segments(tok, row)
    mask = head_mask(batch, [seg], 4, 2, "gather")
    (start, end), summary = seg.spans[0], seg.summary[0]
    visible = (mask[0, 2, summary] == 0).nonzero().flatten().tolist()
    assert visible == list(range(start, end)) + [summary]
    assert torch.equal(mask[0, 1], batch.mask[0, 0])
    result = masking_experiment(model, tok, kv, kv_row_segments, heads)
    assert result["condition"].to_list() == ["(a) unmodified", "(b) G&A heads ablated", "(c) G&A pattern only"]
    assert result["acc"][0] == plain["correct"].mean()


ROLES_TABLE = pl.DataFrame(
    {
        "layer": [0, 1, 1, 2, 2],
        "head": [0, 2, 3, 0, 1],
        "role": ["gather", "gather", "other", "aggregate", "aggregate"],
        "rank": [5, 2, 1, 4, 3],
    }
)


def test_best_role_heads_choose_by_rank():
    from gna.phases.gather_aggregate import best_role_head, map_heads
    from gna.phases.masking import masking_heads

    assert best_role_head(ROLES_TABLE, "gather") == (1, 2) and best_role_head(ROLES_TABLE, "nothing") is None
    assert masking_heads(ROLES_TABLE) == {"gather": (1, 2), "aggregate": (2, 1)}
    assert masking_heads(ROLES_TABLE.filter(pl.col("role") != "aggregate")) == {"gather": (1, 2)}
    ranking = ROLES_TABLE.select("layer", "head", "rank")
    # the two top-ranked heads, then the best Gather / Aggregate heads not among them
    assert map_heads(ranking, ROLES_TABLE, 2) == [(1, 3), (1, 2), (2, 1)]
    assert map_heads(ranking, ROLES_TABLE, 3) == [(1, 3), (1, 2), (2, 1)]
    assert map_heads(ranking, ROLES_TABLE, 0) == [(1, 2), (2, 1)]


def test_heads_label_says_ssm_or_attention_only_for_students():
    from gna.phases.masking import heads_label

    heads = {"gather": (1, 2), "aggregate": (2, 0)}
    assert heads_label(heads) == "gather L1H2, aggregate L2H0"
    assert heads_label(heads, {(1, 2)}) == "gather L1H2 (ssm), aggregate L2H0 (attention)"
    assert heads_label(heads, set()) == "gather L1H2 (attention), aggregate L2H0 (attention)"


def test_choice_masking_is_gated_by_accuracy(tiny_llama):
    from gna.engine.scoring import score_table
    from gna.phases.masking import choice_masking

    model, tok = tiny_llama
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 3, 0, [])
    letter = build_mmlu(subset, pool, "letter", 1, 0)
    heads = {"gather": (1, 2), "aggregate": (2, 0)}
    acc = score_table(model, tok, letter, progress=False)["correct"].mean()
    gated = choice_masking(model, tok, letter, heads, min_acc=acc + 0.01)
    assert gated["condition"].to_list() == ["(a) unmodified"] and gated["acc"][0] == acc
    assert gated["skipped_reason"][0].startswith("at chance") and gated["heads"][0] == "gather L1H2, aggregate L2H0"
    run = choice_masking(model, tok, letter, heads, min_acc=acc)
    assert run["condition"].to_list() == ["(a) unmodified", "(b) G&A heads ablated", "(c) G&A pattern only"]
    assert run["skipped_reason"].null_count() == len(run) and set(run["task"]) == {"mmlu_letter"}


def test_choice_masking_skips_a_table_at_chance_by_its_interval(tiny_llama):
    """The facts' choice form, option lines as segments: with the chance policy an accuracy whose
    interval contains chance runs (a) only, whatever min_acc allows; without it all three run."""
    from gna.engine.chance import at_chance
    from gna.engine.scoring import score_table
    from gna.phases.masking import choice_masking
    from gna.tasks.facts import build_facts, read_local_facts

    model, tok = tiny_llama
    facts = read_local_facts(MINI_MMLU.parent / "mini_facts.csv")
    choice = build_facts(facts, ["capital", "demonym"], 6, seed=2, fmt="choice", shots=1)
    assert at_chance(score_table(model, tok, choice, progress=False), choice) is not None  # 6 items: any accuracy
    heads = {"gather": (1, 2), "aggregate": (2, 0)}
    skipped = choice_masking(model, tok, choice, heads, min_acc=0.0, chance=ChancePolicy(skip=True))
    assert skipped["condition"].to_list() == ["(a) unmodified"]
    assert "not distinguishable from chance" in skipped["skipped_reason"][0] and skipped["task"][0] == "facts_choice"
    run = choice_masking(model, tok, choice, heads, min_acc=0.0)
    assert run["condition"].to_list() == ["(a) unmodified", "(b) G&A heads ablated", "(c) G&A pattern only"]


def test_masking_reads_condition_a_from_the_models_own_scores(tiny_llama):
    """(a) of a knowledge table and the choice table's gate are the model's per-item scores: given
    them (a baseline's, a student's answers), the result is the one scored here; and they are
    read, not recomputed (doctored scores show through)."""
    from gna.engine.scoring import score_table
    from gna.phases.gather_aggregate import kv_row_segments
    from gna.phases.masking import choice_masking, masking_experiment
    from gna.tasks.facts import build_facts, read_local_facts

    model, tok = tiny_llama
    facts = read_local_facts(MINI_MMLU.parent / "mini_facts.csv")
    cloze = build_facts(facts, ["capital", "demonym"], 6, seed=2, fmt="cloze")
    choice = build_facts(facts, ["capital", "demonym"], 6, seed=2, fmt="choice", shots=1)
    kv = build_kv_retrieval([3], 3, 0, "lookup")
    heads = {"gather": (1, 2), "aggregate": (2, 0)}
    scored = {t["task"][0]: score_table(model, tok, t, progress=False) for t in (cloze, choice)}
    args = dict(batch_size=4, knowledge=[cloze], chance=ChancePolicy(skip=True))
    plain = masking_experiment(model, tok, kv, kv_row_segments, heads, **args)
    assert masking_experiment(model, tok, kv, kv_row_segments, heads, scored=scored, **args).equals(plain)
    assert choice_masking(model, tok, choice, heads, 0.0, chance=ChancePolicy(skip=True), scored=scored).equals(
        choice_masking(model, tok, choice, heads, 0.0, chance=ChancePolicy(skip=True))
    )
    doctored = {t: s.with_columns(pl.lit(True).alias("correct")) for t, s in scored.items()}
    read = masking_experiment(model, tok, kv, kv_row_segments, heads, scored=doctored, **args)
    assert read.filter(pl.col("task") == "facts_cloze")["acc"][0] == 1.0
    gate = choice_masking(model, tok, choice, heads, 0.0, chance=ChancePolicy(skip=True), scored=doctored)
    assert "(b) G&A heads ablated" in gate["condition"].to_list()  # the gate read the doctored (a): it opened
